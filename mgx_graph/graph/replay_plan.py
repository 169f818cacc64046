"""The replay plan: a repeated ``run_async`` of a one-region program replayed without the eval loop.

After the ``hip_graph`` pass a decode step's program is one ``graph_launch`` region followed only by
views of its results (``get_tuple_elem`` of each output).  When a ``run_async`` repeats the previous
call (:mod:`mgx_graph.graph.call_record`: the same array objects, unchanged, on the same queue), every layer
of the eval loop comes out as it did: the region's movable inputs are the same objects in the same
bind epoch, so :meth:`~mgx_graph.graph.launch.GraphLaunch.call_key` returns the same key object; the
region's state takes its branch for that key; a replay returns the key's cached result list, which is
in the common case the list the last call returned, so the region's result tuple, the views of it
and the program's outputs are the same objects again.

:class:`ReplayPlan` skips those layers for the one branch that repeats without side effects of its own:
a replay of the key's cached graph exec.  :meth:`ReplayPlan.run` checks what the layers would check
(the queue, the bind epoch and the key's inputs of the region's last call;
:meth:`~mgx_graph.graph.cache.GraphLaunchState.replay_again`: the exec still cached under the key, no
validation due, no eager mode, no capture open on the queue), replays through the state's own replay
(its counters, its trace, its slower-than-eager gate) and returns the outputs read from their slots.
When the last call returned other arrays than the key's cached ones (it ran the region eagerly: a
validated replay, a call made while the caller captured the queue), the region's value is set anew
and the views after it are made again, as the eval loop would.  On the ``ref`` target the replay runs
the kernels on the calling thread, so it runs in the context's queue block (numpy's floating-point
errors ignored, as in the eval loop); an error a kernel raises is an ExecutionError naming the
``graph_launch`` instruction, as the eval loop reports it.  When a check fails it returns None having
changed nothing, and the executor runs the eval loop: the results, counters, trace and errors of a
call are those of the full path either way.  ``stats()["replay_plan_hits"]`` counts the calls it ran.
"""
from __future__ import annotations

from operator import is_

from ..errors import ExecutionError, MgxError
from ..exec.steps import step_kind
from ..operators.dynamic import SpecializationMiss
from . import native_replay
from .call_record import slot_getter


class ReplayPlan:
    """The replay plan of one executor whose ``main`` is one ``graph_launch`` instruction ``region``
    followed only by view steps; ``slots``: the env slots of the region's movable inputs (its
    ``call_inputs()``, in order), ``read(env)`` their values; ``launches``: the kernels ``main``'s own steps issue (added to the
    replay's one launch); ``device``: the context's device (None: a host target), which must be the
    calling thread's current one (``query()``), as the eval loop's queue block would make it;
    ``block(queue)``: the queue block a host target's replay runs in (None on a device target);
    ``out``: the region's slot; ``tail``: the eval loop's plain steps of ``main`` after the region (its
    views); ``label``: the region step's label in errors; ``native``: whether its replays arm the
    executor's native replay (a device target unless ``MIGRAPHX_NATIVE_REPLAY=0`` in ``settings``, the
    compiled program's: :meth:`_arm`)."""

    __slots__ = ("region", "read", "slots", "main", "launches", "device", "query", "block", "out", "tail", "label",
                 "native", "_mark", "_armed", "_cold")

    def __init__(self, region, slots, main, launches: int, device=None, query=None, *, block=None, out=None,
                 tail=(), label: str = "graph_launch", settings=None):
        self.slots = list(slots)
        self.region, self.read, self.main, self.launches = region, slot_getter(self.slots), main, launches
        self._mark: tuple = ()  # (record, last call, entry) of the last replay: the same twice arms the native replay
        self._armed, self._cold = None, 0  # the last C object armed; how many in a row were dropped unused
        self.native = device is not None and native_replay.available(settings)  # arms the native replay
        self.device, self.query = device, query
        self.block, self.out, self.tail, self.label = block, out, list(tail), label

    @classmethod
    def for_executor(cls, ex):
        """The plan of executor ``ex`` (after its eval loop is built), or None when its ``main`` is not
        one ``graph_launch`` region followed only by views of fixed or region-made values (a step before
        the region, a second region, a kernel or host step outside it), or when one lone view follows
        the region (its step is made again on every run of the eval loop: a new object each call)."""
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
                   settings=ex.result.settings)

    def run(self, ex, queue: int):
        """The outputs of a repeated call replayed on ``queue`` (the executor's lock held, its record
        matched and repeated), or None when the eval loop would do more than replay the last call's key
        (or another device is current: the eval loop then makes the program's current for the run),
        with nothing changed but the context's current queue (which the eval loop's run sets so too).
        Raises what the eval loop's run would raise (an error of a kernel the replay runs on the host:
        ExecutionError naming the region)."""
        state = self.region.op.state
        last = state.last_call
        if last is None or last[0] != queue or last[1] != ex.loop.epoch or \
                not all(map(is_, self.read(ex.env), last[2])):
            return None
        if self.device is not None and self.query() != self.device:
            return None
        if self.block is None:
            return self._replay(ex, state, last[3][0], queue)
        with self.block(queue):
            return self._replay(ex, state, last[3][0], queue)

    def _replay(self, ex, state, key, queue: int):
        loop = ex.loop
        ex.ctx.current_queue = queue
        try:
            outs = state.replay_again(key, queue)
        except BaseException as e:
            loop.launches = 0  # as a run of the eval loop that raised at its first step
            if not isinstance(e, Exception) or isinstance(e, (MgxError, SpecializationMiss)):
                raise
            raise ExecutionError(f"instruction {self.label}: {type(e).__name__}: {e}") from e
        if outs is None:
            return None
        loop.launches = self.launches + state.last_launches
        result, env = self.region.op.result_of(outs), ex.env
        if env[self.out] is not result:  # the last call returned other arrays: its views are made again
            env[self.out] = result
            for step in self.tail:
                step(env, queue)
        ex.runs += 1
        ex.replay_plan_hits += 1
        if self.native:
            self._arm(ex, state, key, queue)
        return loop.runner.outputs(self.main)

    def _arm(self, ex, state, key, queue: int) -> None:
        """Arm the executor's native replay (:mod:`mgx_graph.graph.native_replay`) when this replay repeats the
        last one's record, region call and exec (a steady loop), else remember them; called only while
        :attr:`native` (nothing is kept while the native replay is off)."""
        mark = (ex._record, state.last_call, state.entries.get(key))
        if len(self._mark) == 3 and all(map(is_, mark, self._mark)):
            self._settle()
            if self._cold < native_replay.COLD_LIMIT:
                ex._native = self._armed = native_replay.arm(ex, self, state, key, queue)
        self._mark = mark

    def _settle(self) -> None:
        """Drop the last C object armed, counting it as cold when it never replayed."""
        last, self._armed = self._armed, None
        if last is not None:
            self._cold = self._cold + 1 if last.hits == 0 else 0

    def forget(self) -> None:
        """Drop the references to the last call's objects (a full bind dropped the record, whose arrays
        the mark and the C object would keep alive; or the executor is released)."""
        self._settle()
        self._mark = ()
