"""Native CumProd (opset 26: axis, exclusive, reverse) on each target, eager and in a graph (oracle:
numpy ``cumprod``; onnxruntime CPU has no opset 26 kernel here)."""
import numpy as np
import pytest
from onnx import helper

from native_util import run_native
from util import make_model

R = np.random.default_rng(9)


def _oracle(x, axis, exclusive, reverse):
    y = np.flip(x, axis) if reverse else x
    c = np.cumprod(y, axis=axis, dtype=np.float32 if x.dtype == np.float16 else x.dtype).astype(x.dtype)
    if exclusive:
        c = np.concatenate([np.ones_like(np.take(c, [0], axis)), np.delete(c, -1, axis)], axis=axis)
    return np.flip(c, axis) if reverse else c


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("shape,axis", [((6,), 0), ((3, 5), 1), ((3, 5), -2), ((2, 3, 4), 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.float16])
def test_cumprod(target, hip_graph, exclusive, reverse, shape, axis, dtype):
    if np.dtype(dtype).kind == "f":
        x = R.uniform(0.5, 1.5, size=shape).astype(dtype)
    else:
        x = R.integers(-3, 4, size=shape).astype(dtype)
    node = helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    model = make_model([node], {"x": x}, ["y"], {"axis": np.array(axis, np.int64)}, opset=26)
    tol = (2e-3, 2e-3) if dtype == np.float16 else (1e-6, 1e-7)
    run_native(model, {"x": x}, target, hip_graph, ["cumprod"], expect=[_oracle(x, axis % len(shape), exclusive,
                                                                                   reverse)], tol=tol)
