"""ONNX parsers for the quantization ops: DynamicQuantizeLinear, ConvInteger, MatMulInteger, QuantizeLinear,
DequantizeLinear, QLinearMatMul and QLinearConv.

All are lowered to native instructions: DynamicQuantizeLinear to reductions and elementwise ops (as
onnxruntime's CPU kernel computes it), ConvInteger / MatMulInteger to a float64 convolution / GEMM of the
zero-point-shifted operands (every product and partial sum of 8-bit operands is an integer well below 2^53,
so float64 accumulation is exact) converted to int32; QuantizeLinear / DequantizeLinear to one
``quantize_linear`` / ``dequantize_linear`` instruction with the scale and zero point shaped to broadcast
(per tensor, per axis, blocked); QLinearMatMul / QLinearConv to the same exact float64 GEMM / convolution
followed by one ``quantize_linear`` requantization (``round(acc * a_scale * b_scale / y_scale) + y_zp``,
the multiplier in float32 as onnxruntime computes it).  Element types mgx_graph has no representation for
(int4, uint4, float8, float4) raise UnsupportedOpError.
Source: ONNX operator spec (DynamicQuantizeLinear-11, ConvInteger-10, MatMulInteger-10, QuantizeLinear-23,
DequantizeLinear-23, QLinearMatMul-21, QLinearConv-10); onnxruntime ``dynamicquantizelinear.cc``,
``quantize_linear.cc``, ``quantize_linear_matmul.cc``, ``qlinearconv.cc``.
"""
from __future__ import annotations

import numpy as np
import onnx

from ..errors import UnsupportedOpError
from .op_parser import attr, parser
from .parse_nn import conv_geometry

_INT8 = ("uint8", "int8")


def _unsupported(p, node, detail):
    return UnsupportedOpError(p.node_name, node.op_type, node.domain or "", p.opset, detail)


@parser("DynamicQuantizeLinear")
def _p_dynamic_quantize_linear(p, m, node, ins):
    """y = saturate(round(x / scale) + zp) (uint8), scale = (max(x, 0) - min(x, 0)) / 255 (1 when that is 0),
    zp = round(saturate(-min(x, 0) / scale)); rounding half to even.  NaN elements are left out of the
    range and quantize to 0, as onnxruntime does."""
    x = ins[0]
    if x.shape.dtype != "float32":
        raise _unsupported(p, node, f"input type {x.shape.dtype} (float32 only)")

    def f(v):
        return p.lit(m, np.array(v, np.float32))

    nan = p.add(m, "isnan", [x])
    finite = p.add(m, "where", [nan, f(0.0), x])
    axes = list(range(x.shape.ndim))
    lo = p.add(m, "min", [p.add(m, "reduce_min", [finite], axes=axes, keepdims=0), f(0.0)])
    hi = p.add(m, "max", [p.add(m, "reduce_max", [finite], axes=axes, keepdims=0), f(0.0)])
    scale = p.add(m, "div", [p.add(m, "sub", [hi, lo]), f(255.0)])
    scale = p.add(m, "where", [p.add(m, "equal", [hi, lo]), f(1.0), scale])
    zp = p.add(m, "sub", [f(0.0), p.add(m, "div", [lo, scale])])
    zp = p.add(m, "nearbyint", [p.add(m, "min", [p.add(m, "max", [zp, f(0.0)]), f(255.0)])])
    q = p.add(m, "where", [nan, f(-np.inf), x])
    q = p.add(m, "add", [p.add(m, "nearbyint", [p.add(m, "div", [q, scale])]), zp])
    q = p.add(m, "min", [p.add(m, "max", [q, f(0.0)]), f(255.0)])
    q = p.add(m, "where", [p.add(m, "isnan", [q]), f(0.0), q])  # inf / inf
    return [p.add(m, "convert", [q], target_type="uint8"), scale, p.add(m, "convert", [zp], target_type="uint8")]


def _shifted(p, m, x, zp, what, per_axis_shape=None):
    """float64(x) - float64(zero point); a 1-D zero point is reshaped to ``per_axis_shape``."""
    xf = p.add(m, "convert", [x], target_type="float64")
    if zp is None:
        return xf
    if zp.shape.dtype != x.shape.dtype:
        raise p.err(f"{what}_zero_point type {zp.shape.dtype} != input type {x.shape.dtype}")
    if zp.shape.elements() != 1 and (zp.shape.ndim != 1 or per_axis_shape is None):
        raise p.err(f"{what}_zero_point {list(zp.shape.lens)} must be a scalar"
                    + (" or 1-D per channel" if per_axis_shape is not None else ""))
    z = p.add(m, "convert", [zp], target_type="float64")
    if zp.shape.elements() == 1:
        z = p.reshape(m, z, [])
    else:
        if zp.shape.lens[0] != int(np.prod(per_axis_shape)):
            raise p.err(f"{what}_zero_point {list(zp.shape.lens)} does not match {per_axis_shape}")
        z = p.reshape(m, z, per_axis_shape)
    return p.add(m, "sub", [xf, z])


def _integer_conv_geometry(p, node, x, w):
    """``(spatial rank, strides, dilations, pads, group)`` of an 8-bit ConvInteger / QLinearConv node,
    checked as Conv's; UnsupportedOpError for other input types."""
    if x.shape.dtype not in _INT8 or w.shape.dtype not in _INT8:
        raise _unsupported(p, node, f"input types {x.shape.dtype} / {w.shape.dtype} (8-bit integers only)")
    pads, strides, dil, group = conv_geometry(p, node, x, w)
    return x.shape.ndim - 2, strides, dil, pads, group


@parser("ConvInteger")
def _p_conv_integer(p, m, node, ins):
    """int32 convolution of (x - x_zero_point) and (w - w_zero_point); x pads with its zero point."""
    ins = list(ins) + [None] * (4 - len(ins))
    x, w, xz, wz = ins[:4]
    nsp, strides, dil, pads, group = _integer_conv_geometry(p, node, x, w)
    M = w.shape.lens[0]
    xf = _shifted(p, m, x, xz, "x")
    wf = _shifted(p, m, w, wz, "w", [M] + [1] * (w.shape.ndim - 1))
    y = p.add(m, "convolution", [xf, wf], padding=pads, stride=strides, dilation=dil, group=group)
    return p.add(m, "convert", [y], target_type="int32")


@parser("MatMulInteger")
def _p_matmul_integer(p, m, node, ins):
    """int32 (A - a_zero_point) @ (B - b_zero_point), numpy MatMul semantics; a 1-D a_zero_point is per
    row of A, a 1-D b_zero_point per column of B."""
    ins = list(ins) + [None] * (4 - len(ins))
    a, b, az, bz = ins[:4]
    if a.shape.dtype not in _INT8 or b.shape.dtype not in _INT8:
        raise _unsupported(p, node, f"input types {a.shape.dtype} / {b.shape.dtype} (8-bit integers only)")
    a1, b1 = a.shape.ndim == 1, b.shape.ndim == 1
    if a.shape.lens[-1] != b.shape.lens[0 if b1 else -2]:
        raise p.err(f"A {list(a.shape.lens)} and B {list(b.shape.lens)}: inner dims differ")
    af = _shifted(p, m, a, az, "a", None if a1 else [a.shape.lens[-2], 1])
    bf = _shifted(p, m, b, bz, "b", None if b1 else [b.shape.lens[-1]])
    if a1:
        af = p.add(m, "unsqueeze", [af], axes=[0])
    if b1:
        bf = p.add(m, "unsqueeze", [bf], axes=[1])
    y = p.add(m, "dot", [af, bf])
    if a1:
        y = p.add(m, "squeeze", [y], axes=[-2])
    if b1:
        y = p.add(m, "squeeze", [y], axes=[-1])
    return p.add(m, "convert", [y], target_type="int32")


# ---------------------------------------------------------------------------------------------------
# QuantizeLinear / DequantizeLinear (per tensor, per axis, blocked)
# ---------------------------------------------------------------------------------------------------
_QUANT = ("uint8", "int8", "uint16", "int16")
_PRECISIONS = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16"}


def _type_name(t: int) -> str:
    return onnx.TensorProto.DataType.Name(t) if t in onnx.TensorProto.DataType.values() else str(t)


def _onnx_type(p, node, t: int, allowed, what: str) -> str:
    """numpy name of ONNX element type ``t`` when it is in ``allowed``, else UnsupportedOpError."""
    from ..ir.shape import ONNX_TO_NUMPY

    name = ONNX_TO_NUMPY.get(int(t))
    if name is None or name not in allowed:
        raise _unsupported(p, node, f"{what} {_type_name(t)} (supported: {', '.join(allowed)})")
    return name


def broadcast_param(p, m, x, v, axis: int, block: int, what: str):
    """Quantization parameter ``v`` (scale or zero point) shaped to broadcast against ``x``: a scalar
    (per tensor), a 1-D tensor of ``x``'s ``axis`` length (per axis) or, with ``block`` > 0, a tensor of
    ``x``'s shape with ``ceil(D / block)`` on ``axis`` (blocked: each value repeated ``block`` times).
    Raises ParseError naming the shapes when ``v`` is none of these."""
    lens, n = list(x.shape.lens), x.shape.ndim
    vl = list(v.shape.lens)
    if v.shape.elements() == 1 and (v.shape.ndim <= 1 or block):
        return p.reshape(m, v, [])
    if not -n <= axis < n:
        raise p.err(f"axis {axis} is out of range for x {lens} ({what} {vl} is not a scalar)")
    axis %= n
    if block <= 0:
        if v.shape.ndim != 1 or vl[0] != lens[axis]:
            raise p.err(f"{what} {vl} is neither a scalar nor 1-D of length {lens[axis]} (axis {axis} of x {lens})")
        return p.reshape(m, v, [lens[axis] if i == axis else 1 for i in range(n)])
    nb = -(-lens[axis] // block)
    want = [nb if i == axis else d for i, d in enumerate(lens)]
    if vl != want:
        raise p.err(f"{what} {vl} does not match x {lens} blocked by {block} on axis {axis} (expected {want})")
    u = p.add(m, "unsqueeze", [v], axes=[axis + 1])
    full = want[:axis + 1] + [block] + want[axis + 1:]
    r = p.reshape(m, p.add(m, "multibroadcast", [u], out_lens=full), want[:axis] + [nb * block] + want[axis + 1:])
    if nb * block != lens[axis]:
        r = p.add(m, "slice", [r], axes=[axis], starts=[0], ends=[lens[axis]])
    return r


def _axis_block(p, node):
    """(axis, block_size) of a (De)QuantizeLinear node (the axis is checked where it is used)."""
    axis = int(attr(node, "axis", 1)) if p.opset >= 13 else 1
    block = int(attr(node, "block_size", 0)) if p.opset >= 21 else 0
    if block < 0:
        raise p.err(f"block_size {block} must be >= 0")
    return axis, block


def _check_params(p, scale, zp):
    if p.opset < 13 and scale.shape.elements() != 1:
        raise p.err(f"scale {list(scale.shape.lens)} must be a scalar before opset 13 (opset {p.opset})")
    if zp is not None and list(zp.shape.lens) != list(scale.shape.lens) and zp.shape.elements() != \
            scale.shape.elements():
        zname = "y_zero_point" if p.node.op_type == "QuantizeLinear" else "x_zero_point"
        raise p.err(f"{zname} {list(zp.shape.lens)} and scale {list(scale.shape.lens)} shapes differ")


@parser("QuantizeLinear")
def _p_quantize_linear(p, m, node, ins):
    """y = saturate(round_half_even(x / y_scale) + y_zero_point): uint8 / int8 / uint16 / int16 output
    (zero point's type, else ``output_dtype``, else uint8); per tensor, per axis (opset 13) or blocked
    (opset 21).  int4 / uint4 / float8 / float4 outputs raise UnsupportedOpError (no such element type);
    ``saturate`` only concerns float8 outputs."""
    ins = list(ins) + [None] * (3 - len(ins))
    x, scale, zp = ins[:3]
    if x.shape.dtype not in ("float16", "float32", "int32") or scale.shape.dtype not in \
            ("float16", "float32", "int32"):
        raise p.err(f"x {x.shape.dtype} / y_scale {scale.shape.dtype} must be float32, float16 or int32")
    odt = int(attr(node, "output_dtype", 0) or 0)
    if zp is not None:
        out = zp.shape.dtype
        if out not in _QUANT:
            raise _unsupported(p, node, f"zero point type {out} (supported: {', '.join(_QUANT)})")
        if odt and _onnx_type(p, node, odt, _QUANT, "output_dtype") != out:
            raise p.err(f"output_dtype {_type_name(odt)} differs from the zero point type {out}")
    else:
        out = _onnx_type(p, node, odt, _QUANT, "output_dtype") if odt else "uint8"
    precision = attr(node, "precision", 0) or 0
    work = None
    if precision:
        work = _PRECISIONS.get(int(precision))
        if work is None:
            raise _unsupported(p, node, f"precision {_type_name(int(precision))} (float32 or float16)")
    axis, block = _axis_block(p, node)
    _check_params(p, scale, zp)
    s = broadcast_param(p, m, x, scale, axis, block, "y_scale")
    z = broadcast_param(p, m, x, zp, axis, block, "y_zero_point") if zp is not None else \
        p.lit(m, np.zeros((), out))
    return p.add(m, "quantize_linear", [x, s, z], dtype=out, precision=work)


def _widen_4bit(p, m, v):
    """An int4 / uint4 literal (numpy's ml_dtypes arrays, e.g. block-quantized weights) as the same values in
    int8 / uint8; any other instruction unchanged (4-bit run-time tensors have no element type here)."""
    if v is None or v.op.name != "@literal" or v.shape.dtype not in ("int4", "uint4"):
        return v
    return p.lit(m, np.asarray(v.op.value).astype(np.int8 if v.shape.dtype == "int4" else np.uint8))


@parser("DequantizeLinear")
def _p_dequantize_linear(p, m, node, ins):
    """y = (x - x_zero_point) * x_scale: 8/16-bit integer or int32 x (int4 / uint4 initializers are widened
    to 8 bits); per tensor, per axis (opset 13) or blocked (opset 21); output the scale's type, or
    ``output_dtype`` (opset 23)."""
    ins = list(ins) + [None] * (3 - len(ins))
    x, scale, zp = (_widen_4bit(p, m, v) for v in ins[:3])
    if x.shape.dtype not in _QUANT + ("int32",):
        raise _unsupported(p, node, f"x type {x.shape.dtype} (supported: {', '.join(_QUANT)}, int32, and int4 / "
                                    f"uint4 initializers)")
    if scale.shape.dtype not in ("float16", "float32"):
        raise p.err(f"x_scale must be float32 or float16, got {scale.shape.dtype}")
    if zp is not None and zp.shape.dtype != x.shape.dtype:
        raise p.err(f"x_zero_point type {zp.shape.dtype} differs from x type {x.shape.dtype}")
    odt = int(attr(node, "output_dtype", 0) or 0) if p.opset >= 23 else 0
    out = _onnx_type(p, node, odt, ("float32", "float16"), "output_dtype") if odt else None
    axis, block = _axis_block(p, node)
    _check_params(p, scale, zp)
    s = broadcast_param(p, m, x, scale, axis, block, "x_scale")
    z = broadcast_param(p, m, x, zp, axis, block, "x_zero_point") if zp is not None else \
        p.lit(m, np.zeros((), x.shape.dtype))
    return p.add(m, "dequantize_linear", [x, s, z], dtype=out)


# ---------------------------------------------------------------------------------------------------
# QLinearMatMul / QLinearConv: exact integer accumulation (float64), then one requantization
# ---------------------------------------------------------------------------------------------------
def _scale_f32(p, m, s, what, lens):
    """A float32 scale reshaped to ``lens`` ([] for a scalar), checked to hold one value or ``prod(lens)``."""
    if s.shape.dtype not in ("float32", "float16"):
        raise p.err(f"{what} must be float32 or float16, got {s.shape.dtype}")
    n = s.shape.elements()
    if n == 1:
        lens = []
    elif s.shape.ndim != 1 or n != int(np.prod(lens)):
        raise p.err(f"{what} {list(s.shape.lens)} must be a scalar or 1-D of {int(np.prod(lens))} values")
    return p.reshape(m, p.add(m, "convert", [s], target_type="float32"), lens)


def _requantize(p, m, acc, multiplier, y_zp, what="y_zero_point"):
    """round(float32(acc) * multiplier) + y_zp, saturated to y_zp's type (onnxruntime's requantization)."""
    if y_zp.shape.dtype not in _INT8 or y_zp.shape.elements() != 1:
        raise p.err(f"{what} must be one uint8 / int8 value, got {y_zp.shape.dtype} {list(y_zp.shape.lens)}")
    z = p.reshape(m, y_zp, [])
    accf = p.add(m, "convert", [acc], target_type="float32")
    return p.add(m, "quantize_linear", [accf, multiplier, z], dtype=y_zp.shape.dtype, mode="multiply")


def _multiplier(p, m, sa, sb, sy):
    """a_scale * b_scale / y_scale in float32, in that order (as onnxruntime computes it)."""
    return p.add(m, "div", [p.add(m, "mul", [sa, sb]), sy])


def _per_column(p, m, v, b, what, dtype):
    """A parameter of QLinearMatMul's ``b`` as ``dtype``, broadcastable to the product: a scalar, 1-D of N
    values (per column) or b's rank with [..., 1, N] (onnxruntime's batched form)."""
    N = b.shape.lens[-1] if b.shape.ndim > 1 else 1
    vl = list(v.shape.lens)
    if v.shape.elements() == 1:
        lens = []
    elif vl == [N]:
        lens = [N]
    elif b.shape.ndim >= 2 and vl == list(b.shape.lens[:-2]) + [1, N]:
        lens = vl
    else:
        raise p.err(f"{what} {vl} must be a scalar, 1-D of {N} values or {list(b.shape.lens[:-2]) + [1, N]}")
    return p.reshape(m, p.add(m, "convert", [v], target_type=dtype), lens)


@parser("QLinearMatMul")
def _p_qlinear_matmul(p, m, node, ins):
    """y = saturate(round((a - a_zp) @ (b - b_zp) * (a_scale * b_scale / y_scale)) + y_zp), numpy MatMul
    semantics; a's parameters per tensor or per row, b's per tensor or per column (1-D of length N, or
    [..., 1, N] for a batched b as onnxruntime takes them)."""
    ins = list(ins) + [None] * (8 - len(ins))
    a, sa, za, b, sb, zb, sy, zy = ins[:8]
    if any(v is None for v in (a, sa, b, sb, sy, zy)):
        raise p.err("inputs a, a_scale, b, b_scale, y_scale and y_zero_point are required")
    if a.shape.dtype not in _INT8 or b.shape.dtype not in _INT8:
        raise _unsupported(p, node, f"input types {a.shape.dtype} / {b.shape.dtype} (8-bit integers only)")
    if sb.shape.dtype not in ("float32", "float16"):
        raise p.err(f"b_scale must be float32 or float16, got {sb.shape.dtype}")
    if zb is not None and zb.shape.dtype != b.shape.dtype:
        raise p.err(f"b zero point type {zb.shape.dtype} != input type {b.shape.dtype}")
    a1, b1 = a.shape.ndim == 1, b.shape.ndim == 1
    if a.shape.lens[-1] != b.shape.lens[0 if b1 else -2]:
        raise p.err(f"A {list(a.shape.lens)} and B {list(b.shape.lens)}: inner dims differ")
    M = 1 if a1 else a.shape.lens[-2]
    af = _shifted(p, m, a, za, "a", None if a1 else [M, 1])
    bf = p.add(m, "convert", [b], target_type="float64")
    if zb is not None:
        bf = p.add(m, "sub", [bf, _per_column(p, m, zb, b, "b_zero_point", "float64")])
    if a1:
        af = p.add(m, "unsqueeze", [af], axes=[0])
    if b1:
        bf = p.add(m, "unsqueeze", [bf], axes=[1])
    acc = p.add(m, "dot", [af, bf])
    mult = _multiplier(p, m, _scale_f32(p, m, sa, "a_scale", [M, 1]), _per_column(p, m, sb, b, "b_scale", "float32"),
                       _scale_f32(p, m, sy, "y_scale", [1]))
    y = _requantize(p, m, acc, mult, zy)
    if a1:
        y = p.add(m, "squeeze", [y], axes=[-2])
    if b1:
        y = p.add(m, "squeeze", [y], axes=[-1])
    return y


@parser("QLinearConv")
def _p_qlinear_conv(p, m, node, ins):
    """y = saturate(round((conv(x - x_zp, w - w_zp) + B) * (x_scale * w_scale / y_scale)) + y_zp); w's
    parameters per tensor or per output channel, B int32 [M]; x pads with its zero point."""
    ins = list(ins) + [None] * (9 - len(ins))
    x, sx, zx, w, sw, zw, sy, zy, bias = ins[:9]
    if any(v is None for v in (x, sx, w, sw, sy, zy)):
        raise p.err("inputs x, x_scale, w, w_scale, y_scale and y_zero_point are required")
    nsp, strides, dil, pads, group = _integer_conv_geometry(p, node, x, w)
    M = w.shape.lens[0]
    per_m = [M] + [1] * nsp
    if zx is not None and zx.shape.elements() != 1:
        raise p.err(f"x_zero_point {list(zx.shape.lens)} must be a scalar")
    xf = _shifted(p, m, x, zx, "x")
    wf = _shifted(p, m, w, zw, "w", [M] + [1] * (w.shape.ndim - 1))
    acc = p.add(m, "convolution", [xf, wf], padding=pads, stride=strides, dilation=dil, group=group)
    if bias is not None:
        if bias.shape.dtype != "int32" or list(bias.shape.lens) != [M]:
            raise p.err(f"B must be int32 [{M}], got {bias.shape.dtype} {list(bias.shape.lens)}")
        bf = p.reshape(m, p.add(m, "convert", [bias], target_type="float64"), per_m)
        acc = p.add(m, "add", [acc, bf])
    sxf = _scale_f32(p, m, sx, "x_scale", [1])
    mult = _multiplier(p, m, sxf, _scale_f32(p, m, sw, "w_scale", per_m), _scale_f32(p, m, sy, "y_scale", [1]))
    return _requantize(p, m, acc, mult, zy)
