"""The replay plan: a repeated ``run_async`` of a one-region program replayed without the eval loop.

After the ``hip_graph`` pass a decode step's program is one ``graph_launch`` region followed only by
views of its results (``get_tuple_elem`` of each output).  When a ``run_async`` repeats the previous
call (:mod:`mgx_graph.call_record`: the same array objects, unchanged, on the same queue), every layer
of the eval loop comes out as it did: the region's movable inputs are the same objects in the same
bind epoch, so :meth:`~mgx_graph.graph_launch.GraphLaunch.call_key` returns the same key object; the
region's state takes its branch for that key; a replay returns the same result list, so the region's
result tuple, the views of it and the program's outputs are the same objects again.

:class:`ReplayPlan` skips those layers for the one branch that repeats without side effects of its own:
a replay of the key's cached graph exec.  :meth:`ReplayPlan.run` checks what the layers would check
(the queue, the bind epoch and the key's inputs of the region's last call;
:meth:`~mgx_graph.graph_cache.GraphLaunchState.replay_again`: the exec still cached under the key, no
validation due, no eager mode, no capture open on the queue), replays through the state's own replay
(its counters, its trace, its slower-than-eager gate) and returns the outputs read from their slots.
When a check fails it returns None having changed nothing, and the executor runs the eval loop: the
results, counters and trace of a call are those of the full path either way.
``stats()["replay_plan_hits"]`` counts the calls it ran.
"""
from __future__ import annotations

from operator import is_

from .call_record import slot_getter
from .steps import step_kind


class ReplayPlan:
    """The replay plan of one executor whose ``main`` is one ``graph_launch`` instruction ``region``
    followed only by view steps; ``read(env)``: the region's movable inputs (its ``call_inputs()``, in
    order) from their slots; ``launches``: the kernels ``main``'s own steps issue (added to the
    replay's one launch); ``device``: the context's device (None: a host target), which must be the
    calling thread's current one (``query()``), as the eval loop's queue block would make it."""

    __slots__ = ("region", "read", "main", "launches", "device", "query")

    def __init__(self, region, read, main, launches: int, device=None, query=None):
        self.region, self.read, self.main, self.launches = region, read, main, launches
        self.device, self.query = device, query

    @classmethod
    def for_executor(cls, ex):
        """The plan of executor ``ex`` (after its eval loop is built), or None when its ``main`` is not
        one ``graph_launch`` region followed only by views of fixed or region-made values (a step before
        the region, a second region, a kernel or host step outside it)."""
        main = ex.program.get_main_module()
        movable, region = ex.buffers.movable, None
        for ins in main.instructions:
            kind = step_kind(ins, movable)
            if kind is None or (kind == "view" and region is not None):
                continue
            if kind != "modules" or ins.op.name != "graph_launch" or region is not None:
                return None
            region = ins
        picks = region.op.call_inputs() if region is not None else None
        if picks is None:
            return None
        slot, device = ex.buffers.slot, ex.ctx.device_id if ex.ctx.name == "gpu" else None
        read = slot_getter([slot[id(region.inputs[k])] for k in picks])
        return cls(region, read, main, ex.loop.launch_totals[main.name], device,
                   ex.ctx.runtime.current_device if device is not None else None)

    def run(self, ex, queue: int):
        """The outputs of a repeated call replayed on ``queue`` (the executor's lock held, its record
        matched and repeated), or None, with nothing changed, when the eval loop would do more than
        replay the last call's key (or another device is current: the eval loop then makes the
        program's current for the run)."""
        state = self.region.op.state
        last = state.last_call
        loop = ex.loop
        if last is None or last[0] != queue or last[1] != loop.epoch or not all(map(is_, self.read(ex.env), last[2])):
            return None
        if self.device is not None and self.query() != self.device:
            return None
        if state.replay_again(last[3][0], queue) is None:
            return None
        ex.ctx.current_queue = queue
        loop.launches = self.launches + state.last_launches
        ex.runs += 1
        ex.replay_plan_hits += 1
        return loop.runner.outputs(self.main)
