"""The ``graph_launch`` operation: capture a submodule once, replay it as one graph launch.

State machine per cache key (MIGraphX ``hip::graph`` / PR #5261 style):

``WARMUP``   the first ``warmup`` calls with a key run the body eagerly on the same queue the capture
             will use (library handles, kernel compilation and caches reach their steady state);
``CAPTURE``  the next call records the body with ``hipStreamBeginCapture`` (thread-local mode) under
             an allocation guard, instantiates a graph exec and launches it once;
``REPLAY``   later calls launch the graph exec: one launch for the whole region;
``FALLBACK`` a capture that fails in any way is ended cleanly, its partial graph destroyed, the key
             remembered as failed with the reason, and the body runs eagerly (results stay correct).

The key is the queue plus the sorted ``(parameter name, device pointer, shape, dtype)`` of the
region's inputs; outputs are cached per key.  Every call is a real step: warmup and capture calls
compute that call's results exactly once, so state updated in place (a KV cache bound with
``alias``) advances once per call, never more.
"""
from __future__ import annotations

import hashlib
import sys
import threading
import time
from collections import OrderedDict

from . import env
from .errors import CaptureError, DeviceError
from .operators.base import Operation, register_op
from .runtime import hipStreamCaptureModeThreadLocal, hipStreamCaptureStatusNone


@register_op
class GraphLaunch(Operation):
    """Runs its submodule; shape: the submodule's return shape (a tuple when it returns several)."""

    name = "graph_launch"
    capturable = False
    foldable = False

    def compute_shape(self, inputs, mods=()):
        outs = mods[0].get_output_shapes()
        return outs[0] if len(outs) == 1 else tuple(outs)


class _Entry:
    __slots__ = ("runs", "graph", "exec", "outputs", "nodes", "replays", "key_str")

    def __init__(self, key_str):
        self.runs = 0
        self.graph = None
        self.exec = None
        self.outputs = None
        self.nodes = -1
        self.replays = 0
        self.key_str = key_str


class GraphLaunchState:
    """Runtime state of one graph_launch instruction (shared by copies of a compiled program)."""

    def __init__(self, region: str, ctx, body_launches: int, n_instructions: int, warmup: int = 2,
                 debug: bool = False, budget=None):
        self.region = region
        self.ctx = ctx
        self.rt = ctx.runtime
        self.warmup = int(warmup)
        self.debug = debug or env.enabled("MIGRAPHX_HIP_GRAPH_DEBUG")
        self.force_eager = env.enabled("MIGRAPHX_TRACE_EVAL") or env.value_of("MIGRAPHX_TRACE_EVAL", 0) > 0
        self.body_launches = body_launches
        self.n_instructions = n_instructions
        self.entries: OrderedDict = OrderedDict()
        self.failed: dict = {}
        self.lock = threading.RLock()
        self.budget = budget
        self.warmups = self.captures = self.replays = self.fallbacks = self.eager_runs = self.updates = 0
        self.last_launches = 0
        self.last_event = ""
        self.capture_ms = 0.0

    # -- helpers ---------------------------------------------------------------------------------
    def trace(self, event: str, key_str: str, detail: str = "") -> None:
        self.last_event = event
        if self.debug:
            print(f"[mgx_graph] {event:<8} {self.region} key={key_str}" + (f" {detail}" if detail else ""),
                  file=sys.stderr, flush=True)

    @staticmethod
    def key_summary(key) -> str:
        h = hashlib.blake2s(repr(key).encode(), digest_size=4).hexdigest()
        queue, items = key
        return f"{h} ({len(items)} dynamic inputs, queue {queue:#x})"

    def stats(self) -> dict:
        return {"region": self.region, "instructions": self.n_instructions, "launches_eager": self.body_launches,
                "warmups": self.warmups, "captures": self.captures, "replays": self.replays,
                "fallbacks": self.fallbacks, "eager_runs": self.eager_runs, "updates": self.updates,
                "keys": len(self.entries),
                "failed_keys": {self._short(k): r for k, r in self.failed.items()},
                "graph_nodes": [e.nodes for e in self.entries.values() if e.exec is not None],
                "capture_ms": round(self.capture_ms, 3)}

    def _short(self, key) -> str:
        return hashlib.blake2s(repr(key).encode(), digest_size=4).hexdigest()

    # -- the state machine -----------------------------------------------------------------------
    def execute(self, key, queue, run_body, run_body_capture, read_outputs):
        """Run the region for one call; returns its outputs (list of arrays)."""
        with self.lock:
            if self.force_eager:
                return self._eager(run_body, read_outputs, "MIGRAPHX_TRACE_EVAL is set", key, quiet=True)
            e = self.entries.get(key)
            if e is None:
                reason = self.failed.get(key)
                if reason is not None:
                    return self._eager(run_body, read_outputs, f"key failed earlier: {reason}", key)
                e = self.entries[key] = _Entry(self.key_summary(key))
            else:
                self.entries.move_to_end(key)
            if e.exec is not None:
                self.rt.hipGraphLaunch(e.exec, queue)
                e.replays += 1
                self.replays += 1
                self.last_launches = 1
                self.trace("REPLAY", e.key_str)
                return e.outputs
            status = self.rt.hipStreamIsCapturing(queue)
            if status != hipStreamCaptureStatusNone:
                return self._eager(run_body, read_outputs, "the queue is already being captured by the caller", key,
                                   quiet=False)
            if e.runs < self.warmup:
                run_body()
                e.runs += 1
                self.warmups += 1
                self.eager_runs += 1
                self.last_launches = self.body_launches
                self.trace("WARMUP", e.key_str, f"run {e.runs}/{self.warmup}")
                return read_outputs()
            return self._capture(e, key, queue, run_body, run_body_capture, read_outputs)

    def _eager(self, run_body, read_outputs, reason, key, quiet=False):
        run_body()
        self.eager_runs += 1
        self.last_launches = self.body_launches
        if not quiet:
            self.trace("EAGER", self.key_summary(key), f"reason={reason}")
        return read_outputs()

    def _capture(self, e, key, queue, run_body, run_body_capture, read_outputs):
        rt = self.rt
        t0 = time.perf_counter()
        err = None
        graph = None
        try:
            rt.hipStreamBeginCapture(queue, hipStreamCaptureModeThreadLocal)
        except DeviceError as ex:
            return self._fallback(e, key, f"hipStreamBeginCapture failed: {ex}", run_body, read_outputs)
        try:
            run_body_capture()
        except BaseException as ex:  # noqa: BLE001 - any failure inside capture means: fall back
            err = ex
        try:
            graph = rt.hipStreamEndCapture(queue)
        except DeviceError as ex:
            graph = None
            err = err or ex
        if err is not None or graph is None:
            if graph is not None:
                _safe(rt.hipGraphDestroy, graph)
            if isinstance(err, KeyboardInterrupt):
                raise err
            return self._fallback(e, key, _reason(err), run_body, read_outputs)
        try:
            exe = rt.hipGraphInstantiate(graph)
        except DeviceError as ex:
            _safe(rt.hipGraphDestroy, graph)
            return self._fallback(e, key, f"hipGraphInstantiate failed: {ex}", run_body, read_outputs)
        e.graph, e.exec = graph, exe
        try:
            e.nodes = rt.hipGraphGetNodeCount(graph)
        except DeviceError:
            e.nodes = -1
        e.outputs = read_outputs()
        self.capture_ms += (time.perf_counter() - t0) * 1e3
        self.captures += 1
        self.trace("CAPTURE", e.key_str, f"nodes={e.nodes} ({(time.perf_counter() - t0) * 1e3:.1f} ms)")
        rt.hipGraphLaunch(exe, queue)
        self.last_launches = 1
        return e.outputs

    def _fallback(self, e, key, reason, run_body, read_outputs):
        self.entries.pop(key, None)
        self.failed[key] = reason
        self.fallbacks += 1
        self.trace("FALLBACK", e.key_str, f"reason={reason}")
        run_body()
        self.eager_runs += 1
        self.last_launches = self.body_launches
        return read_outputs()

    # -- teardown --------------------------------------------------------------------------------
    def release(self) -> None:
        """Destroy every graph and graph exec (after the queue is synchronized)."""
        with self.lock:
            for e in self.entries.values():
                if e.exec is not None:
                    _safe(self.rt.hipGraphExecDestroy, e.exec)
                if e.graph is not None:
                    _safe(self.rt.hipGraphDestroy, e.graph)
                e.exec = e.graph = None
            self.entries.clear()


def _reason(err) -> str:
    if err is None:
        return "capture produced no graph"
    if isinstance(err, (CaptureError, DeviceError)):
        return str(err)
    return f"{type(err).__name__}: {err}"


def _safe(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:
        pass
