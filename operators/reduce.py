"""Reductions, softmax, argmax / argmin.

ONNX spec: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare, Softmax, LogSoftmax,
ArgMax, ArgMin (https://onnx.ai/onnx/operators/).  ``axes`` are resolved by the parser (an empty
list reduces every axis).  Softmax with opset < 13 is lowered by the parser to a 2-D flatten.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape
from .base import Operation, check_inputs, normalize_axis, register_op
from .index_ops import argext_host


class Reduce(Operation):
    kind = "sum"
    alloc_free = True

    def __init__(self, axes=(), keepdims=1):
        super().__init__(axes=[int(a) for a in axes], keepdims=int(keepdims))

    def _axes(self, ndim):
        return tuple(sorted({normalize_axis(a, ndim, self.name) for a in self.axes})) if self.axes else tuple(range(ndim))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        axes = self._axes(x.ndim)
        if self.keepdims:
            lens = [1 if i in axes else d for i, d in enumerate(x.lens)]
        else:
            lens = [d for i, d in enumerate(x.lens) if i not in axes]
        return Shape(x.dtype, lens)

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        axes = self._axes(x.ndim)
        o = out.reshape([1 if i in axes else d for i, d in enumerate(x.shape)]) if not self.keepdims else out
        k = self.kind
        if x.size == 0 and any(x.shape[a] == 0 for a in axes):  # an empty set: the reduction's identity
            if k in ("max", "min", "log_sum_exp", "log_sum"):
                kind = out.dtype.kind
                if kind == "b":
                    o.fill(k == "min")
                elif kind == "f":
                    o.fill(-np.inf if k in ("max", "log_sum_exp", "log_sum") else np.inf)
                else:
                    info = np.iinfo(out.dtype)
                    o.fill(info.min if k == "max" else info.max)
            else:
                o.fill(1 if k == "prod" else 0)
            return
        if k in ("sum", "mean", "max", "min", "prod"):
            ctx.reduce(k, x, axes, o)
        elif k == "l1":
            o[...] = xp.sum(xp.abs(x), axis=axes, keepdims=True)
        elif k == "l2":
            o[...] = xp.sqrt(xp.sum(x.astype(np.float64) * x, axis=axes, keepdims=True))
        elif k == "sum_square":
            o[...] = xp.sum(x * x, axis=axes, keepdims=True)
        elif k == "log_sum":
            o[...] = xp.log(xp.sum(x, axis=axes, keepdims=True))
        elif k == "log_sum_exp":
            m = xp.amax(x, axis=axes, keepdims=True)
            m = xp.where(xp.isfinite(m), m, 0)
            o[...] = xp.log(xp.sum(xp.exp(x - m), axis=axes, keepdims=True)) + m

    def is_alloc_free(self, inputs):
        return self.kind in ("sum", "mean", "max", "min", "prod") and inputs[0].dtype != "bool"


def _reduce(name, kind):
    return register_op(type(name, (Reduce,), {"name": name, "kind": kind}))


ReduceSum = _reduce("reduce_sum", "sum")
ReduceMean = _reduce("reduce_mean", "mean")
ReduceMax = _reduce("reduce_max", "max")
ReduceMin = _reduce("reduce_min", "min")
ReduceProd = _reduce("reduce_prod", "prod")
ReduceL1 = _reduce("reduce_l1", "l1")
ReduceL2 = _reduce("reduce_l2", "l2")
ReduceSumSquare = _reduce("reduce_sum_square", "sum_square")
ReduceLogSum = _reduce("reduce_log_sum", "log_sum")
ReduceLogSumExp = _reduce("reduce_log_sum_exp", "log_sum_exp")


@register_op
class Softmax(Operation):
    """softmax along ``axis``: exp(x - max) / sum(exp(x - max)).

    The generic kernel issues 5 array calls into ``out`` plus one reduced-size scratch buffer; the
    gpu target replaces it by one fused kernel when the axis is innermost.
    """

    name = "softmax"
    log = False
    alloc_free = True

    def __init__(self, axis=-1):
        super().__init__(axis=int(axis))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        normalize_axis(self.axis, x.ndim, self.name)
        if x.dtype not in ("float16", "float32", "float64"):
            raise ShapeError(f"{self.name}: needs a floating-point input, got {x.dtype}")
        return Shape(x.dtype, x.lens)

    def workspace(self, inputs, output):
        x = inputs[0]
        a = normalize_axis(self.axis, x.ndim, self.name)
        red = Shape(x.dtype, [1 if i == a else d for i, d in enumerate(x.lens)])
        return [red, Shape(x.dtype, x.lens)] if self.log else [red]

    def compute(self, ctx, out, args, ws):
        xp, x, m = ctx.xp, args[0], ws[0]
        a = (self.axis % x.ndim,)
        ctx.reduce("max", x, a, m)
        xp.subtract(x, m, out=out)
        if self.log:  # x - max - log(sum(exp(x - max)))
            xp.exp(out, out=ws[1])
            ctx.reduce("sum", ws[1], a, m)
            xp.log(m, out=m)
            xp.subtract(out, m, out=out)
        else:
            xp.exp(out, out=out)
            ctx.reduce("sum", out, a, m)
            xp.true_divide(out, m, out=out)

    def launches(self, inputs, output):
        return 6 if self.log else 5


@register_op
class LogSoftmax(Softmax):
    name = "logsoftmax"
    log = True


@register_op
class ArgMax(Operation):
    name = "argmax"
    fn = "argmax"

    def __init__(self, axis=0, keepdims=1, select_last_index=0):
        super().__init__(axis=int(axis), keepdims=int(keepdims), select_last_index=int(select_last_index))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        a = normalize_axis(self.axis, x.ndim, self.name)
        lens = [1 if i == a else d for i, d in enumerate(x.lens)] if self.keepdims else \
            [d for i, d in enumerate(x.lens) if i != a]
        return Shape("int64", lens)

    def compute(self, ctx, out, args, ws):
        """onnxruntime's rule for NaN: a line starting with NaN gives 0, other NaNs are skipped."""
        x = args[0]
        r = argext_host(ctx.xp, x, self.axis % x.ndim, self.fn == "argmin", bool(self.select_last_index))
        out[...] = r.reshape(out.shape)


@register_op
class ArgMin(ArgMax):
    name = "argmin"
    fn = "argmin"
