"""Helpers for tests: build small ONNX models and run the onnxruntime oracle."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import mgx_graph

NP2ONNX = {np.dtype(k): v for k, v in {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
                                        "float64": TensorProto.DOUBLE, "int64": TensorProto.INT64,
                                        "int32": TensorProto.INT32, "bool": TensorProto.BOOL,
                                        "uint8": TensorProto.UINT8, "int8": TensorProto.INT8}.items()}


def make_model(nodes, inputs: dict, outputs: list, initializers: dict | None = None, opset: int = 18,
               output_types: dict | None = None) -> onnx.ModelProto:
    """``inputs``: name -> numpy array (shape/dtype used); ``initializers``: name -> array."""
    ins = [helper.make_tensor_value_info(n, NP2ONNX[np.asarray(a).dtype], list(np.asarray(a).shape))
           for n, a in inputs.items()]
    outs = [helper.make_tensor_value_info(n, (output_types or {}).get(n, 0), None) for n in outputs]
    inits = [numpy_helper.from_array(np.asarray(a), n) for n, a in (initializers or {}).items()]
    g = helper.make_graph(nodes, "test", ins, outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(m)
    types = {v.name: v.type for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for o in m.graph.output:
        if o.type.tensor_type.elem_type == 0 and o.name in types:
            o.type.CopyFrom(types[o.name])
            o.type.tensor_type.ClearField("shape")
    return m


def one_node_model(op, names, feeds, inits, out_type, opset, **attrs) -> onnx.ModelProto:
    """One ``op`` node reading ``names`` (graph inputs ``feeds`` and initializers ``inits``, name -> array)
    into one output ``y`` of ONNX type ``out_type``, at ``opset``."""
    node = helper.make_node(op, names, ["y"], **attrs)
    ins = [helper.make_tensor_value_info(k, numpy_helper.from_array(np.asarray(v)).data_type, np.shape(v))
           for k, v in feeds.items()]
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("y", out_type, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


def ort_version() -> tuple[int, ...]:
    """onnxruntime's version as ints, ``(1, 32, 0)`` for "1.32.0" (a suffix such as "rc1" or "+cu130" dropped)."""
    import re

    import onnxruntime as ort

    return tuple(int(p) for p in re.findall(r"\d+", ort.__version__.split("+")[0])[:3])


def ort_run(model: onnx.ModelProto, feeds: dict) -> list:
    """onnxruntime CPU's outputs of ``model`` on ``feeds``, graph optimizations off, with the int8
    operands of the integer GEMMs given as uint8 (:func:`uint8_operands`)."""
    import onnxruntime as ort

    model, feeds = uint8_operands(model, feeds)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# (operand, zero point) input indices of the integer GEMM ops
INTEGER_GEMM_OPERANDS = {"MatMulInteger": ((0, 2), (1, 3)), "ConvInteger": ((0, 2), (1, 3)),
                         "QLinearMatMul": ((0, 2), (3, 5)), "QLinearConv": ((0, 2), (3, 5))}


def uint8_operands(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """``model`` and ``feeds`` with the int8 operand ``v`` of a MatMulInteger / ConvInteger / QLinearMatMul /
    QLinearConv whose other operand is uint8, and its zero point ``z``, given as uint8 ``v + 128`` and
    ``z + 128``: the same integers ``v - z``.  onnxruntime's CPU GEMM of uint8 x int8 on x64 without VNNI
    adds pairs of products in saturating int16 (``vpmaddubsw``; microsoft/onnxruntime#16105), so its
    results are clipped where the ONNX spec accumulates exactly in int32; uint8 x uint8 is exact.  Operands and zero points
    must be initializers or feeds; returns copies (the inputs are not changed)."""
    nodes = [n for n in model.graph.node if n.op_type in INTEGER_GEMM_OPERANDS]
    if not nodes:
        return model, feeds
    model, feeds = onnx.ModelProto.FromString(model.SerializeToString()), dict(feeds)
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    inputs = {i.name: i for i in g.input}
    for node in (n for n in g.node if n.op_type in INTEGER_GEMM_OPERANDS):
        pairs = INTEGER_GEMM_OPERANDS[node.op_type]
        signed = [_int8_of(node.input[v], inits, feeds) is not None for v, _ in pairs]
        if sum(signed) != 1:  # uint8 x uint8 and int8 x int8 are exact (and keep QLinear's output type)
            continue
        for (v, z), s8 in zip(pairs, signed):
            if not s8:
                continue
            node.input[v] = _shifted(g, node.input[v], inits, inputs, feeds)
            if z < len(node.input) and node.input[z]:
                node.input[z] = _shifted(g, node.input[z], inits, inputs, feeds)
            else:
                while len(node.input) <= z:
                    node.input.append("")
                name = f"{node.input[v]}_zero_point_128"
                g.initializer.append(numpy_helper.from_array(np.uint8(128), name))
                node.input[z] = name
    return model, feeds


def _int8_of(name, inits, feeds):
    a = numpy_helper.to_array(inits[name]) if name in inits else feeds.get(name)
    return a if a is not None and np.asarray(a).dtype == np.int8 else None


def _shifted(g, name, inits, inputs, feeds) -> str:
    """The name of ``name`` (an int8 initializer or feed) as uint8 ``+ 128`` (added once)."""
    new = f"{name}_as_uint8"
    a = _int8_of(name, inits, feeds)
    if a is None:
        raise ValueError(f"uint8_operands: '{name}' is not an int8 initializer or feed")
    u = (np.asarray(a).astype(np.int16) + 128).astype(np.uint8)
    if name in inits:
        if new not in inits:
            inits[new] = numpy_helper.from_array(u, new)
            g.initializer.append(inits[new])
    elif new not in feeds:
        feeds[new] = u
        g.input.append(helper.make_tensor_value_info(new, TensorProto.UINT8, list(u.shape)))
    return new


def compile_run(model, feeds, target="ref", hip_graph=False, runs=1, **kw):
    prog = mgx_graph.compile(model, target=target, hip_graph=hip_graph, **kw)
    outs = None
    for _ in range(runs):
        outs = prog.run(feeds)
    return prog, outs


def outside_the_program(out: str) -> tuple[int, list]:
    """From ``mgx-graph generate``'s report ``... (+N outside the program: 3 copies, 1 argmax) ...``:
    ``(N, [(3, "copies"), (1, "argmax")])``; AssertionError when the line is missing."""
    import re

    m = re.search(r"\(\+(\d+) outside the program: ([^)]*)\)", out)
    assert m, out
    parts = []
    for item in m.group(2).split(", "):
        n, what = item.split(" ", 1)
        parts.append((int(n), what))
    return int(m.group(1)), parts
