"""``mgx-graph`` command line (also ``python -m mgx_graph``).

    mgx-graph generate MODEL --prompt TEXT [--max-new-tokens N] [--target gpu|ref|auto] [--hip-graph] [--fp16]
    mgx-graph compile MODEL.onnx [--target ...] [--hip-graph] [--input-dim @name d1 d2 ...] [--print]

MODEL is a registry name (``smollm2``, ``gpt2``; built on first use and cached) or a folder holding a
built ``model.json``.  ``MIGRAPHX_HIP_GRAPH=1`` turns graphs on as ``--hip-graph`` does.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def _load_model(name: str, progress: bool = True):
    from .models import build, load_info

    if os.path.isdir(name) and os.path.exists(os.path.join(name, "model.json")):
        return load_info(name)
    return build(name, progress=progress)


def _input_dims(values) -> dict:
    dims = {}
    for group in values or []:
        if not group or not group[0].startswith("@"):
            raise SystemExit("--input-dim expects @name d1 d2 ...")
        dims[group[0][1:]] = [int(d) for d in group[1:]]
    return dims


def cmd_generate(args) -> int:
    import mgx_graph
    from .generate import Decoder, generate
    from .models.oracle import chat_prompt_ids, decode_tokens

    info = _load_model(args.model)
    hip_graph = True if args.hip_graph else None
    prog = mgx_graph.compile(str(info.onnx_path), target=args.target, hip_graph=hip_graph, fp16=args.fp16)
    ids = chat_prompt_ids(info, args.prompt) if info.tokenizer_dir else [int(t) for t in args.prompt.split()]
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
    st = res.stats
    launches = st["launches_per_run"]
    print(f"--- {info.name} on {prog.target} ({'fp16' if args.fp16 else 'fp32'}), graphs "
          f"{'on' if prog.hip_graph else 'off'}")
    print(f"prompt tokens: {res.prompt_tokens}, generated: {len(res.tokens)}, prefill {res.prefill_s * 1e3:.1f} ms")
    print(f"ms/token: {res.ms_per_token:.3f}  tokens/s: {res.tokens_per_s:.1f}  "
          f"launches/token: {launches} (+3 outside the program: 2 fills, 1 argmax)  "
          f"host us/run: {res.host_us_per_step:.1f}")
    print("graph stats: " + json.dumps({k: st[k] for k in ("captures", "replays", "fallbacks", "warmups",
                                                              "eager_runs", "launches_per_run_eager")}))
    for r in st["regions"]:
        print(f"  region {r['region']}: {r['instructions']} instructions, {r['launches_eager']} launches eager, "
              f"graph nodes {r['graph_nodes']}, captures {r['captures']}, replays {r['replays']}, "
              f"fallbacks {r['fallbacks']}" + (f", failed: {r['failed_keys']}" if r['failed_keys'] else ""))
    prog.release()
    return 0


def cmd_compile(args) -> int:
    import mgx_graph

    prog = mgx_graph.compile(args.model, target=args.target, hip_graph=True if args.hip_graph else None,
                             input_dims=_input_dims(args.input_dim), fp16=args.fp16)
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


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mgx-graph", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text with a decoder model (greedy)")
    g.add_argument("model", help="registry name (smollm2, gpt2) or a built model folder")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-new-tokens", type=int, default=32)
    g.add_argument("--target", default="auto", choices=["auto", "gpu", "ref"])
    g.add_argument("--hip-graph", action="store_true", help="wrap the step in graph_launch (or MIGRAPHX_HIP_GRAPH=1)")
    g.add_argument("--fp16", action="store_true")
    g.set_defaults(fn=cmd_generate)
    c = sub.add_parser("compile", help="compile an ONNX model and print the program")
    c.add_argument("model")
    c.add_argument("--target", default="auto", choices=["auto", "gpu", "ref"])
    c.add_argument("--hip-graph", action="store_true")
    c.add_argument("--fp16", action="store_true")
    c.add_argument("--input-dim", nargs="+", action="append", metavar="@name d", help="@name d1 d2 ...")
    c.add_argument("--print", action="store_true")
    c.set_defaults(fn=cmd_compile)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from .errors import MgxError

    try:
        return args.fn(args)
    except MgxError as e:
        print(f"mgx-graph: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
