"""Reductions (ReduceSum / Mean / Max / Min / Prod / L1 / L2 / SumSquare / LogSum / LogSumExp),
Softmax / LogSoftmax (the opset < 13 flattening form too), ArgMax / ArgMin and TopK.

ONNX operator spec: https://onnx.ai/onnx/operators/
"""
from __future__ import annotations

import math

import numpy as np

from .op_parser import attr, check_axes, check_axis, check_min, ints, parser


def _axes_of(p, node, ins, attr_opset):
    if p.opset < attr_opset:
        return list(attr(node, "axes", []) or [])
    if len(ins) > 1 and ins[1] is not None:
        return ints(p.const(ins[1], "axes"))
    return []


def _keepdims(node) -> int:
    """1 when ``keepdims`` is 1 (its default), else 0: onnxruntime and onnx shape inference keep the
    reduced dims only for the value 1."""
    return int(attr(node, "keepdims", 1) == 1)


_REDUCE = {"ReduceSum": ("reduce_sum", 13), "ReduceMean": ("reduce_mean", 18), "ReduceMax": ("reduce_max", 18),
           "ReduceMin": ("reduce_min", 18), "ReduceProd": ("reduce_prod", 18), "ReduceL1": ("reduce_l1", 18),
           "ReduceL2": ("reduce_l2", 18), "ReduceSumSquare": ("reduce_sum_square", 18),
           "ReduceLogSum": ("reduce_log_sum", 18), "ReduceLogSumExp": ("reduce_log_sum_exp", 18)}


@parser(*_REDUCE)
def _parse_reduce(p, m, node, ins):
    name, attr_opset = _REDUCE[node.op_type]
    axes = _axes_of(p, node, ins, attr_opset)
    x = ins[0]
    norm = check_axes(p, axes, x.shape.ndim, unique=False)
    if not axes and attr(node, "noop_with_empty_axes", 0):
        return x
    if x.shape.elements() == 0:
        return _empty_reduction(p, m, name, x, set(norm or range(x.shape.ndim)), _keepdims(node))
    return p.add(m, name, [x], axes=axes, keepdims=_keepdims(node))


def _empty_reduction(p, m, name, x, axes: set, keepdims: int):
    """The reduction of an input with no elements, as a literal: onnxruntime's value of an empty
    reduction (0 for the sums and the mean, 1 for the product, the type's lowest value for max, log-sum
    and log-sum-exp, its highest for min; -inf / +inf for floats) broadcast to the output shape."""
    dt = np.dtype(x.shape.dtype)
    lens = [1 if i in axes else d for i, d in enumerate(x.shape.lens) if keepdims or i not in axes]
    lo, hi = (-np.inf, np.inf) if dt.kind == "f" else (np.iinfo(dt).min, np.iinfo(dt).max) if dt.kind in "iu" \
        else (False, True)
    value = {"reduce_prod": 1, "reduce_max": lo, "reduce_min": hi, "reduce_log_sum": lo,
             "reduce_log_sum_exp": lo}.get(name, 0)
    one = p.lit(m, np.array(value, dt))
    if math.prod(lens) == 0:
        return p.lit(m, np.zeros(lens, dt))
    return p.add(m, "multibroadcast", [p.reshape(m, one, [1] * len(lens))], out_lens=lens) if lens else one


@parser("Softmax", "LogSoftmax")
def _parse_softmax(p, m, node, ins):
    x = ins[0]
    name = "softmax" if node.op_type == "Softmax" else "logsoftmax"
    if x.shape.elements() == 0:  # an empty input (the axis or another dim of length 0): an empty output
        check_axis(p, attr(node, "axis", -1 if p.opset >= 13 else 1), x.shape.ndim)
        return x
    if p.opset >= 13:
        return p.add(m, name, [x], axis=check_axis(p, attr(node, "axis", -1), x.shape.ndim))
    axis = check_axis(p, attr(node, "axis", 1), x.shape.ndim)  # opsets 1-12: coerced to 2-D at axis
    lens = list(x.shape.lens)
    flat = p.reshape(m, x, [math.prod(lens[:axis]), math.prod(lens[axis:])])
    y = p.add(m, name, [flat], axis=1)
    return p.reshape(m, y, lens)


@parser("ArgMax", "ArgMin")
def _parse_argmax(p, m, node, ins):
    axis = check_axis(p, attr(node, "axis", 0), ins[0].shape.ndim)
    if ins[0].shape.lens[axis] == 0:
        raise p.err(f"'axis' = {attr(node, 'axis', 0)} has length 0 in input {list(ins[0].shape.lens)}: expected a "
                    f"non-empty axis (the index of the extreme of no values is undefined)")
    return p.add(m, node.op_type.lower(), ins, axis=axis, keepdims=_keepdims(node),
                 select_last_index=attr(node, "select_last_index", 0))


@parser("TopK")
def _parse_topk(p, m, node, ins):
    k = int(np.asarray(p.const(ins[1], "K")).reshape(-1)[0]) if p.opset >= 10 else attr(node, "k")
    x = ins[0]
    axis = check_axis(p, attr(node, "axis", -1), x.shape.ndim)
    n = x.shape.lens[axis] if x.shape.ndim else 0
    if not 0 <= k <= n:
        raise p.err(f"'k' = {k} is out of range: expected [0, {n}] (dim {n} of axis {axis})")
    t = p.add(m, "topk", [x], k=k, axis=axis, largest=attr(node, "largest", 1),
              sorted=attr(node, "sorted", 1))
    return [p.add(m, "get_tuple_elem", [t], index=0), p.add(m, "get_tuple_elem", [t], index=1)]
