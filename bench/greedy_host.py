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
``w1_peers`` builds it, cached under ``MGX_GRAPH_CACHE``).  A setting this machine cannot apply (the
host-wait policies off CUDA, ``poll`` where the target reads back by a copy, as ``ref`` does) is reported
with its reason (``"error"`` in the JSON) and not timed; a rep that raises is reported and kept under
``"errors"``.  Exit status 0; 1 when there is no W1 export or the warm pass fails (a full KV cache); 2 for
bad flags.

    python bench/greedy_host.py [--target gpu|ref] [--tiny] [--tokens 96] [--reps 5] [--settings default,spin,...] [--out FILE]
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
POLICIES = {"spin": "cudaDeviceScheduleSpin", "yield": "cudaDeviceScheduleYield",
            "blocking": "cudaDeviceScheduleBlockingSync"}  # setting -> cudaSetDeviceFlags flag
TOKENS, TINY_TOKENS = 96, 8  # default greedy steps timed; --tiny: fits the tiny W1's KV cache


def _device_flags(flag_name: str):
    """``cudaSetDeviceFlags(flag_name)`` on the current device; RuntimeError when CUDA refuses it."""
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


def refusal(name: str, runner):
    """Why setting ``name`` cannot apply to ``runner`` (a :class:`peer_systems.MgxStep`) here, one line,
    or None: the host-wait policies need the CUDA runtime, ``poll`` a read-back with an event."""
    platform = getattr(runner.dec.ctx.runtime, "platform", "?")
    if name in POLICIES and platform != "cuda":
        return f"needs the CUDA runtime (cudaSetDeviceFlags); this target's runtime is {platform!r}"
    if name == "poll" and not hasattr(runner.dec._id_reader(), "poll"):
        return "this target reads the id back by a copy: no HostReader event to poll"
    if name == "pinned" and not hasattr(os, "sched_setaffinity"):
        return "os.sched_setaffinity is not available on this platform"
    return None


@contextmanager
def setting(name: str, runner):
    """The host-side setting ``name`` (see the module docstring) for the body, undone after it; check
    :func:`refusal` first (else an AttributeError / ImportError / RuntimeError of the missing piece)."""
    if name in POLICIES:
        _device_flags(POLICIES[name])
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


def parse_args(argv=None) -> argparse.Namespace:
    """The flags; ``settings`` becomes a list of names.  Exits 2 (argparse) for an unknown or empty
    ``--settings``, ``--tokens`` / ``--reps`` below 1 or another ``--target``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=None,
                    help=f"greedy steps timed, >= 1 (default {TOKENS}, {TINY_TOKENS} with --tiny)")
    ap.add_argument("--reps", type=int, default=5, help="timed passes of every setting, >= 1")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--out", default="greedy_host.json")
    ap.add_argument("--target", default="gpu", choices=("gpu", "ref"),
                    help="gpu (default) or ref (a smoke run of the script)")
    ap.add_argument("--tiny", action="store_true", help="the 2-layer W1 of w1_peers --tiny")
    args = ap.parse_args(argv)
    args.settings = [s for s in args.settings.split(",") if s]
    bad = [s for s in args.settings if s not in SETTINGS]
    if bad or not args.settings:
        ap.error(f"unknown settings {bad or args.settings} (known: {', '.join(SETTINGS)})")
    if args.tokens is None:
        args.tokens = TINY_TOKENS if args.tiny else TOKENS
    if args.tokens < 1 or args.reps < 1:
        ap.error(f"--tokens ({args.tokens}) and --reps ({args.reps}) must be >= 1")
    return args


def time_settings(runner, prompt, args) -> dict:
    """``args.reps`` interleaved passes of every setting not refused; the summary per setting (see the
    module docstring): medians, ``same_tokens`` (the first 16 ids as the first timed pass's), the reps,
    the errors of reps that raised; ``{"error": why}`` for a setting refused or failed in every rep."""
    refused = {n: why for n in args.settings if (why := refusal(n, runner)) is not None}
    for n, why in refused.items():
        print(f"{n}: refused: {why}", file=sys.stderr, flush=True)
    names = [n for n in args.settings if n not in refused]
    rows, errors = {n: [] for n in names}, {n: [] for n in names}
    for rep in range(args.reps):
        for n in names:
            try:
                with setting(n, runner):
                    r = ps.measure(runner, prompt, args.tokens)
            except Exception as e:  # noqa: BLE001 - a setting this machine refuses is reported, not fatal
                print(f"rep {rep} {n}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                errors[n].append(f"rep {rep}: {type(e).__name__}: {e}")
                continue
            rows[n].append({"ms_per_token": r["ms_per_token"], "host_us_per_token": r["host_us_per_token"],
                            "first_tokens": r["first_tokens"]})
            print(f"rep {rep} {n:9s} {r['ms_per_token']:.4f} ms/token  host {r['host_us_per_token']} us",
                  file=sys.stderr, flush=True)
    ref_tokens = next((rs[0]["first_tokens"] for rs in rows.values() if rs), None)
    summary = {}
    for n in args.settings:
        rs = rows.get(n)
        if not rs:
            summary[n] = {"error": refused.get(n) or errors[n][-1]}
            continue
        summary[n] = {"ms_per_token": statistics.median(r["ms_per_token"] for r in rs),
                      "host_us_per_token": statistics.median(r["host_us_per_token"] for r in rs),
                      "same_tokens": all(r["first_tokens"] == ref_tokens for r in rs), "reps": rs}
        if errors[n]:
            summary[n]["errors"] = errors[n]
    return summary


def main(argv=None) -> int:
    """Time the settings (see the module docstring), write ``--out`` and print one line per setting."""
    from mgx_graph.errors import MgxError

    args = parse_args(argv)
    work = pm.workloads(args.tiny)["W1"]
    info, why = pm.registry_build(work.registry, work.options, 600)
    if info is None:
        print(f"no W1 export: {why}", file=sys.stderr)
        return 1
    prompt = pm.prompt_ids(work, info)
    runner = ps.MgxStep(info.onnx_path, args.target, True, True)
    try:
        ps.measure(runner, prompt, args.tokens)  # warmups and capture
    except MgxError as e:
        print(f"greedy_host: the warm pass failed: {e} (--tokens {args.tokens})", file=sys.stderr)
        runner.close()
        return 1
    summary = time_settings(runner, prompt, args)
    b2b = back_to_back_us(runner)
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
