"""Native MaxPool (with Indices), AveragePool, LpPool and GlobalLpPool against onnxruntime (CPU) on every
target: many attribute combinations, the compiled program holds no ``onnx_op``.  NaN: AveragePool against
onnxruntime; MaxPool against a numpy oracle of its rule (NaN skipped, a window of NaNs only gives NaN:
docs/nan_semantics.md) and against onnxruntime where its code paths agree."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from mgx_graph.errors import ParseError, ShapeError, UnsupportedOpError
from util import make_model, ort_run

R = np.random.default_rng(7)


def run_both(node, x, target, opset=22, hip_graph=False, output_types=None):
    m = make_model([node], {"x": x}, list(node.output), opset=opset, output_types=output_types)
    want = ort_run(m, {"x": x})
    prog = mgx_graph.compile(m, target=target, hip_graph=hip_graph)
    assert "onnx_op" not in str(prog)
    got = None
    for _ in range(3 if hip_graph else 1):
        got = prog.run({"x": x})
    return got, want


def check(got, want, tol=1e-5):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


GEOMETRIES = {
    "k3": dict(kernel_shape=[3, 3]),
    "k3x2_s2_pads": dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 2, 1]),
    "k3_s2_ceil": dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    "k3_s2_pad_ceil": dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    "k2_dil": dict(kernel_shape=[2, 2], dilations=[2, 3]),
    "k3_dil_pad_ceil": dict(kernel_shape=[3, 3], dilations=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    "same_upper_s2": dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2]),
    "same_lower": dict(kernel_shape=[2, 2], auto_pad="SAME_LOWER"),
    "valid_s23_ceil": dict(kernel_shape=[3, 3], auto_pad="VALID", strides=[2, 3], ceil_mode=1),
    "k5_p2": dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2]),
}
X4 = R.standard_normal((2, 3, 9, 10)).astype(np.float32)


@pytest.mark.parametrize("geo", list(GEOMETRIES))
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "AveragePool_include_pad", "LpPool", "LpPool_p3"])
def test_pool_2d(op, geo, target):
    extra = {"AveragePool_include_pad": dict(count_include_pad=1), "LpPool_p3": dict(p=3)}.get(op, {})
    node = helper.make_node(op.split("_")[0], ["x"], ["y"], **GEOMETRIES[geo], **extra)
    check(*run_both(node, X4, target))


@pytest.mark.parametrize("geo", list(GEOMETRIES))
@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_indices(geo, storage_order, target):
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], storage_order=storage_order, **GEOMETRIES[geo])
    got, want = run_both(node, X4, target, output_types={"i": TensorProto.INT64})
    check(got, want)
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("shape,attrs", [
    ((2, 3, 11), dict(kernel_shape=[3], strides=[2], pads=[1, 2])),
    ((1, 2, 8), dict(kernel_shape=[2], strides=[2], pads=[0, 1], ceil_mode=1)),  # last window in the pad: dropped
    ((1, 2, 5, 6, 7), dict(kernel_shape=[2, 3, 2], strides=[1, 2, 2], pads=[0, 1, 1, 1, 0, 1])),
    ((1, 2, 6, 5, 7), dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1], ceil_mode=1)),
], ids=["1d", "1d_ceil_drop", "3d", "3d_ceil"])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "AveragePool_include_pad", "LpPool"])
def test_pool_1d_3d(op, shape, attrs, target):
    extra = {"AveragePool_include_pad": dict(count_include_pad=1)}.get(op, {})
    x = R.standard_normal(shape).astype(np.float32)
    check(*run_both(helper.make_node(op.split("_")[0], ["x"], ["y"], **attrs, **extra), x, target))


@pytest.mark.parametrize("dtype", ["float16", "float64", "int8", "uint8"])
def test_maxpool_types(dtype, target):
    x = (R.standard_normal((1, 2, 7, 6)) * 50).astype(dtype)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 2], strides=[2, 1], pads=[1, 1, 1, 0])
    got, want = run_both(node, x, target)
    np.testing.assert_array_equal(got[0], want[0])


def test_averagepool_float16(target):
    x = R.standard_normal((1, 2, 7, 6)).astype(np.float16)
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    check(*run_both(node, x, target), tol=2e-3)


def test_pool_graph_mode(target):
    """Graph mode (warmup, capture, replay on gpu) gives the same values."""
    for op in ("MaxPool", "AveragePool"):
        node = helper.make_node(op, ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
        check(*run_both(node, X4, target, hip_graph=True))


@pytest.mark.parametrize("p", [1, 2, 3])
def test_global_lppool(p, target):
    x = R.standard_normal((2, 3, 5, 4)).astype(np.float32)
    check(*run_both(helper.make_node("GlobalLpPool", ["x"], ["y"], p=p), x, target, opset=2), tol=1e-4)


def test_averagepool_nan_matches_onnxruntime(target):
    """A window holding a NaN averages to NaN: [1, nan, 3, 4] with k=2 gives [nan, nan, 3.5]."""
    x = np.array([[[1, np.nan, 3, 4]]], np.float32)
    got, want = run_both(helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2]), x, target)
    np.testing.assert_array_equal(np.isnan(got[0]), np.isnan(want[0]))
    np.testing.assert_allclose(got[0], want[0])
    assert np.isnan(got[0]).tolist() == [[[True, True, False]]]


def _fmax_pool_oracle(x, k, s, pad):
    """2-D max pooling by numpy: ``np.fmax`` over each window's input positions (the padding holds
    nothing), so NaN is skipped and a window of NaNs only gives NaN; windows by ceil_mode."""
    H, W = x.shape[2:]
    oh, ow = -(-(H + 2 * pad - k) // s) + 1, -(-(W + 2 * pad - k) // s) + 1
    y = np.empty(x.shape[:2] + (oh, ow), x.dtype)
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * s - pad, j * s - pad
            win = x[:, :, max(h0, 0):h0 + k, max(w0, 0):w0 + k].reshape(x.shape[:2] + (-1,))
            y[:, :, i, j] = np.fmax.reduce(win, axis=-1)
    return y


@pytest.mark.parametrize("indices", [False, True])
def test_maxpool_skips_nan(target, indices):
    x = R.standard_normal((1, 2, 8, 9)).astype(np.float32)
    x[0, 0, 2, 3] = x[0, 1, 7, 8] = x[0, 1, 0, 0] = np.nan
    x[0, 0, 5:8, 5:9] = np.nan  # windows of NaNs only
    x[0, 1, 3, :4] = np.inf
    outs = ["y", "i"] if indices else ["y"]
    node = helper.make_node("MaxPool", ["x"], outs, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                            ceil_mode=1)
    m = make_model([node], {"x": x}, outs, opset=22)
    got = mgx_graph.compile(m, target=target).run({"x": x})
    want = _fmax_pool_oracle(x, 3, 2, 1)
    assert got[0].shape == want.shape and np.isnan(want).any()
    np.testing.assert_array_equal(got[0], want)  # NaN positions too
    if indices:  # every index points at an element holding the output value (at a NaN for NaN)
        np.testing.assert_array_equal(x.reshape(-1)[got[1]], got[0])


def test_global_max_pool_nan_then_inf_matches_onnxruntime(target):
    """The case of issue 28: GlobalMaxPool of [nan, inf, ...] is inf, as onnxruntime gives."""
    x = np.array([[[np.nan, np.inf, 1, 2]], [[3, np.nan, -1, 2]]], np.float32).reshape(1, 2, 4)
    m = make_model([helper.make_node("GlobalMaxPool", ["x"], ["y"])], {"x": x}, ["y"], opset=13)
    got = mgx_graph.compile(m, target=target).run({"x": x})[0]
    np.testing.assert_array_equal(got, ort_run(m, {"x": x})[0])
    np.testing.assert_array_equal(got.reshape(-1), [np.inf, 3])


@pytest.mark.parametrize("attrs,err,text", [
    (dict(kernel_shape=[2, 2], pads=[2, 0, 0, 0]), ParseError, "smaller than kernel_shape"),
    (dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", dilations=[2, 1]), UnsupportedOpError, "dilations"),
    (dict(kernel_shape=[3, 3], auto_pad="BOGUS"), ParseError, "'auto_pad' = 'BOGUS'"),
    (dict(kernel_shape=[3]), ParseError, "kernel_shape [3] has 1 values, expected 2"),
    (dict(kernel_shape=[12, 3]), ShapeError, "empty output"),
])
def test_pool_bad_attributes_raise_typed_errors(attrs, err, text):
    x = R.standard_normal((1, 1, 9, 10)).astype(np.float32)
    m = make_model([helper.make_node("MaxPool", ["x"], ["y"], name="pool0", **attrs)], {"x": x}, ["y"], opset=22)
    with pytest.raises(err) as e:
        mgx_graph.compile(m, target="ref")
    assert text in str(e.value) and "pool0" in str(e.value)


def test_averagepool_integer_input_is_refused():
    x = R.integers(0, 9, (1, 1, 4, 4)).astype(np.int8)
    m = make_model([helper.make_node("AveragePool", ["x"], ["y"], name="ap", kernel_shape=[2, 2])], {"x": x}, ["y"],
                   output_types={"y": TensorProto.INT8})
    with pytest.raises(ParseError, match=r"'ap' \(AveragePool\).*tensor\(int8\)"):  # invalid: onnxruntime refuses it
        mgx_graph.compile(m, target="ref")
