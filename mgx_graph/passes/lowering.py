"""lowering: choose the kernel each instruction runs on the target.

Sets ``ins.meta["kernel"]`` (a :class:`Kernel`) on every non-builtin, non-view instruction:
the function, the number of device launches it issues, its scratch buffers, and whether it may be
recorded into a graph.  On ``ref`` every kernel is one host function on the queue; on ``gpu`` see
:func:`mgx_graph.operators.gpu.select_gpu_kernel`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..errors import CompileError


@dataclass
class Kernel:
    fn: Callable
    launches: int
    workspace: list = field(default_factory=list)
    capturable: bool = True
    label: str = ""


def insert_host_fallback(m, ins) -> None:
    """Run ``ins`` on the host: copy_from_gpu each input, mark it on_host, copy_to_gpu each result."""
    from ..operators import make_op

    new_inputs = []
    for v in ins.inputs:
        c = m.insert_instruction(ins, make_op("copy_from_gpu"), [v])
        c.meta["on_host"] = True
        new_inputs.append(c)
    for old, new in zip(ins.inputs, new_inputs):
        old.outputs = [o for o in old.outputs if o is not ins]
        new.outputs.append(ins)
    ins.inputs = new_inputs
    ins.meta["on_host"] = True
    nxt = m.instructions[m.instructions.index(ins) + 1]
    if isinstance(ins.shape, tuple):
        for g in [c for c in ins.outputs if c.op.name == "get_tuple_elem"]:
            g.meta["on_host"] = True
            consumers = list(g.outputs)
            anchor = m.instructions[m.instructions.index(g) + 1]
            up = m.insert_instruction(anchor, make_op("copy_to_gpu"), [g])
            for c in consumers:
                c.inputs = [up if i is g else i for i in c.inputs]
                up.outputs.append(c)
            g.outputs = [up]
    else:
        consumers = list(ins.outputs)
        up = m.insert_instruction(nxt, make_op("copy_to_gpu"), [ins])
        for c in consumers:
            c.inputs = [up if i is ins else i for i in c.inputs]
            up.outputs.append(c)
        ins.outputs = [up]


def _has_strings(ins) -> bool:
    shapes = list(ins.shape) if isinstance(ins.shape, tuple) else [ins.shape]
    shapes += [i.shape for i in ins.inputs if not isinstance(i.shape, tuple)]
    return any(getattr(s, "dtype", "") == "object" for s in shapes)


class Lowering:
    name = "lowering"

    def __init__(self, target: str, host_ops=()):
        self.target = target
        self.host_ops = set(host_ops or ())

    def __call__(self, program) -> None:
        fallback = []
        for m in program.module_order():
            for ins in list(m.instructions):
                op = ins.op
                if op.builtin or op.is_view or ins.module_inputs or op.name in ("copy_from_gpu", "copy_to_gpu"):
                    continue
                if (self.target == "gpu" and not op.gpu_supported) or op.name in self.host_ops:
                    insert_host_fallback(m, ins)
                    fallback.append(op.name)
        if fallback and self.target == "gpu":
            import warnings

            names = sorted(set(fallback))
            warnings.warn(f"gpu target: {len(fallback)} instruction(s) run on the host (no gpu kernel): "
                          f"{', '.join(names)}", stacklevel=3)
        program.host_fallback_ops = sorted(set(fallback))
        strings = [i for m in program.module_order() for i in m.instructions if not i.op.builtin and _has_strings(i)]
        if strings and self.target != "ref":
            raise CompileError(f"string tensors run on the ref target only ({strings[0].op} uses one)")
        for ins in strings:
            ins.meta["on_host"] = True
        for m in program.module_order():
            for ins in m.instructions:
                op = ins.op
                if op.builtin or op.is_view or op.name in ("graph_launch", "if", "loop", "copy_from_gpu",
                                                           "copy_to_gpu"):
                    continue
                if ins.meta.get("on_host"):
                    ins.meta["kernel"] = Kernel(op.compute, 0, op.workspace([i.shape for i in ins.inputs], ins.shape),
                                                False, "host fallback")
                    continue
                in_shapes = [i.shape for i in ins.inputs]
                try:
                    ins.meta["kernel"] = self.select(op, in_shapes, ins.shape, ins)
                except Exception as e:  # pragma: no cover - defensive: name the instruction
                    raise CompileError(f"lowering {op} to '{self.target}' failed: {type(e).__name__}: {e}") from e

    def select(self, op, in_shapes, out_shape, ins) -> Kernel:
        capt = op.capturable and not op.host_only
        if self.target == "ref":
            return Kernel(op.compute, 1, op.workspace(in_shapes, out_shape), capt, "host")
        from ..operators.gpu import select_gpu_kernel

        k = select_gpu_kernel(op, in_shapes, out_shape)
        launches = k.launches
        if op.name == "scatternd" and "bind_param" in ins.meta and k.label == "scatternd.cu":
            launches -= 1  # in place: no copy of data into out
        return Kernel(k.fn, launches, k.workspace, k.capturable and capt, k.label)
