"""Fused instructions over a submodule: ``pointwise`` and ``fused_reduce`` (MIGraphX's ``pointwise``
and ``fused_reduce`` ops, made by the ``fuse_pointwise`` / ``fuse_reduce`` passes), and ``fused_gemv``
(a one-row ``dot`` with its RMSNorm prologue and elementwise epilogue, made by ``fuse_gemv``).

The instruction's ``module_inputs`` is one submodule whose parameters ``x0, x1, ...`` are bound to
the instruction's inputs by position and whose one return value is the result (a standard-layout
buffer of the returned shape).  The submodule holds the original instructions: elementwise ops,
views and ``concat`` of values computed inside, scalar literals, and for ``fused_reduce`` one
reduction over the innermost axis.

Execution: the ``ref`` target evaluates the submodule with the ops' own numpy kernels, instruction
by instruction (the same results as the unfused program, bit for bit); the ``gpu`` target compiles
one generated kernel per instruction (:mod:`.fused_gpu`).  Lowering takes the submodule off
``module_inputs`` (the op keeps it), so the executor sees an ordinary kernel instruction.
"""
from __future__ import annotations

from ..errors import ShapeError
from ..ir.shape import Shape
from .base import Operation, register_op
from .fused_module import VIEW_NAMES, module_params  # noqa: F401

NOT_ELEMENTWISE = ("concat", "reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "softmax", "logsoftmax",
                   "rms_norm", "layernorm")


def evaluate_module(sub, ctx, args, out) -> None:
    """Run the instructions of ``sub`` with the kernels of their ops on ``ctx`` (``ctx.xp`` arrays),
    parameters bound to ``args``; the returned values are written into ``out`` (one array, or a
    tuple of one per returned value).  Temporaries are allocated per call (host memory on ``ref``)."""
    xp = ctx.xp
    env = {id(p): a for p, a in zip(module_params(sub), args)}
    outs = out if isinstance(out, tuple) else (out,)
    dests = {id(r): o for r, o in zip(sub.get_return().inputs, outs)}
    for ins in sub.instructions:
        op = ins.op
        if op.name in ("@param", "@return"):
            continue
        if op.name == "@literal":
            env[id(ins)] = op.value if xp.__name__ == "numpy" else xp.asarray(op.value)
            continue
        vals = [env[id(i)] for i in ins.inputs]
        if op.is_view:
            env[id(ins)] = op.view(xp, vals[0], ins.shape)
            continue
        dst = dests.get(id(ins))
        if dst is None:
            dst = xp.empty(ins.shape.lens, ins.shape.np_dtype)
        ws = [xp.empty(s.lens, s.np_dtype) for s in op.workspace([i.shape for i in ins.inputs], ins.shape)]
        op.compute(ctx, dst, vals, ws)
        env[id(ins)] = dst


def _kernel_symbol(sub, limit: int = 8) -> str:
    names = [i.op.name for i in sub.instructions if not i.op.builtin and i.op.name not in VIEW_NAMES]
    return "_".join(names[:limit] + (["etc"] if len(names) > limit else []))


class FusedOp(Operation):
    """An instruction running a submodule as one kernel (see the module docstring).

    ``module``: the submodule (kept by the op once lowering takes it off ``module_inputs``).
    Shape: the submodule's return shape, standard layout (a tuple of them when it returns several
    values, read through ``get_tuple_elem``); ShapeError when the inputs do not match its parameters
    (count, lens, type)."""

    fused = True
    alloc_free = False  # the generic (array library) evaluation allocates temporaries

    def __init__(self, module=None, **attrs):
        super().__init__(**attrs, _module=module)

    @classmethod
    def from_attrs(cls, attrs: dict):
        """The op of saved attributes (``_module``, ``_lowered`` and the op's own), as a saved program
        stores them (:mod:`mgx_graph.ir.codec`)."""
        own = {k: v for k, v in attrs.items() if k not in ("_module", "_lowered")}
        op = cls(module=attrs.get("_module"), **own)
        if attrs.get("_lowered"):
            op.attrs["_lowered"] = True
        return op

    @property
    def module(self):
        return self.attrs.get("_module")

    def submodule(self, mods=()):
        sub = mods[0] if mods else self.module
        if sub is None:
            raise ShapeError(f"{self.name}: no submodule")
        return sub

    def compute_shape(self, inputs, mods=()):
        sub = self.submodule(mods)
        params = module_params(sub)
        if len(params) != len(inputs):
            raise ShapeError(f"{self.name}: module '{sub.name}' takes {len(params)} parameter(s), "
                             f"given {len(inputs)} input(s)")
        for p, s in zip(params, inputs):
            if not isinstance(s, Shape) or tuple(p.shape.lens) != tuple(s.lens) or p.shape.dtype != s.dtype:
                given = s.brief() if isinstance(s, Shape) else "a tuple"
                raise ShapeError(f"{self.name}: parameter {p.op.parameter} of '{sub.name}' is {p.shape.brief()}, "
                                 f"given {given}")
        outs = sub.get_output_shapes()
        if not outs or not all(isinstance(o, Shape) for o in outs):
            raise ShapeError(f"{self.name}: module '{sub.name}' must return values, returns {len(outs)} "
                             f"(tuples are not returned by fused modules)")
        outs = tuple(o.as_standard() for o in outs)
        return outs[0] if len(outs) == 1 else outs

    def compute(self, ctx, out, args, ws):
        evaluate_module(self.module, ctx, args, out)

    def launches(self, inputs, output):
        return 1

    @property
    def inplace_ok(self):
        """True when parameter ``x0`` has the result's lens and reaches it only through elementwise
        instructions of those lens (no view, concat or reduction on the way): every element of
        ``x0`` is then read only where that same element of the result is written, after any
        reduction of the row (so the output may be ``x0``'s buffer, a binding in place)."""
        sub = self.module
        if sub is None:
            return False
        params = module_params(sub)
        ret = sub.get_return()
        lens = tuple(ret.inputs[0].shape.lens)
        if not params or tuple(params[0].shape.lens) != lens or len(ret.inputs) != 1:
            return False
        stack, seen = [params[0]], set()
        while stack:
            v = stack.pop()
            for c in v.outputs:
                if c is ret or id(c) in seen:
                    continue
                seen.add(id(c))
                if c.op.is_view or c.op.name in NOT_ELEMENTWISE or tuple(c.shape.lens) != lens:
                    return False
                stack.append(c)
        return True

    def mark_lowered(self, sub) -> None:
        """Called by lowering when it takes ``sub`` off the instruction: printing then names it."""
        self.attrs["_module"] = sub
        self.attrs["_lowered"] = True

    def attr_string(self):
        base = super().attr_string()
        if not self.attrs.get("_lowered"):
            return base
        extra = f"module={self.module.name},kernel={_kernel_symbol(self.module)}"
        return "[" + (base[1:-1] + "," if base else "") + extra + "]"


@register_op
class FusedPointwise(FusedOp):
    """``pointwise``: elementwise instructions (with views / concat of internal values) as one kernel,
    one thread per output element on the gpu target."""

    name = "pointwise"


@register_op
class FusedReduce(FusedOp):
    """``fused_reduce[axes]``: one reduction over the innermost axis (``axes`` = [rank - 1]) with its
    elementwise producers and consumers as one kernel, one block per row on the gpu target."""

    name = "fused_reduce"

    def __init__(self, module=None, axes=()):
        super().__init__(module, axes=[int(a) for a in axes])


@register_op
class FusedGemv(FusedOp):
    """``fused_gemv``: a one-row ``dot`` against a constant weight (the gemv kernel's rules) with the
    ``rms_norm`` ``fused_reduce`` that computes its input (the prologue) and / or the ``pointwise``
    that reads its result through last-axis slices of equal length (the epilogue), made by the
    ``fuse_gemv`` pass.  The submodule returns the epilogue's (or the dot's) result, then the
    prologue's further outputs (the residual sum), read through ``get_tuple_elem``.

    On ``ref`` the submodule's instructions run as they are (the unfused program's values, bit for
    bit); on ``gpu`` one generated kernel (:mod:`.fused_gemv_codegen`): every block computes the
    normalized row into shared memory, then its columns of the GEMV, then the epilogue."""

    name = "fused_gemv"

    @property
    def inplace_ok(self):
        """Never: every block reads the whole input row while the first block writes the residual sum
        and the others write their columns."""
        return False
