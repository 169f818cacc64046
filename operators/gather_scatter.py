"""Gather and scatter operations: gather, gather_elements, gather_nd, scatternd, scatter_elements.

Each writes into ``out`` (no views); scatternd may write in place into its data input when the
output is bound onto a parameter (``alias``, the KV cache), see :class:`ScatterND`.  On the gpu target
gathernd runs ``gathernd.cu`` (:mod:`.index_gpu`; scatternd ``scatternd.cu``, :mod:`.gpu`): no
allocation, captured.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape
from .base import Operation, check_inputs, normalize_axis, register_op


@register_op
class Gather(Operation):
    name = "gather"

    def __init__(self, axis=0):
        super().__init__(axis=int(axis))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 2)
        x, idx = inputs
        if idx.dtype not in ("int32", "int64"):
            raise ShapeError(f"gather: indices must be int32/int64, got {idx.dtype}")
        a = normalize_axis(self.axis, x.ndim, self.name)
        return Shape(x.dtype, x.lens[:a] + idx.lens + x.lens[a + 1:])

    def compute(self, ctx, out, args, ws):
        x, idx = args
        xp = ctx.xp
        a = self.axis % x.ndim
        if xp is np:
            d = x.shape[a]
            if idx.size and (idx.min() < -d or idx.max() >= d):
                raise IndexError(f"gather: index out of range [{-d}, {d}) on axis {a}")
            if not x.flags.c_contiguous:  # np.take would first copy all of x (a tied embedding: 100+ MB a step)
                out[...] = x[(slice(None),) * a + (idx,)]
                return
        xp.take(x, idx, axis=a, out=out)

    alloc_free = True


@register_op
class GatherElements(Operation):
    name = "gather_elements"

    def __init__(self, axis=0):
        super().__init__(axis=int(axis))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 2)
        x, idx = inputs
        a = normalize_axis(self.axis, x.ndim, self.name)
        if idx.ndim != x.ndim or any(i > d for k, (i, d) in enumerate(zip(idx.lens, x.lens)) if k != a):
            raise ShapeError(f"gather_elements: indices {list(idx.lens)} must have data's rank {x.ndim} and, "
                             f"off axis {a}, dims <= data's {list(x.lens)}")
        return Shape(x.dtype, idx.lens)

    def compute(self, ctx, out, args, ws):
        x, idx = args
        xp = ctx.xp
        a = self.axis % x.ndim
        idx = xp.where(idx < 0, idx + x.shape[a], idx)
        x = x[tuple(slice(None) if k == a else slice(0, n) for k, n in enumerate(idx.shape))]
        out[...] = xp.take_along_axis(x, idx, axis=a)


@register_op
class GatherND(Operation):
    name = "gathernd"

    def __init__(self, batch_dims=0):
        super().__init__(batch_dims=int(batch_dims))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 2)
        x, idx = inputs
        b, q = self.batch_dims, idx.lens[-1]
        return Shape(x.dtype, idx.lens[:-1] + x.lens[b + q:])

    def compute(self, ctx, out, args, ws):
        x, idx = args
        xp, b = ctx.xp, self.batch_dims
        q = idx.shape[-1]
        bshape = x.shape[:b]
        nb = int(np.prod(bshape)) if b else 1
        xr = x.reshape((nb,) + x.shape[b:])
        ir = idx.reshape((nb, -1, q))
        res = []
        for i in range(nb):
            ii = ir[i]
            ii = xp.where(ii < 0, ii + xp.asarray(x.shape[b:b + q]), ii)
            res.append(xr[i][tuple(ii[:, j] for j in range(q))])
        out[...] = xp.stack(res).reshape(out.shape)


@register_op
class ScatterND(Operation):
    """ONNX ScatterND: ``out = data`` then ``out[indices] (reduction)= updates``.

    ``out`` may be the buffer of ``data`` itself (``inplace_ok``): the copy is then skipped.  This
    is how a fixed-shape KV-cache update writes into the cache in place.
    """

    name = "scatternd"
    inplace_ok = True

    def __init__(self, reduction="none"):
        super().__init__(reduction=str(reduction))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 3)
        data, idx, upd = inputs
        q = idx.lens[-1]
        want = idx.lens[:-1] + data.lens[q:]
        if tuple(upd.lens) != tuple(want):
            raise ShapeError(f"scatternd: updates shape {list(upd.lens)} != expected {list(want)}")
        if upd.dtype != data.dtype:
            raise ShapeError(f"scatternd: updates type {upd.dtype} != data type {data.dtype}")
        return Shape(data.dtype, data.lens)

    def compute(self, ctx, out, args, ws):
        data, idx, upd = args
        xp = ctx.xp
        if not _same_buffer(out, data):
            xp.copyto(out, data)
        q = idx.shape[-1]
        flat_idx = idx.reshape(-1, q)
        flat_upd = upd.reshape((-1,) + tuple(data.shape[q:]))
        dims = xp.asarray(data.shape[:q], dtype=idx.dtype)
        flat_idx = xp.where(flat_idx < 0, flat_idx + dims, flat_idx)
        key = tuple(flat_idx[:, j] for j in range(q))
        if self.reduction == "none":
            out[key] = flat_upd
        else:
            ufunc = {"add": xp.add, "mul": xp.multiply, "max": xp.maximum, "min": xp.minimum}[self.reduction]
            if xp is np:
                ufunc.at(out, key, flat_upd)
            else:  # CuPy: sequential per update row keeps duplicates right
                for r in range(flat_idx.shape[0]):
                    k = tuple(int(flat_idx[r, j]) for j in range(q))
                    out[k] = ufunc(out[k], flat_upd[r])


def _same_buffer(a, b) -> bool:
    try:
        pa = a.__array_interface__["data"][0]
        pb = b.__array_interface__["data"][0]
    except AttributeError:
        pa, pb = a.data.ptr, b.data.ptr
    return pa == pb and a.shape == b.shape and a.strides == b.strides


@register_op
class ScatterElements(Operation):
    name = "scatter_elements"

    def __init__(self, axis=0, reduction="none"):
        super().__init__(axis=int(axis), reduction=str(reduction))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 3)
        return Shape(inputs[0].dtype, inputs[0].lens)

    def compute(self, ctx, out, args, ws):
        data, idx, upd = args
        xp = ctx.xp
        xp.copyto(out, data)
        a = self.axis % data.ndim
        idx = xp.where(idx < 0, idx + data.shape[a], idx)
        grid = [xp.arange(n).reshape([n if j == i else 1 for j in range(idx.ndim)]) for i, n in enumerate(idx.shape)]
        key = tuple(idx if i == a else xp.broadcast_to(grid[i], idx.shape) for i in range(data.ndim))
        if self.reduction == "none":
            out[key] = upd
        else:
            ufunc = {"add": xp.add, "mul": xp.multiply, "max": xp.maximum, "min": xp.minimum}[self.reduction]
            if xp is np:
                ufunc.at(out, key, upd)
            else:
                flat = np.ravel_multi_index(tuple(np.asarray(k.get()).ravel() for k in key), data.shape)
                vals = upd.reshape(-1)
                o = out.reshape(-1) if out.flags.c_contiguous else None
                for j, f in enumerate(flat.tolist()):
                    o[f] = ufunc(o[f], vals[j])
