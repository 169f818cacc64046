"""Unit tests of individual compiler passes on small hand-built programs."""
import numpy as np
import pytest
from onnx import helper

import mgx_graph
from util import make_model, ort_run

R = np.random.default_rng(3)


def rmsnorm_model(weighted=True, eps=1e-5, d=8):
    nodes = [helper.make_node("Pow", ["x", "two"], ["p"]),
             helper.make_node("ReduceMean", ["p", "ax"], ["m"], keepdims=1),
             helper.make_node("Add", ["m", "eps"], ["a"]),
             helper.make_node("Sqrt", ["a"], ["s"]),
             helper.make_node("Reciprocal", ["s"], ["r"]),
             helper.make_node("Mul", ["x", "r"], ["y0"])]
    init = {"two": np.array(2.0, np.float32), "ax": np.array([-1], np.int64), "eps": np.array(eps, np.float32)}
    if weighted:
        nodes.append(helper.make_node("Mul", ["w", "y0"], ["y"]))
        init["w"] = R.uniform(0.5, 1.5, size=(d,)).astype(np.float32)
    else:
        nodes.append(helper.make_node("Identity", ["y0"], ["y"]))
    return make_model(nodes, {"x": np.zeros((2, 3, d), np.float32)}, ["y"], init)


@pytest.mark.parametrize("weighted", [True, False])
def test_fuse_norms_rewrites_rmsnorm(target, weighted):
    model = rmsnorm_model(weighted)
    x = R.normal(size=(2, 3, 8)).astype(np.float32) * 3
    prog = mgx_graph.compile(model, target=target, hip_graph=False)
    names = [i.op.name for i in prog.get_main_module().instructions if not i.op.builtin]
    assert names == ["rms_norm"], names
    np.testing.assert_allclose(prog.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_fuse_norms_leaves_other_patterns():
    """pow with exponent 3 is not a norm: nothing is fused and the result is unchanged."""
    model = rmsnorm_model()
    for init in model.graph.initializer:
        if init.name == "two":
            init.CopyFrom(helper.make_tensor("two", 1, [], [3.0]))
    prog = mgx_graph.compile(model, target="ref")
    assert "rms_norm" not in prog.print()
    x = R.normal(size=(2, 3, 8)).astype(np.float32)
    np.testing.assert_allclose(prog.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_rms_norm_fp16_does_not_overflow(target):
    """x**2 of 400 overflows float16 (max 65504); the fused norm accumulates in float32."""
    model = rmsnorm_model()
    x = np.full((2, 3, 8), 400.0, np.float32)
    x[0, 0, 0] = -300.0
    want = ort_run(model, {"x": x})[0]
    prog = mgx_graph.compile(model, target=target, fp16=True)
    got = prog.run({"x": x.astype(np.float16)})[0]
    assert got.dtype == np.float16 and np.all(np.isfinite(got))
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=2e-3)


def test_quantize_keeps_index_arithmetic_in_float32():
    """cos(position * freq) stays float32 and is converted once where it meets the activations."""
    nodes = [helper.make_node("Cast", ["pos"], ["pf"], to=1),
             helper.make_node("Mul", ["pf", "freq"], ["ang"]),
             helper.make_node("Cos", ["ang"], ["c"]),
             helper.make_node("Mul", ["x", "c"], ["y"])]
    model = make_model(nodes, {"x": np.zeros((1, 4), np.float32), "pos": np.zeros((1, 1), np.int64)}, ["y"],
                       {"freq": np.array([1.0, 0.5, 0.25, 0.125], np.float32)})
    prog = mgx_graph.compile(model, target="ref", fp16=True)
    by_name = {i.op.name: i for i in prog.get_main_module().instructions}
    assert by_name["cos"].shape.dtype == "float32"
    assert by_name["x"].shape.dtype == "float16" if "x" in by_name else True
    assert prog.get_parameter_shapes()["x"].dtype == "float16"
    assert prog.get_parameter_shapes()["pos"].dtype == "int64"
    x = np.ones((1, 4), np.float16)
    pos = np.array([[200]], np.int64)
    got = prog.run({"x": x, "pos": pos})[0]
    want = np.cos(np.float32(200) * np.array([1.0, 0.5, 0.25, 0.125], np.float32))
    # float32 angles: the error is float16 rounding of the result only (an fp16 angle would be off by ~0.06)
    np.testing.assert_allclose(got.astype(np.float32)[0], want, atol=1e-3)


def test_quantize_fp16_program_interface():
    model = rmsnorm_model()
    prog = mgx_graph.compile(model, target="ref", fp16=True)
    assert prog.get_parameter_shapes()["x"].dtype == "float16"
    assert prog.get_output_shapes()[0].dtype == "float16"
    with pytest.raises(mgx_graph.ParameterError, match="expected dtype float16"):
        prog.run({"x": np.zeros((2, 3, 8), np.float32)})
