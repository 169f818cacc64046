"""Shapes known only at run time: specializations of one ONNX model, chosen per call.

A model whose input dims are symbolic, or whose shapes depend on data (``NonZero``, a ``Reshape`` fed
by a computed shape, a ``Loop`` with scan outputs ...), is compiled per *specialization*: its input
shapes plus the run-time values the frontend needed (``known``).  On each call the dispatcher picks
the specialization for the given input shapes (most recently used first); a ``guard`` inside it
re-checks every specialized value, and a mismatch (``SpecializationMiss``) abandons that run and
re-dispatches with the observed value.  A value needed before any specialization exists is computed
by a *prefix program*: the model pruned to the nodes that produce it.  Specializations and prefix
programs are each capped at ``max_specializations`` (LRU, released on eviction), and so are the value
hints kept per input shapes (``HINTS_PER_SPECIALIZATION`` times that); every event is logged (logger
``mgx_graph.dynamic``, printed to stderr) when ``MIGRAPHX_HIP_GRAPH_DEBUG`` is on.

Queue: every specialization and prefix program runs on one queue, the dispatcher's (created with its
first specialization, destroyed at release), so the outputs of ``run_async`` are ready on
``prog.queue`` whatever specialization ran, and a call that reads the outputs of an earlier call of
other shapes runs after it, with no event or synchronization.  An evicted specialization leaves that
queue alive.

Threads: one dispatcher serves any number of threads; its runs are serialized (one queue: a region
capturing on it must not record another thread's launches).  Selection and bookkeeping take a lock;
compiles (and prefix runs) are serialized by a second lock, and a whole run by a third.  Every run holds
a reference on its specialization, so an evicted one is released when its last run returns, never
under it.  The outputs of ``run_async`` alias the specialization's buffers: with several threads,
another thread's call may evict it right after, so copy them before (``run`` returns host copies).
A released dispatcher refuses every run (``MgxError: the program was released``).

Outputs bound in place (``alias``) are not allowed here: a re-dispatched run must have no side effects.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from . import settings as mgx_settings
from .graph.counters import GraphCounters
from .errors import CompileError, MgxError, ParameterError
from .graph.counters import GraphCounters
from .onnx import parse_onnx
from .operators.dynamic import NeedsValue, SpecializationMiss, reduce_for_key
from .targets import make_context

MAX_ATTEMPTS = 16
HINTS_PER_SPECIALIZATION = 8
LOGGER = logging.getLogger("mgx_graph.dynamic")  # the MIGRAPHX_HIP_GRAPH_DEBUG trace of specializations


def _freeze(known: dict) -> tuple:
    return tuple(sorted((k, np.asarray(v).tobytes(), np.asarray(v).shape) for k, v in known.items()))


class _Entry:
    """A compiled program held by a :class:`ProgramCache`, and the runs in flight on it."""

    __slots__ = ("prog", "users", "evicted")

    def __init__(self, prog, users: int):
        self.prog, self.users, self.evicted = prog, users, False


class ProgramCache:
    """Compiled programs by key, least recently used first, at most ``cap`` of them (at least 1).

    Not locked itself: the dispatcher's lock guards every call.  :meth:`acquire` and ``insert(use=True)``
    count one user (a run in flight); an entry pushed out while it has users is only marked ``evicted``,
    and :meth:`done` reports when its last user returns, so that user releases it then.
    """

    def __init__(self, cap: int):
        self.cap = max(int(cap), 1)
        self.items: OrderedDict = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.items)

    def acquire(self, key) -> _Entry | None:
        """The entry under ``key`` (now the most recently used) with one more user, or None."""
        e = self.items.get(key)
        if e is not None:
            self.items.move_to_end(key)
            e.users += 1
        return e

    def insert(self, key, prog, use: bool) -> tuple[_Entry, int, list]:
        """Add ``prog`` under a new ``key``; returns its entry, how many entries were pushed out, and the
        programs among them to release now (no run in flight on them)."""
        e = self.items[key] = _Entry(prog, int(use))
        pushed, free = 0, []
        while len(self.items) > self.cap:
            _, old = self.items.popitem(last=False)
            old.evicted = True
            pushed += 1
            if old.users == 0:
                free.append(old.prog)
        self.evictions += pushed
        return e, pushed, free

    def done(self, e: _Entry) -> bool:
        """One user of ``e`` returned; True when ``e`` is evicted and that was its last user."""
        e.users -= 1
        return e.evicted and e.users == 0

    def clear(self) -> list:
        """Drop every entry; returns the programs to release now (the others go with their last run)."""
        free = []
        for e in self.items.values():
            e.evicted = True
            if e.users == 0:
                free.append(e.prog)
        self.items.clear()
        return free

    def programs(self) -> list:
        return [e.prog for e in self.items.values()]


class Dispatcher:
    """The specializations of one dynamic-shape program (see the module docstring): ``model`` (an
    ``onnx.ModelProto``) is parsed with ``parse_kw`` and compiled with ``compile_kw`` for ``target`` per
    call's shapes and values; each specialization and prefix program is a static
    :class:`~mgx_graph.exec.compiled.CompiledProgram`."""

    def __init__(self, model, parse_kw: dict, compile_kw: dict, target: str, compile_program,
                 max_specializations: int = 8, debug: bool = False):
        self.model = model
        self.compile_program = compile_program  # mgx_graph.compiler.compile_program, which makes this object
        self.parse_kw = dict(parse_kw)
        self.compile_kw = dict(compile_kw)
        self.target = target
        self.cap = max(int(max_specializations), 1)
        self.debug = debug or mgx_settings.current().hip_graph_debug
        if self.debug:
            mgx_settings.trace_logger(LOGGER.name)
        self.lock = threading.RLock()  # selection, caches, hints, counters
        self.compile_lock = threading.RLock()  # one compile (and its prefix runs) at a time
        self.run_lock = threading.RLock()  # one run at a time: every run enqueues on the one queue
        self._queue_ctx: Any = None  # the context that owns the queue of every specialization
        self.specs = ProgramCache(self.cap)  # (shapes, frozen known) -> CompiledProgram
        self.prefixes = ProgramCache(self.cap)  # (tensor, fn, shapes, frozen known) -> prefix CompiledProgram
        self.hints: OrderedDict = OrderedDict()  # shapes -> values of their latest specialization
        self.max_hints = HINTS_PER_SPECIALIZATION * self.cap
        self.released = False
        self.misses = 0
        self.compiles = 0
        self.budget = compile_kw.get("budget")
        self.retired = GraphCounters()  # graph counters of the specializations released so far
        self.retired_fast_path_hits = 0  # repeated run_async calls of those (see mgx_graph.graph.replay)
        self.retired_replay_plan_hits = 0  # those of them replayed without the eval loop (mgx_graph.graph.replay)

    @property
    def evictions(self) -> int:
        return self.specs.evictions

    def trace(self, event: str, detail: str) -> None:
        if self.debug:
            LOGGER.debug("[mgx_graph] %-8s %s", event, detail)

    def _check_open(self) -> None:
        if self.released:
            raise MgxError("the program was released")

    def queue(self) -> int:
        """The queue every specialization and prefix program runs on (created at the first call).
        Raises MgxError once released, DeviceError when the queue cannot be created."""
        with self.lock:
            self._check_open()
            if self._queue_ctx is None:
                self._queue_ctx = make_context(self.target, device_id=self.compile_kw.get("device_id"))
            return self._queue_ctx.queue

    # -- specializations -------------------------------------------------------------------------
    def _compile(self, shapes: tuple, known: dict, params):
        """The specialization (a static :class:`~mgx_graph.exec.compiled.CompiledProgram`) for ``shapes`` and
        the run-time values ``known`` (completed here with the values the frontend still needs)."""
        for _ in range(MAX_ATTEMPTS):
            try:
                prog = parse_onnx(self.model, input_dims=dict(shapes), known_values=known, **self.parse_kw)
            except MemoryError as e:  # e.g. a constant of a run-time shape folded on the host
                raise CompileError(f"specializing for shapes {_fmt_shapes(shapes)}" +
                                   (f" values {_fmt_known(known)}" if known else "") +
                                   f": out of host memory while parsing ({e})") from None
            except NeedsValue as nv:
                if nv.guess is not None:
                    known[nv.key] = np.asarray(nv.guess, np.int64)
                    continue
                if nv.evaluate is not None:
                    known.update(self._prefix_eval(nv, shapes, known, params))
                else:
                    known[nv.key] = self._prefix_value(nv, shapes, known, params)
                continue
            self.compiles += 1
            label = f"[spec {self.compiles}] "
            spec = self.compile_program(prog, self.target, alias=None, _label=label, _queue=self.queue(),
                                   **self.compile_kw)
            self.trace("SPECIALIZE", f"{label}shapes={_fmt_shapes(shapes)}" +
                       (f" values={_fmt_known(known)}" if known else ""))
            return spec
        raise MgxError(f"could not specialize the program after {MAX_ATTEMPTS} attempts (values {list(known)})")

    def _prefix_value(self, nv: NeedsValue, shapes, known, params):
        """Run the program parsed up to the node that needs the value (it ends in the tensor)."""
        pkey = (nv.tensor, nv.fn, shapes, _freeze(known))
        with self.lock:
            self._check_open()
            entry = self.prefixes.acquire(pkey)
        if entry is None:
            prog = nv.program
            main = prog.get_main_module()
            if nv.ins.module is not main:
                raise MgxError(f"node '{nv.node}': {nv.fn}({nv.tensor}) is needed inside a subgraph; "
                               f"this data-dependent shape is not supported")
            main.add_return([nv.ins], [nv.tensor])
            compiled = self.compile_program(prog, self.target, hip_graph=False, alias=None,
                                       fp16=self.compile_kw.get("fp16", False),
                                       device_id=self.compile_kw.get("device_id"), _queue=self.queue())
            with self.lock:
                entry, pushed, free = self.prefixes.insert(pkey, compiled, use=True)
            self._retire(free, fold=False)
            if pushed:
                self.trace("PRUNE", f"prefix program cap {self.cap} reached: released the least recently used")
            self.trace("PREFIX", f"computing {nv.fn}({nv.tensor}) needed by node '{nv.node}'")
        try:
            prog = entry.prog
            sub = {n: params[n] for n in prog.get_parameter_names()}
            val = prog.run(sub)[0]  # host copies; device inputs are copied in as host ones are
        finally:
            with self.lock:
                last = self.prefixes.done(entry)
            if last:
                self._retire([entry.prog], fold=False)
        return reduce_for_key(nv.fn, val)

    def _prefix_eval(self, nv: NeedsValue, shapes, known, params) -> dict:
        """Run the program parsed so far, returning the node's inputs, and evaluate them on the host."""
        prog = nv.program
        main = prog.get_main_module()
        if any(i.module is not main for i in nv.inputs):
            raise MgxError(f"node '{nv.node}': its output shape depends on values inside a subgraph; "
                           f"this data-dependent shape is not supported")
        main.add_return(list(nv.inputs), [f"in{k}" for k in range(len(nv.inputs))])
        prog = self.compile_program(prog, self.target, hip_graph=False, alias=None, fp16=self.compile_kw.get("fp16", False),
                               device_id=self.compile_kw.get("device_id"), _queue=self.queue())
        try:
            self.trace("PREFIX", f"evaluating node '{nv.node}' on the host for its output shapes")
            sub = {n: params[n] for n in prog.get_parameter_names()}
            vals = prog.run(sub)
        finally:
            prog.release()
        return nv.evaluate(vals)

    def _insert(self, shapes, known, prog, use: bool = False) -> _Entry:
        """Cache ``prog`` as the specialization for ``shapes`` and ``known`` (with a run counted on it when
        ``use``); pushes out the least recently used beyond the cap.  A specialization already cached under
        the same key (the values settled on one compiled before) is used instead and ``prog`` released."""
        key = (shapes, _freeze(known))
        entry, stale, pushed = None, None, 0
        free: list = []
        with self.lock:
            if not self.released:
                if key in self.specs.items:
                    stale = prog
                    entry = self.specs.acquire(key) if use else self.specs.items[key]
                else:
                    entry, pushed, free = self.specs.insert(key, prog, use)
                self.hints[shapes] = dict(known)
                self.hints.move_to_end(shapes)
                while len(self.hints) > self.max_hints:
                    self.hints.popitem(last=False)
        if entry is None:
            prog.release()
            raise MgxError("the program was released")
        if stale is not None:
            stale.release()
        for _ in range(pushed):
            self.trace("EVICT", f"specialization cap {self.cap} reached: released the least recently used")
        self._retire(free)
        return entry

    def _retire(self, progs, fold: bool = True) -> None:
        """Release programs no run holds any more, adding their graph counters to the retired totals."""
        for prog in progs:
            if fold:
                counts = prog.counters()
                ex = prog.executor
                hits, plan_hits = (ex.fast_path_hits, ex.replay_plan_hits) if ex is not None else (0, 0)
                with self.lock:
                    self.retired.add(counts)
                    self.retired_fast_path_hits += hits
                    self.retired_replay_plan_hits += plan_hits
            prog.release()

    def _select(self, shapes, known, params) -> _Entry:
        """The specialization for ``shapes`` and ``known`` with this run counted on it (compiled if new)."""
        key = (shapes, _freeze(known))
        with self.lock:
            self._check_open()
            entry = self.specs.acquire(key)
        if entry is not None:
            return entry
        with self.compile_lock:
            with self.lock:
                self._check_open()
                entry = self.specs.acquire(key)  # compiled by another thread meanwhile
            if entry is not None:
                return entry
            prog = self._compile(shapes, known, params)
            return self._insert(shapes, known, prog, use=True)

    def _done(self, entry: _Entry) -> None:
        with self.lock:
            last = self.specs.done(entry)
        if last:
            self._retire([entry.prog])

    # -- running ---------------------------------------------------------------------------------
    def run(self, params: dict, device: bool, queue=None, copy: bool = False):
        """Run the specialization for ``params``' shapes (and run-time values); see :mod:`mgx_graph.dynamic`.
        ``device``: as ``run_async`` (with ``copy``), else as ``run``.

        Raises ParameterError (before anything runs; for a ``queue`` given that was destroyed, once the
        specialization is selected, before it runs), MgxError once released,
        and what compiling a new specialization or running it raises; the dispatcher stays usable after
        any of them."""
        if not isinstance(params, dict):
            raise ParameterError(f"parameters must be a dict of name -> array, got {type(params).__name__}")
        self._check_open()
        validate_params(self.model, params)
        with self.run_lock:
            return self._run(params, device, queue, copy)

    def _run(self, params: dict, device: bool, queue, copy: bool):
        """:meth:`run` under the run lock: select (or compile) the specialization, run it, re-dispatch
        on a guard's miss."""
        shapes = tuple(sorted((n, tuple(int(d) for d in np.shape(a))) for n, a in params.items()))
        with self.lock:
            known = dict(self.hints.get(shapes, {}))
        for _ in range(MAX_ATTEMPTS):
            entry = self._select(shapes, known, params)
            try:
                exe = entry.prog.executor
                if queue is not None and not exe.ctx.runtime.queue_alive(queue):
                    raise ParameterError(_dead_queue(queue))
                return exe.run_async(params, queue, copy) if device else exe.run(params)
            except SpecializationMiss as miss:
                with self.lock:
                    self.misses += 1
                self.trace("RESPECIALIZE", f"{miss}")
                known[miss.key] = miss.observed
            finally:
                self._done(entry)
        raise MgxError(f"run-time values keep changing under the program (last known {list(known)})")

    def last(self):
        """The most recently used specialization (a :class:`~mgx_graph.exec.compiled.CompiledProgram`), or None."""
        with self.lock:
            return next(reversed(self.specs.items.values())).prog if self.specs.items else None

    def last_known(self) -> dict:
        """The run-time values (``{name: array}``) the most recently used specialization was compiled for."""
        with self.lock:
            return dict(next(reversed(self.hints.values()))) if self.hints else {}

    def counters(self) -> GraphCounters:
        """The graph counters of every specialization, those kept and those released, summed."""
        with self.lock:
            retired, progs = self.retired.copy(), self.specs.programs()
        return GraphCounters.total([retired] + [p.counters() for p in progs])

    def stats(self) -> dict:
        """The counters of :meth:`counters`, the regions of the kept specializations, the last one's
        launches and bytes, the repeated ``run_async`` calls of every specialization
        (``fast_path_hits``) and those of them replayed without the eval loop (``replay_plan_hits``),
        and the specialization / prefix-program / hint counts."""
        with self.lock:
            retired, progs = self.retired.copy(), self.specs.programs()
            n_prefixes, n_hints = len(self.prefixes), len(self.hints)
            hits, plan_hits = self.retired_fast_path_hits, self.retired_replay_plan_hits
        stats = [prog.stats() for prog in progs]
        agg = GraphCounters.total([retired] + [p.counters() for p in progs])
        regions = [r for st in stats for r in st["regions"]]
        last = stats[-1] if stats else None
        return {"target": self.target, "regions": regions, **agg.program_dict(),
                "fast_path_hits": hits + sum(st["fast_path_hits"] for st in stats),
                "replay_plan_hits": plan_hits + sum(st["replay_plan_hits"] for st in stats),
                "launches_per_run": last["launches_per_run"] if last else 0,
                "launches_per_run_eager": last["launches_per_run_eager"] if last else 0,
                "host_fallback_instructions": last["host_fallback_instructions"] if last else 0,
                "specializations": len(progs), "specialization_compiles": self.compiles,
                "specialization_misses": self.misses, "specialization_evictions": self.evictions,
                "prefix_programs": n_prefixes, "prefix_evictions": self.prefixes.evictions,
                "shape_hints": n_hints,
                "scratch_bytes": last["scratch_bytes"] if last else 0,
                "literal_bytes": last["literal_bytes"] if last else 0}

    def release(self) -> None:
        """Release every specialization and prefix program, then the queue (after a run in flight in
        another thread returns); later runs raise MgxError.  Safe to call more than once."""
        with self.run_lock:
            with self.lock:
                self.released = True
                specs, prefixes = self.specs.clear(), self.prefixes.clear()
                self.hints.clear()
                owner, self._queue_ctx = self._queue_ctx, None
            self._retire(specs)
            self._retire(prefixes, fold=False)
            if owner is not None:
                owner.close()


def validate_params(model, params: dict) -> None:
    """Check ``params`` against the declared graph inputs of ``model`` (an ``onnx.ModelProto``): every
    input given, nothing unknown, each rank and each fixed dim as declared.  Raises ParameterError naming
    the parameter, the dim and the expected and given values."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    decl = {vi.name: vi for vi in g.input if vi.name not in inits}
    unknown = [k for k in params if k not in decl]
    if unknown:
        raise ParameterError(f"unknown parameter(s) {unknown}; the program takes {sorted(decl)}")
    for name, vi in decl.items():
        if name not in params:
            raise ParameterError(f"parameter '{name}' is missing")
        a = params[name]
        dims = vi.type.tensor_type.shape.dim
        shape = np.shape(a)
        if len(shape) != len(dims):
            raise ParameterError(f"parameter '{name}': expected rank {len(dims)}, got rank {len(shape)} "
                                 f"{list(shape)}")
        for k, (d, given) in enumerate(zip(dims, shape)):
            if d.HasField("dim_value") and d.dim_value >= 0 and d.dim_value != given:
                raise ParameterError(f"parameter '{name}': dim {k} is fixed to {d.dim_value} by the model, "
                                     f"got {given} (shape {list(shape)})")


def _dead_queue(queue) -> str:
    return (f"queue {int(queue):#x} was destroyed: pass queue=None for the program's queue, or a queue created "
            f"and kept alive by the caller")


def _fmt_shapes(shapes) -> str:
    return ",".join(f"{n}{list(s)}" for n, s in shapes)


def _fmt_known(known) -> str:
    return ",".join(f"{k}={np.asarray(v).tolist()}" for k, v in sorted(known.items()))
