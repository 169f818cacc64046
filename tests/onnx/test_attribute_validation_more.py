"""Invalid attributes and inputs of ONNX nodes, the families test_attribute_validation.py does not cover
(issue 28, part 3): recurrent layers, Resize / Upsample, ConvTranspose, pooling, DepthToSpace /
SpaceToDepth, Einsum, Range, Trilu, ReverseSequence, GridSample, RoiAlign, NonMaxSuppression, Col2Im, the
signal ops, CenterCropPad, Mod, BitShift, Cast, the quantization ops, normalizations, losses, the
com.microsoft ops and control flow.  For each case onnxruntime CPU refuses the model and mgx_graph raises
ParseError / ShapeError naming the node, its op type and the attribute (or input); the cases onnxruntime
accepts give its values."""
import numpy as np
import pytest
from onnx import AttributeProto
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import mgx_graph
from mgx_graph.errors import ParseError, ShapeError
from util import ort_run

F = np.float32
X3 = np.zeros((2, 3, 4), F)
X4 = np.zeros((1, 4, 4, 4), F)
W33 = np.zeros((4, 4, 3, 3), F)
MS = "com.microsoft"


def EMPTY_INTS(name):
    return helper.make_attribute(name, [], attr_type=AttributeProto.INTS)


def I64(*v):
    return np.array(v, np.int64)


def K(id, op, attrs, name, feeds=None, inits=None, outs=(TP.FLOAT,), opset=18, domain="", order=None):
    """One case: node ``op`` (of ``domain``) with ``attrs`` reading graph inputs ``feeds`` (default x = X3)
    and initializers ``inits`` in the order ``order`` ("" for an omitted input; default: feeds, then
    initializers); ``outs``: the ONNX types of its outputs; ``name``: what the error must name."""
    return pytest.param(dict(op=op, attrs=attrs, name=name, feeds={"x": X3} if feeds is None else feeds,
                             inits=inits or {}, outs=outs, opset=opset, domain=domain, order=order), id=id)


def build(c):
    """(model, feeds) of case ``c``."""
    feeds, inits = c["feeds"], c["inits"]
    names = c["order"] if c["order"] is not None else list(feeds) + list(inits)
    outs = [f"y{i}" for i in range(len(c["outs"]))]
    plain = {k: v for k, v in c["attrs"].items() if not isinstance(v, AttributeProto)}
    node = helper.make_node(c["op"], names, outs, name=f"bad_{c['op'].lower()}", domain=c["domain"], **plain)
    node.attribute.extend(v for v in c["attrs"].values() if isinstance(v, AttributeProto))
    ins = [helper.make_tensor_value_info(k, numpy_helper.from_array(v).data_type, v.shape) for k, v in feeds.items()]
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, c["outs"])],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    opsets = [helper.make_opsetid("", c["opset"])] + ([helper.make_opsetid(c["domain"], 1)] if c["domain"] else [])
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 10 if c["opset"] >= 21 else 8
    return m, feeds


# -- recurrent layers: X [T=2, B=1, I=3], hidden size 2
XR = np.zeros((2, 1, 3), F)


def RNN(id, attrs, name, op="RNN", G=1, H=2, D=1, W=None, R=None, B=None, h0=None, opset=14):
    inits = {"w": np.zeros((D, G * H, 3), F) if W is None else W, "r": np.zeros((D, G * H, H), F) if R is None else R}
    if B is not None or h0 is not None:
        inits["b"] = np.zeros((D, 2 * G * H), F) if B is None else B
    order = None
    if h0 is not None:
        inits["h"] = h0
        order = ["x", "w", "r", "b", "", "h"]
    return K(id, op, {"hidden_size": H, **attrs}, name, feeds={"x": XR}, inits=inits, outs=(TP.FLOAT, TP.FLOAT),
             opset=opset, order=order)


RECURRENT = [
    RNN("rnn-direction", {"direction": "sideways"}, "direction"),
    RNN("rnn-hidden_size", {"hidden_size": 3}, "hidden_size"),
    RNN("rnn-W-hidden", {"hidden_size": 2}, "W", W=np.zeros((1, 3, 3), F)),
    RNN("rnn-W-input", {"hidden_size": 2}, "W", W=np.zeros((1, 2, 4), F)),
    RNN("rnn-W-directions", {"direction": "bidirectional"}, "W", R=np.zeros((2, 2, 2), F)),
    RNN("rnn-R-directions", {"direction": "bidirectional"}, "R", W=np.zeros((2, 2, 3), F)),
    RNN("rnn-B", {}, "B", B=np.zeros((1, 3), F)),
    RNN("rnn-initial_h", {}, "initial_h", h0=np.zeros((1, 2, 2), F)),
    RNN("rnn-activations-count", {"activations": ["Tanh", "Tanh", "Tanh"]}, "activations"),
    RNN("rnn-activations-name", {"activations": ["Foo"]}, "activation"),
    RNN("rnn-layout", {"layout": 2}, "layout"),
    RNN("gru-clip", {"clip": -1.0}, "clip", op="GRU", G=3),
    RNN("gru-direction", {"direction": "up"}, "direction", op="GRU", G=3),
    RNN("gru-hidden_size", {"hidden_size": 4}, "hidden_size", op="GRU", G=3),
    RNN("gru-W-gates", {}, "W", op="GRU", G=3, W=np.zeros((1, 4, 3), F)),
    RNN("gru-activations-count", {"activations": ["Sigmoid"]}, "activations", op="GRU", G=3),
    RNN("gru-B", {}, "B", op="GRU", G=3, B=np.zeros((1, 6), F)),
    RNN("lstm-direction", {"direction": "sideways"}, "direction", op="LSTM", G=4),
    RNN("lstm-hidden_size", {"hidden_size": 3}, "hidden_size", op="LSTM", G=4),
    RNN("lstm-W-gates", {}, "W", op="LSTM", G=4, W=np.zeros((1, 6, 3), F)),
    RNN("lstm-R", {}, "R", op="LSTM", G=4, R=np.zeros((1, 8, 3), F)),
    RNN("lstm-B", {}, "B", op="LSTM", G=4, B=np.zeros((1, 8), F)),
    RNN("lstm-activations-count", {"activations": ["Sigmoid", "Tanh"]}, "activations", op="LSTM", G=4),
    RNN("lstm-activations-name", {"activations": ["Sigmoid", "Foo", "Tanh"]}, "activation", op="LSTM", G=4),
    RNN("lstm-layout", {"layout": 3}, "layout", op="LSTM", G=4),
    RNN("lstm-clip", {"clip": 0.0}, "clip", op="LSTM", G=4),
    RNN("lstm-initial_h", {}, "initial_h", op="LSTM", G=4, h0=np.zeros((1, 1, 3), F)),
    K("rnn-X-rank", "RNN", {"hidden_size": 2}, "X", feeds={"x": np.zeros((2, 3), F)},
      inits={"w": np.zeros((1, 2, 3), F), "r": np.zeros((1, 2, 2), F)}, outs=(TP.FLOAT, TP.FLOAT), opset=14),
]

# -- Resize / Upsample on X4 [1, 4, 4, 4]
SC2 = np.array([1, 1, 2, 2], F)


def RS(id, attrs, name, scales=SC2, sizes=None, roi=None, opset=18, x=X4):
    if opset < 11:  # X, scales
        return K(id, "Resize", attrs, name, feeds={"x": x}, inits={"sc": scales}, opset=opset)
    inits = {k: v for k, v in (("roi", roi), ("sc", scales), ("sz", sizes)) if v is not None}
    order = ["x", "roi" if roi is not None else "", "sc" if scales is not None else ""] + ["sz"] * (sizes is not None)
    return K(id, "Resize", attrs, name, feeds={"x": x}, inits=inits, opset=opset, order=order)


RESIZE = [
    RS("resize-mode", {"mode": "bicubic"}, "mode"),
    RS("resize-coordinate_transformation_mode", {"coordinate_transformation_mode": "center"},
       "coordinate_transformation_mode"),
    RS("resize-nearest_mode", {"nearest_mode": "up"}, "nearest_mode"),
    RS("resize-keep_aspect_ratio_policy", {"keep_aspect_ratio_policy": "fit"}, "keep_aspect_ratio_policy",
       scales=None, sizes=I64(1, 4, 8, 8)),
    RS("resize-scales-count", {}, "scales", scales=np.array([2, 2], F)),
    RS("resize-sizes-count", {}, "sizes", scales=None, sizes=I64(8, 8)),
    RS("resize-scales-and-sizes", {}, "scales", sizes=I64(1, 4, 8, 8)),
    RS("resize-scales-zero", {}, "scales", scales=np.array([1, 1, 0, 2], F)),
    RS("resize-scales-negative", {}, "scales", scales=np.array([1, 1, -2, 2], F)),
    RS("resize-sizes-negative", {}, "sizes", scales=None, sizes=I64(1, 4, -8, 8)),
    RS("resize-axes-repeat", {"axes": [2, 2]}, "axes", scales=np.array([2, 2], F)),
    RS("resize-axes-count", {"axes": [2, 3]}, "scales", scales=np.array([2], F)),
    RS("resize-roi-count", {"coordinate_transformation_mode": "tf_crop_and_resize"}, "roi",
       roi=np.array([0, 0, 1, 1], F)),
    RS("resize-antialias-cubic-exclude", {"mode": "nearest", "antialias": 1}, "antialias"),
    RS("resize10-mode", {"mode": "area"}, "mode", opset=10),
    RS("resize10-scales-count", {}, "scales", scales=np.array([2, 2], F), opset=10),
    K("upsample-mode", "Upsample", {"mode": "foo"}, "mode", feeds={"x": X4}, inits={"sc": SC2}, opset=9),
    K("upsample-scales-count", "Upsample", {}, "scales", feeds={"x": X4}, inits={"sc": np.array([2, 2], F)}, opset=9),
    K("upsample-scales-below-one", "Upsample", {}, "scales", feeds={"x": X4}, inits={"sc": np.array([1, 1, .5, 2], F)},
      opset=9),
    K("upsample7-scales-count", "Upsample", {"scales": [2.0, 2.0]}, "scales", feeds={"x": X4}, opset=7),
]

# -- ConvTranspose, pooling
WT = np.zeros((4, 1, 3, 3), F)


def CT(id, attrs, name, w=WT, x=X4):
    return K(id, "ConvTranspose", attrs, name, feeds={"x": x}, inits={"w": w})


def PL(id, op, attrs, name, x=X4, outs=(TP.FLOAT,), opset=18):
    return K(id, op, attrs, name, feeds={"x": x}, outs=outs, opset=opset)


SPATIAL = [
    CT("convtranspose-pads-count", {"pads": [1, 1]}, "pads"),
    CT("convtranspose-dilations-empty", {"dilations": EMPTY_INTS("dilations")}, "dilations"),
    PL("maxpool-pads-empty", "MaxPool", {"kernel_shape": [2, 2], "pads": EMPTY_INTS("pads")}, "pads"),
    CT("convtranspose-strides-count", {"strides": [1]}, "strides"),
    CT("convtranspose-dilations-count", {"dilations": [1, 1, 1]}, "dilations"),
    CT("convtranspose-dilations-zero", {"dilations": [0, 1]}, "dilations"),
    CT("convtranspose-kernel_shape", {"kernel_shape": [2, 2]}, "kernel_shape"),
    CT("convtranspose-kernel_shape-count", {"kernel_shape": [3]}, "kernel_shape"),
    CT("convtranspose-output_padding-count", {"output_padding": [0]}, "output_padding"),
    CT("convtranspose-output_padding-negative", {"output_padding": [-1, 0], "strides": [2, 2]}, "output_padding"),
    CT("convtranspose-output_shape-count", {"output_shape": [8]}, "output_shape"),
    CT("convtranspose-output_shape-large", {"output_shape": [20, 20]}, "output_shape"),
    CT("convtranspose-auto_pad", {"auto_pad": "SAME"}, "auto_pad"),
    CT("convtranspose-W-rank", {}, "W", w=np.zeros((4, 1, 3), F)),
    CT("convtranspose-X-rank", {}, "X", x=np.zeros((1, 4), F), w=np.zeros((4, 1), F)),
    PL("maxpool-rank", "MaxPool", {"kernel_shape": [2]}, "X", x=np.zeros((1, 4), F)),
    PL("maxpool-dilations-count", "MaxPool", {"kernel_shape": [2, 2], "dilations": [1]}, "dilations"),
    PL("maxpool-dilations-zero", "MaxPool", {"kernel_shape": [2, 2], "dilations": [1, 0]}, "dilations"),
    PL("maxpool-pads-negative", "MaxPool", {"kernel_shape": [2, 2], "pads": [0, -1, 0, 0]}, "pads"),
    PL("maxpool-pads-kernel", "MaxPool", {"kernel_shape": [2, 2], "pads": [2, 0, 0, 0]}, "pads"),
    PL("maxpool-no-kernel", "MaxPool", {}, "kernel_shape"),
    PL("maxpool-storage_order-indices", "MaxPool", {"kernel_shape": [2, 2], "storage_order": 5}, "storage_order",
       outs=(TP.FLOAT, TP.INT64)),
    PL("averagepool-auto_pad", "AveragePool", {"kernel_shape": [2, 2], "auto_pad": "same_upper"}, "auto_pad"),
    PL("averagepool-kernel-count", "AveragePool", {"kernel_shape": [2, 2, 2]}, "kernel_shape"),
    PL("averagepool-no-kernel", "AveragePool", {}, "kernel_shape"),
    PL("lppool-kernel-count", "LpPool", {"kernel_shape": [2]}, "kernel_shape"),
    PL("lppool-auto_pad", "LpPool", {"kernel_shape": [2, 2], "auto_pad": "FULL"}, "auto_pad"),
    PL("lppool-strides-zero", "LpPool", {"kernel_shape": [2, 2], "strides": [0, 1]}, "strides"),
    PL("globallppool-rank", "GlobalLpPool", {}, "input", x=np.zeros((1, 4), F)),
    PL("depthtospace-mode", "DepthToSpace", {"blocksize": 2, "mode": "RDC"}, "mode"),
    PL("depthtospace-rank", "DepthToSpace", {"blocksize": 2}, "input", x=X3),
    PL("depthtospace-no-blocksize", "DepthToSpace", {}, "blocksize"),
    PL("spacetodepth-zero", "SpaceToDepth", {"blocksize": 0}, "blocksize"),
    PL("spacetodepth-rank", "SpaceToDepth", {"blocksize": 2}, "input", x=X3),
    PL("spacetodepth-negative", "SpaceToDepth", {"blocksize": -2}, "blocksize"),
    K("centercroppad-axes", "CenterCropPad", {"axes": [3]}, "axes", inits={"s": I64(2)}),
    K("centercroppad-axes-repeat", "CenterCropPad", {"axes": [1, 1]}, "axes", inits={"s": I64(2, 2)}),
    K("centercroppad-shape-count", "CenterCropPad", {}, "shape", inits={"s": I64(2, 2)}),
    K("col2im-block-count", "Col2Im", {}, "block_shape", feeds={"x": np.zeros((1, 4, 9), F)},
      inits={"i": I64(4, 4), "b": I64(2)}),
    K("col2im-strides-zero", "Col2Im", {"strides": [0, 1]}, "strides", feeds={"x": np.zeros((1, 4, 9), F)},
      inits={"i": I64(4, 4), "b": I64(2, 2)}),
    K("col2im-pads-count", "Col2Im", {"pads": [0, 0]}, "pads", feeds={"x": np.zeros((1, 4, 9), F)},
      inits={"i": I64(4, 4), "b": I64(2, 2)}),
    K("col2im-blocks", "Col2Im", {}, "input", feeds={"x": np.zeros((1, 4, 8), F)},
      inits={"i": I64(4, 4), "b": I64(2, 2)}),
    K("col2im-channels", "Col2Im", {}, "input", feeds={"x": np.zeros((1, 3, 9), F)},
      inits={"i": I64(4, 4), "b": I64(2, 2)}),
]

# -- index, signal and element-wise ops
X2 = np.zeros((3, 4), F)
BOX = np.zeros((1, 2, 4), F)
SCO = np.zeros((1, 1, 2), F)
OTHER = [
    K("einsum-inputs", "Einsum", {"equation": "ij,jk->ik"}, "equation", feeds={"x": X2}),
    K("einsum-chars", "Einsum", {"equation": "i1,jk->ik"}, "equation", feeds={"x": X2, "y": X2}),
    K("einsum-output-repeat", "Einsum", {"equation": "ij->ii"}, "equation", feeds={"x": X2}),
    K("einsum-arrows", "Einsum", {"equation": "ij->j->i"}, "equation", feeds={"x": X2}),
    K("einsum-sizes", "Einsum", {"equation": "ij,jk->ik"}, "equation", feeds={"x": X2, "y": X2}),
    K("einsum-no-equation", "Einsum", {}, "equation", feeds={"x": X2}),
    K("range-delta-zero", "Range", {}, "delta", feeds={}, inits={"s": np.array(0, F), "l": np.array(4, F),
                                                                  "d": np.array(0, F)}),
    K("range-start-vector", "Range", {}, "start", feeds={}, inits={"s": np.array([0, 1], F), "l": np.array(4, F),
                                                                    "d": np.array(1, F)}),
    K("trilu-rank", "Trilu", {}, "input", feeds={"x": np.zeros(4, F)}),
    K("trilu-k-vector", "Trilu", {}, "k", feeds={"x": X2}, inits={"k": I64(1, 2)}),
    K("reversesequence-batch_axis", "ReverseSequence", {"batch_axis": 2, "time_axis": 0}, "batch_axis",
      inits={"l": I64(1, 1, 1, 1)}),
    K("reversesequence-time_axis", "ReverseSequence", {"batch_axis": 0, "time_axis": 2}, "time_axis",
      inits={"l": I64(1, 1)}),
    K("reversesequence-lens-count", "ReverseSequence", {"batch_axis": 1, "time_axis": 0}, "sequence_lens",
      inits={"l": I64(1, 1)}),
    K("reversesequence-rank", "ReverseSequence", {"batch_axis": 1, "time_axis": 0}, "input",
      feeds={"x": np.zeros(3, F)}, inits={"l": I64(1)}),
    K("gathernd-batch_dims-negative", "GatherND", {"batch_dims": -1}, "batch_dims", inits={"i": np.zeros((2, 1), np.int64)}),
    K("gathernd-index-depth", "GatherND", {}, "indices", inits={"i": np.zeros((2, 4), np.int64)}),
    K("scatternd-index-depth", "ScatterND", {}, "indices", inits={"i": np.zeros((1, 4), np.int64),
                                                                   "u": np.zeros(1, F)}),
    K("scatternd-updates", "ScatterND", {}, "updates", inits={"i": np.zeros((1, 1), np.int64), "u": np.zeros((1, 3), F)}),
    K("gridsample-mode", "GridSample", {"mode": "area"}, "mode", feeds={"x": X4},
      inits={"g": np.zeros((1, 2, 2, 2), F)}),
    K("gridsample-padding_mode", "GridSample", {"padding_mode": "wrap"}, "padding_mode", feeds={"x": X4},
      inits={"g": np.zeros((1, 2, 2, 2), F)}),
    K("gridsample-grid", "GridSample", {}, "grid", feeds={"x": X4}, inits={"g": np.zeros((1, 2, 2, 3), F)}),
    K("gridsample-rank", "GridSample", {}, "X", feeds={"x": X3}, inits={"g": np.zeros((2, 2, 2), F)}),
    K("roialign-mode", "RoiAlign", {"mode": "min"}, "mode", feeds={"x": X4},
      inits={"r": np.zeros((1, 4), F), "b": I64(0)}),
    K("roialign-rois", "RoiAlign", {}, "rois", feeds={"x": X4}, inits={"r": np.zeros((1, 5), F), "b": I64(0)}),
    K("roialign-batch_indices", "RoiAlign", {}, "batch_indices", feeds={"x": X4},
      inits={"r": np.zeros((1, 4), F), "b": I64(0, 0)}),
    K("nms-center_point_box", "NonMaxSuppression", {"center_point_box": 2}, "center_point_box",
      feeds={"x": BOX}, inits={"s": SCO}, outs=(TP.INT64,)),
    K("nms-boxes", "NonMaxSuppression", {}, "boxes", feeds={"x": np.zeros((1, 2, 3), F)}, inits={"s": SCO},
      outs=(TP.INT64,)),
    K("nms-scores", "NonMaxSuppression", {}, "scores", feeds={"x": BOX}, inits={"s": np.zeros((1, 1, 3), F)},
      outs=(TP.INT64,)),
    K("dft-axis", "DFT", {}, "axis", feeds={"x": np.zeros((1, 8, 1), F)}, inits={"n": I64(), "a": I64(2)},
      order=["x", "", "a"], opset=20),
    K("dft17-axis", "DFT", {"axis": 2}, "axis", feeds={"x": np.zeros((1, 8, 1), F)}, opset=17),
    K("dft-onesided-complex", "DFT", {"onesided": 1}, "onesided", feeds={"x": np.zeros((1, 8, 2), F)}, opset=17),
    K("dft-last-dim", "DFT", {}, "input", feeds={"x": np.zeros((1, 8, 3), F)}, opset=17),
    K("stft-frame_step", "STFT", {}, "frame_step", feeds={"x": np.zeros((1, 16, 1), F)},
      inits={"s": I64(0), "w": np.ones(4, F)}, opset=17),
    K("stft-window", "STFT", {}, "window", feeds={"x": np.zeros((1, 16, 1), F)},
      inits={"s": I64(2), "w": np.ones(4, F), "n": I64(8)}, opset=17),
    K("hannwindow-negative", "HannWindow", {}, "size", feeds={}, inits={"n": np.array(-1, np.int64)}, opset=17),
    K("mod-fmod-value", "Mod", {"fmod": 2}, "fmod", feeds={"x": np.ones(4, np.int64), "y": np.ones(4, np.int64)},
      outs=(TP.INT64,)),
    K("bitshift-direction", "BitShift", {"direction": "UP"}, "direction",
      feeds={"x": np.ones(4, np.uint8), "y": np.ones(4, np.uint8)}, outs=(TP.UINT8,)),
    K("bitshift-no-direction", "BitShift", {}, "direction",
      feeds={"x": np.ones(4, np.uint8), "y": np.ones(4, np.uint8)}, outs=(TP.UINT8,)),
    K("cast-to", "Cast", {"to": 99}, "to"),
    K("cast-no-to", "Cast", {}, "to"),
    K("gelu-approximate", "Gelu", {"approximate": "fast"}, "approximate", opset=20),
    K("eyelike-rank", "EyeLike", {}, "input"),
    K("eyelike-dtype", "EyeLike", {"dtype": 99}, "dtype", feeds={"x": X2}),
    K("onehot-values", "OneHot", {}, "values", feeds={"x": np.zeros(3, np.int64)},
      inits={"d": I64(4), "v": np.array([0, 1, 2], F)}),
    K("cumsum-axis-vector", "CumSum", {}, "axis", inits={"a": I64(0, 1)}),
    K("dropout-ratio", "Dropout", {}, "ratio", inits={"r": np.array(1.5, F)}),
    K("cumsum-exclusive", "CumSum", {"exclusive": 2}, "exclusive", inits={"a": I64(1)}),
    K("cumsum-reverse", "CumSum", {"reverse": -1}, "reverse", inits={"a": I64(1)}),
    K("reversesequence-lens-range", "ReverseSequence", {"batch_axis": 1, "time_axis": 0}, "sequence_lens",
      inits={"l": I64(5, 0, 1)}),
    K("nms-iou_threshold", "NonMaxSuppression", {}, "iou_threshold", feeds={"x": BOX},
      inits={"s": SCO, "m": I64(2), "iou": np.array([1.5], F)}, outs=(TP.INT64,)),
    K("shape-start", "Shape", {"start": "a"}, "start", outs=(TP.INT64,)),
]

# -- quantization, normalization, losses
U8 = np.uint8
XQ = np.zeros((2, 3, 4), np.int8)
QX4 = np.zeros((1, 4, 4, 4), U8)
QW = np.zeros((4, 4, 3, 3), U8)
QUANT = [
    K("quantizelinear-axis", "QuantizeLinear", {"axis": 3}, "axis", inits={"s": np.ones(3, F), "z": np.zeros(3, U8)},
      outs=(TP.UINT8,)),
    K("quantizelinear-scale-length", "QuantizeLinear", {"axis": 1}, "scale", inits={"s": np.ones(4, F)},
      outs=(TP.UINT8,)),
    K("quantizelinear-block_size-negative", "QuantizeLinear", {"axis": 2, "block_size": -2}, "block_size",
      inits={"s": np.ones((2, 3, 2), F)}, outs=(TP.UINT8,), opset=21),
    K("quantizelinear-output_dtype", "QuantizeLinear", {"output_dtype": TP.INT8}, "output_dtype",
      inits={"s": np.array(1, F), "z": np.array(0, U8)}, outs=(TP.UINT8,), opset=21),
    K("dequantizelinear-axis", "DequantizeLinear", {"axis": -4}, "axis", feeds={"x": XQ},
      inits={"s": np.ones(3, F), "z": np.zeros(3, np.int8)}),
    K("dequantizelinear-scale-length", "DequantizeLinear", {"axis": 2}, "scale", feeds={"x": XQ},
      inits={"s": np.ones(3, F)}),
    K("dequantizelinear-zero_point-shape", "DequantizeLinear", {"axis": 1}, "zero_point", feeds={"x": XQ},
      inits={"s": np.ones(3, F), "z": np.zeros(2, np.int8)}),
    K("matmulinteger-inner", "MatMulInteger", {}, "B", feeds={"x": np.zeros((2, 3), U8)},
      inits={"b": np.zeros((4, 2), U8)}, outs=(TP.INT32,)),
    K("matmulinteger-a_zero_point", "MatMulInteger", {}, "a_zero_point", feeds={"x": np.zeros((2, 3), U8)},
      inits={"b": np.zeros((3, 2), U8), "za": np.zeros(3, U8)}, outs=(TP.INT32,)),
    K("convinteger-group", "ConvInteger", {"group": 3}, "group", feeds={"x": QX4}, inits={"w": QW}, outs=(TP.INT32,)),
    K("convinteger-kernel_shape", "ConvInteger", {"kernel_shape": [2, 2]}, "kernel_shape", feeds={"x": QX4},
      inits={"w": QW}, outs=(TP.INT32,)),
    K("convinteger-strides", "ConvInteger", {"strides": [0, 1]}, "strides", feeds={"x": QX4}, inits={"w": QW},
      outs=(TP.INT32,)),
    K("convinteger-pads", "ConvInteger", {"pads": [1, 1]}, "pads", feeds={"x": QX4}, inits={"w": QW}, outs=(TP.INT32,)),
    K("qlinearconv-group", "QLinearConv", {"group": 3}, "group", feeds={"x": QX4},
      inits={"xs": np.array(1, F), "xz": np.array(0, U8), "w": QW, "ws": np.array(1, F), "wz": np.array(0, U8),
             "ys": np.array(1, F), "yz": np.array(0, U8)}, outs=(TP.UINT8,)),
    K("qlinearconv-dilations", "QLinearConv", {"dilations": [0, 1]}, "dilations", feeds={"x": QX4},
      inits={"xs": np.array(1, F), "xz": np.array(0, U8), "w": QW, "ws": np.array(1, F), "wz": np.array(0, U8),
             "ys": np.array(1, F), "yz": np.array(0, U8)}, outs=(TP.UINT8,)),
    K("qlinearconv-w_scale", "QLinearConv", {}, "w_scale", feeds={"x": QX4},
      inits={"xs": np.array(1, F), "xz": np.array(0, U8), "w": QW, "ws": np.ones(3, F), "wz": np.array(0, U8),
             "ys": np.array(1, F), "yz": np.array(0, U8)}, outs=(TP.UINT8,)),
    K("instancenorm-rank", "InstanceNormalization", {}, "input", feeds={"x": X2},
      inits={"s": np.ones(4, F), "b": np.ones(4, F)}),
    K("groupnorm-zero", "GroupNormalization", {"num_groups": 0}, "num_groups", feeds={"x": X4},
      inits={"s": np.ones(4, F), "b": np.ones(4, F)}, opset=21),
    K("groupnorm-missing", "GroupNormalization", {}, "num_groups", feeds={"x": X4},
      inits={"s": np.ones(4, F), "b": np.ones(4, F)}, opset=21),
    K("groupnorm-scale", "GroupNormalization", {"num_groups": 2}, "scale", feeds={"x": X4},
      inits={"s": np.ones(3, F), "b": np.ones(4, F)}, opset=21),
    K("lrn-missing-size", "LRN", {}, "size", feeds={"x": X4}),
    K("lrn-rank", "LRN", {"size": 3}, "input", feeds={"x": X2}),
    K("lpnormalization-p", "LpNormalization", {"p": 3}, "p"),
    K("rmsnorm-axis", "RMSNormalization", {"axis": 3}, "axis", inits={"s": np.ones(4, F)}, opset=23),
    K("rmsnorm-scale", "RMSNormalization", {}, "scale", inits={"s": np.ones(5, F)}, opset=23),
    K("nll-target", "NegativeLogLikelihoodLoss", {}, "target", inits={"t": np.zeros((2, 3), np.int64)}),
]

# -- com.microsoft ops: hidden 8 = 2 heads of 4
Q8 = np.zeros((1, 2, 8), F)
I32 = np.int32
GQA = dict(feeds={"x": Q8}, inits={"k": np.zeros((1, 2, 8), F), "v": np.zeros((1, 2, 8), F),
                                   "sl": np.array([1], I32), "tl": np.array(2, I32)},
           order=["x", "k", "v", "", "", "sl", "tl"], outs=(TP.FLOAT, TP.FLOAT, TP.FLOAT), domain=MS)
NB = dict(feeds={"x": np.zeros((2, 16), F)}, domain=MS)


def NB_(id, attrs, name, b=np.zeros((4, 1, 8), U8), s=np.ones(4, F)):
    return K(id, "MatMulNBits", {"K": 16, "N": 4, "bits": 4, "block_size": 16, **attrs}, name,
             inits={"b": b, "s": s}, **NB)


CONTRIB = [
    K("gqa-kv_num_heads", "GroupQueryAttention", {"num_heads": 2, "kv_num_heads": 3}, "kv_num_heads", **GQA),
    K("gqa-num_heads", "GroupQueryAttention", {"num_heads": 3, "kv_num_heads": 1}, "num_heads", **GQA),
    K("gqa-kv-hidden", "GroupQueryAttention", {"num_heads": 2, "kv_num_heads": 2}, "key",
      **{**GQA, "inits": {**GQA["inits"], "k": np.zeros((1, 2, 6), F)}}),
    NB_("matmulnbits-bits", {"bits": 3}, "bits"),
    NB_("matmulnbits-block_size", {"block_size": 8}, "block_size", b=np.zeros((4, 2, 4), U8), s=np.ones(8, F)),
    NB_("matmulnbits-K", {"K": 32}, "K"),
    NB_("matmulnbits-B", {}, "B", b=np.zeros((3, 1, 8), U8)),
    NB_("matmulnbits-scales", {}, "scales", s=np.ones(3, F)),
    K("skiplayernorm-skip", "SkipLayerNormalization", {}, "skip", feeds={"x": Q8},
      inits={"s": np.zeros((1, 2, 4), F), "g": np.ones(8, F), "b": np.zeros(8, F)}, domain=MS),
    K("skiplayernorm-gamma", "SkipLayerNormalization", {}, "gamma", feeds={"x": Q8},
      inits={"s": np.zeros((1, 2, 8), F), "g": np.ones(4, F), "b": np.zeros(8, F)}, domain=MS),
    K("skipsimplifiedlayernorm-gamma", "SkipSimplifiedLayerNormalization", {}, "gamma", feeds={"x": Q8},
      inits={"s": np.zeros((1, 2, 8), F), "g": np.ones(4, F)}, domain=MS),
    K("skiplayernorm-rank", "SkipLayerNormalization", {}, "input", feeds={"x": np.zeros(8, F)},
      inits={"s": np.zeros(8, F), "g": np.ones(8, F), "b": np.zeros(8, F)}, domain=MS),
    K("skiplayernorm-rank4", "SkipLayerNormalization", {}, "input", feeds={"x": np.zeros((1, 1, 2, 8), F)},
      inits={"s": np.zeros((1, 1, 2, 8), F), "g": np.ones(8, F), "b": np.zeros(8, F)}, domain=MS),
    K("fastgelu-bias", "FastGelu", {}, "bias", feeds={"x": Q8}, inits={"b": np.zeros(4, F)}, domain=MS),
    K("biasgelu-bias", "BiasGelu", {}, "bias", feeds={"x": Q8}, inits={"b": np.zeros(4, F)}, domain=MS),
    K("mha-num_heads", "MultiHeadAttention", {"num_heads": 3}, "num_heads", feeds={"x": Q8},
      inits={"k": np.zeros((1, 2, 8), F), "v": np.zeros((1, 2, 8), F)}, domain=MS),
    K("mha-key", "MultiHeadAttention", {"num_heads": 2}, "key", feeds={"x": Q8},
      inits={"k": np.zeros((1, 2, 6), F), "v": np.zeros((1, 2, 8), F)}, domain=MS),
    K("rotary-cos", "RotaryEmbedding", {}, "cos_cache", feeds={"x": Q8},
      inits={"p": np.zeros((1, 2), np.int64), "c": np.ones((4, 3), F), "s": np.ones((4, 2), F)}, domain=MS),
    K("rotary-num_heads", "RotaryEmbedding", {"num_heads": 3}, "num_heads", feeds={"x": Q8},
      inits={"p": np.zeros((1, 2), np.int64), "c": np.ones((4, 2), F), "s": np.ones((4, 2), F)}, domain=MS),
    K("attention23-q_num_heads", "Attention", {"q_num_heads": 3, "kv_num_heads": 3}, "q_num_heads", feeds={"x": Q8},
      inits={"k": np.zeros((1, 2, 8), F), "v": np.zeros((1, 2, 8), F)}, opset=23),
    K("attention23-kv_num_heads", "Attention", {"q_num_heads": 2, "kv_num_heads": 3}, "kv_num_heads",
      feeds={"x": Q8}, inits={"k": np.zeros((1, 2, 8), F), "v": np.zeros((1, 2, 8), F)}, opset=23),
]

SCHEMA = [  # nodes against their op's schema
    K("add-one-input", "Add", {}, "inputs"),
    K("relu-two-outputs", "Relu", {}, "outputs", outs=(TP.FLOAT, TP.FLOAT)),
    K("conv-empty-X", "Conv", {}, "X", feeds={}, inits={"w": W33}, order=["", "w"]),
    K("matmul-unknown-attribute", "MatMul", {"axis": 0}, "axis", feeds={"x": X2, "y": X2.T.copy()}),
    K("gather-axis-floats", "Gather", {"axis": [1.0]}, "axis", inits={"i": I64(0)}),
    K("cast-to-string-attribute", "Cast", {"to": "FLOAT"}, "to"),
]

ALL = RECURRENT + RESIZE + SPATIAL + OTHER + QUANT + CONTRIB + SCHEMA


@pytest.mark.parametrize("c", ALL)
def test_invalid_attribute_raises_typed_error(c):
    model, feeds = build(c)
    with pytest.raises(Exception):  # the oracle agrees that the model is invalid
        ort_run(model, feeds)
    with pytest.raises((ParseError, ShapeError)) as e:
        mgx_graph.compile(model, target="ref").run(feeds)
    msg = str(e.value)
    assert f"bad_{c['op'].lower()}" in msg and c["op"] in msg and c["name"] in msg, msg


_rng = np.random.default_rng(0)
RW = [_rng.standard_normal(s).astype(F) for s in ((1, 2, 3), (1, 2, 2))]
GW = [_rng.standard_normal(s).astype(F) for s in ((1, 6, 3), (1, 6, 2), (1, 12))]
ACCEPTED = [  # onnxruntime accepts these: mgx_graph must give its values
    PL("lppool-p0", "LpPool", {"kernel_shape": [2, 2], "p": 0}, "p"),
    PL("lppool-p-negative", "LpPool", {"kernel_shape": [2, 2], "p": -1}, "p"),
    PL("globallppool-p0", "GlobalLpPool", {"p": 0}, "p"),
    PL("globallppool-p-negative", "GlobalLpPool", {"p": -2}, "p"),
    PL("maxpool-ceil_mode2", "MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 2}, "ceil_mode"),
    PL("averagepool-count_include_pad2", "AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                                                         "count_include_pad": 2}, "count_include_pad"),
    K("roialign-unknown-ctm", "RoiAlign", {"coordinate_transformation_mode": "pixel"},
      "coordinate_transformation_mode", feeds={"x": X4}, inits={"r": np.array([[0, 0, 2, 3]], F), "b": I64(0)}),
    K("dft-inverse2", "DFT", {"inverse": 2}, "inverse", feeds={"x": np.zeros((1, 8, 1), F)}, opset=17),
    K("dft-onesided2", "DFT", {"onesided": 2}, "onesided", feeds={"x": np.zeros((1, 8, 1), F)}, opset=17),
    K("melweightmatrix-bins0", "MelWeightMatrix", {}, "num_mel_bins", feeds={},
      inits={"m": np.array(0, np.int64), "n": np.array(16, np.int64), "r": np.array(8000, np.int64),
             "lo": np.array(0, F), "hi": np.array(4000, F)}, opset=17),
    K("mvn-axes-repeat", "MeanVarianceNormalization", {"axes": [1, 1]}, "axes"),
    K("nll-unknown-reduction", "NegativeLogLikelihoodLoss", {"reduction": "avg"}, "reduction",
      inits={"t": np.ones((2, 4), np.int64)}),
    K("softmaxcrossentropy-unknown-reduction", "SoftmaxCrossEntropyLoss", {"reduction": "max"}, "reduction",
      inits={"t": np.ones((2, 4), np.int64)}),
    K("shape-start-end-clamped", "Shape", {"start": -10, "end": 10}, "start", outs=(TP.INT64,)),
    K("shape-start-past-end", "Shape", {"start": 2, "end": 1}, "start", outs=(TP.INT64,)),
    RNN("rnn-clip-negative", {"clip": -1.0}, "clip", W=RW[0], R=RW[1]),
    RNN("gru-linear_before_reset2", {"linear_before_reset": 2}, "linear_before_reset", op="GRU", G=3, W=GW[0], R=GW[1],
        B=GW[2]),
    K("trilu-upper2", "Trilu", {"upper": 2}, "upper", feeds={"x": X2}),
    K("isinf-detect2", "IsInf", {"detect_positive": 2}, "detect_positive", outs=(TP.BOOL,)),
    K("eyelike-k-past", "EyeLike", {"k": 7}, "k", feeds={"x": X2}),
    K("hardsigmoid-alpha-negative", "HardSigmoid", {"alpha": -1.0}, "alpha"),
    K("range-delta-against", "Range", {}, "delta", feeds={}, inits={"s": np.array(0, F), "l": np.array(4, F),
                                                                     "d": np.array(-1, F)}),
    RS("resize-exclude_outside2", {"mode": "cubic", "exclude_outside": 2}, "exclude_outside"),
    RS("resize10-cubic", {"mode": "cubic"}, "mode", opset=10),
    K("upsample-cubic", "Upsample", {"mode": "cubic"}, "mode", feeds={"x": X4}, inits={"sc": SC2}, opset=9),
    RS("resize-antialias2", {"mode": "linear", "antialias": 2}, "antialias", scales=np.array([1, 1, .5, .5], F)),
    K("gridsample-align_corners2", "GridSample", {"align_corners": 2}, "align_corners", feeds={"x": X4},
      inits={"g": np.full((1, 2, 2, 2), 0.5, F)}, opset=16),
    K("mod-fmod1-int", "Mod", {"fmod": 1}, "fmod", feeds={"x": np.ones(4, np.int64)}, inits={"y": I64(3, -3, 2, -2)},
      outs=(TP.INT64,)),
]


@pytest.mark.parametrize("c", ACCEPTED)
def test_attribute_onnxruntime_accepts_gives_its_values(target, c):
    feeds = {k: (np.arange(v.size, dtype=v.dtype).reshape(v.shape) - v.size // 3).astype(v.dtype)
             for k, v in c["feeds"].items()}
    model, _ = build(c)
    want = ort_run(model, feeds)
    got = mgx_graph.compile(model, target=target).run(feeds)
    for g, w in zip(got, want):
        assert np.asarray(g).shape == w.shape and np.asarray(g).dtype == w.dtype, (np.shape(g), w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


# -- control flow: subgraph bodies whose inputs / outputs do not fit the node
def _body(name, n_in, n_out, shape=(3,)):
    """A graph of ``n_in`` float inputs (the first two of a Loop body typed as it needs) and ``n_out``
    Identity outputs of its last input."""
    ins = [helper.make_tensor_value_info(f"{name}_i{k}", TP.FLOAT, list(shape)) for k in range(n_in)]
    nodes = [helper.make_node("Identity", [ins[-1].name if ins else "c"], [f"{name}_o{k}"]) for k in range(n_out)]
    outs = [helper.make_tensor_value_info(f"{name}_o{k}", TP.FLOAT, list(shape)) for k in range(n_out)]
    inits = [] if ins else [numpy_helper.from_array(np.ones(shape, F), "c")]
    return helper.make_graph(nodes, name, ins, outs, inits)


def _loop_body(n_in):
    ins = [helper.make_tensor_value_info("it", TP.INT64, []), helper.make_tensor_value_info("cin", TP.BOOL, [])] + \
        [helper.make_tensor_value_info(f"v{k}", TP.FLOAT, [3]) for k in range(n_in - 2)]
    nodes = [helper.make_node("Identity", ["cin"], ["cout"]), helper.make_node("Identity", ["v0"], ["vout"])]
    outs = [helper.make_tensor_value_info("cout", TP.BOOL, []), helper.make_tensor_value_info("vout", TP.FLOAT, [3])]
    return helper.make_graph(nodes, "body", ins, outs)


V3 = np.zeros(3, F)
CONTROL = [
    K("if-branch-outputs", "If", {"then_branch": _body("t", 0, 1), "else_branch": _body("e", 0, 2)}, "else_branch",
      feeds={"x": np.array(True)}),
    K("loop-body-inputs", "Loop", {"body": _loop_body(4)}, "body", feeds={"x": V3},
      inits={"m": I64(2).reshape(()), "c": np.array(True)}, order=["m", "c", "x"]),
    K("scan-num_scan_inputs", "Scan", {"body": _body("s", 1, 1), "num_scan_inputs": 2}, "num_scan_inputs",
      feeds={"x": np.zeros((2, 3), F)}, opset=16),
    K("scan-input-axes", "Scan", {"body": _body("s", 1, 1), "num_scan_inputs": 1, "scan_input_axes": [2]},
      "scan_input_axes", feeds={"x": np.zeros((2, 3), F)}, opset=16),
    K("scan-input-axes-count", "Scan", {"body": _body("s", 1, 1), "num_scan_inputs": 1, "scan_input_axes": [0, 1]},
      "scan_input_axes", feeds={"x": np.zeros((2, 3), F)}, opset=16),
    K("scan-output-axes", "Scan", {"body": _body("s", 1, 1), "num_scan_inputs": 1, "scan_output_axes": [-3]},
      "scan_output_axes", feeds={"x": np.zeros((2, 3), F)}, opset=16),
    K("scan-directions", "Scan", {"body": _body("s", 1, 1), "num_scan_inputs": 1, "scan_input_directions": [2]},
      "scan_input_directions", feeds={"x": np.zeros((2, 3), F)}, opset=16),
]


@pytest.mark.parametrize("c", CONTROL)
def test_invalid_control_flow_raises_typed_error(c):
    test_invalid_attribute_raises_typed_error(c)
