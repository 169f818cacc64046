"""The core kernels of the ``gpu`` target: its entries for ``dot`` (the one-row GEMV of
:mod:`.gemv_gpu`, else one strided-batched GEMM through the vendor BLAS), ``scatternd``
(``scatternd.cu``) and ``rms_norm`` (two kernels) in the kernel table (:mod:`.gpu_lowering`), and the
reductions and the GEMM the target context runs for the ops' ``ctx.reduce`` / ``ctx.matmul``.
"""
from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from ..ir.shape import Shape
from .gpu_kernel import HEADER, GpuKernel, compiled_function
from .gpu_lowering import gpu_kernel_for

_HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------------------------------------------
# reductions (one kernel each, accumulating in float / double / the integer type)
# ---------------------------------------------------------------------------------------------------
_CTYPES = {"int8": "signed char", "uint8": "unsigned char", "int16": "short", "uint16": "unsigned short",
           "int32": "int", "uint32": "unsigned int", "int64": "long long", "uint64": "unsigned long long"}


@functools.lru_cache(maxsize=None)
def reduction_kernel(kind: str, dtype: str):
    import cupy

    if dtype in ("float16", "float32"):
        acc, lo, hi = "float", "__int_as_float(0xff800000)", "__int_as_float(0x7f800000)"
    elif dtype == "float64":
        acc, lo, hi = "double", "__longlong_as_double(0xfff0000000000000ULL)", "__longlong_as_double(0x7ff0000000000000ULL)"
    elif dtype in _CTYPES:
        acc = _CTYPES[dtype]
        info = np.iinfo(dtype)
        lo, hi = f"(({acc})({int(info.min) + 1}) - 1)" if info.min < 0 else "0", f"(({acc}){int(info.max)}U)" \
            if info.min >= 0 else f"(({acc}){int(info.max)})"
    else:
        raise TypeError(f"no GPU reduction for {dtype}")
    # max / min propagate NaN (``a != a``), as numpy's amax / amin on the ref target do
    reduce_expr = {"sum": "a + b", "mean": "a + b", "prod": "a * b", "max": "((a > b || a != a) ? a : b)",
                   "min": "((a < b || a != a) ? a : b)"}[kind]
    identity = {"sum": "0", "mean": "0", "prod": "1", "max": lo, "min": hi}[kind]
    # parameter names are substituted textually by CuPy: keep them distinct from every other token
    post = ("out_v = (T)((double)a / ((double)_in_ind.size() / (double)_out_ind.size()))" if kind == "mean"
            else "out_v = (T)a")
    return cupy.ReductionKernel("T in_v", "T out_v", "(mgx_acc)in_v", reduce_expr, post, identity,
                                name=f"mgx_reduce_{kind}", reduce_type=acc, preamble=f"typedef {acc} mgx_acc;")


FULL_REDUCE_MAX = 1 << 22  # elements a one-block full reduction takes (a larger one runs as CuPy reduces)
FULL_REDUCE_THREADS = 1024


def full_reduction_source(kind: str, dtype: str) -> str:
    """The source of ``mgx_full_reduce(x, out, n)``: ``out[0]`` = the ``kind`` reduction (sum, mean,
    prod, max, min; max / min propagate NaN as :func:`reduction_kernel` does) of the ``n`` contiguous
    elements of ``x``, by one block of :data:`FULL_REDUCE_THREADS` threads (strided partial values,
    then a shared-memory tree), accumulated in float for float16 / float32, double for float64."""
    ctype = {"float16": "__half", "float32": "float", "float64": "double"}.get(dtype) or _CTYPES[dtype]
    acc = {"float16": "float", "float32": "float", "float64": "double"}.get(dtype, ctype)
    if dtype in ("float16", "float32"):
        lo, hi = "__int_as_float(0xff800000)", "__int_as_float(0x7f800000)"
    elif dtype == "float64":
        lo, hi = "__longlong_as_double(0xfff0000000000000ULL)", "__longlong_as_double(0x7ff0000000000000ULL)"
    else:
        info = np.iinfo(dtype)
        lo = f"(({acc})({int(info.min) + 1}) - 1)" if info.min < 0 else "0"
        hi = f"(({acc}){int(info.max)}U)" if info.min >= 0 else f"(({acc}){int(info.max)})"
    combine = {"sum": "a + b", "mean": "a + b", "prod": "a * b", "max": "((a > b || a != a) ? a : b)",
               "min": "((a < b || a != a) ? a : b)"}[kind]
    identity = {"sum": "0", "mean": "0", "prod": "1", "max": lo, "min": hi}[kind]
    post = "r / (A)n" if kind == "mean" else "r"
    return HEADER + f"""typedef {ctype} T;
typedef {acc} A;
__device__ __forceinline__ A mgx_combine(A a, A b) {{ return {combine}; }}
extern "C" __global__ void __launch_bounds__({FULL_REDUCE_THREADS}) mgx_full_reduce(const T* x, T* out, long long n) {{
    __shared__ A sm[{FULL_REDUCE_THREADS}];
    const int tid = threadIdx.x;
    A a = (A)({identity});
    for (long long i = tid; i < n; i += blockDim.x) a = mgx_combine(a, (A)x[i]);
    sm[tid] = a;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {{
        if (tid < s) sm[tid] = mgx_combine(sm[tid], sm[tid + s]);
        __syncthreads();
    }}
    if (tid == 0) {{
        const A r = sm[0];
        out[0] = (T)({post});
    }}
}}
"""


def full_reduction(kind: str, x, out) -> bool:
    """Reduce every element of ``x`` (C-contiguous, at most :data:`FULL_REDUCE_MAX` elements, a numeric
    type) into the one element of ``out`` with one launch that allocates nothing (capturable: CuPy's
    reductions of large arrays run in two passes over a temporary they allocate); False when ``x`` does
    not qualify (the caller reduces otherwise)."""
    dtype = x.dtype.name
    if kind not in ("sum", "mean", "prod", "max", "min") or out.size != 1 or x.size == 0 or \
            x.size > FULL_REDUCE_MAX or not x.flags.c_contiguous or not out.flags.c_contiguous or \
            dtype not in ("float16", "float32", "float64", *_CTYPES):
        return False
    fn = compiled_function(full_reduction_source(kind, dtype), "mgx_full_reduce")
    fn((1,), (FULL_REDUCE_THREADS,), (x, out, np.int64(x.size)))
    return True


# ---------------------------------------------------------------------------------------------------
# dot: strided-batched GEMM through the vendor BLAS
# ---------------------------------------------------------------------------------------------------
def _matrix_layout(lens, strides):
    """(transposed, ld) of the last two dims as a BLAS operand, or None if not representable."""
    R, C = lens[-2], lens[-1]
    sr, sc = strides[-2], strides[-1]
    if (sc == 1 or C == 1) and (R == 1 or sr >= max(C, 1)):
        return False, (max(C, 1) if R == 1 else sr)
    if (sr == 1 or R == 1) and (C == 1 or sc >= max(R, 1)):
        return True, (max(R, 1) if C == 1 else sc)
    return None


def _batch_stride(lens, strides, batch_lens):
    """One stride s with offset(b) = flat(b) * s over the broadcast batch dims, or None."""
    nb = len(batch_lens)
    off = nb - (len(lens) - 2)
    bstr = []
    for i, d in enumerate(batch_lens):
        j = i - off
        if j < 0 or lens[j] == 1:
            bstr.append(0)
        else:
            bstr.append(strides[j])
    dims = [(d, s) for d, s in zip(batch_lens, bstr) if d != 1]
    if not dims:
        return 0
    if all(s == 0 for _, s in dims):
        return 0
    s = dims[-1][1]
    acc = s
    for d, st in reversed(dims):
        if st != acc:
            return None
        acc *= d
    return s


def _dot_kernel(op, in_shapes, out_shape) -> GpuKernel | None:
    a, b = in_shapes
    if a.dtype not in ("float16", "float32", "float64"):
        return None
    M, K, N = a.lens[-2], a.lens[-1], b.lens[-1]
    batch_lens = tuple(out_shape.lens[:-2])
    batch = int(np.prod(batch_lens)) if batch_lens else 1
    ws: list[Shape] = []
    plans: list[tuple[tuple[bool, Any], Any, int | None]] = []
    for idx, s in enumerate((a, b)):
        lay = _matrix_layout(s.lens, s.strides)
        bs = _batch_stride(s.lens, s.strides, batch_lens) if lay else None
        if lay is None or bs is None:
            # materialize: contiguous, broadcast to the full batch
            full = Shape(s.dtype, batch_lens + tuple(s.lens[-2:]))
            ws.append(full)
            lay = (False, max(full.lens[-1], 1))
            bs = full.lens[-2] * full.lens[-1] if batch > 1 else 0
            plans.append((lay, bs, len(ws) - 1))
        else:
            plans.append((lay, bs, None))
    (ta, lda), sa, wa = plans[0]
    (tb, ldb), sb, wb = plans[1]
    # fold the batch into M when B is shared and A's rows are uniformly strided across the batch
    m_eff, batch_eff, sa_eff = M, batch, sa
    if batch > 1 and sb == 0 and not ta and sa == M * lda:
        m_eff, batch_eff, sa_eff = M * batch, 1, 0
    ldc, sc = max(N, 1), M * N
    dtype = np.dtype(a.dtype)
    launches = 1 + (wa is not None) + (wb is not None)

    def run(ctx, out, args, ws_arrays):
        xa, xb = args
        if wa is not None:
            ctx.xp.copyto(ws_arrays[wa], ctx.xp.broadcast_to(xa, ws_arrays[wa].shape))
            xa = ws_arrays[wa]
        if wb is not None:
            ctx.xp.copyto(ws_arrays[wb], ctx.xp.broadcast_to(xb, ws_arrays[wb].shape))
            xb = ws_arrays[wb]
        if M == 0 or N == 0:
            return
        if K == 0:
            out.fill(0)
            return
        ctx.blas(ctx.current_queue).gemm(xa.data.ptr, ta, lda, sa_eff, xb.data.ptr, tb, ldb, sb, out.data.ptr, ldc,
                                         sc, m_eff, N, K, batch_eff, dtype)

    return GpuKernel(run, launches, ws, True, f"gemm{'_batched' if batch_eff > 1 else ''}")


def blas_matmul(ctx, a, b, out) -> None:
    """``out = a @ b`` (2-D, or 3-D batched with a shared or batched operand) with the layouts read from
    the arrays at run time; raises TypeError when an operand is not a BLAS layout (callers copy first)."""
    from ..ir.shape import Shape as _S

    sa = _S(a.dtype.name, a.shape, [s // a.itemsize for s in a.strides])
    sb = _S(b.dtype.name, b.shape, [s // b.itemsize for s in b.strides])
    so = _S(out.dtype.name, out.shape)
    k = _dot_kernel(None, [sa, sb], so)
    if k is None or k.workspace:
        raise TypeError(f"matmul: operands {a.shape}/{a.strides} and {b.shape}/{b.strides} need a copy")
    k.fn(ctx, out, [a, b], [])


# ---------------------------------------------------------------------------------------------------
# scatternd
# ---------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _scatternd_module():
    import cupy

    with open(os.path.join(_HERE, "scatternd.cu")) as f:
        return cupy.RawModule(code=f.read())


def _scatternd_kernel(op, in_shapes, out_shape) -> GpuKernel | None:
    """``scatternd.cu`` after the copy of ``data`` into ``out`` (none when ``out`` is ``data``'s own
    buffer); strided indices or updates are first copied into a workspace (one launch each)."""
    data, idx, upd = in_shapes
    q = idx.lens[-1]
    trailing = len(data.lens) - q
    if op.reduction != "none" or q > 4 or trailing > 5:
        return None
    width = np.dtype(data.dtype).itemsize
    if width not in (1, 2, 4, 8) or idx.dtype not in ("int32", "int64"):
        return None
    name = f"scatternd_w{width}_i{idx.dtype[3:]}"
    dims = list(data.lens[:q]) + [1] * (4 - q)
    strides = list(out_shape.strides[:q]) + [0] * (4 - q)
    tdims = [1] * (5 - trailing) + list(data.lens[q:])
    tstrides = [0] * (5 - trailing) + list(out_shape.strides[q:])
    n = upd.elements()
    slice_ = int(np.prod(data.lens[q:])) if trailing else 1
    block = 256
    grid = max(1, min((n + block - 1) // block, 65535))
    scal = [np.int64(n), np.int64(slice_), np.int32(q)] + [np.int64(v) for v in dims + strides + tdims + tstrides]
    stage = [not idx.standard(), not upd.standard()]
    ws = [Shape(s.dtype, s.lens) for s, st in zip((idx, upd), stage) if st]

    def run(ctx, out, args, wsa):
        d, i, u = args
        if stage[0]:
            ctx.xp.copyto(wsa[0], i)
            i = wsa[0]
        if stage[1]:
            ctx.xp.copyto(wsa[-1], u)
            u = wsa[-1]
        if out.data.ptr != d.data.ptr or out.strides != d.strides:
            ctx.xp.copyto(out, d)
        if n:
            k = _scatternd_module().get_function(name)
            k((grid,), (block,), (out, i, u, *scal))

    return GpuKernel(run, 2 + len(ws), ws, True, "scatternd.cu", bound_copies=True)


# ---------------------------------------------------------------------------------------------------
# rms_norm: a sum-of-squares reduction (float accumulation) and one elementwise kernel
# ---------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _sumsq_kernel(acc: str):
    import cupy

    return cupy.ReductionKernel("T in_v", "S out_v", "(S)in_v * (S)in_v", "a + b", "out_v = a", "0",
                                name="mgx_sumsq", reduce_type=acc)


@functools.lru_cache(maxsize=None)
def _rms_scale_kernel(acc: str, weighted: bool, inv_n: float, eps: float):
    import cupy

    w_in, w_mul = (", W w", " * (C)w") if weighted else ("", "")
    body = f"y = (T)((C)x * (C(1) / sqrt(s * C({inv_n!r}) + C({eps!r}))){w_mul})"
    return cupy.ElementwiseKernel(f"T x, S s{w_in}", "T y", body, "mgx_rms_scale",
                                  preamble=f"typedef {acc} C;")


def _rms_norm_kernel(op, in_shapes, out_shape) -> GpuKernel | None:
    x = in_shapes[0]
    nd = x.ndim
    if op.axis % nd != nd - 1:
        return None
    acc = "double" if x.dtype == "float64" else "float"
    sdt = "float64" if x.dtype == "float64" else "float32"
    ws = [Shape(sdt, list(x.lens[:-1]) + [1])]
    inv_n, eps = 1.0 / max(x.lens[-1], 1), float(op.epsilon)
    weighted = len(in_shapes) > 1

    def run(ctx, out, args, ws_arrays):
        s = ws_arrays[0]
        _sumsq_kernel(acc)(args[0], s, axis=(nd - 1,), keepdims=True)
        _rms_scale_kernel(acc, weighted, inv_n, eps)(*args[:1], s, *args[1:], out)

    return GpuKernel(run, 2, ws, True, "rms_norm (2 kernels)")


# ---------------------------------------------------------------------------------------------------
# the table's entries
# ---------------------------------------------------------------------------------------------------
@gpu_kernel_for("dot")
def _lower_dot(op, inputs, output, ins) -> GpuKernel | None:
    """A one-row ``dot`` against a constant weight: the GEMV of :mod:`.gemv_gpu` (``MIGRAPHX_GEMV``);
    otherwise one strided-batched GEMM (None: a type the BLAS does not take, the generic kernel)."""
    from .gemv_gpu import dot_gemv_kernel

    k = dot_gemv_kernel(ins, inputs, output) if ins is not None else None
    return k if k is not None else _dot_kernel(op, inputs, output)


@gpu_kernel_for("scatternd")
def _lower_scatternd(op, inputs, output, ins) -> GpuKernel | None:
    return _scatternd_kernel(op, inputs, output)


@gpu_kernel_for("rms_norm")
def _lower_rms_norm(op, inputs, output, ins) -> GpuKernel | None:
    return _rms_norm_kernel(op, inputs, output)
