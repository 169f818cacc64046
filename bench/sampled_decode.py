"""Sampled vs greedy decode, ms per step, in one process: ``generate`` pipelined on one row.

The W1 / W2 workloads of ``bench/peer_models.py`` (SmolLM2-135M, vocabulary 49152; the Llama-3.2-1B
shape, vocabulary 128256), fp16, graphs on, are run through :func:`mgx_graph.llm.generation.generate` with
``--tokens`` new tokens (no end-of-sequence id, so every run makes all of them) under each mode, the
modes interleaved ``--reps`` times (A B C A B C ...) so that a drift of the machine reaches all alike:

* ``greedy`` -- the argmax tail (one kernel);
* ``t0.7_p0.9`` -- temperature 0.7, top-p 0.9, no top-k (the sampling kernels: four);
* ``t0.7_p0.9_k50`` -- the same with transformers' default top-k 50;
* ``penalty1.2`` -- greedy with a repetition penalty of 1.2 (the sampling tail's first kernel).

Reported per mode: the median over reps of ``GenerationResult.ms_per_token`` (decode wall time over the
steps after the first), and its ratio to ``greedy``.  Writes JSON with the machine's details.

    python bench/sampled_decode.py [--work W1,W2] [--tokens 128] [--reps 5] [--tiny] [--target gpu] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_info  # noqa: E402
import peer_models as pm  # noqa: E402

MODES = {"greedy": {}, "t0.7_p0.9": dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=None),
         "t0.7_p0.9_k50": dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=50),
         "penalty1.2": dict(repetition_penalty=1.2)}


def time_work(work, args) -> dict:
    """The modes of one workload (see the module docstring); ``{"error": why}`` without its export."""
    import mgx_graph
    from mgx_graph.llm.generation import Decoder, generate

    info, why = pm.registry_build(work.registry, work.options, 1200)
    if info is None:
        return {"error": why}
    prompt = pm.prompt_ids(work, info)
    prog = mgx_graph.compile(str(info.onnx_path), target=args.target, hip_graph=True, fp16=True)
    dec = Decoder(prog)
    tokens = min(args.tokens, work.kv - len(prompt))
    for opts in MODES.values():  # warm: captures, kernel compiles
        generate(dec, prompt, 4, seed=0, **opts)
    reps = {m: [] for m in MODES}
    for rep in range(args.reps):
        for m, opts in MODES.items():
            res = generate(dec, prompt, tokens, seed=rep, **opts)
            reps[m].append(round(res.ms_per_token, 4))
            print(f"{work.name} rep {rep} {m:14s} {res.ms_per_token:.4f} ms/step", file=sys.stderr, flush=True)
    prog.release()
    med = {m: statistics.median(v) for m, v in reps.items()}
    return {"title": work.title, "tokens": tokens,
            "modes": {m: {"ms_per_step": med[m], "vs_greedy": round(med[m] / med["greedy"], 4), "reps": reps[m]}
                      for m in MODES}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="W1,W2", help="workloads, comma-separated (W1, W2)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tiny", action="store_true", help="the small workloads of peer_models (a CPU smoke run)")
    ap.add_argument("--target", default="gpu", choices=("gpu", "ref"))
    ap.add_argument("--out", default="sampled_decode.json")
    args = ap.parse_args(argv)
    if args.tokens < 2 or args.reps < 1:
        ap.error("--tokens must be >= 2 and --reps >= 1")
    works = pm.workloads(args.tiny)
    names = [w for w in args.work.split(",") if w]
    bad = [w for w in names if w not in works]
    if bad or not names:
        ap.error(f"unknown workloads {bad or names} (known: {', '.join(works)})")
    out = {"machine": machine_info(), "target": args.target, "reps": args.reps,
           "works": {w: time_work(works[w], args) for w in names}}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    for w, r in out["works"].items():
        if "error" in r:
            print(f"{w}: {r['error']}")
            continue
        for m, row in r["modes"].items():
            print(f"{w} {m:14s} {row['ms_per_step']:.4f} ms/step  x{row['vs_greedy']:.3f} of greedy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
