"""Spectral ops: ONNX DFT (forward / inverse, real or complex input, one-sided RFFT and IRFFT, any signal
axis, zero-padded or truncated ``dft_length``), STFT, the window generators (Hann, Hamming, Blackman) and
MelWeightMatrix.

Complex values are ONNX's real representation: a trailing dim of 2 (real, imaginary); a real signal has a
trailing dim of 1.  The ref target runs ``numpy.fft`` (complex64; complex128 for float64).  The gpu target
(:mod:`.signal_gpu`) runs cuFFT (hipFFT on ROCm) through CuPy's ``cupy.cuda.cufft.Plan1d``: the signal is copied into a complex
workspace with the transformed axis last (zero-padded), one batched C2C plan transforms it into a second
workspace, and the bins are copied (scaled by 1/n for an inverse) into ``out``.  An IRFFT builds the
Hermitian full spectrum in the workspace first (real part of the C2C inverse).  Plans are made on an
instruction's first eager run and kept; a run that would need a new plan inside a capture raises
CaptureError before touching cuFFT (the region then runs eagerly, makes the plan, and is captured later),
so a plan is never created in a capture.
Source: ONNX operator spec (DFT-20, STFT-17, HannWindow-17, HammingWindow-17, BlackmanWindow-17,
MelWeightMatrix-17); https://docs.nvidia.com/cuda/cufft/.
"""
from __future__ import annotations

import numpy as np

from ..errors import ExecutionError, ShapeError
from ..ir.shape import Shape
from .base import Operation, check_inputs, register_op

FLOATS = ("float16", "float32", "float64")


def as_complex(x):
    """numpy complex of an ONNX real-representation array ``[..., 1 or 2]`` (the trailing dim removed):
    complex128 for float64, else complex64 (numpy.fft then computes in that precision, as onnxruntime)."""
    cdt = np.complex128 if np.asarray(x).dtype == np.float64 else np.complex64
    y = np.empty(np.shape(x)[:-1], cdt)
    y.real = x[..., 0]
    y.imag = x[..., 1] if x.shape[-1] == 2 else 0
    return y


def _store(out, y):
    """Write complex or real ``y`` into ``out`` ``[..., 2]`` / ``[..., 1]``."""
    out[..., 0] = np.real(y)
    if out.shape[-1] == 2:
        out[..., 1] = np.imag(y)


@register_op
class DFT(Operation):
    """ONNX DFT along ``axis`` (of x, never the last) with ``length`` points: x ``[..., L, ..., 1 or 2]``.

    Output ``[..., K, ..., 2]``: K = ``length`` (forward, inverse), ``length // 2 + 1`` (``onesided``
    forward: real input only); an ``inverse`` ``onesided`` DFT (IRFFT: complex input only) gives the real
    signal ``[..., length, ..., 1]``.  The inverse is scaled by 1 / length.  x's dtype (float16 runs in
    float32).  Raises ShapeError for a bad axis, length or input kind."""

    name = "dft"

    def __init__(self, axis=1, length=0, inverse=0, onesided=0):
        super().__init__(axis=int(axis), length=int(length), inverse=int(inverse), onesided=int(onesided))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        if x.dtype not in FLOATS or x.ndim < 2 or x.lens[-1] not in (1, 2):
            raise ShapeError(f"{self.name}: input must be float [..., 1 or 2], got {x.dtype} {list(x.lens)}")
        if not 0 <= self.axis < x.ndim - 1 or self.length < 1:
            raise ShapeError(f"{self.name}: axis {self.axis} / length {self.length} for input {list(x.lens)}")
        if self.onesided and (x.lens[-1] == 2) != bool(self.inverse):
            raise ShapeError(f"{self.name}: a one-sided {'inverse' if self.inverse else 'forward'} DFT needs "
                             f"{'complex' if self.inverse else 'real'} input, got {list(x.lens)}")
        lens = list(x.lens)
        n = self.length
        lens[self.axis] = n // 2 + 1 if self.onesided and not self.inverse else n
        lens[-1] = 1 if self.onesided and self.inverse else 2
        return Shape(x.dtype, lens)

    def compute(self, ctx, out, args, ws):
        xc = as_complex(args[0])
        a, n = self.axis, self.length
        if self.inverse and self.onesided:
            y = np.fft.irfft(xc, n=n, axis=a)
        elif self.inverse:
            y = np.fft.ifft(xc, n=n, axis=a)
        else:
            y = np.fft.fft(xc, n=n, axis=a)
            if self.onesided:
                y = np.take(y, np.arange(n // 2 + 1), axis=a)
        _store(out, y)


@register_op
class STFT(Operation):
    """ONNX STFT: signal ``[B, T, 1 or 2]``, window ``[frame_length]`` -> ``[B, F, K, 2]`` with
    F = 1 + (T - frame_length) // frame_step frames, each ``signal[b, f*step : f*step + frame_length] *
    window`` transformed with frame_length points; K = frame_length // 2 + 1 when ``onesided`` (real
    signal only), else frame_length.  The signal's dtype (float16 runs in float32)."""

    name = "stft"

    def __init__(self, frame_step=1, frame_length=1, onesided=1):
        super().__init__(frame_step=int(frame_step), frame_length=int(frame_length), onesided=int(onesided))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 2)
        s, w = inputs
        n, step = self.frame_length, self.frame_step
        if s.dtype not in FLOATS or s.ndim != 3 or s.lens[-1] not in (1, 2) or w.dtype != s.dtype:
            raise ShapeError(f"{self.name}: signal must be float [batch, length, 1 or 2] and the window the same "
                             f"type, got {s.dtype} {list(s.lens)} / {w.dtype}")
        if list(w.lens) != [n] or step < 1 or not 1 <= n <= s.lens[1]:
            raise ShapeError(f"{self.name}: frame_length {n} / frame_step {step} / window {list(w.lens)} for a "
                             f"signal of length {s.lens[1]}")
        if self.onesided and s.lens[-1] == 2:
            raise ShapeError(f"{self.name}: a one-sided STFT needs a real signal, got {list(s.lens)}")
        frames = 1 + (s.lens[1] - n) // step
        return Shape(s.dtype, [s.lens[0], frames, n // 2 + 1 if self.onesided else n, 2])

    def frames(self, xp, s):
        n, step = self.frame_length, self.frame_step
        B, T, c = s.shape
        F = 1 + (T - n) // step
        st = s.strides
        return xp.lib.stride_tricks.as_strided(s, (B, F, n, c), (st[0], step * st[1], st[1], st[2]))

    def compute(self, ctx, out, args, ws):
        s, w = np.asarray(args[0]), np.asarray(args[1])
        frames = as_complex(self.frames(np, s)) * w.astype(np.float64 if s.dtype == np.float64 else np.float32)
        y = np.fft.fft(frames, axis=2)[:, :, :out.shape[2]]
        _store(out, y)


# ---------------------------------------------------------------------------------------------------
# windows and the mel filter bank (evaluated on the host at parse time)
# ---------------------------------------------------------------------------------------------------
_F = np.float32
WINDOWS = {"HannWindow": (_F(0.5), _F(0.5), _F(0)),
            "HammingWindow": (_F(25) / _F(46), _F(1) - _F(25) / _F(46), _F(0)),
            "BlackmanWindow": (_F(0.5) - _F(0.16) / _F(2), _F(0.5), _F(0.16) / _F(2))}


def window(kind: str, size: int, periodic: bool) -> np.ndarray:
    """float64 ``a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N)``, n = 0 .. size-1, N = size (periodic) or
    size - 1 (symmetric), as onnxruntime computes it (float32 coefficients, double arithmetic with
    pi = 3.14159265).  A symmetric window of size 1 is NaN (0 / 0), as in onnxruntime and the reference."""
    a0, a1, a2 = (float(c) for c in WINDOWS[kind])
    N = size if periodic else size - 1
    k = np.arange(size, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ang = (2 * 3.14159265) / np.float64(N)
        w = a0 - a1 * np.cos(ang * k)
        if a2:
            w = w + a2 * np.cos(2 * ang * k)
    return w


def mel_edges(xp, num_mel_bins, dft_length, sample_rate, lower, upper):
    """The num_mel_bins + 2 integer spectrogram bins of the mel triangles (float64), as onnxruntime computes
    them: mel = 2595 log10(1 + f / 700), num_mel_bins + 2 even mel steps from the lower edge, bin =
    floor((dft_length + 1) * hz / sample_rate)."""
    def mel(f):
        return 2595 * xp.log10(1 + f.astype(np.float64) / 700)

    lo, hi = mel(lower), mel(upper)
    k = xp.arange(num_mel_bins + 2, dtype=np.float64)
    hz = 700 * (xp.power(10.0, (lo + ((hi - lo) / (num_mel_bins + 2)) * k) / 2595) - 1)
    return xp.floor((dft_length + 1) * hz / sample_rate.astype(np.float64))


def mel_range_error(dft_length, sample_rate, lower, upper) -> str:
    """onnxruntime's check of the edges (float32 arithmetic): '' when both map into the spectrogram bins."""
    bins = dft_length // 2 + 1
    for f, what in ((lower, "lower_edge_hertz"), (upper, "upper_edge_hertz")):
        idx = np.floor(np.float32(dft_length + 1) * np.float32(f) / np.float32(sample_rate))
        if not 0 <= idx < bins:
            return (f"{what} {float(f)} maps to spectrogram bin {int(idx)}, outside the {bins} bins of dft_length "
                    f"{dft_length} at sample_rate {int(sample_rate)}")
    return ""


def mel_matrix(xp, edges, bins: int):
    """[bins, M] triangles over integer ``edges`` [M + 2]: rising (j - l) / (c - l) on [l, c] (1 at c when
    l == c), falling (h - j) / (h - c) on [c, h)."""
    j = xp.arange(bins, dtype=np.float64)[:, None]
    lo, c, hi = edges[None, :-2], edges[None, 1:-1], edges[None, 2:]
    rise = xp.where(c > lo, (j - lo) / xp.maximum(c - lo, 1), (j == c).astype(np.float64))
    fall = (hi - j) / xp.maximum(hi - c, 1)
    zero = xp.zeros_like(rise)
    return xp.where((j >= c) & (j < hi), fall, xp.where((j >= lo) & (j <= c), rise, zero))


@register_op
class MelWeightMatrix(Operation):
    """ONNX MelWeightMatrix with run-time sample_rate / lower_edge_hertz / upper_edge_hertz (0-d inputs):
    ``[dft_length // 2 + 1, num_mel_bins]`` of ``dtype``.  Edges outside the spectrogram raise
    ExecutionError on the host (as onnxruntime); the gpu drops the parts outside.  The literal case is
    folded at parse time by the parser with the same functions."""

    name = "mel_weight_matrix"
    capturable = False  # a few small temporaries (a constant filter bank in practice)

    def __init__(self, num_mel_bins=1, dft_length=1, dtype="float32"):
        super().__init__(num_mel_bins=int(num_mel_bins), dft_length=int(dft_length), dtype=np.dtype(dtype).name)

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 3)
        if any(s.elements() != 1 for s in inputs):
            raise ShapeError(f"{self.name}: sample_rate and the edges must be scalars")
        return Shape(self.dtype, [self.dft_length // 2 + 1, self.num_mel_bins])

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        bins = self.dft_length // 2 + 1
        vals = [a.reshape(()) for a in args]
        if xp is np:
            why = mel_range_error(self.dft_length, *vals)
            if why:
                raise ExecutionError(f"{self.name}: {why}")
        edges = mel_edges(xp, self.num_mel_bins, self.dft_length, *vals)
        xp.copyto(out, mel_matrix(xp, edges, bins), casting="unsafe")
