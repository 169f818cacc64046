"""Sampling at computed positions: ONNX GridSample (4-D and 5-D; nearest, linear, cubic; zeros, border and
reflection padding; align_corners) and RoiAlign (avg / max; half_pixel / output_half_pixel); AffineGrid,
which makes GridSample's grid (on ``ctx.xp``, both targets).

Both follow onnxruntime's CPU kernels (which the ONNX reference implementation matches, except GridSample
cubic with border padding, where onnxruntime and PyTorch clamp each tap and the reference clamps the
coordinate): padding is applied to each tap's integer index, nearest rounds half to even, cubic uses Keys'
kernel with a = -0.75; RoiAlign's max mode takes the largest *weighted corner* of each bilinear sample.
The ref target computes them with vectorized numpy (a loop over the few taps / corners); the gpu target
with the kernels in ``sampling.cu`` (:mod:`.vision_gpu`: one thread per output position; nothing
allocated: captured).
Source: ONNX operator spec (GridSample-22, RoiAlign-22); onnxruntime ``grid_sample.cc``, ``roialign.cc``.
"""
from __future__ import annotations

import functools
import itertools

import numpy as np

from ..errors import ExecutionError, ShapeError
from ..ir.shape import Shape
from .base import Operation, check_inputs, register_op

FLOATS = ("float16", "float32", "float64")
GS_MODES = ("nearest", "linear", "cubic")
GS_PADDING = ("zeros", "border", "reflection")


def _work(dtype) -> type:
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


# ---------------------------------------------------------------------------------------------------
# GridSample
# ---------------------------------------------------------------------------------------------------
def _reflect(x, lo, hi):
    """onnxruntime's GsReflect: reflect ``x`` by the near border into [lo, hi] (vectorized)."""
    rng = hi - lo
    if rng <= 0:
        return np.full_like(x, lo)
    dlo, dhi = lo - x, x - hi
    nlo, nhi = np.trunc(dlo / rng), np.trunc(dhi / rng)
    rlo, rhi = dlo - nlo * rng, dhi - nhi * rng
    below = np.where(nlo % 2 == 0, lo + rlo, hi - rlo)
    above = np.where(nhi % 2 == 0, hi - rhi, lo + rhi)
    return np.where(x < lo, below, np.where(x > hi, above, x))


def _tap_index(i, length, pad, align):
    """(index clamped into [0, length), valid mask) of integer tap positions ``i``."""
    if pad == "zeros":
        return np.clip(i, 0, length - 1), (i >= 0) & (i < length)
    if pad == "border":
        return np.clip(i, 0, length - 1), None
    lo, hi = (0.0, length - 1.0) if align else (-0.5, length - 0.5)
    r = np.trunc(_reflect(i.astype(np.float64), lo, hi)).astype(np.int64)
    return np.clip(r, 0, length - 1), None


def _cubic_coeffs(t):
    a = -0.75
    x = np.abs(t)
    return [((a * (x + 1) - 5 * a) * (x + 1) + 8 * a) * (x + 1) - 4 * a, ((a + 2) * x - (a + 3)) * x * x + 1,
            ((a + 2) * (1 - x) - (a + 3)) * (1 - x) * (1 - x) + 1,
            ((a * (2 - x) - 5 * a) * (2 - x) + 8 * a) * (2 - x) - 4 * a]


def grid_taps(g, length, mode, pad, align):
    """Taps of one axis for normalized coordinates ``g``: a list of (index, weight, valid or None)."""
    F = g.dtype.type
    x = (g + F(1)) / F(2) * F(length - 1) if align else ((g + F(1)) * F(length) - F(1)) / F(2)
    if mode == "nearest":
        ix, ok = _tap_index(np.rint(x).astype(np.int64), length, pad, align)
        return [(ix, np.ones_like(x), ok)]
    x0 = np.floor(x)
    i0 = x0.astype(np.int64)
    if mode == "linear":
        pos, w = [i0, i0 + 1], [x0 + F(1) - x, x - x0]
    else:
        pos, w = [i0 - 1 + k for k in range(4)], _cubic_coeffs(x - x0)
    taps = []
    for p, wk in zip(pos, w):
        ix, ok = _tap_index(p, length, pad, align)
        taps.append((ix, wk, ok))
    return taps


@register_op
class GridSample(Operation):
    """ONNX GridSample: X ``[N, C, *S]`` (2 or 3 spatial dims) sampled at grid ``[N, *O, nd]`` (normalized
    coordinates in [-1, 1], the last entry ordered x, y[, z]) -> ``[N, C, *O]``, X's dtype (float16 runs in
    float32).  ``mode`` nearest / linear / cubic (cubic: 2 spatial dims), ``padding_mode`` zeros / border /
    reflection, ``align_corners`` 0 / 1.  Raises ShapeError for mismatched shapes, types or attributes."""

    name = "grid_sample"

    def __init__(self, mode="linear", padding_mode="zeros", align_corners=0):
        super().__init__(mode=str(mode), padding_mode=str(padding_mode), align_corners=int(align_corners))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 2)
        x, g = inputs
        nd = x.ndim - 2
        if x.dtype not in FLOATS or g.dtype != x.dtype:
            raise ShapeError(f"{self.name}: X {x.dtype} / grid {g.dtype} must be one float type")
        if nd not in (2, 3) or g.ndim != x.ndim or g.lens[-1] != nd or g.lens[0] != x.lens[0]:
            raise ShapeError(f"{self.name}: X {list(x.lens)} and grid {list(g.lens)} do not match (expected X "
                             f"[N, C, *S] with 2 or 3 spatial dims and grid [N, *O, {nd}])")
        if self.mode not in GS_MODES or self.padding_mode not in GS_PADDING or (self.mode == "cubic" and nd != 2):
            raise ShapeError(f"{self.name}: mode '{self.mode}' / padding_mode '{self.padding_mode}' for {nd} "
                             f"spatial dims")
        return Shape(x.dtype, list(x.lens[:2]) + list(g.lens[1:-1]))

    def compute(self, ctx, out, args, ws):
        x, g = np.asarray(args[0]), np.asarray(args[1])
        W = _work(x.dtype)
        N, C = x.shape[:2]
        spatial = x.shape[2:]
        nd = len(spatial)
        gf = g.astype(W).reshape(N, -1, nd)
        xf = x.reshape(N, C, -1)
        strides = [int(np.prod(spatial[k + 1:])) for k in range(nd)]
        # grid entry k addresses spatial axis nd - 1 - k (x: the last)
        axes = [grid_taps(gf[..., nd - 1 - a], spatial[a], self.mode, self.padding_mode, self.align_corners)
                for a in range(nd)]
        acc = np.zeros((N, C, gf.shape[1]), W)
        for combo in itertools.product(*axes):
            flat = sum(t[0] * s for t, s in zip(combo, strides))
            w = functools.reduce(np.multiply, [t[1] for t in combo])
            v = np.take_along_axis(xf, flat[:, None, :], axis=2).astype(W)
            masks = [t[2] for t in combo if t[2] is not None]
            if masks:
                v = np.where(functools.reduce(np.logical_and, masks)[:, None, :], v, W(0))
            acc += v * w[:, None, :]
        out[...] = acc.reshape(out.shape)


# ---------------------------------------------------------------------------------------------------
# RoiAlign
# ---------------------------------------------------------------------------------------------------
def _roi_axis(v, length):
    """(low, high, fraction) of sample coordinates ``v`` on one axis (onnxruntime's clamping)."""
    v = np.maximum(v, 0)
    lo = v.astype(np.int64)
    edge = lo >= length - 1
    lo = np.where(edge, length - 1, lo)
    hi = np.where(edge, length - 1, lo + 1)
    v = np.where(edge, v.dtype.type(length - 1), v)
    return lo, hi, v - lo


@register_op
class RoiAlign(Operation):
    """ONNX RoiAlign: X ``[N, C, H, W]``, rois ``[R, 4]`` (x1, y1, x2, y2 in input coordinates times
    ``spatial_scale``), batch_indices ``[R]`` int64 -> ``[R, C, output_height, output_width]``, X's dtype.
    Each bin averages (``mode`` avg) or takes the maximum (max) of ``sampling_ratio`` x ``sampling_ratio``
    bilinear samples (0: ceil(roi size / bins) per axis); ``half_pixel`` shifts coordinates by -0.5
    (else rois are at least 1 x 1).  A batch index outside [0, N) raises ExecutionError on the host; the gpu
    kernel clamps it."""

    name = "roi_align"

    def __init__(self, mode="avg", output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0,
                 half_pixel=1):
        super().__init__(mode=str(mode), output_height=int(output_height), output_width=int(output_width),
                         sampling_ratio=int(sampling_ratio), spatial_scale=float(spatial_scale),
                         half_pixel=int(half_pixel))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 3)
        x, rois, b = inputs
        if x.dtype not in FLOATS or rois.dtype != x.dtype or x.ndim != 4:
            raise ShapeError(f"{self.name}: X must be float [N, C, H, W] and rois the same type, got X {x.dtype} "
                             f"{list(x.lens)}, rois {rois.dtype}")
        if rois.ndim != 2 or rois.lens[1] != 4 or b.dtype != "int64" or list(b.lens) != [rois.lens[0]]:
            raise ShapeError(f"{self.name}: rois {list(rois.lens)} must be [R, 4] and batch_indices int64 [R], got "
                             f"{b.dtype} {list(b.lens)}")
        if self.mode not in ("avg", "max") or self.output_height < 1 or self.output_width < 1:
            raise ShapeError(f"{self.name}: mode '{self.mode}', output {self.output_height} x {self.output_width}")
        return Shape(x.dtype, [rois.lens[0], x.lens[1], self.output_height, self.output_width])

    def _geometry(self, rois, F):
        off = F(0.5) if self.half_pixel else F(0)
        r = rois.astype(F) * F(self.spatial_scale) - off
        sw, sh, ew, eh = r[:, 0], r[:, 1], r[:, 2], r[:, 3]
        rw, rh = ew - sw, eh - sh
        if not self.half_pixel:
            rw, rh = np.maximum(rw, F(1)), np.maximum(rh, F(1))
        PH, PW = self.output_height, self.output_width
        bh, bw = rh / F(PH), rw / F(PW)
        s = self.sampling_ratio
        gh = np.full(len(r), s) if s > 0 else np.ceil(rh / F(PH)).astype(np.int64)
        gw = np.full(len(r), s) if s > 0 else np.ceil(rw / F(PW)).astype(np.int64)
        return sh, sw, bh, bw, gh, gw

    def _samples(self, start, size, grid, bins, F):
        """Sample coordinates [k, bins, grid] of rois sharing one grid size."""
        p = np.arange(bins, dtype=F)[None, :, None]
        i = np.arange(grid, dtype=F)[None, None, :]
        return start[:, None, None] + p * size[:, None, None] + (i + F(0.5)) * size[:, None, None] / F(grid)

    def compute(self, ctx, out, args, ws):
        x, rois, batch = (np.asarray(a) for a in args)
        N, C, H, W = x.shape
        F = _work(x.dtype)
        if batch.size and (batch.min() < 0 or batch.max() >= N):
            bad = int(batch[(batch < 0) | (batch >= N)][0])
            raise ExecutionError(f"{self.name}: batch index {bad} is outside [0, {N})")
        sh, sw, bh, bw, gh, gw = self._geometry(rois, F)
        res = np.zeros(out.shape, F)
        for g_h, g_w in sorted(set(zip(gh.tolist(), gw.tolist()))):
            sel = np.nonzero((gh == g_h) & (gw == g_w))[0]
            if g_h <= 0 or g_w <= 0:
                continue  # no samples: 0
            chunk = max(1, (1 << 22) // max(1, C * self.output_height * self.output_width * g_h * g_w))
            for k in range(0, len(sel), chunk):
                idx = sel[k:k + chunk]
                res[idx] = self._bins(x, batch[idx], F, g_h, g_w, max(g_h * g_w, 1),
                                      self._samples(sh[idx], bh[idx], g_h, self.output_height, F),
                                      self._samples(sw[idx], bw[idx], g_w, self.output_width, F))
        out[...] = res

    def _bins(self, x, batch, F, g_h, g_w, count, yy, xx):
        """[k, C, PH, PW] for k rois with sample coordinates yy [k, PH, gh] and xx [k, PW, gw]."""
        H, W = x.shape[2:]
        oky = ~((yy < -1.0) | (yy > H))
        okx = ~((xx < -1.0) | (xx > W))
        y0, y1, ly = _roi_axis(yy, H)
        x0, x1, lx = _roi_axis(xx, W)
        hy, hx = F(1) - ly, F(1) - lx
        b = batch[:, None, None, None, None]

        def corner(yi, xi, wy, wx):
            v = x[b, :, yi[:, :, :, None, None], xi[:, None, None, :, :]].astype(F)  # [k, PH, gh, PW, gw, C]
            return v * (wy[:, :, :, None, None] * wx[:, None, None, :, :])[..., None]

        vals = [corner(y0, x0, hy, hx), corner(y0, x1, hy, lx), corner(y1, x0, ly, hx), corner(y1, x1, ly, lx)]
        ok = (oky[:, :, :, None, None] & okx[:, None, None, :, :])[..., None]
        if self.mode == "max":
            s = np.where(ok, np.maximum(np.maximum(vals[0], vals[1]), np.maximum(vals[2], vals[3])), F(0))
            r = s.max(axis=(2, 4))
        else:
            r = np.where(ok, vals[0] + vals[1] + vals[2] + vals[3], F(0)).sum(axis=(2, 4)) / F(count)
        return r.transpose(0, 3, 1, 2)


# ---------------------------------------------------------------------------------------------------
# AffineGrid
# ---------------------------------------------------------------------------------------------------
@register_op
class AffineGrid(Operation):
    """ONNX AffineGrid: theta ``[N, 2, 3]`` (or ``[N, 3, 4]``) and the constant ``size`` ``[N, C, H, W]``
    (or ``[N, C, D, H, W]``) -> the sampling grid ``[N, H, W, 2]`` (``[N, D, H, W, 3]``) of GridSample:
    theta times the normalized coordinates (x, y[, z], 1) of each output position, x along the last axis;
    ``align_corners`` 1 puts -1 and 1 at the centers of the corner positions, 0 at their outer edges.
    Computed on ``ctx.xp`` (with temporaries: not captured)."""

    name = "affine_grid"
    capturable = False

    def __init__(self, size=(), align_corners=0):
        super().__init__(size=tuple(int(v) for v in size), align_corners=int(align_corners))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        t = inputs[0]
        nd = len(self.size) - 2
        if t.dtype not in FLOATS or nd not in (2, 3) or list(t.lens) != [self.size[0], nd, nd + 1] \
                or min(self.size) < 1 or self.align_corners not in (0, 1):
            raise ShapeError(f"{self.name}: theta {t.dtype} {list(t.lens)} does not match size {list(self.size)} "
                             f"(expected float theta [N, 2, 3] with size [N, C, H, W] or [N, 3, 4] with "
                             f"[N, C, D, H, W]; align_corners {self.align_corners} must be 0 or 1)")
        return Shape(t.dtype, [self.size[0], *self.size[2:], nd])

    def _line(self, xp, n: int, W):
        """The ``n`` normalized coordinates of one spatial axis."""
        if self.align_corners:
            return xp.linspace(-1, 1, n, dtype=W)
        return (xp.arange(n, dtype=W) * W(2) + W(1)) / W(n) - W(1)

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        nd = len(self.size) - 2
        W = _work(out.dtype)
        mesh = xp.meshgrid(*[self._line(xp, n, W) for n in self.size[2:]], indexing="ij")  # spatial axes in order
        base = xp.stack([mesh[nd - 1 - k] for k in range(nd)] + [xp.ones_like(mesh[0])], axis=-1)  # x, y[, z], 1
        theta = args[0].astype(W)
        res = xp.matmul(base.reshape(1, -1, nd + 1), xp.swapaxes(theta, 1, 2))  # [N, positions, nd]
        out[...] = res.reshape(out.shape).astype(out.dtype)
