"""AffineGrid (opset 20) on each target against onnxruntime CPU: 2-D and 3-D, align_corners 0 and 1; a node
with bad attributes or inputs is refused with a ParseError naming it."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from mgx_graph.errors import ParseError
from native_util import check_outputs
from util import ort_run

R = np.random.default_rng(5)


def _model(theta_shape, size, align_corners=0, name="grid"):
    node = helper.make_node("AffineGrid", ["theta", "size"], ["y"], name=name, align_corners=align_corners)
    size_init = helper.make_tensor("size", TensorProto.INT64, [len(size)], list(size))
    g = helper.make_graph([node], "affine_grid",
                          [helper.make_tensor_value_info("theta", TensorProto.FLOAT, list(theta_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [size_init])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)


@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("theta_shape,size", [((2, 2, 3), (2, 3, 5, 7)), ((2, 3, 4), (2, 1, 4, 3, 6))],
                         ids=["2d", "3d"])
def test_affine_grid_matches_onnxruntime(target, theta_shape, size, align_corners):
    model = _model(theta_shape, size, align_corners)
    theta = R.standard_normal(theta_shape).astype(np.float32)
    prog = mgx_graph.compile(model, target=target)
    got = prog.run({"theta": theta})
    assert got[0].shape == (size[0], *size[2:], theta_shape[1])
    check_outputs(got, ort_run(model, {"theta": theta}), (1e-5, 1e-5))


@pytest.mark.parametrize("theta_shape,size,align_corners,match", [
    ((2, 2, 3), (2, 3, 5, 7), 2, "'align_corners' = 2 is not one of 0, 1"),
    ((2, 2, 4), (2, 3, 5, 7), 0, r"theta \[2, 2, 4\] must be"),
    ((2, 2, 3), (2, 3, 4, 5, 7), 0, "'size' = .* has 5 values: expected 4"),
    ((2, 3, 4), (2, 1, 4, 3), 0, "'size' = .* has 4 values: expected 5"),
    ((2, 2, 3), (3, 3, 5, 7), 0, "has batch 3"),
    ((2, 2, 3), (2, 3, 0, 7), 0, "expected values >= 1"),
], ids=["align", "theta", "size-2d", "size-3d", "batch", "zero"])
def test_affine_grid_refuses_bad_node(theta_shape, size, align_corners, match):
    with pytest.raises(ParseError, match=match) as e:
        mgx_graph.compile(_model(theta_shape, size, align_corners, name="bad_grid"), target="ref")
    assert "bad_grid" in str(e.value)


def test_affine_grid_size_must_be_known():
    node = helper.make_node("AffineGrid", ["theta", "size"], ["y"], name="runtime_size")
    g = helper.make_graph([node], "affine_grid", [
        helper.make_tensor_value_info("theta", TensorProto.FLOAT, [1, 2, 3]),
        helper.make_tensor_value_info("size", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
    theta = R.standard_normal((1, 2, 3)).astype(np.float32)
    size = np.array([1, 1, 3, 4], np.int64)
    # a size given at run time is specialized on (the program is compiled for the value seen)
    got = mgx_graph.compile(model, target="ref").run({"theta": theta, "size": size})
    check_outputs(got, ort_run(model, {"theta": theta, "size": size}), (1e-5, 1e-5))
