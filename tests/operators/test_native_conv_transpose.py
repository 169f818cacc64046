"""Native ConvTranspose against onnxruntime (CPU) on every target: groups, strides, dilations, pads,
output_padding, output_shape and auto_pad, 1-D to 3-D, with and without bias; no ``onnx_op``."""
import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph.errors import ParseError, UnsupportedOpError
from util import make_model, ort_run

R = np.random.default_rng(3)

CASES = {
    "basic": ((1, 4, 5, 6), (4, 3, 3, 3), dict()),
    "group2_strides": ((2, 4, 5, 6), (4, 2, 3, 2), dict(group=2, strides=[2, 3])),
    "depthwise": ((1, 4, 5, 6), (4, 1, 3, 3), dict(group=4, strides=[2, 2], pads=[1, 1, 1, 1])),
    "pads_output_padding": ((1, 2, 5, 6), (2, 3, 3, 3), dict(strides=[2, 2], pads=[1, 0, 2, 1], output_padding=[1, 1])),
    "dilations": ((1, 2, 5, 6), (2, 3, 3, 3), dict(strides=[2, 2], dilations=[2, 1])),
    "output_shape": ((1, 2, 5, 6), (2, 3, 3, 3), dict(strides=[2, 2], output_shape=[10, 12])),
    "output_shape_larger": ((1, 2, 4), (2, 1, 3), dict(strides=[2], output_shape=[10])),
    "output_shape_same_upper": ((1, 2, 5, 6), (2, 3, 3, 3), dict(strides=[2, 2], output_shape=[9, 11],
                                                               auto_pad="SAME_UPPER")),
    "same_upper": ((1, 2, 5, 6), (2, 3, 3, 3), dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    "same_lower_k4": ((1, 2, 5, 6), (2, 3, 4, 4), dict(strides=[2, 2], auto_pad="SAME_LOWER")),
    "same_short_kernel": ((1, 2, 4), (2, 1, 2), dict(strides=[3], auto_pad="SAME_UPPER")),
    "same_dilated": ((1, 2, 4), (2, 1, 3), dict(strides=[3], dilations=[2], auto_pad="SAME_UPPER")),
    "valid": ((1, 2, 4), (2, 1, 3), dict(strides=[2], auto_pad="VALID")),
    "1d_stride3": ((1, 2, 7), (2, 3, 3), dict(strides=[3])),
    "3d": ((1, 2, 3, 3, 4), (2, 2, 2, 2, 3), dict(strides=[2, 1, 2])),
    "ppocr_2x2_s2": ((1, 8, 10, 10), (8, 4, 2, 2), dict(kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0])),
}


def run_both(xs, ws, attrs, target, bias, dtype=np.float32, hip_graph=False):
    x = R.standard_normal(xs).astype(dtype)
    w = R.standard_normal(ws).astype(dtype)
    names, init = ["x", "w"], {"w": w}
    if bias:
        init["b"] = R.standard_normal(ws[1] * attrs.get("group", 1)).astype(dtype)
        names.append("b")
    m = make_model([helper.make_node("ConvTranspose", names, ["y"], **attrs)], {"x": x}, ["y"], init, opset=22)
    want = ort_run(m, {"x": x})[0]
    prog = mgx_graph.compile(m, target=target, hip_graph=hip_graph)
    assert "onnx_op" not in str(prog)
    for _ in range(3 if hip_graph else 1):
        got = prog.run({"x": x})[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    return got, want


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("name", list(CASES))
def test_conv_transpose(name, bias, target):
    got, want = run_both(*CASES[name], target, bias)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_conv_transpose_float16(target):
    got, want = run_both((1, 4, 5, 6), (4, 3, 3, 3), dict(strides=[2, 2]), target, True, np.float16)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


def test_conv_transpose_graph_mode(target):
    got, want = run_both((2, 4, 5, 6), (4, 2, 3, 3), dict(group=2, strides=[2, 2], pads=[1, 1, 1, 1]), target,
                         True, hip_graph=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs,err,text", [
    (dict(strides=[2], output_shape=[11]), ParseError, "output_shape [11] is inconsistent"),
    (dict(strides=[2], output_padding=[2]), ParseError, "output_padding [2] must be"),
    (dict(strides=[2], output_padding=[1], auto_pad="SAME_UPPER"), UnsupportedOpError, "output_padding"),
    (dict(strides=[2], output_shape=[1, 1, 8]), ParseError, "output_shape [1, 1, 8] has 3 values"),
    (dict(kernel_shape=[2]), ParseError, "kernel_shape [2] does not match"),
])
def test_conv_transpose_bad_attributes_raise_typed_errors(attrs, err, text):
    x = R.standard_normal((1, 1, 4)).astype(np.float32)
    m = make_model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="ct0", **attrs)], {"x": x}, ["y"],
                   {"w": np.ones((1, 1, 3), np.float32)}, opset=22)
    with pytest.raises(err) as e:
        mgx_graph.compile(m, target="ref")
    assert text in str(e.value) and "ct0" in str(e.value)
