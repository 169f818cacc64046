"""lowering: choose the kernel each instruction runs on the target.

Sets ``ins.meta["kernel"]`` (a :class:`Kernel`) on every non-builtin, non-view instruction:
the function, the number of device launches it issues, its scratch buffers, and whether it may be
recorded into a graph.  On ``ref`` every kernel is one host function on the queue; on ``gpu`` the
kernel the gpu target's kernel table gives (:func:`mgx_graph.operators.gpu_lowering.select_gpu_kernel`:
one entry per op name, the fused ops included), which also says which ops have no device kernel.

A fused instruction (``pointwise``, ``fused_reduce``) first gives up its submodule: the op keeps it
(its kernel runs it) and the module leaves the program, so what follows (graph regions, memory
planning, the executor) sees one ordinary kernel instruction.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..errors import CompileError
from ..operators.gpu_lowering import runs_on_gpu, select_gpu_kernel
from .analysis import bound_params
from .pass_manager import Pass


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
    m.set_inputs(ins, new_inputs)
    ins.meta["on_host"] = True
    nxt = m.instructions[m.instructions.index(ins) + 1]
    if isinstance(ins.shape, tuple):
        for g in [c for c in ins.outputs if c.op.name == "get_tuple_elem"]:
            g.meta["on_host"] = True
            anchor = m.instructions[m.instructions.index(g) + 1]
            m.replace_instruction(g, m.insert_instruction(anchor, make_op("copy_to_gpu"), [g]))
    else:
        m.replace_instruction(ins, m.insert_instruction(nxt, make_op("copy_to_gpu"), [ins]))


def host_instructions(program) -> list[str]:
    """Every instruction of ``program`` (all modules) that runs on the host in place of a device kernel,
    as ``"module:@index op"`` (``onnx_op`` with its ONNX op type): those lowering placed on the host
    (host fallback, ``host_ops``, string tensors) and those whose op has no device kernel at all
    (the kernel table's ``HOST_ONLY``: ``onnx_op`` evaluated by onnx.reference, ``unique``), on either
    target, so a ``ref`` program reports what its ``gpu`` build would run on the host.  Views, builtins,
    the ``copy_from_gpu`` / ``copy_to_gpu`` around a fallback and control flow (``if`` / ``loop``,
    whose bodies are counted instruction by instruction) are not counted."""
    res = []
    for m in program.module_order():
        for ins in m.instructions:
            op = ins.op
            if op.builtin or op.is_view or ins.module_inputs or op.name in ("copy_from_gpu", "copy_to_gpu"):
                continue
            if ins.meta.get("on_host") or not runs_on_gpu(op, [i.shape for i in ins.inputs]):
                kind = f"{op.name}({op.attrs['op_type']})" if "op_type" in op.attrs else op.name
                res.append(f"{m.name}:{m.label_of(ins)} {kind}")
    return res


def _has_strings(ins) -> bool:
    shapes = list(ins.shape) if isinstance(ins.shape, tuple) else [ins.shape]
    shapes += [i.shape for i in ins.inputs if not isinstance(i.shape, tuple)]
    return any(getattr(s, "dtype", "") == "object" for s in shapes)


def detach_fused_modules(program) -> None:
    """Take the submodule off every fused instruction (its op keeps it) and out of the program."""
    for m in program.module_order():
        for ins in m.instructions:
            if getattr(ins.op, "fused", False) and ins.module_inputs:
                sub = ins.module_inputs[0]
                ins.op.mark_lowered(sub)
                ins.module_inputs = []
                program.remove_module(sub.name)


class Lowering(Pass):
    """Lower to ``target`` (``ref`` or ``gpu``; None: the pass context's target), running the ops
    named in ``host_ops`` on the host.  Records in the compile result the sorted names of the ops put
    on the host (``ctx.result.host_fallback_ops``) and every host instruction
    (``ctx.result.host_instructions``, see :func:`host_instructions`); warns once on gpu listing every
    instruction with no gpu kernel; raises CompileError for a string tensor off
    ``ref`` or a kernel that cannot be chosen (naming the instruction's op)."""

    name = "lowering"
    required = True

    def __init__(self, target: str | None = None, host_ops=()):
        self.target = target
        self.host_ops = set(host_ops or ())

    def apply(self, program, ctx=None) -> None:
        target = self.target or (ctx.target if ctx is not None else "ref")
        detach_fused_modules(program)
        fallback = self._place_on_host(program, target)
        if ctx is not None:
            ctx.result.host_fallback_ops = fallback
            ctx.result.host_instructions = host_instructions(program)
        self.select_kernels(program, target)

    def select_kernels(self, program, target: str | None = None) -> None:
        """Set ``meta["kernel"]`` on every instruction that runs one, from its op, shapes and host
        placement (``meta["on_host"]``) alone: what a saved program, already lowered, re-selects on load
        (CompileError naming the op when no kernel can be chosen)."""
        target = target or self.target or "ref"
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
                    ins.meta["kernel"] = self.select(op, in_shapes, ins.shape, ins, target)
                except Exception as e:  # pragma: no cover - defensive: name the instruction
                    raise CompileError(f"lowering {op} to '{target}' failed: {type(e).__name__}: {e}") from e

    def _place_on_host(self, program, target: str) -> list[str]:
        """Host fallback for ops without a kernel on ``target`` and for ``host_ops``; string tensors
        run on the host (ref only).  Returns the sorted names of the ops put on the host."""
        fallback = []
        for m in program.module_order():
            for ins in list(m.instructions):
                op = ins.op
                if op.builtin or op.is_view or ins.module_inputs or op.name in ("copy_from_gpu", "copy_to_gpu"):
                    continue
                on_gpu = runs_on_gpu(op, [i.shape for i in ins.inputs])
                if (target == "gpu" and not on_gpu) or op.name in self.host_ops:
                    insert_host_fallback(m, ins)
                    fallback.append(op.name)
        if fallback and target == "gpu":
            import warnings

            names = sorted(set(fallback))
            warnings.warn(f"gpu target: {len(fallback)} instruction(s) run on the host (no gpu kernel): "
                          f"{', '.join(names)}: {'; '.join(host_instructions(program))}", stacklevel=4)
        strings = [i for m in program.module_order() for i in m.instructions if not i.op.builtin and _has_strings(i)]
        if strings and target != "ref":
            raise CompileError(f"string tensors run on the ref target only ({strings[0].op} uses one)")
        for ins in strings:
            ins.meta["on_host"] = True
        return sorted(set(fallback))

    def select(self, op, in_shapes, out_shape, ins, target: str | None = None) -> Kernel:
        """The kernel of ``op`` on ``target`` (default: the pass's target)."""
        target = target or self.target or "ref"
        capt = op.capturable and not op.host_only
        if target == "ref":
            return Kernel(op.compute, 1, op.workspace(in_shapes, out_shape), capt, "host")
        k = select_gpu_kernel(op, in_shapes, out_shape, ins)
        launches = k.launches - (len(bound_params(ins)) if k.bound_copies else 0)
        return Kernel(k.fn, launches, k.workspace, k.capturable and capt, k.label)
