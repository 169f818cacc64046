"""Random generators: RandomUniform / RandomNormal (and their ``Like`` forms) and Bernoulli, drawn by
the ``random_*`` ops with the node's ``seed``.

ONNX operator spec: https://onnx.ai/onnx/operators/
"""
from __future__ import annotations

from ..ir.shape import onnx_dtype
from .op_parser import attr, parser


@parser("RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Bernoulli")
def _parse_random(p, m, node, ins):
    t = node.op_type
    seed = attr(node, "seed")
    if t.endswith("Like") or t == "Bernoulli":
        dt = attr(node, "dtype")
        dtype = onnx_dtype(dt, p.node_name) if dt is not None else ins[0].shape.dtype
        kw = dict(seed=seed, dtype=dtype)
        args = [ins[0]]
    else:
        dtype = onnx_dtype(attr(node, "dtype", 1), p.node_name)
        kw = dict(seed=seed, dtype=dtype, shape=list(attr(node, "shape")))
        args = []
    if t.startswith("RandomUniform"):
        return p.add(m, "random_uniform", args, low=attr(node, "low", 0.0), high=attr(node, "high", 1.0), **kw)
    if t.startswith("RandomNormal"):
        return p.add(m, "random_normal", args, mean=attr(node, "mean", 0.0), scale=attr(node, "scale", 1.0), **kw)
    return p.add(m, "bernoulli", args, **kw)
