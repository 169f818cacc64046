"""Values known at parse time: Constant, ConstantOfShape, and the shape arithmetic Shape / Size /
Range, which become literals (their results depend only on static shapes and on inputs known at parse
time: literals, or values the program is specialized for).  A ConstantOfShape or Range of more than
:data:`~mgx_graph.ir.fold.FOLD_LIMIT` elements is not made a literal: it is computed at run time from
scalars (:func:`run_time_iota`), so a model of a few bytes never makes the parser allocate gigabytes.

ONNX operator spec: https://onnx.ai/onnx/operators/
"""
from __future__ import annotations

import numpy as np

from ..ir.fold import FOLD_LIMIT

from .op_parser import attr, ints, parser
from .schema_check import read_tensor


@parser("Constant")
def _parse_constant(p, m, node, ins):
    a = node.attribute[0]
    if a.name == "value":
        v = read_tensor(a.t, f"node '{p.node_name}' (Constant): attribute 'value'")
    elif a.name == "value_float":
        v = np.array(a.f, dtype=np.float32)
    elif a.name == "value_floats":
        v = np.array(list(a.floats), dtype=np.float32)
    elif a.name == "value_int":
        v = np.array(a.i, dtype=np.int64)
    elif a.name == "value_ints":
        v = np.array(list(a.ints), dtype=np.int64)
    else:
        raise p.err(f"Constant attribute '{a.name}' is not supported")
    return p.lit(m, v)


@parser("ConstantOfShape")
def _parse_constant_of_shape(p, m, node, ins):
    lens = [int(d) for d in ints(p.const(ins[0], "input"))]
    t = attr(node, "value")
    v = read_tensor(t, f"node '{p.node_name}' (ConstantOfShape): attribute 'value'") if t is not None \
        else np.zeros(1, np.float32)
    if _count(lens) > FOLD_LIMIT:  # a broadcast scalar made contiguous at run time, never a literal
        wide = p.add(m, "multibroadcast", [p.lit(m, v.reshape(-1)[:1].reshape([1] * len(lens)))], out_lens=lens)
        return p.add(m, "contiguous", [wide])
    return p.lit(m, np.full(lens, v.reshape(-1)[0], dtype=v.dtype))


def _count(lens) -> int:
    n = 1
    for d in lens:
        n *= max(int(d), 0)
    return n


def run_time_iota(p, m, n: int):
    """``0 .. n-1`` (int64) computed at run time, an exclusive scan of ``n`` broadcast ones: no literal of ``n``
    elements."""
    ones = p.add(m, "multibroadcast", [p.lit(m, np.ones(1, np.int64))], out_lens=[n])
    return p.add(m, "cumsum", [ones], axis=0, exclusive=1)


@parser("Shape")
def _parse_shape(p, m, node, ins):
    lens = list(ins[0].shape.lens)
    start, end = attr(node, "start", 0), attr(node, "end", None)
    return p.lit(m, np.array(lens[slice(start, end)], dtype=np.int64))


@parser("Size")
def _parse_size(p, m, node, ins):
    return p.lit(m, np.array(ins[0].shape.elements(), dtype=np.int64))


@parser("Range")
def _parse_range(p, m, node, ins):
    for x, what in zip(ins, ("start", "limit", "delta")):
        if x.shape.elements() != 1:  # onnxruntime's kernel takes a scalar or one-element vector
            raise p.err(f"{what} must be a scalar, got {list(x.shape.lens)}")
    s, l, d = (np.asarray(p.const(i, n)) for i, n in zip(ins, ("start", "limit", "delta")))
    dt = s.dtype
    s, l, d = (v.reshape(-1)[0] for v in (s, l, d))
    if d == 0:
        raise p.err("delta must not be 0")
    n = max(int(np.ceil((l - s) / d)), 0)  # ONNX: number_of_elements = max(ceil((limit - start) / delta), 0)
    if n <= FOLD_LIMIT:
        return p.lit(m, (s + np.arange(n) * d).astype(dt))
    wide = np.result_type(np.int64, dt)  # start + i * delta as the literal's numpy arithmetic does it
    steps = p.add(m, "convert", [run_time_iota(p, m, n)], target_type=wide.name)
    scaled = p.add(m, "mul", [steps, p.add(m, "multibroadcast", [p.lit(m, np.array([d], wide))], out_lens=[n])])
    moved = p.add(m, "add", [p.add(m, "multibroadcast", [p.lit(m, np.array([s], wide))], out_lens=[n]), scaled])
    return moved if wide == dt else p.add(m, "convert", [moved], target_type=dt.name)
