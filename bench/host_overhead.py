"""Host time of a replayed ``run_async`` of the SmolLM2 decode step, split by phase.

Compiles the SmolLM2-135M decode step (fp16, ``hip_graph`` on, KV cache 256: 62 inputs, the 60 KV
buffers bound in place) on ``--target`` (``ref``: the host queue captures and replays numpy host
functions as a GPU stream does; ``gpu`` when one is present), feeds the same input objects every
call as :class:`mgx_graph.llm.generation.Decoder` does, and once every call replays times ``--calls``
replayed calls three ways (``time.perf_counter_ns``, medians over the calls).  ``--state bound``
binds the 60 cache arrays once (``bind_state``, as the Decoder does) and passes the two step inputs
per call; ``--state passed`` (the default) passes all 62; ``--on-queue`` makes each call inside
``ctx.on_queue(queue)`` as ``Decoder.feed`` does.  The three splits below time the Python replay path
(compiled with ``MIGRAPHX_NATIVE_REPLAY=0``: the C replay of ``cpp/replay.c`` launches the graph itself, so
no Python hook sees its launch); where the native replay arms (a GPU, the ``_native`` module built),
``native_total_us`` is the median whole call of a second compile with it on:

* ``clean``: only the graph launch call is timed besides the whole call, giving the host time up
  to the launch, the launch call itself and the time after it (``host_us``: the whole call).  On
  ``ref`` the launch call runs the replay's numpy kernels on the host (about a second per call in
  fp16, and it evicts the CPU caches the host code runs from), so in the timed calls the launch is
  replaced by a call that runs nothing (the state machine, key and counters all run as usual) and
  ``host_us`` leaves the launch out; the launch with its kernels is timed separately over
  ``--kernel-calls`` calls (``launch_with_kernels_ms``).  On ``gpu`` the launch is the real
  asynchronous enqueue and is host time (``host_us`` counts it);
* ``phases``: the functions of each phase are wrapped (one timer each, nesting subtracted):
  ``bind / interop`` (parameter conversion, validation and binding, or the repeated-call check that
  replaces them), ``staging check`` (inputs against the program's own memory), ``key build`` (the
  graph key of the region), ``graph cache lookup`` (the region's state machine up to the launch),
  ``launch`` and ``rest`` (the eval loop, queue context, output list: the whole call less the
  phases).  The wrappers add a little time of their own; ``clean`` has the honest total;
* ``profile``: cProfile over the same calls; the functions taking the most time are listed.

Writes JSON (the result under ``--label``, merged into an existing file of the same target, with
the machine details of ``bench/machine.py``) and a PNG bar chart of the phases of every label in
the file (matplotlib).

    python bench/host_overhead.py --target ref --label after \
        --out bench/results/host_overhead_ref.json [--calls 300] [--model PATH/model.onnx] \
        [--state bound --on-queue]
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_info  # noqa: E402

import mgx_graph  # noqa: E402
from mgx_graph.llm.generation import Decoder  # noqa: E402

NATIVE = "MIGRAPHX_NATIVE_REPLAY"
PHASES = ("bind / interop", "staging check", "key build", "graph cache lookup", "launch")
# (module, class, method) wrapped per phase; names missing from the code under test are skipped
HOOKS = {
    "bind / interop": [("mgx_graph.exec.executor", "Executor", "bind"),
                       ("mgx_graph.graph.call_record", "CallRecord", "matches"),
                       ("mgx_graph.graph.call_record", "CallRecord", "repeat"),
                       ("mgx_graph.graph.replay", "CallRecord", "matches"),
                       ("mgx_graph.graph.replay", "CallRecord", "repeat")],
    "staging check": [("mgx_graph.exec.staging", "InputStaging", "check")],
    "key build": [("mgx_graph.graph.launch", "GraphLaunch", "graph_key"),
                  ("mgx_graph.graph.launch", "GraphLaunch", "call_key"),
                  ("mgx_graph.graph.launch", "GraphLaunch", "region_call")],
    "graph cache lookup": [("mgx_graph.graph.cache", "GraphLaunchState", "execute")],
}


class PhaseClock:
    """Exclusive nanoseconds per phase of the current call (a stack subtracts nested phases)."""

    def __init__(self):
        self.stack: list = []
        self.spent: dict = {}

    def wrap(self, phase: str, fn):
        clock, now = self, time.perf_counter_ns

        def timed(*args, **kw):
            frame = [now(), 0]
            clock.stack.append(frame)
            try:
                return fn(*args, **kw)
            finally:
                total = now() - frame[0]
                clock.stack.pop()
                clock.spent[phase] = clock.spent.get(phase, 0) + total - frame[1]
                if clock.stack:
                    clock.stack[-1][1] += total
        return timed


def _launcher(rt, stub: bool):
    """The runtime's ``hipGraphLaunch``, or (``stub``) a call that launches nothing."""
    if stub:
        return lambda exe, s: None
    return type(rt).hipGraphLaunch.__get__(rt)


def _hooks(clock: PhaseClock, rt, launch):
    """Install the phase wrappers (``launch``: what the wrapped ``hipGraphLaunch`` calls); returns
    the list of ``(owner, name, original)`` to restore."""
    import importlib

    done = []
    for phase, targets in HOOKS.items():
        for mod, cls, name in targets:
            try:
                owner = getattr(importlib.import_module(mod), cls)
            except (ImportError, AttributeError):
                continue
            fn = owner.__dict__.get(name)
            if fn is None:
                continue
            setattr(owner, name, clock.wrap(phase, fn))
            done.append((owner, name, fn))
    rt.hipGraphLaunch = clock.wrap("launch", launch)
    done.append((rt, "hipGraphLaunch", None))
    return done


def _unhook(done) -> None:
    for owner, name, fn in done:
        if fn is None:
            owner.__dict__.pop(name, None)
        else:
            setattr(owner, name, fn)


class Step:
    """The decode step fed like :class:`Decoder`: the same parameter dict and arrays every call, the
    position written into ``cache_position`` (outside the timed call).

    ``state``: ``"bound"``: the cache arrays bound once as the program's state (what Decoder does
    with a static program) and each call passes the two step inputs; ``"passed"``: the state dropped
    and every array passed each call (the way before ``bind_state``).  ``on_queue``: each timed call
    made inside ``ctx.on_queue(queue)``, as ``Decoder.feed`` makes it (the program's own block then
    nests in it)."""

    def __init__(self, prog, state: str = "passed", on_queue: bool = False):
        self.prog, self.dec = prog, Decoder(prog)
        self.queue, self.ctx, self.on_queue = self.dec.queue, prog.context, on_queue
        if state == "bound":
            if not hasattr(self.dec, "step_params") or self.dec.params is self.dec.step_params:
                raise SystemExit("--state bound: this mgx_graph binds no state (no bind_state)")
            self.params = self.dec.step_params
        else:
            if hasattr(prog, "bind_state"):
                prog.bind_state(None)
            self.params = self.dec.params
        self.position = 0
        self.started = 0  # perf_counter_ns at the start of the last timed call

    def call(self, profile=None) -> int:
        """One timed ``run_async`` (under ``profile``, a cProfile.Profile, when given); returns its
        nanoseconds."""
        with self.ctx.on_queue(self.queue):
            self.dec.params["cache_position"].fill(self.position % self.dec.max_len)
        self.position += 1
        if self.on_queue:
            with self.ctx.on_queue(self.queue):
                t = self._timed(profile)
        else:
            t = self._timed(profile)
        self.ctx.synchronize(self.queue)
        return t

    def _timed(self, profile) -> int:
        t0 = self.started = time.perf_counter_ns()
        if profile is None:
            self.prog.run_async(self.params, self.queue)
        else:
            profile.runcall(self.prog.run_async, self.params, self.queue)
        return time.perf_counter_ns() - t0


def measure_clean(step: Step, calls: int, stub: bool) -> dict:
    rt = step.ctx.runtime
    marks = {}
    launch = _launcher(rt, stub)

    def timed_launch(exe, s):
        marks["in"] = time.perf_counter_ns()
        launch(exe, s)
        marks["out"] = time.perf_counter_ns()

    rt.hipGraphLaunch = timed_launch
    rows = []
    try:
        for _ in range(calls):
            marks.clear()
            total = step.call()
            if "in" not in marks:
                raise RuntimeError("a timed call did not launch a graph (not a replay)")
            rows.append((total, marks["in"] - step.started, marks["out"] - marks["in"]))
    finally:
        del rt.hipGraphLaunch
    med = lambda k: statistics.median(r[k] for r in rows) / 1e3  # noqa: E731
    after = statistics.median(r[0] - r[1] - r[2] for r in rows) / 1e3
    host = statistics.median(r[0] - (r[2] if stub else 0) for r in rows) / 1e3
    return {"host_us": round(host, 2), "total_us": round(med(0), 2), "until_launch_us": round(med(1), 2),
            "launch_us": round(med(2), 2), "after_launch_us": round(after, 2), "launch_stubbed": stub}


def measure_phases(step: Step, calls: int, stub: bool) -> dict:
    clock = PhaseClock()
    done = _hooks(clock, step.ctx.runtime, _launcher(step.ctx.runtime, stub))
    rows = []
    try:
        for _ in range(calls):
            clock.spent = {}
            total = step.call()
            row = {p: clock.spent.get(p, 0) for p in PHASES}
            row["rest"] = total - sum(row.values())
            row["total"] = total
            rows.append(row)
    finally:
        _unhook(done)
    return {k: round(statistics.median(r[k] for r in rows) / 1e3, 2) for k in (*PHASES, "rest", "total")}


def measure_profile(step: Step, calls: int, stub: bool, top: int = 15) -> list:
    rt = step.ctx.runtime
    rt.hipGraphLaunch = _launcher(rt, stub)
    prof = cProfile.Profile()
    try:
        for _ in range(calls):
            step.call(prof)
    finally:
        del rt.hipGraphLaunch
    rows = []
    for (path, line, fn), (cc, nc, tt, ct, _) in pstats.Stats(prof).stats.items():
        if "perf_counter_ns" in fn or "host_overhead" in path or "lsprof" in fn:
            continue
        rows.append({"function": f"{os.path.basename(path)}:{line}({fn})", "calls_per_run": round(nc / calls, 1),
                     "tottime_us_per_run": round(tt / calls * 1e6, 2),
                     "cumtime_us_per_run": round(ct / calls * 1e6, 2)})
    rows.sort(key=lambda r: -r["tottime_us_per_run"])
    return rows[:top]


def measure_kernels(step: Step, calls: int) -> float | None:
    """Median ms of the launch call with the replay's kernels (``calls`` replayed calls)."""
    if calls <= 0:
        return None
    rt, times = step.ctx.runtime, []
    launch = _launcher(rt, False)

    def timed_launch(exe, s):
        t0 = time.perf_counter_ns()
        launch(exe, s)
        times.append(time.perf_counter_ns() - t0)

    rt.hipGraphLaunch = timed_launch
    try:
        for _ in range(calls):
            step.call()
    finally:
        del rt.hipGraphLaunch
    return round(statistics.median(times) / 1e6, 3)


def _compile(model: str, target: str, native: bool):
    """The fp16 decode step with graphs on, compiled with ``MIGRAPHX_NATIVE_REPLAY`` set to ``native``."""
    from mgx_graph import settings as mgx_settings

    old = os.environ.get(NATIVE)
    os.environ[NATIVE] = "1" if native else "0"
    mgx_settings.reset()
    try:
        return mgx_graph.compile(model, target=target, fp16=True, hip_graph=True)
    finally:
        if old is None:
            os.environ.pop(NATIVE, None)
        else:
            os.environ[NATIVE] = old
        mgx_settings.reset()


def measure_native(model: str, target: str, calls: int, state: str, on_queue: bool) -> float | None:
    """Median µs of the whole replayed call with the native replay on (None where it does not arm: the
    ``ref`` target, no built ``_native`` module)."""
    from mgx_graph.graph import replay

    if target == "ref" or not replay.available():
        return None
    prog = _compile(model, target, True)
    try:
        step = Step(prog, state, on_queue)
        for _ in range(6):  # warmups, the capture, the replays that arm the native replay
            step.call()
        return round(statistics.median(step.call() for _ in range(calls)) / 1e3, 2)
    finally:
        prog.release()


def run(model: str, target: str, calls: int, kernel_calls: int, state: str = "passed",
        on_queue: bool = False) -> dict:
    prog = _compile(model, target, False)  # the Python replay path, whose phases the hooks time
    try:
        step = Step(prog, state, on_queue)
        for _ in range(4):  # warmups, the capture, a first replay
            step.call()
        stub = target == "ref"
        st0 = prog.stats()
        res = {"inputs": len(step.dec.params), "passed_per_call": len(step.params), "state": state,
               "on_queue": on_queue, "calls": calls, "clean": measure_clean(step, calls, stub),
               "phases": measure_phases(step, calls, stub), "profile_top": measure_profile(step, calls, stub),
               "launch_with_kernels_ms": measure_kernels(step, kernel_calls if stub else 0)}
        st = prog.stats()
        res["replays_in_timed_calls"] = st["replays"] - st0["replays"]
        res["fast_path_hits_in_timed_calls"] = st.get("fast_path_hits", 0) - st0.get("fast_path_hits", 0)
        res["graph_nodes"] = [r["graph_nodes"] for r in st["regions"]]
        res["context"] = prog.context.describe()
    finally:
        prog.release()
    res["native_total_us"] = measure_native(model, target, calls, state, on_queue)
    return res


def plot(path: str) -> str:
    """Write ``<path without .json>.png``: the median µs of every phase, one bar group per label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as f:
        d = json.load(f)
    labels = list(d["results"])
    ref = d.get("target") == "ref"
    names = [p for p in (*PHASES, "rest") if not (ref and p == "launch")]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(len(labels), 1)
    for k, lab in enumerate(labels):
        r = d["results"][lab]
        vals = [r["phases"][p] for p in names]
        xs = [i + k * width for i in range(len(names))]
        ax.bar(xs, vals, width, label=f"{lab}: host {r['clean']['host_us']:.1f} µs/call")
        for x, v in zip(xs, vals):
            ax.text(x, v, f"{v:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks([i + width * (len(labels) - 1) / 2 for i in range(len(names))])
    ax.set_xticklabels(names, rotation=15)
    ax.set_ylabel("µs per replayed run_async (median)")
    note = " (launch = the replay's numpy kernels on ref: not drawn)" if ref else ""
    ax.set_title(f"SmolLM2 decode step, {d.get('target')} target, host time by phase{note}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = os.path.splitext(path)[0] + ".png"
    fig.savefig(out, dpi=100)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="auto")
    ap.add_argument("--label", default="current", help="name of this result in the JSON (e.g. before / after)")
    ap.add_argument("--calls", type=int, default=300, help="replayed calls timed per measurement (>= 200)")
    ap.add_argument("--model", default=None, help="the decode step's model.onnx (default: build('smollm2'))")
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/host_overhead_<target>.json)")
    ap.add_argument("--kernel-calls", type=int, default=3,
                    help="ref: calls timed with the replay's numpy kernels run (the launch alone)")
    ap.add_argument("--state", choices=("bound", "passed"), default="passed",
                    help="bound: the cache bound once (bind_state), two arrays passed per call, as Decoder "
                         "does; passed: every array passed per call")
    ap.add_argument("--on-queue", action="store_true",
                    help="make each call inside ctx.on_queue(queue), as Decoder.feed does")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    if args.calls < 200:
        ap.error("--calls must be at least 200")
    from mgx_graph.targets import resolve_target

    target = resolve_target(args.target)
    model = args.model
    if model is None:
        from mgx_graph.models import build

        model = str(build("smollm2", max_cache_len=256, progress=False).onnx_path)
    out = args.out or f"bench/results/host_overhead_{target}.json"
    res = run(model, target, args.calls, args.kernel_calls, args.state, args.on_queue)
    doc = {"benchmark": "host_overhead", "model": "SmolLM2-135M decode step, fp16, hip_graph, KV cache 256",
           "target": target, "results": {}}
    if os.path.exists(out):
        with open(out) as f:
            old = json.load(f)
        if old.get("target") == target:
            doc["results"] = old.get("results", {})
    res["machine"] = machine_info()
    doc["results"][args.label] = res
    c, ph = res["clean"], res["phases"]
    print(f"{target} [{args.label}]: host {c['host_us']:.1f} us per replayed run_async (total {c['total_us']:.1f}, "
          f"until launch {c['until_launch_us']:.1f}, launch {c['launch_us']:.1f}, after {c['after_launch_us']:.1f})")
    print("  phases (us): " + ", ".join(f"{k} {v:.1f}" for k, v in ph.items()))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {out}")
    if not args.no_plot:
        try:
            print(f"wrote {plot(out)}")
        except ImportError:
            print("matplotlib is not installed: no chart", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
