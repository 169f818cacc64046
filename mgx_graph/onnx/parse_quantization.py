"""ONNX parsers for the dynamic-quantization ops: DynamicQuantizeLinear, ConvInteger, MatMulInteger.

All three are lowered to native instructions: DynamicQuantizeLinear to reductions and elementwise ops
(as onnxruntime's CPU kernel computes it), ConvInteger / MatMulInteger to a float64 convolution / GEMM of
the zero-point-shifted operands (every product and partial sum of 8-bit operands is an integer well below
2^53, so float64 accumulation is exact) converted to int32.  Source: ONNX operator spec
(DynamicQuantizeLinear-11, ConvInteger-10, MatMulInteger-10); onnxruntime ``dynamicquantizelinear.cc``.
"""
from __future__ import annotations

import numpy as np
import onnx

from ..errors import UnsupportedOpError
from .op_parser import parser

_INT8 = ("uint8", "int8")


def _attr(node, name, default=None):
    """Attribute ``name`` of ``node`` as a Python value, or ``default`` when absent."""
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _decode(v):
    return v.decode() if isinstance(v, bytes) else v


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
        raise p.err(f"{what} zero point type {zp.shape.dtype} != input type {x.shape.dtype}")
    if zp.shape.elements() != 1 and (zp.shape.ndim != 1 or per_axis_shape is None):
        raise p.err(f"{what} zero point {list(zp.shape.lens)} must be a scalar"
                    + (" or 1-D per channel" if per_axis_shape is not None else ""))
    z = p.add(m, "convert", [zp], target_type="float64")
    if zp.shape.elements() == 1:
        z = p.reshape(m, z, [])
    else:
        if zp.shape.lens[0] != int(np.prod(per_axis_shape)):
            raise p.err(f"{what} zero point {list(zp.shape.lens)} does not match {per_axis_shape}")
        z = p.reshape(m, z, per_axis_shape)
    return p.add(m, "sub", [xf, z])


def _conv_pads(p, node, x, kernel, strides, dil):
    nsp = x.shape.ndim - 2
    auto = _decode(_attr(node, "auto_pad", b"NOTSET")) or "NOTSET"
    pads = list(_attr(node, "pads") or [0] * (2 * nsp))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * nsp)
        for i in range(nsp):
            size = x.shape.lens[2 + i]
            total = max(0, (-(-size // strides[i]) - 1) * strides[i] + dil[i] * (kernel[i] - 1) + 1 - size)
            small, big = total // 2, total - total // 2
            pads[i], pads[i + nsp] = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        pads = [0] * (2 * nsp)
    elif auto != "NOTSET":
        raise p.err(f"auto_pad '{auto}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID")
    if len(pads) != 2 * nsp:
        raise p.err(f"pads {pads} has {len(pads)} values, expected {2 * nsp}")
    return pads


@parser("ConvInteger")
def _p_conv_integer(p, m, node, ins):
    """int32 convolution of (x - x_zero_point) and (w - w_zero_point); x pads with its zero point."""
    ins = list(ins) + [None] * (4 - len(ins))
    x, w, xz, wz = ins[:4]
    if x.shape.dtype not in _INT8 or w.shape.dtype not in _INT8:
        raise _unsupported(p, node, f"input types {x.shape.dtype} / {w.shape.dtype} (8-bit integers only)")
    if x.shape.ndim < 3 or w.shape.ndim != x.shape.ndim:
        raise p.err(f"input {list(x.shape.lens)} and weights {list(w.shape.lens)} ranks do not match")
    nsp = x.shape.ndim - 2
    kernel = list(_attr(node, "kernel_shape") or w.shape.lens[2:])
    strides = list(_attr(node, "strides") or [1] * nsp)
    dil = list(_attr(node, "dilations") or [1] * nsp)
    pads = _conv_pads(p, node, x, kernel, strides, dil)
    M = w.shape.lens[0]
    xf = _shifted(p, m, x, xz, "x")
    wf = _shifted(p, m, w, wz, "w", [M] + [1] * (w.shape.ndim - 1))
    y = p.add(m, "convolution", [xf, wf], padding=pads, stride=strides, dilation=dil,
              group=int(_attr(node, "group", 1)))
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
