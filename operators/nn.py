"""Matrix products and normalizations.

``dot`` follows numpy/ONNX MatMul semantics for inputs of rank >= 2 with broadcast batch dims (the
parser unsqueezes 1-D operands).  On the gpu target it runs as one vendor-BLAS strided-batched GEMM
(cuBLAS through nvmath-python, hipBLAS through hip-python), which is legal inside stream capture.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape, broadcast_lens
from .base import Operation, check_inputs, normalize_axis, register_op


@register_op
class Dot(Operation):
    uses_blas = True  # its kernel calls ctx.matmul: the queue's BLAS handle must exist before a capture
    name = "dot"
    alloc_free = True

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 2)
        a, b = inputs
        if a.ndim < 2 or b.ndim < 2:
            raise ShapeError(f"dot: inputs must have rank >= 2, got {list(a.lens)} and {list(b.lens)}")
        if a.dtype != b.dtype:
            raise ShapeError(f"dot: input types differ ({a.dtype} vs {b.dtype})")
        if a.lens[-1] != b.lens[-2]:
            raise ShapeError(f"dot: inner dims differ: {list(a.lens)} x {list(b.lens)}")
        batch = broadcast_lens(a.lens[:-2], b.lens[:-2], where="dot")
        return Shape(a.dtype, batch + (a.lens[-2], b.lens[-1]))

    def compute(self, ctx, out, args, ws):
        ctx.xp.matmul(args[0], args[1], out=out)


@register_op
class LayerNorm(Operation):
    """LayerNormalization (opset 17): normalize over dims ``axis..rank-1``, then ``* scale + bias``.

    Inputs: x, scale, optional bias (broadcast to the normalized dims).  The mean and inverse
    std-dev outputs of the ONNX op are not produced (the parser rejects models that use them).
    """

    name = "layernorm"
    alloc_free = True

    def __init__(self, axis=-1, epsilon=1e-5):
        super().__init__(axis=int(axis), epsilon=float(epsilon))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, (2, 3))
        x = inputs[0]
        normalize_axis(self.axis, x.ndim, self.name)
        return Shape(x.dtype, x.lens)

    def _axes(self, ndim):
        return tuple(range(self.axis % ndim, ndim))

    def workspace(self, inputs, output):
        x = inputs[0]
        axes = self._axes(x.ndim)
        return [Shape(x.dtype, [1 if i in axes else d for i, d in enumerate(x.lens)]), Shape(x.dtype, x.lens)]

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        m, sq = ws
        axes = self._axes(x.ndim)
        ctx.reduce("mean", x, axes, m)
        xp.subtract(x, m, out=out)
        xp.multiply(out, out, out=sq)
        ctx.reduce("mean", sq, axes, m)
        xp.add(m, m.dtype.type(self.epsilon), out=m)
        xp.sqrt(m, out=m)
        xp.true_divide(out, m, out=out)
        xp.multiply(out, args[1], out=out)
        if len(args) > 2:
            xp.add(out, args[2], out=out)

    def launches(self, inputs, output):
        return 8 + (len(inputs) > 2)


@register_op
class RMSNorm(Operation):
    """y = x / sqrt(mean(x^2 over the last ``axis..`` dims) + epsilon) * scale.

    Produced by the ``fuse_norms`` pass from the Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul chain that
    LLaMA-family exports contain (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization").
    The reduction is accumulated in float32 even for half inputs.
    """

    name = "rms_norm"
    alloc_free = True

    def __init__(self, axis=-1, epsilon=1e-6):
        super().__init__(axis=int(axis), epsilon=float(epsilon))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, (1, 2))
        x = inputs[0]
        normalize_axis(self.axis, x.ndim, self.name)
        return Shape(x.dtype, x.lens)

    def workspace(self, inputs, output):
        x = inputs[0]
        axes = tuple(range(self.axis % x.ndim, x.ndim))
        return [Shape("float32" if x.dtype == "float16" else x.dtype,
                      [1 if i in axes else d for i, d in enumerate(x.lens)]),
                Shape("float32" if x.dtype == "float16" else x.dtype, x.lens)]

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        m, sq = ws
        axes = tuple(range(self.axis % x.ndim, x.ndim))
        xp.multiply(x, x, out=sq, dtype=sq.dtype)
        ctx.reduce("mean", sq, axes, m)
        xp.add(m, m.dtype.type(self.epsilon), out=m)
        xp.sqrt(m, out=m)
        xp.true_divide(x, m, out=sq, dtype=sq.dtype)
        if len(args) > 1:
            xp.multiply(sq, args[1], out=out, casting="same_kind", dtype=sq.dtype)
        else:
            xp.copyto(out, sq, casting="same_kind")

    def launches(self, inputs, output):
        return 6


def _sigmoid_into(xp, x, out):
    xp.negative(x, out=out)
    xp.exp(out, out=out)
    xp.add(out, 1, out=out)
    xp.reciprocal(out, out=out)


@register_op
class Convolution(Operation):
    """N-d convolution (ONNX Conv): x [N, C, *S], w [M, C/group, *K], optional bias [M].

    Computed as pad (into a scratch buffer) -> im2col (one strided copy into a scratch buffer laid out
    [N, group, C/group * prod(K), prod(out)]) -> one GEMM per image (batched over groups) -> bias add,
    so it allocates nothing and runs as vendor BLAS on the gpu target.
    """
    uses_blas = True  # its kernel calls ctx.matmul: the queue's BLAS handle must exist before a capture

    name = "convolution"
    alloc_free = True

    def __init__(self, padding=(), stride=(), dilation=(), group=1):
        super().__init__(padding=[int(p) for p in padding], stride=[int(s) for s in stride],
                         dilation=[int(d) for d in dilation], group=int(group))

    def _geometry(self, x: Shape, w: Shape):
        nsp = x.ndim - 2
        pads = self.padding or [0] * (2 * nsp)
        stride = self.stride or [1] * nsp
        dil = self.dilation or [1] * nsp
        out = []
        for i in range(nsp):
            eff = dil[i] * (w.lens[2 + i] - 1) + 1
            o = (x.lens[2 + i] + pads[i] + pads[i + nsp] - eff) // stride[i] + 1
            out.append(o)
        return nsp, pads, stride, dil, out

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, (2, 3))
        x, w = inputs[0], inputs[1]
        if x.ndim < 3 or w.ndim != x.ndim:
            raise ShapeError(f"convolution: input {list(x.lens)} and weights {list(w.lens)} ranks do not match")
        if x.lens[1] != w.lens[1] * self.group or w.lens[0] % self.group:
            raise ShapeError(f"convolution: channels {x.lens[1]} != {w.lens[1]} x group {self.group}")
        nsp, pads, stride, dil, out = self._geometry(x, w)
        if any(o <= 0 for o in out):
            raise ShapeError(f"convolution: empty output {out} for input {list(x.lens)}")
        return Shape(x.dtype, [x.lens[0], w.lens[0]] + out)

    def workspace(self, inputs, output):
        x, w = inputs[0], inputs[1]
        nsp, pads, stride, dil, out = self._geometry(x, w)
        g = self.group
        ws = []
        if any(pads):
            ws.append(Shape(x.dtype, list(x.lens[:2]) + [x.lens[2 + i] + pads[i] + pads[i + nsp] for i in range(nsp)]))
        kdim = (x.lens[1] // g) * int(np.prod(w.lens[2:]))
        ws.append(Shape(x.dtype, [x.lens[0], g, kdim, int(np.prod(out))]))
        return ws

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        x, w = args[0], args[1]
        nsp, pads, stride, dil, osz = self._geometry(Shape(x.dtype.name, x.shape), Shape(w.dtype.name, w.shape))
        g = self.group
        N, C = x.shape[:2]
        M = w.shape[0]
        k = w.shape[2:]
        if any(pads):
            padded = ws[0]
            padded.fill(0)
            xp.copyto(padded[(slice(None), slice(None)) + tuple(slice(pads[i], pads[i] + x.shape[2 + i])
                                                               for i in range(nsp))], x)
            src = padded
        else:
            src = x
        col = ws[-1]
        isz = src.dtype.itemsize
        sN, sC = src.strides[0], src.strides[1]
        sp = src.strides[2:]
        shape = (N, g, C // g) + tuple(k) + tuple(osz)
        strides = (sN, (C // g) * sC, sC) + tuple(dil[i] * sp[i] for i in range(nsp)) + \
            tuple(stride[i] * sp[i] for i in range(nsp))
        patches = xp.lib.stride_tricks.as_strided(src, shape, strides)
        xp.copyto(col.reshape(shape), patches)
        kdim = col.shape[2]
        wm = w.reshape(g, M // g, kdim)
        o = out.reshape(N, g, M // g, col.shape[3])
        for n in range(N):
            ctx.matmul(wm, col[n], o[n])
        if len(args) > 2:
            xp.add(out, args[2].reshape((M,) + (1,) * nsp), out=out)

    def launches(self, inputs, output):
        x = inputs[0]
        pads = any(self.padding)
        return (2 if pads else 0) + 1 + x.lens[0] + (len(inputs) > 2)


@register_op
class LSTM(Operation):
    """ONNX LSTM (layout 0, default activations, no peepholes / sequence_lens / clip).

    Inputs: X [T, B, I], W [D, 4H, I], R [D, 4H, H], B [D, 8H] or None, initial_h / initial_c
    [D, B, H] or None.  Output tuple: Y [T, D, B, H], Y_h [D, B, H], Y_c [D, B, H].  Gate order i, o, f, c
    (ONNX); per step: gates = x W^T + h R^T + Wb + Rb, c = f*c + i*tanh(g), h = o*tanh(c).
    ``compute`` (the ref target) runs this with the array library; the gpu target runs
    :func:`.lstm_gpu.lstm_gpu_kernel` (one GEMM of the input projection per direction, then per step
    one GEMM and one fused gate kernel).  ``compute_shape`` raises ShapeError naming the input whose
    lens differ from these.
    """
    uses_blas = True  # its kernel calls ctx.matmul: the queue's BLAS handle must exist before a capture

    name = "lstm"
    alloc_free = True

    def __init__(self, hidden_size=0, direction="forward"):
        super().__init__(hidden_size=int(hidden_size), direction=str(direction))

    def compute_shape(self, inputs, mods=()):
        x, w = inputs[0], inputs[1]
        if x.ndim != 3 or w.ndim != 3:
            raise ShapeError(f"lstm: X {list(x.lens)} and W {list(w.lens)}, expected X [T, B, I] and W [D, 4H, I]")
        T, B = x.lens[0], x.lens[1]
        D = 2 if self.direction == "bidirectional" else 1
        H = self.hidden_size
        if w.lens[0] != D or w.lens[1] != 4 * H:
            raise ShapeError(f"lstm: W {list(w.lens)} does not match hidden_size {H} / direction {self.direction}")
        want = [("X", [T, B, w.lens[2]]), ("W", list(w.lens)), ("R", [D, 4 * H, H]), ("B", [D, 8 * H]),
                ("initial_h", [D, B, H]), ("initial_c", [D, B, H])]
        for (name, lens), s in zip(want, inputs):
            if list(s.lens) != lens:
                raise ShapeError(f"lstm: {name} {list(s.lens)}, expected {lens} (hidden_size {H}, direction "
                                 f"{self.direction}, X {list(x.lens)})")
        return (Shape(x.dtype, [T, D, B, H]), Shape(x.dtype, [D, B, H]), Shape(x.dtype, [D, B, H]))

    def workspace(self, inputs, output):
        x = inputs[0]
        B, H = x.lens[1], self.hidden_size
        return [Shape(x.dtype, [B, 4 * H]), Shape(x.dtype, [B, 4 * H]), Shape(x.dtype, [B, H]),
                Shape(x.dtype, [B, H]), Shape(x.dtype, [B, H])]

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        x, w, r = args[0], args[1], args[2]
        b = args[3] if len(args) > 3 else None
        h0 = args[4] if len(args) > 4 else None
        c0 = args[5] if len(args) > 5 else None
        Y, Yh, Yc = out
        gates, tmp, h, c, t2 = ws
        T = x.shape[0]
        H = self.hidden_size
        D = w.shape[0]
        for d in range(D):
            reverse = self.direction == "reverse" or d == 1
            if h0 is not None:
                xp.copyto(h, h0[d])
            else:
                h.fill(0)
            if c0 is not None:
                xp.copyto(c, c0[d])
            else:
                c.fill(0)
            wt = w[d].T
            rt = r[d].T
            for step in range(T):
                t = T - 1 - step if reverse else step
                ctx.matmul(x[t], wt, gates)
                ctx.matmul(h, rt, tmp)
                xp.add(gates, tmp, out=gates)
                if b is not None:
                    xp.add(gates, b[d, :4 * H], out=gates)
                    xp.add(gates, b[d, 4 * H:], out=gates)
                i_g, o_g, f_g, c_g = gates[:, :H], gates[:, H:2 * H], gates[:, 2 * H:3 * H], gates[:, 3 * H:]
                _sigmoid_into(xp, gates[:, :3 * H], tmp[:, :3 * H])
                xp.tanh(c_g, out=t2)
                xp.multiply(tmp[:, 2 * H:3 * H], c, out=c)      # f * c
                xp.multiply(tmp[:, :H], t2, out=t2)              # i * tanh(g)
                xp.add(c, t2, out=c)
                xp.tanh(c, out=t2)
                xp.multiply(tmp[:, H:2 * H], t2, out=h)          # o * tanh(c)
                xp.copyto(Y[t, d], h)
            xp.copyto(Yh[d], h)
            xp.copyto(Yc[d], c)

    def launches(self, inputs, output):
        """Device launches of ``compute`` with the array library (the gpu target runs :mod:`.lstm_gpu`'s kernel)."""
        T = inputs[0].lens[0]
        D = 2 if self.direction == "bidirectional" else 1
        per_step = 2 + 1 + (2 if len(inputs) > 3 else 0) + 4 + 1 + 2 + 1 + 1 + 1 + 1
        return D * (2 + T * per_step + 2)

