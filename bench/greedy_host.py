"""Host time of the replayed decode step inside the greedy loop, under host-side settings, in one process.

The W1 runner of ``bench/w1_peers.py`` (:class:`peer_systems.MgxStep`, SmolLM2-135M fp16 with graphs on,
:func:`peer_systems.measure`: the prompt token by token, then ``--tokens`` pipelined greedy steps) is timed
``--reps`` times under each setting, the settings interleaved (A B C ... A B C ...) so that a drift of the
machine reaches all of them alike.  Per setting: the median over reps of the per-rep medians of
``ms_per_token`` and ``host_us_per_token`` (the ``run_async`` call of a step), and every rep's values.

Settings (each undone before the next):

* ``default`` -- as ``w1_peers`` runs;
* ``spin`` / ``yield`` / ``blocking`` -- the device's host-wait policy (``cudaSetDeviceFlags`` with
  ``cudaDeviceScheduleSpin`` / ``Yield`` / ``BlockingSync``; CUDA runtime API), then back to ``Auto``;
* ``poll`` -- the step's :class:`~mgx_graph.targets.host_reader.HostReader` polls its event
  (``hipEventQuery``, as ``MIGRAPHX_HOST_READER_POLL=1``) instead of ``hipEventSynchronize``;
* ``pinned`` -- the process pinned to the CPU it runs on (``os.sched_setaffinity``; the CPU from
  ``/proc/self/stat``);
* ``nogc`` -- Python's cyclic garbage collector off during the timed pass.

Also the same ``run_async`` call made back to back outside the loop (``back_to_back_us``).  Writes JSON with
the machine's details (``bench/machine.py``).  Needs the gpu target and the W1 export (built as
``w1_peers`` builds it, cached under ``MGX_GRAPH_CACHE``).

    python bench/greedy_host.py [--target gpu] [--tiny] [--tokens 96] [--reps 5] [--settings default,spin,...] [--out FILE]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_info  # noqa: E402
import peer_models as pm  # noqa: E402
import peer_systems as ps  # noqa: E402

SETTINGS = ("default", "spin", "yield", "blocking", "poll", "pinned", "nogc")


def _device_flags(flag_name: str):
    from cuda.bindings import runtime as rt

    err = rt.cudaSetDeviceFlags(getattr(rt, flag_name))[0]
    if int(err) != 0:
        raise RuntimeError(f"cudaSetDeviceFlags({flag_name}): {err}")


def _current_cpu(allowed) -> int:
    """The CPU this process last ran on (field 39 of ``/proc/self/stat``), else the lowest allowed."""
    try:
        with open("/proc/self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return min(allowed)


@contextmanager
def setting(name: str, runner):
    """The host-side setting ``name`` (see the module docstring) for the body, undone after it."""
    if name in ("spin", "yield", "blocking"):
        flag = {"spin": "cudaDeviceScheduleSpin", "yield": "cudaDeviceScheduleYield",
                "blocking": "cudaDeviceScheduleBlockingSync"}[name]
        _device_flags(flag)
        try:
            yield
        finally:
            _device_flags("cudaDeviceScheduleAuto")
    elif name == "poll":
        reader = runner.dec._id_reader()
        before, reader.poll = reader.poll, True
        try:
            yield
        finally:
            reader.poll = before
    elif name == "pinned":
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {_current_cpu(before)})
        try:
            yield
        finally:
            os.sched_setaffinity(0, before)
    elif name == "nogc":
        gc.disable()
        try:
            yield
        finally:
            gc.enable()
    else:
        yield


def back_to_back_us(runner, calls: int = 200) -> float:
    """Median host µs of the step's ``run_async`` made back to back (the queue filling)."""
    dec = runner.dec
    dec.position = 0
    times = []
    with dec.ctx.on_queue(dec.queue):
        for _ in range(calls):
            dec._run_at_position(dec.queue)
            times.append(dec.last_host_s)
    dec.ctx.synchronize(dec.queue)
    return round(statistics.median(times) * 1e6, 2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--out", default="greedy_host.json")
    ap.add_argument("--target", default="gpu", help="gpu (default) or ref (a smoke run of the script)")
    ap.add_argument("--tiny", action="store_true", help="the 2-layer W1 of w1_peers --tiny (fits --tokens 8)")
    args = ap.parse_args(argv)
    names = [s for s in args.settings.split(",") if s]
    bad = [s for s in names if s not in SETTINGS]
    if bad:
        ap.error(f"unknown settings {bad} (known: {', '.join(SETTINGS)})")
    work = pm.workloads(args.tiny)["W1"]
    info, why = pm.registry_build(work.registry, work.options, 600)
    if info is None:
        print(f"no W1 export: {why}", file=sys.stderr)
        return 1
    prompt = pm.prompt_ids(work, info)
    runner = ps.MgxStep(info.onnx_path, args.target, True, True)
    rows, errors = {n: [] for n in names}, {}
    ps.measure(runner, prompt, args.tokens)  # warmups and capture
    for rep in range(args.reps):
        for n in names:
            try:
                with setting(n, runner):
                    r = ps.measure(runner, prompt, args.tokens)
            except Exception as e:  # noqa: BLE001 - a setting this machine refuses is reported, not fatal
                print(f"rep {rep} {n}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                errors[n] = f"{type(e).__name__}: {e}"
                continue
            rows[n].append({"ms_per_token": r["ms_per_token"], "host_us_per_token": r["host_us_per_token"],
                            "first_tokens": r["first_tokens"]})
            print(f"rep {rep} {n:9s} {r['ms_per_token']:.4f} ms/token  host {r['host_us_per_token']} us",
                  file=sys.stderr, flush=True)
    b2b = back_to_back_us(runner)
    ref_tokens = next((rs[0]["first_tokens"] for rs in rows.values() if rs), None)
    summary = {n: {"ms_per_token": statistics.median(r["ms_per_token"] for r in rs),
                   "host_us_per_token": statistics.median(r["host_us_per_token"] for r in rs),
                   "same_tokens": all(r["first_tokens"] == ref_tokens for r in rs), "reps": rs}
               for n, rs in rows.items() if rs}
    summary.update({n: {"error": why} for n, why in errors.items() if not rows[n]})
    runner.close()
    out = {"machine": machine_info(), "workload": work.describe(), "tokens": args.tokens,
           "reps": args.reps, "back_to_back_us": b2b, "settings": summary,
           "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    for n, s in summary.items():
        if "error" in s:
            print(f"{n:9s} {s['error']}")
            continue
        print(f"{n:9s} {s['ms_per_token']:.4f} ms/token  host {s['host_us_per_token']:.1f} us  "
              f"same tokens {s['same_tokens']}")
    print(f"back to back: {b2b} us per run_async")
    return 0


if __name__ == "__main__":
    sys.exit(main())
