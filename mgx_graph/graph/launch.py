"""The ``graph_launch`` operation: capture a submodule once, replay it as one graph launch.

As MIGraphX's ``gpu::hip_graph`` op (``src/targets/gpu/hip_graph.cpp``), the op owns its behaviour:

* ``finalize(ctx, ins, run)`` (once, before any run) binds the fixed inputs (``meta["fixed_inputs"]``,
  recorded by the ``hip_graph`` pass: arena buffers, literals, loop-owned buffers) to the submodule's
  parameters for good, and creates the op's state, a :class:`~mgx_graph.graph.cache.GraphLaunchState`
  (the graph cache: warmup, capture, update, replay, fallback, eager; validation mode in
  :mod:`mgx_graph.graph.validation`);
* ``compute_modules(ctx, queue, out, args, mods, run)`` (every call) builds the graph key from the
  movable inputs (``meta["movable_inputs"]``) and lets the state run the submodule through the eval
  loop's ``run`` callback: eagerly, for a capture, or not at all (a replay).

The key is the queue plus ``(parameter name, device pointer, shape, dtype char)`` of every movable
input, in sorted parameter-name order (a :class:`GraphKey`: a tuple whose hash is computed once).
A call whose movable inputs are the very objects of the previous call, on the same queue and in the
same bind epoch of the eval loop (the parameters not bound anew since, so unchanged: see
:mod:`mgx_graph.graph.replay`), has the previous call's key: the state says so
(:meth:`GraphLaunchState.repeat_of`), and its :class:`~mgx_graph.graph.replay.RegionCall` (key and
callbacks) is reused instead of being built again.  Graph APIs are called only through the runtime layer.
"""
from __future__ import annotations

from ..errors import CompileError
from ..operators.base import Operation, register_op
from ..passes.analysis import bound_params, launch_count
from .cache import GraphBudget, GraphLaunchState, GraphOptions  # noqa: F401  (the op's state and settings)
from .replay import RegionCall
from .validation import Validator


class GraphKey(tuple):
    """A graph key ``(queue, ((name, device pointer, shape, dtype char), ...))``: equal to, printed
    and hashed as the plain tuple, its hash computed once, so looking the same key object up again
    costs no pass over its items."""

    def __new__(cls, queue, items):
        key = super().__new__(cls, (queue, items))
        key._hash = tuple.__hash__(key)
        return key

    def __hash__(self):
        return self._hash


@register_op
class GraphLaunch(Operation):
    """Runs its submodule as a graph; shape: the submodule's return shape (a tuple when it returns
    several).  One op object per instruction (the ``hip_graph`` pass makes one per region): the
    state made by :meth:`finalize` belongs to that instruction."""

    name = "graph_launch"
    capturable = False
    foldable = False

    def compute_shape(self, inputs, mods=()):
        outs = mods[0].get_output_shapes()
        return outs[0] if len(outs) == 1 else tuple(outs)

    def finalize(self, ctx, ins, run) -> GraphLaunchState:
        """Bind the fixed inputs and create this region's :class:`GraphLaunchState` (named
        ``<label><submodule>``, counted under the program's graph budget).

        An instruction with no placement record (not made by the ``hip_graph`` pass) treats every input
        as movable.  Raises CompileError naming the instruction when the record does not list the
        submodule's parameters, when a fixed input is in fact bound per call, or when the op was
        finalized before (an op object shared by two instructions)."""
        if self.__dict__.get("state") is not None:
            raise CompileError(f"{_where(ins)}: finalized twice (one graph_launch op object per instruction)")
        sub = ins.module_inputs[0]
        names = sorted(sub.get_parameter_names())
        movable = list(ins.meta.get("movable_inputs", names))
        fixed = list(ins.meta.get("fixed_inputs", ()))
        if sorted(movable + fixed) != names:
            raise CompileError(f"{_where(ins)}: input placement lists {sorted(movable + fixed)}, the submodule "
                               f"'{sub.name}' has parameters {names}")
        index = {n: k for k, n in enumerate(names)}
        moved = [n for n in fixed if run.moves(ins.inputs[index[n]])]
        if moved:
            raise CompileError(f"{_where(ins)}: input(s) {moved} recorded as fixed are bound per call "
                               f"(was the program changed after the hip_graph pass?)")
        run.bind(sub, {n: run.value(ins.inputs[index[n]]) for n in fixed})
        self._movable = sorted((index[n], n) for n in movable)
        self._names = tuple(n for _, n in self._movable)
        main = ins.module.program.get_main_module()
        written = [main.get_parameter(n) for i in sub.instructions for _, n in bound_params(i)]
        validator = Validator(ctx, lambda: [run.value(p) for p in written])
        self.state = GraphLaunchState(f"{run.label}{sub.name}", ctx, sum(launch_count(i) for i in sub.instructions),
                                      sum(1 for i in sub.instructions if not i.op.builtin), budget=run.budget,
                                      family=sub.name, validator=validator, n_results=len(sub.get_return().inputs))
        return self.state

    def call_inputs(self) -> list[int]:
        """The positions of the inputs a call reads (the movable ones, in key order); the eval loop
        passes only these as ``args`` (the fixed ones were bound at finalize)."""
        return [k for k, _ in self._movable]

    def graph_key(self, ctx, queue, args) -> GraphKey:
        """``(queue, ((name, device pointer, shape, dtype char), ...))`` of the movable inputs ``args``
        (in :meth:`call_inputs` order)."""
        ptr = ctx.data_ptr
        return GraphKey(queue, tuple((n, ptr(a), a.shape, a.dtype.char) for n, a in zip(self._names, args)))

    def region_call(self, ctx, queue, args, sub, run) -> RegionCall:
        """The :class:`RegionCall` of a call with movable inputs ``args``: the state's last call when the
        call repeats it (:meth:`GraphLaunchState.repeat_of`), else a new one, kept as the last call."""
        state, epoch = self.state, run.epoch
        call = state.repeat_of(queue, epoch, args)
        if call is None:
            params = dict(zip(self._names, args))
            call = state.last_call = RegionCall(queue, epoch, args, self.graph_key(ctx, queue, args),
                                                lambda: run(sub, queue, params), _capture_body(ctx, run, sub, params),
                                                lambda: run.outputs(sub))
        return call

    def compute_modules(self, ctx, queue, out, args, mods, run):
        """One call of the region (``args``: its movable inputs, in :meth:`call_inputs` order): its
        state warms up, captures, replays or runs eagerly; returns the submodule's results (one
        array, or a tuple: the same tuple object while the state returns the same result list)."""
        state = self.state
        call = self.region_call(ctx, queue, args, mods[0], run)
        outs = state.execute(call.key, queue, call.run_body, call.capture_body, call.read_outputs)
        run.add_launches(state.last_launches)
        return state.value_of(outs)


def _where(ins) -> str:
    m = ins.module
    return f"graph_launch {m.name}:{m.label_of(ins)}" if m is not None else "graph_launch"


def _capture_body(ctx, run, sub, params):
    """``body(q)``: one run of ``sub`` on ``params`` issued on queue ``q`` for a capture recorded there
    (the context's capture queue): every launch path reads ``q`` for the run: the steps' queue, the
    current stream of the array library (``ctx.on_queue``) and ``ctx.current_queue`` (the BLAS calls'),
    restored after."""
    def body(q):
        before = getattr(ctx, "current_queue", None)
        with ctx.on_queue(q):
            ctx.current_queue = q
            try:
                run(sub, q, params, capture=True)
            finally:
                ctx.current_queue = before
    return body
