"""Smooth activations: ONNX Mish (opset 18) and Swish (opset 24).

On the gpu target each is one elementwise kernel of a CUDA / HIP statement (:mod:`.pointwise_gpu`);
the ``ref`` kernel is numpy.

ONNX spec: https://onnx.ai/onnx/operators/onnx__Mish.html, https://onnx.ai/onnx/operators/onnx__Swish.html
"""
from __future__ import annotations

import numpy as np

from .base import register_op
from .pointwise import _Param1


@register_op
class Mish(_Param1):
    """``y = x * tanh(softplus(x))`` with ``softplus(x) = log(1 + exp(x))``; float16/32/64."""

    name = "mish"

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        if x.dtype == np.float16:  # as the gpu kernel: computed in float32, rounded once
            x = x.astype(np.float32)
        out[...] = x * xp.tanh(xp.logaddexp(x, x.dtype.type(0)))


@register_op
class Swish(_Param1):
    """``y = x * sigmoid(alpha * x)``; float16/32/64."""

    name = "swish"

    def __init__(self, alpha=1.0):
        super().__init__(alpha=float(alpha))

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        if x.dtype == np.float16:
            x = x.astype(np.float32)
        a = x.dtype.type(self.alpha)
        with np.errstate(over="ignore"):
            out[...] = x / (1 + xp.exp(-a * x))
