"""memory_coloring: give every intermediate a fixed offset in one scratch arena, before any run.

The program is flattened in execution order (a ``graph_launch`` body runs where the instruction
stands).  Each buffer-owning instruction (a kernel that is not bound to a parameter) lives from its
definition to its last use, views and tuple elements extending the life of the buffer they alias;
program outputs live to the end.  Scratch buffers of a kernel live for that kernel only.  Buffers are
packed first-fit by ascending start, with 256-byte alignment; two buffers whose lives overlap never
share bytes.  Literals go into a separate constant area.  The result is ``program.memory_plan``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

ALIGN = 256
END = 1 << 60


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Buffer:
    key: object  # instruction (output) or (instruction, k) (scratch k)
    size: int
    start: int
    end: int
    offset: int = -1


@dataclass
class MemoryPlan:
    buffers: list = field(default_factory=list)
    offsets: dict = field(default_factory=dict)  # id(ins) -> offset
    workspace: dict = field(default_factory=dict)  # id(ins) -> [offsets]
    arena_bytes: int = 0
    literal_offsets: dict = field(default_factory=dict)  # id(ins) -> offset
    literal_bytes: int = 0

    @property
    def peak_bytes(self) -> int:
        return self.arena_bytes


def linear_order(module):
    """Instructions in execution order, graph_launch bodies inlined before the graph_launch."""
    out = []
    for ins in module.instructions:
        if ins.op.name == "graph_launch":
            out.extend(linear_order(ins.module_inputs[0]))
        out.append(ins)
    return out


def value_root(ins, parent_of_param=None):
    """The instruction owning the memory of ``ins`` (itself, or what it aliases)."""
    seen = 0
    while True:
        seen += 1
        if seen > 100000:
            raise RuntimeError("alias cycle")
        op = ins.op
        if op.name == "@param" and parent_of_param and id(ins) in parent_of_param:
            ins = parent_of_param[id(ins)]
        elif op.name == "get_tuple_elem":
            gl = ins.inputs[0]
            ins = gl.module_inputs[0].get_return().inputs[op.index]
        elif op.name == "graph_launch":
            ins = ins.module_inputs[0].get_return().inputs[0]
        elif op.is_view:
            ins = ins.inputs[0]
        else:
            return ins


def sub_param_map(program) -> dict:
    """id(submodule @param) -> the parent instruction bound to it (graph_launch inputs by sorted name)."""
    res = {}
    for m in program.module_order():
        for ins in m.instructions:
            if ins.op.name == "graph_launch":
                sub = ins.module_inputs[0]
                names = sorted(sub.get_parameter_names())
                for name, v in zip(names, ins.inputs):
                    res[id(sub.get_parameter(name))] = v
    return res


def needs_buffer(ins) -> bool:
    op = ins.op
    if op.builtin or op.is_view or op.name == "graph_launch":
        return False
    return "bind_param" not in ins.meta


def plan_buffers(buffers: list[Buffer]) -> int:
    """First-fit packing by ascending start; returns the arena size."""
    active: list[Buffer] = []
    total = 0
    for b in sorted(buffers, key=lambda b: (b.start, -b.size)):
        active = [a for a in active if a.end >= b.start]
        occupied = sorted((a.offset, a.offset + _align(a.size)) for a in active)
        off = 0
        for lo, hi in occupied:
            if off + _align(b.size) <= lo:
                break
            off = max(off, hi)
        b.offset = off
        active.append(b)
        total = max(total, off + _align(b.size))
    return total


class MemoryColoring:
    name = "memory_coloring"

    def __call__(self, program) -> None:
        main = program.get_main_module()
        order = linear_order(main)
        pos = {id(i): n for n, i in enumerate(order)}
        pmap = sub_param_map(program)
        live: dict[int, Buffer] = {}
        buffers = []
        for ins in order:
            if needs_buffer(ins):
                b = Buffer(ins, max(ins.shape.bytes(), 1), pos[id(ins)], pos[id(ins)])
                live[id(ins)] = b
                buffers.append(b)
        for ins in order:
            p = pos[id(ins)]
            for v in ins.inputs:
                r = value_root(v, pmap)
                b = live.get(id(r))
                if b is not None:
                    b.end = max(b.end, p if ins.op.name != "@return" or ins.module is not main else END)
        ret = main.get_return()
        if ret is not None:
            for v in ret.inputs:
                b = live.get(id(value_root(v, pmap)))
                if b is not None:
                    b.end = END
        ws_bufs = {}
        for ins in order:
            k = ins.meta.get("kernel")
            if k is None:
                continue
            for j, s in enumerate(k.workspace):
                b = Buffer((ins, j), max(s.bytes(), 1), pos[id(ins)], pos[id(ins)])
                buffers.append(b)
                ws_bufs.setdefault(id(ins), []).append(b)
        plan = MemoryPlan(buffers=buffers)
        plan.arena_bytes = plan_buffers(buffers)
        for b in buffers:
            if isinstance(b.key, tuple):
                continue
            plan.offsets[id(b.key)] = b.offset
        for k, bs in ws_bufs.items():
            plan.workspace[k] = [b.offset for b in bs]
        off = 0
        for m in program.module_order():
            for ins in m.instructions:
                if ins.op.name == "@literal":
                    plan.literal_offsets[id(ins)] = off
                    off += _align(max(ins.shape.bytes(), 1))
        plan.literal_bytes = off
        program.memory_plan = plan
