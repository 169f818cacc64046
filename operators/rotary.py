"""Rotary position embedding (RoPE; Su et al. 2021, https://arxiv.org/abs/2104.09864).

One op serves onnxruntime's com.microsoft::RotaryEmbedding, ONNX RotaryEmbedding (opset 23) and the
rotation GroupQueryAttention applies with ``do_rotary``.  Source of the semantics: the ONNX opset-23
RotaryEmbedding reference (onnx.ai/onnx/operators/onnx__RotaryEmbedding.html) and onnxruntime's
ContribOperators.md.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape
from .base import Operation, check_inputs, register_op
from .normalization_contrib import FLOATS, acc_dtype


@register_op
class RotaryEmbedding(Operation):
    """Rotate the first ``rotary_dim`` (R; 0: the head size H) channels of every head by the angles of
    each token's position; the other channels pass through.

    Inputs: x [B, S, N, H] (``heads_axis`` 2) or [B, N, S, H] (``heads_axis`` 1), any strides;
    cos, sin: [M, R/2] tables indexed by position_ids [B or 1, S] (int64, values in [0, M)) when that
    4th input is given, else [B or 1, S, R/2] per token.  Output: x's shape (standard layout) and type.
    With ``interleaved`` channel pairs are (0, 1), (2, 3) ...; otherwise (i, i + R/2).
    ``y1 = x1 cos - x2 sin``, ``y2 = x1 sin + x2 cos``, computed in float32 (float64 for double).

    Raises ShapeError for inconsistent shapes; at run time on the ref target a position id outside
    [0, M) raises (an ExecutionError naming the instruction).  The gpu target does not check the
    position ids (an out-of-range id reads a wrapped-around table row).
    """

    name = "rotary_embedding"
    alloc_free = True

    def __init__(self, interleaved=0, rotary_dim=0, heads_axis=2):
        super().__init__(interleaved=int(interleaved), rotary_dim=int(rotary_dim), heads_axis=int(heads_axis))

    def _dims(self, x: Shape):
        """(B, S, N, H, R) of input ``x``."""
        B, a, b, H = x.lens
        S, N = (a, b) if self.heads_axis == 2 else (b, a)
        return B, S, N, H, self.rotary_dim or H

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, (3, 4))
        x, cos, sin = inputs[:3]
        if x.ndim != 4 or x.dtype not in FLOATS or self.heads_axis not in (1, 2):
            raise ShapeError(f"{self.name}: input must be a 4-D float tensor, got {x.brief()}")
        B, S, N, H, R = self._dims(x)
        if R % 2 or R > H:
            raise ShapeError(f"{self.name}: rotary dim {R} must be even and at most the head size {H}")
        if cos.lens != sin.lens or cos.dtype not in FLOATS or sin.dtype not in FLOATS:
            raise ShapeError(f"{self.name}: cos {cos.brief()} and sin {sin.brief()} caches differ")
        if len(inputs) == 4:
            pos = inputs[3]
            if pos.dtype != "int64" or pos.ndim != 2 or pos.lens[0] not in (1, B) or pos.lens[1] != S:
                raise ShapeError(f"{self.name}: position ids {pos.brief()} must be int64 [{B} or 1, {S}]")
            want = "[max_position, %d]" % (R // 2)
            ok = cos.ndim == 2 and cos.lens[1] == R // 2
        else:
            want = "[%d or 1, %d, %d]" % (B, S, R // 2)
            ok = cos.ndim == 3 and cos.lens[0] in (1, B) and tuple(cos.lens[1:]) == (S, R // 2)
        if not ok:
            raise ShapeError(f"{self.name}: cos / sin caches {list(cos.lens)} must be {want} "
                             f"(input {list(x.lens)}, rotary dim {R})")
        return Shape(x.dtype, x.lens)

    def workspace(self, inputs, output):
        x, cos = inputs[0], inputs[1]
        B, S, N, H, R = self._dims(x)
        half = list(x.lens[:3]) + [R // 2]
        acc = acc_dtype(x.dtype)
        ws = [Shape(acc, half), Shape(acc, half)]
        if len(inputs) == 4:
            ws += [Shape(cos.dtype, list(inputs[3].lens) + [R // 2])] * 2
        return ws

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        x, cos, sin = args[:3]
        B, S, N, H, R = self._dims(Shape(x.dtype.name, x.shape))
        a, b = ws[0], ws[1]
        if len(args) == 4:
            pos = args[3]
            if xp is np and pos.size and (pos.min() < 0 or pos.max() >= cos.shape[0]):
                bad = int(pos.min() if pos.min() < 0 else pos.max())
                raise IndexError(f"position id {bad} is out of range [0, {cos.shape[0]}) of the cos / sin caches")
            xp.take(cos, pos, axis=0, out=ws[2])
            xp.take(sin, pos, axis=0, out=ws[3])
            cos, sin = ws[2], ws[3]
        # [B|1, S, R/2] -> broadcast over the heads axis
        c = cos[:, :, None, :] if self.heads_axis == 2 else cos[:, None, :, :]
        s = sin[:, :, None, :] if self.heads_axis == 2 else sin[:, None, :, :]
        if self.interleaved:
            x1, x2, y1, y2 = x[..., 0:R:2], x[..., 1:R:2], out[..., 0:R:2], out[..., 1:R:2]
        else:
            h = R // 2
            x1, x2, y1, y2 = x[..., :h], x[..., h:R], out[..., :h], out[..., h:R]
        _rotate_half(xp, x1, x2, c, s, y1, a, b, sign=-1)
        _rotate_half(xp, x2, x1, c, s, y2, a, b, sign=1)
        if R < H:
            xp.copyto(out[..., R:], x[..., R:])

    def launches(self, inputs, output):
        x = inputs[0]
        return 12 + 2 * (len(inputs) == 4) + (self._dims(x)[4] < x.lens[3])


def _rotate_half(xp, u, w, c, s, y, a, b, sign):
    """``y = u * c + sign * w * s`` with the products formed in the accumulation buffers ``a`` and ``b``."""
    xp.copyto(a, u)
    xp.multiply(a, c, out=a)
    xp.copyto(b, w)
    xp.multiply(b, s, out=b)
    if sign < 0:
        xp.subtract(a, b, out=a)
    else:
        xp.add(a, b, out=a)
    xp.copyto(y, a)
