"""Native BitCast (opset 26) on each target, eager and in a graph: the output's bytes equal the input's
(oracle: numpy ``view``; onnxruntime CPU has no opset 26 kernel here)."""
import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph.errors import ShapeError
from mgx_graph.ir.shape import NUMPY_TO_ONNX
from native_util import run_native

R = np.random.default_rng(2)
PAIRS = [(np.float32, np.int32), (np.int32, np.float32), (np.float64, np.int64), (np.uint32, np.int32),
         (np.int8, np.uint8), (np.uint16, np.int16), (np.bool_, np.uint8), (np.float16, np.uint16),
         (np.int64, np.uint64)]


def _model(x, to):
    node = helper.make_node("BitCast", ["x"], ["y"], to=NUMPY_TO_ONNX[np.dtype(to).name])
    g = helper.make_graph([node], "bitcast", [helper.make_tensor_value_info("x", NUMPY_TO_ONNX[x.dtype.name],
                                                                            list(x.shape))],
                          [helper.make_tensor_value_info("y", NUMPY_TO_ONNX[np.dtype(to).name], None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 26)], ir_version=12)


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("src,to", PAIRS, ids=[f"{np.dtype(a).name}-{np.dtype(b).name}" for a, b in PAIRS])
@pytest.mark.parametrize("shape", [(), (7,), (3, 4)])
def test_bitcast(target, hip_graph, src, to, shape):
    raw = R.integers(0, 256, size=shape + (np.dtype(src).itemsize,), dtype=np.uint8)
    x = raw.view(src).reshape(shape) if src is not np.bool_ else (raw[..., 0] & 1).astype(np.bool_)
    run_native(_model(x, to), {"x": x}, target, hip_graph, ["bitcast"], expect=[x.view(to)], tol=(0, 0))


def test_bitcast_width_mismatch():
    with pytest.raises(ShapeError, match="cannot be reinterpreted"):
        mgx_graph.compile(_model(np.zeros(3, np.float32), np.int64), target="ref")
