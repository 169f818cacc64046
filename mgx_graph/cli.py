"""mgx-graph: compile and run ONNX models with graph_launch capture and replay.

commands:
  generate MODEL --prompt TEXT   greedy text generation with a decoder (smollm2, gpt2, llama, or a folder)
  compile MODEL.onnx             print the compiled program, its graph_launch regions and scratch size
  verify MODEL.onnx              compare the target with ref and onnxruntime on random inputs (PASS/FAIL)
  run MODEL.onnx                 one run with random or given inputs; save the outputs
  perf MODEL.onnx                per-instruction times and a summary, like migraphx-driver perf

MIGRAPHX_HIP_GRAPH=1 turns graphs on as --hip-graph does.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np


class UsageError(Exception):
    pass


def _article(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


def _load_model(name: str, progress: bool = True):
    from .models import build, list_models, load_info

    if os.path.isdir(name):
        if not os.path.exists(os.path.join(name, "model.json")):
            raise UsageError(f"folder '{name}' holds no model.json (a model built by mgx_graph.models)")
        return load_info(name)
    if name not in list_models():
        raise UsageError(f"unknown model '{name}': use one of {', '.join(list_models())} or a built model folder")
    return build(name, progress=progress)


def _input_dims(values) -> dict:
    dims = {}
    for group in values or []:
        if not group or not group[0].startswith("@") or len(group[0]) < 2:
            raise UsageError("--input-dim expects @name d1 d2 ...")
        try:
            dims[group[0][1:]] = [int(d) for d in group[1:]]
        except ValueError:
            raise UsageError(f"--input-dim {' '.join(group)}: dims must be integers") from None
    return dims


def cmd_generate(args) -> int:
    import mgx_graph
    from .generate import Decoder, generate
    from .models.oracle import chat_prompt_ids, decode_tokens

    if args.max_new_tokens < 1:
        raise UsageError("--max-new-tokens must be at least 1")
    from .models import _builder, list_models

    if args.model in list_models() and getattr(_builder(args.model), "KIND", "decoder") == "encoder":
        raise UsageError(f"model '{args.model}' is an encoder model, not a decoder: 'generate' needs a decode step "
                         f"with a KV cache; use 'run' or 'verify' instead")  # refused before building it
    info = _load_model(args.model)
    if info.config.get("kind") not in ("static", "dynamic"):
        kind = _article(info.config.get("kind") or "non-decoder")
        raise UsageError(f"model '{info.name}' is {kind} model, not a decoder: 'generate' needs "
                         f"a decode step with a KV cache; use 'run' or 'verify' instead")
    if info.tokenizer_dir:
        ids = chat_prompt_ids(info, args.prompt)
    else:
        try:  # models without a tokenizer (gpt2, llama: random weights) take token ids
            ids = [int(t) for t in args.prompt.split()]
        except ValueError:
            raise UsageError(f"model '{info.name}' has no tokenizer: --prompt must be space-separated token ids "
                             f"(0..{info.config['vocab_size'] - 1 if info.config.get('vocab_size') else '?'})") from None
        vocab = info.config.get("vocab_size")
        bad = [t for t in ids if vocab and not 0 <= t < vocab]
        if bad or not ids:
            raise UsageError(f"token ids must be in 0..{vocab - 1 if vocab else '?'}; got {bad or 'none'}")
    cache = info.config.get("max_cache_len")
    if cache and len(ids) >= cache:
        raise UsageError(f"the prompt has {len(ids)} tokens; the model's KV cache holds {cache}")
    hip_graph = True if args.hip_graph else None
    prog = mgx_graph.compile(str(info.onnx_path), target=args.target, hip_graph=hip_graph, fp16=args.fp16)
    dec = Decoder(prog)
    printed = [""]
    generated = []

    def on_token(t):
        generated.append(t)
        if info.tokenizer_dir:
            text = decode_tokens(info, generated)
            sys.stdout.write(text[len(printed[0]):])
            printed[0] = text
        else:
            sys.stdout.write(f"{t} ")
        sys.stdout.flush()

    eos = info.config.get("eos_token_ids", [])
    res = generate(dec, ids, args.max_new_tokens, eos, on_token)
    sys.stdout.write("\n")
    if len(res.tokens) < args.max_new_tokens and (not res.tokens or res.tokens[-1] not in set(eos)):
        print(f"(stopped: the KV cache is full at {dec.max_len} positions)")
    st = res.stats
    launches = st["launches_per_run"]
    print(f"--- {info.name} on {prog.target} ({'fp16' if args.fp16 else 'fp32'}), graphs "
          f"{'on' if prog.hip_graph else 'off'}")
    print(f"prompt tokens: {res.prompt_tokens}, generated: {len(res.tokens)}, prefill {res.prefill_s * 1e3:.1f} ms")
    speed = (f"ms/token: {res.ms_per_token:.3f}  tokens/s: {res.tokens_per_s:.1f}" if len(res.tokens) >= 2
             else "ms/token: n/a (needs 2 generated tokens)")
    print(f"{speed}  launches/token: {launches} (+3 outside the program: 2 fills, 1 argmax)  "
          f"host us/run: {res.host_us_per_step:.1f}")
    print("graph stats: " + json.dumps({k: st[k] for k in ("captures", "replays", "fallbacks", "warmups",
                                                              "eager_runs", "launches_per_run_eager")}))
    for r in st["regions"]:
        print(f"  region {r['region']}: {r['instructions']} instructions, {r['launches_eager']} launches eager, "
              f"graph nodes {r['graph_nodes']}, captures {r['captures']}, replays {r['replays']}, "
              f"fallbacks {r['fallbacks']}" + (f", failed: {r['failed_keys']}" if r['failed_keys'] else ""))
    prog.release()
    return 0


def _model_path(name: str) -> str:
    """An .onnx path, or a registry name / built model folder (its model.onnx)."""
    if os.path.isfile(name) or name.endswith(".onnx"):
        return name
    return str(_load_model(name).onnx_path)


def _compile(args, target=None, hip_graph=None):
    import mgx_graph

    hg = hip_graph if hip_graph is not None else (True if getattr(args, "hip_graph", False) else None)
    return mgx_graph.compile(_model_path(args.model), target=target or args.target, hip_graph=hg,
                             input_dims=_input_dims(getattr(args, "input_dim", None)),
                             fp16=getattr(args, "fp16", False), alias=None)


def cmd_compile(args) -> int:
    prog = _compile(args)
    d = getattr(prog, "_dispatch", None)
    if d is not None and prog._compiled is None:
        print("the program's shapes depend on run-time values: it is specialized at its first run")
        return 0
    if args.print:
        print(prog.print())
    regions = [m for m in prog.modules if ":graph_launch" in m]
    print(f"graph_launch regions: {len(regions)}")
    for name in regions:
        n = sum(1 for i in prog.modules[name].instructions if not i.op.builtin)
        print(f"  {name}: {n} instructions")
    st = prog.stats()
    print(f"peak scratch bytes: {st['scratch_bytes']}")
    print(f"literal bytes: {st['literal_bytes']}")
    prog.release()
    return 0


def random_inputs(prog_or_shapes, seed: int = 0) -> dict:
    """Seeded random inputs for every parameter: floats in [-1, 1), ints in {0, 1} (valid indices for
    any table with two rows or more, e.g. token_type_ids), bools. Give real values with --input."""
    shapes = prog_or_shapes.get_parameter_shapes() if hasattr(prog_or_shapes, "get_parameter_shapes") \
        else prog_or_shapes
    rng = np.random.default_rng(seed)
    out = {}
    for name, s in sorted(shapes.items()):
        dt = np.dtype(s.dtype)
        if dt.kind == "f":
            out[name] = rng.uniform(-1, 1, size=s.lens).astype(dt)
        elif dt.kind in "iu":
            out[name] = rng.integers(0, 2, size=s.lens).astype(dt)
        elif dt.kind == "b":
            out[name] = rng.random(size=s.lens) > 0.5
        else:
            raise UsageError(f"parameter '{name}': cannot generate random {s.dtype} values; give it with --input")
    return out


def _load_inputs(specs, prog) -> dict:
    """``name=file`` (.npy or ONNX TensorProto .pb) for some inputs; the others random."""
    feeds = random_inputs(prog)
    for spec in specs or []:
        if "=" not in spec:
            raise UsageError(f"--input expects name=file.npy|file.pb, got '{spec}'")
        name, path = spec.split("=", 1)
        if name not in feeds:
            raise UsageError(f"--input names '{name}', which is not a parameter ({', '.join(sorted(feeds))})")
        if path.endswith(".pb"):
            import onnx
            from onnx import numpy_helper

            t = onnx.TensorProto()
            with open(path, "rb") as f:
                t.ParseFromString(f.read())
            feeds[name] = numpy_helper.to_array(t)
        else:
            feeds[name] = np.load(path)
    return feeds


def _errors(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    diff = np.abs(a - b)
    finite = np.isfinite(diff)
    same_nonfinite = np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(np.isinf(a), np.isinf(b))
    absd = float(diff[finite].max()) if finite.any() else 0.0
    rel = float((diff[finite] / np.maximum(np.abs(b[finite]), 1e-12)).max()) if finite.any() else 0.0
    rms = float(np.sqrt(np.mean(diff[finite] ** 2))) if finite.any() else 0.0
    return absd, rel, rms, same_nonfinite


def cmd_verify(args) -> int:
    import onnxruntime as ort

    path = _model_path(args.model)
    target = _compile(args)
    ref = _compile(args, target="ref", hip_graph=False)
    feeds = _load_inputs(args.input, ref)
    print(f"Running [ {target.target}{' + graph_launch' if target.hip_graph else ''} ]: {path}")
    runs = 4 if target.hip_graph else 1
    for _ in range(runs):  # warmup, warmup, capture, replay: the compared outputs come from a replay
        got = target.run(feeds)
    print("Running [ ref ]")
    want_ref = ref.run(feeds)
    print("Running [ onnxruntime CPU ]")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want_ort = sess.run(None, feeds)
    names = target.get_output_names() or [f"output_{k}" for k in range(len(got))]
    ok = True
    for k, (name, g, r, o) in enumerate(zip(names, got, want_ref, want_ort)):
        for label, w in (("onnxruntime", o), ("ref", r)):
            w = np.asarray(w)
            if g.shape != w.shape or g.dtype != w.dtype:
                print(f"output {k} '{name}': {g.dtype}{list(g.shape)} vs {label} {w.dtype}{list(w.shape)}: FAILED")
                ok = False
                continue
            if g.dtype.kind in "fc":
                absd, rel, rms, nf = _errors(g, w)
                good = nf and np.allclose(g, w, rtol=args.rtol, atol=args.atol, equal_nan=True)
                print(f"output {k} '{name}' {g.dtype}{list(g.shape)} vs {label}: max abs error {absd:.3g}, "
                      f"max rel error {rel:.3g}, rms error {rms:.3g}: {'PASSED' if good else 'FAILED'}")
            else:
                good = np.array_equal(g, w)
                print(f"output {k} '{name}' {g.dtype}{list(g.shape)} vs {label}: "
                      f"{'identical' if good else 'different'}: {'PASSED' if good else 'FAILED'}")
            ok = ok and good
    st = target.stats()
    if target.hip_graph:
        print(f"graph: captures {st['captures']}, replays {st['replays']}, fallbacks {st['fallbacks']}")
    print("PASSED" if ok else "FAILED")
    target.release()
    ref.release()
    return 0 if ok else 1


def cmd_run(args) -> int:
    prog = _compile(args)
    feeds = _load_inputs(args.input, prog)
    outs = prog.run(feeds)
    names = prog.get_output_names() or [f"output_{k}" for k in range(len(outs))]
    os.makedirs(args.output_dir, exist_ok=True)
    for name, o in zip(names, outs):
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
        path = os.path.join(args.output_dir, f"{safe}.npy")
        np.save(path, o)
        print(f"{name}: {o.dtype}{list(o.shape)} -> {path}")
    prog.release()
    return 0


def _hip_graph_env() -> bool:
    from .program import hip_graph_from_env

    return hip_graph_from_env()


def _common_average(v):
    """Mean without the top and bottom quartiles (MIGraphX's common_average)."""
    v = sorted(v)
    n = len(v)
    q = n // 4
    mid = v[q:n - q] or v
    return sum(mid) / len(mid)


def cmd_perf(args) -> int:
    import time

    prog = _compile(args, hip_graph=False)
    feeds = _load_inputs(args.input, prog)
    prog.run(feeds)
    rows = prog._compiled.profile(feeds, runs=args.iterations)
    totals = []
    for _ in range(args.iterations):
        t0 = time.perf_counter()
        prog.run(feeds)
        totals.append((time.perf_counter() - t0) * 1e3)
    eager_launches = prog.stats()["launches_per_run"]
    per_ins = [(lab, op, _common_average(t)) for lab, op, t in rows]
    total_ins = sum(t for _, _, t in per_ins)
    for lab, op, t in per_ins:
        print(f"{lab}: {t:.5f}ms, {100 * t / max(total_ins, 1e-12):.2f}%")
    print()
    print("Summary:")
    groups = {}
    for _, op, t in per_ins:
        groups.setdefault(op, []).append(t)
    for op, ts in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        print(f"{op}: {sum(ts):.5f}ms / {len(ts)} = {sum(ts) / len(ts):.5f}ms, {100 * sum(ts) / max(total_ins, 1e-12):.2f}%")
    print()
    mean = sum(totals) / len(totals)
    avg = _common_average(totals)
    s = sorted(totals)

    def pct(p):
        return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]

    batch = 1
    print(f"Batch size: {batch}")
    print(f"Rate: {1000.0 / avg * batch:.3f} inferences/sec")
    print(f"Total time: {avg:.5f}ms (Min: {s[0]:.5f}ms, Max: {s[-1]:.5f}ms, Mean: {mean:.5f}ms, "
          f"Median: {s[len(s) // 2]:.5f}ms)")
    print(f"Percentiles (90%, 95%, 99%): ({pct(90):.5f}ms, {pct(95):.5f}ms, {pct(99):.5f}ms)")
    print(f"Total instructions time: {total_ins:.5f}ms")
    print(f"Overhead time: {max(avg - total_ins, 0):.5f}ms")
    print(f"Overhead: {100 * max(avg - total_ins, 0) / avg:.2f}%")
    print(f"Launches per run: {eager_launches}")
    prog.release()
    if args.hip_graph or _hip_graph_env():
        g = _compile(args, hip_graph=True)
        for _ in range(3):
            g.run(feeds)
        gt = []
        for _ in range(args.iterations):
            t0 = time.perf_counter()
            g.run(feeds)
            gt.append((time.perf_counter() - t0) * 1e3)
        st = g.stats()
        ga = _common_average(gt)
        print(f"Graph (graph_launch) total time: {ga:.5f}ms vs eager {avg:.5f}ms ({avg / ga:.2f}x); "
              f"launches per run: {st['launches_per_run']} vs {eager_launches}; regions: {len(st['regions'])}, "
              f"captures {st['captures']}, replays {st['replays']}, fallbacks {st['fallbacks']}")
        g.release()
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mgx-graph", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text with a decoder model (greedy)")
    g.add_argument("model", help="smollm2 (real, with a tokenizer), gpt2 or llama (random weights: the prompt is "
                                 "token ids), or a built model folder")
    g.add_argument("--prompt", required=True, help="text (smollm2) or space-separated token ids")
    g.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate (default 32)")
    g.add_argument("--target", default="auto", choices=["auto", "gpu", "ref"], help="default: gpu if usable")
    g.add_argument("--hip-graph", action="store_true", help="wrap the step in graph_launch (or MIGRAPHX_HIP_GRAPH=1)")
    g.add_argument("--fp16", action="store_true", help="run in half precision")
    g.set_defaults(fn=cmd_generate)

    def model_cmd(name, help_, fn):
        c = sub.add_parser(name, help=help_)
        c.add_argument("model", help="an .onnx file, a registry name or a built model folder")
        c.add_argument("--target", default="auto", choices=["auto", "gpu", "ref"])
        c.add_argument("--hip-graph", action="store_true", help="wrap capturable runs in graph_launch")
        c.add_argument("--fp16", action="store_true")
        c.add_argument("--input-dim", nargs="+", action="append", metavar="@name d", help="@name d1 d2 ...")
        c.set_defaults(fn=fn)
        return c

    c = model_cmd("compile", "compile an ONNX model and print the program", cmd_compile)
    c.add_argument("--print", action="store_true", help="print every module")
    v = model_cmd("verify", "compare the target with ref and onnxruntime (seeded random inputs)", cmd_verify)
    v.add_argument("--rtol", type=float, default=1e-3)
    v.add_argument("--atol", type=float, default=1e-4)
    v.add_argument("--input", action="append", metavar="name=file", help=".npy or .pb for an input")
    r = model_cmd("run", "one run; outputs saved as .npy", cmd_run)
    r.add_argument("--input", action="append", metavar="name=file", help=".npy or .pb for an input")
    r.add_argument("--output-dir", default="mgx_outputs")
    p = model_cmd("perf", "per-instruction times and a summary (migraphx-driver perf layout)", cmd_perf)
    p.add_argument("-n", "--iterations", type=int, default=100)
    p.add_argument("--input", action="append", metavar="name=file", help=".npy or .pb for an input")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from .errors import MgxError

    try:
        return args.fn(args)
    except (MgxError, UsageError) as e:
        print(f"mgx-graph: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. piped into head
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except Exception as e:  # a build or environment problem: one clear line, not a traceback
        name = type(e).__name__
        if name in ("BuildError", "VerificationError", "ValueError", "FileNotFoundError", "PermissionError",
                    "OSError", "ImportError", "ModuleNotFoundError"):
            print(f"mgx-graph: error: {name}: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
