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


_REDUCE = {"ReduceSum": ("reduce_sum", 13), "ReduceMean": ("reduce_mean", 18), "ReduceMax": ("reduce_max", 18),
           "ReduceMin": ("reduce_min", 18), "ReduceProd": ("reduce_prod", 18), "ReduceL1": ("reduce_l1", 18),
           "ReduceL2": ("reduce_l2", 18), "ReduceSumSquare": ("reduce_sum_square", 18),
           "ReduceLogSum": ("reduce_log_sum", 18), "ReduceLogSumExp": ("reduce_log_sum_exp", 18)}


@parser(*_REDUCE)
def _parse_reduce(p, m, node, ins):
    name, attr_opset = _REDUCE[node.op_type]
    axes = _axes_of(p, node, ins, attr_opset)
    check_axes(p, axes, ins[0].shape.ndim, unique=False)
    if not axes and attr(node, "noop_with_empty_axes", 0):
        return ins[0]
    return p.add(m, name, [ins[0]], axes=axes, keepdims=attr(node, "keepdims", 1))


@parser("Softmax", "LogSoftmax")
def _parse_softmax(p, m, node, ins):
    x = ins[0]
    name = "softmax" if node.op_type == "Softmax" else "logsoftmax"
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
    return p.add(m, node.op_type.lower(), ins, axis=axis, keepdims=attr(node, "keepdims", 1),
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
