"""Normalizations by moments, norms and local windows (ONNX InstanceNormalization,
GroupNormalization, MeanVarianceNormalization, LpNormalization, LRN).

Every kernel is a short sequence of ``xp`` calls that write into ``out`` or into declared workspaces
(``ctx.reduce`` for the reductions), so the ops allocate nothing and are captured on the gpu target.
Half-precision inputs are computed in float32 (the ``acc`` type) and rounded once at the end.

ONNX spec: https://onnx.ai/onnx/operators/ (the operators named above).
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape, broadcast_lens
from .base import Operation, check_inputs, normalize_axis, register_op

FLOATS = ("float16", "float32", "float64")


def _acc(dtype: str, acc: str | None = None) -> str:
    """The compute type: ``acc`` when given, else float32 for float16 and the input type otherwise."""
    if acc:
        return np.dtype(acc).name
    return "float32" if dtype == "float16" else dtype


def _check_float(op: Operation, x: Shape) -> None:
    if x.dtype not in FLOATS:
        raise ShapeError(f"{op.name}: needs a floating-point input, got {x.dtype} {list(x.lens)}")


@register_op
class MeanVarNorm(Operation):
    """``(x - mean) / sqrt(var + epsilon) * scale + bias`` with mean and variance over ``axes``.

    Inputs: x (float16/32/64, any rank), optional scale and bias (broadcastable to x; the parser
    reshapes ONNX's per-channel vectors to ``[C, 1, ...]``).  Attributes:

    * ``axes``: the reduced axes (non-negative after :func:`normalize_axis`);
    * ``epsilon``: added to the variance, or to the standard deviation when ``eps_on_std`` (ONNX
      MeanVarianceNormalization: ``(x - E[x]) / (sqrt(E[x^2] - E[x]^2) + epsilon)``);
    * ``moments``: ``"centered"`` (var = E[(x - E[x])^2]) or ``"raw"`` (var = E[x^2] - E[x]^2, the
      formula of the MeanVarianceNormalization function body, which onnxruntime follows);
    * ``acc``: the compute type (default float32 for float16 inputs, else the input type).

    Output: x's shape and type.  Raises ShapeError for integer inputs or bad axes.
    """

    name = "mean_var_norm"
    alloc_free = True

    def __init__(self, axes=(), epsilon=1e-5, eps_on_std=0, moments="centered", acc=None):
        super().__init__(axes=[int(a) for a in axes], epsilon=float(epsilon), eps_on_std=int(eps_on_std),
                         moments=str(moments), acc=None if acc is None else np.dtype(acc).name)

    def _axes(self, ndim):
        return tuple(sorted({normalize_axis(a, ndim, self.name) for a in self.axes}))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, (1, 3))
        x = inputs[0]
        _check_float(self, x)
        self._axes(x.ndim)
        for s in inputs[1:]:
            if tuple(broadcast_lens(x.lens, s.lens, where=self.name)) != tuple(x.lens):
                raise ShapeError(f"{self.name}: scale/bias {list(s.lens)} does not broadcast to x {list(x.lens)}")
        return Shape(x.dtype, x.lens)

    def _own_copy(self, x: Shape) -> bool:
        return _acc(x.dtype, self.acc) != x.dtype

    def workspace(self, inputs, output):
        x = inputs[0]
        acc = _acc(x.dtype, self.acc)
        axes = self._axes(x.ndim)
        red = Shape(acc, [1 if i in axes else d for i, d in enumerate(x.lens)])
        full = Shape(acc, x.lens)
        return ([full] if self._own_copy(x) else []) + [full, red, red]

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        axes = self._axes(x.ndim)
        if x.dtype != ws[-1].dtype:  # compute in acc: c holds x cast, then x - mean
            c, sq, m, v = ws
            xp.copyto(c, x)
            src = c
        else:
            sq, m, v = ws
            c, src = out, x
        ctx.reduce("mean", src, axes, m)
        if self.moments == "raw":
            xp.multiply(src, src, out=sq)
            ctx.reduce("mean", sq, axes, v)
            xp.subtract(src, m, out=c)
            xp.multiply(m, m, out=m)
            xp.subtract(v, m, out=v)
        else:
            xp.subtract(src, m, out=c)
            xp.multiply(c, c, out=sq)
            ctx.reduce("mean", sq, axes, v)
        eps = v.dtype.type(self.epsilon)
        if self.eps_on_std:
            xp.sqrt(v, out=v)
            xp.add(v, eps, out=v)
        else:
            xp.add(v, eps, out=v)
            xp.sqrt(v, out=v)
        xp.true_divide(c, v, out=c)
        if len(args) > 1:
            xp.multiply(c, args[1], out=c)
        if len(args) > 2:
            xp.add(c, args[2], out=c)
        if c is not out:
            xp.copyto(out, c)

    def launches(self, inputs, output):
        own = self._own_copy(inputs[0])
        return 2 * own + 7 + 2 * (self.moments == "raw") + (len(inputs) - 1)


@register_op
class LpNorm(Operation):
    """ONNX LpNormalization: ``x / ||x||_p`` along ``axis`` for p = 1 or 2; a zero norm gives 0 (as
    onnxruntime), a NaN in the line gives NaN.  Input and output: float16/32/64, same shape."""

    name = "lp_norm"
    alloc_free = True

    def __init__(self, axis=-1, p=2):
        super().__init__(axis=int(axis), p=int(p))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        _check_float(self, x)
        normalize_axis(self.axis, x.ndim, self.name)
        if self.p not in (1, 2):
            raise ShapeError(f"{self.name}: p must be 1 or 2, got {self.p}")
        return Shape(x.dtype, x.lens)

    def workspace(self, inputs, output):
        x = inputs[0]
        acc = _acc(x.dtype)
        a = normalize_axis(self.axis, x.ndim, self.name)
        red = [1 if i == a else d for i, d in enumerate(x.lens)]
        return [Shape(acc, x.lens), Shape(acc, red), Shape("bool", red)]

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        t, m, zero = ws
        a = (self.axis % x.ndim,)
        if self.p == 2:
            xp.multiply(x, x, out=t, dtype=t.dtype)
        else:
            xp.absolute(x, out=t, dtype=t.dtype)
        ctx.reduce("sum", t, a, m)
        if self.p == 2:
            xp.sqrt(m, out=m)
        xp.equal(m, 0, out=zero)
        xp.add(m, zero, out=m)  # a zero norm divides by 1: the line is all zeros
        xp.true_divide(x, m, out=out, dtype=m.dtype)

    def launches(self, inputs, output):
        return 5 + (self.p == 2)


@register_op
class LRN(Operation):
    """ONNX LRN over the channel axis 1 of ``[N, C, D1, ...]``:
    ``y = x / (bias + alpha / size * sum(x^2 over channels c - floor((size-1)/2) .. c + ceil((size-1)/2))) ^ beta``.

    The window sum is ``size`` shifted adds into a workspace (``size`` is small).  Float16/32/64.
    """

    name = "lrn"
    alloc_free = True

    def __init__(self, size=1, alpha=1e-4, beta=0.75, bias=1.0):
        super().__init__(size=int(size), alpha=float(alpha), beta=float(beta), bias=float(bias))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        _check_float(self, x)
        if x.ndim < 3:
            raise ShapeError(f"{self.name}: input must be [N, C, D1, ...], got {list(x.lens)}")
        if self.size < 1:
            raise ShapeError(f"{self.name}: size must be >= 1, got {self.size}")
        return Shape(x.dtype, x.lens)

    def workspace(self, inputs, output):
        x = inputs[0]
        acc = _acc(x.dtype)
        return [Shape(acc, x.lens), Shape(acc, x.lens)]

    def _offsets(self, C):
        lo = (self.size - 1) // 2
        hi = self.size - 1 - lo
        for d in range(-lo, hi + 1):
            a0, a1 = max(0, -d), min(C, C - d)
            if a1 > a0:
                yield d, a0, a1

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        sq, s = ws
        C = x.shape[1]
        xp.multiply(x, x, out=sq, dtype=sq.dtype)
        s.fill(0)
        for d, a0, a1 in self._offsets(C):
            w = s[:, a0:a1]  # one view object as input and output: CuPy then needs no staging copy
            xp.add(w, sq[:, a0 + d:a1 + d], out=w)
        t = s.dtype.type
        xp.multiply(s, t(self.alpha / self.size), out=s)
        xp.add(s, t(self.bias), out=s)
        xp.power(s, t(self.beta), out=s)
        xp.true_divide(x, s, out=out, dtype=s.dtype)

    def launches(self, inputs, output):
        return 6 + len(list(self._offsets(inputs[0].lens[1])))
