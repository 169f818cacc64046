"""The ONNX LSTM (``lstm``) on the gpu target: per direction one GEMM of the input projection over
every time step, then per step one GEMM of the hidden state and one kernel of ``lstm.cu`` for the gates.

Per direction ``d`` (time runs ``T-1 .. 0`` for ``reverse`` and the second direction of
``bidirectional``)::

    G [T*B, 4H] = X [T*B, I] @ W[d]^T                                   1 GEMM (ctx.matmul)
    per step t:  hr [B, 4H] = h @ R[d]^T                                1 GEMM (h: initial_h[d] or Y[t', d])
                 c, Y[t, d] (and Y_h[d], Y_c[d] at the last step) =
                     lstm_step(G[t], hr, Wb[d], Rb[d], c)                1 kernel (mgx_lstm_step)

so ``1 + 2 T`` launches a direction (one more when initial_c is omitted: the cell workspace is filled
with 0; an omitted initial_h replaces the first step's GEMM by a fill of ``hr``), plus one copy for each
input that is not standard layout.  The hidden state is read back from ``Y`` (its rows ``[B, H]`` are
contiguous), the cell state lives in a ``[B, H]`` workspace.  Every result is written into the output
or a planned workspace and ``ctx.matmul`` is vendor BLAS, so the kernel is captured.

Element types float16 (compute in float32, rounded at the stores), float32 and float64; the gate math
is that of :class:`~mgx_graph.operators.nn.LSTM` (ONNX gate order i, o, f, c).
Source: ONNX operator spec (LSTM-22).

``dynamic_quantize_lstm`` (:class:`~mgx_graph.operators.dq_lstm.DynamicQuantizeLSTM`) runs the kernels
of ``dq_lstm.cu``: one quantizes X, one computes the input GEMM of every direction, then one kernel per
step runs every direction and batch row (quantization of h, the recurrent GEMM, the gate math).
"""
from __future__ import annotations

import functools
import os

import numpy as np

from ..ir.shape import Shape
from .gpu_kernel import GpuKernel
from .gpu_lowering import gpu_kernel_for

_HERE = os.path.dirname(os.path.abspath(__file__))
CTYPES = {"float16": ("__half", "float"), "float32": ("float", "float"), "float64": ("double", "double")}
BLOCK = 256  # threads per block of mgx_lstm_step
MAX_BLOCKS = 1 << 16  # its loop is grid-stride
QUANT_BLOCK = 512  # threads of the one-block quantization of X (dq_lstm.cu)
GEMM_BLOCK = 128  # columns per block of the input GEMM (each thread: DQ_RT = 8 rows)
GEMM_ROWS = 8
STEP_BLOCK = (32, 16)  # hidden units x reduction slices of the step kernel (DQ_JB x DQ_KS in dq_lstm.cu)


def kernel_source(dtype: str) -> str:
    """The source of ``lstm.cu`` for element type ``dtype`` (float16 / float32 / float64)."""
    from .gpu_kernel import HEADER

    t, acc = CTYPES[dtype]
    with open(os.path.join(_HERE, "lstm.cu")) as f:
        return HEADER + f"#define MGX_LSTM_CONFIG\ntypedef {t} T;\ntypedef {acc} ACC;\n" + f.read()


@functools.lru_cache(maxsize=None)
def lstm_step_function(dtype: str):
    """``mgx_lstm_step`` for ``dtype`` (CuPy RawModule: NVRTC / hipRTC), compiled once per process
    without FMA contraction."""
    import cupy

    no_fma = "-ffp-contract=off" if cupy.cuda.runtime.is_hip else "--fmad=false"
    return cupy.RawModule(code=kernel_source(dtype), options=(no_fma,)).get_function("mgx_lstm_step")


def launch_count(op, inputs) -> int:
    """Device launches of :func:`lstm_gpu_kernel`'s function for these input shapes."""
    T, B = inputs[0].lens[0], inputs[0].lens[1]
    staged = sum(1 for s in inputs if not s.standard())
    if T == 0 or B == 0:
        return staged + 2
    D = 2 if op.direction == "bidirectional" else 1
    return staged + D * (1 + 2 * T + (len(inputs) < 6))


@gpu_kernel_for("lstm")
def _lower_lstm(op, inputs, output, ins) -> GpuKernel | None:
    """None (the op's ``compute``) for inputs of mixed element types."""
    if any(s.dtype != inputs[0].dtype for s in inputs):
        return None
    return lstm_gpu_kernel(op, inputs, output)


def lstm_gpu_kernel(op, inputs, output) -> GpuKernel | None:
    """The kernel of ``op`` (an ``lstm``) on the gpu target, or None for an element type ``lstm.cu``
    does not take (the generic kernel then runs).
    Workspace: a copy of each non-standard input, G ``[max(T*B, 1), 4H]``, hr ``[max(B, 1), 4H]`` and the
    cell state ``[max(B, 1), H]``, all of X's dtype."""
    x = inputs[0]
    if x.dtype not in CTYPES:
        return None
    T, B, _ = x.lens
    H, dt = op.hidden_size, x.dtype
    staged = [k for k, s in enumerate(inputs) if not s.standard()]
    ws = [Shape(inputs[k].dtype, inputs[k].lens) for k in staged]
    ws += [Shape(dt, [max(T * B, 1), 4 * H]), Shape(dt, [max(B, 1), 4 * H]), Shape(dt, [max(B, 1), H])]
    launches = launch_count(op, inputs)
    grid = (int(min(max(-(-(B * H) // BLOCK), 1), MAX_BLOCKS)),)
    sizes = (np.int64(B), np.int64(H))
    n_in = len(inputs)

    def run(ctx, out, args, wsa):
        args = list(args)
        for n, k in enumerate(staged):
            ctx.xp.copyto(wsa[n], args[k])
            args[k] = wsa[n]
        args += [None] * (6 - n_in)
        G, hr, c = wsa[len(staged):]
        if T == 0 or B == 0:
            _copy_states(ctx.xp, out, args[4], args[5])
            return
        step = lstm_step_function(dt)
        for d in range(2 if op.direction == "bidirectional" else 1):
            _direction(ctx, op, d, args, out, (G[:T * B], hr[:B], c[:B]), lambda a: step(grid, (BLOCK,), a), sizes)

    return GpuKernel(run, launches, ws, True, f"lstm.cu ({launches} launches)")


def _copy_states(xp, out, h0, c0) -> None:
    """T = 0 (or B = 0): Y_h / Y_c are the initial states (zeros when omitted)."""
    for dst, src in ((out[1], h0), (out[2], c0)):
        if src is None:
            dst.fill(0)
        else:
            xp.copyto(dst, src)


def _direction(ctx, op, d, args, out, ws, step, sizes) -> None:
    """Direction ``d``: the input projection, then per step the recurrent GEMM and ``mgx_lstm_step``."""
    x, w, r, b, h0, c0 = args
    Y, Yh, Yc = out
    G, hr, c = ws
    T, B, I = x.shape
    reverse = op.direction == "reverse" or d == 1
    ctx.matmul(x.reshape(T * B, I), w[d].T, G)
    g3 = G.reshape(T, B, G.shape[1])
    bias = b[d] if b is not None else G
    has_bias = np.int32(b is not None)
    if c0 is None:
        c.fill(0)
    h = None if h0 is None else h0[d]
    rt = r[d].T
    for s in range(T):
        t = T - 1 - s if reverse else s
        if h is None:
            hr.fill(0)
        else:
            ctx.matmul(h, rt, hr)
        c_in = c0[d] if s == 0 and c0 is not None else c
        step((g3[t], hr, bias, has_bias, c_in, c, Y[t, d], Yh[d], Yc[d], np.int32(s == T - 1), *sizes))
        h = Y[t, d]


# ---------------------------------------------------------------------------------------------------
# dynamic_quantize_lstm: dq_lstm.cu
# ---------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def dq_lstm_module():
    """``dq_lstm.cu`` (CuPy RawModule), compiled without FMA contraction."""
    import cupy

    with open(os.path.join(_HERE, "dq_lstm.cu")) as f:
        src = f.read()
    no_fma = "-ffp-contract=off" if cupy.cuda.runtime.is_hip else "--fmad=false"
    return cupy.RawModule(code=src, options=(no_fma,))


def _per_column(s: Shape) -> int:
    return int(s.ndim == 2)


@gpu_kernel_for("dynamic_quantize_lstm")
def dq_lstm_kernel(op, inputs, output, ins=None) -> GpuKernel:
    """``dq_lstm.cu``: quantize X (1 launch), the input GEMM (1), one step kernel per time step; a
    copy first for each input that is not standard layout; T = 0 copies initial_h / initial_c."""
    x, w = inputs[0], inputs[1]
    T, B, I = x.lens
    D, H = op.num_directions, op.hidden_size
    staged = [k for k, s in enumerate(inputs) if not s.standard()]
    ws = [Shape(inputs[k].dtype, inputs[k].lens) for k in staged]
    ws += [Shape("int32", [max(T * B * I, 1)]), Shape("float32", [2]),
           Shape("float32", [max(D * T * B * 4 * H, 1)])]
    suffix = "i8" if w.dtype == "int8" else "u8"
    rows, N = T * B, 4 * H
    gemm_grid = (max(1, -(-N // GEMM_BLOCK)), max(1, min(-(-rows // GEMM_ROWS), 65535)), D)
    step_grid = (max(1, -(-H // STEP_BLOCK[0])), D, max(1, min(B, 65535)))
    cols = [np.int32(_per_column(inputs[k])) for k in (7, 6, 9, 8)]
    sizes = (np.int64(T), np.int64(B), np.int64(H), np.int32(D), np.int32(op.direction == "reverse"))

    def run(ctx, out, args, wsa):
        args = list(args)
        for n, k in enumerate(staged):
            ctx.xp.copyto(wsa[n], args[k])
            args[k] = wsa[n]
        x_, w_, r_, b_, h0, c0, w_scale, w_zp, r_scale, r_zp = args
        qx, params, xw = wsa[len(staged):]
        Y, Yh, Yc = out
        if T == 0:
            ctx.xp.copyto(Yh, h0)
            ctx.xp.copyto(Yc, c0)
            return
        mod = dq_lstm_module()
        mod.get_function("dq_quantize_input")((1,), (QUANT_BLOCK,), (x_, np.int64(T * B * I), qx, params))
        mod.get_function("dq_input_gemm_" + suffix)(gemm_grid, (GEMM_BLOCK,), (
            qx, params, w_, w_zp, w_scale, cols[0], cols[1], np.int64(rows), np.int64(I), np.int64(N),
            np.int32(D), xw))
        step = mod.get_function("dq_lstm_step_" + suffix)
        for s in range(T):
            step(step_grid, STEP_BLOCK, (xw, r_, r_zp, r_scale, cols[2], cols[3], b_, h0, c0, Y, Yh, Yc,
                                         *sizes, np.int64(s)))

    launches = len(staged) + (2 if T == 0 else 2 + T)
    return GpuKernel(run, launches, ws, True, f"dq_lstm.cu ({launches} launches)")
