"""Mish (opset 18) and Swish (opset 24) on each target, eager and in a graph, against a float64 numpy
oracle (tight) and onnxruntime CPU (its sigmoid is an approximation in the far tails: looser)."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from native_util import check_outputs, run_native
from util import make_model, ort_run

R = np.random.default_rng(3)
EDGES = np.array([0.0, -0.0, 1e-8, -30.0, 30.0, 88.0, -88.0, 100.0, -100.0, np.inf, -np.inf, np.nan], np.float32)


def _mish(x):
    x = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return x * np.tanh(np.logaddexp(x, 0))


def _swish(x, alpha=1.0):
    x = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return x / (1 + np.exp(-alpha * x))


def _x(dtype=np.float32):
    return np.concatenate([R.uniform(-8, 8, size=52).astype(np.float32), EDGES]).reshape(4, 16).astype(dtype)


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("opset", [18, 22])
def test_mish(target, hip_graph, opset):
    x = _x()
    model = make_model([helper.make_node("Mish", ["x"], ["y"])], {"x": x}, ["y"], opset=opset)
    prog = run_native(model, {"x": x}, target, hip_graph, ["mish"], tol=(2e-6, 1e-7),
                      expect=[_mish(x).astype(np.float32)])
    check_outputs(prog.run({"x": x}), ort_run(model, {"x": x}), tol=(2e-6, 5e-6))


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("alpha", [None, 1.0, 0.5, -2.0, 1.702])
def test_swish(target, hip_graph, alpha):
    x = _x()
    attrs = {} if alpha is None else {"alpha": alpha}
    model = make_model([helper.make_node("Swish", ["x"], ["y"], **attrs)], {"x": x}, ["y"], opset=24)
    prog = run_native(model, {"x": x}, target, hip_graph, ["swish"], tol=(2e-6, 1e-7),
                      expect=[_swish(x, 1.0 if alpha is None else alpha).astype(np.float32)])
    check_outputs(prog.run({"x": x}), ort_run(model, {"x": x}), tol=(2e-6, 5e-6))


@pytest.mark.parametrize("op,opset", [("Mish", 22), ("Swish", 24)])
@pytest.mark.parametrize("dtype,otype,tol", [(np.float16, TensorProto.FLOAT16, (2e-3, 1e-3)),
                                             (np.float64, TensorProto.DOUBLE, (1e-12, 1e-14))])
def test_activation_types(target, op, opset, dtype, otype, tol):
    x = _x(dtype)
    x = x[np.isfinite(x).all(axis=1)] if dtype == np.float16 else x
    model = make_model([helper.make_node(op, ["x"], ["y"])], {"x": x}, ["y"], opset=opset, output_types={"y": otype})
    want = (_mish if op == "Mish" else _swish)(x).astype(dtype)  # onnxruntime has no float64 Mish
    run_native(model, {"x": x}, target, False, [op.lower()], tol=tol, expect=[want])
