"""The memory of a finalized program and the value slot of every instruction.

Before the first run, through the target context (and so the runtime layer): the scratch arena and
the literal area of the memory plan, and the parameter area holding one buffer per parameter of
``main`` (each 256-byte aligned; what ``run`` uploads host inputs into) are allocated; literals are
uploaded.  Every instruction of every module gets a slot in ``env``, the list of values the eval loop
reads and writes; a slot whose value never changes is filled here:

* literals: their uploaded array (host values, e.g. strings, stay numpy arrays); a literal marked by
  ``share_literals`` is the array another program (the owner of ``shared``) uploaded;
* instructions with a buffer of their own: an array over the arena at the planned offset (a tuple of
  arrays for a tuple result; ``if`` / ``loop`` results included);
* host-fallback instructions: a host buffer of their shape;
* a loop body's iteration number and condition: loop-owned arena buffers; its carried values: the
  loop's own result buffers;
* views of fixed values (in ``main`` and the submodules it runs).

Movable values (:func:`mgx_graph.passes.analysis.movable_values`) are left empty: the eval loop or
the op running them binds them per call.
"""
from __future__ import annotations

import weakref
from operator import itemgetter

import numpy as np

from ..errors import MgxError
from ..passes.analysis import linear_order, on_host

ALIGN = 256


def _aligned(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


def slot_getter(keys):
    """A function returning ``(container[k] for k in keys)`` as a tuple, in one C call (any count): how
    a step, a module's return and the replay path read a fixed list of ``env`` slots."""
    keys = list(keys)
    if not keys:
        return lambda container: ()
    if len(keys) == 1:
        k = keys[0]
        return lambda container: (container[k],)
    return itemgetter(*keys)


def host_value(shape):
    """A host buffer (numpy) of ``shape`` (a tuple of them for a tuple of shapes)."""
    if isinstance(shape, tuple):
        return tuple(np.empty(s.lens, s.np_dtype) for s in shape)
    return np.empty(shape.lens, shape.np_dtype)


class ProgramBuffers:
    """Allocations and initial slot values of one program (see the module docstring).

    ``program``: the lowered IR; ``plan``: its :class:`~mgx_graph.passes.analysis.MemoryPlan`;
    ``ctx``: the target context; ``movable``: ids of the values bound per call; ``shared``: the
    :class:`~mgx_graph.passes.share_literals.LiteralTable` of the program whose literals this one reads,
    or None, and ``user`` the executor of this program, which the owner closes first when it is closed.
    Raises DeviceError when an allocation fails (the context frees what it allocated when it is
    closed), MgxError when a shared literal's owner holds no array for it (released).
    """

    def __init__(self, program, plan, ctx, movable: set, shared=None, user=None):
        self.ctx, self.plan, self.movable, self.shared = ctx, plan, movable, shared
        # what reads this program's literals (share_literals): closed before they are freed
        self.borrowers: weakref.WeakSet = weakref.WeakSet()
        if shared is not None and user is not None:
            shared.owner.buffers.borrowers.add(user)
        self.modules = program.module_order()
        self.slot: dict[int, int] = {}
        for m in self.modules:
            for ins in m.instructions:
                self.slot[id(ins)] = len(self.slot)
        self.env: list = [None] * len(self.slot)
        self.arena = ctx.allocate(plan.arena_bytes) if plan.arena_bytes else None
        self.literals = ctx.allocate(plan.literal_bytes) if plan.literal_bytes else None
        self.params = [i for i in program.get_main_module().instructions if i.op.name == "@param"]
        self._parameter_area()
        self._fixed_values()
        self._loop_buffers()
        for ins in linear_order(program.get_main_module()):
            if ins.op.is_view and id(ins) not in movable:
                self.env[self.slot[id(ins)]] = ins.op.view(ctx.xp, self.env[self.slot[id(ins.inputs[0])]], ins.shape)

    def close_borrowers(self) -> None:
        """Close (``close()``) the executors that read this program's literals."""
        for b in list(self.borrowers):
            b.close()

    def value(self, ins):
        """The current value of instruction ``ins`` (an array, a tuple of arrays, or None)."""
        return self.env[self.slot[id(ins)]]

    def _parameter_area(self) -> None:
        ctx = self.ctx
        self.param_area = ctx.allocate(max(sum(_aligned(p.shape.bytes()) for p in self.params), 1))
        self.param_buffers: dict = {}
        off = 0
        for p in self.params:
            if p.shape.dtype == "object":  # strings live on the host
                self.param_buffers[p.op.parameter] = np.empty(p.shape.lens, dtype=object)
                continue
            self.param_buffers[p.op.parameter] = ctx.array(self.param_area, off, p.shape.as_standard())
            off += _aligned(p.shape.bytes())

    def _fixed_values(self) -> None:
        ctx, plan, env = self.ctx, self.plan, self.env
        for m in self.modules:
            for ins in m.instructions:
                op, s = ins.op, self.slot[id(ins)]
                if op.name == "@literal":
                    env[s] = self._literal(ins)
                elif op.name == "@param" or op.is_view or id(ins) in self.movable:
                    continue  # bound per call, loop-owned (below) or a view (after the loop buffers)
                elif on_host(ins):
                    env[s] = host_value(ins.shape)
                else:
                    env[s] = self._owned(ins)

    def _literal(self, ins):
        k = ins.meta.get("shared_literal")
        if k is not None:
            value = self.shared.value(k) if self.shared is not None else None
            if value is None:
                raise MgxError(f"literal {ins.shape.brief()} is read from a program that holds it no more "
                               f"(released)")
            return value
        offsets = self.plan.literal_offsets
        return ins.op.value if id(ins) not in offsets else self.ctx.upload(ins.op.value, self.literals, offsets[id(ins)])

    def _owned(self, ins):
        ctx, plan = self.ctx, self.plan
        if isinstance(ins.shape, tuple):
            return tuple(ctx.array(self.arena, plan.offsets[(id(ins), k)], s) for k, s in enumerate(ins.shape))
        return ctx.array(self.arena, plan.offsets[(id(ins), None)], ins.shape)

    def _loop_buffers(self) -> None:
        """A loop body reads its iteration number and condition from loop-owned arena buffers and its
        carried values from the loop's own result buffers."""
        for m in self.modules:
            for ins in m.instructions:
                if ins.op.name != "loop":
                    continue
                body = ins.module_inputs[0]
                own = self.value(ins)
                own = own if isinstance(own, tuple) else (own,)
                for k, name in enumerate(ins.op.param_names):
                    p = body.get_parameter(name)
                    if p is None:
                        continue
                    self.env[self.slot[id(p)]] = own[k - 2] if k >= 2 else \
                        self.ctx.array(self.arena, self.plan.offsets[(id(ins), ("var", k))], p.shape)
