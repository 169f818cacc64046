"""View operations: reshape (when strides allow), transpose, squeeze, unsqueeze, slice with positive
steps, multibroadcast and get_tuple_elem produce a strided shape over their input's buffer and launch
no kernel, as MIGraphX's view ops do.
"""
from __future__ import annotations

import math

from ..errors import ShapeError
from ..ir.shape import Shape, broadcast_lens, standard_strides
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
