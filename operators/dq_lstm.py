"""onnxruntime contrib op ``com.microsoft::DynamicQuantizeLSTM`` (what onnxruntime's ``quantize_dynamic``
makes of an ONNX LSTM), on the host with numpy and on the gpu target with the kernels of ``dq_lstm.cu``
(:mod:`.lstm_gpu`).

Both compute the same thing: every GEMM input is quantized to uint8 at run time with one scale (ONNX
DynamicQuantizeLinear: the range widened to include 0, ``scale = (max - min) / 255``, the zero point
rounded half to even), the products are accumulated exactly in int32, and the result is scaled by
``input scale * weight scale`` in float32.  The input GEMM quantizes X over the whole sequence; the
recurrent GEMM quantizes h per step and per batch row.
Source: onnxruntime ContribOperators.md (DynamicQuantizeLSTM); onnxruntime ``deep_cpu_lstm.cc``.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape
from .base import Operation, register_op

INPUTS = ("X", "W", "R", "B", "initial_h", "initial_c", "W_scale", "W_zero_point", "R_scale", "R_zero_point")


def dynamic_quantize(a):
    """uint8 dynamic quantization of ``a`` (float32, any shape) as onnxruntime's quantized GEMMs do it:
    one scale for the whole array, the range widened to include 0 (ONNX DynamicQuantizeLinear).
    Returns (q int32 in [0, 255], scale float32, zero point int32)."""
    mn = np.float32(min(np.float32(0), a.min()))
    mx = np.float32(max(np.float32(0), a.max()))
    scale = np.float32(1) if mx == mn else np.float32((mx - mn) / np.float32(255))
    zp = np.rint(np.clip(np.float32(0) - mn / scale, 0, 255))
    q = np.clip(np.rint(a / scale) + zp, 0, 255).astype(np.int32)
    return q, scale, np.int32(zp)


def quantized_gemm(a, w_q, w_zp, w_scale):
    """A (float32 [M, K], quantized on the fly) times W (int8/uint8 [K, N], zero point and scale scalar or
    per column [N]) -> float32 [M, N]: exact int32 accumulation, then one scale per column."""
    qa, sa, za = dynamic_quantize(a)
    acc = (qa - za) @ (w_q.astype(np.int32) - np.asarray(w_zp, np.int32))
    return acc.astype(np.float32) * (sa * np.asarray(w_scale, np.float32))


@register_op
class DynamicQuantizeLSTM(Operation):
    """An LSTM whose weights are int8/uint8 and whose GEMM inputs are quantized to uint8 at run time
    with one scale per GEMM (the input GEMM over the whole sequence; the recurrent GEMM per step and per
    batch row), as onnxruntime's CPU kernel computes it with at least ``batch`` threads (with fewer it
    quantizes groups of ceil(batch / threads) rows together, so for batch > 1 its results depend on its
    thread count; batch 1 is exact either way).

    Inputs (all ten, the parser fills the optional ones): X float32 [T, B, I]; W [D, I, 4H] and R
    [D, H, 4H] int8 or uint8 (transposed with respect to ONNX LSTM), both of one type; B float32 [D, 8H];
    initial_h / initial_c float32 [D, B, H]; W_scale / R_scale float32 [D] or [D, 4H]; W_zero_point /
    R_zero_point of W's type, [D] or [D, 4H].  Gate order i, o, f, c; default activations only.
    Outputs Y float32 [T, D, B, H], Y_h and Y_c [D, B, H].  Raises ShapeError naming the input whose
    dtype or shape does not match.

    On the gpu target: one kernel quantizes X, one computes the input GEMM of every direction, then one
    kernel per step runs every direction and batch row (quantization of h, the recurrent GEMM, the gate
    math), all on the queue without allocating (captured); inputs that are not standard layout are
    first copied into workspaces.
    """

    name = "dynamic_quantize_lstm"
    float32_only = True  # onnxruntime's kernel takes float32 X only; quantize_fp16 keeps it in float32

    def __init__(self, hidden_size=0, direction="forward"):
        super().__init__(hidden_size=int(hidden_size), direction=str(direction))

    @property
    def num_directions(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    def compute_shape(self, inputs, mods=()):
        if len(inputs) != len(INPUTS):
            raise ShapeError(f"{self.name}: expects {len(INPUTS)} inputs ({', '.join(INPUTS)}), got {len(inputs)}")
        x, w, r = inputs[0], inputs[1], inputs[2]
        if x.dtype != "float32" or x.ndim != 3:
            raise ShapeError(f"{self.name}: X must be float32 [seq_length, batch, input_size], got "
                             f"{x.dtype} {list(x.lens)}")
        T, B, _ = x.lens
        D, H = self.num_directions, self.hidden_size
        if list(w.lens) != [D, x.lens[2], 4 * H] or list(r.lens) != [D, H, 4 * H]:
            raise ShapeError(f"{self.name}: W {list(w.lens)} / R {list(r.lens)} do not match "
                             f"[{D}, {x.lens[2]}, {4 * H}] / [{D}, {H}, {4 * H}] (hidden_size {H}, {self.direction})")
        self._check_types(inputs, D, B, H)
        return (Shape(x.dtype, [T, D, B, H]), Shape(x.dtype, [D, B, H]), Shape(x.dtype, [D, B, H]))

    def _check_types(self, inputs, D, B, H):
        w, r = inputs[1], inputs[2]
        if w.dtype not in ("int8", "uint8") or r.dtype != w.dtype:
            raise ShapeError(f"{self.name}: W and R must both be int8 or both uint8, got {w.dtype} and {r.dtype}")
        floats = {3: [[D, 8 * H]], 4: [[D, B, H]], 5: [[D, B, H]], 6: [[D], [D, 4 * H]], 8: [[D], [D, 4 * H]]}
        for k, lens in floats.items():
            s = inputs[k]
            if s.dtype != "float32" or list(s.lens) not in lens:
                raise ShapeError(f"{self.name}: {INPUTS[k]} must be float32 "
                                 f"{' or '.join(str(v) for v in lens)}, got {s.dtype} {list(s.lens)}")
        for k in (7, 9):
            s = inputs[k]
            if s.dtype != w.dtype or list(s.lens) not in ([D], [D, 4 * H]):
                raise ShapeError(f"{self.name}: {INPUTS[k]} must be {w.dtype} [{D}] or [{D}, {4 * H}], got "
                                 f"{s.dtype} {list(s.lens)}")

    def compute(self, ctx, out, args, ws):
        x, w, r, b, h0, c0, w_scale, w_zp, r_scale, r_zp = args
        Y, Yh, Yc = out
        T, B, _ = x.shape
        H = self.hidden_size
        x2 = np.asarray(x, np.float32).reshape(T * B, -1)
        for d in range(w.shape[0]):
            reverse = self.direction == "reverse" or d == 1
            xw = quantized_gemm(x2, w[d], w_zp[d], w_scale[d]).reshape(T, B, 4 * H)
            h = np.array(h0[d], np.float32)
            c = np.array(c0[d], np.float32)
            bias = b[d, :4 * H] + b[d, 4 * H:]
            for step in range(T):
                t = T - 1 - step if reverse else step
                # onnxruntime quantizes h one batch row at a time (its batch-parallel recurrent GEMM)
                hr = np.concatenate([quantized_gemm(h[k:k + 1], r[d], r_zp[d], r_scale[d]) for k in range(B)])
                g = xw[t] + hr + bias
                i_g, o_g, f_g = (1 / (1 + np.exp(-g[:, k * H:(k + 1) * H])) for k in range(3))
                c = f_g * c + i_g * np.tanh(g[:, 3 * H:])
                h = o_g * np.tanh(c)
                Y[t, d] = h
            Yh[d] = h
            Yc[d] = c
