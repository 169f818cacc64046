"""Matrix products and normalizations.

``dot`` follows numpy/ONNX MatMul semantics for inputs of rank >= 2 with broadcast batch dims (the
parser unsqueezes 1-D operands).  On the gpu target it runs as one vendor-BLAS strided-batched GEMM
(cuBLAS through nvmath-python, hipBLAS through hip-python), which is legal inside stream capture.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..shape import Shape, broadcast_lens
from .base import Operation, check_inputs, normalize_axis, register_op


@register_op
class Dot(Operation):
    name = "dot"
    alloc_free = True

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 2)
        a, b = inputs
        if a.ndim < 2 or b.ndim < 2:
            raise ShapeError(f"dot: inputs must have rank >= 2, got {list(a.lens)} and {list(b.lens)}")
        if a.dtype != b.dtype:
            raise ShapeError(f"dot: input types differ ({a.dtype} vs {b.dtype})")
        if a.lens[-1] != b.lens[-2]:
            raise ShapeError(f"dot: inner dims differ: {list(a.lens)} x {list(b.lens)}")
        batch = broadcast_lens(a.lens[:-2], b.lens[:-2], where="dot")
        return Shape(a.dtype, batch + (a.lens[-2], b.lens[-1]))

    def compute(self, ctx, out, args, ws):
        ctx.xp.matmul(args[0], args[1], out=out)


@register_op
class LayerNorm(Operation):
    """LayerNormalization (opset 17): normalize over dims ``axis..rank-1``, then ``* scale + bias``.

    Inputs: x, scale, optional bias (broadcast to the normalized dims).  The mean and inverse
    std-dev outputs of the ONNX op are not produced (the parser rejects models that use them).
    """

    name = "layernorm"
    alloc_free = True

    def __init__(self, axis=-1, epsilon=1e-5):
        super().__init__(axis=int(axis), epsilon=float(epsilon))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, (2, 3))
        x = inputs[0]
        normalize_axis(self.axis, x.ndim, self.name)
        return Shape(x.dtype, x.lens)

    def _axes(self, ndim):
        return tuple(range(self.axis % ndim, ndim))

    def workspace(self, inputs, output):
        x = inputs[0]
        axes = self._axes(x.ndim)
        return [Shape(x.dtype, [1 if i in axes else d for i, d in enumerate(x.lens)]), Shape(x.dtype, x.lens)]

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        m, sq = ws
        axes = self._axes(x.ndim)
        ctx.reduce("mean", x, axes, m)
        xp.subtract(x, m, out=out)
        xp.multiply(out, out, out=sq)
        ctx.reduce("mean", sq, axes, m)
        xp.add(m, m.dtype.type(self.epsilon), out=m)
        xp.sqrt(m, out=m)
        xp.true_divide(out, m, out=out)
        xp.multiply(out, args[1], out=out)
        if len(args) > 2:
            xp.add(out, args[2], out=out)

    def launches(self, inputs, output):
        return 8 + (len(inputs) > 2)


@register_op
class RMSNorm(Operation):
    """y = x / sqrt(mean(x^2 over the last ``axis..`` dims) + epsilon) * scale.

    Produced by the ``fuse_norms`` pass from the Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul chain that
    LLaMA-family exports contain (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization").
    The reduction is accumulated in float32 even for half inputs.
    """

    name = "rms_norm"
    alloc_free = True

    def __init__(self, axis=-1, epsilon=1e-6):
        super().__init__(axis=int(axis), epsilon=float(epsilon))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, (1, 2))
        x = inputs[0]
        normalize_axis(self.axis, x.ndim, self.name)
        return Shape(x.dtype, x.lens)

    def workspace(self, inputs, output):
        x = inputs[0]
        axes = tuple(range(self.axis % x.ndim, x.ndim))
        return [Shape("float32" if x.dtype == "float16" else x.dtype,
                      [1 if i in axes else d for i, d in enumerate(x.lens)]),
                Shape("float32" if x.dtype == "float16" else x.dtype, x.lens)]

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        m, sq = ws
        axes = tuple(range(self.axis % x.ndim, x.ndim))
        xp.multiply(x, x, out=sq, dtype=sq.dtype)
        ctx.reduce("mean", sq, axes, m)
        xp.add(m, m.dtype.type(self.epsilon), out=m)
        xp.sqrt(m, out=m)
        xp.true_divide(x, m, out=sq, dtype=sq.dtype)
        if len(args) > 1:
            xp.multiply(sq, args[1], out=out, casting="same_kind", dtype=sq.dtype)
        else:
            xp.copyto(out, sq, casting="same_kind")

    def launches(self, inputs, output):
        return 6
