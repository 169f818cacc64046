"""The replay path: a repeated ``run_async`` of a one-region program replayed as one graph launch.

A decode loop passes the same parameter arrays every step (:class:`mgx_graph.llm.generation.Decoder`
rewrites them in place), and after the ``hip_graph`` pass its step is one ``graph_launch`` region followed
only by views of its results (``get_tuple_elem`` of each output).  Such a call repeats the previous one at
every level, so it is replayed in one unit, its fast checks asked of the objects that own them:

1. the call (:class:`CallRecord`, kept by the executor after a ``run_async`` in which every value was the
   target's own array as given): :meth:`CallRecord.matches` says that the call brings the recorded
   objects, unchanged, on the same queue, and :meth:`CallRecord.repeat` repeats its per-call copies; the
   executor then skips conversion, validation, binding and the staging check (``stats()["fast_path_hits"]``);
2. the region (its :class:`~mgx_graph.graph.cache.GraphLaunchState`, whose fast checks are
   :class:`FastReplay`'s): :meth:`FastReplay.repeat_of` says that the call repeats the region's last call,
   a :class:`RegionCall` (the same movable inputs in the same bind epoch, on the same queue: the same key),
   ``GraphLaunchState.replay_again`` replays the key's cached exec when the state would take that branch
   (the exec still cached, no validation due, no eager mode, no capture open on the queue), and
   :meth:`FastReplay.value_of` gives the region's value of its outputs;
3. the program (:class:`ReplayPlan`): the region's value is in its slot (else the views after it are made
   again, as the eval loop would), the program's device is current, the outputs are read from their slots.

The op asks its state the same questions in the eval loop (``GraphLaunch.compute_modules``,
:mod:`mgx_graph.graph.launch`), so a call that the plan does not take runs the eval loop and gets the same
answers; the results, counters, trace and errors of a call are those of the eval loop either way.
``stats()["replay_plan_hits"]`` counts the calls the plan replayed.

**The native replay** is that same path in C (``cpp/replay.c``).  Once the plan has replayed the same record,
region call and exec twice in a row, :func:`arm` builds a :class:`mgx_graph._native.Replay` from the checks
each owner gives as data (:class:`Guards`: the record's :meth:`CallRecord.native_layouts`, the state's
:meth:`FastReplay.replay_guards`, the executor's and the plan's below) and hands it to the executor,
which calls it first on every ``run_async``: it takes both locks without blocking, makes every check,
launches the exec through the driver (:meth:`mgx_graph.runtime.Runtime.native_replay_calls`), applies the
updates and returns the outputs; when a check fails, or the launch returns an error, it returns None having
changed nothing, and the Python path runs.  Arming needs the ``_native`` module (built from ``cpp/replay.c``
at install when a C compiler is present) and ``MIGRAPHX_NATIVE_REPLAY`` unset or true (:func:`available`).
A C object dropped without having replayed once counts as cold; after :data:`COLD_LIMIT` cold ones in a row
the plan stops arming (a loop whose calls all miss would otherwise pay the arming on every call).

What a call record compares, in one pass over the parameters:

* its queue and ``copy`` flag; a dict of exactly the names the recorded call brought (every parameter not
  bound as state), each bound to the very object of the recorded call (the record holds references to them,
  so no new object can take a recorded object's ``id``);
* every value's layout: numpy lets shape, strides and dtype be set on an existing array, so a numpy value's
  three are compared; CuPy lets only its shape be set (``dtype`` and ``strides`` are read-only), so a device
  array's shape alone is compared.  Neither lets an array's data pointer change, so the same live object has
  the same pointer; every numpy value of a parameter written in place (``alias``) is still writeable.

The contents of the arrays are not part of it (a decode step rewrites its inputs between calls), nor are the
parameters bound as state (:meth:`mgx_graph.exec.executor.Executor.bind_state`: the executor's own views,
bound again by every full bind).  Values the call had to convert (DLPack, ``__cuda_array_interface__``)
leave no record; every full bind (a ``run``, a call that does not match, a call that raised), a
``bind_state`` and ``release`` drop it.
"""
from __future__ import annotations

from operator import attrgetter, is_
from typing import Any, Callable, NamedTuple

import numpy as np

from .. import settings as mgx_settings
from ..errors import ExecutionError, MgxError
from ..exec.program_buffers import slot_getter
from ..exec.steps import step_kind
from ..operators.dynamic import SpecializationMiss

try:
    from .. import _native
except ImportError:  # built without a C compiler: the Python path replays
    _native = None  # type: ignore[assignment]  # no module: available() says so before any use

IS, EQ, LEN = 0, 1, 2  # how an attribute check compares (cpp/replay.c): identity, ==, len() ==
COLD_LIMIT = 2  # C objects dropped in a row without a replay before the plan stops arming

_LAYOUT = attrgetter("shape", "strides", "dtype")
_SHAPE = attrgetter("shape")
_WRITEABLE = attrgetter("flags.writeable")


# -- the checks and updates of the replay, as data for the C object --------------------------------------------
class AttrCheck(NamedTuple):
    """``getattr(obj, name)`` compared with ``expected``: ``mode`` :data:`IS`, :data:`EQ` or :data:`LEN`."""

    obj: Any
    name: str
    expected: Any
    mode: int


class ItemCheck(NamedTuple):
    """``container[key] is expected``."""

    container: Any
    key: Any
    expected: Any


class Count(NamedTuple):
    """``obj.name += 1`` on a replay."""

    obj: Any
    name: str


class Assign(NamedTuple):
    """``obj.name = value`` on a replay."""

    obj: Any
    name: str
    value: Any


class Layout(NamedTuple):
    """A recorded value's layout: the attribute ``names`` compared and their recorded ``values``."""

    names: tuple
    values: tuple


class Guards(NamedTuple):
    """The part of the replay one owner checks (``checks``, ``items``) and updates (``counts``, ``sets``)."""

    checks: tuple = ()
    items: tuple = ()
    counts: tuple = ()
    sets: tuple = ()

    @staticmethod
    def join(*parts: "Guards") -> "Guards":
        """One :class:`Guards` of ``parts``, in order."""
        return Guards(*(tuple(row for p in parts for row in getattr(p, f)) for f in Guards._fields))


# -- the call --------------------------------------------------------------------------------------------------
class CallRecord:
    """One recorded ``run_async`` call of an executor (see the module docstring).

    ``names``: the names a call brings (the parameters not bound as state), in the executor's order;
    ``values``: the objects given for them (the same order); ``queue``: the call's queue (int); ``copy``: its
    ``copy`` flag; ``written``: the names of the parameters written in place; ``copies``: ``[(parameter buffer,
    source, on_device)]`` and ``staged``: ``[(slot, array, buffer)]`` as :meth:`Executor.bind` resolved them.
    """

    __slots__ = ("queue", "copy", "n", "names", "getter", "values", "host", "layouts", "device", "shapes", "writeable",
                 "copies", "staged")

    def __init__(self, names, values, queue: int, copy: bool, written, copies, staged):
        self.queue, self.copy, self.n = queue, bool(copy), len(names)
        self.names = tuple(names)
        self.getter = slot_getter(names)
        self.values = tuple(values)
        self.host = [a for a in self.values if isinstance(a, np.ndarray)]
        self.device = [a for a in self.values if not isinstance(a, np.ndarray)]
        self.layouts = list(map(_LAYOUT, self.host))
        self.shapes = list(map(_SHAPE, self.device))
        self.writeable = [a for n, a in zip(names, self.values) if n in written and isinstance(a, np.ndarray)]
        self.copies, self.staged = list(copies), list(staged)

    def matches(self, params, queue: int, copy) -> bool:
        """Whether a ``run_async(params, queue, copy)`` repeats the recorded call (see the module
        docstring); no state is touched."""
        if queue != self.queue or bool(copy) != self.copy or type(params) is not dict or len(params) != self.n:
            return False
        try:
            values = self.getter(params)
        except KeyError:
            return False
        # the same objects: their current layouts are read from the recorded references
        if not all(map(is_, values, self.values)) or list(map(_SHAPE, self.device)) != self.shapes:
            return False
        return not self.host or (list(map(_LAYOUT, self.host)) == self.layouts and all(map(_WRITEABLE, self.writeable)))

    def repeat(self, executor, queue: int) -> None:
        """The per-call work of the recorded call on ``queue``: its copies into parameter buffers and its
        staged inputs (what the call's bind would issue again)."""
        if self.copies:
            executor._copy_in(queue, self.copies, self.staged)
        elif self.staged:
            executor.staging.stage(queue, self.staged, executor.env)

    @property
    def bare(self) -> bool:
        """Whether a repeat does nothing but the check: no copies, no staged inputs, ``copy`` false."""
        return not self.copies and not self.staged and not self.copy

    def native_layouts(self) -> tuple:
        """Per recorded value, the :class:`Layout` :meth:`matches` compares: shape, strides and dtype of a
        numpy array, the shape of a device array."""
        host, device = iter(self.layouts), iter(self.shapes)
        return tuple(Layout(("shape", "strides", "dtype"), tuple(next(host))) if isinstance(v, np.ndarray)
                     else Layout(("shape",), (next(device),)) for v in self.values)


# -- the region ------------------------------------------------------------------------------------------------
class RegionCall(NamedTuple):
    """One call of a region as its ``graph_launch`` op made it: kept as the state's ``last_call`` while a
    later call may repeat it (:meth:`FastReplay.repeat_of`)."""

    queue: int
    epoch: int                          # the eval loop's bind epoch (mgx_graph.exec.eval_loop)
    inputs: tuple                       # the movable inputs' objects, in the op's call_inputs() order
    key: Any                            # the graph key (mgx_graph.graph.launch.GraphKey)
    run_body: Callable[[], Any]         # the body run eagerly on the queue
    capture_body: Callable[[Any], Any]  # the body issued on a capture queue
    read_outputs: Callable[[], list]    # the body's results after either


class RegionResult(NamedTuple):
    """The region's value of a result list: ``outputs`` (a list a call returned) and ``value`` (the tuple
    of them, the same object while calls return that list)."""

    outputs: list | None
    value: Any


class RegionGuards(NamedTuple):
    """The plain replay of a region's last call: the graph exec it launches, the region's value it returns
    (of the key's cached outputs), and, as :class:`Guards`, what keeps a repeat that replay and what the
    replay updates."""

    exec: Any
    value: Any
    guards: Guards


class FastReplay:
    """The fast checks of a repeated call of a region, a property of its state
    (:class:`~mgx_graph.graph.cache.GraphLaunchState`, which this mixin is part of: it reads the state's
    ``last_call``, ``last_result``, ``n_results``, ``entries``, ``options``, ``validator``, ``debug``,
    ``force_eager`` and ``counters``)."""

    last_call: RegionCall | None
    last_result: RegionResult
    n_results: int
    entries: Any
    options: Any
    validator: Any
    debug: bool
    force_eager: bool
    counters: Any

    def repeat_of(self, queue, epoch: int, inputs) -> RegionCall | None:
        """``last_call`` when a call on ``queue`` in bind epoch ``epoch`` with the movable inputs ``inputs``
        repeats it (the very objects, so the key and the callbacks would come out the same), else None."""
        last = self.last_call
        if last is not None and last.queue == queue and last.epoch == epoch and all(map(is_, inputs, last.inputs)):
            return last
        return None

    def value_of(self, outs):
        """The region's value for the result list ``outs`` a call returned: ``outs[0]`` for one result,
        else a tuple of them (the same tuple object while calls return the same list)."""
        if self.n_results == 1:
            return outs[0]
        last = self.last_result
        if last.outputs is outs:
            return last.value
        value = tuple(outs)
        self.last_result = RegionResult(outs, value)
        return value

    def entry_of(self, call: RegionCall):
        """The cache entry (exec, outputs, counts) a replay of ``call`` launches, or None."""
        return self.entries.get(call.key)

    def replay_guards(self, call: RegionCall) -> RegionGuards | None:
        """The plain replay of ``call`` (the last call) as data for the native replay: the exec it launches,
        the region's value it returns, the checks that keep a repeat of ``call`` that replay (the key's exec the only one cached
        and the same, no eager mode, validation, gate or debug trace pending) and what it updates (the
        counters of ``GraphLaunchState._replay``).  None when a repeat would not stay the plain replay."""
        e, o = self.entries.get(call.key), self.options
        if e is None or e.exec is None or call is not self.last_call or self.debug or self.force_eager or \
                len(self.entries) != 1 or (o.validate and self.validator is not None) or \
                (o.gate_slower and len(e.times) < 3):
            return None
        value = self.value_of(e.outputs)
        checks = [AttrCheck(self, "last_call", call, IS), AttrCheck(self, "entries", self.entries, IS),
                  AttrCheck(self, "entries", 1, LEN), AttrCheck(self, "force_eager", self.force_eager, IS),
                  AttrCheck(self, "debug", self.debug, IS), AttrCheck(self, "options", o, IS),
                  AttrCheck(o, "validate", o.validate, EQ), AttrCheck(self, "validator", self.validator, IS),
                  AttrCheck(o, "gate_slower", o.gate_slower, EQ), AttrCheck(e, "times", len(e.times), LEN),
                  AttrCheck(e, "exec", e.exec, IS), AttrCheck(e, "outputs", e.outputs, IS),
                  AttrCheck(self, "counters", self.counters, IS)]
        items = [ItemCheck(self.entries, call.key, e)]
        if self.n_results == 1:
            items.append(ItemCheck(e.outputs, 0, value))
        else:
            checks.append(AttrCheck(self, "last_result", self.last_result, IS))
        counts = (Count(self, "calls"), Count(self.counters, "replays"), Count(e, "replays"))
        sets = (Assign(self, "last_launches", 1), Assign(self, "last_event", "REPLAY"))
        return RegionGuards(e.exec, value, Guards(tuple(checks), tuple(items), counts, sets))


# -- the program -----------------------------------------------------------------------------------------------
class ReplayPlan:
    """The replay path of one executor whose ``main`` is one ``graph_launch`` instruction ``region`` followed
    only by view steps.  ``state``: the region's state; ``slots``: the env slots of the region's movable inputs
    (its ``call_inputs()``, in order), ``read(env)`` their values; ``main`` / ``returns(env)``: the module and
    its outputs; ``launches``: the kernels ``main``'s own steps issue (added to the replay's one launch);
    ``device``: the context's device (None: a host target), which must be the calling thread's current one
    (``query()``), as the eval loop's queue block would make it; ``block(queue)``: the queue block a host
    target's replay runs in (None on a device target); ``out``: the region's slot; ``tail``: the eval loop's
    plain steps of ``main`` after the region (its views); ``label``: the region step's label in errors;
    ``native``: whether its replays arm the executor's native replay (a device target unless
    ``MIGRAPHX_NATIVE_REPLAY=0`` in ``settings``, the compiled program's: :meth:`_arm`)."""

    __slots__ = ("region", "state", "read", "slots", "main", "returns", "launches", "device", "query", "block", "out",
                 "tail", "label", "native", "_mark", "_armed", "_cold")

    def __init__(self, region, slots, main, launches: int, device=None, query=None, *, block=None, out=None,
                 tail=(), label: str = "graph_launch", settings=None, returns=None):
        self.slots = list(slots)
        self.region, self.state, self.read = region, region.op.state, slot_getter(self.slots)
        self.main, self.returns, self.launches = main, returns, launches
        self._mark: tuple = ()  # (record, region call, exec) of the last replay: the same twice arms the C object
        self._armed, self._cold = None, 0  # the last C object armed; how many in a row were dropped unused
        self.native = device is not None and available(settings)  # arms the native replay
        self.device, self.query = device, query
        self.block, self.out, self.tail, self.label = block, out, list(tail), label

    @classmethod
    def for_executor(cls, ex):
        """The plan of executor ``ex`` (after its eval loop is built), or None when its ``main`` is not one
        ``graph_launch`` region followed only by views of fixed or region-made values (a step before the
        region, a second region, a kernel or host step outside it), or when one lone view follows the
        region (its step is made again on every run of the eval loop: a new object each call)."""
        main = ex.program.get_main_module()
        movable, region, views = ex.buffers.movable, None, 0
        for ins in main.instructions:
            kind = step_kind(ins, movable)
            if kind is None or (kind == "view" and region is not None):
                views += kind is not None
                continue
            if kind != "modules" or ins.op.name != "graph_launch" or region is not None:
                return None
            region = ins
        picks = region.op.call_inputs() if region is not None else None
        if picks is None or views == 1:
            return None
        slot, ctx, loop = ex.buffers.slot, ex.ctx, ex.loop
        device = ctx.device_id if ctx.name == "gpu" else None
        return cls(region, [slot[id(region.inputs[k])] for k in picks], main, loop.launch_totals[main.name], device,
                   ctx.runtime.device_query() if device is not None else None,
                   block=ctx.on_queue if device is None else None, out=slot[id(region)],
                   tail=loop.plain[main.name][1:], label=loop.plain_labels[main.name][0],
                   settings=ex.result.settings, returns=loop.runner.returns_of(main))

    def run(self, ex, queue: int):
        """The outputs of a repeated call replayed on ``queue`` (the executor's lock held, its record matched
        and repeated), or None when the eval loop would do more than replay the region's last call (or
        another device is current: the eval loop then makes the program's current for the run), with
        nothing changed but the context's current queue (which the eval loop's run sets so too).  Raises
        what the eval loop's run would raise (an error of a kernel the replay runs on the host:
        ExecutionError naming the region)."""
        call = self.state.repeat_of(queue, ex.loop.epoch, self.read(ex.env))
        if call is None or (self.device is not None and self.query() != self.device):
            return None
        if self.block is None:
            return self._replay(ex, call, queue)
        with self.block(queue):
            return self._replay(ex, call, queue)

    def _replay(self, ex, call, queue: int):
        loop, state = ex.loop, self.state
        ex.ctx.current_queue = queue
        try:
            outs = state.replay_again(call.key, queue)
        except BaseException as e:
            loop.launches = 0  # as a run of the eval loop that raised at its first step
            if not isinstance(e, Exception) or isinstance(e, (MgxError, SpecializationMiss)):
                raise
            raise ExecutionError(f"instruction {self.label}: {type(e).__name__}: {e}") from e
        if outs is None:
            return None
        loop.launches = self.launches + state.last_launches
        value, env = state.value_of(outs), ex.env
        if env[self.out] is not value:  # the last call returned other arrays: its views are made again
            env[self.out] = value
            for step in self.tail:
                step(env, queue)
        ex.runs += 1
        ex.replay_plan_hits += 1
        if self.native:
            self._arm(ex, call, queue)
        return list(self.returns(env))

    def _arm(self, ex, call, queue: int) -> None:
        """Arm the executor's native replay when this replay repeats the last one's record, region call and
        exec (a steady loop), else remember them; called only while :attr:`native` (nothing is kept while
        the native replay is off)."""
        mark = (ex._record, call, self.state.entry_of(call))
        if len(self._mark) == 3 and all(map(is_, mark, self._mark)):
            self._settle()
            if self._cold < COLD_LIMIT:
                ex._native = self._armed = arm(ex, self, call, queue)
        self._mark = mark

    def _settle(self) -> None:
        """Drop the last C object armed, counting it as cold when it never replayed."""
        last, self._armed = self._armed, None
        if last is not None:
            self._cold = self._cold + 1 if last.hits == 0 else 0

    def forget(self) -> None:
        """Drop the references to the last call's objects (a full bind dropped the record, whose arrays the
        mark and the C object would keep alive; or the executor is released)."""
        self._settle()
        self._mark = ()


# -- the same path in C ----------------------------------------------------------------------------------------
def available(settings=None) -> bool:
    """Whether the native replay can arm here: the module is built and ``MIGRAPHX_NATIVE_REPLAY`` of
    ``settings`` (a compiled program's; default: :func:`mgx_graph.settings.current`) is on.  On by default:
    9.9 against 15-33 host us per W1 step on an H200, 2026-12-03."""
    return _native is not None and (settings or mgx_settings.current()).native_replay


def _program_guards(ex, plan: ReplayPlan, call, value) -> Guards | None:
    """The executor's and the plan's part of the replay: the executor open with the same record, plan,
    eval loop (bind epoch ``call.epoch``) and context, the region's inputs and value in their slots; the run
    counters and the context's current queue and launch count it sets.  None when the value's slot holds
    another value (the plan would make the views again)."""
    env, loop = ex.env, ex.loop
    if env[plan.out] is not value:
        return None
    checks = (AttrCheck(ex, "released", False, IS), AttrCheck(ex, "_record", ex._record, IS),
              AttrCheck(ex, "_replay_plan", plan, IS), AttrCheck(ex, "_rebind_per_run", False, IS),
              AttrCheck(ex, "loop", loop, IS), AttrCheck(loop, "epoch", call.epoch, EQ),
              AttrCheck(loop, "runner", loop.runner, IS), AttrCheck(loop.runner, "_env", env, IS),
              AttrCheck(ex, "ctx", ex.ctx, IS))
    items = (*(ItemCheck(env, s, a) for s, a in zip(plan.slots, call.inputs)), ItemCheck(env, plan.out, value))
    counts = (Count(ex, "runs"), Count(ex, "fast_path_hits"), Count(ex, "replay_plan_hits"))
    sets = (Assign(ex.ctx, "current_queue", call.queue), Assign(loop, "launches", plan.launches + 1))
    return Guards(checks, items, counts, sets)


def arm(ex, plan: ReplayPlan, call, queue: int):
    """The :class:`mgx_graph._native.Replay` of ``call`` just replayed by ``plan`` on ``queue`` (the executor's
    lock held), or None when it cannot be armed: no native calls or exec handle on this runtime, a host
    target, a record whose repeat does more than the check, a region or program that would not stay the
    plain replay (see :meth:`FastReplay.replay_guards`)."""
    rt, rec, state = ex.ctx.runtime, ex._record, plan.state
    calls = rt.native_replay_calls()
    if calls is None or plan.device is None or rec is None or not rec.bare or rec.queue != queue or \
            ex._rebind_per_run or ex.released:
        return None
    region = state.replay_guards(call)
    if region is None:
        return None
    handle = rt.native_handle(region.exec)
    program = _program_guards(ex, plan, call, region.value) if handle is not None else None
    if program is None:
        return None
    g = Guards.join(program, region.guards)
    return _native.Replay(*calls, handle, queue, plan.device, ex.ctx, (ex.lock, state.lock), rec.names,
                          rec.values, rec.native_layouts(), tuple(rec.writeable), g.checks, g.items, g.counts,
                          g.sets, plan.returns, ex.env)
