"""Native LayerNormalization with its Mean / InvStdDev outputs (any axis, with and without bias, float32
and float16 inputs) against onnxruntime CPU, on each target, eager and in a graph."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from native_util import run_native
from util import make_model

R = np.random.default_rng(3)


def _case(shape, axis, bias, dtype=np.float32, outputs=("y", "mean", "inv")):
    x = R.uniform(-2, 2, size=shape).astype(dtype)
    norm = shape[axis:] if axis >= 0 else shape[len(shape) + axis:]
    init = {"s": R.uniform(0.5, 1.5, size=norm).astype(dtype)}
    if bias:
        init["b"] = R.uniform(-1, 1, size=norm).astype(dtype)
    node = helper.make_node("LayerNormalization", ["x"] + list(init), list(outputs), axis=axis, epsilon=1e-3)
    types = {"y": TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT,
             "mean": TensorProto.FLOAT, "inv": TensorProto.FLOAT}
    model = make_model([node], {"x": x}, [o for o in outputs if o], init, opset=17,
                       output_types={o: types[o] for o in outputs if o})
    return model, {"x": x}


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("shape,axis", [((4, 6), -1), ((4, 6), 0), ((2, 3, 5), 1), ((2, 3, 5), -2),
                                        ((2, 3, 4, 5), 2), ((2, 3, 4, 5), 0)])
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_stats(target, hip_graph, shape, axis, bias):
    model, feeds = _case(shape, axis, bias)
    run_native(model, feeds, target, hip_graph, ["reduce_mean"], tol=(1e-5, 1e-5))


def test_layernorm_inv_std_only(target):
    model, feeds = _case((3, 8), -1, True, outputs=("y", "", "inv"))
    run_native(model, feeds, target, False, ["reduce_mean"], tol=(1e-5, 1e-5))


def test_layernorm_stats_float16(target):
    model, feeds = _case((2, 4, 8), -1, True, dtype=np.float16)
    run_native(model, feeds, target, False, ["reduce_mean"], tol=(2e-3, 2e-3))
