"""Native SwiGLU (opset 28) and CausalConvWithState (opset 27) on each target, eager and in a graph
(oracle: numpy, the spec's formulas; onnxruntime CPU has no kernels for these opsets here)."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from mgx_graph.errors import ParseError, UnsupportedOpError
from native_util import run_native

R = np.random.default_rng(4)
T = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}


def _model(op, inputs, outputs, opset, **attrs):
    node = helper.make_node(op, list(inputs), outputs, **attrs)
    g = helper.make_graph([node], op, [helper.make_tensor_value_info(n, T[a.dtype.type], list(a.shape))
                                       for n, a in inputs.items()],
                          [helper.make_tensor_value_info(o, 0, None) for o in outputs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=12)


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("alpha", [1.0, 1.702])
@pytest.mark.parametrize("shape", [(7,), (2, 3, 8)])
def test_swiglu(target, hip_graph, alpha, shape):
    a, b = (R.uniform(-4, 4, size=shape).astype(np.float32) for _ in range(2))
    expect = a / (1 + np.exp(-alpha * a)) * b
    run_native(_model("SwiGLU", {"a": a, "b": b}, ["y"], 28, alpha=alpha), {"a": a, "b": b}, target, hip_graph,
               ["sigmoid"], expect=[expect], tol=(1e-5, 1e-6))


def _conv_oracle(x, w, bias, past, act):
    B, C, L = x.shape
    K = w.shape[2]
    padded = np.concatenate([past if past is not None else np.zeros((B, C, K - 1), x.dtype), x], axis=2)
    y = sum(padded[:, :, i:i + L].astype(np.float64) * w[None, :, 0, i, None] for i in range(K))
    if bias is not None:
        y = y + bias[None, :, None]
    y = y.astype(x.dtype)
    if act != "none":
        y = (y.astype(np.float32) / (1 + np.exp(-y.astype(np.float32)))).astype(x.dtype)
    return [y, padded[:, :, L:]]


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("act", ["none", "silu", "swish"])
@pytest.mark.parametrize("with_bias,with_past", [(False, False), (True, False), (True, True), (False, True)])
@pytest.mark.parametrize("K,L", [(4, 6), (3, 1), (1, 5)])
def test_causal_conv_with_state(target, hip_graph, act, with_bias, with_past, K, L):
    B, C = 2, 3
    feeds = {"x": R.uniform(-2, 2, size=(B, C, L)).astype(np.float32),
             "w": R.uniform(-1, 1, size=(C, 1, K)).astype(np.float32)}
    names = ["x", "w", "", ""]
    if with_bias:
        feeds["b"], names[2] = R.uniform(-1, 1, size=C).astype(np.float32), "b"
    if with_past:
        feeds["s"], names[3] = R.uniform(-2, 2, size=(B, C, K - 1)).astype(np.float32), "s"
    node = helper.make_node("CausalConvWithState", [n for n in names[:4 if with_past else 3 if with_bias else 2]],
                            ["y", "state"], activation=act)
    g = helper.make_graph([node], "ccs", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape))
                                          for n, a in feeds.items()],
                          [helper.make_tensor_value_info(o, 0, None) for o in ("y", "state")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 27)], ir_version=12)
    expect = _conv_oracle(feeds["x"], feeds["w"], feeds.get("b"), feeds.get("s"), act)
    run_native(model, feeds, target, hip_graph, ["concat"] if K > 1 else [], expect=expect, tol=(1e-5, 1e-6))


def test_gated_errors():
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(ParseError, match="one shape"):
        mgx_graph.compile(_model("SwiGLU", {"a": a, "b": np.zeros((3,), np.float32)}, ["y"], 28), target="ref")
    x, w = np.zeros((1, 2, 4), np.float32), np.zeros((2, 1, 3), np.float32)
    with pytest.raises(UnsupportedOpError, match="activation='gelu'"):
        mgx_graph.compile(_model("CausalConvWithState", {"x": x, "w": w}, ["y", "s"], 27, activation="gelu"),
                          target="ref")
    with pytest.raises(ParseError, match="weight"):
        mgx_graph.compile(_model("CausalConvWithState", {"x": x, "w": w[:1]}, ["y", "s"], 27), target="ref")
