"""Models that break the ONNX spec in ways onnxruntime refuses on loading (issue 28): a node against its
op's schema (input count, empty required input, unknown / missing / mistyped attribute, attribute list
sizes), an input type outside the op's type constraints, a graph output declared with another type than
it computes, the model's ir_version, a stored tensor with a negative dim.  For each, onnxruntime CPU
refuses the model (the oracle agrees it is invalid) and mgx_graph raises ParseError naming the node
(name and op type) and the attribute, input or tensor at fault.  Models onnxruntime accepts give its
values."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import mgx_graph
from mgx_graph.errors import ParseError, ShapeError
from util import ort_run

pytestmark = pytest.mark.filterwarnings("ignore:onnx shape inference failed")

F = np.float32
X23 = np.arange(6, dtype=F).reshape(2, 3)
X4 = np.arange(16, dtype=F).reshape(1, 1, 4, 4)


def _model(nodes, feeds, inits=None, outs=(("y", TP.FLOAT),), opset=17, ir=8, sub=False):
    ins = [h.make_tensor_value_info(k, nh.from_array(v).data_type, v.shape) for k, v in feeds.items()]
    tensors = [v if isinstance(v, onnx.TensorProto) else nh.from_array(np.asarray(v), k)
               for k, v in (inits or {}).items()]
    g = h.make_graph(nodes, "g", ins, [h.make_tensor_value_info(n, t, None) for n, t in outs], tensors)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = ir
    return m


def _attr(name, kind):
    """An attribute of type ``kind`` with no values (onnx.helper cannot make an empty list)."""
    return onnx.AttributeProto(name=name, type=kind)


def _node(op, ins, outs=("y",), extra=(), **attrs):
    n = h.make_node(op, list(ins), list(outs), name=f"bad_{op.lower()}", **attrs)
    n.attribute.extend(extra)
    return n


def _negative_dim(name):
    t = nh.from_array(np.arange(6, dtype=F).reshape(3, 2), name)
    t.dims[0] = -1
    return t


def _short_data(name):
    t = nh.from_array(np.arange(4, dtype=F), name)
    t.dims[:] = [3, 2]
    return t


def _in_subgraph(node):
    """``node`` inside the then-branch of an If (its else-branch passes x through)."""
    then = h.make_graph([node], "then", [], [h.make_tensor_value_info("y", TP.FLOAT, None)])
    other = h.make_graph([h.make_node("Identity", ["x"], ["z"])], "else", [],
                         [h.make_tensor_value_info("z", TP.FLOAT, None)])
    return h.make_node("If", ["c"], ["out"], name="branch", then_branch=then, else_branch=other)


def R(id, nodes, names, feeds=None, inits=None, **kw):
    """A case onnxruntime refuses; ``names``: words the message must hold (node name, op type, attribute...)."""
    return pytest.param(nodes, names, {"x": X23} if feeds is None else feeds, inits, kw, id=id)


REFUSED = [
    R("add-one-input", [_node("Add", ["x"])], ["bad_add", "Add", "1 inputs: expected 2..2"]),
    R("relu-empty-input", [_node("Relu", [""])], ["bad_relu", "Relu", "('X') is required"]),
    R("concat-empty-variadic-input", [_node("Concat", ["", "x"], axis=1)], ["bad_concat", "Concat", "input 0",
                                                                            "('inputs') is required"]),
    R("concat-empty-second-input", [_node("Concat", ["x", ""], axis=1)], ["bad_concat", "Concat", "input 1"]),
    R("clip-too-many-inputs", [_node("Clip", ["x", "", "", "x"])], ["bad_clip", "Clip", "4 inputs: expected 1..3"]),
    R("gather-axis-floats", [_node("Gather", ["x", "i"], axis=[1.0, 2.0])], ["bad_gather", "Gather", "axis", "FLOATS"],
      inits={"i": np.array([0], np.int64)}),
    R("matmul-unknown-attribute", [_node("MatMul", ["x", "w"], axis=0)], ["bad_matmul", "MatMul", "axis"],
      inits={"w": np.ones((3, 2), F)}),
    R("conv-pads-as-int", [_node("Conv", ["x", "w"], pads=-7)], ["bad_conv", "Conv", "pads", "INTS"],
      feeds={"x": X4}, inits={"w": np.ones((1, 1, 2, 2), F)}),
    R("conv-dilations-empty", [_node("Conv", ["x", "w"], extra=[_attr("dilations", onnx.AttributeProto.INTS)])],
      ["bad_conv", "Conv", "dilations"], feeds={"x": X4}, inits={"w": np.ones((1, 1, 2, 2), F)}),
    R("conv-kernel_shape-empty", [_node("Conv", ["x", "w"], extra=[_attr("kernel_shape", onnx.AttributeProto.INTS)])],
      ["bad_conv", "Conv", "kernel_shape"], feeds={"x": X4}, inits={"w": np.ones((1, 1, 2, 2), F)}),
    R("conv-dilations-short", [_node("Conv", ["x", "w"], dilations=[1])], ["bad_conv", "Conv", "dilations"],
      feeds={"x": X4}, inits={"w": np.ones((1, 1, 2, 2), F)}),
    R("maxpool-strides-empty", [_node("MaxPool", ["x"], kernel_shape=[2, 2],
                                      extra=[_attr("strides", onnx.AttributeProto.INTS)])],
      ["bad_maxpool", "MaxPool", "strides"], feeds={"x": X4}),
    R("softmax-axis-empty-list", [_node("Softmax", ["x"], extra=[_attr("axis", onnx.AttributeProto.INTS)])],
      ["bad_softmax", "Softmax", "axis"]),
    R("concat-missing-axis", [_node("Concat", ["x", "x"])], ["bad_concat", "Concat", "axis"]),
    R("expand-one-input", [_node("Expand", ["x"])], ["bad_expand", "Expand", "1 inputs: expected 2..2"]),
    R("tile-one-input", [_node("Tile", ["x"])], ["bad_tile", "Tile", "1 inputs: expected 2..2"]),
    R("split-axis-int64-min", [_node("Split", ["x", "n"], ["y", "y1"], axis=-2 ** 63)], ["bad_split", "Split", "axis"],
      inits={"n": np.array([1, 2], np.int64)}, outs=(("y", TP.FLOAT), ("y1", TP.FLOAT))),
    R("pad-mode-empty", [_node("Pad", ["x", "p"], mode="")], ["bad_pad", "Pad", "mode"],
      inits={"p": np.array([0, 1, 0, 1], np.int64)}),
    R("pad-bool-float-constant", [_node("Pad", ["x", "p", "v"])], ["bad_pad", "Pad", "'v'", "tensor(bool)"],
      feeds={"x": np.ones((2, 3), bool)}, outs=(("y", TP.BOOL),),
      inits={"p": np.array([0, 1, 0, 1], np.int64), "v": np.array(0.5, F)}),
    R("split1-int64-split", [_node("Split", ["x", "s"], ["y", "y1"], axis=1)], ["bad_split", "Split", "'s'", "int64"],
      inits={"s": np.array([1, 2], np.int64)}, outs=(("y", TP.FLOAT), ("y1", TP.FLOAT)), opset=1, ir=3),
    R("sqrt-int64", [_node("Sqrt", ["x"])], ["bad_sqrt", "Sqrt", "tensor(int64)"],
      feeds={"x": np.ones((2, 3), np.int64)}, outs=(("y", TP.INT64),)),
    R("output-declared-float8", [_node("Relu", ["x"])], ["bad_relu", "Relu", "'y'", "float8e4m3fn", "tensor(float)"],
      outs=(("y", TP.FLOAT8E4M3FN),)),
    R("initializer-negative-dim", [_node("Add", ["x", "z"])], ["'z'", "negative", "[-1, 2]"],
      feeds={"x": np.ones((3, 2), F)}, inits={"z": _negative_dim("z")}),
    R("constant-negative-dim", [_node("Constant", [], ["z"], value=_negative_dim("v")), _node("Add", ["x", "z"])],
      ["bad_constant", "Constant", "value", "negative"], feeds={"x": np.ones((3, 2), F)}),
    R("subgraph-add-one-input", [_in_subgraph(_node("Add", ["x"]))], ["branch", "then_branch", "bad_add", "1 inputs"],
      feeds={"c": np.array(True), "x": X23}, outs=(("out", TP.FLOAT),)),
    R("gelu-before-its-opset", [_node("Gelu", ["x"])], ["bad_gelu", "Gelu", "No Op registered", "17"]),
    R("constant-data-short", [_node("Constant", [], ["z"], value=_short_data("v")), _node("Add", ["x", "z"])],
      ["bad_constant", "Constant", "raw_data size", "too small"], feeds={"x": np.ones((3, 2), F)}),
    R("ir-version-too-high", [_node("Relu", ["x"])], ["IR version 99"], ir=99),
    R("ir-version-missing", [_node("Relu", ["x"])], ["missing model IR version"], ir=None),
]


def _refused_model(nodes, feeds, inits, kw):
    ir = kw.pop("ir", 8)
    m = _model(nodes, feeds, inits, **kw, ir=ir or 8)
    if ir is None:
        m.ClearField("ir_version")
    return m


@pytest.mark.parametrize("nodes,names,feeds,inits,kw", REFUSED)
def test_onnxruntime_refuses_mgx_raises_parse_error(nodes, names, feeds, inits, kw):
    model = _refused_model(nodes, feeds, inits, dict(kw))
    with pytest.raises(Exception):  # the oracle agrees that the model is invalid
        ort_run(model, feeds)
    with pytest.raises(ParseError) as e:
        mgx_graph.compile(model, target="ref").run(feeds)
    for word in names:
        assert word in str(e.value), str(e.value)


def A(id, nodes, feeds=None, inits=None, **kw):
    return pytest.param(nodes, {"x": X23} if feeds is None else feeds, inits, kw, id=id)


ACCEPTED = [  # valid models near the refused ones: onnxruntime runs them, mgx_graph must give its values
    A("clip-empty-optional-min", [_node("Clip", ["x", "", "m"])], inits={"m": np.array(2.5, F)}),
    A("relu-domain-ai.onnx", [h.make_node("Relu", ["x"], ["y"], domain="ai.onnx")]),
    A("sum-variadic", [_node("Sum", ["x", "x", "x"])]),
    A("pad-int64-constant", [_node("Pad", ["x", "p", "v"])], feeds={"x": np.arange(6).reshape(2, 3)},
      inits={"p": np.array([0, 1, 0, 1], np.int64), "v": np.array(7, np.int64)}, outs=(("y", TP.INT64),)),
    A("conv-defaults", [_node("Conv", ["x", "w"])], feeds={"x": X4}, inits={"w": np.ones((1, 1, 2, 2), F)}),
    A("groupnormalization-18", [_node("GroupNormalization", ["x", "s", "b"], num_groups=1, epsilon=1e-5)],
      feeds={"x": X4}, inits={"s": np.ones(1, F), "b": np.zeros(1, F)}, opset=18),
    A("reducesum-keepdims2", [_node("ReduceSum", ["x", "a"], keepdims=2)], inits={"a": np.array([1], np.int64)}),
    A("initializer-empty-dim", [_node("Concat", ["x", "z"], axis=0)], inits={"z": np.zeros((0, 3), F)}),
]


@pytest.mark.parametrize("nodes,feeds,inits,kw", ACCEPTED)
def test_valid_models_give_onnxruntime_values(nodes, feeds, inits, kw):
    model = _model(nodes, feeds, inits, **kw)
    want = ort_run(model, feeds)
    got = mgx_graph.compile(model, target="ref").run(feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert np.asarray(g).dtype == w.dtype and np.asarray(g).shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_checker_sees_nodes_without_their_weights_and_subgraphs(monkeypatch):
    """Each node goes to onnx's checker alone, its large tensors and subgraphs left out: a Constant of
    4 MiB and an If whose branch holds it cost the checker a few hundred bytes each."""
    big = nh.from_array(np.ones((1 << 20,), F), "big")
    branch = h.make_graph([h.make_node("Constant", [], ["k"], value=big)], "then", [],
                          [h.make_tensor_value_info("k", TP.FLOAT, None)])
    nodes = [h.make_node("Constant", [], ["k0"], value=big),
             h.make_node("If", ["c"], ["k1"], then_branch=branch, else_branch=branch),
             h.make_node("Add", ["k0", "k1"], ["y"])]
    model = _model(nodes, {"c": np.array(True)})
    sizes = []
    real = onnx.checker.C.check_node
    monkeypatch.setattr(onnx.checker.C, "check_node", lambda b, *a: (sizes.append(len(b)), real(b, *a))[1])
    got = mgx_graph.compile(model, target="ref").run({"c": np.array(True)})
    np.testing.assert_array_equal(got[0], np.full(1 << 20, 2, F))
    assert len(sizes) == 5 and max(sizes) < 1024, sizes


def test_shape_errors_stay_typed_for_bad_values():
    """A value out of range that the schema allows (Reshape to a negative dim other than -1) still
    raises a typed error naming the node."""
    model = _model([_node("Reshape", ["x", "s"])], {"x": X23}, {"s": np.array([-2, 3], np.int64)})
    with pytest.raises(Exception):
        ort_run(model, {"x": X23})
    with pytest.raises((ParseError, ShapeError)) as e:
        mgx_graph.compile(model, target="ref")
    assert "bad_reshape" in str(e.value) and "Reshape" in str(e.value)
