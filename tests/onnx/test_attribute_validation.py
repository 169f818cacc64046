"""Invalid attributes and inputs of ONNX nodes (issue 28, part 3): for each (op, bad attribute) case,
onnxruntime CPU refuses the model (the oracle agrees it is invalid) and mgx_graph raises a typed error
(ParseError, or ShapeError from an op's shape check) whose message names the node, its op type and the
attribute.  Cases onnxruntime accepts must give its values.  Empty tensors (part 4) run against
onnxruntime on each target."""
import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import mgx_graph
from mgx_graph.errors import ParseError, ShapeError
from util import ort_run

F = np.float32
X3 = np.zeros((2, 3, 4), F)
X4 = np.zeros((1, 4, 4, 4), F)
W33 = np.zeros((4, 4, 3, 3), F)


def I64(*v):
    return np.array(v, np.int64)


def C(id, op, attrs, name, feeds=None, inits=None, out=TP.FLOAT, opset=18, nout=1):
    """One case: node ``op`` with ``attrs`` on graph inputs ``feeds`` (default x = X3) and initializers
    ``inits``; ``name``: the attribute (or input) the error must name."""
    return pytest.param(op, attrs, name, {"x": X3} if feeds is None else feeds, inits or {}, out, opset, nout, id=id)


AXIS_CASES = [C(f"{op}-axis{v}", op, {"axis": v}, "axis", opset=o, out=TP.INT64 if op.startswith("Arg") else TP.FLOAT)
              for op, vals, o in [("Flatten", (4, -4, 2**31, -2**63), 18), ("Flatten", (5,), 9),
                                  ("Softmax", (3, -4, 2**31), 18), ("LogSoftmax", (3, -4), 18), ("Hardmax", (3, -4), 18),
                                  ("Softmax", (4,), 11), ("LogSoftmax", (-4,), 11), ("Hardmax", (4,), 11),
                                  ("ArgMax", (3, -4), 18), ("ArgMin", (3,), 18), ("LpNormalization", (3,), 18),
                                  ("Split", (3,), 13)]
              for v in vals]
AXIS_CASES[-1] = C("Split-axis3", "Split", {"axis": 3}, "axis", opset=13, nout=2)

CASES = AXIS_CASES + [
    C("concat-axis", "Concat", {"axis": 3}, "axis", feeds={"x": X3, "y": X3}),
    C("concat-axis-neg", "Concat", {"axis": -4}, "axis", feeds={"x": X3, "y": X3}),
    C("concat-no-axis", "Concat", {}, "axis", feeds={"x": X3, "y": X3}, opset=4),
    C("gather-axis", "Gather", {"axis": 3}, "axis", inits={"i": I64(0)}),
    C("gatherelements-axis", "GatherElements", {"axis": 3}, "axis", inits={"i": np.zeros((2, 3, 4), np.int64)}),
    C("scatterelements-axis", "ScatterElements", {"axis": -4}, "axis",
      inits={"i": np.zeros((2, 3, 4), np.int64), "u": X3}),
    C("gathernd-batch_dims", "GatherND", {"batch_dims": 3}, "batch_dims", inits={"i": np.zeros((2, 3, 4, 1), np.int64)}),
    C("split-sum", "Split", {"axis": 1}, "split", inits={"s": I64(1, 1)}, nout=2, opset=13),
    C("split-negative", "Split", {"axis": 1}, "split", inits={"s": I64(4, -1)}, nout=2, opset=13),
    C("split-count", "Split", {"axis": 1}, "split", inits={"s": I64(1, 1, 1)}, nout=2, opset=13),
    C("split-none18", "Split", {"axis": 1}, "num_outputs", nout=3, opset=18),
    C("split-both18", "Split", {"axis": 1, "num_outputs": 3}, "num_outputs", inits={"s": I64(1, 1, 1)}, nout=3),
    C("transpose-repeat", "Transpose", {"perm": [0, 0, 1]}, "perm"),
    C("transpose-short", "Transpose", {"perm": [0, 1]}, "perm"),
    C("transpose-range", "Transpose", {"perm": [0, 1, 3]}, "perm"),
    C("transpose-negative", "Transpose", {"perm": [-1, 0, 1]}, "perm"),
    C("squeeze-range", "Squeeze", {}, "axes", inits={"a": I64(3)}),
    C("squeeze-not-one", "Squeeze", {}, "axes", inits={"a": I64(1)}),
    C("squeeze11-range", "Squeeze", {"axes": [5]}, "axes", opset=11),
    C("reshape-2d-shape", "Reshape", {}, "shape", inits={"s": np.array([[2], [3], [4]], np.int64)}),
    C("reshape-scalar-shape", "Reshape", {}, "shape", feeds={"x": np.zeros((3,), F)}, inits={"s": np.array(3, np.int64)}),
    C("unsqueeze-range", "Unsqueeze", {}, "axes", inits={"a": I64(4)}),
    C("unsqueeze-repeat", "Unsqueeze", {}, "axes", inits={"a": I64(0, 0)}),
    C("unsqueeze11-range", "Unsqueeze", {"axes": [-5]}, "axes", opset=11),
    C("slice-axes-range", "Slice", {}, "axes", inits={"s": I64(0), "e": I64(1), "a": I64(3)}),
    C("slice-axes-repeat", "Slice", {}, "axes", inits={"s": I64(0, 0), "e": I64(1, 1), "a": I64(1, 1)}),
    C("slice-ends-count", "Slice", {}, "ends", inits={"s": I64(0, 0), "e": I64(1)}),
    C("slice-step0", "Slice", {}, "steps", inits={"s": I64(0), "e": I64(1), "a": I64(0), "st": I64(0)}),
    C("slice9-axes", "Slice", {"starts": [0], "ends": [1], "axes": [4]}, "axes", opset=9),
    C("reshape-two-minus-one", "Reshape", {}, "shape", inits={"s": I64(-1, -1)}),
    C("reshape-zero-past-rank", "Reshape", {}, "shape", inits={"s": I64(2, 3, 4, 0)}),
    C("reshape-negative", "Reshape", {}, "shape", inits={"s": I64(-2, -12)}),
    C("reshape-count", "Reshape", {}, "shape", inits={"s": I64(5, 5)}),
    C("reducesum-axes", "ReduceSum", {}, "axes", inits={"a": I64(3)}),
    C("reducemax13-axes", "ReduceMax", {"axes": [3]}, "axes", opset=13),
    C("reducemean-axes", "ReduceMean", {}, "axes", inits={"a": I64(-4)}),
    C("cumsum-axis", "CumSum", {}, "axis", inits={"a": I64(3)}),
    C("topk-axis", "TopK", {"axis": 3}, "axis", inits={"k": I64(1)}, nout=2, opset=11),
    C("topk-k", "TopK", {"axis": -1}, "k", inits={"k": I64(5)}, nout=2, opset=11),
    C("topk-k-negative", "TopK", {"axis": -1}, "k", inits={"k": I64(-1)}, nout=2, opset=11),
    C("pad-count", "Pad", {}, "pads", inits={"p": I64(1, 1)}),
    C("pad-axes", "Pad", {}, "axes", inits={"p": I64(1, 1), "c": np.array(0, F), "a": I64(3)}),
    C("pad-mode", "Pad", {"mode": "mirror"}, "mode", inits={"p": I64(0, 0, 1, 0, 0, 1)}),
    C("pad2-count", "Pad", {"pads": [1, 1]}, "pads", opset=2),
    C("pad-reflect-past-axis", "Pad", {"mode": "reflect"}, "reflect", inits={"p": I64(0, 0, 4, 0, 0, 0)}),
    C("pad-reflect-past-cropped-axis", "Pad", {"mode": "reflect"}, "reflect", inits={"p": I64(0, -1, 0, 0, 2, 0)}),
    C("tile-count", "Tile", {}, "repeats", inits={"r": I64(1, 2)}),
    C("tile-negative", "Tile", {}, "repeats", inits={"r": I64(1, -1, 1)}),
    C("expand-shape", "Expand", {}, "shape", inits={"s": I64(3, 1, 1)}),
    C("expand-negative", "Expand", {}, "shape", inits={"s": I64(2, -3, 4)}),
    C("depthtospace-divisible", "DepthToSpace", {"blocksize": 3}, "blocksize", feeds={"x": X4}),
    C("depthtospace-zero", "DepthToSpace", {"blocksize": 0}, "blocksize", feeds={"x": X4}),
    C("spacetodepth-divisible", "SpaceToDepth", {"blocksize": 3}, "blocksize", feeds={"x": X4}),
    C("conv-group", "Conv", {"group": 3}, "group", feeds={"x": X4}, inits={"w": np.zeros((4, 1, 3, 3), F)}),
    C("conv-channels", "Conv", {}, "group", feeds={"x": X4}, inits={"w": np.zeros((4, 3, 3, 3), F)}),
    C("conv-kernel-count", "Conv", {"kernel_shape": [3]}, "kernel_shape", feeds={"x": X4}, inits={"w": W33}),
    C("conv-kernel-vs-w", "Conv", {"kernel_shape": [2, 2]}, "kernel_shape", feeds={"x": X4}, inits={"w": W33}),
    C("conv-strides-count", "Conv", {"strides": [1]}, "strides", feeds={"x": X4}, inits={"w": W33}),
    C("conv-strides-zero", "Conv", {"strides": [0, 1]}, "strides", feeds={"x": X4}, inits={"w": W33}),
    C("conv-pads-count", "Conv", {"pads": [1, 1]}, "pads", feeds={"x": X4}, inits={"w": W33}),
    C("conv-pads-negative", "Conv", {"pads": [-1, 0, 0, 0]}, "pads", feeds={"x": X4}, inits={"w": W33}),
    C("conv-dilations-zero", "Conv", {"dilations": [0, 1]}, "dilations", feeds={"x": X4}, inits={"w": W33}),
    C("conv-kernel-too-big", "Conv", {}, "kernel_shape", feeds={"x": X4}, inits={"w": np.zeros((4, 4, 5, 5), F)}),
    C("convtranspose-group", "ConvTranspose", {"group": 3}, "group", feeds={"x": X4},
      inits={"w": np.zeros((4, 1, 3, 3), F)}),
    C("convtranspose-strides", "ConvTranspose", {"strides": [0, 1]}, "strides", feeds={"x": X4},
      inits={"w": np.zeros((4, 1, 3, 3), F)}),
    C("convtranspose-output_padding", "ConvTranspose", {"output_padding": [2, 2], "strides": [2, 2]},
      "output_padding", feeds={"x": X4}, inits={"w": np.zeros((4, 1, 3, 3), F)}),
    C("maxpool-kernel-count", "MaxPool", {"kernel_shape": [2]}, "kernel_shape", feeds={"x": X4}),
    C("maxpool-kernel-zero", "MaxPool", {"kernel_shape": [0, 2]}, "kernel_shape", feeds={"x": X4}),
    C("maxpool-storage_order", "MaxPool", {"kernel_shape": [2, 2], "storage_order": 2}, "storage_order",
      feeds={"x": X4}),
    C("maxpool-auto_pad", "MaxPool", {"kernel_shape": [2, 2], "auto_pad": "FOO"}, "auto_pad", feeds={"x": X4}),
    C("averagepool-strides", "AveragePool", {"kernel_shape": [2, 2], "strides": [0, 1]}, "strides", feeds={"x": X4}),
    C("averagepool-pads", "AveragePool", {"kernel_shape": [2, 2], "pads": [1, 1]}, "pads", feeds={"x": X4}),
    C("gemm-rank", "Gemm", {}, "A", inits={"b": np.zeros((4, 2), F)}),
    C("gemm-transA", "Gemm", {"transA": 1}, "transA", feeds={"x": np.zeros((2, 3), F)}, inits={"b": np.zeros((3, 2), F)}),
    C("gemm-c", "Gemm", {}, "C", feeds={"x": np.zeros((2, 3), F)},
      inits={"b": np.zeros((3, 2), F), "c": np.zeros((3, 2), F)}),
    C("layernorm-axis", "LayerNormalization", {"axis": 3}, "axis", inits={"s": np.ones(4, F)}),
    C("layernorm-axis-negative", "LayerNormalization", {"axis": -4}, "axis", inits={"s": np.ones(4, F)}),
    C("layernorm-scale", "LayerNormalization", {"axis": -1}, "Scale", inits={"s": np.ones(5, F)}),
    C("batchnorm-scale", "BatchNormalization", {}, "scale", feeds={"x": X4},
      inits={"s": np.ones(3, F), "b": np.ones(4, F), "m": np.ones(4, F), "v": np.ones(4, F)}),
    C("batchnorm-rank", "BatchNormalization", {}, "X", feeds={"x": np.zeros(4, F)},
      inits={"s": np.ones(4, F), "b": np.ones(4, F), "m": np.ones(4, F), "v": np.ones(4, F)}),
    C("einsum-rank", "Einsum", {"equation": "ij,jk->ik"}, "equation", feeds={"x": X3, "y": X3}),
    C("einsum-output", "Einsum", {"equation": "ij,jk->iz"}, "equation",
      feeds={"x": np.zeros((2, 3), F), "y": np.zeros((3, 4), F)}),
    C("onehot-axis", "OneHot", {"axis": 3}, "axis", feeds={"x": np.zeros((2, 3), np.int64)},
      inits={"d": I64(4), "v": np.array([0, 1], F)}),
    C("onehot-depth", "OneHot", {}, "depth", feeds={"x": np.zeros((2, 3), np.int64)},
      inits={"d": I64(0), "v": np.array([0, 1], F)}),
    C("compress-axis", "Compress", {"axis": 3}, "axis", inits={"c": np.array([True])}),
    C("reversesequence-axes", "ReverseSequence", {"batch_axis": 1, "time_axis": 1}, "time_axis",
      inits={"l": I64(1, 1, 1)}),
    C("resize-axes", "Resize", {"axes": [4], "mode": "nearest"}, "axes",
      inits={"r": np.array([], F), "sc": np.array([2], F)}),
    C("instancenorm-scale", "InstanceNormalization", {}, "scale", inits={"s": np.ones(2, F), "b": np.ones(3, F)}),
    C("groupnorm-num_groups", "GroupNormalization", {"num_groups": 3}, "num_groups", feeds={"x": X4},
      inits={"s": np.ones(3, F), "b": np.ones(3, F)}),
    C("mvn-axes", "MeanVarianceNormalization", {"axes": [3]}, "axes"),
    C("lrn-size", "LRN", {"size": 0}, "size", feeds={"x": X4}),
    C("unique-axis", "Unique", {"axis": 3}, "axis"),
    C("globalaveragepool-rank", "GlobalAveragePool", {}, "input", feeds={"x": np.zeros((2, 3), F)}),
    C("globalmaxpool-rank", "GlobalMaxPool", {}, "input", feeds={"x": np.zeros((2, 3), F)}),
]


def _model(op, attrs, feeds, inits, out, opset, nout):
    outs = [f"y{i}" for i in range(nout)]
    node = helper.make_node(op, list(feeds) + list(inits), outs, name=f"bad_{op.lower()}", **attrs)
    ins = [helper.make_tensor_value_info(k, numpy_helper.from_array(v).data_type, v.shape) for k, v in feeds.items()]
    types = [out] + [TP.INT64 if op == "TopK" else out] * (nout - 1)
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, types)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("op,attrs,name,feeds,inits,out,opset,nout", CASES)
def test_invalid_attribute_raises_typed_error(op, attrs, name, feeds, inits, out, opset, nout):
    model = _model(op, attrs, feeds, inits, out, opset, nout)
    with pytest.raises(Exception):  # the oracle agrees that the model is invalid
        ort_run(model, feeds)
    with pytest.raises((ParseError, ShapeError)) as e:
        mgx_graph.compile(model, target="ref").run(feeds)
    msg = str(e.value)
    assert f"bad_{op.lower()}" in msg and op in msg and name in msg, msg


ACCEPTED = [  # onnxruntime accepts these: mgx_graph must give its values
    C("squeeze-repeat", "Squeeze", {}, "axes", feeds={"x": np.zeros((1, 3, 1), F)}, inits={"a": I64(0, -3)}),
    C("reducesum-repeat", "ReduceSum", {}, "axes", inits={"a": I64(1, -2)}),
    C("argmax-keepdims2", "ArgMax", {"axis": 0, "keepdims": 2}, "keepdims", out=TP.INT64),
    C("reducemax-keepdims2", "ReduceMax", {"keepdims": 2}, "keepdims", inits={"a": I64(1)}),
    C("split18-num_outputs-past-dim", "Split", {"axis": 1, "num_outputs": 4}, "num_outputs", nout=4),
    C("scatterelements-unknown-reduction", "ScatterElements", {"axis": 0, "reduction": "avg"}, "reduction",
      inits={"i": np.ones((1, 3, 4), np.int64), "u": np.full((1, 3, 4), 5, F)}),
    C("scatternd-unknown-reduction", "ScatterND", {"reduction": "foo"}, "reduction",
      inits={"i": np.ones((1, 1), np.int64), "u": np.full((1, 3, 4), 5, F)}),
    C("compress-2d-condition", "Compress", {"axis": 1}, "condition", inits={"c": np.array([[True, False, True]])}),
    # pads longer than the axis: wrap repeats it, edge repeats its end (each border copies from itself)
    C("pad-wrap-longer-than-axis", "Pad", {"mode": "wrap"}, "pads", opset=19, inits={"p": I64(0, 7, 1, 1, 8, 9)}),
    C("pad-wrap-cropped", "Pad", {"mode": "wrap"}, "pads", opset=19, inits={"p": I64(0, -1, 5, 0, 4, -2)}),
    C("pad-edge-longer-than-axis", "Pad", {"mode": "edge"}, "pads", inits={"p": I64(3, 0, 9, 2, 5, 0)}),
    C("pad-reflect-longest", "Pad", {"mode": "reflect"}, "pads", inits={"p": I64(1, 2, 3, 0, 2, 3)}),
]


def _same_as_onnxruntime(model, feeds, target):
    """mgx_graph's outputs equal onnxruntime CPU's (shape, dtype, values); skipped where the installed
    onnxruntime refuses the model (1.30 refuses Split-18 with num_outputs past the dim, which 1.32 runs)."""
    try:
        want = ort_run(model, feeds)
    except Exception as e:
        pytest.skip(f"this onnxruntime refuses the model, so it gives no values to compare: {e}")
    got = mgx_graph.compile(model, target=target).run(feeds)
    for g, w in zip(got, want):
        assert np.asarray(g).shape == w.shape and np.asarray(g).dtype == w.dtype, (np.shape(g), w.shape)
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("op,attrs,name,feeds,inits,out,opset,nout", ACCEPTED)
def test_attribute_onnxruntime_accepts_gives_its_values(target, op, attrs, name, feeds, inits, out, opset, nout):
    feeds = {k: np.arange(v.size, dtype=v.dtype).reshape(v.shape) for k, v in feeds.items()}
    model = _model(op, attrs, feeds, inits, out, opset, nout)
    _same_as_onnxruntime(model, feeds, target)


# ---------------------------------------------------------------------------------------------------
# Empty tensors (a dim of length 0) flow as onnxruntime's do
# ---------------------------------------------------------------------------------------------------
E3 = np.zeros((2, 0, 3), F)
REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
          "ReduceLogSumExp", "ReduceSumSquare"]
EMPTY = [C(f"{op}-axis{a}-o{o}", op, {"axis": a}, "", feeds={"x": E3}, opset=o)
         for op in ("Softmax", "LogSoftmax", "Hardmax") for a in (1, 2) for o in (11, 13)] + \
    [C(f"{op}-k{k}", op, {"keepdims": k}, "", feeds={"x": E3}, inits={"a": I64(1)}) for op in REDUCE for k in (0, 1)] + \
    [C(f"{op}-int32-k0", op, {"keepdims": 0}, "", feeds={"x": np.zeros((2, 0, 3), np.int32)}, inits={"a": I64(1)},
       out=TP.INT32) for op in ("ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd")] + [
    C("reducesum-all", "ReduceSum", {"keepdims": 0}, "", feeds={"x": E3}),
    C("reducemax-other-axis", "ReduceMax", {"keepdims": 1}, "", feeds={"x": E3}, inits={"a": I64(2)}),
    C("argmax-other-axis", "ArgMax", {"axis": 2}, "", feeds={"x": E3}, out=TP.INT64),
    C("topk-k0", "TopK", {"axis": 1}, "", feeds={"x": E3}, inits={"k": I64(0)}, nout=2, opset=11),
    C("cumsum", "CumSum", {}, "", feeds={"x": E3}, inits={"a": I64(1)}),
    C("concat-empty-and-full", "Concat", {"axis": 1}, "", feeds={"x": E3, "y": np.ones((2, 2, 3), F)}),
    C("concat-empties", "Concat", {"axis": 1}, "", feeds={"x": E3, "y": E3}),
    C("matmul-k0", "MatMul", {}, "", feeds={"x": np.zeros((2, 0), F), "y": np.zeros((0, 3), F)}),
    C("gemm-k0", "Gemm", {}, "", feeds={"x": np.zeros((2, 0), F), "y": np.zeros((0, 3), F)}),
    C("layernorm-outer-empty", "LayerNormalization", {"axis": -1}, "", feeds={"x": np.zeros((0, 3), F)},
      inits={"s": np.ones(3, F)}, opset=17),
    C("pad-constant-empty-axis", "Pad", {}, "", feeds={"x": E3}, inits={"p": I64(0, 1, 0, 0, 1, 0)}),
    C("pad-edge-other-axis", "Pad", {"mode": "edge"}, "", feeds={"x": E3}, inits={"p": I64(0, 0, 1, 0, 0, 1)}),
]


@pytest.mark.parametrize("op,attrs,name,feeds,inits,out,opset,nout", EMPTY)
def test_empty_tensors_match_onnxruntime(target, op, attrs, name, feeds, inits, out, opset, nout):
    model = _model(op, attrs, feeds, inits, out, opset, nout)
    _same_as_onnxruntime(model, feeds, target)


@pytest.mark.parametrize("op,attrs,name,feeds,inits,out,opset,nout", [
    C("argmax-empty-axis", "ArgMax", {"axis": 1}, "axis", feeds={"x": E3}, out=TP.INT64),
    C("argmin-empty-axis", "ArgMin", {"axis": -2}, "axis", feeds={"x": E3}, out=TP.INT64),
    C("layernorm-empty-dims", "LayerNormalization", {"axis": 1}, "axis", feeds={"x": E3}, inits={"s": np.ones(3, F)},
      opset=17),
    C("globalmaxpool-empty", "GlobalMaxPool", {}, "input", feeds={"x": np.zeros((1, 2, 0, 3), F)}),
    C("globalaveragepool-empty", "GlobalAveragePool", {}, "input", feeds={"x": np.zeros((1, 2, 0, 3), F)}),
    C("pad-edge-empty-axis", "Pad", {"mode": "edge"}, "axis 1", feeds={"x": E3}, inits={"p": I64(0, 1, 0, 0, 1, 0)}),
])
def test_empty_axis_refused_as_onnxruntime(op, attrs, name, feeds, inits, out, opset, nout):
    test_invalid_attribute_raises_typed_error(op, attrs, name, feeds, inits, out, opset, nout)
