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
    results are clipped where the ONNX spec accumulates exactly in int32; uint8 x uint8 is exact.  The
    operand types come from the initializers, the feeds and ONNX shape inference; an initializer or feed is
    shifted here, a tensor computed in the graph by nodes inserted before its first use.  Nodes inside
    subgraphs are not rewritten.  Returns copies (the inputs are not changed)."""
    if not any(n.op_type in INTEGER_GEMM_OPERANDS for n in model.graph.node):
        return model, feeds
    model, feeds = onnx.ModelProto.FromString(model.SerializeToString()), dict(feeds)
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    types = {t.name: t.data_type for t in g.initializer}
    types.update({k: NP2ONNX.get(np.asarray(v).dtype, 0) for k, v in feeds.items()})
    inferred = onnx.shape_inference.infer_shapes(model)
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        types.setdefault(vi.name, vi.type.tensor_type.elem_type)
    done: set = set()  # tensors shifted so far
    nodes = []
    for node in g.node:
        pairs = INTEGER_GEMM_OPERANDS.get(node.op_type)
        if pairs is not None:
            kinds = [types.get(node.input[v], 0) for v, _ in pairs]
            for name, t in zip((node.input[v] for v, _ in pairs), kinds):
                if t not in (TensorProto.INT8, TensorProto.UINT8):
                    raise ValueError(f"uint8_operands: the type of '{name}' ({node.op_type}) is unknown")
            if sorted(kinds) == [TensorProto.UINT8, TensorProto.INT8]:
                for (v, z), t in zip(pairs, kinds):
                    if t != TensorProto.INT8:
                        continue
                    node.input[v] = _shifted(g, node.input[v], inits, feeds, nodes, done)
                    if z < len(node.input) and node.input[z]:
                        node.input[z] = _shifted(g, node.input[z], inits, feeds, nodes, done)
                    else:
                        while len(node.input) <= z:
                            node.input.append("")
                        zname = "zero_point_128_as_uint8"
                        if zname not in inits:
                            inits[zname] = numpy_helper.from_array(np.array(128, np.uint8), zname)
                            g.initializer.append(inits[zname])
                        node.input[z] = zname
        nodes.append(node)
    g.ClearField("node")
    g.node.extend(nodes)
    return model, feeds


def _shifted(g, name, inits, feeds, nodes, done) -> str:
    """The name of ``name`` (an int8 tensor) as uint8 ``+ 128``, made once: an initializer or feed shifted
    here, a computed tensor by Cast / Add / Cast nodes appended to ``nodes`` (before its first use)."""
    new = f"{name}_as_uint8"
    if name in done:
        return new
    done.add(name)
    if name in inits or name in feeds:
        a = numpy_helper.to_array(inits[name]) if name in inits else np.asarray(feeds[name])
        u = np.asarray(a.astype(np.int16) + 128).astype(np.uint8)
        if name in inits:
            inits[new] = numpy_helper.from_array(u, new)
            g.initializer.append(inits[new])
        else:
            feeds[new] = u
            g.input.append(helper.make_tensor_value_info(new, TensorProto.UINT8, list(u.shape)))
        return new
    c128 = f"{name}_128_int32"
    inits[c128] = numpy_helper.from_array(np.array(128, np.int32), c128)
    g.initializer.append(inits[c128])
    nodes += [helper.make_node("Cast", [name], [f"{name}_int32"], to=TensorProto.INT32),
              helper.make_node("Add", [f"{name}_int32", c128], [f"{name}_plus_128"]),
              helper.make_node("Cast", [f"{name}_plus_128"], [new], to=TensorProto.UINT8)]
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
