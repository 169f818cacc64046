"""Native DynamicQuantizeLinear, ConvInteger and MatMulInteger against onnxruntime (CPU), exactly, on every
target (per-channel zero points, which onnxruntime's CPU kernels refuse, against numpy); no ``onnx_op``."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from util import make_model, ort_run

R = np.random.default_rng(5)


def compiled(m, target):
    prog = mgx_graph.compile(m, target=target)
    assert "onnx_op" not in str(prog)
    return prog


DQL_INPUTS = {
    "normal": R.standard_normal((3, 5)).astype(np.float32) * 4,
    "zeros": np.zeros((2, 3), np.float32),
    "positive_constant": np.full((2, 3), 2.0, np.float32),
    "negative": -np.abs(R.standard_normal((4, 4))).astype(np.float32),
    "nan": np.array([[1, np.nan, 3], [4, 5, 6]], np.float32),
    "inf": np.array([[0.5, 1.5, 2.5], [-1.5, 1.0, np.inf]], np.float32),
    "halves": np.array([[-2.5, -0.5, 0.5], [1.5, 2.5, 255.0 * 0.5]], np.float32),
}


@pytest.mark.parametrize("name", list(DQL_INPUTS))
def test_dynamic_quantize_linear(name, target):
    x = DQL_INPUTS[name]
    m = make_model([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], {"x": x}, ["y", "s", "z"],
                   opset=11)
    want = ort_run(m, {"x": x})
    got = compiled(m, target).run({"x": x})
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def _ints(dt, shape):
    lo, hi = (0, 256) if dt == np.uint8 else (-128, 128)
    return R.integers(lo, hi, shape).astype(dt)


TYPES = [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.uint8), (np.int8, np.int8)]


@pytest.mark.parametrize("attrs", [dict(group=2, pads=[1, 0, 2, 1], strides=[2, 1]), dict(group=2, auto_pad="SAME_UPPER"),
                                   dict(dilations=[2, 1]), dict()], ids=["pads_strides", "same_upper", "dil", "plain"])
@pytest.mark.parametrize("xt,wt", TYPES, ids=lambda t: np.dtype(t).name)
def test_conv_integer(xt, wt, attrs, target):
    group = attrs.get("group", 1)
    x, w = _ints(xt, (2, 4, 7, 6)), _ints(wt, (6, 4 // group, 3, 3))
    init = {"w": w, "xz": _ints(xt, ()), "wz": _ints(wt, ())}
    m = make_model([helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], **attrs)], {"x": x}, ["y"], init,
                   opset=10, output_types={"y": TensorProto.INT32})
    got, want = compiled(m, target).run({"x": x})[0], ort_run(m, {"x": x})[0]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_conv_integer_per_channel_weight_zero_point(target):
    """A per-output-channel w_zero_point (onnxruntime's CPU kernel refuses it): against numpy."""
    x, w, wz = _ints(np.uint8, (1, 2, 5, 5)), _ints(np.int8, (3, 2, 2, 2)), _ints(np.int8, (3,))
    m = make_model([helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"])], {"x": x}, ["y"],
                   {"w": w, "xz": np.array(7, np.uint8), "wz": wz}, opset=10, output_types={"y": TensorProto.INT32})
    got = compiled(m, target).run({"x": x})[0]
    xs = x.astype(np.int64) - 7
    ws = w.astype(np.int64) - wz.astype(np.int64)[:, None, None, None]
    want = np.zeros((1, 3, 4, 4), np.int64)
    for i in range(4):
        for j in range(4):
            want[0, :, i, j] = np.tensordot(ws, xs[0, :, i:i + 2, j:j + 2], axes=([1, 2, 3], [0, 1, 2]))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shapes", [((2, 3, 5), (5, 4)), ((5,), (5, 4)), ((3, 5), (5,)), ((2, 1, 3, 5), (2, 5, 4))],
                         ids=["batched", "a1d", "b1d", "broadcast"])
@pytest.mark.parametrize("at,bt", TYPES, ids=lambda t: np.dtype(t).name)
def test_matmul_integer(at, bt, shapes, target):
    a, b = _ints(at, shapes[0]), _ints(bt, shapes[1])
    init = {"b": b, "az": _ints(at, ()), "bz": _ints(bt, (shapes[1][-1],)) if len(shapes[1]) == 2 else _ints(bt, ())}
    m = make_model([helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])], {"a": a}, ["y"], init,
                   opset=10, output_types={"y": TensorProto.INT32})
    got, want = compiled(m, target).run({"a": a})[0], ort_run(m, {"a": a})[0]
    assert got.dtype == np.int32 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("feed_b", [False, True], ids=["b_literal", "b_fed"])
def test_the_oracle_is_exact_for_uint8_times_int8(feed_b):
    """The onnxruntime oracle (``util.ort_run``) against numpy's int64 product, at the extremes where
    onnxruntime's int16 pair sums saturate on CPUs without VNNI (255 * -128 twice is -65280)."""
    a = np.concatenate([np.full((2, 16), 255, np.uint8), R.integers(0, 256, (4, 16)).astype(np.uint8)])
    b = np.concatenate([np.full((16, 2), -128, np.int8), R.integers(-128, 128, (16, 3)).astype(np.int8)], axis=1)
    feeds, init = ({"a": a, "b": b}, {}) if feed_b else ({"a": a}, {"b": b})
    m = make_model([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], feeds, ["y"], init, opset=10,
                   output_types={"y": TensorProto.INT32})
    np.testing.assert_array_equal(ort_run(m, feeds)[0], a.astype(np.int64) @ b.astype(np.int64))


def test_matmul_integer_per_row_a_zero_point(target):
    a, b, az = _ints(np.uint8, (3, 5)), _ints(np.uint8, (5, 2)), _ints(np.uint8, (3,))
    m = make_model([helper.make_node("MatMulInteger", ["a", "b", "az"], ["y"])], {"a": a}, ["y"], {"b": b, "az": az},
                   opset=10, output_types={"y": TensorProto.INT32})
    got = compiled(m, target).run({"a": a})[0]
    want = (a.astype(np.int64) - az.astype(np.int64)[:, None]) @ b.astype(np.int64)
    np.testing.assert_array_equal(got, want)
