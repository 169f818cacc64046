"""Recurrent layers: ONNX RNN and GRU (every direction, activation, clip, sequence_lens, initial_h;
GRU with either ``linear_before_reset``).

Both ops take time-major inputs (the parser transposes ``layout`` 1 around them) and compute, per
direction, the input projection of every step in one GEMM, then per step one GEMM of the hidden state
(two for GRU) and elementwise updates into declared workspaces: nothing is allocated, so the ops are
captured on the gpu target (vendor BLAS through ``ctx.matmul``).

``sequence_lens`` (int32 ``[B]``): a batch entry ``b`` takes steps ``0 .. len[b] - 1``; a reverse
direction starts at step ``len[b] - 1``. Steps past the length write zeros to ``Y`` and leave the hidden
state unchanged, so ``Y_h`` holds the state after the last valid step (onnxruntime's rule).  A length
outside ``[0, T]`` raises ExecutionError on the host (as onnxruntime); the gpu kernels clamp it.

Activations (ONNX names, case-insensitive): Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu,
ScaledTanh, HardSigmoid, Elu, Softsign, Softplus, each with its resolved ``alpha`` / ``beta``.
Source: ONNX operator spec (RNN-22, GRU-22); onnxruntime ``rnn.cc`` / ``deep_cpu_gru.cc``.
"""
from __future__ import annotations

import numpy as np

from ..errors import ExecutionError, ShapeError
from ..ir.shape import Shape
from .base import Operation, register_op

ACTIVATIONS = ("relu", "tanh", "sigmoid", "affine", "leakyrelu", "thresholdedrelu", "scaledtanh",
               "hardsigmoid", "elu", "softsign", "softplus")
FLOATS = ("float16", "float32", "float64")


def activate(xp, name: str, alpha: float, beta: float, x, out, tmp, flag) -> None:
    """``out = f(x)`` for activation ``name``; ``x`` may be ``out``.  ``tmp`` (x's shape and dtype) and
    ``flag`` (bool, x's shape) are scratch.  All calls write through ``out=``: nothing is allocated."""
    if name == "tanh":
        xp.tanh(x, out=out)
    elif name == "sigmoid":  # 1 / (1 + e^-x) as 0.5 * (1 + tanh(x / 2)): no overflow
        xp.multiply(x, 0.5, out=out)
        xp.tanh(out, out=out)
        xp.add(out, 1, out=out)
        xp.multiply(out, 0.5, out=out)
    elif name == "relu":
        xp.maximum(x, 0, out=out)
    elif name == "affine":
        xp.multiply(x, alpha, out=out)
        xp.add(out, beta, out=out)
    elif name in ("leakyrelu", "elu"):  # x >= 0 ? x : alpha * x  /  alpha * (e^x - 1)
        xp.minimum(x, 0, out=tmp)
        if name == "elu":
            xp.expm1(tmp, out=tmp)
        xp.multiply(tmp, alpha, out=tmp)
        xp.maximum(x, 0, out=out)
        xp.add(out, tmp, out=out)
    elif name == "thresholdedrelu":  # x > alpha ? x : 0 (a NaN gives 0)
        xp.greater(x, alpha, out=flag)
        xp.copyto(tmp, x)
        out.fill(0)
        xp.copyto(out, tmp, where=flag)
    elif name == "scaledtanh":
        xp.multiply(x, beta, out=out)
        xp.tanh(out, out=out)
        xp.multiply(out, alpha, out=out)
    elif name == "hardsigmoid":
        xp.multiply(x, alpha, out=out)
        xp.add(out, beta, out=out)
        xp.maximum(out, 0, out=out)
        xp.minimum(out, 1, out=out)
    elif name == "softsign":
        xp.abs(x, out=tmp)
        xp.add(tmp, 1, out=tmp)
        xp.true_divide(x, tmp, out=out)
    elif name == "softplus":
        xp.logaddexp(x, 0, out=out)
    else:
        raise ShapeError(f"unknown recurrent activation '{name}' (one of {', '.join(ACTIVATIONS)})")


_LAUNCHES = {"tanh": 1, "sigmoid": 4, "relu": 1, "affine": 2, "leakyrelu": 5, "elu": 6, "thresholdedrelu": 4,
             "scaledtanh": 3, "hardsigmoid": 4, "softsign": 3, "softplus": 1}


class Recurrent(Operation):
    """Shared shape checks and step bookkeeping of :class:`RNN` and :class:`GRU`.

    Inputs: X ``[T, B, I]`` (standard layout), W ``[D, G*H, I]``, R ``[D, G*H, H]``, B ``[D, 2*G*H]``,
    initial_h ``[D, B, H]``, then sequence_lens ``[B]`` (int32) when ``sequence_lens`` is set (``G`` gates:
    1 for RNN, 3 for GRU).  Outputs (a tuple): Y ``[T, D, B, H]`` and Y_h ``[D, B, H]``, X's dtype.
    Attributes: ``hidden_size``, ``direction`` (forward / reverse / bidirectional), ``activations``
    (lower-case names, ``A`` per direction), ``alphas`` / ``betas`` (one per activation), ``clip``
    (None: no clip; else pre-activations are clipped to ``[-clip, clip]``).
    Raises ShapeError naming the input whose shape or dtype does not match.
    """
    uses_blas = True  # its kernel calls ctx.matmul: the queue's BLAS handle must exist before a capture

    gates = 1
    per_direction = 1  # activations per direction
    alloc_free = True

    def __init__(self, hidden_size=0, direction="forward", activations=(), alphas=(), betas=(), clip=None,
                 sequence_lens=False, **extra):
        D = 2 if direction == "bidirectional" else 1
        acts = [str(a).lower() for a in activations] or self.default_activations() * D
        super().__init__(hidden_size=int(hidden_size), direction=str(direction), activations=acts,
                         alphas=[float(a) for a in alphas] or [0.0] * len(acts),
                         betas=[float(b) for b in betas] or [0.0] * len(acts),
                         clip=None if clip is None else float(clip), sequence_lens=bool(sequence_lens) or None,
                         **extra)

    @classmethod
    def default_activations(cls) -> list:
        return ["tanh"]

    @property
    def num_directions(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    def compute_shape(self, inputs, mods=()):
        want = 6 if self.sequence_lens else 5
        if len(inputs) != want:
            raise ShapeError(f"{self.name}: expects {want} inputs, got {len(inputs)}")
        x, w, r, b, h0 = inputs[:5]
        D, H, G = self.num_directions, self.hidden_size, self.gates
        if x.dtype not in FLOATS or x.ndim != 3:
            raise ShapeError(f"{self.name}: X must be a float [seq_length, batch, input_size], got "
                             f"{x.dtype} {list(x.lens)}")
        T, B, I = x.lens
        expect = {"W": (w, [D, G * H, I]), "R": (r, [D, G * H, H]), "B": (b, [D, 2 * G * H]),
                  "initial_h": (h0, [D, B, H])}
        for what, (s, lens) in expect.items():
            if list(s.lens) != lens or s.dtype != x.dtype:
                raise ShapeError(f"{self.name}: {what} must be {x.dtype} {lens} (hidden_size {H}, direction "
                                 f"{self.direction}), got {s.dtype} {list(s.lens)}")
        if self.sequence_lens and (inputs[5].dtype != "int32" or list(inputs[5].lens) != [B]):
            raise ShapeError(f"{self.name}: sequence_lens must be int32 [{B}], got {inputs[5].dtype} "
                             f"{list(inputs[5].lens)}")
        if len(self.activations) != self.per_direction * D:
            raise ShapeError(f"{self.name}: {len(self.activations)} activations for {D} direction(s), expected "
                             f"{self.per_direction * D}")
        bad = [a for a in self.activations if a not in ACTIVATIONS]
        if bad:
            raise ShapeError(f"{self.name}: unknown activation '{bad[0]}' (one of {', '.join(ACTIVATIONS)})")
        return (Shape(x.dtype, [T, D, B, H]), Shape(x.dtype, [D, B, H]))

    def _act(self, xp, d, k, x, out, tmp, flag):
        """Activation ``k`` of direction ``d`` on ``x`` into ``out``, after the clip."""
        j = d * self.per_direction + k
        if self.clip is not None:
            xp.clip(x, -self.clip, self.clip, out=out)
            x = out
        activate(xp, self.activations[j], self.alphas[j], self.betas[j], x, out, tmp, flag)

    def _act_launches(self, k_of_direction) -> int:
        return sum(_LAUNCHES[self.activations[d * self.per_direction + k]] + (self.clip is not None)
                   for d in range(self.num_directions) for k in k_of_direction)

    @staticmethod
    def _lengths(xp, args, T):
        """sequence_lens as a [B, 1] view (host: checked against ``[0, T]``), or None."""
        if len(args) < 6:
            return None
        lens = args[5]
        if xp is np and lens.size and (lens.min() < 0 or lens.max() > T):
            bad = int(lens[(lens < 0) | (lens > T)][0])
            raise ExecutionError(f"sequence_lens value {bad} is outside [0, {T}] (seq_length of X)")
        return lens.reshape(-1, 1)

    @staticmethod
    def _store(xp, t, lens, mask, h, hn, y):
        """Step ``t``: h = hn where the step is valid, Y[t] = hn there and 0 elsewhere."""
        if lens is None:
            xp.copyto(h, hn)
            xp.copyto(y, hn)
            return
        xp.less(t, lens, out=mask)
        xp.copyto(h, hn, where=mask)
        y.fill(0)
        xp.copyto(y, hn, where=mask)

    def _input_projection(self, ctx, x, w, b, xw, d):
        """xw[T*B, G*H] = X W[d]^T + the bias terms that do not depend on the state."""
        xp, H, G = ctx.xp, self.hidden_size, self.gates
        T, B, I = x.shape
        ctx.matmul(x.reshape(T * B, I), w[d].T, xw)
        xp.add(xw, b[d, :G * H], out=xw)
        rb = b[d, G * H:]
        lead = (G - 1) * H if G > 1 and self.attrs.get("linear_before_reset") else G * H
        head = xw[:, :lead]  # one view object as input and out: CuPy copies an input that overlaps out
        xp.add(head, rb[:lead], out=head)  # through another view (an allocation, refused in a capture)

    def launches(self, inputs, output):
        """Per direction: the input projection (3), initial state and Y_h copies (2); per step: the state
        GEMMs and updates, the store (2, or 4 with sequence_lens) and the activations (with the clip)."""
        T = inputs[0].lens[0]
        store = 4 if self.sequence_lens else 2
        per_step = self.num_directions * (self._step_launches() + store)
        return self.num_directions * 5 + T * (per_step + self._act_launches(range(self.per_direction)))

    def _step_launches(self) -> int:
        return 2


@register_op
class RNN(Recurrent):
    """ONNX RNN: ``H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)`` (see :class:`Recurrent` for inputs,
    outputs and attributes; one activation per direction)."""

    name = "rnn"

    def workspace(self, inputs, output):
        x = inputs[0]
        T, B, _ = x.lens
        H, dt = self.hidden_size, x.dtype
        return [Shape(dt, [T * B, H]), Shape(dt, [B, H]), Shape(dt, [B, H]), Shape(dt, [B, H]),
                Shape("bool", [B, H]), Shape("bool", [B, 1])]

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        x, w, r, b, h0 = args[:5]
        Y, Yh = out
        xw, g, h, tmp, flag, mask = ws
        T, B = x.shape[0], x.shape[1]
        lens = self._lengths(xp, args, T)
        for d in range(self.num_directions):
            reverse = self.direction == "reverse" or d == 1
            self._input_projection(ctx, x, w, b, xw, d)
            xp.copyto(h, h0[d])
            rt = r[d].T
            for step in range(T):
                t = T - 1 - step if reverse else step
                ctx.matmul(h, rt, g)
                xp.add(g, xw[t * B:(t + 1) * B], out=g)
                self._act(xp, d, 0, g, g, tmp, flag)
                self._store(xp, t, lens, mask, h, g, Y[t, d])
            xp.copyto(Yh[d], h)


@register_op
class GRU(Recurrent):
    """ONNX GRU, gates z, r, h (see :class:`Recurrent` for inputs, outputs and attributes; activations
    f (z and r) and g (h) per direction)::

        z = f(X W_z^T + H R_z^T + Wb_z + Rb_z)      r = f(X W_r^T + H R_r^T + Wb_r + Rb_r)
        h = g(X W_h^T + (r * H) R_h^T + Rb_h + Wb_h)            linear_before_reset = 0
        h = g(X W_h^T + r * (H R_h^T + Rb_h) + Wb_h)            linear_before_reset = 1
        H' = (1 - z) * h + z * H
    """

    name = "gru"
    gates = 3
    per_direction = 2

    def __init__(self, linear_before_reset=0, **attrs):
        super().__init__(linear_before_reset=int(linear_before_reset), **attrs)

    @classmethod
    def default_activations(cls) -> list:
        return ["sigmoid", "tanh"]

    def workspace(self, inputs, output):
        x = inputs[0]
        T, B, _ = x.lens
        H, dt = self.hidden_size, x.dtype
        return [Shape(dt, [T * B, 3 * H]), Shape(dt, [B, 2 * H]), Shape(dt, [B, H]), Shape(dt, [B, H]),
                Shape(dt, [B, H]), Shape(dt, [B, 2 * H]), Shape("bool", [B, 2 * H]), Shape("bool", [B, 1])]

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        x, w, r, b, h0 = args[:5]
        Y, Yh = out
        xw, zr, hh, h, rh, tmp, flag, mask = ws
        T, B = x.shape[0], x.shape[1]
        H = self.hidden_size
        lens = self._lengths(xp, args, T)
        lbr = self.linear_before_reset
        for d in range(self.num_directions):
            reverse = self.direction == "reverse" or d == 1
            self._input_projection(ctx, x, w, b, xw, d)
            xp.copyto(h, h0[d])
            r_zr, r_h = r[d, :2 * H].T, r[d, 2 * H:].T
            rb_h = b[d, 5 * H:]
            for step in range(T):
                t = T - 1 - step if reverse else step
                xt = xw[t * B:(t + 1) * B]
                ctx.matmul(h, r_zr, zr)
                xp.add(zr, xt[:, :2 * H], out=zr)
                self._act(xp, d, 0, zr, zr, tmp, flag)
                z, rg = zr[:, :H], zr[:, H:]
                if lbr:
                    ctx.matmul(h, r_h, hh)
                    xp.add(hh, rb_h, out=hh)
                    xp.multiply(hh, rg, out=hh)
                else:
                    xp.multiply(rg, h, out=rh)
                    ctx.matmul(rh, r_h, hh)
                xp.add(hh, xt[:, 2 * H:], out=hh)
                self._act(xp, d, 1, hh, hh, tmp[:, :H], flag[:, :H])
                # H' = h + z * (H - h)
                xp.subtract(h, hh, out=rh)
                xp.multiply(rh, z, out=rh)
                xp.add(hh, rh, out=hh)
                self._store(xp, t, lens, mask, h, hh, Y[t, d])
            xp.copyto(Yh[d], h)

    def _step_launches(self) -> int:
        return 2 + 3 + 3 + 1
