"""memory_coloring: give every intermediate a fixed offset in one scratch arena, before any run.

The program is flattened in execution order: the bodies of ``graph_launch``, ``if`` and ``loop`` are
laid out before the instruction that runs them.  A buffer lives from its definition to its last use;
views, tuple elements and submodule parameters extend the life of the buffer they alias; program
outputs live to the end.  A control-flow instruction's own buffers (its results, the loop's carried
state) live across its whole body, and values its body reads live until it finishes (a loop body runs
many times).  Scratch buffers of a kernel live for that kernel only.  Buffers are packed first-fit by
ascending start with 256-byte alignment, so two buffers whose lives overlap never share bytes.
Literals go to a separate constant area; host-fallback values live in host memory.  The result is
a :class:`MemoryPlan` (offsets keyed by ``(id(instruction), tuple index or None)``), stored in the
compile result (``ctx.result.memory_plan``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .analysis import (CONTROL, MemoryPlan, bound_params, linear_order, on_host,  # noqa: F401
                       param_bindings, sub_param_map, tuple_size, value_root)
from .pass_manager import Pass

ALIGN = 256
END = 1 << 60


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Buffer:
    key: tuple
    size: int
    start: int
    end: int
    offset: int = -1


def owned_buffers(ins) -> list:
    """(key, shape) of every device buffer the instruction owns (a tuple element bound into a
    parameter owns none)."""
    op = ins.op
    if op.builtin or op.is_view or op.name == "graph_launch" or on_host(ins):
        return []
    many = isinstance(ins.shape, tuple)
    if "bind_param" in ins.meta and not many:
        return []
    shapes = ins.shape if many else (ins.shape,)
    bound = {k for k, _ in bound_params(ins)}
    out: list[tuple[tuple[int, Any], Any]] = [((id(ins), k if many else None), s) for k, s in enumerate(shapes)
                                               if k not in bound]
    if op.name == "loop":
        body = ins.module_inputs[0]
        for k, name in enumerate(op.param_names[:2]):
            p = body.get_parameter(name)
            if p is not None:
                out.append(((id(ins), ("var", k)), p.shape))
    return out


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


def describe(ins, shape=None) -> str:
    """``instruction main:@3 relu float32[2,3]``: where an instruction is and what it holds."""
    m = ins.module
    where = f"{m.name}:{m.label_of(ins)}" if m is not None else "?"
    shape = ins.shape if shape is None else shape
    return f"instruction {where} {ins.op.name} {shape.brief() if hasattr(shape, 'brief') else 'tuple'}"


def _keep_largest(largest: list, nbytes: int, ins, shape, what: str = "", n: int = 3) -> list[tuple]:
    """The ``n`` largest ``(bytes, instruction, shape, what)`` seen so far, largest first."""
    if len(largest) >= n and nbytes <= largest[-1][0]:
        return largest
    largest = sorted(largest + [(nbytes, ins, shape, what)], key=lambda t: -t[0])
    return largest[:n]


class MemoryColoring(Pass):
    """Plan every buffer of the program (see the module docstring); the plan goes to
    ``ctx.result.memory_plan`` (and is returned by :meth:`plan`)."""

    name = "memory_coloring"
    required = True

    def apply(self, program, ctx=None) -> None:
        plan = self.plan(program)
        if ctx is not None:
            ctx.result.memory_plan = plan

    def plan(self, program) -> MemoryPlan:
        """The memory plan of ``program`` (lowered; the IR is not changed)."""
        main = program.get_main_module()
        order = linear_order(main)
        pos = {id(i): n for n, i in enumerate(order)}
        binds = param_bindings(program)
        # control-flow spans: [first body position, instruction position]
        span_start = {}
        for ins in order:
            if ins.op.name in ("if", "loop"):
                firsts = [pos[id(b.instructions[0])] for b in ins.module_inputs if b.instructions]
                span_start[id(ins)] = min(firsts + [pos[id(ins)]])
        enclosing: dict[int, int] = {}  # id(body instruction) -> end position of the outermost if/loop running it

        def mark(mod, end):
            for i in mod.instructions:
                enclosing[id(i)] = max(enclosing.get(id(i), -1), end)
                if i.op.name in CONTROL:
                    for s in i.module_inputs:
                        mark(s, end)

        for ins in order:
            if ins.op.name in ("if", "loop"):
                for b in ins.module_inputs:
                    mark(b, pos[id(ins)])
        live: dict = {}
        buffers = []
        largest: list = []
        for ins in order:
            for key, shape in owned_buffers(ins):
                start = span_start.get(id(ins), pos[id(ins)])
                b = Buffer(key, max(shape.bytes(), 1), start, pos[id(ins)])
                live[key] = b
                buffers.append(b)
                largest = _keep_largest(largest, b.size, ins, shape)
        for ins in order:
            p = pos[id(ins)]
            use = p
            if id(ins) in enclosing:  # read inside an if/loop body: alive until the construct finishes
                use = max(use, enclosing[id(ins)])
            for v in ins.inputs:
                r, k = value_root(v, binds)
                keys = [(id(r), k)] if (k is not None or tuple_size(r) == 0) else \
                    [(id(r), j) for j in range(tuple_size(r))]
                for key in keys:
                    b = live.get(key)
                    if b is not None:
                        b.end = max(b.end, END if (ins.op.name == "@return" and ins.module is main) else use)
        ws_bufs: dict = {}
        for ins in order:
            k = ins.meta.get("kernel")
            if k is None or on_host(ins):
                continue
            for j, s in enumerate(k.workspace):
                p = pos[id(ins)]
                b = Buffer((ins, j), max(s.bytes(), 1), p, max(p, enclosing.get(id(ins), p)))
                buffers.append(b)
                largest = _keep_largest(largest, b.size, ins, s, f" workspace {j}")
                ws_bufs.setdefault(id(ins), []).append(b)
        plan = MemoryPlan(buffers=buffers, largest=[(b, describe(i, s) + w) for b, i, s, w in largest])
        plan.arena_bytes = plan_buffers(buffers)
        for b in buffers:
            if isinstance(b.key[0], int):
                plan.offsets[b.key] = b.offset
        for k, bs in ws_bufs.items():
            plan.workspace[k] = [b.offset for b in bs]
        off, shared = 0, set()
        for m in program.module_order():
            for ins in m.instructions:
                if ins.op.name == "@literal" and ins.shape.dtype != "object":
                    if "shared_literal" in ins.meta:  # read from another program's memory (share_literals)
                        if ins.meta["shared_literal"] not in shared:
                            shared.add(ins.meta["shared_literal"])
                            plan.shared_literal_bytes += ins.shape.bytes()
                        continue
                    plan.literal_offsets[id(ins)] = off
                    off += _align(max(ins.shape.bytes(), 1))
        plan.literal_bytes = off
        return plan
