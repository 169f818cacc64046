"""Native Resize / Upsample against onnxruntime (CPU) on every target: each mode, coordinate transform and
nearest rounding, scales or sizes, axes, keep_aspect_ratio_policy, antialias, exclude_outside and
extrapolation; the compiled program holds no ``onnx_op``."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from mgx_graph.errors import ParseError, UnsupportedOpError
from util import make_model, ort_run

R = np.random.default_rng(11)
X = R.standard_normal((2, 3, 5, 7)).astype(np.float32)
COORDS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
          "tf_half_pixel_for_nn", "tf_crop_and_resize"]
ROI4 = np.array([0, 0, 0.1, 0.2, 1, 1, 0.8, 0.9], np.float32)
SIZES = {  # name -> (scales, sizes, axes, keep_aspect_ratio_policy)
    "up": (np.array([1, 1, 2.0, 1.5], np.float32), None, None, None),
    "down": (np.array([1, 1, 0.6, 0.45], np.float32), None, None, None),
    "odd": (np.array([1, 1, 1.7, 0.77], np.float32), None, None, None),
    "sizes": (None, np.array([2, 3, 8, 4], np.int64), None, None),
    "sizes_not_larger": (None, np.array([2, 3, 8, 4], np.int64), None, "not_larger"),
    "axes_sizes": (None, np.array([10, 3], np.int64), [3, 2], None),
    "axes_scales": (np.array([0.5, 2.5], np.float32), None, [2, 3], None),
    "axes_not_smaller": (None, np.array([8, 4], np.int64), [2, 3], "not_smaller"),
}
LINEAR_SIZES = [k for k in SIZES if k != "sizes_not_larger"]  # onnxruntime: linear only on NCHW / NHWC axes


def resize_model(x, attrs, scales=None, sizes=None, roi=None, opset=19):
    inits, names = {}, ["x"]
    for nm, v in (("roi", roi), ("scales", scales), ("sizes", sizes)):
        names.append(nm if v is not None else "")
        if v is not None:
            inits[nm] = v
    while names[-1] == "":
        names.pop()
    return make_model([helper.make_node("Resize", names, ["y"], **attrs)], {"x": x}, ["y"], inits, opset=opset)


def reference_run(m, feeds):
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(m).run(None, feeds)


def check(m, x, target, tol=1e-5, hip_graph=False, oracle=ort_run):
    want = oracle(m, {"x": x})[0]
    prog = mgx_graph.compile(m, target=target, hip_graph=hip_graph)
    assert "onnx_op" not in str(prog)
    for _ in range(3 if hip_graph else 1):
        got = prog.run({"x": x})[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def case_model(mode, coord, how, **attrs):
    scales, sizes, axes, policy = SIZES[how]
    attrs = dict(mode=mode, coordinate_transformation_mode=coord, extrapolation_value=-3.5, **attrs)
    if axes is not None:
        attrs["axes"] = axes
    if policy is not None:
        attrs["keep_aspect_ratio_policy"] = policy
    roi = None
    if coord == "tf_crop_and_resize":
        roi = ROI4 if axes is None else np.array([0.2, 0.1, 0.9, 0.8], np.float32)
    return resize_model(X, attrs, scales, sizes, roi)


def oracle_of(coord, how):
    """align_corners with scales whose ``scale * length`` is fractional: the ONNX reference (whose data the
    conformance suite holds) divides by that fractional length, onnxruntime by the integer one; mgx_graph
    follows the reference there and onnxruntime everywhere else."""
    return reference_run if coord == "align_corners" and SIZES[how][0] is not None else ort_run


@pytest.mark.parametrize("how", list(SIZES))
@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("coord", COORDS)
def test_resize_nearest(coord, nearest_mode, how, target):
    check(case_model("nearest", coord, how, nearest_mode=nearest_mode), X, target, oracle=oracle_of(coord, how))


@pytest.mark.parametrize("how", LINEAR_SIZES)
@pytest.mark.parametrize("antialias", [0, 1])
@pytest.mark.parametrize("coord", COORDS)
def test_resize_linear(coord, antialias, how, target):
    oracle = ort_run if antialias else oracle_of(coord, how)
    check(case_model("linear", coord, how, antialias=antialias), X, target, oracle=oracle)


def test_resize_align_corners_fractional_width_follows_the_reference(target):
    """The conformance case: [1, 2, 3, 4] scaled by 0.6 with align_corners divides by 0.6 * 4 - 1 = 1.4."""
    x = np.array([[[[1, 2, 3, 4], [5, 6, 7, 8]]]], np.float32)
    m = resize_model(x, dict(mode="linear", coordinate_transformation_mode="align_corners"),
                     np.array([1, 1, 0.6, 0.6], np.float32))
    got = mgx_graph.compile(m, target=target).run({"x": x})[0]
    np.testing.assert_allclose(got, reference_run(m, {"x": x})[0], rtol=1e-6)
    np.testing.assert_allclose(got.ravel(), [1.0, 1.0 + 3.0 / 1.4], rtol=1e-6)


@pytest.mark.parametrize("exclude_outside", [0, 1])
@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("how", ["up", "axes_scales_up"])
def test_resize_cubic(coord, exclude_outside, how, target):
    # onnxruntime runs cubic (without antialias) only for NCHW upsampling
    attrs = dict(mode="cubic", coordinate_transformation_mode=coord, exclude_outside=exclude_outside,
                 cubic_coeff_a=-0.5, extrapolation_value=2.0)
    roi = ROI4 if coord == "tf_crop_and_resize" else None
    oracle = ort_run
    if how == "up":
        m = resize_model(X, attrs, np.array([1, 1, 2.0, 1.5], np.float32), roi=roi)
        oracle = reference_run if coord == "align_corners" else ort_run
    else:
        attrs["axes"] = [2, 3]
        m = resize_model(X, attrs, sizes=np.array([9, 11], np.int64),
                         roi=None if roi is None else np.array([0.1, 0.2, 0.8, 0.9], np.float32))
    check(m, X, target, tol=1e-4, oracle=oracle)


@pytest.mark.parametrize("exclude_outside", [0, 1])
@pytest.mark.parametrize("scales", [[1, 1, 0.5, 0.4], [1, 1, 1.5, 0.7]], ids=["down", "mixed"])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias(mode, scales, exclude_outside, target):
    attrs = dict(mode=mode, antialias=1, exclude_outside=exclude_outside)
    x = R.standard_normal((1, 2, 12, 15)).astype(np.float32)
    check(resize_model(x, attrs, np.array(scales, np.float32)), x, target, tol=1e-4)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int32", "float16"])
def test_resize_nearest_types(dtype, target):
    x = (R.standard_normal((1, 2, 4, 5)) * 60).astype(dtype)
    m = resize_model(x, dict(mode="nearest"), np.array([1, 1, 1.5, 2.0], np.float32), opset=13)
    check(m, x, target, tol=0)


def test_resize_nearest_float64(target):
    """onnxruntime has no float64 Resize: nearest copies values, so its float32 result is the oracle."""
    x = R.standard_normal((1, 2, 4, 5))
    attrs = dict(mode="nearest", coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_ceil")
    scales = np.array([1, 1, 1.5, 0.6], np.float32)
    want = ort_run(resize_model(x.astype(np.float32), attrs, scales), {"x": x.astype(np.float32)})[0]
    got = mgx_graph.compile(resize_model(x, attrs, scales), target=target).run({"x": x})[0]
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got.astype(np.float32), want)


def test_resize_linear_float16(target):
    x = R.standard_normal((1, 2, 4, 5)).astype(np.float16)
    check(resize_model(x, dict(mode="linear"), np.array([1, 1, 1.5, 2.0], np.float32)), x, target, tol=3e-3)


@pytest.mark.parametrize("opset", [11, 13])
def test_resize_opset11_empty_roi_scales(opset, target):
    """PP-OCR / YOLO style: an empty roi, scales [1, 1, 2, 2], asymmetric + floor."""
    attrs = dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    m = resize_model(X, attrs, np.array([1, 1, 2, 2], np.float32), roi=np.array([], np.float32), opset=opset)
    check(m, X, target)
    m = resize_model(X, dict(mode="linear"), np.array([], np.float32), np.array([2, 3, 9, 4], np.int64),
                     roi=np.array([], np.float32), opset=opset)
    check(m, X, target)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize10_and_upsample(mode, target):
    scales = np.array([1, 1, 2.0, 1.5], np.float32)
    m = make_model([helper.make_node("Resize", ["x", "s"], ["y"], mode=mode)], {"x": X}, ["y"], {"s": scales},
                   opset=10)
    check(m, X, target)
    m = make_model([helper.make_node("Upsample", ["x", "s"], ["y"], mode=mode)], {"x": X}, ["y"], {"s": scales},
                   opset=9)
    check(m, X, target)


def test_resize_down_nearest_opset10_rounds_up(target):
    """Resize-10 nearest downsampling takes ceil of the asymmetric coordinate (onnxruntime's rule)."""
    m = make_model([helper.make_node("Resize", ["x", "s"], ["y"], mode="nearest")], {"x": X}, ["y"],
                   {"s": np.array([1, 1, 0.6, 0.45], np.float32)}, opset=10)
    check(m, X, target)


def test_resize_graph_mode(target):
    check(case_model("linear", "half_pixel", "up"), X, target, hip_graph=True)
    check(case_model("nearest", "tf_crop_and_resize", "sizes"), X, target, hip_graph=True)


def test_resize_identity_returns_input(target):
    prog = mgx_graph.compile(resize_model(X, dict(mode="linear"), np.ones(4, np.float32)), target=target)
    assert "resize" not in str(prog)
    np.testing.assert_array_equal(prog.run({"x": X})[0], X)


@pytest.mark.parametrize("attrs,scales,sizes,err,text", [
    (dict(mode="nearest", antialias=1), [1, 1, 2, 2], None, UnsupportedOpError, "antialias"),
    (dict(mode="linear", exclude_outside=1), [1, 1, 2, 2], None, UnsupportedOpError, "exclude_outside"),
    (dict(mode="area"), [1, 1, 2, 2], None, ParseError, "'mode' = 'area' is not one of 'nearest', 'linear', 'cubic'"),
    (dict(mode="nearest", coordinate_transformation_mode="bogus"), [1, 1, 2, 2], None, ParseError,
     "'coordinate_transformation_mode' = 'bogus' is not one of"),
    (dict(mode="nearest"), [1, 1, 2, 2], [2, 3, 4, 4], ParseError, "exactly one of"),
    (dict(mode="nearest"), [1, 1, 2], None, ParseError, "has 3 values, expected 4"),
    (dict(mode="nearest"), [1, 1, -2, 2], None, ParseError, "must be > 0"),
])
def test_resize_bad_inputs_raise_typed_errors(attrs, scales, sizes, err, text):
    m = resize_model(X, attrs, np.array(scales, np.float32), None if sizes is None else np.array(sizes, np.int64))
    m.graph.node[0].name = "rs0"
    with pytest.raises(err) as e:
        mgx_graph.compile(m, target="ref")
    assert text in str(e.value) and "rs0" in str(e.value)


def test_resize_linear_on_integers_is_unsupported():
    x = R.integers(0, 9, (1, 1, 4, 4)).astype(np.uint8)
    m = resize_model(x, dict(mode="linear"), np.array([1, 1, 2, 2], np.float32))
    m.graph.output[0].type.tensor_type.elem_type = TensorProto.UINT8
    with pytest.raises(UnsupportedOpError, match="uint8"):
        mgx_graph.compile(m, target="ref")
