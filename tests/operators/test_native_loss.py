"""Native NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (reductions none / sum / mean, class
weights, ignore_index, 2-D to 5-D inputs) against onnxruntime CPU, on each target, eager and in a graph."""
import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph.errors import ParseError
from native_util import run_native
from util import make_model

R = np.random.default_rng(5)


def _feeds(shape, weight, ii, dtype=np.float32):
    N, C = shape[:2]
    x = R.uniform(-3, 0, size=shape).astype(dtype)
    t = R.integers(0, C, size=(N,) + tuple(shape[2:])).astype(np.int64)
    if ii is not None:
        t.reshape(-1)[::3] = ii
    feeds = {"x": x, "t": t}
    if weight:
        feeds["w"] = R.uniform(0.2, 1.5, size=C).astype(dtype)
    return feeds


def _model(op, feeds, outputs=("loss",), **attrs):
    node = helper.make_node(op, [n for n in ("x", "t", "w") if n in feeds], list(outputs), **attrs)
    return make_model([node], feeds, list(outputs), opset=13)


SHAPES = [(4, 5), (2, 3, 4), (2, 4, 2, 3), (1, 3, 2, 2, 2)]


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weight,ii", [(False, None), (True, None), (False, 1), (True, -1), (True, 7)])
@pytest.mark.parametrize("shape", SHAPES, ids=[str(len(s)) + "d" for s in SHAPES])
def test_nll_loss(target, hip_graph, reduction, weight, ii, shape):
    feeds = _feeds(shape, weight, ii)
    attrs = {"reduction": reduction} | ({"ignore_index": ii} if ii is not None else {})
    run_native(_model("NegativeLogLikelihoodLoss", feeds, **attrs), feeds, target, hip_graph, ["gather_elements"],
               tol=(1e-5, 1e-6))


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weight,ii", [(False, None), (True, None), (True, 2), (False, -1)])
@pytest.mark.parametrize("shape", SHAPES, ids=[str(len(s)) + "d" for s in SHAPES])
def test_softmax_cross_entropy(target, hip_graph, reduction, weight, ii, shape):
    feeds = _feeds(shape, weight, ii)
    feeds["x"] = (feeds["x"] * 2 + 3).astype(np.float32)
    attrs = {"reduction": reduction} | ({"ignore_index": ii} if ii is not None else {})
    model = _model("SoftmaxCrossEntropyLoss", feeds, outputs=("loss", "log_prob"), **attrs)
    run_native(model, feeds, target, hip_graph, ["logsoftmax", "gather_elements"], tol=(1e-5, 1e-5))


def test_softmax_cross_entropy_float16(target):
    feeds = _feeds((3, 4, 2), True, 1, dtype=np.float16)
    model = _model("SoftmaxCrossEntropyLoss", feeds, reduction="mean", ignore_index=1)
    run_native(model, feeds, target, False, ["logsoftmax"], tol=(5e-3, 5e-3))


def test_loss_errors():
    feeds = _feeds((2, 3, 4), True, None)
    bad = dict(feeds, t=feeds["t"][:, :2])
    with pytest.raises(ParseError, match="target"):
        mgx_graph.compile(_model("NegativeLogLikelihoodLoss", bad), target="ref")
    bad = dict(feeds, w=feeds["w"][:2])
    with pytest.raises(ParseError, match="weight"):
        mgx_graph.compile(_model("SoftmaxCrossEntropyLoss", bad), target="ref")
