"""Normalizations: InstanceNormalization, GroupNormalization, MeanVarianceNormalization,
LpNormalization, LRN and RMSNormalization, as native instructions (float16 computed in float32).

ONNX operator spec: https://onnx.ai/onnx/operators/
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError
from ..ir.shape import broadcast_lens
from .op_parser import attr, check_axes, check_axis, parser, require_float, unsupported


def _stash(p, node) -> None:
    """stash_type 1 (float32; float64 inputs are computed in float64, as onnxruntime does)."""
    st = attr(node, "stash_type", 1)
    if st != 1:
        raise unsupported(p, node, f"stash_type={st} (only 1, float32, is implemented)")


def _channel(p, m, v, rank: int):
    """A per-channel vector [C] as [C, 1, ...] for an input of ``rank`` laid out [N, C, ...]."""
    return p.reshape(m, v, [v.shape.elements()] + [1] * (rank - 2))


@parser("InstanceNormalization")
def _p_instance_norm(p, m, node, ins):
    x, scale, bias = ins[:3]
    require_float(p, x)
    r, C = x.shape.ndim, x.shape.lens[1] if x.shape.ndim > 1 else 0
    if r < 3:
        raise p.err(f"input must be [N, C, D1, ...] (rank >= 3), got {list(x.shape.lens)}")
    for v, what in ((scale, "scale"), (bias, "B")):
        if v.shape.elements() != C:
            raise p.err(f"{what} must have C={C} elements, got {list(v.shape.lens)}")
    return p.add(m, "mean_var_norm", [x, _channel(p, m, scale, r), _channel(p, m, bias, r)],
                 axes=list(range(2, r)), epsilon=attr(node, "epsilon", 1e-5))


@parser("GroupNormalization")
def _p_group_norm(p, m, node, ins):
    """Grouped as [N, G, C/G, prod(spatial)] and normalized over the last two axes; scale and bias are
    per channel (opset 21) or per group (opset 18) and broadcast in that layout."""
    x, scale, bias = ins[:3]
    require_float(p, x)
    _stash(p, node)
    G = attr(node, "num_groups")
    lens = list(x.shape.lens)
    if G is None or len(lens) < 2 or G < 1 or lens[1] % G:
        raise p.err(f"num_groups={G} must divide the channel dim of {lens}")
    C = lens[1]
    per_group = p.opset < 21
    want = G if per_group else C
    for v, what in ((scale, "scale"), (bias, "bias")):
        if v.shape.elements() != want:
            raise p.err(f"{what} must have {want} elements ({'num_groups' if per_group else 'C'}), got "
                        f"{list(v.shape.lens)}")
    grouped = p.reshape(m, x, [lens[0], G, C // G, math.prod(lens[2:])])
    vshape = [G, 1, 1] if per_group else [G, C // G, 1]
    y = p.add(m, "mean_var_norm", [grouped, p.reshape(m, scale, vshape), p.reshape(m, bias, vshape)],
              axes=[2, 3], epsilon=attr(node, "epsilon", 1e-5))
    return p.reshape(m, y, lens)


@parser("MeanVarianceNormalization")
def _p_mvn(p, m, node, ins):
    """``(x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9)`` over ``axes`` (the function body of the spec)."""
    x = ins[0]
    require_float(p, x)
    # a repeated axis counts once (onnxruntime)
    axes = sorted(set(check_axes(p, attr(node, "axes", [0, 2, 3]), x.shape.ndim, unique=False)))
    return p.add(m, "mean_var_norm", [x], axes=axes, epsilon=1e-9, eps_on_std=1, moments="raw")


@parser("LpNormalization")
def _p_lp_norm(p, m, node, ins):
    x = ins[0]
    require_float(p, x)
    pn = attr(node, "p", 2)
    if pn not in (1, 2):
        raise unsupported(p, node, f"p={pn} (the spec allows 1 and 2)")
    return p.add(m, "lp_norm", [x], axis=check_axis(p, attr(node, "axis", -1), x.shape.ndim), p=pn)


@parser("LRN")
def _p_lrn(p, m, node, ins):
    x = ins[0]
    require_float(p, x)
    size = attr(node, "size")
    if size is None or size < 1:  # the spec allows an even size (onnxruntime does not)
        raise p.err(f"'size' = {size} must be a positive integer")
    return p.add(m, "lrn", [x], size=size, alpha=attr(node, "alpha", 1e-4), beta=attr(node, "beta", 0.75),
                 bias=attr(node, "bias", 1.0))


@parser("RMSNormalization")
def _p_rms_norm(p, m, node, ins):
    x, scale = ins[:2]
    require_float(p, x)
    _stash(p, node)
    r = x.shape.ndim
    a = check_axis(p, attr(node, "axis", -1), r)
    normalized = tuple(x.shape.lens[a:])
    try:
        fits = tuple(broadcast_lens(normalized, scale.shape.lens, where=p.node_name)) == normalized
    except ShapeError:
        fits = False
    if not fits:
        raise p.err(f"scale {list(scale.shape.lens)} does not broadcast to the normalized dims {list(normalized)}")
    return p.add(m, "rms_norm", [x, scale], axis=a, epsilon=attr(node, "epsilon", 1e-5))


def layernorm_with_stats(p, m, node, ins):
    """LayerNormalization with its Mean / InvStdDev outputs, as reductions and pointwise instructions
    (fused on the gpu target): ``mean = E[x]``, ``inv = 1 / sqrt(E[(x - mean)^2] + epsilon)`` over axes
    ``axis..rank-1`` (kept as 1s), computed in float32 (float64 inputs in float64);
    ``Y = (x - mean) * inv * scale (+ B)`` in x's type.  Outputs: [Y, Mean, InvStdDev]."""
    x, scale = ins[:2]
    bias = ins[2] if len(ins) > 2 else None
    require_float(p, x)
    _stash(p, node)
    r = x.shape.ndim
    a = check_axis(p, attr(node, "axis", -1), r)
    dt = x.shape.dtype
    st = "float64" if dt == "float64" else "float32"
    xf = x if dt == st else p.add(m, "convert", [x], target_type=st)
    axes = list(range(a, r))
    mean = p.add(m, "reduce_mean", [xf], axes=axes, keepdims=1)
    d = p.add(m, "sub", [xf, mean])
    var = p.add(m, "reduce_mean", [p.add(m, "mul", [d, d])], axes=axes, keepdims=1)
    eps = p.lit(m, np.array(attr(node, "epsilon", 1e-5), st))
    inv = p.add(m, "recip", [p.add(m, "sqrt", [p.add(m, "add", [var, eps])])])
    y = p.add(m, "mul", [d, inv])
    if dt != st:
        y = p.add(m, "convert", [y], target_type=dt)
    y = p.add(m, "mul", [y, scale])
    if bias is not None:
        y = p.add(m, "add", [y, bias])
    return [y, mean, inv]
