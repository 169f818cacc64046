"""Soak and churn runs of a decode step with graph_launch on the GPU.

soak:  replay the step ``--steps`` times (10,000 by default) and record the device memory in use every
       1,000 replays (runtime free/total and CuPy's pool); the growth over the last 9,000 replays must
       be zero (below 1 MiB).
churn: ``--churn`` calls (1,000) where the inputs live in a freshly allocated buffer every call (a new
       device pointer, so a new graph key each call) next to an eager program fed the same tokens; the
       logits are compared every call, and captures / exec updates are counted: captures stay at or
       under the cap (``max_graphs``) and most calls are served by updating an exec.
dynamic: ``--shapes`` calls (1,000) of two dynamic programs, each call with shapes no other call has
       (at most 1,000 elements): symbolic dims (``x: float32[A, B]``, 40 x 25 pairs) and a
       value-dependent shape (``ConstantOfShape(ReduceMax(n)) + x``, ``n: int64[A]`` with largest value B,
       so every call needs a new prefix program and a new specialization).  Outputs are compared with
       onnxruntime every call; live queues, bytes allocated through the runtime, process RSS, and the
       specializations, prefix programs and shape hints kept are sampled before, every 100 calls and
       after release: they must stay within what ``max_specializations`` (``--dyn-cap``) programs hold
       (bytes: that many times what one call's programs hold at the largest shapes), and come back to
       the start on release.

    python bench/soak.py --out bench/results/soak_h200.json [--model smollm2|llama] [--target gpu]
    python bench/soak.py --out bench/results/soak_dynamic_ref.json --parts dynamic --target ref
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
from mgx_graph.llm.generation import Decoder  # noqa: E402


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


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _books(rt, prog=None) -> dict:
    import gc

    gc.collect()
    c = rt.counters()
    d = {"live_queues": c["live_queues"], "allocated_bytes": c["allocated_bytes"],
         "held_releases": c["held_releases"], "rss_bytes": _rss_bytes()}
    if prog is not None:
        st = prog.stats()
        d.update({k: st[k] for k in ("specializations", "prefix_programs", "shape_hints",
                                     "specialization_compiles", "specialization_evictions", "prefix_evictions")})
    return d


def dynamic_models():
    """(name, model, feeds for call i, feeds of the largest call) of the two programs of the dynamic soak:
    call i < 1000 has shapes no other call has, of at most 1,000 elements."""
    from onnx import TensorProto, helper

    r = np.random.default_rng(7)

    def model(nodes, inputs):
        g = helper.make_graph(nodes, "soak", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
        m.ir_version = 8
        return m

    def dims(i):  # (a, b): 40 x 25 distinct pairs
        return 1 + i % 40, 1 + (i // 40) % 25

    batch = model([helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("ReduceSum", ["t"], ["y"], keepdims=1)],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["A", "B"])])
    fill = helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5])
    value = model([helper.make_node("ReduceMax", ["n"], ["k"], keepdims=1),
                   helper.make_node("ConstantOfShape", ["k"], ["c"], value=fill), helper.make_node("Add", ["c", "x"], ["y"])],
                  [helper.make_tensor_value_info("n", TensorProto.INT64, ["L"]),
                   helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])])

    def batch_feeds(i):
        return {"x": r.normal(size=dims(i)).astype(np.float32)}

    def value_feeds(i):  # n has a elements, its largest is b: the output has b elements
        a, b = dims(i)
        n = r.integers(1, b + 1, size=a).astype(np.int64)
        n[r.integers(a)] = b
        return {"n": n, "x": r.normal(size=1).astype(np.float32)}

    largest = 40 * 25 - 1
    return [("symbolic_batch", batch, batch_feeds, batch_feeds(largest)),
            ("value_dependent_shape", value, value_feeds, value_feeds(largest))]


def _one_call_bytes(model, feeds, target) -> int:
    """Bytes a fresh dynamic program holds after one call with ``feeds`` (all its programs)."""
    rt = _runtime(target)
    before = rt.counters()["allocated_bytes"]
    prog = mgx_graph.compile(model, target=target, hip_graph=False)
    prog.run(feeds)
    held = rt.counters()["allocated_bytes"] - before
    prog.release()
    return held


def dynamic_soak(name, model, feeds_for, largest, target, calls, cap, every=100):
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    bytes_bound = cap * _one_call_bytes(model, largest, target)
    rt = _runtime(target)
    before = _books(rt)
    prog = mgx_graph.compile(model, target=target, hip_graph=False, max_specializations=cap)
    samples, mismatches, worst, shapes = [], 0, 0.0, set()
    t0 = time.perf_counter()
    for i in range(calls):
        feeds = feeds_for(i)
        got, want = prog.run(feeds)[0], sess.run(None, feeds)[0]
        shapes.add(tuple((k, v.shape) for k, v in feeds.items()) + (want.shape,))
        err = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("inf")
        worst = max(worst, err)
        mismatches += got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-5)  # float32 tolerance
        if (i + 1) % every == 0:
            samples.append({"calls": i + 1, **_books(rt, prog)})
    wall = time.perf_counter() - t0
    prog.release()
    after = _books(rt)
    peak = {k: max(s[k] for s in samples) for k in ("live_queues", "allocated_bytes", "specializations",
                                                     "prefix_programs", "shape_hints")}
    bounded = (peak["specializations"] <= cap and peak["prefix_programs"] <= cap and peak["shape_hints"] <= 8 * cap
               and peak["live_queues"] - before["live_queues"] <= 2 * cap
               and peak["allocated_bytes"] - before["allocated_bytes"] <= bytes_bound)
    return {"model": name, "calls": calls, "distinct_shapes": len(shapes), "max_specializations": cap,
            "wall_s": round(wall, 2), "mismatches_vs_onnxruntime": int(mismatches), "max_abs_error": worst,
            "allocated_bytes_bound": bytes_bound, "before": before, "samples": samples, "after_release": after,
            "peak": peak, "bounded": bool(bounded),
            "released_to_start": after["live_queues"] == before["live_queues"] and
            after["allocated_bytes"] == before["allocated_bytes"] and after["held_releases"] == 0,
            "rss_growth_after_first_sample_bytes": samples[-1]["rss_bytes"] - samples[0]["rss_bytes"]}


def _runtime(target):
    from mgx_graph.runtime import device_runtime, host_runtime

    return host_runtime() if target == "ref" else device_runtime()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "llama"])
    ap.add_argument("--target", default="gpu")
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--every", type=int, default=1000)
    ap.add_argument("--churn", type=int, default=1000)
    ap.add_argument("--cap", type=int, default=8)
    ap.add_argument("--shapes", type=int, default=1000, help="calls (each a new shape) of the dynamic soak")
    ap.add_argument("--dyn-cap", type=int, default=8, help="max_specializations of the dynamic soak")
    ap.add_argument("--parts", default="soak,churn,dynamic", help="comma-separated: soak, churn, dynamic")
    args = ap.parse_args(argv)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    res = {"model": args.model, "target": args.target}
    if parts & {"soak", "churn"}:
        from mgx_graph.models import build

        info = build(args.model) if args.model == "smollm2" else build("llama", max_cache_len=64)
        if "soak" in parts:
            res["soak"] = soak(info, args.target, args.steps, args.every)
            print(json.dumps(res["soak"]), flush=True)
        if "churn" in parts:
            res["churn"] = churn(info, args.target, args.churn, args.cap)
            print(json.dumps(res["churn"]), flush=True)
    if "dynamic" in parts:
        res["dynamic"] = [dynamic_soak(name, model, feeds, largest, args.target, args.shapes, args.dyn_cap)
                          for name, model, feeds, largest in dynamic_models()]
        for d in res["dynamic"]:
            print(json.dumps({k: d[k] for k in ("model", "wall_s", "mismatches_vs_onnxruntime", "bounded",
                                                "released_to_start", "before", "peak", "after_release")}), flush=True)
    res["machine"] = machine_info()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
