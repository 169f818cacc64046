"""Linear (de)quantization: ONNX QuantizeLinear / DequantizeLinear, and the requantization step of
QLinearMatMul / QLinearConv.

The scale and zero point arrive already shaped to broadcast against ``x`` (the parser reshapes per-axis
parameters and expands blocked ones).  Both ops run a few ``xp`` calls through ``out=`` into a declared
workspace (nothing allocated: captured on the gpu target).  Rounding is half to even; saturation to the
output type's range is done with ``fmax`` / ``fmin``, so a NaN quantizes to the type's lowest value and
+-inf to its bounds, as onnxruntime (CPU) does.
Source: ONNX operator spec (QuantizeLinear-21, DequantizeLinear-21); onnxruntime ``quantize_linear.cc``.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape, broadcast_lens
from .base import Operation, check_inputs, register_op

QUANT_TYPES = ("uint8", "int8", "uint16", "int16")
FLOATS = ("float16", "float32", "float64")


def compute_type(*dtypes) -> str:
    """float64 when any of ``dtypes`` is float64 or an int32, else float32 (float16 math runs in float32)."""
    return "float64" if any(d in ("float64", "int32") for d in dtypes) else "float32"


@register_op
class QuantizeLinear(Operation):
    """``y = saturate(round(x / scale) + zero_point)`` (``mode`` "divide"), or ``round(x * scale) + zero_point``
    (``mode`` "multiply": the requantization of QLinearMatMul / QLinearConv, ``scale`` being
    ``a_scale * b_scale / y_scale``).

    Inputs: x (float16/32/64 or int32), scale (float, broadcastable to x), zero_point (``dtype``,
    broadcastable to x).  Output: x's shape, ``dtype`` (uint8, int8, uint16, int16).  The division and
    rounding run in ``precision`` when given (ONNX ``precision``), else float32 (float64 for float64 or
    int32 operands).  Raises ShapeError for other types or
    parameters that do not broadcast to x.
    """

    name = "quantize_linear"
    alloc_free = True

    def __init__(self, dtype="uint8", mode="divide", precision=None):
        super().__init__(dtype=np.dtype(dtype).name, mode=str(mode),
                         precision=None if precision is None else np.dtype(precision).name)

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 3)
        x, s, z = inputs
        if self.dtype not in QUANT_TYPES or z.dtype != self.dtype:
            raise ShapeError(f"{self.name}: output type {self.dtype} / zero point {z.dtype} (expected one of "
                             f"{', '.join(QUANT_TYPES)}, the same for both)")
        if x.dtype not in FLOATS + ("int32",) or s.dtype not in FLOATS + ("int32",):
            raise ShapeError(f"{self.name}: x {x.dtype} / scale {s.dtype} must be float or int32")
        if self.mode not in ("divide", "multiply"):
            raise ShapeError(f"{self.name}: mode '{self.mode}' is not divide or multiply")
        lens = broadcast_lens(x.lens, s.lens, z.lens, where=self.name)
        if tuple(lens) != tuple(x.lens):
            raise ShapeError(f"{self.name}: scale {list(s.lens)} / zero point {list(z.lens)} do not broadcast to "
                             f"x {list(x.lens)}")
        return Shape(self.dtype, x.lens)

    def workspace(self, inputs, output):
        return [Shape(self.precision or compute_type(inputs[0].dtype, inputs[1].dtype), inputs[0].lens)]

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        x, s, z = args
        tmp = ws[0]
        info = np.iinfo(self.dtype)
        fn = xp.true_divide if self.mode == "divide" else xp.multiply
        fn(x, s, out=tmp, dtype=tmp.dtype)
        xp.rint(tmp, out=tmp)
        xp.add(tmp, z, out=tmp, dtype=tmp.dtype)
        xp.fmax(tmp, info.min, out=tmp)  # NaN -> the lowest value
        xp.fmin(tmp, info.max, out=tmp)
        xp.copyto(out, tmp, casting="unsafe")

    def launches(self, inputs, output):
        return 6


@register_op
class DequantizeLinear(Operation):
    """``y = (x - zero_point) * scale``.

    Inputs: x (int8/uint8/int16/uint16/int32), scale (float, broadcastable to x), zero_point (x's type,
    broadcastable).  Output: x's shape, ``dtype`` (float16/32/64; default: scale's type).  Computed in
    float32 (float64 for a float64 scale) and rounded once to ``dtype``.  Raises ShapeError for other types
    or parameters that do not broadcast to x.
    """

    name = "dequantize_linear"
    alloc_free = True

    def __init__(self, dtype=None):
        super().__init__(dtype=None if dtype is None else np.dtype(dtype).name)

    def _out_type(self, s: Shape) -> str:
        return self.dtype or s.dtype

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 3)
        x, s, z = inputs
        if x.dtype not in QUANT_TYPES + ("int32",) or z.dtype != x.dtype:
            raise ShapeError(f"{self.name}: x {x.dtype} / zero point {z.dtype} must be one 8/16-bit integer or "
                             f"int32 type")
        if s.dtype not in FLOATS or self._out_type(s) not in FLOATS:
            raise ShapeError(f"{self.name}: scale {s.dtype} / output {self._out_type(s)} must be float")
        lens = broadcast_lens(x.lens, s.lens, z.lens, where=self.name)
        if tuple(lens) != tuple(x.lens):
            raise ShapeError(f"{self.name}: scale {list(s.lens)} / zero point {list(z.lens)} do not broadcast to "
                             f"x {list(x.lens)}")
        return Shape(self._out_type(s), x.lens)

    def _work(self, inputs):
        return "float64" if inputs[1].dtype == "float64" else "float32"

    def workspace(self, inputs, output):
        work = self._work(inputs)
        return [] if output.dtype == work else [Shape(work, inputs[0].lens)]

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        x, s, z = args
        tmp = ws[0] if ws else out
        xp.subtract(x, z, out=tmp, dtype=tmp.dtype)
        xp.multiply(tmp, s, out=tmp, dtype=tmp.dtype)
        if ws:
            xp.copyto(out, tmp, casting="unsafe")

    def launches(self, inputs, output):
        return 2 + bool(self.workspace(inputs, output))
