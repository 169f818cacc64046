"""Layout and data-movement operations.

View ops (reshape when strides allow, transpose, squeeze, unsqueeze, slice with positive steps,
multibroadcast, get_tuple_elem) produce a strided shape over their input's buffer and launch no kernel,
as MIGraphX's view ops do.  Copying ops (concat, pad, tile, ...) write into ``out``; the gather and
scatter family is in :mod:`.gather_scatter`.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError
from ..shape import Shape, broadcast_lens, standard_strides
from .base import Operation, check_inputs, normalize_axis, register_op


def reshape_strides(shape: Shape, new_lens) -> tuple[int, ...] | None:
    """Strides that view ``shape`` as ``new_lens`` without a copy, or None if a copy is needed.

    The rule numpy uses for a no-copy reshape: the non-unit dims are split into groups with equal
    products in the old and the new lens, and the old dims of each group must be contiguous with
    each other.
    """
    new_lens = tuple(int(d) for d in new_lens)
    if math.prod(new_lens) != shape.elements():
        return None
    if shape.standard() or shape.elements() <= 1:
        return standard_strides(new_lens)
    old = [(d, s) for d, s in zip(shape.lens, shape.strides) if d != 1]
    nonones = [i for i, d in enumerate(new_lens) if d != 1]
    n_dims = [new_lens[i] for i in nonones]
    strides = [0] * len(new_lens)
    oi = ni = 0
    while oi < len(old) and ni < len(n_dims):
        op_, np_ = old[oi][0], n_dims[ni]
        oj, nj = oi + 1, ni + 1
        while op_ != np_:
            if op_ < np_:
                op_ *= old[oj][0]
                oj += 1
            else:
                np_ *= n_dims[nj]
                nj += 1
        for k in range(oi, oj - 1):
            if old[k][1] != old[k + 1][1] * old[k + 1][0]:
                return None
        st = old[oj - 1][1]
        for k in range(nj - 1, ni - 1, -1):
            strides[nonones[k]] = st
            st *= n_dims[k]
        oi, ni = oj, nj
    for i in range(len(new_lens) - 1, -1, -1):
        if new_lens[i] == 1:
            strides[i] = strides[i + 1] * new_lens[i + 1] if i + 1 < len(new_lens) else 1
    return tuple(strides)


class View(Operation):
    is_view = True
    alloc_free = True

    def launches(self, inputs, output):
        return 0


@register_op
class Reshape(View):
    """View with new dims (``dims`` fully resolved: no 0 or -1).  Needs a viewable input."""

    name = "reshape"

    def __init__(self, dims=()):
        super().__init__(dims=[int(d) for d in dims])

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        if math.prod(self.dims) != x.elements():
            raise ShapeError(f"reshape: cannot reshape {list(x.lens)} ({x.elements()} elements) to {self.dims}")
        strides = reshape_strides(x, self.dims)
        if strides is None:
            raise ShapeError(f"reshape: input layout {x} cannot be viewed as {self.dims}; make it contiguous first")
        return Shape(x.dtype, self.dims, strides)

    def view(self, xp, x, shape):
        return _restride(xp, x, shape)


@register_op
class Transpose(View):
    name = "transpose"

    def __init__(self, permutation=()):
        super().__init__(permutation=[int(p) for p in permutation])

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x, perm = inputs[0], self.permutation
        if sorted(perm) != list(range(x.ndim)):
            raise ShapeError(f"transpose: permutation {perm} invalid for rank {x.ndim}")
        return Shape(x.dtype, [x.lens[p] for p in perm], [x.strides[p] for p in perm])

    def view(self, xp, x, shape):
        return x.transpose(self.permutation)


@register_op
class Squeeze(View):
    name = "squeeze"

    def __init__(self, axes=()):
        super().__init__(axes=[int(a) for a in axes])

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        axes = [normalize_axis(a, x.ndim, self.name) for a in self.axes] if self.axes else \
            [i for i, d in enumerate(x.lens) if d == 1]
        for a in axes:
            if x.lens[a] != 1:
                raise ShapeError(f"squeeze: axis {a} has size {x.lens[a]}, not 1 (input {list(x.lens)})")
        keep = [i for i in range(x.ndim) if i not in axes]
        return Shape(x.dtype, [x.lens[i] for i in keep], [x.strides[i] for i in keep])

    def view(self, xp, x, shape):
        return _restride(xp, x, shape)


@register_op
class Unsqueeze(View):
    name = "unsqueeze"

    def __init__(self, axes=()):
        super().__init__(axes=[int(a) for a in axes])

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        rank = x.ndim + len(self.axes)
        axes = sorted(normalize_axis(a, rank, self.name) for a in self.axes)
        if len(set(axes)) != len(axes):
            raise ShapeError(f"unsqueeze: repeated axes {self.axes}")
        lens, strides, it = [], [], iter(zip(x.lens, x.strides))
        for i in range(rank):
            if i in axes:
                lens.append(1)
                strides.append(0)
            else:
                d, s = next(it)
                lens.append(d)
                strides.append(s)
        # give size-1 dims the stride a standard layout would have, so a standard input stays standard
        std = standard_strides(lens)
        strides = [std[i] if lens[i] == 1 else strides[i] for i in range(rank)]
        if x.standard():
            strides = list(std)
        return Shape(x.dtype, lens, strides)

    def view(self, xp, x, shape):
        return _restride(xp, x, shape)


def _restride(xp, x, shape: Shape):
    """A view of ``x`` with ``shape``'s lens and strides (same buffer, same first element)."""
    return xp.lib.stride_tricks.as_strided(x, shape.lens, shape.byte_strides())


@register_op
class Slice(View):
    """Slice with resolved ``starts``/``ends``/``steps`` per ``axes`` (steps > 0 are views)."""

    name = "slice"

    def __init__(self, axes=(), starts=(), ends=(), steps=None):
        steps = [1] * len(axes) if steps is None else [int(s) for s in steps]
        super().__init__(axes=[int(a) for a in axes], starts=[int(s) for s in starts],
                         ends=[int(e) for e in ends], steps=steps)
        self.is_view = all(s > 0 for s in steps)

    def _bounds(self, x: Shape):
        out = []
        for a, s, e, st in zip(self.axes, self.starts, self.ends, self.steps):
            a = normalize_axis(a, x.ndim, self.name)
            d = x.lens[a]
            if st == 0:
                raise ShapeError("slice: step 0")
            rng = range(d)[slice(s, e, st)]
            out.append((a, rng))
        return out

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        lens, strides = list(x.lens), list(x.strides)
        for a, rng in self._bounds(x):
            lens[a] = len(rng)
            strides[a] = x.strides[a] * rng.step
        if not self.is_view:
            return Shape(x.dtype, lens)
        return Shape(x.dtype, lens, strides)

    def offset_elements(self, x: Shape) -> int:
        return sum(x.strides[a] * (rng.start if len(rng) else 0) for a, rng in self._bounds(x))

    def _index(self, ndim, x_shape):
        idx = [slice(None)] * ndim
        for a, rng in self._bounds(x_shape):
            idx[a] = slice(rng.start, rng.stop if rng.stop >= 0 else None, rng.step) if len(rng) else slice(0, 0)
        return tuple(idx)

    def view(self, xp, x, shape):
        return x[self._index(x.ndim, Shape(x.dtype.name, x.shape))]

    def compute(self, ctx, out, args, ws):  # negative steps: a copy
        x = args[0]
        ctx.xp.copyto(out, x[self._index(x.ndim, Shape(x.dtype.name, x.shape))])

    def launches(self, inputs, output):
        return 0 if self.is_view else 1


@register_op
class MultiBroadcast(View):
    name = "multibroadcast"

    def __init__(self, out_lens=()):
        super().__init__(out_lens=[int(d) for d in out_lens])

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        lens = broadcast_lens(x.lens, self.out_lens, where=self.name)
        if list(lens) != self.out_lens:
            raise ShapeError(f"multibroadcast: {list(x.lens)} does not broadcast to {self.out_lens}")
        off = len(lens) - x.ndim
        strides = [0] * off + [0 if (x.lens[i] == 1 and lens[i + off] != 1) else x.strides[i] for i in range(x.ndim)]
        return Shape(x.dtype, lens, strides)

    def view(self, xp, x, shape):
        return xp.broadcast_to(x, shape.lens)


@register_op
class GetTupleElem(View):
    name = "get_tuple_elem"

    def __init__(self, index=0):
        super().__init__(index=int(index))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        t = inputs[0]
        if not isinstance(t, tuple):
            raise ShapeError("get_tuple_elem: input is not a tuple")
        return t[self.index]

    def view(self, xp, x, shape):
        return x[self.index]


# ---------------------------------------------------------------------------------------------------
# copying ops
# ---------------------------------------------------------------------------------------------------
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
        return Shape(x.dtype, [x.lens[i] + self.pads[i] + self.pads[i + n] for i in range(n)])

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
            else:  # wrap
                if lo[d]:
                    xp.copyto(out[sl(0, lo[d])], out[sl(size, size + lo[d])])
                if hi[d]:
                    xp.copyto(out[sl(lo[d] + size, lo[d] + size + hi[d])], out[sl(lo[d], lo[d] + hi[d])])

    def launches(self, inputs, output):
        n = inputs[0].ndim
        borders = sum((self.pads[i] > 0) + (self.pads[i + n] > 0) for i in range(n))
        return 1 + (self.mode == "constant") + (0 if self.mode == "constant" else borders)


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
    keep the lower index first."""

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
        key = -x if self.largest else x
        if x.dtype.kind == "b":
            key = -x.astype(np.int8) if self.largest else x.astype(np.int8)
        elif x.dtype.kind == "u" and self.largest:
            key = np.iinfo(x.dtype).max - x  # unsigned: negation wraps around
        order = xp.argsort(key, axis=a, kind="stable") if xp is np else xp.argsort(key, axis=a)
        idx = xp.take(order, xp.arange(self.k), axis=a)
        out[1][...] = idx
        out[0][...] = xp.take_along_axis(x, idx, axis=a)


@register_op
class Unique(Operation):
    """ONNX Unique: ``(Y, indices, inverse_indices, counts)``; ``count`` (the number of unique values
    or slices) is data-dependent, specialized and guarded like NonZero's."""

    name = "unique"
    gpu_supported = False

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
