"""Values known at parse time: Constant, ConstantOfShape, and the shape arithmetic Shape / Size /
Range, which become literals (their results depend only on static shapes and on inputs known at parse
time: literals, or values the program is specialized for).  A ConstantOfShape or Range of more than
:data:`~mgx_graph.ir.fold.FOLD_LIMIT` elements is not made a literal: it is computed at run time from
scalars (:func:`run_time_iota`), so a model of a few bytes never makes the parser allocate gigabytes.

The helpers every parser uses for values sized by a model's declared shapes or attributes follow the same
rule: :func:`filled` (a constant tensor) and :func:`iota` (``0 .. n-1``) are literals up to
``FOLD_LIMIT`` elements and instructions computing them at run time beyond; :func:`check_table` refuses,
with a CompileError naming the node and the sizes, a host-computed table (Resize's interpolation tables,
MaxPool's index maps) of more than :data:`TABLE_LIMIT` elements before it is computed.

ONNX operator spec: https://onnx.ai/onnx/operators/
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import CompileError
from ..ir.fold import FOLD_LIMIT

#: the most elements of a table computed on the host while parsing (Resize's interpolation tables, MaxPool's
#: index maps), which no instruction computes at run time: beyond it the node is refused (CompileError)
TABLE_LIMIT = 4 * FOLD_LIMIT

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
    if v.size < 1:
        raise p.err(f"attribute 'value' must hold one value, got {v.size}")
    return filled(p, m, lens, v.reshape(-1)[0], v.dtype)


def count(lens) -> int:
    """The elements of a tensor of ``lens`` (negative dims count as 0)."""
    return math.prod(max(int(d), 0) for d in lens)


def filled(p, m, lens, value, dtype):
    """A tensor of ``lens`` holding ``value`` (``dtype``): a literal up to ``FOLD_LIMIT`` elements, else one
    scalar broadcast and made contiguous at run time (no array of that size while parsing).  ParseError
    (naming the node) for a negative dim."""
    lens = [int(d) for d in lens]
    if any(d < 0 for d in lens):
        raise p.err(f"a value of shape {lens} (negative dims) cannot be made")
    dt = np.dtype(dtype)
    if count(lens) <= FOLD_LIMIT:
        return p.lit(m, np.full(lens, value, dtype=dt))
    one = p.lit(m, np.full([1] * len(lens), value, dtype=dt))
    return p.add(m, "contiguous", [p.add(m, "multibroadcast", [one], out_lens=lens)])


def run_time_iota(p, m, n: int):
    """``0 .. n-1`` (int64) computed at run time, an exclusive scan of ``n`` broadcast ones: no literal of ``n``
    elements."""
    ones = p.add(m, "multibroadcast", [p.lit(m, np.ones(1, np.int64))], out_lens=[n])
    return p.add(m, "cumsum", [ones], axis=0, exclusive=1)


def iota(p, m, n: int, shape=None, dtype="int64"):
    """``0 .. n-1`` of ``dtype``, reshaped to ``shape`` (``n`` elements; default ``[n]``): a literal up to
    ``FOLD_LIMIT`` elements, else computed at run time (:func:`run_time_iota`)."""
    n = int(n)
    shape = [n] if shape is None else [int(d) for d in shape]
    if n <= FOLD_LIMIT:
        return p.lit(m, np.arange(n, dtype=dtype).reshape(shape))
    v = run_time_iota(p, m, n)
    if np.dtype(dtype) != np.int64:
        v = p.add(m, "convert", [v], target_type=np.dtype(dtype).name)
    return v if shape == [n] else p.reshape(m, v, shape)


def check_table(p, n, what: str) -> None:
    """CompileError naming the node being parsed unless a host table of ``n`` elements (``what``) fits
    :data:`TABLE_LIMIT`; ``n`` may be a float (a size computed from a scale: inf and NaN are refused too)."""
    if not (n == n and n <= TABLE_LIMIT):  # NaN fails both
        size = f"{int(n)}" if math.isfinite(n) else str(n)
        raise CompileError(f"node '{p.node_name}' ({p.node.op_type}): {what} would take {size} elements, more than "
                           f"the {TABLE_LIMIT} a table computed while compiling may hold (TABLE_LIMIT)")


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
