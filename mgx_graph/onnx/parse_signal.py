"""ONNX parsers for the signal ops: DFT, STFT, HannWindow, HammingWindow, BlackmanWindow, MelWeightMatrix.

DFT and STFT become one native ``dft`` / ``stft`` instruction (operators/spectral.py); their lengths,
steps and axis must be known at compile time (literals, or values the program is specialized for).  The
windows depend only on their size (which fixes their shape), so they are evaluated here and added as
literals (computed at run time beyond FOLD_LIMIT values); MelWeightMatrix too when its inputs are literals
and it has at most FOLD_LIMIT values, else it is a native ``mel_weight_matrix`` instruction over the
sample rate and edges.
Source: ONNX operator spec (DFT-17/20, STFT-17, HannWindow-17, HammingWindow-17, BlackmanWindow-17,
MelWeightMatrix-17).
"""
from __future__ import annotations

import numpy as np

from ..ir.shape import ONNX_TO_NUMPY
from ..ir.fold import FOLD_LIMIT
from ..operators.spectral import WINDOWS, mel_edges, mel_matrix, mel_range_error, window
from .op_parser import attr, ints, parser, require_float, unsupported
from .parse_constant import filled, iota


def _scalar(p, ins, what) -> int:
    """The compile-time value of a scalar integer input."""
    if ins.shape.dtype not in ("int32", "int64") or ins.shape.elements() != 1:
        raise p.err(f"{what} must be one int32 / int64 value, got {ins.shape.dtype} {list(ins.shape.lens)}")
    return ints(p.const(ins, what))[0]


def _dft_axis(p, node, ins, x) -> int:
    r = x.shape.ndim
    if p.opset >= 20:
        axis = _scalar(p, ins[2], "axis") if len(ins) > 2 and ins[2] is not None else -2
    else:
        axis = int(attr(node, "axis", 1))
    if not (-r <= axis <= -2 or 0 <= axis <= r - 2):
        raise p.err(f"axis {axis} is outside [-{r}, -2] and [0, {r - 2}] (input rank {r}; the last dim holds "
                    f"the real and imaginary parts)")
    return axis % r


@parser("DFT")
def _p_dft(p, m, node, ins):
    """DFT (input, dft_length, axis) -> the transform (see operators/spectral.py DFT)."""
    x = ins[0]
    require_float(p, x, "input")
    if x.shape.ndim < 2 or x.shape.lens[-1] not in (1, 2):
        raise p.err(f"input {list(x.shape.lens)} must end in 1 (real) or 2 (complex)")
    # any nonzero inverse / onesided is on, as onnxruntime reads them
    inverse, onesided = int(bool(attr(node, "inverse", 0))), int(bool(attr(node, "onesided", 0)))
    complex_in = x.shape.lens[-1] == 2
    if onesided and not inverse and complex_in:
        raise p.err("'onesided' = 1: a one-sided forward DFT (RFFT) needs real input (last dim 1)")
    if onesided and inverse and not complex_in:
        raise p.err("'onesided' = 1: a one-sided inverse DFT (IRFFT) needs complex input (last dim 2)")
    axis = _dft_axis(p, node, ins, x)
    L = x.shape.lens[axis]
    if len(ins) > 1 and ins[1] is not None:
        n = _scalar(p, ins[1], "dft_length")
    else:
        n = 2 * (L - 1) if inverse and onesided else L
    if n < 1:
        raise p.err(f"dft_length {n} must be >= 1")
    return p.add(m, "dft", [x], axis=axis, length=n, inverse=inverse, onesided=onesided)


@parser("STFT")
def _p_stft(p, m, node, ins):
    """STFT (signal, frame_step, window, frame_length) -> [batch, frames, bins, 2]."""
    ins = list(ins) + [None] * (4 - len(ins))
    s, step_in, win, length_in = ins[:4]
    require_float(p, s, "signal")
    if s.shape.ndim != 3 or s.shape.lens[-1] not in (1, 2):
        raise p.err(f"signal {list(s.shape.lens)} must be [batch, length, 1 or 2]")
    onesided = int(attr(node, "onesided", 1))
    if onesided not in (0, 1):
        raise p.err(f"onesided {onesided} must be 0 or 1")
    if onesided and s.shape.lens[-1] == 2:
        raise p.err("a one-sided STFT needs a real signal (last dim 1)")
    if attr(node, "onesided") is None:
        # onnx's STFT shape inference takes an absent onesided as 0; the schema default (and onnxruntime,
        # and the conformance data) is 1: the output shape is checked against the schema's
        p.inferred.pop(node.output[0], None)
    step = _scalar(p, step_in, "frame_step")
    if win is not None and (win.shape.ndim != 1 or win.shape.dtype != s.shape.dtype):
        raise p.err(f"window must be 1-D {s.shape.dtype}, got {win.shape.dtype} {list(win.shape.lens)}")
    n = _scalar(p, length_in, "frame_length") if length_in is not None else \
        (win.shape.lens[0] if win is not None else s.shape.lens[1])
    if win is not None and win.shape.lens[0] != n:
        raise p.err(f"window length {win.shape.lens[0]} differs from frame_length {n}")
    if step < 1 or not 1 <= n <= s.shape.lens[1]:
        raise p.err(f"frame_step {step} must be >= 1 and frame_length {n} in [1, {s.shape.lens[1]}] (signal length)")
    if win is None:
        win = filled(p, m, [n], 1, s.shape.dtype)
    return p.add(m, "stft", [s, win], frame_step=step, frame_length=n, onesided=onesided)


def _output_type(p, node, default=1) -> str:
    t = int(attr(node, "output_datatype", default))
    name = ONNX_TO_NUMPY.get(t)
    if name is None or name in ("bool", "object"):
        raise unsupported(p, node, f"output_datatype {t}")
    return name


@parser("HannWindow", "HammingWindow", "BlackmanWindow")
def _p_window(p, m, node, ins):
    """The window of ``size`` values (a literal: it depends on the size only), cast to output_datatype."""
    size = _scalar(p, ins[0], "size")
    if size < 0:
        raise p.err(f"size {size} must be >= 0")
    periodic = int(attr(node, "periodic", 1))
    dt = _output_type(p, node)
    if size == 1 and not periodic and np.dtype(dt).kind != "f":
        raise p.err(f"a symmetric window of size 1 is NaN (0 / 0): no {dt} value")
    if size <= FOLD_LIMIT:
        return p.lit(m, window(node.op_type, size, bool(periodic)).astype(dt))
    return _run_time_window(p, m, node.op_type, size, bool(periodic), dt)


def _run_time_window(p, m, kind: str, size: int, periodic: bool, dt: str):
    """:func:`~mgx_graph.operators.spectral.window` as instructions over run-time positions (float64, then
    ``dt``): ``a0 - a1 cos(ang n) + a2 cos(2 ang n)``, no literal of ``size`` values."""
    def lit(v):
        return p.lit(m, np.array(v, np.float64))

    a0, a1, a2 = (float(c) for c in WINDOWS[kind])
    ang = (2 * 3.14159265) / np.float64(size if periodic else size - 1)  # size > 1 here: no 0 / 0
    k = iota(p, m, size, dtype="float64")
    w = p.add(m, "sub", [lit(a0), p.add(m, "mul", [lit(a1), p.add(m, "cos", [p.add(m, "mul", [lit(ang), k])])])])
    if a2:
        w = p.add(m, "add", [w, p.add(m, "mul", [lit(a2), p.add(m, "cos", [p.add(m, "mul", [lit(2 * ang), k])])])])
    return p.add(m, "convert", [w], target_type=dt)


@parser("MelWeightMatrix")
def _p_mel_weight_matrix(p, m, node, ins):
    """[dft_length // 2 + 1, num_mel_bins] triangular mel filter bank (folded when its inputs are literals)."""
    M = _scalar(p, ins[0], "num_mel_bins")
    n = _scalar(p, ins[1], "dft_length")
    sr, lo, hi = ins[2], ins[3], ins[4]
    if M < 0 or n < 1:
        raise p.err(f"num_mel_bins {M} must be >= 0 and dft_length {n} >= 1")
    if sr.shape.dtype not in ("int32", "int64") or sr.shape.elements() != 1:
        raise p.err(f"sample_rate must be one int32 / int64 value, got {sr.shape.dtype} {list(sr.shape.lens)}")
    for v, what in ((lo, "lower_edge_hertz"), (hi, "upper_edge_hertz")):
        require_float(p, v, what)
        if v.shape.elements() != 1:
            raise p.err(f"{what} must be a scalar, got {list(v.shape.lens)}")
    dt = _output_type(p, node)
    if M == 0:  # no bins: an empty matrix, as onnxruntime gives
        return p.lit(m, np.zeros((n // 2 + 1, 0), dt))
    if all(v.op.name == "@literal" for v in (sr, lo, hi)):
        vals = [np.asarray(v.op.value).reshape(()) for v in (sr, lo, hi)]
        why = mel_range_error(n, *vals)
        if why:
            raise p.err(why)
        if (n // 2 + 1) * M <= FOLD_LIMIT:  # larger: the instruction computes it at run time
            return p.lit(m, mel_matrix(np, mel_edges(np, M, n, *vals), n // 2 + 1).astype(dt))
    return p.add(m, "mel_weight_matrix", [sr, lo, hi], num_mel_bins=M, dft_length=n, dtype=dt)
