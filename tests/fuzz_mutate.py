"""Mutations of ONNX models for the fuzz tests: protobuf bytes, and the model's structure (attributes,
shapes, dtypes, op types, names, initializers, opsets).  Each takes hypothesis's ``draw`` and returns a
one-line description of what it changed."""
from __future__ import annotations

import math

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import AttributeProto as A, TensorProto as T, helper as h, numpy_helper

INTS = [-(2 ** 63), -(2 ** 31), -7, -3, -2, -1, 0, 1, 2, 3, 4, 7, 2 ** 31 - 1, 2 ** 40, 2 ** 63 - 1]
DIMS = [0, 1, 2, 3, 5, -1, -2, 2 ** 34, 2 ** 62]
FLOATS = [math.nan, math.inf, -math.inf, 0.0, -1.0, 1e-30, 1e30]
STRINGS = [b"", b"constant", b"reflect", b"edge", b"wrap", b"NOTSET", b"foo", b"\xff\xfe"]
ELEM_TYPES = [0, T.FLOAT, T.UINT8, T.INT8, T.INT32, T.INT64, T.STRING, T.BOOL, T.FLOAT16, T.DOUBLE, T.UINT64,
              T.BFLOAT16, T.COMPLEX64, T.FLOAT8E4M3FN, T.INT4]
OPS = ["Relu", "Add", "MatMul", "Identity", "Softmax", "Transpose", "Reshape", "Gather", "Concat", "Slice", "Pad",
       "ReduceSum", "Flatten", "Conv", "MaxPool", "Split", "Where", "Cast", "Unsqueeze", "Squeeze", "Expand", "Tile",
       "Sigmoid", "Neg", "LogSoftmax", "ArgMax", "NotAnOp", ""]
ATTR_NAMES = ["axis", "axes", "perm", "kernel_shape", "pads", "strides", "dilations", "group", "keepdims", "to",
              "mode", "auto_pad", "ceil_mode", "noop_with_empty_axes", "split", "foo"]
OPSETS = [0, 1, 6, 7, 9, 10, 11, 12, 13, 15, 17, 18, 19, 20, 21, 22, 23, 24, 99, 2 ** 31 - 1]
IR_VERSIONS = [0, 1, 3, 7, 8, 9, 10, 11, 12, 99]


# -- protobuf bytes -----------------------------------------------------------------------------------
def mutate_bytes(draw, data: bytes) -> tuple[bytes, str]:
    """1-4 of: a bit flip, a byte set, a truncation, a random splice, a deleted or a duplicated range."""
    b = bytearray(data)
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "truncate", "splice", "delete", "duplicate"]))
        pos = draw(st.integers(0, max(len(b) - 1, 0)))
        if kind == "flip" and b:
            bit = draw(st.integers(0, 7))
            b[pos] ^= 1 << bit
            steps.append(f"flip {pos}:{bit}")
        elif kind == "set" and b:
            v = draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF, 0x08, 0x0A, 0x12, 0x1A, 0x22]))
            b[pos] = v
            steps.append(f"set {pos}={v:#x}")
        elif kind == "truncate":
            del b[pos:]
            steps.append(f"truncate {pos}")
        elif kind == "splice":
            junk = draw(st.binary(min_size=1, max_size=16))
            b[pos:pos] = junk
            steps.append(f"splice {pos}+{junk.hex()}")
        else:
            n = draw(st.integers(1, 32))
            piece = bytes(b[pos:pos + n])
            if kind == "delete":
                del b[pos:pos + n]
            else:
                b[pos:pos] = piece
            steps.append(f"{kind} {pos}:{n}")
    return bytes(b), "; ".join(steps)


# -- structure ----------------------------------------------------------------------------------------
def _attr_value(draw, kind: int):
    if kind == A.INT:
        return draw(st.sampled_from(INTS))
    if kind == A.FLOAT:
        return draw(st.sampled_from(FLOATS))
    if kind == A.STRING:
        return draw(st.sampled_from(STRINGS))
    if kind == A.INTS:
        return draw(st.lists(st.sampled_from(INTS), max_size=6))
    if kind == A.FLOATS:
        return draw(st.lists(st.sampled_from(FLOATS), max_size=4))
    return numpy_helper.from_array(np.array(draw(st.sampled_from(INTS)), np.int64))


def _set_attr(node, name: str, kind: int, value) -> None:
    keep = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(keep)
    if kind in (A.INTS, A.FLOATS) and not value:
        a = onnx.AttributeProto(name=name, type=kind)  # make_attribute cannot infer an empty list's type
    else:
        a = h.make_attribute(name, value)
    node.attribute.append(a)


def mutate_attribute(draw, m: onnx.ModelProto) -> str:
    node = draw(st.sampled_from(list(m.graph.node)))
    attrs = list(node.attribute)
    kind = draw(st.sampled_from(["value", "element", "type", "drop", "add"] if attrs else ["add"]))
    if kind == "add":
        name = draw(st.sampled_from(ATTR_NAMES))
        t = draw(st.sampled_from([A.INT, A.INTS, A.FLOAT, A.STRING]))
        v = _attr_value(draw, t)
        _set_attr(node, name, t, v)
        return f"{node.op_type}: add {name}={v!r}"
    a = draw(st.sampled_from(attrs))
    if kind == "drop":
        _set_attr(node, a.name, A.INT, 0)
        del node.attribute[-1]
        return f"{node.op_type}: drop {a.name}"
    if kind == "element" and a.type == A.INTS and a.ints:
        v = list(a.ints)
        k = draw(st.integers(0, len(v) - 1))
        op = draw(st.sampled_from(["set", "delete", "append"]))
        if op == "set":
            v[k] = draw(st.sampled_from(INTS))
        elif op == "delete":
            del v[k]
        else:
            v.append(draw(st.sampled_from(INTS)))
        _set_attr(node, a.name, A.INTS, v)
        return f"{node.op_type}: {a.name}={v}"
    t = a.type if kind != "type" else draw(st.sampled_from([A.INT, A.INTS, A.FLOAT, A.FLOATS, A.STRING, A.TENSOR]))
    v = _attr_value(draw, t)
    _set_attr(node, a.name, t, v)
    return f"{node.op_type}: {a.name}={v!r}" if t != A.TENSOR else f"{node.op_type}: {a.name}=<tensor>"


def _value_infos(m):
    return list(m.graph.input) + list(m.graph.output)


def mutate_shape(draw, m: onnx.ModelProto) -> str:
    vi = draw(st.sampled_from(_value_infos(m)))
    tt = vi.type.tensor_type
    dims = tt.shape.dim
    kind = draw(st.sampled_from(["dim", "dim", "param", "add", "drop", "clear", "elem"]))
    if kind == "elem":
        tt.elem_type = draw(st.sampled_from(ELEM_TYPES))
        return f"{vi.name}: elem_type {tt.elem_type}"
    if kind == "clear":
        tt.ClearField("shape")
        return f"{vi.name}: no shape"
    if kind == "add":
        dims.add().dim_value = draw(st.sampled_from(DIMS))
        return f"{vi.name}: add dim {dims[len(dims) - 1].dim_value}"
    if not len(dims):
        return "nothing"
    k = draw(st.integers(0, len(dims) - 1))
    if kind == "drop":
        del dims[k]
        return f"{vi.name}: drop dim {k}"
    if kind == "param":
        dims[k].dim_param = draw(st.sampled_from(["N", "", "x y"]))
        return f"{vi.name}: dim {k} = '{dims[k].dim_param}'"
    dims[k].dim_value = draw(st.sampled_from(DIMS))
    return f"{vi.name}: dim {k} = {dims[k].dim_value}"


def mutate_initializer(draw, m: onnx.ModelProto) -> str:
    if not len(m.graph.initializer):
        return "nothing"
    t = draw(st.sampled_from(list(m.graph.initializer)))
    try:
        a = numpy_helper.to_array(t)
        kinds = ["values", "values", "dims", "dtype", "truncate", "length"]
    except Exception:  # noqa: BLE001  (mutated already: its data no longer fits its dims or type)
        kinds = ["dims", "dtype", "truncate"]
    kind = draw(st.sampled_from(kinds))
    if kind == "values":
        if a.dtype.kind in "iu":
            v = np.array(draw(st.lists(st.sampled_from(INTS), min_size=a.size, max_size=a.size)), np.int64)
        else:
            v = np.array(draw(st.lists(st.sampled_from(FLOATS + [0.5, -2.0]), min_size=a.size, max_size=a.size)))
        t.CopyFrom(numpy_helper.from_array(v.astype(a.dtype, casting="unsafe").reshape(a.shape), t.name))
        return f"{t.name} = {v.tolist()}"
    if kind == "length":
        n = draw(st.integers(0, 8))
        v = np.resize(a.ravel(), n)
        t.CopyFrom(numpy_helper.from_array(v, t.name))
        return f"{t.name}: {n} values {v.tolist()}"
    if kind == "dims":
        dims = list(t.dims)
        op = draw(st.sampled_from(["set", "add", "drop"] if dims else ["add"]))
        if op == "add":
            dims.append(draw(st.sampled_from(DIMS)))
        elif op == "drop":
            dims.pop(draw(st.integers(0, len(dims) - 1)))
        else:
            dims[draw(st.integers(0, len(dims) - 1))] = draw(st.sampled_from(DIMS))
        del t.dims[:]
        t.dims.extend(dims)
        return f"{t.name}: dims {dims} (data kept)"
    if kind == "dtype":
        t.data_type = draw(st.sampled_from([e for e in ELEM_TYPES if e]))
        return f"{t.name}: data_type {t.data_type} (raw data kept)"
    raw = t.raw_data
    cut = draw(st.integers(0, max(len(raw) - 1, 0)))
    t.raw_data = raw[:cut]
    return f"{t.name}: raw_data cut to {cut} bytes"


def mutate_op(draw, m: onnx.ModelProto) -> str:
    node = draw(st.sampled_from(list(m.graph.node)))
    kind = draw(st.sampled_from(["op", "op", "domain", "inputs"]))
    if kind == "op":
        old, node.op_type = node.op_type, draw(st.sampled_from(OPS))
        return f"{old} -> {node.op_type!r}"
    if kind == "domain":
        node.domain = draw(st.sampled_from(["ai.onnx", "com.microsoft", "foo.bar"]))
        return f"{node.op_type}: domain {node.domain}"
    if draw(st.booleans()) and len(node.input):
        del node.input[-1]
        return f"{node.op_type}: last input dropped"
    names = [i.name for i in m.graph.input] + [t.name for t in m.graph.initializer]
    node.input.append(draw(st.sampled_from(names + [""])))
    return f"{node.op_type}: input {node.input[-1]!r} appended"


def mutate_names(draw, m: onnx.ModelProto) -> str:
    g = m.graph
    kind = draw(st.sampled_from(["dangling", "empty", "dup-output", "graph-output", "dup-input", "drop-input",
                                 "reorder"]))
    node = draw(st.sampled_from(list(g.node)))
    if kind in ("dangling", "empty") and len(node.input):
        k = draw(st.integers(0, len(node.input) - 1))
        node.input[k] = "nowhere" if kind == "dangling" else ""
        return f"{node.op_type}: input {k} -> {node.input[k]!r}"
    if kind == "dup-output":
        other = draw(st.sampled_from(list(g.node)))
        node.output[0] = other.output[0]
        return f"{node.op_type}: output 0 named {other.output[0]!r} (as {other.op_type}'s)"
    if kind == "graph-output":
        names = [i.name for i in g.input] + [t.name for t in g.initializer] + ["nowhere"]
        g.output[0].name = draw(st.sampled_from(names))
        return f"graph output 0 named {g.output[0].name!r}"
    if kind == "dup-input" and len(g.input):
        g.input.append(g.input[0])
        return f"graph input {g.input[0].name!r} twice"
    if kind == "drop-input" and len(g.input):
        del g.input[0]
        return "graph input 0 dropped"
    nodes = list(g.node)
    order = draw(st.permutations(range(len(nodes))))
    del g.node[:]
    g.node.extend(nodes[k] for k in order)
    return f"nodes reordered {list(order)}"


def mutate_opset(draw, m: onnx.ModelProto) -> str:
    kind = draw(st.sampled_from(["opset", "opset", "none", "ir", "extra"]))
    if kind == "opset" and len(m.opset_import):
        m.opset_import[0].version = draw(st.sampled_from(OPSETS))
        return f"opset {m.opset_import[0].version}"
    if kind in ("none", "opset"):
        del m.opset_import[:]
        return "no opset_import"
    if kind == "ir":
        m.ir_version = draw(st.sampled_from(IR_VERSIONS))
        return f"ir_version {m.ir_version}"
    m.opset_import.append(h.make_opsetid(draw(st.sampled_from(["", "com.microsoft"])), draw(st.sampled_from(OPSETS))))
    return f"extra opset_import {m.opset_import[-1].domain!r} {m.opset_import[-1].version}"


STRUCTURE = {f.__name__[len("mutate_"):]: f for f in (mutate_attribute, mutate_shape, mutate_initializer, mutate_op,
                                                     mutate_names, mutate_opset)}
