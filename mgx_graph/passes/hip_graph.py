"""hip_graph: wrap each maximal run of capturable instructions in a ``graph_launch`` instruction.

As MIGraphX's ``gpu::hipgraphify``: walk a module in order; a run grows over instructions whose
kernel may be recorded into a graph (views and device kernels) and is cut at anything that is not
(host-side ops, host syncs, control flow, ``graph_launch`` itself, ``@return``).  Parameters and
literals neither join nor cut a run.  A run with at least ``min_partition_size`` kernel launches
becomes a submodule ``<module>:graph_launch<N>`` whose parameters ``x0..`` are the run's inputs
(bound by sorted name) and whose return values are the run's values used after it; consumers outside
the run read them through ``get_tuple_elem``.  Running the pass twice equals running it once.

The pass then records on every ``graph_launch`` instruction which of its inputs are *movable*
(``meta["movable_inputs"]``: values the eval loop binds per call, whose device pointer may change
from one call to the next, :func:`movable_values`) and which are *fixed* (``meta["fixed_inputs"]``:
scratch-arena buffers, literals and loop-owned buffers, at one address for the program's life).  The
op binds the fixed ones once when the program is finalized and keys its graphs on the movable ones.
"""
from __future__ import annotations

from ..operators import make_op
from .analysis import launch_count, movable_values  # noqa: F401
from .pass_manager import Pass


def is_capturable(ins) -> bool:
    op = ins.op
    if op.name == "graph_launch" or not op.capturable or op.host_only or ins.meta.get("on_host"):
        return False
    if op.is_view:
        return True
    k = ins.meta.get("kernel")
    return k is not None and k.capturable


def record_input_placement(program) -> None:
    """Set ``meta["movable_inputs"]`` / ``meta["fixed_inputs"]`` (submodule parameter names, sorted)
    on every ``graph_launch`` instruction of ``program``."""
    moving = movable_values(program)
    for m in program.module_order():
        for ins in m.instructions:
            if ins.op.name != "graph_launch":
                continue
            names = sorted(ins.module_inputs[0].get_parameter_names())
            ins.meta["movable_inputs"] = [n for n, v in zip(names, ins.inputs) if id(v) in moving]
            ins.meta["fixed_inputs"] = [n for n, v in zip(names, ins.inputs) if id(v) not in moving]


class HipGraph(Pass):
    """Wrap runs of at least ``min_partition_size`` kernel launches and record each region's movable and
    fixed inputs (see the module docstring)."""

    name = "hip_graph"

    def __init__(self, min_partition_size: int = 4):
        self.min_partition_size = int(min_partition_size)

    def apply(self, program, ctx=None) -> None:
        counter = [sum(1 for n in program.modules if ":graph_launch" in n)]
        for m in list(program.module_order()):
            if ":graph_launch" in m.name:
                continue  # no nested capture
            for run in self.find_runs(m):
                self.wrap(m, run, counter)
        record_input_placement(program)

    def find_runs(self, m) -> list[list]:
        """Maximal runs of capturable instructions of ``m`` with enough launches, in order."""
        runs, cur = [], []
        for ins in m.instructions:
            if ins.op.name in ("@param", "@literal"):
                continue
            if is_capturable(ins):
                cur.append(ins)
                continue
            if cur:
                runs.append(cur)
            cur = []
        if cur:
            runs.append(cur)
        return [r for r in runs if sum(launch_count(i) for i in r) >= self.min_partition_size]

    def wrap(self, m, run, counter) -> None:
        """Outline ``run`` into ``<module>:graph_launch<N>`` run by one ``graph_launch`` (a run nothing
        reads after it is left as it is)."""
        _, outputs = m.run_io(run)
        if not outputs:
            return
        name = f"{m.name}:graph_launch{counter[0]}"
        counter[0] += 1
        m.move_to_submodule(run, name, make_op("graph_launch"))
