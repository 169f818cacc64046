"""``mgx-graph perf``: migraphx-driver's performance report for an mgx_graph program.

What is timed (``n`` iterations each, after one untimed run; times in milliseconds):

* **Total time**: whole runs, the queue synchronized at the end of each.  Inputs are device arrays
  made once before timing (no host copies in the runs), unless ``offload_copy`` is set: then each run
  copies the host inputs in and the outputs out (``Program.run``), as migraphx-driver's
  ``--enable-offload-copy``.  Reported as migraphx-driver does: the mean without the top and bottom
  quartiles (``common_average``), min, max, mean, median and the 90/95/99th percentiles (element
  ``floor(p * (n - 1))`` of the sorted times).
* **Total instructions time**: each instruction of ``main`` timed alone, the queue synchronized after
  it, over ``n`` profiled runs; the sum over instructions of each one's common average.
* **Overhead time**, two figures, both measured durations (so never below zero):

  1. *dry run*: runs in which no instruction executes (every step replaced by nothing): binding the
     parameters, walking the instruction list and collecting the outputs.  migraphx-driver's first
     figure (``program::dry_run``).  Its percent is of Total time.
  2. *outside instructions*: in the profiled runs, the time not inside any timed instruction (the
     same runs' wall time minus their instruction times, as means).  migraphx-driver computes its
     second figure as Total time - Total instructions time instead, which goes negative whenever
     instructions timed one at a time (each followed by a synchronization) add up to more than a
     pipelined whole run; this figure keeps the same meaning, the part of a run outside its
     instructions, with both terms from the same runs.  Its percent is of the profiled run time.
"""
from __future__ import annotations

import math
import sys
import time

import numpy as np



def common_average(v) -> float:
    """Mean without the top and bottom quartiles (MIGraphX's ``common_average``)."""
    v = sorted(v)
    q = len(v) // 4
    mid = v[q:len(v) - q] or v
    return sum(mid) / len(mid)


def percentile(v, p: float) -> float:
    """migraphx-driver's percentile: element ``floor(p * (n - 1))`` of the sorted values."""
    v = sorted(v)
    return v[int(p * (len(v) - 1))]


def median(v) -> float:
    v = sorted(v)
    m = len(v) // 2
    return (v[m - 1] + v[m]) / 2 if len(v) % 2 == 0 else v[m]


def device_inputs(prog, feeds: dict) -> dict:
    """Copies of host ``feeds`` as device arrays of ``prog``'s context (CuPy on gpu, numpy on ref),
    made on its queue and synchronized; ``prog`` must have run once (a dynamic program specializes)."""
    ctx = prog.context
    q = prog.queue
    with ctx.on_queue(q):
        dev = {n: ctx.xp.asarray(np.asarray(a, order="C")) for n, a in feeds.items()}
    ctx.synchronize(q)
    return dev


def _timed_runs(prog, host: dict, dev: dict, n: int, offload: bool, bar) -> list:
    ctx, q = prog.context, prog.queue
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        if offload:
            prog.run(host)
        else:
            prog.run_async(dev, q)
            ctx.synchronize(q)
        times.append((time.perf_counter() - t0) * 1e3)
        bar.update()
    return times


def _profiled_runs(ex, host: dict, dev: dict, n: int, offload: bool, bar):
    """Per-instruction times of ``main`` (:meth:`Executor.profile_steps`, on device-resident inputs
    unless ``offload``) and, per run, the wall time outside the timed instructions."""
    labels = ex.step_labels()
    per: list[list[float]] = [[] for _ in labels]
    outside, run_ms = [], []
    for _ in range(n):
        times, total = ex.profile_steps(host, device=False) if offload else ex.profile_steps(dev, device=True)
        for k, t in enumerate(times):
            per[k].append(t)
        run_ms.append(total)
        outside.append(total - sum(times))
        bar.update()
    rows = [named_row(ex, lab) + (t,) for lab, t in zip(labels, per)]
    return rows, outside, run_ms


# kernels an op can lower to besides its usual one, named in the report (the first word of their label)
KERNEL_NAMES = ("gemv", "gemv_nbits.cu", "dequant_nbits.cu")


def named_row(ex, label: str) -> tuple:
    """``(instruction, op)`` of the report for step ``label`` (``"main:@<n> <op>"``): the op's name
    without attributes, followed by ``(<kernel>)`` when its instruction runs one of ``KERNEL_NAMES``
    (a one-row ``dot`` lowered to the gemv kernel: ``dot (gemv)``; ``matmul_nbits (gemv_nbits.cu)`` /
    ``matmul_nbits (dequant_nbits.cu)``), so such instructions are summed apart from the op's other
    instructions."""
    op = label.split(" ", 1)[1].split("[")[0]
    where = label.split(" ", 1)[0]
    mod, _, idx = where.partition(":@")
    try:
        ins = ex.program.modules[mod].instructions[int(idx)]
    except (AttributeError, KeyError, IndexError, ValueError):
        return label, op
    k = ins.meta.get("kernel")
    name = getattr(k, "label", "").split(" ", 1)[0]
    if name in KERNEL_NAMES:
        return f"{label} ({name})", f"{op} ({name})"
    return label, op


def _dry_runs(ex, dev: dict, n: int, bar) -> list:
    """Runs in which no instruction executes (:meth:`Executor.dry_run`, migraphx-driver's dry run)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        ex.dry_run(dev)
        times.append((time.perf_counter() - t0) * 1e3)
        bar.update()
    return times


def measure(prog, feeds: dict, n: int, offload: bool = False, progress: bool = True) -> dict:
    """Time ``prog`` (compiled, graphs off) on host ``feeds``; returns the report as a dict (all times
    in ms; see the module docstring for what each figure is).  Raises ValueError when ``n`` < 1."""
    from tqdm import tqdm

    if n < 1:
        raise ValueError("the number of iterations must be at least 1")
    prog.run(feeds)  # untimed: allocates, specializes a dynamic program
    ex = prog.active_executor()
    dev = device_inputs(prog, feeds)
    with tqdm(total=3 * n + 1, desc="perf", unit="run", file=sys.stderr, disable=not progress, leave=False) as bar:
        _timed_runs(prog, feeds, dev, 1, offload, bar)  # untimed: the first run of the timed kind
        totals = _timed_runs(prog, feeds, dev, n, offload, bar)
        launches = prog.stats()["launches_per_run"]  # of a whole run (the profiled runs are not counted)
        rows, outside, run_ms = _profiled_runs(ex, feeds, dev, n, offload, bar)
        dry = _dry_runs(ex, {n_: ex.param_buffers[n_] for n_ in feeds} if offload else dev, n, bar)
    per_ins = [(lab, op, common_average(t)) for lab, op, t in rows]
    total_ins = sum(t for _, _, t in per_ins)
    groups: dict = {}
    for _, op, t in per_ins:
        groups.setdefault(op, []).append(t)
    total = common_average(totals)
    dry_ms = common_average(dry)
    outside_ms = float(np.mean(outside))
    profiled_ms = float(np.mean(run_ms))
    return {
        "iterations": n, "offload_copy": offload, "batch_size": 1, "launches_per_run": launches,
        "rate_per_sec": 1000.0 / total if total > 0 else math.inf,
        "total_time_ms": total, "min_ms": min(totals), "max_ms": max(totals),
        "mean_ms": float(np.mean(totals)), "median_ms": median(totals),
        "p90_ms": percentile(totals, 0.90), "p95_ms": percentile(totals, 0.95), "p99_ms": percentile(totals, 0.99),
        "instructions_time_ms": total_ins,
        "overhead_dry_run_ms": dry_ms, "overhead_dry_run_percent": 100.0 * dry_ms / total if total > 0 else 0.0,
        "overhead_outside_instructions_ms": outside_ms, "profiled_run_ms": profiled_ms,
        "overhead_outside_instructions_percent": 100.0 * outside_ms / profiled_ms if profiled_ms > 0 else 0.0,
        "instructions": [{"instruction": lab, "op": op, "ms": t} for lab, op, t in per_ins],
        "ops": [{"op": op, "ms": sum(ts), "count": len(ts)}
                for op, ts in sorted(groups.items(), key=lambda kv: -sum(kv[1]))],
    }


def _g(x: float) -> str:
    """A number as C++ ``std::ostream`` prints a double by default (6 significant digits)."""
    return f"{x:.6g}"


def _pct(part: float, whole: float) -> int:
    return math.ceil(100.0 * part / whole) if whole > 0 else 0


def format_report(r: dict) -> str:
    """migraphx-driver's ``perf`` text: one line per instruction, ``Summary:`` per op, then the totals."""
    tin = r["instructions_time_ms"]
    lines = [f"{i['instruction']}: {_g(i['ms'])}ms, {_pct(i['ms'], tin)}%" for i in r["instructions"]]
    lines += ["", "Summary:"]
    lines += [f"{o['op']}: {_g(o['ms'])}ms / {o['count']} = {_g(o['ms'] / o['count'])}ms, {_pct(o['ms'], tin)}%"
              for o in r["ops"]]
    lines += ["",
              f"Batch size: {r['batch_size']}",
              f"Rate: {_g(r['rate_per_sec'] * r['batch_size'])} inferences/sec",
              f"Total time: {_g(r['total_time_ms'])}ms (Min: {_g(r['min_ms'])}ms, Max: {_g(r['max_ms'])}ms, "
              f"Mean: {_g(r['mean_ms'])}ms, Median: {_g(r['median_ms'])}ms)",
              f"Percentiles (90%, 95%, 99%): ({_g(r['p90_ms'])}ms, {_g(r['p95_ms'])}ms, {_g(r['p99_ms'])}ms)",
              f"Total instructions time: {_g(tin)}ms",
              f"Overhead time: {_g(r['overhead_dry_run_ms'])}ms, {_g(r['overhead_outside_instructions_ms'])}ms",
              f"Overhead: {round(r['overhead_dry_run_percent'])}%, "
              f"{round(r['overhead_outside_instructions_percent'])}%"]
    return "\n".join(lines)


def measure_graphs(prog, feeds: dict, n: int, offload: bool = False, progress: bool = True) -> dict:
    """Whole-run times of ``prog`` compiled with graphs on: 3 untimed runs of the timed kind (warmup,
    warmup, capture), then ``n`` timed runs (replays).  Returns total (common average, ms) and the
    graph counters."""
    from tqdm import tqdm

    prog.run(feeds)  # a dynamic program specializes; its context exists from here on
    dev = device_inputs(prog, feeds)
    with tqdm(total=n + 3, desc="perf (graphs)", unit="run", file=sys.stderr, disable=not progress,
              leave=False) as bar:
        _timed_runs(prog, feeds, dev, 3, offload, bar)
        times = _timed_runs(prog, feeds, dev, n, offload, bar)
    st = prog.stats()
    return {"total_time_ms": common_average(times), "launches_per_run": st["launches_per_run"],
            "regions": len(st["regions"]), "captures": st["captures"], "replays": st["replays"],
            "fallbacks": st["fallbacks"]}
