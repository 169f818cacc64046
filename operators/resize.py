"""Resize (ONNX Resize-10..19, Upsample) as a separable gather-and-weight pass per resized axis.

Every Resize mode (nearest, linear, cubic, with or without antialias) maps output position ``i`` of an
axis to a fixed set of input positions and weights that depend only on the static shapes and attributes.
:func:`axis_tables` computes them at parse time, in float32 as onnxruntime's CPU kernel does (so nearest
picks the same pixels at ties): ``index [T, O]`` (int64, clamped into the input: clamping is the edge
handling of every mode), ``weight [T, O]`` (None for nearest) and, for ``tf_crop_and_resize``, which output
positions take ``extrapolation_value``.  The ``resize`` op then runs per axis ``T`` ``take`` + multiply-add
passes into workspaces (the last axis into ``out``) and writes the extrapolation value through a mask:
nothing is allocated, so it can be captured on the gpu target.
Source: ONNX operator spec (Resize-19), onnxruntime ``upsamplebase.h`` / ``upsample_antialias.h`` formulas.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape
from .base import Operation, check_inputs, register_op

COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_half_pixel_for_nn", "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")

_f = np.float32


def original_coordinate(mode, out_len, in_len, scale, roi=(0.0, 1.0), exact=None, out_width=None):
    """Input coordinate of every output position of one axis ([out_len]).

    Computed in float32 as onnxruntime's CPU kernel does (so nearest picks the same pixel where the float32
    value falls just below or above an integer).  ``exact=(num, den)``: in float64 with the scale taken as
    the exact ratio ``num / den`` it rounds (used to recognise ties, see :func:`axis_tables`).
    ``out_width``: for align_corners, the (possibly fractional) ``scale * in_len`` the ONNX reference and
    conformance data divide by when scales are given (onnxruntime divides by the integer length)."""
    if exact is not None:
        F, x = np.float64, np.arange(out_len, dtype=np.float64)
        num, den = exact
        s = num / den

        def div(v):
            return v * den / num
    else:
        F, x, s = _f, np.arange(out_len, dtype=_f), _f(scale)

        def div(v):
            return v / s
    L_in, L_out, half = F(in_len), F(out_len), F(0.5)
    if mode == "asymmetric":
        return div(x)
    if mode == "pytorch_half_pixel":
        return div(x + half) - half if out_len > 1 else np.zeros(out_len, F)
    if mode == "tf_half_pixel_for_nn":
        return div(x + half)
    if mode == "align_corners":
        if out_width is not None:  # the reference's float64 arithmetic
            xd = np.arange(out_len, dtype=np.float64)
            return xd * (in_len - 1) / (out_width - 1) if out_width != 1 else np.zeros(out_len)
        return x * (L_in - 1) / (L_out - 1) if out_len > 1 else np.zeros(out_len, F)
    if mode == "tf_crop_and_resize":
        r0, r1 = F(_f(roi[0])), F(_f(roi[1]))
        if out_len > 1:
            return r0 * (L_in - 1) + (x * (r1 - r0) * (L_in - 1)) / (L_out - 1)
        return np.full(out_len, 0.5 * (float(r0) + float(r1)) * (in_len - 1), F)
    if mode == "half_pixel_symmetric":
        adjustment = L_out / (F(s) * L_in)
        offset = (L_in / 2) * (1 - adjustment)
        return (offset + div(x.astype(np.float64) + 0.5) - 0.5).astype(F)
    if mode == "half_pixel":
        return div(x + half) - half
    raise ValueError(f"coordinate_transformation_mode '{mode}'")


def _round_half_away(v):
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def nearest_index(xo, mode, downsample):
    """Nearest input position (int64) of coordinates ``xo`` (onnxruntime's rounding)."""
    if mode == "round_prefer_floor":
        tie = xo == np.trunc(xo) + 0.5
        r = np.where(tie, np.floor(xo), _round_half_away(xo))
    elif mode == "round_prefer_ceil":
        r = _round_half_away(xo)
    elif mode == "floor":
        r = np.floor(xo)
    elif mode == "ceil":
        r = np.ceil(xo)
    else:  # "simple": Resize-10 / Upsample
        r = np.ceil(xo) if downsample else np.trunc(xo)
    return r.astype(np.int64)


def _cubic_weights(r, a):
    """Keys cubic convolution weights of the taps at floor(x) - 1 .. floor(x) + 2, ``r = x - floor(x)``."""
    def far(t):
        return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a

    def near(t):
        return ((a + 2) * t - (a + 3)) * t * t + 1

    return np.stack([far(r + 1), near(r), near(1 - r), far(2 - r)])


def _filter(mode, v, a):
    v = np.abs(v)
    if mode == "linear":
        return np.where(v < 1, 1 - v, 0.0)
    return np.where(v < 1, ((a + 2) * v - (a + 3)) * v * v + 1, np.where(v < 2, (((v - 5) * v + 8) * v - 4) * a, 0.0))


def _support(mode, scale) -> tuple:
    """``(support, 1 / scale)`` of the antialiasing filter (the support widens by 1/scale when downsampling)."""
    support_size = 2.0 if mode == "linear" else 4.0
    with np.errstate(divide="ignore", over="ignore"):
        inv = float(np.float64(1.0) / np.float64(_f(scale)))  # inf for a scale of 0
    return (support_size * 0.5 * inv if inv >= 1.0 else support_size * 0.5), inv


def table_taps(mode, scale, antialias=False) -> float:
    """Taps per output position of one axis's tables (:func:`axis_tables`): 1 nearest, 2 linear, 4 cubic,
    the filter's window with ``antialias`` (a float: inf for a scale too small to invert)."""
    if mode == "nearest":
        return 1.0
    if not antialias:
        return 2.0 if mode == "linear" else 4.0
    support = _support(mode, scale)[0]
    return float(np.ceil(support)) * 2 + 1 if np.isfinite(support) else float("inf")


def _antialias_tables(mode, xo, in_len, scale, a, exclude_outside):
    """onnxruntime's (Pillow-style) antialiasing filter: the support widens by 1/scale when downsampling."""
    support, inv = _support(mode, scale)
    window = int(np.ceil(support)) * 2 + 1
    inv_scale = 1.0 / inv if inv >= 1.0 else 1.0
    center = xo + 0.5
    lo = np.floor(center - support + 0.5).astype(np.int64)
    hi = np.floor(center + support + 0.5).astype(np.int64)
    if exclude_outside:
        lo, hi = np.maximum(lo, 0), np.minimum(hi, in_len)
    t = np.arange(window)[:, None]
    pos = lo[None, :] + t
    w = np.where(pos < hi[None, :], _filter(mode, (t + lo[None, :] - center[None, :] + 0.5) * inv_scale, a), 0.0)
    total = w.sum(axis=0)
    w = w / np.where(total == 0, 1.0, total)
    return pos, w


def axis_tables(mode, in_len, out_len, scale, coord_mode, nearest_mode="round_prefer_floor", cubic_a=-0.75,
                exclude_outside=False, antialias=False, roi=(0.0, 1.0), exact=None, out_width=None):
    """(index int64 [T, O], weight float64 [T, O] or None, extrapolated bool [O] or None) of one axis.

    ``exact``: ``(num, den)`` when the float32 ``scale`` stands for the ratio ``num / den`` (sizes given,
    or a scale equal to out / in): nearest rounding then treats exact halfway coordinates as ties.
    ``out_width``: see :func:`original_coordinate`."""
    xo = original_coordinate(coord_mode, out_len, in_len, scale, roi, out_width=out_width)
    extrap = None
    if coord_mode == "tf_crop_and_resize":
        extrap = (xo < 0) | (xo > in_len - 1)
    if mode == "nearest":
        if nearest_mode.startswith("round") and exact is not None:
            # a coordinate halfway between two pixels in exact arithmetic is a tie, even where float32 puts
            # it one ulp off (onnxruntime rounds 2 / (4 / 7) as the tie 3.5)
            xe = original_coordinate(coord_mode, out_len, in_len, scale, roi, exact, out_width)
            half = np.floor(xe) + 0.5
            tie = (np.abs(xe - half) < 1e-9) & (np.abs(half - xo) <= 4 * np.spacing(np.abs(xo).astype(_f)))
            xo = np.where(tie, half, xo)
        idx = nearest_index(xo, nearest_mode, float(_f(scale)) < 1.0)[None, :]
        return np.clip(idx, 0, in_len - 1), None, extrap
    if antialias:
        pos, w = _antialias_tables(mode, xo, in_len, scale, cubic_a, exclude_outside)
        return np.clip(pos, 0, in_len - 1), w, extrap
    if mode == "linear":
        xc = np.clip(xo, 0.0, in_len - 1.0)
        x1 = np.minimum(np.trunc(xc).astype(np.int64), in_len - 1)
        x2 = np.minimum(x1 + 1, in_len - 1)
        d1, d2 = np.abs(xc - x1), np.abs(xc - x2)
        same = x1 == x2
        w = np.stack([np.where(same, 0.5, d2), np.where(same, 0.5, d1)])
        return np.stack([x1, x2]), w, extrap
    base = np.floor(xo).astype(np.int64)
    pos = base[None, :] + np.arange(-1, 3)[:, None]
    w = _cubic_weights(xo - np.floor(xo), cubic_a)
    if exclude_outside:
        w = np.where((pos >= 0) & (pos < in_len), w, 0.0)
        total = w.sum(axis=0)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(pos, 0, in_len - 1), w, extrap


def is_identity(index, weight, extrap, in_len, out_len):
    """True when the tables of an axis reproduce the input (the axis can be skipped)."""
    if out_len != in_len or (extrap is not None and extrap.any()):
        return False
    if not np.array_equal(index[0], np.arange(in_len)):
        return False
    return weight is None or (np.all(weight[0] == 1.0) and not np.any(weight[1:]))


@register_op
class Resize(Operation):
    """Separable resize (see the module docstring).

    Inputs: x, then per resized axis (``axes``, in order) the index table ``[T, O]`` (int64) and, when
    ``weighted``, the weight table ``[T, O]`` (x's dtype); with ``extrapolate``, last the extrapolation
    value (0-d, x's dtype) and a bool mask broadcastable to the output (True: take the value).
    Output: x's shape with ``out_lens[k]`` on axis ``axes[k]``.
    Raises ShapeError when the tables do not match the axes.
    """

    name = "resize"
    alloc_free = True

    def __init__(self, axes=(), weighted=False, extrapolate=False):
        super().__init__(axes=[int(a) for a in axes], weighted=bool(weighted), extrapolate=bool(extrapolate) or None)

    def _per_axis(self):
        return 2 if self.weighted else 1

    def _stage_lens(self, x_lens, inputs):
        lens, stages = list(x_lens), []
        for k, a in enumerate(self.axes):
            lens[a] = inputs[1 + k * self._per_axis()].lens[1]
            stages.append(list(lens))
        return stages

    def compute_shape(self, inputs, mods=()):
        n = 1 + len(self.axes) * self._per_axis() + (2 if self.extrapolate else 0)
        check_inputs(self, inputs, n)
        x = inputs[0]
        if not self.axes or any(not 0 <= a < x.ndim for a in self.axes):
            raise ShapeError(f"resize: axes {self.axes} out of range for input {list(x.lens)}")
        for k in range(len(self.axes)):
            tabs = inputs[1 + k * self._per_axis():1 + (k + 1) * self._per_axis()]
            if tabs[0].ndim != 2 or any(t.lens != tabs[0].lens for t in tabs):
                raise ShapeError(f"resize: tables of axis {self.axes[k]} {[list(t.lens) for t in tabs]} are not "
                                 f"one [taps, out] shape")
        return Shape(x.dtype, self._stage_lens(x.lens, inputs)[-1])

    def workspace(self, inputs, output):
        x = inputs[0]
        stages = self._stage_lens(x.lens, inputs)
        ws = [Shape(x.dtype, s) for s in stages[:-1]]
        if self.weighted:
            ws += [Shape(x.dtype, s) for s in stages]
        return ws

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        src = args[0]
        n = len(self.axes)
        per = self._per_axis()
        for k, a in enumerate(self.axes):
            dst = out if k == n - 1 else ws[k]
            idx = args[1 + k * per]
            xp.take(src, idx[0], axis=a, out=dst)
            if self.weighted:
                w = args[2 + k * per]
                bshape = (-1,) + (1,) * (src.ndim - a - 1)
                tmp = ws[n - 1 + k]
                xp.multiply(dst, w[0].reshape(bshape), out=dst)
                for t in range(1, idx.shape[0]):
                    xp.take(src, idx[t], axis=a, out=tmp)
                    xp.multiply(tmp, w[t].reshape(bshape), out=tmp)
                    xp.add(dst, tmp, out=dst)
            src = dst
        if self.extrapolate:
            xp.copyto(out, args[-2], where=args[-1])

    def launches(self, inputs, output):
        n = 0
        for k in range(len(self.axes)):
            taps = inputs[1 + k * self._per_axis()].lens[0]
            n += 1 + (1 + 3 * (taps - 1) if self.weighted else 0)
        return n + (1 if self.extrapolate else 0)
