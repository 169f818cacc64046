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
from .op_parser import attr, check_min, decode, parser, require_float
from .parse_constant import filled

_USES = {"affine": (True, True), "leakyrelu": (True, False), "thresholdedrelu": (True, False),
         "scaledtanh": (True, True), "hardsigmoid": (True, True), "elu": (True, False)}
_DEFAULTS = {"leakyrelu": (0.01, 0.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, 0.0)}
_DIRECTIONS = ("forward", "reverse", "bidirectional")


def _activations(p, node, D):
    """(names, alphas, betas) of the node's activations, ``A`` per direction (checked)."""
    gru = node.op_type == "GRU"
    names = [decode(a) for a in (attr(node, "activations") or [])]
    if not names:
        names = (["Sigmoid", "Tanh"] if gru else ["Tanh"]) * D
    elif not gru and D == 1 and len(names) == 2:
        names = names[:1]  # the schema's default ["Tanh", "Tanh"] on a one-direction RNN
    low = [n.lower() for n in names]
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


_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_PER_DIRECTION = {"RNN": 1, "GRU": 2, "LSTM": 3}  # activations per direction


def _check_shape(p, v, want, what, why) -> None:
    if v is not None and list(v.shape.lens) != want:
        raise p.err(f"{what} {list(v.shape.lens)} must be {want} ({why})")


def check_recurrent(p, node, ins) -> tuple:
    """(direction, num_directions, hidden_size, layout) of an RNN / GRU / LSTM node, with its attributes
    and the shapes of its inputs (X, W, R, B, sequence_lens, initial_h, initial_c, P) checked against
    the ONNX spec: ParseError naming the attribute or input otherwise."""
    ins = list(ins) + [None] * (8 - len(ins))
    x, w, r, b = ins[:4]
    direction = decode(attr(node, "direction", b"forward"))
    if direction not in _DIRECTIONS:
        raise p.err(f"'direction' = '{direction}' is not one of {', '.join(_DIRECTIONS)}")
    layout = int(attr(node, "layout", 0))
    if layout not in (0, 1):
        raise p.err(f"'layout' = {layout} is not 0 (time-major) or 1 (batch-major)")
    for what, v in (("X", x), ("W", w), ("R", r)):
        if v is None or v.shape.ndim != 3:
            raise p.err(f"{what} must be 3-D, got {None if v is None else list(v.shape.lens)}")
    D, G = 1 + (direction == "bidirectional"), _GATES[node.op_type]
    H = attr(node, "hidden_size")  # optional in the spec (onnxruntime requires it): R's last dim
    H = check_min(p, r.shape.lens[2] if H is None else H, 1, "hidden_size")[0]
    _check_shape(p, r, [D, G * H, H], "R", f"[num_directions, {G}*hidden_size, hidden_size] for 'hidden_size' = {H}, "
                                           f"'direction' = '{direction}'")
    T, B = (x.shape.lens[1], x.shape.lens[0]) if layout else x.shape.lens[:2]
    _check_shape(p, w, [D, G * H, x.shape.lens[2]], "W", f"[num_directions, {G}*hidden_size, input_size]")
    _check_shape(p, b, [D, 2 * G * H], "B", f"[num_directions, {2 * G}*hidden_size]")
    state = [B, D, H] if layout else [D, B, H]
    _check_shape(p, ins[4], [B], "sequence_lens", "[batch_size]")
    _check_shape(p, ins[5], state, "initial_h", "the batch and hidden sizes of X and R")
    if node.op_type == "LSTM":
        _check_shape(p, ins[6], state, "initial_c", "the batch and hidden sizes of X and R")
        _check_shape(p, ins[7], [D, 3 * H], "P", "[num_directions, 3*hidden_size]")
    clip = attr(node, "clip")
    if clip is not None and not clip > 0 and node.op_type != "RNN":  # RNN: no clipping (onnxruntime)
        raise p.err(f"'clip' = {clip} must be positive")
    names = [decode(a) for a in (attr(node, "activations") or [])]
    per = _PER_DIRECTION[node.op_type]
    if names and len(names) != per * D and not (node.op_type == "RNN" and D == 1 and len(names) == 2):
        raise p.err(f"'activations' = {names} has {len(names)} entries, expected {per * D} ({per} per direction, "
                    f"{D} direction(s))")
    for n in names:
        if n.lower() not in ACTIVATIONS:
            raise p.err(f"activation '{n}' is not one of Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, "
                        f"ScaledTanh, HardSigmoid, Elu, Softsign, Softplus")
    return direction, D, H, layout


@parser("RNN", "GRU")
def _p_recurrent(p, m, node, ins):
    """RNN / GRU (inputs X, W, R, B, sequence_lens, initial_h) -> outputs Y, Y_h."""
    ins = list(ins) + [None] * (6 - len(ins))
    x, w, r, b, seq, h0 = ins[:6]
    require_float(p, x, "X")
    direction, D, H, layout = check_recurrent(p, node, ins)
    clip = attr(node, "clip")
    clip = None if clip is not None and not clip > 0 else clip  # an RNN's clip <= 0 clips nothing (onnxruntime)
    if layout == 1:
        x = p.contiguous(m, p.add(m, "transpose", [x], permutation=[1, 0, 2]))
        if h0 is not None:
            h0 = p.add(m, "transpose", [h0], permutation=[1, 0, 2])
    x = p.contiguous(m, x)
    T, B = x.shape.lens[0], x.shape.lens[1]
    dt = x.shape.dtype
    G = 3 if node.op_type == "GRU" else 1
    if b is None:
        b = filled(p, m, (D, 2 * G * H), 0, dt)
    if h0 is None:
        h0 = filled(p, m, (D, B, H), 0, dt)
    names, alphas, betas = _activations(p, node, D)
    args = [x, w, r, b, h0]
    if seq is not None:
        _check_lengths(p, seq, T)
        args.append(seq)
    extra = {}
    if G == 3:
        extra["linear_before_reset"] = int(bool(attr(node, "linear_before_reset", 0)))  # nonzero: on (onnxruntime)
    t = p.add(m, node.op_type.lower(), args, hidden_size=H, direction=direction, activations=names,
              alphas=alphas, betas=betas, clip=clip, sequence_lens=seq is not None, **extra)
    y, yh = (p.add(m, "get_tuple_elem", [t], index=k) for k in range(2))
    if layout == 1:
        y = p.add(m, "transpose", [y], permutation=[2, 0, 1, 3])
        yh = p.add(m, "transpose", [yh], permutation=[1, 0, 2])
    return [y, yh]
