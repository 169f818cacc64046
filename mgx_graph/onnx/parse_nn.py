"""Neural-network ops: MatMul, Gemm, Conv, GlobalAveragePool / GlobalMaxPool, BatchNormalization
(inference), LayerNormalization and LSTM.  Variants the device kernels do not cover go to the host
fallback (``parse_generic``).

ONNX operator spec: https://onnx.ai/onnx/operators/
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from .op_parser import attr, check_axis, check_min, decode, parser, unsupported
from .parse_constant import filled
from .parse_generic import parse_generic
from .parse_normalization import layernorm_with_stats
from .parse_recurrent import check_recurrent


@parser("MatMul")
def _parse_matmul(p, m, node, ins):
    a, b = ins
    a1, b1 = a.shape.ndim == 1, b.shape.ndim == 1
    if a1:
        a = p.add(m, "unsqueeze", [a], axes=[0])
    if b1:
        b = p.add(m, "unsqueeze", [b], axes=[1])
    # broadcast batch dims explicitly when the ranks differ (dot wants equal batch ranks or none)
    r = p.add(m, "dot", [a, b])
    if a1:
        r = p.add(m, "squeeze", [r], axes=[-2])
    if b1:
        r = p.add(m, "squeeze", [r], axes=[-1])
    return r


@parser("Gemm")
def _parse_gemm(p, m, node, ins):
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    alpha, beta = attr(node, "alpha", 1.0), attr(node, "beta", 1.0)
    ta, tb = attr(node, "transA", 0), attr(node, "transB", 0)
    if a.shape.ndim != 2 or b.shape.ndim != 2:
        raise p.err(f"A {list(a.shape.lens)} and B {list(b.shape.lens)} must be 2-D")
    ka, kb = a.shape.lens[0 if ta else 1], b.shape.lens[1 if tb else 0]
    if ka != kb:
        raise p.err(f"inner dims differ: A {list(a.shape.lens)} with transA={ta}, B {list(b.shape.lens)} with "
                    f"transB={tb} give K = {ka} and {kb}")
    if c is not None:
        _gemm_c(p, c, [a.shape.lens[1 if ta else 0], b.shape.lens[0 if tb else 1]])
    if ta:
        a = p.add(m, "transpose", [a], permutation=[1, 0])
    if tb:
        b = p.add(m, "transpose", [b], permutation=[1, 0])
    y = p.add(m, "dot", [a, b])
    dt = y.shape.dtype
    if alpha != 1.0:
        y = p.add(m, "mul", [y, p.lit(m, np.array(alpha, dtype=dt))])
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = p.add(m, "mul", [c, p.lit(m, np.array(beta, dtype=c.shape.dtype))])
        y = p.add(m, "add", [y, c])
    return y


def _gemm_c(p, c, mn):
    """ParseError unless C broadcasts (one way) to [M, N]."""
    lens = list(c.shape.lens)
    if len(lens) > 2 or any(d not in (1, t) for d, t in zip(lens[::-1], mn[::-1])):
        raise p.err(f"C {lens} does not broadcast to [M, N] = {mn}")


def _layernorm_params(p, ins) -> None:
    """ParseError unless Scale (and B) broadcast to the normalized dims of X."""
    from ..ir.shape import broadcast_lens

    x = ins[0]
    a = check_axis(p, attr(p.node, "axis", -1), x.shape.ndim)
    normalized = tuple(x.shape.lens[a:])
    if 0 in normalized:
        raise p.err(f"'axis' = {attr(p.node, 'axis', -1)} normalizes the dims {list(normalized)} of X "
                    f"{list(x.shape.lens)}: expected dims of length >= 1 (no mean of no values)")
    for v, what in zip(ins[1:3], ("Scale", "B")):
        if v is None:
            continue
        try:
            ok = tuple(broadcast_lens(normalized, v.shape.lens)) == normalized
        except ShapeError:
            ok = False
        if not ok:
            raise p.err(f"{what} {list(v.shape.lens)} does not broadcast to the normalized dims {list(normalized)} "
                        f"(axis {a})")


@parser("LayerNormalization")
def _parse_layernorm(p, m, node, ins):
    if attr(node, "stash_type", 1) != 1:
        return parse_generic(p, m, node, ins)
    _layernorm_params(p, ins)
    if any(o for o in node.output[1:]):  # Mean / InvStdDev outputs
        return layernorm_with_stats(p, m, node, ins)
    args = [i for i in ins if i is not None]
    axis = check_axis(p, attr(node, "axis", -1), ins[0].shape.ndim)
    return p.add(m, "layernorm", args, axis=axis, epsilon=attr(node, "epsilon", 1e-5))


@parser("BatchNormalization")
def _parse_batchnorm(p, m, node, ins):
    """Inference BatchNormalization: y = (x - mean) / sqrt(var + eps) * scale + B, folded into one
    multiply and one add per channel (the ``momentum`` attribute of opsets 9-13 does not matter here)."""
    if attr(node, "training_mode", 0) or any(o for o in node.output[1:]):
        return parse_generic(p, m, node, ins)
    x, scale, bias, mean, var = ins[:5]
    if x.shape.ndim < 2:
        raise p.err(f"X must be [N, C, ...] (rank >= 2), got {list(x.shape.lens)}")
    for v, what in ((scale, "scale"), (bias, "B"), (mean, "input_mean"), (var, "input_var")):
        if list(v.shape.lens) != [x.shape.lens[1]]:
            raise p.err(f"{what} {list(v.shape.lens)} must be [C] = [{x.shape.lens[1]}]")
    eps = attr(node, "epsilon", 1e-5)
    dt = x.shape.dtype
    shape = [x.shape.lens[1]] + [1] * (x.shape.ndim - 2) if x.shape.ndim > 2 else [x.shape.lens[-1]]
    eps_l = p.lit(m, np.array(eps, dtype=dt))
    inv = p.add(m, "recip", [p.add(m, "sqrt", [p.add(m, "add", [var, eps_l])])])
    mul = p.reshape(m, p.add(m, "mul", [scale, inv]), shape)
    add = p.reshape(m, p.add(m, "sub", [bias, p.add(m, "mul", [mean, p.add(m, "mul", [scale, inv])])]), shape)
    return p.add(m, "add", [p.add(m, "mul", [x, mul]), add])


def _global_pool_input(p, x) -> None:
    """ParseError unless ``x`` is [N, C, D1, ...] with spatial dims of length >= 1 (onnxruntime refuses
    empty ones: there is no mean or maximum of no values)."""
    if x.shape.ndim < 3 or 0 in x.shape.lens[2:]:
        raise p.err(f"input must be [N, C, D1, ...] with spatial dims >= 1, got {list(x.shape.lens)}")


@parser("GlobalAveragePool")
def _parse_global_average_pool(p, m, node, ins):
    x = ins[0]
    _global_pool_input(p, x)
    return p.add(m, "reduce_mean", [x], axes=list(range(2, x.shape.ndim)), keepdims=1)


@parser("GlobalMaxPool")
def _parse_global_max_pool(p, m, node, ins):
    """Max pooling with a window of all the spatial dims: NaN skipped, NaN for a channel of NaNs only
    (docs/nan_semantics.md), floored at the type's lowest value as onnxruntime's pooling starts from it
    (a channel of -inf gives -FLT_MAX)."""
    x = ins[0]
    _global_pool_input(p, x)
    nsp = x.shape.ndim - 2
    y = p.add(m, "pooling", [x], mode="max", kernel=list(x.shape.lens[2:]), stride=[1] * nsp,
              dilation=[1] * nsp, pads_begin=[0] * nsp, out_lens=[1] * nsp)
    dt = np.dtype(x.shape.dtype)
    if dt.kind != "f":
        return y
    return p.add(m, "max", [y, p.lit(m, np.array(np.finfo(dt).min, dtype=dt))])


def conv_geometry(p, node, x, w) -> tuple:
    """``(pads, strides, dilations, group)`` of a Conv / ConvInteger / QLinearConv node over X ``x`` and W
    ``w``, its attributes checked against the spec and the input shapes (ParseError naming them)."""
    from .parse_spatial import _spatial_attrs

    if w.shape.ndim != x.shape.ndim:
        raise p.err(f"W {list(w.shape.lens)} and X {list(x.shape.lens)} ranks differ")
    nsp = x.shape.ndim - 2
    kshape, strides, dil, pads, auto = _spatial_attrs(p, node, x, list(w.shape.lens[2:]))
    if list(kshape) != list(w.shape.lens[2:]):
        raise p.err(f"'kernel_shape' = {kshape} does not match W {list(w.shape.lens)}: expected "
                    f"{list(w.shape.lens[2:])}")
    group = check_min(p, attr(node, "group", 1), 1, "group")[0]
    C, M = x.shape.lens[1], w.shape.lens[0]
    if C != w.shape.lens[1] * group or M % group:
        raise p.err(f"'group' = {group} does not fit X {list(x.shape.lens)} and W {list(w.shape.lens)}: expected "
                    f"C = {C} = W dim 1 x group and M = {M} divisible by group")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * nsp)
        for i in range(nsp):
            size = x.shape.lens[2 + i]
            out = -(-size // strides[i])
            total = max(0, (out - 1) * strides[i] + dil[i] * (kshape[i] - 1) + 1 - size)
            small, big = total // 2, total - total // 2
            pads[i], pads[i + nsp] = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        pads = [0] * (2 * nsp)
    for i in range(nsp):
        span = x.shape.lens[2 + i] + pads[i] + pads[i + nsp]
        if span < dil[i] * (kshape[i] - 1) + 1:
            raise p.err(f"'kernel_shape' = {kshape} with 'dilations' = {dil} spans more than X {list(x.shape.lens)} "
                        f"padded by 'pads' = {pads} on spatial axis {i}: expected an output of at least 1")
    return pads, strides, dil, group


@parser("Conv")
def _parse_conv(p, m, node, ins):
    x, w = ins[0], ins[1]
    pads, strides, dil, group = conv_geometry(p, node, x, w)
    M = w.shape.lens[0]
    args = [x, w] + ([ins[2]] if len(ins) > 2 and ins[2] is not None else [])
    if len(args) > 2 and list(args[2].shape.lens) != [M]:
        raise p.err(f"B {list(args[2].shape.lens)} must be 1-D [M] = [{M}]")
    return p.add(m, "convolution", args, padding=pads, stride=strides, dilation=dil, group=group)


LSTM_ACTIVATIONS = ["Sigmoid", "Tanh", "Tanh"]  # f, g, h of one direction (ONNX defaults)


def _lstm_unsupported(p, node, ins) -> None:
    """UnsupportedOpError for the LSTM attributes that neither the ``lstm`` op nor the host fallback
    (onnx.reference, whose LSTM ignores them) computes: activations other than the defaults in any
    direction, ``clip``, ``input_forget``, and a constant ``sequence_lens`` other than T everywhere
    (one of T everywhere is the same as none; one fed at run time goes to the host, whose op checks
    each run's values: :mod:`mgx_graph.operators.onnx_ref`)."""
    acts = [decode(a) for a in (attr(node, "activations") or [])]
    D = 2 if decode(attr(node, "direction", b"forward")) == "bidirectional" else 1
    if acts and acts != LSTM_ACTIVATIONS * D:
        raise unsupported(p, node, f"activations {acts} (only {LSTM_ACTIVATIONS * D})")
    if attr(node, "clip") is not None:
        raise unsupported(p, node, f"clip={attr(node, 'clip')}")
    if attr(node, "input_forget", 0):
        raise unsupported(p, node, f"input_forget={attr(node, 'input_forget')}")
    seq = _sequence_lens(ins)
    if seq is not None and seq.op.name == "@literal":
        T = ins[0].shape.lens[1 if attr(node, "layout", 0) else 0]
        if np.any(np.asarray(seq.op.value) != T):
            raise unsupported(p, node, f"sequence_lens {np.asarray(seq.op.value).tolist()} (only {T}, the "
                                       f"sequence length, in every row)")


def _sequence_lens(ins):
    return ins[4] if len(ins) > 4 else None


def _lstm_on_host(node, ins) -> bool:
    """LSTM variants the device kernel does not cover: layout 1, peepholes (onnx.reference computes
    them) or a sequence_lens fed at run time (its op checks that each run's values are T)."""
    seq = _sequence_lens(ins)
    return attr(node, "layout", 0) != 0 or (len(ins) > 7 and ins[7] is not None) \
        or (seq is not None and seq.op.name != "@literal")


@parser("LSTM")
def _parse_lstm(p, m, node, ins):
    """LSTM (inputs X, W, R, B, sequence_lens, initial_h, initial_c, P) as one ``lstm`` instruction
    with zero bias / initial states where omitted; outputs Y, Y_h, Y_c.  Layout 1 and peepholes run on
    the host; raises UnsupportedOpError (see :func:`_lstm_unsupported`) for what nothing computes."""
    direction, D, H, _ = check_recurrent(p, node, ins)
    _lstm_unsupported(p, node, ins)
    if _lstm_on_host(node, ins):
        return parse_generic(p, m, node, ins)
    args = [ins[0], ins[1], ins[2]]
    dt = ins[0].shape.dtype
    B = ins[0].shape.lens[1]
    bias = ins[3] if len(ins) > 3 and ins[3] is not None else filled(p, m, (D, 8 * H), 0, dt)
    h0 = ins[5] if len(ins) > 5 and ins[5] is not None else filled(p, m, (D, B, H), 0, dt)
    c0 = ins[6] if len(ins) > 6 and ins[6] is not None else filled(p, m, (D, B, H), 0, dt)
    t = p.add(m, "lstm", args + [bias, h0, c0], hidden_size=H, direction=direction)
    return [p.add(m, "get_tuple_elem", [t], index=k) for k in range(3)]
