"""``mgx-graph generate``: text generation with a decoder model, its flags and its report.

One prompt streams its text to stdout as it is generated (``--no-stream`` prints it at the end);
several prompts (``--prompt`` repeated, ``--batch-prompts FILE``) are decoded together as one
batch with left padding, by a step built with ``batch=N`` for a registry name, and printed in
order when all are done. Models without a tokenizer (gpt2, llama: random weights) take and print
token ids.
"""
from __future__ import annotations

import io
import json
import os
import stat
import sys

from . import model_arg
from .errors import float_in, int_at_least
from .inputs import UsageError

DESCRIPTION = ("Text generation with a decoder and its KV cache: greedy, or sampled (--do-sample) with\n"
               "transformers' processors in transformers' order (repetition penalty, temperature, top-k,\n"
               "top-p, min-p). Several prompts are decoded as one batch with left padding.")


def add_parser(sub, parser_kw: dict, cmd) -> None:
    """Add the ``generate`` command to the subparsers ``sub``; ``cmd`` is its function."""
    g = sub.add_parser("generate", help="generate text with a decoder model (greedy or sampled)",
                       description=DESCRIPTION, **parser_kw)
    g.add_argument("model", help="smollm2, smollm2-optimum or smollm2-genai (real, with a tokenizer), gpt2, llama "
                                 "or llama-optimum (random weights: the prompt is token ids), an onnxruntime-genai "
                                 "or optimum folder, or a built model folder")
    g.add_argument("--prompt", action="append", metavar="TEXT",
                   help="text (smollm2) or space-separated token ids; repeat it for several prompts decoded as one "
                        "batch (default: none; give --prompt or --batch-prompts)")
    g.add_argument("--batch-prompts", metavar="FILE",
                   help="a file with one prompt per line, decoded as one batch after any --prompt (default: none)")
    g.add_argument("--max-new-tokens", type=int_at_least(1), default=32, help="tokens to generate per prompt")
    g.add_argument("--do-sample", action="store_true", help="sample the next token (default: off: greedy)")
    g.add_argument("--temperature", type=float_in(0.0, low_open=True), default=1.0, help="divides the logits when sampling")
    g.add_argument("--top-k", type=int_at_least(0), default=50, help="sample among the k most likely tokens; 0: off")
    g.add_argument("--top-p", type=float_in(0.0, 1.0, low_open=True), default=1.0,
                   help="sample among the most likely tokens whose probability adds up to p; 1: off")
    g.add_argument("--min-p", type=float_in(0.0, 1.0),
                   help="drop tokens less likely than p times the most likely one (default: off)")
    g.add_argument("--repetition-penalty", type=float_in(0.0, low_open=True), default=1.0,
                   help="divides positive, multiplies negative logits of tokens already seen; 1: off")
    g.add_argument("--seed", type=int_at_least(0), help="seed of the sampling (default: a new seed each run)")
    g.add_argument("--stop", action="append", metavar="TEXT",
                   help="stop when the text holds TEXT, which is cut off; repeatable (default: none)")
    g.add_argument("--eos-id", action="append", type=int_at_least(0), metavar="ID",
                   help="an end-of-sequence token id; repeatable (default: the model's eos ids)")
    g.add_argument("--no-stream", action="store_true",
                   help="print the text when it is complete (default: one prompt streams to stdout)")
    g.add_argument("--target", default="auto", choices=["auto", "gpu", "ref"],
                   help="where to run; auto: gpu if one is usable, else ref")
    g.add_argument("--hip-graph", action="store_true",
                   help="wrap the step in graph_launch (default: off, or on with MIGRAPHX_HIP_GRAPH=1)")
    g.add_argument("--fp16", action="store_true", help="run in half precision (default: off)")
    g.add_argument("--max-length", type=int_at_least(1), metavar="N",
                   help="onnxruntime-genai / optimum-style folders: KV cache rows per prompt, prompt included (default: the "
                        "power of two holding the longest prompt plus --max-new-tokens, at most the context)")
    g.set_defaults(fn=cmd)


class IdText:
    """The "tokenizer" of a model without one: token ids as text, each followed by a space."""

    @staticmethod
    def decode(ids, skip_special_tokens: bool = True) -> str:
        return "".join(f"{int(t)} " for t in ids)


MAX_BATCH_PROMPTS_BYTES = 16 << 20  # the largest --batch-prompts file read


def _prompt_texts(args) -> list[str]:
    prompts = list(args.prompt or [])
    if args.batch_prompts:
        try:
            text = _read_prompts_file(args.batch_prompts).decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"--batch-prompts: {args.batch_prompts} is not UTF-8 text ({e.reason} at byte "
                             f"{e.start})") from None
        prompts += [line.rstrip("\n") for line in io.StringIO(text, newline=None) if line.strip()]
    if not prompts:
        raise UsageError("give a prompt: --prompt TEXT (repeatable) or --batch-prompts FILE")
    return prompts


def _read_prompts_file(path) -> bytes:
    """The bytes of the regular file ``path``, at most :data:`MAX_BATCH_PROMPTS_BYTES` (a FIFO or a device is
    refused without blocking or reading it)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise UsageError(f"--batch-prompts: cannot read {path}: {e.strerror or e}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UsageError(f"--batch-prompts: cannot read {path}: not a regular file (a folder, FIFO or device)")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > MAX_BATCH_PROMPTS_BYTES:
            raise UsageError(f"--batch-prompts: {path} has {st.st_size} bytes, more than the "
                             f"{MAX_BATCH_PROMPTS_BYTES} read here")
        try:
            data = f.read(MAX_BATCH_PROMPTS_BYTES + 1)
        except OSError as e:
            raise UsageError(f"--batch-prompts: cannot read {path}: {e.strerror or e}") from None
    if len(data) > MAX_BATCH_PROMPTS_BYTES:
        raise UsageError(f"--batch-prompts: {path} has more than the {MAX_BATCH_PROMPTS_BYTES} bytes read here")
    return data


def _prompt_ids(info, prompt: str, chat_prompt_ids) -> list:
    if info.tokenizer_dir:
        return chat_prompt_ids(info, prompt)
    vocab = info.config.get("vocab_size")
    try:  # models without a tokenizer (gpt2, llama: random weights) take token ids
        ids = [int(t) for t in prompt.split()]
    except ValueError:
        raise UsageError(f"model '{info.name}' has no tokenizer: --prompt must be space-separated token ids "
                         f"(0..{vocab - 1 if vocab else '?'})") from None
    bad = [t for t in ids if vocab and not 0 <= t < vocab]
    if bad or not ids:
        raise UsageError(f"token ids must be in 0..{vocab - 1 if vocab else '?'}; got {bad or 'none'}")
    return ids


def _load(args, n_prompts: int):
    """The model's info: a registry name is built with ``batch=n_prompts``; a folder must hold a step of
    at least that many rows."""
    import os

    from ..models import _builder, list_models

    if args.model in list_models() and getattr(_builder(args.model), "KIND", "decoder") == "encoder":
        raise UsageError(f"model '{args.model}' is an encoder model, not a decoder: 'generate' needs a decode step "
                         f"with a KV cache; use 'run' or 'verify' instead")  # refused before building it
    if n_prompts > 1 and not os.path.isdir(args.model) and args.model in list_models():
        from ..models import build

        info = build(args.model, batch=n_prompts)
    else:
        info = model_arg.load_model(args.model)
    if info.config.get("kind") not in ("static", "dynamic"):
        kind = model_arg.article(info.config.get("kind") or "non-decoder")
        raise UsageError(f"model '{info.name}' is {kind} model, not a decoder: 'generate' needs "
                         f"a decode step with a KV cache; use 'run' or 'verify' instead")
    rows = int(info.config.get("batch", 1))
    if n_prompts > rows:
        raise UsageError(f"{n_prompts} prompts, but the decode step of '{args.model}' takes {rows} row(s); "
                         f"build it with batch={n_prompts} (or give the registry name)")
    return info


def _options(args, info, tokenizer, single: bool) -> dict:
    eos = args.eos_id if args.eos_id else info.config.get("eos_token_ids", [])
    vocab = info.config.get("vocab_size")
    bad = [e for e in args.eos_id or [] if vocab and e >= vocab]
    if bad:
        raise UsageError(f"--eos-id {bad[0]}: expected a token id in 0..{vocab - 1} (the model's vocabulary)")
    stream = None
    if single and not args.no_stream:
        from ..llm.streaming import TextStreamer

        stream = TextStreamer(end_text="")
    return dict(eos_token_id=list(eos), do_sample=args.do_sample, temperature=args.temperature,
                top_k=args.top_k or None, top_p=args.top_p, min_p=args.min_p,
                repetition_penalty=args.repetition_penalty, seed=args.seed, stop=args.stop or None,
                streamer=stream, tokenizer=tokenizer)


def cmd_generate(args) -> int:
    from ..compiler import compile as compile_model

    from ..llm.generation import Decoder, generate
    from ..llm.open_decoder import prefill_path
    from ..models.oracle import chat_prompt_ids
    from ..targets import resolve_target

    texts = _prompt_texts(args)
    genai = _genai_setup(args, texts, chat_prompt_ids)
    if genai is not None:
        return _generate_and_print(args, *genai)
    if args.max_length is not None:
        raise UsageError("--max-length applies to onnxruntime-genai and optimum-style folders; the KV cache of "
                         f"'{args.model}' has the length it was built with")
    info = _load(args, len(texts))
    ids = [_prompt_ids(info, t, chat_prompt_ids) for t in texts]
    cache = info.config.get("max_cache_len")
    for p in ids:
        if cache and len(p) >= cache:
            raise UsageError(f"the prompt has {len(p)} tokens; the model's KV cache holds {cache}")
    model_arg.fp16_warnings(args.fp16, resolve_target(args.target))
    hip_graph = True if args.hip_graph else None
    prog = compile_model(str(info.onnx_path), target=args.target, hip_graph=hip_graph, fp16=args.fp16)
    return _generate_and_print(args, info, ids, Decoder(prog, prefill=prefill_path(info)))


def _genai_setup(args, texts, chat_prompt_ids):
    """``(info, prompt ids, runner)`` for an onnxruntime-genai folder (genai_config.json) or
    ``smollm2-genai``, or an optimum-style folder (config.json + model.onnx), ``llama-optimum`` or
    ``smollm2-optimum``; else None."""
    import os
    from types import SimpleNamespace

    from ..llm.runner import FOLDER_MODELS, GenaiLayout, GenaiRunner, is_genai_folder, length_bucket
    from ..llm.optimum_runner import OptimumRunner, is_optimum_folder, read_folder

    folder = args.model
    if args.model in FOLDER_MODELS and not os.path.isdir(args.model):
        from ..models import build

        folder = build(args.model).directory
    if is_genai_folder(folder):
        lay = GenaiLayout.read(folder)
        eos, vocab, ctx, cls = lay.eos_token_ids, lay.vocab_size, lay.context_length, GenaiRunner
    elif is_optimum_folder(folder):
        sizes = read_folder(folder)
        eos, vocab, ctx, cls = sizes["eos_token_ids"], sizes["vocab_size"], sizes["context_length"], OptimumRunner
    else:
        return None
    tok = str(folder) if os.path.isfile(os.path.join(str(folder), "tokenizer.json")) else None
    info = SimpleNamespace(name=os.path.basename(os.path.normpath(str(folder))), tokenizer_dir=tok,
                           config={"eos_token_ids": eos, "vocab_size": vocab})
    ids = [_prompt_ids(info, t, chat_prompt_ids) for t in texts]
    m = args.max_length
    if m is None:
        m = length_bucket(max(len(p) for p in ids) + args.max_new_tokens, ctx)
    if not 1 <= m <= ctx:
        raise UsageError(f"--max-length must be in 1..{ctx} (the context length), got {m}")
    for p in ids:
        if len(p) > m:
            raise UsageError(f"the prompt has {len(p)} tokens; --max-length is {m}")
    from ..targets import resolve_target


    model_arg.fp16_warnings(args.fp16, resolve_target(args.target))
    runner = cls(folder, batch=len(ids), max_length=m, target=args.target,
                 hip_graph=True if args.hip_graph else None, fp16=args.fp16)
    return info, ids, runner


def _generate_and_print(args, info, ids, dec) -> int:
    """Generate from ``ids`` with ``dec`` (a Decoder or a GenaiRunner), print the text and the report."""
    from ..llm.generation import generate

    prog = dec.program
    single = len(ids) == 1
    tokenizer = _tokenizer(info)
    opts = _options(args, info, tokenizer, single)
    results = generate(dec, ids[0] if single else ids, args.max_new_tokens, **opts)
    results = [results] if single else results
    for k, res in enumerate(results):
        if not single:
            sys.stdout.write(f"[{k + 1}] ")
        if single and opts["streamer"] is not None:
            sys.stdout.write("\n")
        else:
            sys.stdout.write(res.text + "\n")
        if res.finish_reason == "cache_full":
            print(f"(stopped: the KV cache is full at {dec.max_len} positions)")
    _print_generation(info, prog, dec, results, args)
    (dec.release if hasattr(dec, "release") else prog.release)()
    return 0


def _tokenizer(info):
    if not info.tokenizer_dir:
        return IdText()
    from ..models.oracle import _tokenizer

    return _tokenizer(info)


def outside_parts(dec, args) -> list:
    """What one step launches outside the program, ``[(count, what), ...]``: the runner's own
    (``dec.host_op_parts``) and the read of the next token (an argmax, or the logits read back when
    sampling or a repetition penalty needs them)."""
    sampled = args.do_sample or args.repetition_penalty != 1.0
    if sampled and hasattr(dec, "sample_op_parts"):  # the sampling rule's kernels, or the logits read back
        return list(dec.sample_op_parts(args.do_sample))
    read = "logits read-back" if sampled else "argmax"
    parts = dec.host_op_parts if sampled or getattr(dec, "batch", 1) != 1 else \
        getattr(dec, "greedy_op_parts", dec.host_op_parts)
    return [*parts, (1, read)]


def _print_generation(info, prog, dec, results, args) -> None:
    from ..llm.generation import describe_host_ops

    res = results[0]
    st = res.stats
    launches = st["launches_per_run"]
    parts = outside_parts(dec, args)
    outside = sum(n for n, _ in parts)
    print(f"--- {info.name} on {prog.target} ({'fp16' if args.fp16 else 'fp32'}), graphs "
          f"{'on' if prog.hip_graph else 'off'}" + (f", batch {dec.batch}" if dec.batch > 1 else ""))
    prompt = ", ".join(str(r.prompt_tokens) for r in results)
    made = ", ".join(str(len(r.tokens)) for r in results)
    finish = ", ".join(r.finish_reason for r in results)
    print(f"prompt tokens: {prompt}, generated: {made} ({finish}), prefill {res.prefill_s * 1e3:.1f} ms")
    unit = "token" if len(results) == 1 else "step"
    if res.steps >= 2:
        made_n = sum(len(r.tokens) for r in results)
        per_s = (made_n - len(results)) / res.decode_s if res.decode_s else 0.0
        speed = (f"ms/{unit}: {res.ms_per_token:.3f}  tokens/s: "
                 f"{res.tokens_per_s if len(results) == 1 else per_s:.1f}")
    else:
        speed = f"ms/{unit}: n/a (needs 2 generated tokens)"
    print(f"{speed}  launches/{unit}: {launches} (+{outside} outside the program: {describe_host_ops(parts)})  "
          f"host us/run: {res.host_us_per_step:.1f}")
    print("graph stats: " + json.dumps({k: st[k] for k in ("captures", "replays", "fallbacks", "warmups",
                                                              "eager_runs", "launches_per_run_eager")}))
    for r in st["regions"]:
        print(f"  region {r['region']}: {r['instructions']} instructions, {r['launches_eager']} launches eager, "
              f"graph nodes {r['graph_nodes']}, captures {r['captures']}, replays {r['replays']}, "
              f"fallbacks {r['fallbacks']}" + (f", failed: {r['failed_keys']}" if r['failed_keys'] else ""))
