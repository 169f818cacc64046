"""Soak and churn runs of a decode step with graph_launch on the GPU.

soak:  replay the step ``--steps`` times (10,000 by default) and record the device memory in use every
       1,000 replays (runtime free/total and CuPy's pool); the growth over the last 9,000 replays must
       be zero (below 1 MiB).
churn: ``--churn`` calls (1,000) where the inputs live in a freshly allocated buffer every call (a new
       device pointer, so a new graph key each call) next to an eager program fed the same tokens; the
       logits are compared every call, and captures / exec updates are counted: captures stay at or
       under the cap (``max_graphs``) and most calls are served by updating an exec.

    python bench/soak.py --out bench/results/soak_h200.json [--model smollm2|llama] [--target gpu]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_info  # noqa: E402

import mgx_graph  # noqa: E402
from mgx_graph.generate import Decoder  # noqa: E402


def used_bytes(prog) -> dict:
    ctx = prog.context
    free, total = ctx.runtime.hipMemGetInfo()
    d = {"device_used_bytes": int(total - free)}
    if ctx.name == "gpu":
        pool = ctx.cupy.get_default_memory_pool()
        d["cupy_pool_used_bytes"] = int(pool.used_bytes())
        d["cupy_pool_total_bytes"] = int(pool.total_bytes())
    return d


def soak(info, target, steps, every):
    prog = mgx_graph.compile(str(info.onnx_path), target=target, hip_graph=True)
    dec = Decoder(prog)
    max_pos = dec.max_len - 1
    samples = []
    tok = 1
    t0 = time.perf_counter()
    for i in range(steps + 3):
        if dec.position >= max_pos:
            dec.position = 0  # wrap around: the step's work is the same at every position
        tok = dec.step(tok) % 1000
        if i >= 3 and (i - 3) % every == 0 or i == steps + 2:
            prog.context.synchronize(prog.queue)
            samples.append({"replays": prog.stats()["replays"], **used_bytes(prog)})
    wall = time.perf_counter() - t0
    st = prog.stats()
    prog.release()
    first = samples[1]["device_used_bytes"] if len(samples) > 1 else samples[0]["device_used_bytes"]
    growth = samples[-1]["device_used_bytes"] - first
    return {"steps": steps, "wall_s": round(wall, 2), "samples": samples,
            "growth_last_9000_replays_bytes": int(growth), "plateau": abs(growth) < (1 << 20),
            "captures": st["captures"], "replays": st["replays"], "fallbacks": st["fallbacks"]}


def churn(info, target, calls, cap):
    graph = mgx_graph.compile(str(info.onnx_path), target=target, hip_graph=True, warmup=1, max_graphs=cap)
    eager = mgx_graph.compile(str(info.onnx_path), target=target, hip_graph=False)
    dg, de = Decoder(graph), Decoder(eager)
    xp = graph.context.xp
    worst = 0.0
    mismatches = 0
    tok = 1
    keep = []  # every call's buffers stay alive, so the allocator cannot hand an address back
    t0 = time.perf_counter()
    for i in range(calls):
        if dg.position >= dg.max_len - 1:
            dg.reset()
            de.reset()
        with graph.context.on_queue(graph.queue):
            # the step's inputs in new buffers every call: a new device pointer, so a new graph key
            dg.params["input_ids"] = xp.full((1, 1), tok, dtype=np.int64)
            dg.params["cache_position"] = xp.full((1,), dg.position, dtype=np.int64)
            keep.append((dg.params["input_ids"], dg.params["cache_position"]))
            outs = graph.run_async(dg.params, graph.queue)
            dg.position += 1
            lg = graph.context.to_host(outs[dg.logits_index], graph.queue)
        de.step(tok)
        le = eager.context.to_host(de.last_logits, eager.queue)
        err = float(np.max(np.abs(lg.astype(np.float64) - le.astype(np.float64))))
        worst = max(worst, err)
        if err > 1e-3:
            mismatches += 1
        tok = int(le.reshape(-1).argmax()) % 1000
    wall = time.perf_counter() - t0
    st = graph.stats()
    graph.release()
    eager.release()
    return {"calls": calls, "cap": cap, "wall_s": round(wall, 2), "captures": st["captures"],
            "updates": st["updates"], "replays": st["replays"], "fallbacks": st["fallbacks"],
            "evictions": st["evictions"], "max_abs_logit_error_vs_eager": worst, "mismatches": mismatches,
            "captures_within_cap": st["captures"] <= cap, "most_calls_updated": st["updates"] > calls // 2}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "llama"])
    ap.add_argument("--target", default="gpu")
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--every", type=int, default=1000)
    ap.add_argument("--churn", type=int, default=1000)
    ap.add_argument("--cap", type=int, default=8)
    args = ap.parse_args(argv)
    from mgx_graph.models import build

    info = build(args.model) if args.model == "smollm2" else build("llama", max_cache_len=64)
    res = {"model": args.model, "target": args.target}
    res["soak"] = soak(info, args.target, args.steps, args.every)
    print(json.dumps(res["soak"]), flush=True)
    res["churn"] = churn(info, args.target, args.churn, args.cap)
    print(json.dumps(res["churn"]), flush=True)
    res["machine"] = machine_info()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
