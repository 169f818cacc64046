"""ONNX parsers for the recurrent layers RNN and GRU: one native ``rnn`` / ``gru`` instruction
(operators/recurrent.py) with zero bias / initial state where omitted; ``layout`` 1 (batch-major) is
transposed around it.

Activation parameters: GRU consumes ``activation_alpha`` / ``activation_beta`` in the order of its
activations, each taking values only if it uses them (Affine, LeakyRelu, ThresholdedRelu, ScaledTanh,
HardSigmoid, Elu), with onnxruntime's defaults once a list runs out (LeakyRelu 0.01, HardSigmoid
0.2 / 0.5, Elu 1.0, others 0).  RNN takes entry ``k`` of each list for its ``k``-th activation (0 when
absent), as onnxruntime and the ONNX reference implementation do.
Source: ONNX operator spec (RNN-22, GRU-22); onnxruntime ``rnn_helpers.cc``.
"""
from __future__ import annotations

import numpy as np

from ..operators.recurrent import ACTIVATIONS
from .op_parser import attr, decode, parser, require_float

_USES = {"affine": (True, True), "leakyrelu": (True, False), "thresholdedrelu": (True, False),
         "scaledtanh": (True, True), "hardsigmoid": (True, True), "elu": (True, False)}
_DEFAULTS = {"leakyrelu": (0.01, 0.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, 0.0)}
_DIRECTIONS = ("forward", "reverse", "bidirectional")


def _activations(p, node, D):
    """(names, alphas, betas) of the node's activations, ``A`` per direction (checked)."""
    gru = node.op_type == "GRU"
    per = 2 if gru else 1
    names = [decode(a) for a in (attr(node, "activations") or [])]
    if not names:
        names = (["Sigmoid", "Tanh"] if gru else ["Tanh"]) * D
    elif not gru and D == 1 and len(names) == 2:
        names = names[:1]  # the schema's default ["Tanh", "Tanh"] on a one-direction RNN
    if len(names) != per * D:
        raise p.err(f"activations {names} has {len(names)} entries, expected {per * D} ({per} per direction, "
                    f"{D} direction(s))")
    low = [n.lower() for n in names]
    for n, lo in zip(names, low):
        if lo not in ACTIVATIONS:
            raise p.err(f"activation '{n}' is not one of Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, "
                        f"ScaledTanh, HardSigmoid, Elu, Softsign, Softplus")
    alpha = list(attr(node, "activation_alpha") or [])
    beta = list(attr(node, "activation_beta") or [])
    alphas, betas = [], []
    ia = ib = 0
    for lo in low:
        need_a, need_b = _USES.get(lo, (False, False))
        da, db = _DEFAULTS.get(lo, (0.0, 0.0))
        a, b = 0.0, 0.0
        if need_a:
            a, ia = (alpha[ia], ia + 1) if ia < len(alpha) else (da, ia)
        if need_b:
            b, ib = (beta[ib], ib + 1) if ib < len(beta) else (db, ib)
        alphas.append(a)
        betas.append(b)
    return low, alphas, betas


def _check_lengths(p, seq, T):
    if seq.shape.dtype != "int32":
        raise p.err(f"sequence_lens must be int32, got {seq.shape.dtype}")
    if seq.op.name == "@literal":
        v = np.asarray(seq.op.value).reshape(-1)
        if v.size and (v.min() < 0 or v.max() > T):
            raise p.err(f"sequence_lens {v.tolist()} has values outside [0, {T}] (seq_length)")


@parser("RNN", "GRU")
def _p_recurrent(p, m, node, ins):
    """RNN / GRU (inputs X, W, R, B, sequence_lens, initial_h) -> outputs Y, Y_h."""
    ins = list(ins) + [None] * (6 - len(ins))
    x, w, r, b, seq, h0 = ins[:6]
    require_float(p, x, "X")
    direction = decode(attr(node, "direction", b"forward"))
    if direction not in _DIRECTIONS:
        raise p.err(f"direction '{direction}' is not one of {', '.join(_DIRECTIONS)}")
    layout = int(attr(node, "layout", 0))
    if layout not in (0, 1):
        raise p.err(f"layout {layout} is not 0 (time-major) or 1 (batch-major)")
    if x.shape.ndim != 3 or w.shape.ndim != 3 or r.shape.ndim != 3:
        raise p.err(f"X, W and R must be 3-D, got {list(x.shape.lens)}, {list(w.shape.lens)}, {list(r.shape.lens)}")
    D = 2 if direction == "bidirectional" else 1
    H = attr(node, "hidden_size")
    H = int(r.shape.lens[2]) if H is None else int(H)
    if H != r.shape.lens[2]:
        raise p.err(f"hidden_size {H} does not match R {list(r.shape.lens)} (expected [{D}, G*{H}, {H}])")
    clip = attr(node, "clip")
    if clip is not None and not clip > 0:
        raise p.err(f"clip {clip} must be positive")
    if layout == 1:
        x = p.contiguous(m, p.add(m, "transpose", [x], permutation=[1, 0, 2]))
        if h0 is not None:
            h0 = p.add(m, "transpose", [h0], permutation=[1, 0, 2])
    x = p.contiguous(m, x)
    T, B = x.shape.lens[0], x.shape.lens[1]
    dt = x.shape.dtype
    G = 3 if node.op_type == "GRU" else 1
    if b is None:
        b = p.lit(m, np.zeros((D, 2 * G * H), dt))
    if h0 is None:
        h0 = p.lit(m, np.zeros((D, B, H), dt))
    names, alphas, betas = _activations(p, node, D)
    args = [x, w, r, b, h0]
    if seq is not None:
        _check_lengths(p, seq, T)
        args.append(seq)
    extra = {}
    if G == 3:
        lbr = int(attr(node, "linear_before_reset", 0))
        if lbr not in (0, 1):
            raise p.err(f"linear_before_reset {lbr} is not 0 or 1")
        extra["linear_before_reset"] = lbr
    t = p.add(m, node.op_type.lower(), args, hidden_size=H, direction=direction, activations=names,
              alphas=alphas, betas=betas, clip=clip, sequence_lens=seq is not None, **extra)
    y, yh = (p.add(m, "get_tuple_elem", [t], index=k) for k in range(2))
    if layout == 1:
        y = p.add(m, "transpose", [y], permutation=[2, 0, 1, 3])
        yh = p.add(m, "transpose", [yh], permutation=[1, 0, 2])
    return [y, yh]
