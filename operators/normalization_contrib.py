"""onnxruntime's fused normalizations: SkipLayerNormalization, SkipSimplifiedLayerNormalization
(com.microsoft) and SimplifiedLayerNormalization (the ai.onnx-domain name onnxruntime registers), as one
op with float32 accumulation for half inputs.

Source: onnxruntime ContribOperators.md (SkipLayerNormalization, SkipSimplifiedLayerNormalization) and
onnxruntime's CPU kernels (skip_layer_norm.cc, layer_norm_impl.cc): the sum ``input + skip + bias`` is
formed in float32, the statistics come from that float32 sum, and ``input_skip_bias_sum`` is the sum
rounded to the input type.
"""
from __future__ import annotations

from ..errors import ShapeError
from ..ir.shape import Shape, broadcast_lens
from .base import Operation, check_inputs, normalize_axis, register_op

FLOATS = ("float16", "float32", "float64")


def broadcasts_to(lens, target) -> bool:
    """True when ``lens`` broadcasts (numpy rules) to exactly ``target``."""
    try:
        return len(lens) <= len(target) and broadcast_lens(lens, target) == tuple(target)
    except ShapeError:
        return False


def acc_dtype(dtype: str) -> str:
    """The accumulation type of ``dtype``: float64 for float64, float32 for every other float."""
    return "float64" if dtype == "float64" else "float32"


@register_op
class SkipLayerNorm(Operation):
    """``s = x (+ skip) (+ bias)``; ``y = (s - mean(s)) / sqrt(var(s) + epsilon) * gamma (+ beta)``, or with
    ``simplified`` (RMS normalization) ``y = s / sqrt(mean(s^2) + epsilon) * gamma``; the statistics run
    over dims ``axis..rank-1`` in float32 (float64 for double inputs).

    Inputs, in this order, those present per the flags ``skip`` / ``beta`` / ``bias``:
    x [..., D] (float16 / float32 / float64), skip (broadcastable to x: [B, S, D], [1, S, D], [S, D]),
    gamma, beta and bias (broadcastable to the normalized dims, e.g. [D]).

    Output: y (x's shape and type); with ``stats`` a tuple (y, mean, inv_std_var, sum): mean and
    inv_std_var are float32 [x dims before ``axis``, 1, ...] (mean is 0 when ``simplified``), sum is
    ``x + skip + bias`` in x's type.  Raises ShapeError for a non-float x or an input that does not
    broadcast.
    """

    name = "skip_layer_norm"
    alloc_free = True

    def __init__(self, epsilon=1e-5, simplified=0, axis=-1, skip=0, beta=0, bias=0, stats=0):
        super().__init__(epsilon=float(epsilon), simplified=int(simplified), axis=int(axis), skip=int(skip),
                         beta=int(beta), bias=int(bias), stats=int(stats))

    def _split(self, items):
        """(x, skip, gamma, beta, bias) from the inputs (None for an absent one)."""
        it = iter(items)
        x = next(it)
        skip = next(it) if self.skip else None
        gamma = next(it)
        beta = next(it) if self.beta else None
        bias = next(it) if self.bias else None
        return x, skip, gamma, beta, bias

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 2 + self.skip + self.beta + self.bias)
        x, skip, gamma, beta, bias = self._split(inputs)
        if x.dtype not in FLOATS:
            raise ShapeError(f"{self.name}: input must be float16 / float32 / float64, got {x.dtype}")
        a = normalize_axis(self.axis, x.ndim, self.name)
        norm = tuple(x.lens[a:])
        if skip is not None and not broadcasts_to(skip.lens, x.lens):
            raise ShapeError(f"{self.name}: skip {list(skip.lens)} does not broadcast to input {list(x.lens)}")
        for what, s in (("gamma", gamma), ("beta", beta), ("bias", bias)):
            if s is None:
                continue
            if s.dtype not in FLOATS or not broadcasts_to(s.lens, norm):
                raise ShapeError(f"{self.name}: {what} {s.brief()} does not broadcast to the normalized dims "
                                 f"{list(norm)} of input {list(x.lens)}")
        y = Shape(x.dtype, x.lens)
        if not self.stats:
            return y
        st = Shape(acc_dtype(x.dtype), list(x.lens[:a]) + [1] * (x.ndim - a))
        return (y, st, st, Shape(x.dtype, x.lens))

    def _stat_lens(self, x: Shape):
        a = self.axis % x.ndim
        return list(x.lens[:a]) + [1] * (x.ndim - a)

    def workspace(self, inputs, output):
        x = inputs[0]
        acc = acc_dtype(x.dtype)
        return [Shape(acc, x.lens), Shape(acc, x.lens), Shape(acc, self._stat_lens(x)),
                Shape(acc, self._stat_lens(x))]

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        x, skip, gamma, beta, bias = self._split(args)
        s, sq, mean, inv = ws
        axes = tuple(range(self.axis % x.ndim, x.ndim))
        y = out[0] if self.stats else out
        xp.copyto(s, x)
        if skip is not None:
            xp.add(s, skip, out=s)
        if bias is not None:
            xp.add(s, bias, out=s)
        if self.stats:
            xp.copyto(out[3], s)
        if not self.simplified:
            ctx.reduce("mean", s, axes, mean)
            xp.subtract(s, mean, out=s)
        xp.multiply(s, s, out=sq)
        ctx.reduce("mean", sq, axes, inv)
        xp.add(inv, inv.dtype.type(self.epsilon), out=inv)
        xp.sqrt(inv, out=inv)
        xp.reciprocal(inv, out=inv)
        xp.multiply(s, inv, out=s)
        xp.multiply(s, gamma, out=s)
        if beta is not None:
            xp.add(s, beta, out=s)
        xp.copyto(y, s)
        if self.stats:
            if self.simplified:
                out[1].fill(0)
            else:
                xp.copyto(out[1], mean)
            xp.copyto(out[2], inv)

    def launches(self, inputs, output):
        n = 9 + self.skip + self.bias + self.beta + (0 if self.simplified else 2)
        return n + (3 if self.stats else 0)
