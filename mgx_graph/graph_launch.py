"""The ``graph_launch`` operation: capture a submodule once, replay it as one graph launch.

As MIGraphX's ``gpu::hip_graph`` op (``src/targets/gpu/hip_graph.cpp``), the op owns its behaviour:

* ``finalize(ctx, ins, run)`` (once, before any run) binds the fixed inputs (``meta["fixed_inputs"]``,
  recorded by the ``hip_graph`` pass: arena buffers, literals, loop-owned buffers) to the submodule's
  parameters for good, and creates the op's state, a :class:`~mgx_graph.graph_cache.GraphLaunchState`
  (the graph cache: warmup, capture, update, replay, fallback, eager; validation mode in
  :mod:`mgx_graph.graph_validation`);
* ``compute_modules(ctx, queue, out, args, mods, run)`` (every call) builds the graph key from the
  movable inputs (``meta["movable_inputs"]``) and lets the state run the submodule through the eval
  loop's ``run`` callback: eagerly, for a capture, or not at all (a replay).

The key is the queue plus ``(parameter name, device pointer, shape, dtype char)`` of every movable
input, in sorted parameter-name order.  Graph APIs are called only through the runtime layer.
"""
from __future__ import annotations

from .errors import CompileError
from .graph_cache import GraphBudget, GraphLaunchState, GraphOptions  # noqa: F401  (the op's state and settings)
from .graph_validation import Validator
from .operators.base import Operation, register_op
from .passes.hip_graph import launch_count


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
        self._single = len(sub.get_return().inputs) == 1
        main = ins.module.program.get_main_module()
        written = [main.get_parameter(i.meta["bind_param"]) for i in sub.instructions if "bind_param" in i.meta]
        validator = Validator(ctx, lambda: [run.value(p) for p in written])
        self.state = GraphLaunchState(f"{run.label}{sub.name}", ctx, sum(launch_count(i) for i in sub.instructions),
                                      sum(1 for i in sub.instructions if not i.op.builtin), budget=run.budget,
                                      family=sub.name, validator=validator)
        return self.state

    def graph_key(self, ctx, queue, args) -> tuple:
        """``(queue, ((name, device pointer, shape, dtype char), ...))`` of the movable inputs."""
        ptr = ctx.data_ptr
        return queue, tuple((n, ptr(args[k]), args[k].shape, args[k].dtype.char) for k, n in self._movable)

    def compute_modules(self, ctx, queue, out, args, mods, run):
        """One call of the region: its state warms up, captures, replays or runs eagerly; returns the
        submodule's results (one array, or a tuple)."""
        sub, state = mods[0], self.state
        params = {n: args[k] for k, n in self._movable}
        outs = state.execute(self.graph_key(ctx, queue, args), queue, lambda: run(sub, queue, params),
                             lambda: run(sub, queue, params, capture=True), lambda: run.outputs(sub))
        run.add_launches(state.last_launches)
        return outs[0] if self._single else tuple(outs)


def _where(ins) -> str:
    m = ins.module
    return f"graph_launch {m.name}:{m.label_of(ins)}" if m is not None else "graph_launch"
