"""Gather and scatter operations: gather, gather_elements, gather_nd, scatternd, scatter_elements.

Each writes into ``out`` (no views); scatternd may write in place into its data input when the
output is bound onto a parameter (``alias``, the KV cache), see :class:`ScatterND`.  On the gpu target
gathernd runs ``gathernd.cu`` (scatternd ``scatternd.cu``, see :mod:`.gpu`): no allocation, captured.
"""
from __future__ import annotations

import functools
import os

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

    def gpu_kernel(self, inputs, output):
        """One elementwise kernel over the output: each element unravels its index over the indices'
        dims, replaces the axis coordinate by its index (negative ones wrapped, then clamped into the
        axis: no read outside ``data``) and reads ``data`` there through its strides.  Allocates
        nothing (captured); None (the generic path) for a rank-0 or empty output."""
        x, idx = inputs
        if not idx.lens or output.elements() == 0 or x.lens[self.axis % x.ndim] == 0:
            return None
        kern = _gather_elements_kernel(tuple(int(d) for d in idx.lens), self.axis % x.ndim,
                                       int(x.lens[self.axis % x.ndim]))

        def run(ctx, out, args, ws):
            kern(args[0], args[1], out)

        return run, 1, [], True, "elementwise gather_elements"


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

    def gpu_kernel(self, inputs, output):
        """``gathernd.cu``, one thread per output element (a strided data or indices input is first
        copied into a workspace); None (the generic path) for more than 4 indexed dims, an element
        size other than 1, 2, 4 or 8 bytes, or an indexed dim of size 0.  An index outside its dim is
        clamped into it there (no read outside ``data``; the host raises ExecutionError for it, and
        CuPy's indexing of the generic path wrapped it around)."""
        x, idx = inputs
        width = np.dtype(x.dtype).itemsize
        if not 1 <= idx.lens[-1] <= 4 or width not in (1, 2, 4, 8) or idx.dtype not in ("int32", "int64") \
                or not output.standard() or 0 in x.lens[self.batch_dims:self.batch_dims + idx.lens[-1]]:
            return None
        scal = [np.int64(v) for v in gathernd_geometry(x.lens, idx.lens, self.batch_dims)]
        scal[4] = np.int32(scal[4])  # q
        n, name = int(scal[0]), f"gathernd_w{width}_i{idx.dtype[3:]}"
        stage = [not x.standard(), not idx.standard()]
        ws = [Shape(s.dtype, s.lens) for s, st in zip(inputs, stage) if st]
        grid = max(1, min((n + 255) // 256, 65535))

        def run(ctx, out, args, wsa):
            args, k = list(args), 0
            for j, st in enumerate(stage):
                if st:
                    ctx.xp.copyto(wsa[k], args[j])
                    args[j], k = wsa[k], k + 1
            if n:
                _gathernd_module().get_function(name)((grid,), (256,), (args[0], args[1], out, *scal))

        return run, 1 + len(ws), ws, True, "gathernd.cu"


def gathernd_geometry(data_lens, idx_lens, batch_dims: int) -> list[int]:
    """The scalars ``gathernd.cu`` takes after its three arrays, for standard ``data`` / ``indices`` of
    these dims: ``[n (output elements), slice, rows (index tuples per batch entry), bstride, q, d0..d3
    (the indexed dims), s0..s3 (their element strides)]``, unused dims padded with 1 / 0."""
    b, q = batch_dims, idx_lens[-1]
    after = [int(np.prod(data_lens[k:])) for k in range(len(data_lens) + 1)]  # elements from dim k on
    rows = int(np.prod(idx_lens[b:-1]))
    n = int(np.prod(idx_lens[:-1])) * after[b + q]
    dims = [int(d) for d in data_lens[b:b + q]] + [1] * (4 - q)
    strides = [after[b + j + 1] for j in range(q)] + [0] * (4 - q)
    return [n, after[b + q], rows, after[b], q] + dims + strides


@functools.lru_cache(maxsize=None)
def _gather_elements_kernel(lens: tuple[int, ...], axis: int, axis_len: int):
    import cupy

    r = len(lens)
    body = (f"const ptrdiff_t L[{r}] = {{{', '.join(str(d) for d in lens)}}};\n"
            f"ptrdiff_t c[{r}]; ptrdiff_t rem = i;\n"
            f"for (int d = {r - 1}; d >= 0; --d) {{ c[d] = rem % L[d]; rem /= L[d]; }}\n"
            f"long long k = (long long)j[c];\n"
            f"if (k < 0) k += {axis_len}LL;\n"
            f"k = k < 0 ? 0 : (k >= {axis_len}LL ? {axis_len - 1}LL : k);\n"
            f"c[{axis}] = (ptrdiff_t)k;\n"
            f"y = x[c];")
    return cupy.ElementwiseKernel("raw T x, raw I j", "T y", body, f"mgx_gather_elements_r{r}")


@functools.lru_cache(maxsize=None)
def _gathernd_module():
    import cupy

    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "gathernd.cu")) as f:
        return cupy.RawModule(code=f.read())


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
