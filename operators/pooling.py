"""Pooling over the spatial dims of an ``[N, C, *S]`` tensor (ONNX MaxPool, AveragePool, LpPool).

The parser resolves ``auto_pad`` / ``ceil_mode`` into explicit begin pads and output lens, so the op sees
a fixed geometry: kernel ``k``, stride ``s``, dilation ``d``, begin pads ``pb`` and output lens ``O``.
The kernel is written once against ``xp`` (numpy on ``ref``, CuPy on ``gpu``):

1. when the windows reach outside the input, the input is copied into a padded scratch buffer filled
   with the pad value (NaN for a float max, which ``fmax`` skips; the integer minimum for an integer
   max; 0 for average / Lp, where Lp stores |x|^p);
2. max and sums are separable, so each spatial axis is pooled in turn (last axis first, into scratch
   buffers, the first axis into ``out``): for every kernel offset ``j`` of that axis (a small static loop)
   the strided view ``src[..., o*s + j*d, ...]`` of all windows at once is folded in (``fmax`` or
   ``add``); MaxPool's Indices output instead folds all ``prod(k)`` offsets, tracking the argmax;
3. average divides by a divisor literal computed by the parser (the window positions inside the input,
   or inside the explicitly padded extent with ``count_include_pad``); Lp takes the 1/p-th power.

Every step writes into ``out`` or a declared workspace, so the op allocates nothing and can be captured.
NaN (docs/nan_semantics.md): max pooling skips NaN (``fmax``), a window of NaNs only gives NaN, as
onnxruntime's CPU MaxPool does wherever its SIMD lanes do not change the answer; the Indices output
points at the first maximum (at the window's first NaN when it holds NaNs only).  Average and Lp pooling
propagate NaN.
Source: ONNX operator spec, MaxPool-22 / AveragePool-22 / LpPool-22.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape
from .base import Operation, check_inputs, register_op


def pool_geometry(in_lens, kernel, stride, dilation, pads_begin, out_lens):
    """Length per spatial axis of the padded source the windows read: enough for the input after its
    begin pad and for the last window, ``max(S + pb, (O - 1) * s + (k - 1) * d + 1)``."""
    return [max(int(s) + pb, (o - 1) * st + (k - 1) * d + 1)
            for s, k, st, d, pb, o in zip(in_lens, kernel, stride, dilation, pads_begin, out_lens)]


def window_views(src, kernel, stride, dilation, out_lens):
    """The strided views ``src[:, :, o*s + j*d]`` (one per kernel offset ``j``, row-major order), each
    shaped ``[N, C, *out_lens]``."""
    views = []
    for j in np.ndindex(*kernel):
        idx = (slice(None), slice(None)) + tuple(
            slice(jj * d, jj * d + (o - 1) * s + 1, s) for jj, d, s, o in zip(j, dilation, stride, out_lens))
        views.append(src[idx])
    return views


def _fill_value(dtype, mode):
    if mode != "max":
        return 0
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return np.nan
    return np.iinfo(dt).min


@register_op
class Pooling(Operation):
    """Max / average / Lp pooling with a static geometry (see the module docstring).

    Inputs: x ``[N, C, *S]``; for ``average`` also the divisor ``[1, 1, *O]`` (x's dtype); for ``max``
    with ``indices`` also the spatial index of every kernel offset ``[prod(k), *O]`` (int64, row- or
    column-major as ONNX ``storage_order`` asks) and the ``(n * C + c) * prod(S)`` offsets ``[N, C, 1...]``.
    Output: y ``[N, C, *O]``, or ``(y, indices int64)`` with ``indices``.
    Attributes: ``mode`` ('max', 'average', 'lp'), ``kernel``, ``stride``, ``dilation``, ``pads_begin``,
    ``out_lens`` (one int per spatial axis), ``p`` (Lp only).
    Raises ShapeError for a rank below 3, attributes of the wrong length, or an empty output.
    """

    name = "pooling"
    alloc_free = True

    def __init__(self, mode="max", kernel=(), stride=(), dilation=(), pads_begin=(), out_lens=(), p=2.0,
                 indices=False):
        super().__init__(mode=str(mode), kernel=[int(k) for k in kernel], stride=[int(s) for s in stride],
                         dilation=[int(d) for d in dilation], pads_begin=[int(p_) for p_ in pads_begin],
                         out_lens=[int(o) for o in out_lens], p=float(p) if mode == "lp" else None,
                         indices=bool(indices) or None)

    def _n_inputs(self):
        if self.mode == "average":
            return 2
        return 3 if self.indices else 1

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, self._n_inputs())
        x = inputs[0]
        nsp = x.ndim - 2
        if nsp < 1:
            raise ShapeError(f"pooling: input must be [N, C, spatial...], got {list(x.lens)}")
        for what in ("kernel", "stride", "dilation", "pads_begin", "out_lens"):
            if len(getattr(self, what)) != nsp:
                raise ShapeError(f"pooling: {what} {getattr(self, what)} does not have {nsp} values "
                                 f"for input {list(x.lens)}")
        if any(o <= 0 for o in self.out_lens):
            raise ShapeError(f"pooling: empty output {self.out_lens} for input {list(x.lens)} (kernel "
                             f"{self.kernel}, strides {self.stride}, dilations {self.dilation})")
        out = Shape(x.dtype, list(x.lens[:2]) + self.out_lens)
        if self.indices:
            return (out, Shape("int64", out.lens))
        return out

    def _padded_lens(self, x_lens):
        nsp = len(x_lens) - 2
        return pool_geometry(x_lens[2:], self.kernel, self.stride, self.dilation, self.pads_begin[:nsp],
                             self.out_lens)

    def _needs_pad(self, x_lens):
        return self.mode == "lp" or any(self.pads_begin) or \
            any(L > s for L, s in zip(self._padded_lens(x_lens), x_lens[2:]))

    def _stage_lens(self, x_lens):
        """Shapes after pooling the last 1, 2, ... spatial axes (the separable passes, last axis first)."""
        lens = list(x_lens[:2]) + self._padded_lens(x_lens)
        stages = []
        for a in range(len(self.kernel) - 1, -1, -1):
            lens[2 + a] = self.out_lens[a]
            stages.append(list(lens))
        return stages

    def workspace(self, inputs, output):
        x = inputs[0]
        ws = []
        if self._needs_pad(x.lens):
            ws.append(Shape(x.dtype, list(x.lens[:2]) + self._padded_lens(x.lens)))
        if self.indices:
            lens = list(x.lens[:2]) + self.out_lens
            ws += [Shape("bool", lens), Shape("bool", lens)]
        else:
            ws += [Shape(x.dtype, s) for s in self._stage_lens(x.lens)[:-1]]
        return ws

    def _source(self, xp, x, ws):
        if not self._needs_pad(x.shape):
            return x
        src = ws[0]
        src.fill(_fill_value(x.dtype, self.mode))
        inner = src[(slice(None), slice(None)) + tuple(slice(pb, pb + s) for pb, s in
                                                       zip(self.pads_begin, x.shape[2:]))]
        if self.mode == "lp":
            xp.abs(x, out=inner)
            if self.p != 1.0:
                with np.errstate(divide="ignore", over="ignore"):  # p < 0: |0|^p is inf (onnxruntime's value)
                    xp.power(inner, inner.dtype.type(self.p), out=inner)
        else:
            xp.copyto(inner, x)
        return src

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        src = self._source(xp, x, ws)
        if self.indices:
            views = window_views(src, self.kernel, self.stride, self.dilation, self.out_lens)
            self._max_with_indices(xp, out, args, views, ws[-2:])
            return
        # max and sums are separable: one pass per spatial axis (sum(k) instead of prod(k) folds)
        fold = xp.fmax if self.mode == "max" else xp.add
        nsp = len(self.kernel)
        stages = ws[1 if self._needs_pad(x.shape) else 0:] + [out]
        cur = src
        for step, a in enumerate(range(nsp - 1, -1, -1)):
            dst = stages[step]
            k, d, s, o = self.kernel[a], self.dilation[a], self.stride[a], self.out_lens[a]
            pre = (slice(None),) * (2 + a)
            xp.copyto(dst, cur[pre + (slice(0, (o - 1) * s + 1, s),)])
            for j in range(1, k):
                fold(dst, cur[pre + (slice(j * d, j * d + (o - 1) * s + 1, s),)], out=dst)
            cur = dst
        if self.mode == "average":
            xp.true_divide(out, args[1], out=out)
        elif self.mode == "lp" and self.p != 1.0:
            with np.errstate(divide="ignore", over="ignore"):  # p = 0: the count to the power inf
                xp.power(out, out.dtype.type(1.0 / self.p if self.p else np.inf), out=out)

    def _max_with_indices(self, xp, out, args, views, masks):
        """First maximum wins (strictly greater replaces); NaN is skipped: a number replaces a NaN, and a
        NaN of the input replaces a NaN of the padding (index -1), so a window of NaNs only points at its
        first NaN."""
        y, ind = out
        idx, nc = args[1], args[2]
        take, valid = masks
        xp.copyto(y, views[0])
        xp.copyto(ind, idx[0])
        floating = y.dtype.kind == "f"
        for j, v in enumerate(views[1:], start=1):
            if floating:
                xp.equal(v, v, out=take)                  # v is a number
                xp.less(ind, 0, out=valid)                # y is the padding
                xp.logical_or(take, valid, out=take)
                xp.not_equal(y, y, out=valid)             # y is NaN
                xp.logical_and(take, valid, out=valid)    # NaN y that v replaces
                xp.greater(v, y, out=take)
                xp.logical_or(take, valid, out=take)
            else:
                xp.greater(v, y, out=take)
            xp.copyto(y, v, where=take)
            xp.copyto(ind, idx[j], where=take)
        xp.add(ind, nc, out=ind)

    def launches(self, inputs, output):
        x = inputs[0]
        n = math.prod(self.kernel)
        pad = 0
        if self._needs_pad(x.lens):
            pad = 2 + (self.mode == "lp" and self.p != 1.0)
        if self.indices:
            per = 9 if x.dtype.startswith("float") else 3
            return pad + 2 + (n - 1) * per + 1
        tail = 1 if self.mode == "average" or (self.mode == "lp" and self.p != 1.0) else 0
        return pad + sum(self.kernel) + tail


def pool_counts(size, kernel, stride, dilation, pad_begin, pad_end, out, include_pad, xp=np, index=None):
    """Kernel taps of each of the ``out`` windows along one axis that fall inside the input ``[0, size)``, or
    (``include_pad``) inside the explicitly padded extent ``[-pad_begin, size + pad_end)`` (float64, ``[out]``).
    Closed form, no ``out x kernel`` array: window ``i`` starts at ``a = i * stride - pad_begin`` and tap
    ``t`` reads ``a + t * dilation``, so the taps inside ``[lo, hi)`` are ``t`` in
    ``[ceil((lo - a) / d), floor((hi - 1 - a) / d)]`` clipped to ``[0, kernel)``.  ``index``: the window
    indices (float64, default ``arange(out)``)."""
    i = xp.arange(out, dtype=np.float64) if index is None else index
    lo, hi = (-pad_begin, size + pad_end) if include_pad else (0, size)
    a = i * stride - pad_begin
    first = xp.maximum(xp.ceil((lo - a) / dilation), 0.0)
    last = xp.minimum(xp.floor((hi - 1 - a) / dilation), kernel - 1.0)
    return xp.maximum(last - first + 1.0, 0.0)


def pool_divisor(in_lens, kernel, stride, dilation, pads_begin, pads_end, out_lens, include_pad, dtype):
    """Divisor of every average-pooling window, ``[1, 1, *out_lens]``: the kernel positions inside the
    input, or (``include_pad``) inside the explicitly padded extent ``[-pb, S + pe)`` (positions a
    ``ceil_mode`` window reaches past the end pad never count), as onnxruntime computes it: the product
    of each axis's :func:`pool_counts`."""
    div = np.ones((), np.float64)
    for s, k, st, d, pb, pe, o in zip(in_lens, kernel, stride, dilation, pads_begin, pads_end, out_lens):
        div = np.multiply.outer(div, pool_counts(s, k, st, d, pb, pe, o, include_pad))
    return div.reshape((1, 1) + tuple(out_lens)).astype(dtype)


def max_pool_index_maps(n, c, in_lens, kernel, stride, dilation, pads_begin, out_lens, column_major):
    """For MaxPool's Indices output: the flat spatial index (int64) each kernel offset reads, shaped
    ``[prod(kernel), *out_lens]`` (positions in the padding get -1; they never win), and the
    ``(n * C + c) * prod(S)`` offsets ``[N, C, 1, ...]``.  ``column_major``: ONNX ``storage_order=1``."""
    nsp = len(in_lens)
    order = range(nsp - 1, -1, -1) if not column_major else range(nsp)
    strides = [0] * nsp
    acc = 1
    for a in order:
        strides[a] = acc
        acc *= int(in_lens[a])
    maps = []
    for j in np.ndindex(*kernel):
        flat = np.zeros(tuple(out_lens), np.int64)
        inside = np.ones(tuple(out_lens), bool)
        for a in range(nsp):
            pos = np.arange(out_lens[a]) * stride[a] + j[a] * dilation[a] - pads_begin[a]
            shp = [1] * nsp
            shp[a] = out_lens[a]
            flat = flat + (pos * strides[a]).reshape(shp)
            inside = inside & ((pos >= 0) & (pos < in_lens[a])).reshape(shp)
        maps.append(np.where(inside, flat, -1))
    nc = (np.arange(n * c, dtype=np.int64) * int(np.prod(in_lens))).reshape((n, c) + (1,) * nsp)
    return np.stack(maps), nc
