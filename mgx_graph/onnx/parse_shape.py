"""Shape and data movement: Reshape, Flatten, Transpose, Squeeze / Unsqueeze, Slice, Concat, Split,
Expand, Tile, Pad, Gather / GatherElements / GatherND, ScatterND / ScatterElements.  Shape-like inputs
(``shape``, ``axes``, ``starts`` ...) must be known at parse time: literals, or values the program is
specialized for (``p.const``).

ONNX operator spec: https://onnx.ai/onnx/operators/
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError
from .op_parser import attr, check_axes, check_axis, check_count, check_min, check_perm, decode, ints, parser


@parser("Reshape")
def _parse_reshape(p, m, node, ins):
    x = ins[0]
    if p.opset < 5:
        shape = list(attr(node, "shape"))
    else:
        if ins[1].shape.ndim != 1:
            raise p.err(f"'shape' has shape {list(ins[1].shape.lens)}: expected a 1-D tensor")
        shape = ints(p.const(ins[1], "shape"))
    allowzero = attr(node, "allowzero", 0)
    if any(d < -1 for d in shape):
        raise p.err(f"'shape' = {shape} is out of range: expected dims >= -1")
    if shape.count(-1) > 1:
        raise p.err(f"'shape' = {shape} has more than one -1: expected at most one")
    if allowzero and -1 in shape and 0 in shape:
        raise p.err(f"'shape' = {shape} holds both 0 and -1 with allowzero=1: expected at most one of them")
    if not allowzero and 0 in shape[x.shape.ndim:]:
        at = x.shape.ndim + shape[x.shape.ndim:].index(0)
        raise p.err(f"'shape' = {shape} has a 0 (copy the input dim) at index {at}: expected 0 only at indices "
                    f"< input rank {x.shape.ndim}")
    lens = [x.shape.lens[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]
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
    axis = check_axis(p, attr(node, "axis", 1), x.shape.ndim, upper=x.shape.ndim)
    lens = x.shape.lens
    return p.reshape(m, x, [math.prod(lens[:axis]), math.prod(lens[axis:])])


@parser("Transpose")
def _parse_transpose(p, m, node, ins):
    x = ins[0]
    perm = check_perm(p, attr(node, "perm", list(reversed(range(x.shape.ndim)))), x.shape.ndim)
    if list(perm) == list(range(x.shape.ndim)):
        return x
    return p.add(m, "transpose", [x], permutation=list(perm))


@parser("Squeeze")
def _parse_squeeze(p, m, node, ins):
    if p.opset < 13:
        axes = attr(node, "axes", [])
    else:
        axes = [] if len(ins) < 2 or ins[1] is None else ints(p.const(ins[1], "axes"))
    lens = ins[0].shape.lens
    for a in check_axes(p, axes, len(lens), unique=False):
        if lens[a] != 1:
            raise p.err(f"'axes' = {list(axes)} names axis {a} of size {lens[a]}: expected axes of size 1 "
                        f"(input {list(lens)})")
    return p.add(m, "squeeze", [ins[0]], axes=list(axes))


@parser("Unsqueeze")
def _parse_unsqueeze(p, m, node, ins):
    axes = attr(node, "axes", []) if p.opset < 13 else ints(p.const(ins[1], "axes"))
    check_axes(p, axes, ins[0].shape.ndim + len(axes))
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
    n = len(starts)
    check_count(p, ends, n, "ends", "one per value of 'starts'")
    axes = check_axes(p, check_count(p, axes, n, "axes", "one per value of 'starts'"), x.shape.ndim)
    check_count(p, steps, n, "steps", "one per value of 'starts'")
    if any(s == 0 for s in steps):
        raise p.err(f"'steps' = {steps} holds 0: expected nonzero steps")
    big = 1 << 62
    starts = [max(min(s, big), -big) for s in starts]
    ends = [max(min(e, big), -big) for e in ends]
    return p.add(m, "slice", [x], axes=axes, starts=starts, ends=ends, steps=steps)


@parser("Concat")
def _parse_concat(p, m, node, ins):
    ins = [i for i in ins if i is not None]
    axis = attr(node, "axis")
    if axis is None:
        raise p.err("attribute 'axis' is required")
    r = ins[0].shape.ndim
    axis = check_axis(p, axis, r)
    for i in ins[1:]:
        if i.shape.ndim != r:
            raise p.err(f"inputs have ranks {[j.shape.ndim for j in ins]}: expected one rank")
    nonempty = [i for i in ins if i.shape.elements() > 0]
    if len(nonempty) == 1 and len(ins) > 1:
        return nonempty[0]
    if len(ins) == 1:
        return ins[0]
    return p.add(m, "concat", ins, axis=axis)


@parser("Split")
def _parse_split(p, m, node, ins):
    x = ins[0]
    a = check_axis(p, attr(node, "axis", 0), x.shape.ndim)
    d = x.shape.lens[a]
    n = len(node.output)
    if p.opset < 13:
        split = attr(node, "split")
    else:
        split = ints(p.const(ins[1], "split")) if len(ins) > 1 and ins[1] is not None else None
    if split is not None and attr(node, "num_outputs") is not None:
        raise p.err("both the 'split' input and the 'num_outputs' attribute are given: expected one")
    if split is None:
        k = check_min(p, attr(node, "num_outputs", n), 1, "num_outputs")[0]
        if p.opset >= 18 and attr(node, "num_outputs") is None:
            raise p.err("neither the 'split' input nor the 'num_outputs' attribute is given: expected one")
        if k != n:
            raise p.err(f"'num_outputs' = {k}: expected the number of outputs, {n}")
        chunk = -(-d // k)
        split = [min(chunk, d - i * chunk) for i in range(k)]
    split = check_min(p, check_count(p, split, n, "split", "one per output"), 0, "split")
    if sum(split) != d:
        raise p.err(f"'split' = {split} adds up to {sum(split)}: expected dim {d} of axis {a}")
    outs, pos = [], 0
    for s in split:
        outs.append(p.add(m, "slice", [x], axes=[a], starts=[pos], ends=[pos + s], steps=[1]))
        pos += s
    return outs


@parser("Expand")
def _parse_expand(p, m, node, ins):
    from ..ir.shape import broadcast_lens

    x = ins[0]
    shape = ints(p.const(ins[1], "shape"))
    check_min(p, shape, 0, "shape")
    try:
        lens = broadcast_lens(x.shape.lens, shape, where="")
    except ShapeError:
        raise p.err(f"'shape' = {shape} does not broadcast with input {list(x.shape.lens)}") from None
    if tuple(lens) == tuple(x.shape.lens):
        return x
    return p.add(m, "multibroadcast", [x], out_lens=list(lens))


@parser("Tile")
def _parse_tile(p, m, node, ins):
    r = ins[0].shape.ndim
    reps = check_min(p, check_count(p, ints(p.const(ins[1], "repeats")), r, "repeats", f"input rank {r}"), 0,
                     "repeats")
    return p.add(m, "tile", [ins[0]], repeats=reps)


_PAD_MODES = ("constant", "reflect", "edge", "wrap")


@parser("Pad")
def _parse_pad(p, m, node, ins):
    x = ins[0]
    mode = decode(attr(node, "mode", b"constant"))
    if mode not in _PAD_MODES:
        raise p.err(f"'mode' = '{mode}' is not one of {', '.join(_PAD_MODES)}")
    if p.opset < 11:
        pads, value = list(attr(node, "pads")), attr(node, "value", 0.0)
    else:
        pads = ints(p.const(ins[1], "pads"))
        value = 0.0
        if len(ins) > 2 and ins[2] is not None:
            cv = p.const(ins[2], "constant_value")
            value = float(np.asarray(cv).reshape(-1)[0]) if np.asarray(cv).size else 0.0
        if len(ins) > 3 and ins[3] is not None:
            axes = check_axes(p, ints(p.const(ins[3], "axes")), x.shape.ndim)
            check_count(p, pads, 2 * len(axes), "pads", f"two per axis of 'axes' = {len(axes)}")
            full = [0] * (2 * x.shape.ndim)
            for i, a in enumerate(axes):
                full[a], full[a + x.shape.ndim] = pads[i], pads[i + len(axes)]
            pads = full
    check_count(p, pads, 2 * x.shape.ndim, "pads", f"two per dim of input rank {x.shape.ndim}")
    return p.add(m, "pad", [x], pads=pads, mode=mode, value=value)


@parser("Gather")
def _parse_gather(p, m, node, ins):
    return p.add(m, "gather", ins, axis=check_axis(p, attr(node, "axis", 0), ins[0].shape.ndim))


@parser("GatherElements")
def _parse_gather_el(p, m, node, ins):
    _same_rank(p, ins[0], ins[1], "indices")
    return p.add(m, "gather_elements", ins, axis=check_axis(p, attr(node, "axis", 0), ins[0].shape.ndim))


@parser("GatherND")
def _parse_gathernd(p, m, node, ins):
    r, q = ins[0].shape.ndim, ins[1].shape.ndim
    b = attr(node, "batch_dims", 0)
    if not 0 <= b < min(r, q):
        raise p.err(f"'batch_dims' = {b} is out of range: expected [0, {min(r, q) - 1}] for data rank {r} and "
                    f"indices rank {q}")
    if q and not 1 <= ins[1].shape.lens[-1] <= r - b:
        raise p.err(f"the last dim of indices {list(ins[1].shape.lens)} is out of range: expected [1, {r - b}] "
                    f"(data rank {r} - batch_dims {b})")
    return p.add(m, "gathernd", ins, batch_dims=b)


@parser("ScatterND")
def _parse_scatternd(p, m, node, ins):
    data, idx, upd = (v.shape for v in ins[:3])
    k = idx.lens[-1] if idx.ndim else 0
    if idx.ndim < 1 or not 1 <= k <= data.ndim:
        raise p.err(f"the last dim of indices {list(idx.lens)} is out of range: expected [1, {data.ndim}] (data rank)")
    want = list(idx.lens[:-1]) + list(data.lens[k:])
    if list(upd.lens) != want:
        raise p.err(f"updates {list(upd.lens)} must be indices.shape[:-1] + data.shape[{k}:] = {want}")
    return p.add(m, "scatternd", ins, reduction=_reduction(node))


@parser("ScatterElements", "Scatter")
def _parse_scatter_el(p, m, node, ins):
    _same_rank(p, ins[0], ins[1], "indices")
    _same_rank(p, ins[0], ins[2], "updates")
    return p.add(m, "scatter_elements", ins, axis=check_axis(p, attr(node, "axis", 0), ins[0].shape.ndim),
                 reduction=_reduction(node))


def _same_rank(p, data, other, what):
    if other.shape.ndim != data.shape.ndim:
        raise p.err(f"{what} {list(other.shape.lens)} has rank {other.shape.ndim}: expected the rank of data "
                    f"{list(data.shape.lens)}, {data.shape.ndim}")


_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _reduction(node) -> str:
    """The ``reduction`` of a scatter; one that is none of ``_REDUCTIONS`` is "none", as onnxruntime takes it."""
    r = decode(attr(node, "reduction", b"none"))
    return r if r in _REDUCTIONS else "none"
