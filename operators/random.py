"""Random number ops (ONNX RandomUniform[Like], RandomNormal[Like], Bernoulli).

A replayed graph would repeat the numbers it recorded (the PyTorch / flash-attention RNG lesson), so
these ops are never captured: they are graph boundaries and draw fresh numbers on every run.  Each
instruction owns a numpy ``Generator`` (seeded by the ``seed`` attribute when given), so a program with
a seed reproduces the same sequence run after run, and successive runs differ.
"""
from __future__ import annotations

import numpy as np

from ..ir.shape import Shape
from .base import Operation, register_op


class _Random(Operation):
    capturable = False
    foldable = False

    def __init__(self, seed=None, dtype="float32", shape=None, **attrs):
        super().__init__(seed=None if seed is None else float(seed), dtype=np.dtype(dtype).name,
                         shape=None if shape is None else [int(d) for d in shape], **attrs)
        self._rng = np.random.default_rng(None if seed is None else int(np.float32(seed).view(np.int32)))

    def compute_shape(self, inputs, mods=()):
        lens = self.shape if self.shape is not None else inputs[0].lens
        return Shape(self.dtype, lens)

    def draw(self, shape):
        raise NotImplementedError

    def compute(self, ctx, out, args, ws):
        host = self.draw(out.shape, args).astype(out.dtype, copy=False)
        if ctx.xp is np:
            out[...] = host
        else:
            out.set(host)

    def attr_string(self):
        items = {k: v for k, v in self.attrs.items() if v is not None and k not in ("shape",)}
        return "[" + ",".join(f"{k}={v}" for k, v in items.items()) + "]" if items else ""


@register_op
class RandomUniform(_Random):
    name = "random_uniform"

    def __init__(self, low=0.0, high=1.0, **kw):
        super().__init__(low=float(low), high=float(high), **kw)

    def draw(self, shape, args):
        return self._rng.uniform(self.low, self.high, size=shape)


@register_op
class RandomNormal(_Random):
    name = "random_normal"

    def __init__(self, mean=0.0, scale=1.0, **kw):
        super().__init__(mean=float(mean), scale=float(scale), **kw)

    def draw(self, shape, args):
        return self._rng.normal(self.mean, self.scale, size=shape)


@register_op
class Bernoulli(_Random):
    name = "bernoulli"

    def draw(self, shape, args):
        p = args[0]
        p = np.asarray(p if isinstance(p, np.ndarray) else p.get())
        return (self._rng.random(size=shape) < p).astype(self.dtype)
