"""hip_graph: wrap each maximal run of capturable instructions in a ``graph_launch`` instruction.

As MIGraphX's ``gpu::hipgraphify``: walk a module in order; a run grows over instructions whose
kernel may be recorded into a graph (views and device kernels) and is cut at anything that is not
(host-side ops, host syncs, control flow, ``graph_launch`` itself, ``@return``).  Parameters and
literals neither join nor cut a run.  A run with at least ``min_partition_size`` kernel launches
becomes a submodule ``<module>:graph_launch<N>`` whose parameters ``x0..`` are the run's inputs
(bound by sorted name) and whose return values are the run's values used after it; consumers outside
the run read them through ``get_tuple_elem``.  Running the pass twice equals running it once.
"""
from __future__ import annotations

from ..operators import make_op
from ..shape import Shape


def is_capturable(ins) -> bool:
    op = ins.op
    if op.name == "graph_launch" or not op.capturable or op.host_only or ins.meta.get("on_host"):
        return False
    if op.is_view:
        return True
    k = ins.meta.get("kernel")
    return k is not None and k.capturable


def launch_count(ins) -> int:
    k = ins.meta.get("kernel")
    return k.launches if k is not None else 0


class HipGraph:
    name = "hip_graph"

    def __init__(self, min_partition_size: int = 4):
        self.min_partition_size = int(min_partition_size)

    def __call__(self, program) -> None:
        counter = [sum(1 for n in program.modules if ":graph_launch" in n)]
        for m in list(program.module_order()):
            if ":graph_launch" in m.name:
                continue  # no nested capture
            for run in self.find_runs(m):
                self.wrap(program, m, run, counter)

    def find_runs(self, m) -> list[list]:
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

    def wrap(self, program, m, run, counter) -> None:
        members = {id(i) for i in run}
        inputs, seen = [], set()
        for ins in run:
            for v in ins.inputs:
                if id(v) not in members and id(v) not in seen:
                    seen.add(id(v))
                    inputs.append(v)
        outputs = [i for i in run if any(id(c) not in members for c in i.outputs)]
        if not outputs:
            return
        sub = program.create_module(f"{m.name}:graph_launch{counter[0]}")
        counter[0] += 1
        names = [f"x{k}" for k in range(len(inputs))]
        order = sorted(range(len(inputs)), key=lambda k: names[k])
        pmap = {}
        for k in order:
            v = inputs[k]
            p = sub.add_parameter(names[k], v.shape if isinstance(v.shape, Shape) else v.shape)
            pmap[id(v)] = p
        last_pos = m.instructions.index(run[-1])
        anchor = m.instructions[last_pos + 1] if last_pos + 1 < len(m.instructions) else None
        for ins in run:
            m.instructions.remove(ins)
            new_inputs = []
            for v in ins.inputs:
                if id(v) in pmap:
                    p = pmap[id(v)]
                    v.outputs = [c for c in v.outputs if c is not ins]
                    p.outputs.append(ins)
                    new_inputs.append(p)
                else:
                    new_inputs.append(v)
            ins.inputs = new_inputs
            ins.module = sub
            sub.instructions.append(ins)
        outside = {id(o): [c for c in o.outputs if id(c) not in members] for o in outputs}
        for o in outputs:
            o.outputs = [c for c in o.outputs if id(c) in members]
        sub.add_return(outputs)
        gl_inputs = [inputs[k] for k in order]
        op = make_op("graph_launch")
        if anchor is None:
            gl = m.add_instruction(op, gl_inputs, [sub])
        else:
            gl = m.insert_instruction(anchor, op, gl_inputs, [sub])
        for idx, o in enumerate(outputs):
            if len(outputs) == 1:
                val = gl
            else:
                val = m.insert_instruction(anchor, make_op("get_tuple_elem", index=idx), [gl]) if anchor is not None \
                    else m.add_instruction(make_op("get_tuple_elem", index=idx), [gl])
            for c in outside[id(o)]:
                c.inputs = [val if i is o else i for i in c.inputs]
                val.outputs.append(c)
