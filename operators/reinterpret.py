"""BitCast: a tensor's bytes reinterpreted as another element type of the same width.

ONNX operator spec: https://onnx.ai/onnx/operators/onnx__BitCast.html (opset 26; little endian, as
numpy / CuPy on every supported host and device).
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape
from .base import Operation, check_inputs, register_op


@register_op
class BitCast(Operation):
    """``out`` (type ``to``, the input's shape) holds the input's bytes unchanged.

    The input is copied into the output buffer viewed as the input's type (one copy kernel, no
    temporaries: capturable).  Raises ShapeError when ``to`` has a different width than the input
    type (the spec requires equal bit widths)."""

    name = "bitcast"
    alloc_free = True

    def __init__(self, to="float32"):
        super().__init__(to=str(to))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        if np.dtype(x.dtype).itemsize != np.dtype(self.to).itemsize:
            raise ShapeError(f"{self.name}: {x.dtype} ({8 * np.dtype(x.dtype).itemsize} bits) cannot be "
                             f"reinterpreted as {self.to} ({8 * np.dtype(self.to).itemsize} bits)")
        return Shape(self.to, x.lens)

    def compute(self, ctx, out, args, ws):
        ctx.xp.copyto(out.view(args[0].dtype), args[0])

    def launches(self, inputs, output):
        return 1
