"""The gpu target's kernels of the index ops (:mod:`.gather_scatter`, :mod:`.index_ops`, ArgMax /
ArgMin of :mod:`.reduce`): ``gathernd.cu``, the line kernels of ``line_ops.cu`` (one thread or block
per line along the axis: ArgMax / ArgMin, Hardmax, CumSum / CumProd, Compress's index) and CuPy
elementwise kernels (GatherElements, OneHot, ReverseSequence).  Each writes into ``out`` and declared
workspaces (a strided input is first copied into one), so it is captured; each is the op's entry in the
kernel table (:mod:`.gpu_lowering`).
"""
from __future__ import annotations

import functools
import os

import numpy as np

from ..ir.shape import Shape
from .gpu_kernel import GpuKernel
from .gpu_lowering import gpu_kernel_for
from .index_ops import _CTYPES, BLOCK, _lines, _staged, _standard, line_function

_HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------------------------------------------
# gather_elements, gathernd
# ---------------------------------------------------------------------------------------------------
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


@gpu_kernel_for("gather_elements")
def _lower_gather_elements(op, inputs, output, ins) -> GpuKernel | None:
    """One elementwise kernel over the output: each element unravels its index over the indices'
    dims, replaces the axis coordinate by its index (negative ones wrapped, then clamped into the
    axis: no read outside ``data``) and reads ``data`` there through its strides.  Allocates
    nothing (captured); None (the generic path) for a rank-0 or empty output."""
    x, idx = inputs
    if not idx.lens or output.elements() == 0 or x.lens[op.axis % x.ndim] == 0:
        return None
    kern = _gather_elements_kernel(tuple(int(d) for d in idx.lens), op.axis % x.ndim,
                                   int(x.lens[op.axis % x.ndim]))

    def run(ctx, out, args, ws):
        kern(args[0], args[1], out)

    return GpuKernel(run, 1, [], True, "elementwise gather_elements")


@functools.lru_cache(maxsize=None)
def _gathernd_module():
    import cupy

    with open(os.path.join(_HERE, "gathernd.cu")) as f:
        return cupy.RawModule(code=f.read())


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


@gpu_kernel_for("gathernd")
def _lower_gathernd(op, inputs, output, ins) -> GpuKernel | None:
    """``gathernd.cu``, one thread per output element (a strided data or indices input is first
    copied into a workspace); None (the generic path) for more than 4 indexed dims, an element
    size other than 1, 2, 4 or 8 bytes, or an indexed dim of size 0.  An index outside its dim is
    clamped into it there (no read outside ``data``; the host raises ExecutionError for it, and
    CuPy's indexing of the generic path wrapped it around)."""
    x, idx = inputs
    width = np.dtype(x.dtype).itemsize
    if not 1 <= idx.lens[-1] <= 4 or width not in (1, 2, 4, 8) or idx.dtype not in ("int32", "int64") \
            or not output.standard() or 0 in x.lens[op.batch_dims:op.batch_dims + idx.lens[-1]]:
        return None
    scal = [np.int64(v) for v in gathernd_geometry(x.lens, idx.lens, op.batch_dims)]
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

    return GpuKernel(run, 1 + len(ws), ws, True, "gathernd.cu")


# ---------------------------------------------------------------------------------------------------
# the line kernels of line_ops.cu
# ---------------------------------------------------------------------------------------------------
@gpu_kernel_for("argmax", "argmin")
def _lower_argext(op, inputs, output, ins) -> GpuKernel | None:
    """One block per line (``mgx_argext``); a strided input is first copied to a workspace."""
    x = inputs[0]
    if x.dtype not in _CTYPES or x.elements() == 0:
        return None
    a = op.axis % x.ndim
    outer, n, inner = _lines(x.lens, a)
    ws = _standard(x)
    is_min, last = int(op.name == "argmin"), int(op.select_last_index)

    def run(ctx, out, args, wsa):
        src = _staged(ctx, args[0], wsa)
        k = line_function(x.dtype, "mgx_argext")
        k((outer * inner,), (BLOCK,), (src, out, np.int64(n), np.int64(inner), np.int32(is_min), np.int32(last)))

    return GpuKernel(run, 1 + len(ws), ws, True, "line_ops.cu argext")


@gpu_kernel_for("hardmax")
def _lower_hardmax(op, inputs, output, ins) -> GpuKernel | None:
    x = inputs[0]
    if x.elements() == 0:
        return None
    a = op.axis % x.ndim
    outer, n, inner = _lines(x.lens, a)
    ws = _standard(x)

    def run(ctx, out, args, wsa):
        src = _staged(ctx, args[0], wsa)
        line_function(x.dtype, "mgx_hardmax")((outer * inner,), (BLOCK,),
                                                         (src, out, np.int64(n), np.int64(inner)))

    return GpuKernel(run, 1 + len(ws), ws, True, "line_ops.cu hardmax")


@gpu_kernel_for("cumsum", "cumprod")
def _lower_scan(op, inputs, output, ins) -> GpuKernel | None:
    x = inputs[0]
    if x.elements() == 0 or x.ndim == 0:
        return None
    outer, n, inner = _lines(x.lens, op.axis % x.ndim)
    lines = outer * inner
    ws = _standard(x)
    grid = (lines + BLOCK - 1) // BLOCK

    def run(ctx, out, args, wsa):
        src = _staged(ctx, args[0], wsa)
        line_function(x.dtype, f"mgx_{op.name}")(
            (grid,), (BLOCK,), (src, out, np.int64(lines), np.int64(n), np.int64(inner),
                                np.int32(op.exclusive), np.int32(op.reverse)))

    return GpuKernel(run, 1 + len(ws), ws, True, f"line_ops.cu {op.name}")


@gpu_kernel_for("compress")
def _lower_compress(op, inputs, output, ins) -> GpuKernel | None:
    x, cond = inputs
    if not cond.standard():
        return None
    ws = [Shape("int64", [max(op.count, 1)])]
    n = cond.lens[0]
    a = op.axis % x.ndim

    def run(ctx, out, args, wsa):
        if op.count == 0:
            return
        idx = wsa[0]
        line_function("int64", "mgx_compress_index")((1,), (1,), (args[1], np.int64(n), idx))
        ctx.xp.take(args[0], idx, axis=a, out=out)

    return GpuKernel(run, 2, ws, True, "line_ops.cu compress")


# ---------------------------------------------------------------------------------------------------
# elementwise kernels
# ---------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _onehot_kernel():
    import cupy

    return cupy.ElementwiseKernel("I ind, I pos, T off, T on, I depth", "T y",
                                  "I v = ind < 0 ? ind + depth : ind; y = (v == pos) ? on : off;", "mgx_onehot")


@gpu_kernel_for("onehot")
def _lower_onehot(op, inputs, output, ins) -> GpuKernel | None:
    def run(ctx, out, args, ws):
        ind, pos, val = args
        flat = val.reshape(-1)
        _onehot_kernel()(ind, pos, flat[0], flat[1], ind.dtype.type(op.depth), out)

    return GpuKernel(run, 1, [], True, "elementwise onehot")


@functools.lru_cache(maxsize=None)
def _revseq_kernel():
    import cupy

    body = """
    long long r = i % rest, j = i / rest, a1 = j % d1, a0 = j / d1;
    long long b = batch_axis == 0 ? a0 : a1, t = batch_axis == 0 ? a1 : a0;
    long long L = (long long)lens[b];
    L = L < 0 ? 0 : (L > steps ? steps : L);
    long long tt = t < L ? L - 1 - t : t;
    long long s0 = batch_axis == 0 ? a0 : tt, s1 = batch_axis == 0 ? tt : a1;
    y = x[(s0 * d1 + s1) * rest + r];
    """
    return cupy.ElementwiseKernel("raw T x, raw I lens, int64 d1, int64 rest, int64 steps, int32 batch_axis", "T y",
                                  body, "mgx_reverse_sequence")


@gpu_kernel_for("reverse_sequence")
def _lower_reverse_sequence(op, inputs, output, ins) -> GpuKernel | None:
    x = inputs[0]
    d1 = x.lens[1]
    rest = int(np.prod(x.lens[2:])) if x.ndim > 2 else 1
    steps = x.lens[op.time_axis]

    def run(ctx, out, args, ws):
        _revseq_kernel()(args[0], args[1], np.int64(d1), np.int64(rest), np.int64(steps),
                         np.int32(op.batch_axis), out)

    return GpuKernel(run, 1, [], True, "elementwise reverse_sequence")
