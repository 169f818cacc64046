"""Ops whose output shape depends on input values: NonZero and Unique.  The program is specialized
for the count it sees (``p.specialize``; a ``guard`` re-checks it on every run, see
:mod:`mgx_graph.operators.dynamic`).

ONNX operator spec: https://onnx.ai/onnx/operators/
"""
from __future__ import annotations

from .op_parser import attr, check_axis, parser


@parser("NonZero")
def _parse_nonzero(p, m, node, ins):
    count = int(p.specialize(ins[0], "count_nonzero", "input"))
    return p.add(m, "nonzero", [ins[0]], count=count)


@parser("Unique")
def _parse_unique(p, m, node, ins):
    axis = attr(node, "axis")
    if axis is not None:
        axis = check_axis(p, axis, ins[0].shape.ndim)
    fn = "unique_count" if axis is None else f"unique_count:{axis}"
    count = int(p.specialize(ins[0], fn, "X"))
    u = p.add(m, "unique", [ins[0]], count=count, axis=axis, sorted=attr(node, "sorted", 1))
    return [p.add(m, "get_tuple_elem", [u], index=k) for k in range(4)]
