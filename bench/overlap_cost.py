"""Cost of the bind-time overlap check of ``run_async`` (inputs against the program's own memory).

Builds the random GPT-2 decode step (``--layers`` layers: 2 + 2 * layers parameters, 60 by default,
the KV cache bound in place), compiles it, and times :meth:`InputStaging.check` on the step's
validated inputs, in blocks of ``--block`` calls, ``--blocks`` blocks; the median over blocks of the
per-call time is reported in microseconds for two cases:

* ``same_arrays``: the same input arrays every call (a decode loop): the verdict of each array is
  remembered, one identity test per input;
* ``new_arrays``: a new array object every call for every input (new views of the same buffers):
  every input's pointer range is compared with the program's ranges.

For scale it also reports the median wall time of a whole ``run_async`` call of the step (the same
arrays every call, graphs off) and the check's share of it.

    python bench/overlap_cost.py --out bench/results/overlap_cost_ref.json [--target ref] [--layers 29]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_info  # noqa: E402

import mgx_graph  # noqa: E402
from mgx_graph.llm.generation import Decoder  # noqa: E402


def _per_call_us(fn, inputs_for, block: int, blocks: int) -> float:
    """Median over ``blocks`` of the mean time per call (µs) of ``fn(inputs_for(i))`` over ``block`` calls."""
    per = []
    for b in range(blocks):
        args = [inputs_for(b * block + i) for i in range(block)]
        t0 = time.perf_counter_ns()
        for a in args:
            fn(a)
        per.append((time.perf_counter_ns() - t0) / block / 1e3)
    return statistics.median(per)


def measure(info, target: str, block: int, blocks: int, steps: int) -> dict:
    prog = mgx_graph.compile(str(info.onnx_path), target=target, hip_graph=False)
    dec = Decoder(prog)
    ex = prog.executor
    values = [(s, dec.params[name]) for name, s, _ in ex.param_specs]
    staging = ex.staging
    same = _per_call_us(staging.check, lambda i: values, block, blocks)
    # fresh array objects over the same buffers: the remembered verdicts never apply
    fresh = [[(s, a.view()) for s, a in values] for _ in range(block * blocks)]
    new = _per_call_us(staging.check, lambda i: fresh[i], block, blocks)
    staged = sum(len(staging.check(v)) for v in fresh[:10])
    walls = []
    for i in range(steps):
        dec.position = i % (dec.max_len - 1)
        dec.step(1, want_next=False)
        prog.context.synchronize(prog.queue)
        walls.append(dec.last_host_s * 1e6)
    run_us = statistics.median(walls[3:])
    prog.release()
    return {"inputs": len(values), "owned_ranges": len(staging.ranges),
            "check_us_same_arrays": round(same, 3), "check_us_new_arrays": round(new, 3),
            "inputs_staged_in_check": staged, "run_async_us": round(run_us, 1),
            "check_share_of_run_async": round(same / run_us, 5) if run_us else None,
            "calls_per_case": block * blocks, "block": block, "blocks": blocks}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/overlap_cost_ref.json")
    ap.add_argument("--target", default="ref")
    ap.add_argument("--layers", type=int, default=29, help="GPT-2 layers (2 + 2 * layers inputs)")
    ap.add_argument("--block", type=int, default=200)
    ap.add_argument("--blocks", type=int, default=100)
    ap.add_argument("--steps", type=int, default=200, help="run_async calls timed for scale")
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args(argv)
    from mgx_graph.models import build

    info = build("gpt2", cache_dir=args.cache_dir, progress=False, n_layer=args.layers, n_embd=64, n_head=4,
                 vocab_size=256, max_cache_len=16)
    res = measure(info, args.target, args.block, args.blocks, args.steps)
    out = {"benchmark": "overlap_cost", "model": f"gpt2 random, n_layer={args.layers}, n_embd=64, cache 16",
           "target": args.target, **res, "machine": machine_info()}
    print(f"overlap check, {res['inputs']} inputs, {res['owned_ranges']} owned ranges: "
          f"{res['check_us_same_arrays']:.2f} us/call (same arrays), {res['check_us_new_arrays']:.2f} us/call "
          f"(new arrays); run_async {res['run_async_us']:.0f} us/call")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
