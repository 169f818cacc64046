"""The graph cache of one ``graph_launch`` region: graph execs by key, captured, updated, evicted.

State machine of one region (MIGraphX ``hip::graph`` / PR #5261 style):

``WARMUP``   the first ``warmup`` calls on a queue run the body eagerly on that queue (library handles,
             kernel compilation and caches reach their steady state on the queue the capture will use);
``CAPTURE``  a call with a new key records the body with ``hipStreamBeginCapture`` (thread-local mode by
             default) under an allocation guard on the context's private non-blocking capture queue for
             the call's queue (:mod:`mgx_graph.graph.capture_queues`; the queue itself where the
             context has none or cannot make one), instantiates a graph exec and launches it on the queue;
``UPDATE``   once the region holds ``max_graphs`` execs, a new key re-records the body and updates the
             least recently used exec in place (``hipGraphExecUpdate``) instead of instantiating another:
             only pointers changed, the topology is the same; an exec updated ``max_updates_per_exec``
             times is replaced by a fresh one (long-lived, per-call-updated execs have hit driver bugs);
``REPLAY``   a call with a known key launches its exec: one launch for the whole region;
``FALLBACK`` a capture that fails in any way is ended cleanly, its partial graph destroyed, the key
             remembered as failed with the reason, and the body runs eagerly (results stay correct); the
             key is retried after ``retry_after`` calls, the wait doubling on each new failure (at most
             1024 calls);
``EAGER``    a call run eagerly for a stated reason: the caller is capturing the queue, the key failed,
             the region's capture limit is reached, the key was disabled;
``VALIDATE`` in validation mode the first ``validate_first`` replays of a key and every
             ``validate_every``-th after run eagerly too and are compared (:mod:`mgx_graph.graph.validation`);
             a mismatch disables the key.

The key (built by the ``graph_launch`` op, :mod:`mgx_graph.graph.launch`) is the queue plus the sorted
``(parameter name, device pointer, shape, dtype)`` of the region's movable inputs; outputs are cached
per key.  Every call is a real step: warmup, capture and update calls compute that call's results
exactly once, so state updated in place (a KV cache bound with ``alias``) advances once per call.
Graph APIs are called through the context's runtime layer (:mod:`mgx_graph.runtime`) only.
"""
from __future__ import annotations

import hashlib
import statistics
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from .. import settings as mgx_settings
from ..errors import CaptureError, DeviceError
from ..runtime import CAPTURE_MODES, hipStreamCaptureStatusNone
from .counters import GraphCounters
from .replay import FastReplay, RegionCall, RegionResult  # noqa: F401  (RegionCall: the state's last_call)
from .validation import ValidatedReplay

NEVER = 1 << 62

LOGGER = logging.getLogger("mgx_graph.graph")  # the MIGRAPHX_HIP_GRAPH_DEBUG trace (one line per event)


@dataclass
class GraphOptions:
    """Graph settings of a compiled program (compile options; MIGRAPHX_* variables give the defaults).

    Counts are calls or execs; ``max_graph_bytes`` is bytes of device memory; ``rtol`` / ``atol`` are
    the validation tolerances.  :meth:`from_env` raises ValueError for an unknown ``capture_mode``.
    """

    warmup: int = 2
    max_graphs: int = 8                 # execs per region, and captures per region over its lifetime
    max_graph_bytes: int = 1 << 30      # device memory of all graph execs of the program
    capture_mode: str = "thread_local"
    validate: bool = False
    validate_first: int = 3
    validate_every: int = 100
    rtol: float = 1e-3
    atol: float = 1e-4
    retry_after: int = 16
    max_updates_per_exec: int = 1000
    gate_slower: bool = False
    debug: bool = False
    force_eager: bool = False           # MIGRAPHX_TRACE_EVAL above 0: every region runs eagerly

    @classmethod
    def from_env(cls, settings=None, **overrides) -> "GraphOptions":
        """The defaults with the graph variables of ``settings`` (default: :func:`mgx_graph.settings.current`),
        then ``overrides`` that are not None."""
        s, o = settings or mgx_settings.current(), cls()
        o.max_graphs, o.max_graph_bytes = s.hip_graph_max, s.hip_graph_max_bytes
        o.validate, o.debug, o.force_eager = s.hip_graph_validate, s.hip_graph_debug, s.trace_eval > 0
        for k, v in overrides.items():
            if v is not None:
                setattr(o, k, v)
        if o.capture_mode not in CAPTURE_MODES:
            raise ValueError(f"capture_mode must be one of {sorted(CAPTURE_MODES)}, got {o.capture_mode!r}")
        return o


class GraphBudget:
    """Caps shared by every region of one program (and of its specializations): captures per region
    family over its lifetime, and the bytes of all live graph execs."""

    def __init__(self, options: GraphOptions):
        self.options = options
        self.lifetime_captures: dict[str, int] = {}
        self.live_bytes = 0
        self.lock = threading.RLock()


class _Entry:
    __slots__ = ("exec", "outputs", "nodes", "replays", "key_str", "bytes", "updates", "validations", "times")

    def __init__(self, key_str):
        self.exec = None
        self.outputs = None
        self.nodes = -1
        self.replays = 0
        self.key_str = key_str
        self.bytes = 0
        self.updates = 0
        self.validations = 0
        self.times = []


class _Failure:
    __slots__ = ("reason", "retry_at", "attempts")

    def __init__(self, reason, retry_at, attempts):
        self.reason, self.retry_at, self.attempts = reason, retry_at, attempts


class GraphLaunchState(ValidatedReplay, FastReplay):
    """Runtime state of one graph_launch instruction: its graph execs by key and its counters.

    ``region``: name in traces and stats; ``ctx``: the target context (its ``runtime`` is the graph
    API); ``body_launches`` / ``n_instructions``: kernel launches and instructions of one eager run of
    the body (for stats); ``budget`` / ``options``: the program's caps and settings; ``family``: the
    name lifetime captures are counted under (the submodule, shared by specializations);
    ``validator``: a :class:`~mgx_graph.graph.validation.Validator` for validation mode.

    ``last_launches`` is the number of graph launches the last call issued (0 or 1); the kernels of a
    body run eagerly are counted by whoever runs the body (the eval loop's ``run`` callback).

    The fast checks of a repeated call (:class:`~mgx_graph.graph.replay.FastReplay`; ``n_results``: the
    body's results) and :meth:`replay_again` are the state's own, asked by the op and the replay path.
    """

    def __init__(self, region: str, ctx, body_launches: int, n_instructions: int, warmup: int = 2,
                 debug: bool = False, budget: GraphBudget | None = None, options: GraphOptions | None = None,
                 family: str | None = None, validator=None, n_results: int = 1):
        self.options = options or (budget.options if budget is not None else GraphOptions.from_env(warmup=warmup))
        if options is None and budget is None:
            self.options.warmup = warmup
        self.budget = budget or GraphBudget(self.options)
        self.region = region
        self.family = family or region
        self.ctx = ctx
        self.rt = ctx.runtime
        self.warmup = self.options.warmup
        self.debug = debug or self.options.debug or mgx_settings.current().hip_graph_debug
        self.force_eager = self.options.force_eager or mgx_settings.current().trace_eval > 0
        if self.debug:
            mgx_settings.trace_logger(LOGGER.name)
        self.mode = CAPTURE_MODES[self.options.capture_mode]
        self.body_launches = body_launches
        self.n_instructions = n_instructions
        self.validator = validator
        self.entries: OrderedDict = OrderedDict()
        self.failed: dict = {}
        self.warm: dict = {}
        self.lock = threading.RLock()
        self.calls = 0
        self.counters = GraphCounters()
        self.last_launches = 0
        self.last_event = ""
        self.capture_ms = 0.0
        self.eager_times: list = []
        # what a call that repeats the last one reuses (dropped at release): see repeat_of, value_of
        self.n_results = n_results
        self.last_call: RegionCall | None = None
        self.last_result = RegionResult(None, None)

    # -- helpers ---------------------------------------------------------------------------------
    def trace(self, event: str, key_str: str, detail: str = "") -> None:
        self.last_event = event
        if self.debug:
            LOGGER.debug("[mgx_graph] %-8s %s key=%s%s", event, self.region, key_str, f" {detail}" if detail else "")

    @staticmethod
    def key_summary(key) -> str:
        h = hashlib.blake2s(repr(key).encode(), digest_size=4).hexdigest()
        queue, items = key
        return f"{h} ({len(items)} dynamic inputs, queue {queue:#x})"

    def _short(self, key) -> str:
        return hashlib.blake2s(repr(key).encode(), digest_size=4).hexdigest()

    def stats(self) -> dict:
        return {"region": self.region, "instructions": self.n_instructions, "launches_eager": self.body_launches,
                **self.counters.region_dict(), "keys": len(self.entries),
                "graph_bytes": sum(e.bytes for e in self.entries.values()),
                "failed_keys": {self._short(k): f.reason for k, f in self.failed.items()},
                "graph_nodes": [e.nodes for e in self.entries.values() if e.exec is not None],
                "capture_ms": round(self.capture_ms, 3)}

    # -- the state machine -----------------------------------------------------------------------
    def execute(self, key, queue, run_body, run_body_capture, read_outputs):
        """Run the region for one call; returns its outputs (list of arrays).

        ``run_body()`` runs the body eagerly on ``queue``, ``run_body_capture(q)`` issues it on queue
        ``q`` for a capture recorded there, ``read_outputs()`` gives the body's results after either."""
        with self.lock:
            outs = self.replay_again(key, queue)  # the plain replay of a cached exec
            if outs is not None:
                return outs
            self.calls += 1
            if self.force_eager:
                return self._eager(run_body, read_outputs, "MIGRAPHX_TRACE_EVAL is set", key, quiet=True)
            if self.rt.hipStreamIsCapturing(queue) != hipStreamCaptureStatusNone:
                return self._eager(run_body, read_outputs, "the caller is capturing the queue: the kernels go "
                                                           "into the caller's graph", key)
            e = self.entries.get(key)
            if e is not None:  # cached, not replayed above: a validation is due
                self.entries.move_to_end(key)
                return self._replay_validated(e, key, queue, run_body, read_outputs)
            f = self.failed.get(key)
            if f is not None:
                if self.calls < f.retry_at:
                    wait = "never" if f.retry_at >= NEVER else f"in {f.retry_at - self.calls} calls"
                    return self._eager(run_body, read_outputs, f"key failed earlier ({f.reason}); retry {wait}", key)
            done = self.warm.get(queue, 0)
            if done < self.warmup:
                t = _timed(self.rt, run_body, queue) if self.options.gate_slower else run_body()
                if t is not None:
                    self.eager_times.append(t)
                self.warm[queue] = done + 1
                self.counters.warmups += 1
                self.counters.eager_runs += 1
                self.last_launches = 0
                self.trace("WARMUP", self.key_summary(key), f"run {done + 1}/{self.warmup} on this queue")
                return read_outputs()
            limit = self.options.max_graphs
            if not self.entries and self.budget.lifetime_captures.get(self.family, 0) >= limit:
                return self._eager(run_body, read_outputs, f"capture limit reached ({limit} graphs captured for "
                                                           f"this region; MIGRAPHX_HIP_GRAPH_MAX)", key)
            return self._capture(key, queue, run_body, run_body_capture, read_outputs, f)

    def replay_again(self, key, queue):
        """The replay branch of :meth:`execute` (which tries it first), also called directly by the replay
        path (:mod:`mgx_graph.graph.replay`) for the key of the region's last call: replays the exec cached
        under ``key`` and returns its outputs; None, with nothing changed, when the call takes another
        branch (no exec cached under ``key``, eager mode, a validation due, a capture open on ``queue``)."""
        with self.lock:
            e = self.entries.get(key)
            if e is None or self.force_eager or (self.options.validate and self._validation_due(e)) or \
                    self.rt.hipStreamIsCapturing(queue) != hipStreamCaptureStatusNone:
                return None
            self.calls += 1
            self.entries.move_to_end(key)
            return self._replay(e, key, queue)

    def _replay(self, e, key, queue):
        if self.options.gate_slower and len(e.times) < 3:
            e.times.append(_timed(self.rt, lambda: self.rt.hipGraphLaunch(e.exec, queue), queue))
            if len(e.times) == 3 and len(self.eager_times) >= 1:
                g, ea = statistics.median(e.times), statistics.median(self.eager_times)
                if g > ea:
                    self.counters.disabled += 1
                    reason = f"graph replay slower than eager ({g:.3f} ms vs {ea:.3f} ms)"
                    self._disable(key, e, reason)
                    self.trace("DISABLE", e.key_str, f"reason={reason}")
        else:
            self.rt.hipGraphLaunch(e.exec, queue)
        e.replays += 1
        self.counters.replays += 1
        self.last_launches = 1
        self.last_event = "REPLAY"  # trace() inlined: called once per replay
        if self.debug:
            self.trace("REPLAY", e.key_str)
        return e.outputs

    def _eager(self, run_body, read_outputs, reason, key, quiet=False):
        run_body()
        self.counters.eager_runs += 1
        self.last_launches = 0
        if not quiet:
            self.trace("EAGER", self.key_summary(key), f"reason={reason}")
        return read_outputs()

    def _capture(self, key, queue, run_body, run_body_capture, read_outputs, failure):
        t0 = time.perf_counter()
        cq = self._capture_queue(queue)
        graph, reason = _record(self.rt, self.mode, cq, lambda: run_body_capture(cq))
        if graph is None:
            return self._fallback(key, reason, run_body, read_outputs, failure)
        key_str = self.key_summary(key)
        e, event = self._update_oldest(graph, key_str)
        if e is None and event == "LIMIT":
            limit = self.options.max_graphs
            return self._eager(run_body, read_outputs, f"capture limit reached ({limit} graphs captured for "
                                                       f"this region; MIGRAPHX_HIP_GRAPH_MAX)", key)
        if e is None:
            e, reason = self._instantiate(graph, key_str)
            if e is None:
                return self._fallback(key, reason, run_body, read_outputs, failure)
            event = "CAPTURE"
        self.failed.pop(key, None)
        self.entries[key] = e
        self._enforce_bytes()
        e.outputs = read_outputs()
        ms = (time.perf_counter() - t0) * 1e3
        self.capture_ms += ms
        self.trace(event, key_str, f"nodes={e.nodes} ({ms:.1f} ms)")
        if self._validation_due(e):  # the first launch of a new exec is checked too
            e.replays -= 1
            self.counters.replays -= 1
            return self._replay_validated(e, key, queue, run_body, read_outputs)
        self.rt.hipGraphLaunch(e.exec, queue)
        self.last_launches = 1
        return e.outputs

    def _capture_queue(self, queue):
        """The queue a capture of work for ``queue`` records on: the context's capture queue, or
        ``queue`` itself when the context has none or cannot make one (traced): whatever making it
        raised (the runtime's DeviceError, or the BLAS binding's own error for the queue's handle),
        since a failure here must not fail the call."""
        make = getattr(self.ctx, "capture_queue", None)
        if make is None:
            return queue
        try:
            return make(queue)
        except Exception as ex:  # noqa: BLE001 - any failure: the capture records on the queue itself
            self.trace("QUEUE", f"queue {queue:#x}", f"capturing on the queue itself: no capture queue ({_reason(ex)})")
            return queue

    def _update_oldest(self, graph, key_str):
        """When the region is full (``max_graphs`` execs held, or its lifetime captures used up), update
        the least recently used exec with ``graph`` in place.  Returns ``(entry, "UPDATE")`` when that
        worked, ``(None, "LIMIT")`` when the exec had to go and no capture is left (``graph`` destroyed),
        ``(None, "")`` when a new exec may be instantiated."""
        rt, o = self.rt, self.options
        used = self.budget.lifetime_captures.get(self.family, 0)
        if not (len(self.entries) >= o.max_graphs or (self.entries and used >= o.max_graphs)):
            return None, ""
        victim_key, victim = next(iter(self.entries.items()))
        del self.entries[victim_key]
        worn = victim.updates >= o.max_updates_per_exec
        if not worn and rt.hipGraphExecUpdate(victim.exec, graph):
            _safe(rt.hipGraphDestroy, graph)
            victim.key_str, victim.replays, victim.validations, victim.times = key_str, 0, 0, []
            victim.updates += 1
            self.counters.updates += 1
            return victim, "UPDATE"
        if worn:
            self.counters.refreshes += 1
        self._drop(victim)
        self.counters.evictions += 1
        self.trace("EVICT", victim.key_str, "reason=" + ("exec updated too often, replaced" if worn else
                                                         "topology changed, cannot update"))
        # replacing a worn exec is not a new variant
        if not worn and self.budget.lifetime_captures.get(self.family, 0) >= o.max_graphs:
            _safe(rt.hipGraphDestroy, graph)
            return None, "LIMIT"
        return None, ""

    def _instantiate(self, graph, key_str):
        """A new exec of ``graph`` (destroyed here); returns ``(entry, None)`` or ``(None, reason)``."""
        rt = self.rt
        free0 = _free_bytes(rt)
        try:
            exe = rt.hipGraphInstantiate(graph)
        except DeviceError as ex:
            _safe(rt.hipGraphDestroy, graph)
            return None, f"hipGraphInstantiate failed: {ex}"
        e = _Entry(key_str)
        e.exec = exe
        try:
            e.nodes = rt.hipGraphGetNodeCount(graph)
        except DeviceError:
            e.nodes = -1
        _safe(rt.hipGraphDestroy, graph)
        e.bytes = max(0, free0 - _free_bytes(rt)) if free0 is not None else 0
        self.counters.captures += 1
        with self.budget.lock:
            self.budget.lifetime_captures[self.family] = self.budget.lifetime_captures.get(self.family, 0) + 1
            self.budget.live_bytes += e.bytes
        return e, None

    def _drop(self, e) -> None:
        if e.exec is not None:
            _safe(self.rt.hipGraphExecDestroy, e.exec)
            e.exec = None
        with self.budget.lock:
            self.budget.live_bytes -= e.bytes
        e.bytes = 0

    def _disable(self, key, e, reason: str) -> None:
        """Drop the exec of ``key`` and run the key eagerly from now on, for ``reason``."""
        del self.entries[key]
        self._drop(e)
        self.failed[key] = _Failure(reason, NEVER, 1)

    def _enforce_bytes(self) -> None:
        cap = self.options.max_graph_bytes
        while self.budget.live_bytes > cap and len(self.entries) > 1:
            k, victim = next(iter(self.entries.items()))
            del self.entries[k]
            self._drop(victim)
            self.counters.evictions += 1
            self.trace("EVICT", victim.key_str, f"reason=graph memory above the cap ({cap} bytes; "
                                                f"MIGRAPHX_HIP_GRAPH_MAX_BYTES)")

    def _fallback(self, key, reason, run_body, read_outputs, failure):
        attempts = (failure.attempts + 1) if failure is not None else 1
        wait = min(self.options.retry_after << (attempts - 1), 1024)
        self.failed[key] = _Failure(reason, self.calls + wait, attempts)
        self.counters.fallbacks += 1
        self.trace("FALLBACK", self.key_summary(key), f"reason={reason}; retry in {wait} calls")
        run_body()
        self.counters.eager_runs += 1
        self.last_launches = 0
        return read_outputs()

    # -- teardown --------------------------------------------------------------------------------
    def release(self) -> None:
        """Destroy every graph exec (after the queue is synchronized)."""
        with self.lock:
            self.last_call, self.last_result = None, RegionResult(None, None)
            for e in self.entries.values():
                self._drop(e)
            self.entries.clear()


def _record(rt, mode: int, queue, run_body_capture):
    """Record the body (``run_body_capture()``, which issues it on ``queue``) into a graph on
    ``queue``; returns ``(graph, None)`` or ``(None, reason)``.  Any
    failure ends the capture cleanly (its partial graph destroyed); only KeyboardInterrupt propagates."""
    try:
        rt.hipStreamBeginCapture(queue, mode)
    except DeviceError as ex:
        return None, f"hipStreamBeginCapture failed: {ex}"
    err = None
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
        return None, _reason(err)
    return graph, None


def _timed(rt, fn, queue) -> float:
    """Milliseconds ``fn()`` takes on ``queue``, between two events (synchronizes on the second)."""
    a, b = rt.hipEventCreate(), rt.hipEventCreate()
    rt.hipEventRecord(a, queue)
    fn()
    rt.hipEventRecord(b, queue)
    rt.hipEventSynchronize(b)
    ms = rt.hipEventElapsedTime(a, b)
    rt.hipEventDestroy(a)
    rt.hipEventDestroy(b)
    return ms


def _free_bytes(rt):
    """Free device memory in bytes (None on the host runtime or when the runtime cannot say)."""
    try:
        return rt.hipMemGetInfo()[0] if rt.platform != "host" else None
    except Exception:
        return None


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
