"""Data-movement operations that write into ``out``: concat, tile, pad, nonzero, topk, unique.  The view
ops are in :mod:`.views`, the gather and scatter family in :mod:`.gather_scatter`.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape
from .base import Operation, check_inputs, normalize_axis, register_op
from .index_ops import topk_order


@register_op
class Concat(Operation):
    name = "concat"
    alloc_free = True

    def __init__(self, axis=0):
        super().__init__(axis=int(axis))

    def compute_shape(self, inputs, mods=()):
        if not inputs:
            raise ShapeError("concat: no inputs")
        x = inputs[0]
        a = normalize_axis(self.axis, x.ndim, self.name)
        lens = list(x.lens)
        for s in inputs[1:]:
            if s.ndim != x.ndim or any(s.lens[i] != x.lens[i] for i in range(x.ndim) if i != a):
                raise ShapeError(f"concat: shapes {[list(i.lens) for i in inputs]} differ off axis {a}")
            if s.dtype != x.dtype:
                raise ShapeError(f"concat: types differ ({x.dtype} vs {s.dtype})")
            lens[a] += s.lens[a]
        return Shape(x.dtype, lens)

    def compute(self, ctx, out, args, ws):
        a = self.axis % out.ndim
        pos = 0
        for x in args:  # one copy per input, no temporaries
            n = x.shape[a]
            idx = (slice(None),) * a + (slice(pos, pos + n),)
            ctx.xp.copyto(out[idx], x)
            pos += n

    def launches(self, inputs, output):
        return sum(1 for s in inputs if s.elements())


@register_op
class Tile(Operation):
    name = "tile"

    def __init__(self, repeats=()):
        super().__init__(repeats=[int(r) for r in repeats])

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        if len(self.repeats) != x.ndim:
            raise ShapeError(f"tile: {len(self.repeats)} repeats for rank {x.ndim}")
        return Shape(x.dtype, [d * r for d, r in zip(x.lens, self.repeats)])

    def compute(self, ctx, out, args, ws):
        out[...] = ctx.xp.tile(args[0], self.repeats)


@register_op
class Pad(Operation):
    """Pad with resolved ``pads`` ([begin..., end...], may be negative), mode constant/reflect/edge/wrap."""

    name = "pad"

    def __init__(self, pads=(), mode="constant", value=0.0):
        super().__init__(pads=[int(p) for p in pads], mode=str(mode), value=float(value))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        n = x.ndim
        if len(self.pads) != 2 * n:
            raise ShapeError(f"pad: {len(self.pads)} pads for rank {n}")
        if self.mode != "constant":
            for i in range(n):  # edge / reflect / wrap copy from the axis: nothing to copy from an empty one
                kept, most = self._kept(x.lens, i), max(self.pads[i], self.pads[i + n])
                if kept <= 0 and most > 0:
                    raise ShapeError(f"pad: mode '{self.mode}' cannot pad axis {i}, which holds no values (length "
                                     f"{x.lens[i]}, pads {self.pads[i]} / {self.pads[i + n]})")
                if self.mode == "reflect" and most >= kept > 0:  # as onnxruntime: one reflection, no repeats
                    raise ShapeError(f"pad: mode 'reflect' pads axis {i} by {most}, which must be less than the "
                                     f"{kept} values it reflects")
        return Shape(x.dtype, [x.lens[i] + self.pads[i] + self.pads[i + n] for i in range(n)])

    def _kept(self, lens, i: int) -> int:
        """Values of axis ``i`` left after the negative pads crop it."""
        n = len(lens)
        return lens[i] + min(self.pads[i], 0) + min(self.pads[i + n], 0)

    def is_alloc_free(self, inputs):
        # reflect / edge / wrap copy between overlapping parts of ``out``: CuPy stages such copies in a
        # temporary, so only constant padding can be captured
        return self.mode == "constant"

    def compute(self, ctx, out, args, ws):
        """Into ``out`` with copies only: crop (negative pads), fill / copy the interior, then each padded
        dim's borders from ``out`` itself (so corners come out right), as numpy.pad does."""
        xp, x = ctx.xp, args[0]
        n = x.ndim
        crop = tuple(slice(max(-self.pads[i], 0), x.shape[i] - max(-self.pads[i + n], 0)) for i in range(n))
        x = x[crop]
        lo = [max(self.pads[i], 0) for i in range(n)]
        hi = [max(self.pads[i + n], 0) for i in range(n)]
        if self.mode == "constant":
            out.fill(out.dtype.type(self.value))
        interior = tuple(slice(lo[d], lo[d] + x.shape[d]) for d in range(n))
        xp.copyto(out[interior], x)
        if self.mode == "constant":
            return
        for d in range(n):
            size = x.shape[d]
            if not (lo[d] or hi[d]):
                continue

            def sl(a, b, step=1):
                return tuple(slice(a, b, step) if k == d else slice(None) for k in range(n))

            if self.mode == "edge":
                if lo[d]:
                    xp.copyto(out[sl(0, lo[d])], out[sl(lo[d], lo[d] + 1)])
                if hi[d]:
                    xp.copyto(out[sl(lo[d] + size, lo[d] + size + hi[d])], out[sl(lo[d] + size - 1, lo[d] + size)])
            elif self.mode == "reflect":
                if lo[d]:
                    xp.copyto(out[sl(0, lo[d])], out[sl(2 * lo[d], lo[d], -1)])
                if hi[d]:
                    e = lo[d] + size
                    xp.copyto(out[sl(e, e + hi[d])], out[sl(e - 2, e - 2 - hi[d] if e - 2 - hi[d] >= 0 else None, -1)])
            else:  # wrap: each copy reads ``size`` places further in (filled already), so pads longer than
                # the axis repeat it
                end = lo[d]
                while end > 0:
                    start = max(0, end - size)
                    xp.copyto(out[sl(start, end)], out[sl(start + size, end + size)])
                    end = start
                start, stop = lo[d] + size, lo[d] + size + hi[d]
                while start < stop:
                    end = min(stop, start + size)
                    xp.copyto(out[sl(start, end)], out[sl(start - size, end - size)])
                    start = end

    def launches(self, inputs, output):
        lens = inputs[0].lens
        n = len(lens)
        if self.mode == "constant":
            return 2
        copies = 0
        for i in range(n):
            size = max(self._kept(lens, i), 1)
            for p in (self.pads[i], self.pads[i + n]):
                copies += (-(-p // size) if self.mode == "wrap" else 1) if p > 0 else 0
        return 1 + copies


@register_op
class NonZero(Operation):
    """Indices of the non-zero elements, ``[rank, count]`` int64 (row-major order, as numpy).

    ``count`` is data-dependent: a program is specialized for the count it saw, and a ``guard`` checks
    it on every run (see :mod:`mgx_graph.operators.dynamic`)."""

    name = "nonzero"

    def __init__(self, count=0):
        super().__init__(count=int(count))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        return Shape("int64", [max(inputs[0].ndim, 1), self.count])

    def compute(self, ctx, out, args, ws):
        x = args[0]
        idx = ctx.xp.nonzero(x.reshape(1) if x.ndim == 0 else x)
        out[...] = ctx.xp.stack(idx) if idx else out


@register_op
class TopK(Operation):
    """Values and indices of the ``k`` largest (or smallest) elements along ``axis`` (ONNX TopK); ties
    keep the lower index first, NaN ranks above +inf (as onnxruntime's CPU kernel orders them from 1.32
    on, and PyTorch; the ONNX spec leaves NaN unordered)."""

    name = "topk"

    def __init__(self, k=1, axis=-1, largest=1, sorted=1):
        super().__init__(k=int(k), axis=int(axis), largest=int(largest), sorted=int(sorted))

    def compute_shape(self, inputs, mods=()):
        x = inputs[0]
        a = normalize_axis(self.axis, x.ndim, self.name)
        if self.k > x.lens[a]:
            raise ShapeError(f"topk: k={self.k} exceeds dim {x.lens[a]} of axis {a}")
        lens = list(x.lens)
        lens[a] = self.k
        return (Shape(x.dtype, lens), Shape("int64", lens))

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        a = self.axis % x.ndim
        idx = xp.take(topk_order(xp, x, a, self.largest), xp.arange(self.k), axis=a)
        out[1][...] = idx
        out[0][...] = xp.take_along_axis(x, idx, axis=a)


@register_op
class Unique(Operation):
    """ONNX Unique: ``(Y, indices, inverse_indices, counts)``; ``count`` (the number of unique values
    or slices) is data-dependent, specialized and guarded like NonZero's."""

    name = "unique"

    def __init__(self, count=0, axis=None, sorted=1):
        super().__init__(count=int(count), axis=None if axis is None else int(axis), sorted=int(sorted))

    def compute_shape(self, inputs, mods=()):
        x = inputs[0]
        u = self.count
        if self.axis is None:
            return (Shape(x.dtype, [u]), Shape("int64", [u]), Shape("int64", [x.elements()]), Shape("int64", [u]))
        a = normalize_axis(self.axis, x.ndim, self.name)
        lens = list(x.lens)
        lens[a] = u
        return (Shape(x.dtype, lens), Shape("int64", [u]), Shape("int64", [x.lens[a]]), Shape("int64", [u]))

    def compute(self, ctx, out, args, ws):
        x = np.asarray(args[0])
        if self.axis is None:
            vals, idx, inv, cnt = np.unique(x.reshape(-1), return_index=True, return_inverse=True, return_counts=True)
        else:
            vals, idx, inv, cnt = np.unique(x, axis=self.axis % x.ndim, return_index=True, return_inverse=True,
                                            return_counts=True)
        inv = inv.reshape(-1)
        if not self.sorted:  # order of first occurrence
            order = np.argsort(idx, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            vals = np.take(vals, order, axis=0 if self.axis is None else self.axis % x.ndim)
            idx, cnt, inv = idx[order], cnt[order], rank[inv]
        out[0][...] = vals
        out[1][...] = idx
        out[2][...] = inv
        out[3][...] = cnt
