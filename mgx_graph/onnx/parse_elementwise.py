"""Elementwise ops: unary math and activations, binary arithmetic / comparison / logic (numpy-style
broadcasting; the opset < 7 ``broadcast`` / ``axis`` form too), variadic Sum / Max / Min / Mean,
Cast / CastLike, Where, Clip, and the ops that pass their input through (Identity, inference Dropout).

ONNX operator spec: https://onnx.ai/onnx/operators/
"""
from __future__ import annotations

import numpy as np

from ..ir.shape import onnx_dtype
from .op_parser import attr, check_choice, decode, element_type, parser
from .parse_constant import filled
from .parse_generic import parse_generic


_UNARY = {
    "Neg": "neg", "Abs": "abs", "Sqrt": "sqrt", "Reciprocal": "recip", "Exp": "exp", "Log": "log",
    "Sin": "sin", "Cos": "cos", "Tan": "tan", "Tanh": "tanh", "Asin": "asin", "Acos": "acos", "Atan": "atan",
    "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh",
    "Floor": "floor", "Ceil": "ceil", "Round": "nearbyint", "Sign": "sign", "Erf": "erf", "Sigmoid": "sigmoid",
    "Relu": "relu", "IsNaN": "isnan", "Not": "not", "BitwiseNot": "bitwise_not", "HardSwish": "hard_swish",
    "Softplus": "softplus", "Softsign": "softsign",
}


_BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Equal": "equal", "Less": "less",
    "Greater": "greater", "LessOrEqual": "less_equal", "GreaterOrEqual": "greater_equal", "And": "logical_and",
    "Or": "logical_or", "Xor": "logical_xor", "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or",
    "BitwiseXor": "bitwise_xor", "PRelu": "prelu",
}


@parser(*_UNARY)
def _parse_unary(p, m, node, ins):
    return p.add(m, _UNARY[node.op_type], [ins[0]])


@parser(*_BINARY)
def _parse_binary(p, m, node, ins):
    a, b = ins
    if p.opset < 7 and attr(node, "broadcast"):
        # legacy broadcast: b's dims line up with a's starting at ``axis`` (default: the trailing dims)
        axis = attr(node, "axis")
        ra, rb = a.shape.ndim, b.shape.ndim
        axis = ra - rb if axis is None else (axis + ra if axis < 0 else axis)
        trailing = ra - axis - rb
        if trailing > 0:
            b = p.reshape(m, b, list(b.shape.lens) + [1] * trailing)
    elif node.op_type == "PRelu" and p.opset < 9 and b.shape.ndim == 1 and a.shape.ndim > 2 and \
            b.shape.lens[0] == a.shape.lens[1] != a.shape.lens[-1]:
        b = p.reshape(m, b, [b.shape.lens[0]] + [1] * (a.shape.ndim - 2))  # slope per channel (axis 1)
    return p.add(m, _BINARY[node.op_type], [a, b])


@parser("Mod")
def _parse_mod(p, m, node, ins):
    # fmod = 0 on floats: Python's (numpy's) mod, as onnx 1.23's node tests define it (test_mod_float*_fmod_0);
    # onnxruntime 1.32 still refuses it
    fmod = check_choice(p, int(attr(node, "fmod", 0)), (0, 1), "fmod")
    return p.add(m, "mod", ins, fmod=fmod)


@parser("BitShift")
def _parse_bitshift(p, m, node, ins):
    direction = check_choice(p, decode(attr(node, "direction")), ("LEFT", "RIGHT"), "direction")
    return p.add(m, "bitshift", ins, direction=direction)


@parser("Sum", "Max", "Min", "Mean")
def _parse_variadic(p, m, node, ins):
    name = {"Sum": "add", "Max": "max", "Min": "min", "Mean": "add"}[node.op_type]
    acc = ins[0]
    for x in ins[1:]:
        acc = p.add(m, name, [acc, x])
    if node.op_type == "Mean" and len(ins) > 1:
        acc = p.add(m, "div", [acc, p.lit(m, np.array(len(ins), dtype=acc.shape.dtype))])
    return acc


@parser("LeakyRelu")
def _parse_leaky(p, m, node, ins):
    return p.add(m, "leaky_relu", ins, alpha=attr(node, "alpha", 0.01))


@parser("Elu")
def _parse_elu(p, m, node, ins):
    return p.add(m, "elu", ins, alpha=attr(node, "alpha", 1.0))


@parser("Celu")
def _parse_celu(p, m, node, ins):
    return p.add(m, "celu", ins, alpha=attr(node, "alpha", 1.0))


@parser("Selu")
def _parse_selu(p, m, node, ins):
    return p.add(m, "selu", ins, alpha=attr(node, "alpha", 1.67326319217681884765625),
                 gamma=attr(node, "gamma", 1.05070102214813232421875))


@parser("HardSigmoid")
def _parse_hsig(p, m, node, ins):
    return p.add(m, "hard_sigmoid", ins, alpha=attr(node, "alpha", 0.2), beta=attr(node, "beta", 0.5))


@parser("ThresholdedRelu")
def _parse_trelu(p, m, node, ins):
    return p.add(m, "thresholded_relu", ins, alpha=attr(node, "alpha", 1.0))


@parser("Gelu")
def _parse_gelu(p, m, node, ins):
    approximate = check_choice(p, decode(attr(node, "approximate", b"none")), ("none", "tanh"), "approximate")
    return p.add(m, "gelu", ins, approximate=approximate)


@parser("Shrink")
def _parse_shrink(p, m, node, ins):
    return p.add(m, "shrink", ins, bias=attr(node, "bias", 0.0), lambd=attr(node, "lambd", 0.5))


@parser("IsInf")
def _parse_isinf(p, m, node, ins):
    return p.add(m, "isinf", ins, detect_positive=attr(node, "detect_positive", 1),
                 detect_negative=attr(node, "detect_negative", 1))


@parser("Identity")
def _parse_identity(p, m, node, ins):
    return ins[0]


@parser("Dropout")
def _parse_dropout(p, m, node, ins):
    ratio = None  # an input from opset 12 (onnxruntime checks it there only)
    if len(ins) > 1 and ins[1] is not None and ins[1].op.name == "@literal":
        ratio = float(np.asarray(ins[1].op.value).reshape(-1)[0])
    if ratio is not None and not 0 <= ratio < 1:
        raise p.err(f"ratio {ratio} is out of range: expected [0, 1)")
    if len(ins) > 2 and ins[2] is not None:
        train = p.const(ins[2], "training_mode")
        if bool(np.asarray(train)):
            return parse_generic(p, m, node, ins)  # training mode: a random mask, drawn on the host
    outs = [ins[0]]
    if len(node.output) > 1 and node.output[1]:
        outs.append(filled(p, m, ins[0].shape.lens, True, bool))  # inference: every element kept
    return outs


@parser("Cast")
def _parse_cast(p, m, node, ins):
    to = element_type(p, attr(node, "to"), "to")
    if ins[0].shape.dtype == to:
        return ins[0]
    return p.add(m, "convert", ins, target_type=to)


@parser("CastLike")
def _parse_castlike(p, m, node, ins):
    to = ins[1].shape.dtype
    if ins[0].shape.dtype == to:
        return ins[0]
    return p.add(m, "convert", [ins[0]], target_type=to)


@parser("Where")
def _parse_where(p, m, node, ins):
    return p.add(m, "where", ins)


@parser("Clip")
def _parse_clip(p, m, node, ins):
    """``y = min(max(x, lo), hi)`` with onnxruntime's semantics (``x < lo ? lo : x``, then
    ``hi < y ? hi : y``): NaN inputs stay NaN, NaN bounds are ignored, a missing bound is the type's
    lowest / largest value (so a float Clip without bounds maps +-inf to the largest finite values)."""
    x = ins[0]
    dt = np.dtype(x.shape.dtype)
    if p.opset < 11:
        lo, hi = attr(node, "min"), attr(node, "max")
        lo = None if lo is None else p.lit(m, np.array(lo, dtype=dt))
        hi = None if hi is None else p.lit(m, np.array(hi, dtype=dt))
    else:
        lo = ins[1] if len(ins) > 1 else None
        hi = ins[2] if len(ins) > 2 else None
    if lo is None and hi is None and dt.kind != "f":
        return x
    info = np.finfo(dt) if dt.kind == "f" else np.iinfo(dt)
    lo = p.lit(m, np.array(info.min, dtype=dt)) if lo is None else lo
    hi = p.lit(m, np.array(info.max, dtype=dt)) if hi is None else hi
    for b, what in ((lo, "min"), (hi, "max")):
        if b.shape.elements() != 1 or b.shape.dtype != dt.name:
            raise p.err(f"{what} must be one {dt.name} value, got {b.shape.dtype} {list(b.shape.lens)}")
    return p.add(m, "clip", [x, lo, hi])


@parser("Mish")
def _parse_mish(p, m, node, ins):
    return p.add(m, "mish", [ins[0]])


@parser("Swish")
def _parse_swish(p, m, node, ins):
    return p.add(m, "swish", [ins[0]], alpha=attr(node, "alpha", 1.0))


@parser("BitCast")
def _parse_bitcast(p, m, node, ins):
    """BitCast (opset 26): the input's bytes as type ``to`` (same bit width; strings are rejected)."""
    to = attr(node, "to")
    if to is None:
        raise p.err("needs the 'to' attribute")
    dt = onnx_dtype(to, where=p.node_name)
    if "string" in (dt, ins[0].shape.dtype):
        raise p.err(f"to={dt} / input {ins[0].shape.dtype}: strings have no bit pattern to reinterpret")
    return p.add(m, "bitcast", [ins[0]], to=dt)
