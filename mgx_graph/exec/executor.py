"""The executor of a compiled program: finalize once, then bind parameters and run the eval loop.

Finalize (the constructor) allocates the program's memory and fills every fixed slot
(:class:`~mgx_graph.exec.program_buffers.ProgramBuffers`), builds the steps of every module and finalizes
the ops with submodules (:class:`~mgx_graph.exec.eval_loop.EvalLoop`), all before the first run, so every
intermediate has a fixed address.  A run converts (:mod:`mgx_graph.exec.interop`), validates and binds the
parameters (staging inputs that overlap the program's own memory, :mod:`mgx_graph.exec.staging`), then
issues the steps of ``main`` on the queue.  A ``run_async`` that repeats the previous one (the same
array objects, unchanged, on the same queue) reuses its bindings and only repeats its copies
(``stats()["fast_path_hits"]`` counts those calls).  When the program is one graph region and such a call
replays its graph, the eval loop is skipped too, in Python or in one C call once armed (the replay path,
:mod:`mgx_graph.graph.replay`; ``stats()["replay_plan_hits"]``).  Parameters bound once as
*state* (:meth:`Executor.bind_state`: a decode step's KV cache) are held as the executor's own views
and left out of what a ``run_async`` call brings and what its record compares.
:meth:`Executor.profile_steps` and :meth:`Executor.dry_run` serve ``mgx-graph perf``.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from ..errors import MgxError, ParameterError
from ..graph.cache import GraphBudget, GraphOptions
from ..graph.counters import GraphCounters
from ..graph.replay import CallRecord, ReplayPlan
from ..passes.analysis import movable_values
from .bound_state import BoundState, state_views
from .eval_loop import EvalLoop
from .interop import expected, to_target, type_name
from .program_buffers import ProgramBuffers
from .staging import InputStaging
from .steps import step_kind
from .written_parameters import WrittenParameters


class Executor:
    """Runs one compiled program (``program``: the lowered IR; ``result``: its
    :class:`~mgx_graph.passes.compile_result.CompileResult`) on the target context ``ctx``.

    Thread-safe: runs are serialized by ``lock``.  Raises DeviceError when an allocation fails.
    """

    def __init__(self, program, result, ctx, *, options: GraphOptions | None = None,
                 budget: GraphBudget | None = None, label: str = ""):
        self.program, self.result, self.plan, self.ctx = program, result, result.memory_plan, ctx
        self.lock = threading.RLock()
        self.budget = budget or GraphBudget(options or GraphOptions.from_env())
        self.options = self.budget.options
        self.label = label
        self.runs = 0
        self.fast_path_hits = 0
        self._record: CallRecord | None = None  # the last run_async, while a repeat may reuse it
        self.released = False  # True once closed: its memory, queue and graphs are gone
        self.queues: set[int] = set()  # queues given to run_async (released with the context)
        self.buffers = ProgramBuffers(program, self.plan, ctx, movable_values(program), result.shared_literals, self)
        self.loop = EvalLoop(ctx, self.buffers, self.budget, label)
        self._finalize_parameters()
        self.replay_plan_hits = 0
        self._native = None  # the replay path in C, armed by the replay plan (mgx_graph.graph.replay)
        self._replay_plan = ReplayPlan.for_executor(self)  # a repeated call replayed without the eval loop
        self._uses_blas = any(i.op.uses_blas for m in self.buffers.modules for i in m.instructions)
        _before_any_capture(ctx, self.buffers.modules, self._uses_blas)
        self.staging = InputStaging.for_executor(self)

    def _finalize_parameters(self) -> None:
        b = self.buffers
        slot, main = b.slot, self.program.get_main_module()
        self.env, self.arena, self.literals = b.env, b.arena, b.literals
        self.param_area, self.param_buffers = b.param_area, b.param_buffers
        self.param_specs = [(p.op.parameter, slot[id(p)], p.shape) for p in b.params]
        self.param_names = {p.op.parameter for p in b.params}
        self._param_order = [name for name, _, _ in self.param_specs]
        self.state = BoundState(self._param_order)  # the parameters bound once (bind_state)
        self._param_checks = [(name, s, tuple(shape.lens), shape.np_dtype, shape)
                              for name, s, shape in self.param_specs]
        self.written = WrittenParameters(b, self.plan, main)
        self._written = self.written.slots
        self._written_names = {n for n, ps, _ in self.param_specs if ps in self._written}
        # a writer whose step stores its own value would need its binding restored before every run
        movable = b.movable
        self._rebind_per_run = any(step_kind(i, movable) in ("view", "guard", "modules") for i in self.written.writers)
        self.out_slots = [slot[id(i)] for i in main.get_return().inputs]

    @property
    def regions(self) -> list:
        """The graph_launch states of this program (one per region)."""
        return self.loop.states

    # -- parameters ------------------------------------------------------------------------------
    def bind(self, params: dict, device: bool, queue=None, copy: bool = False):
        """Validate and bind parameters (raises ParameterError before touching any state).

        Each value goes through :func:`mgx_graph.exec.interop.to_target` (any DLPack / CUDA Array Interface
        / numpy-readable object, viewed without a copy).  ``device`` (``run_async``): a value of the
        target's memory, C-contiguous, is bound as it is; with ``copy`` one in host memory (``gpu``) or
        non-contiguous is copied into its parameter buffer on ``queue``, without ``copy`` it is a
        ParameterError.  Not ``device`` (``run``): every value is copied into its parameter buffer.
        Device inputs that overlap the program's own memory are staged into their parameter buffers
        (see :mod:`mgx_graph.exec.staging`).  Drops the record of the last call (the bindings change).

        Returns ``(given, copies, staged)``: the objects given, in parameter order (None when one was
        converted to another object), the copies made and the inputs staged."""
        _drop_record(self)
        self.loop.epoch += 1
        if not isinstance(params, dict):
            raise ParameterError(f"parameters must be a dict of name -> array, got {type(params).__name__}")
        if len(params) != len(self._param_checks) or any(k not in self.param_names for k in params):
            unknown = [k for k in params if k not in self.param_names]
            if unknown:
                raise ParameterError(f"unknown parameter(s) {unknown}; the program takes {sorted(self.param_names)}")
        q = self.ctx.queue if queue is None else queue
        values, copies, given = [], [], []
        for name, s, lens, dt, shape in self._param_checks:
            g = params.get(name)
            a, on_device = self._checked(g, name, lens, dt, shape, q, device)
            given.append(g if a is g else None)
            if device and on_device and a.flags.c_contiguous:
                values.append((s, a))
                continue
            if device and not copy:
                _refuse_copy(self.ctx, name, a, on_device)
            buf = self.param_buffers[name]
            copies.append((buf, a, on_device))
            values.append((s, buf))
        self._check_writable(values)
        staged = self.staging.check(values)
        env = self.env
        for s, a in values:
            env[s] = a
        if copies:
            self._copy_in(q, copies, staged)
        elif staged:
            self.staging.stage(q, staged, env)
        self._bind_written_parameters()
        return given, copies, staged

    def _checked(self, a, name, lens, dt, shape, queue, device):
        """``(array, on_device)``: ``a`` as the value of parameter ``name`` (ParameterError naming
        expected vs given)."""
        if a is None:
            raise ParameterError(f"parameter '{name}' is missing (expected {shape.brief()})")
        a, on_device = to_target(self.ctx, a, name, queue, loose=not device)
        if a.shape != lens or a.dtype != dt:
            if a.ndim != len(lens):
                raise ParameterError(f"parameter '{name}': expected rank {len(lens)} {shape.brief()}, "
                                     f"got rank {a.ndim} {list(a.shape)}")
            if a.shape != lens:
                raise ParameterError(f"parameter '{name}': expected shape {list(lens)}, got {list(a.shape)}")
            raise ParameterError(f"parameter '{name}': expected dtype {shape.dtype}, got {a.dtype}")
        return a, on_device

    def _check_writable(self, values) -> None:
        """A parameter written in place (``alias``) must be given writable memory (a read-only numpy
        view, e.g. of a JAX array, is refused)."""
        for s, a in values:
            if s in self._written and not getattr(a.flags, "writeable", True):
                name = next(n for n, ps, _ in self.param_specs if ps == s)
                raise ParameterError(f"parameter '{name}' is written in place (an output is bound onto it) but "
                                     f"the array given is read-only")

    def _copy_in(self, q, copies, staged) -> None:
        """Copy ``[(parameter buffer, source, on_device)]`` into the parameter buffers on queue ``q``
        (with the ``staged`` inputs): a device source in the program's own memory is read first, so
        every copy reads the caller's value."""
        ctx, staging = self.ctx, self.staging
        with ctx.on_queue(q):
            copies = [(buf, ctx.xp.array(a, copy=True) if dev and staging.overlaps(a) else a, dev)
                      for buf, a, dev in copies]
        if staged:
            staging.stage(q, staged, self.env)
        for buf, src, dev in copies:
            if dev:
                ctx.copy(q, buf, src)
            else:
                ctx.copy_from_host(buf, src, q)

    def _bind_written_parameters(self) -> None:
        """Instructions that write into a parameter (``bind_param``) read its current array, in the
        layout they were planned with (:class:`~mgx_graph.exec.written_parameters.WrittenParameters`)."""
        self.written.bind(self.env)

    # -- running ---------------------------------------------------------------------------------
    def _use_queue(self, q: int) -> None:
        """Record ``q`` as a queue runs use; a new one gets its BLAS handle and workspace now, before
        any run on it: made lazily by the first GEMM, they would be allocated inside the capture of a
        first run that captures (``warmup=0``, as the runners' prefill programs), which fails it."""
        if q in self.queues:
            return
        if self._uses_blas:
            self.ctx.blas(q)
        self.queues.add(q)

    def bind_state(self, params) -> int:
        """:meth:`CompiledProgram.bind_state` (:mod:`mgx_graph.exec.bound_state`); returns the binding's serial."""
        with self.lock:
            self._check_open()
            views = state_views(self, params)
            self._record = None
            return self.state.set(views)

    def run_async(self, params: dict, queue=None, copy: bool = False) -> list:
        native = self._native  # the replay path in one C call (mgx_graph.graph.replay), when armed
        outs = native(params, queue, copy) if native is not None else None
        if outs is not None:
            return outs
        self._native = None  # none armed, or a check failed: the Python path runs (and may arm it again)
        with self.lock:
            self._check_open()
            q = self.ctx.queue if queue is None else int(queue)
            rec = self._record
            repeat = rec is not None and rec.matches(params, q, copy)
            if repeat and rec is not None:
                rec.repeat(self, q)
                if self._rebind_per_run:
                    self._bind_written_parameters()
                self.fast_path_hits += 1
            else:
                self._bind_call(params, q, copy)
            try:
                outs = self._replay_plan.run(self, q) if repeat and self._replay_plan is not None else None
                return self._run(q) if outs is None else outs
            except BaseException:
                self._record = None
                raise

    def _bind_call(self, params, q: int, copy: bool) -> None:
        """The full path of a ``run_async``: bind ``{**state, **params}``, record what the call brought."""
        self._use_queue(q)
        given, copies, staged = self.bind(self.state.merged(params), device=True, queue=q, copy=copy)
        given = self.state.call_values(params, given)
        if given is not None and all(g is not None for g in given):
            self._record = CallRecord(self.state.order, given, q, copy, self._written_names, copies, staged)

    def _run(self, q) -> list:
        ctx = self.ctx
        with ctx.on_queue(q):
            ctx.current_queue = q
            outs = self.loop.run(self.program.get_main_module(), q)
        self.runs += 1
        return outs

    def run(self, params: dict) -> list[np.ndarray]:
        with self.lock:
            self._check_open()
            ctx = self.ctx
            q = ctx.queue
            if not isinstance(params, dict):
                raise ParameterError(f"parameters must be a dict of name -> numpy array, got {type(params).__name__}")
            self.bind(params, device=False, queue=q)
            outs = self._run(q)
            ctx.synchronize(q)
            return [ctx.to_host(o, q) for o in outs]

    # -- profiling (mgx-graph perf) --------------------------------------------------------------
    def step_labels(self) -> list[str]:
        """``"main:@<n> <op>"`` of every step of ``main``, in run order."""
        return list(self.loop.labels["main"])

    def profile_steps(self, params: dict, device: bool = True) -> tuple[list[float], float]:
        """One run of ``main`` with the queue synchronized after every step, timed on the host.

        ``params``: device arrays (``device=True``) or host arrays, copied into the parameter buffers
        and the outputs copied back to the host as :meth:`run` does.  Returns ``([ms of each step, in
        step_labels() order], ms of the whole call)``; graph regions run as their state decides."""
        with self.lock:
            self._check_open()
            ctx = self.ctx
            q = ctx.queue
            r0 = time.perf_counter()
            self.bind(params, device=device, queue=q)
            times = []
            self.loop.launches = 0  # counted as a run counts them (stats' launches_per_run)
            with ctx.on_queue(q):
                ctx.current_queue = q
                for step in self.loop.steps["main"]:
                    t0 = time.perf_counter()
                    step(self.env, q)
                    ctx.synchronize(q)
                    times.append((time.perf_counter() - t0) * 1e3)
            self.loop.launches += self.loop.launch_totals.get("main", 0)
            if not device:
                for s in self.out_slots:
                    ctx.to_host(self.env[s], q)
            return times, (time.perf_counter() - r0) * 1e3

    def dry_run(self, params: dict, queue=None) -> list:
        """:meth:`run_async` with no instruction executed (migraphx-driver's dry run): binds the device
        ``params``, walks the steps of ``main`` and returns the output arrays (not computed)."""
        with self.lock:
            self._check_open()
            q = self.ctx.queue if queue is None else int(queue)
            self._use_queue(q)
            self.bind(params, device=True, queue=q)
            with self.ctx.on_queue(q):
                self.loop.walk("main", q)
            return [self.env[s] for s in self.out_slots]

    # -- stats and teardown ----------------------------------------------------------------------
    def _check_open(self):
        if self.released:
            raise MgxError("the program was released")

    def counters(self) -> GraphCounters:
        """The graph counters of every region of this program, summed."""
        return GraphCounters.total(r.counters for r in self.regions)

    def stats(self) -> dict:
        return _stats(self)

    def close(self) -> None:
        with self.lock:
            if self.released:
                return
            self.released, self._native = True, None
            self.buffers.close_borrowers()  # they read this program's literals
            if self._replay_plan is not None:
                self._replay_plan.forget()
            # no reference to the caller's arrays outlives the program: the slot values (shared by the
            # eval loop), the last call's record, the view memos, the bound-parameter views
            self._record = None
            self.state.set({})
            self.loop.forget()
            self.env[:] = [None] * len(self.env)
            self.written.forget_views()
            regions, self.env = list(self.regions), []
            self.staging.clear()
            # the context synchronizes, then graph execs go, then memory: later if a capture is open
            self.ctx.close(self.queues, before=lambda: [r.release() for r in regions])


def _stats(ex: Executor) -> dict:
    """:meth:`Executor.stats`: runs, hits, the graph counters, launches, graph and memory bytes
    (``shared_literal_bytes``: another program's literals read from its memory)."""
    regions = [r.stats() for r in ex.regions]
    eager_launches = ex.loop.launch_totals.get("main", 0) + sum(r["launches_eager"] for r in regions)
    return {"target": ex.ctx.name, "runs": ex.runs, "fast_path_hits": ex.fast_path_hits,
            "replay_plan_hits": ex.replay_plan_hits, "regions": regions,
            **ex.counters().program_dict(),
            "launches_per_run": ex.loop.launches, "launches_per_run_eager": eager_launches,
            "graph_bytes": ex.budget.live_bytes,
            "scratch_bytes": ex.plan.arena_bytes,
            "literal_bytes": ex.plan.literal_bytes, "shared_literal_bytes": ex.plan.shared_literal_bytes}


def _drop_record(ex) -> None:
    """Drop executor ``ex``'s record of the last call, its native replay and the replay plan's references
    to the last call's objects (which would keep the record's arrays alive)."""
    ex._record = ex._native = None
    if ex._replay_plan is not None:
        ex._replay_plan.forget()


def _refuse_copy(ctx, name, a, on_device) -> None:
    """The ParameterError of a ``run_async`` value of parameter ``name`` that would need a copy (host
    memory on a device target, or not C-contiguous) without ``copy=True``."""
    if not on_device:
        raise ParameterError(f"parameter '{name}': expected {expected(ctx)}, got {type_name(a)} in host "
                             f"memory (run_async(..., copy=True) copies it to the device)")
    raise ParameterError(f"parameter '{name}': device array must be C-contiguous (strides {a.strides}; "
                         f"run_async(..., copy=True) copies it)")


def _before_any_capture(ctx, modules, uses_blas: bool) -> None:
    """What a capture needs, made at finalize (never inside a capture): the BLAS handle of the program's
    queue when ``modules`` call BLAS, and when they hold graph regions the capture queue of the program's
    queue (:mod:`mgx_graph.graph.capture_queues`) with its own handle, so that a first capture
    allocates nothing (a caller's own capture open in the thread then would be spoiled by it).  A capture
    queue that cannot be made now is tried again at the first capture, which records on the queue itself
    if that fails."""
    if uses_blas:
        ctx.blas(ctx.queue)
    make = getattr(ctx, "capture_queue", None)
    if make is None or not any(i.op.name == "graph_launch" for m in modules for i in m.instructions):
        return
    try:
        make(ctx.queue)
    except Exception:  # noqa: BLE001 - see the docstring
        pass
