"""Values known at parse time: Constant, ConstantOfShape, and the shape arithmetic Shape / Size /
Range, which become literals (their results depend only on static shapes and on inputs known at parse
time: literals, or values the program is specialized for).

ONNX operator spec: https://onnx.ai/onnx/operators/
"""
from __future__ import annotations

import math
import os

import numpy as np

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


def _host_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 64 << 30


@parser("ConstantOfShape")
def _parse_constant_of_shape(p, m, node, ins):
    lens = ints(p.const(ins[0], "input"))
    t = attr(node, "value")
    v = read_tensor(t, f"node '{p.node_name}' (ConstantOfShape): attribute 'value'") if t is not None \
        else np.zeros(1, np.float32)
    nbytes = math.prod(int(d) for d in lens) * v.dtype.itemsize
    if nbytes > _host_memory():  # refuse before numpy tries (an overcommitting host would kill the process)
        raise MemoryError(f"node '{node.name}' (ConstantOfShape): a {v.dtype}{list(lens)} literal of {nbytes} "
                          f"bytes is more than the host's {_host_memory()} bytes of memory")
    return p.lit(m, np.full(lens, v.reshape(-1)[0], dtype=v.dtype))


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
    return p.lit(m, (s + np.arange(n) * d).astype(dt))
