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


class Lowering:
    name = "lowering"

    def __init__(self, target: str):
        self.target = target

    def __call__(self, program) -> None:
        for m in program.module_order():
            for ins in m.instructions:
                op = ins.op
                if op.builtin or op.is_view or op.name == "graph_launch":
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
