"""Shape and data movement: Reshape, Flatten, Transpose, Squeeze / Unsqueeze, Slice, Concat, Split,
Expand, Tile, Pad, Gather / GatherElements / GatherND, ScatterND / ScatterElements.  Shape-like inputs
(``shape``, ``axes``, ``starts`` ...) must be known at parse time: literals, or values the program is
specialized for (``p.const``).

ONNX operator spec: https://onnx.ai/onnx/operators/
"""
from __future__ import annotations

import math

import numpy as np

from .op_parser import attr, decode, ints, parser


@parser("Reshape")
def _parse_reshape(p, m, node, ins):
    x = ins[0]
    if p.opset < 5:
        shape = list(attr(node, "shape"))
    else:
        shape = ints(p.const(ins[1], "shape"))
    allowzero = attr(node, "allowzero", 0)
    lens = []
    for i, d in enumerate(shape):
        if d == 0 and not allowzero:
            lens.append(x.shape.lens[i])
        else:
            lens.append(d)
    if lens.count(-1) > 1:
        raise p.err(f"shape {shape} has more than one -1")
    if -1 in lens:
        known = math.prod(d for d in lens if d != -1)
        if known == 0 or x.shape.elements() % known:
            raise p.err(f"cannot reshape {list(x.shape.lens)} to {shape}")
        lens[lens.index(-1)] = x.shape.elements() // known
    if math.prod(lens) != x.shape.elements():
        raise p.err(f"cannot reshape {list(x.shape.lens)} ({x.shape.elements()} elements) to {shape}")
    return p.reshape(m, x, lens)


@parser("Flatten")
def _parse_flatten(p, m, node, ins):
    x = ins[0]
    axis = attr(node, "axis", 1)
    axis = axis + x.shape.ndim if axis < 0 else axis
    lens = x.shape.lens
    return p.reshape(m, x, [math.prod(lens[:axis]), math.prod(lens[axis:])])


@parser("Transpose")
def _parse_transpose(p, m, node, ins):
    x = ins[0]
    perm = attr(node, "perm", list(reversed(range(x.shape.ndim))))
    if list(perm) == list(range(x.shape.ndim)):
        return x
    return p.add(m, "transpose", [x], permutation=list(perm))


@parser("Squeeze")
def _parse_squeeze(p, m, node, ins):
    if p.opset < 13:
        axes = attr(node, "axes", [])
    else:
        axes = [] if len(ins) < 2 or ins[1] is None else ints(p.const(ins[1], "axes"))
    return p.add(m, "squeeze", [ins[0]], axes=list(axes))


@parser("Unsqueeze")
def _parse_unsqueeze(p, m, node, ins):
    axes = attr(node, "axes", []) if p.opset < 13 else ints(p.const(ins[1], "axes"))
    return p.add(m, "unsqueeze", [ins[0]], axes=list(axes))


@parser("Slice")
def _parse_slice(p, m, node, ins):
    x = ins[0]
    if p.opset < 10:
        starts, ends = list(attr(node, "starts")), list(attr(node, "ends"))
        axes = list(attr(node, "axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = ints(p.const(ins[1], "starts"))
        ends = ints(p.const(ins[2], "ends"))
        axes = ints(p.const(ins[3], "axes")) if len(ins) > 3 and ins[3] is not None \
            else list(range(len(starts)))
        steps = ints(p.const(ins[4], "steps")) if len(ins) > 4 and ins[4] is not None \
            else [1] * len(starts)
    if any(s == 0 for s in steps):
        raise p.err("slice step 0")
    big = 1 << 62
    starts = [max(min(s, big), -big) for s in starts]
    ends = [max(min(e, big), -big) for e in ends]
    return p.add(m, "slice", [x], axes=axes, starts=starts, ends=ends, steps=steps)


@parser("Concat")
def _parse_concat(p, m, node, ins):
    ins = [i for i in ins if i is not None]
    axis = attr(node, "axis")
    nonempty = [i for i in ins if i.shape.elements() > 0]
    if len(nonempty) == 1 and len(ins) > 1:
        return nonempty[0]
    if len(ins) == 1:
        return ins[0]
    return p.add(m, "concat", ins, axis=axis)


@parser("Split")
def _parse_split(p, m, node, ins):
    x = ins[0]
    axis = attr(node, "axis", 0)
    a = axis + x.shape.ndim if axis < 0 else axis
    d = x.shape.lens[a]
    n = len(node.output)
    if p.opset < 13:
        split = attr(node, "split")
    else:
        split = ints(p.const(ins[1], "split")) if len(ins) > 1 and ins[1] is not None else None
    if split is None:
        k = attr(node, "num_outputs", n)
        chunk = -(-d // k)
        split = [min(chunk, d - i * chunk) for i in range(k)]
    if sum(split) != d:
        raise p.err(f"split sizes {list(split)} do not add up to dim {d}")
    outs, pos = [], 0
    for s in split:
        outs.append(p.add(m, "slice", [x], axes=[a], starts=[pos], ends=[pos + s], steps=[1]))
        pos += s
    return outs


@parser("Expand")
def _parse_expand(p, m, node, ins):
    from ..shape import broadcast_lens

    x = ins[0]
    shape = ints(p.const(ins[1], "shape"))
    lens = broadcast_lens(x.shape.lens, shape, where=p.node_name)
    if tuple(lens) == tuple(x.shape.lens):
        return x
    return p.add(m, "multibroadcast", [x], out_lens=list(lens))


@parser("Tile")
def _parse_tile(p, m, node, ins):
    reps = ints(p.const(ins[1], "repeats"))
    return p.add(m, "tile", [ins[0]], repeats=reps)


@parser("Pad")
def _parse_pad(p, m, node, ins):
    x = ins[0]
    mode = decode(attr(node, "mode", b"constant"))
    if p.opset < 11:
        pads, value = list(attr(node, "pads")), attr(node, "value", 0.0)
    else:
        pads = ints(p.const(ins[1], "pads"))
        value = 0.0
        if len(ins) > 2 and ins[2] is not None:
            cv = p.const(ins[2], "constant_value")
            value = float(np.asarray(cv).reshape(-1)[0]) if np.asarray(cv).size else 0.0
        if len(ins) > 3 and ins[3] is not None:
            axes = [int(a) % x.shape.ndim for a in p.const(ins[3], "axes")]
            full = [0] * (2 * x.shape.ndim)
            for i, a in enumerate(axes):
                full[a], full[a + x.shape.ndim] = pads[i], pads[i + len(axes)]
            pads = full
    return p.add(m, "pad", [x], pads=pads, mode=mode, value=value)


@parser("Gather")
def _parse_gather(p, m, node, ins):
    return p.add(m, "gather", ins, axis=attr(node, "axis", 0))


@parser("GatherElements")
def _parse_gather_el(p, m, node, ins):
    return p.add(m, "gather_elements", ins, axis=attr(node, "axis", 0))


@parser("GatherND")
def _parse_gathernd(p, m, node, ins):
    return p.add(m, "gathernd", ins, batch_dims=attr(node, "batch_dims", 0))


@parser("ScatterND")
def _parse_scatternd(p, m, node, ins):
    return p.add(m, "scatternd", ins, reduction=decode(attr(node, "reduction", b"none")))


@parser("ScatterElements", "Scatter")
def _parse_scatter_el(p, m, node, ins):
    return p.add(m, "scatter_elements", ins, axis=attr(node, "axis", 0),
                 reduction=decode(attr(node, "reduction", b"none")))
