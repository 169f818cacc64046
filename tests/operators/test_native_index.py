"""Native index and selection ops (CumSum, OneHot, Trilu, EyeLike, ReverseSequence, Compress,
NonMaxSuppression) against onnxruntime CPU, on each target, eager and in a graph."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from native_util import run_native
from util import make_model, ort_run

R = np.random.default_rng(11)


def _model(op, inputs, init=None, opset=18, outs=("y",), out_types=None, **attrs):
    names = [n if n else "" for n in list(inputs) + list(init or {})]
    node = helper.make_node(op, names, list(outs), **attrs)
    return make_model([node], inputs, list(outs), init, opset=opset, output_types=out_types)


# ---------------------------------------------------------------------------------------------------
# CumSum
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum(target, hip_graph, exclusive, reverse, axis):
    x = R.uniform(-2, 2, size=(3, 4, 5)).astype(np.float32)
    model = _model("CumSum", {"x": x}, {"a": np.array(axis, np.int64)}, opset=14, exclusive=exclusive,
                   reverse=reverse)
    run_native(model, {"x": x}, target, hip_graph, ["cumsum"], tol=(1e-5, 1e-5))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64, np.float16])
def test_cumsum_types(target, dtype):
    x = (R.uniform(-5, 5, size=(4, 300)) if dtype != np.float16 else R.uniform(0, 1, size=(4, 300))).astype(dtype)
    model = _model("CumSum", {"x": x}, {"a": np.array([1], np.int32)}, opset=14, reverse=1)
    run_native(model, {"x": x}, target, False, ["cumsum"], tol=(1e-3, 1e-3) if dtype == np.float16 else (1e-12, 1e-12))


def test_cumsum_runtime_axis_is_specialized(target):
    x = R.uniform(-1, 1, size=(3, 4)).astype(np.float32)
    model = _model("CumSum", {"x": x, "a": np.array(1, np.int64)}, opset=14)
    for a in (1, 0):
        feeds = {"x": x, "a": np.array(a, np.int64)}
        run_native(model, feeds, target, False, ["cumsum"])


# ---------------------------------------------------------------------------------------------------
# OneHot
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
@pytest.mark.parametrize("itype", [np.int64, np.int32])
def test_onehot(target, hip_graph, axis, itype):
    ind = np.array([[0, 3, -1, 7], [5, -4, -6, 2]], itype)  # in range, negative, out of range both ways
    # onnxruntime's kernels: int64 indices with a float depth, int32 indices with an int32 depth
    depth = np.array(5, np.float32 if itype == np.int64 else np.int32)
    init = {"d": depth, "v": np.array([-1.5, 2.0], np.float32)}
    model = _model("OneHot", {"i": ind}, init, opset=11, axis=axis)
    run_native(model, {"i": ind}, target, hip_graph, ["onehot"])


def test_onehot_runtime_values_and_int_output(target):
    ind = np.array([1, 0, 2, 9], np.int64)
    vals = np.array([3, 8], np.int64)
    feeds = {"i": ind, "d": np.array([3], np.int64), "v": vals}
    model = _model("OneHot", feeds, opset=11)
    run_native(model, feeds, target, False, ["onehot"])


# ---------------------------------------------------------------------------------------------------
# Trilu, EyeLike
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 1, -2, 7, -9])
@pytest.mark.parametrize("shape", [(4, 6), (2, 5, 3)])
def test_trilu(target, hip_graph, upper, k, shape):
    x = R.uniform(-2, 2, size=shape).astype(np.float32)
    init = {} if k is None else {"k": np.array(k, np.int64)}
    model = _model("Trilu", {"x": x}, init, opset=14, upper=upper)
    ones = np.ones(shape[-2:])
    kept = (np.triu if upper else np.tril)(ones, 0 if k is None else k)
    ops = [] if kept.all() else ["where"]  # nothing zeroed: no instruction
    run_native(model, {"x": x}, target, hip_graph, ops)


def test_trilu_int_and_bool(target):
    for x in (np.arange(12, dtype=np.int32).reshape(3, 4), np.ones((3, 3), bool)):
        model = _model("Trilu", {"x": x}, opset=14, upper=0)
        run_native(model, {"x": x}, target, False, ["where"])


@pytest.mark.parametrize("k", [0, 1, -1, 4])
@pytest.mark.parametrize("dtype", [None, TensorProto.FLOAT, TensorProto.INT32])
def test_eyelike(target, k, dtype):
    x = np.zeros((3, 5), np.float32)
    attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    model = _model("EyeLike", {"x": x}, opset=9, **attrs)
    run_native(model, {"x": x}, target, False, [])


# ---------------------------------------------------------------------------------------------------
# ReverseSequence
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
@pytest.mark.parametrize("rank", [2, 3, 4])
def test_reverse_sequence(target, hip_graph, batch_axis, time_axis, rank):
    T, B = 5, 4
    shape = [T, B] if time_axis == 0 else [B, T]
    shape += [3, 2][:rank - 2]
    x = R.uniform(-2, 2, size=shape).astype(np.float32)
    lens = np.array([5, 1, 0, 3], np.int64)
    model = _model("ReverseSequence", {"x": x, "l": lens}, opset=10, batch_axis=batch_axis, time_axis=time_axis)
    run_native(model, {"x": x, "l": lens}, target, hip_graph, ["reverse_sequence"])


def test_reverse_sequence_bad_length_raises_on_ref():
    x = np.zeros((3, 2), np.float32)
    model = _model("ReverseSequence", {"x": x, "l": np.array([4, 1], np.int64)}, opset=10)
    prog = mgx_graph.compile(model, target="ref", hip_graph=False)
    with pytest.raises(mgx_graph.ExecutionError, match=r"sequence length 4 is outside \[0, 3\]"):
        prog.run({"x": x, "l": np.array([4, 1], np.int64)})
    got = prog.run({"x": x + 1, "l": np.array([3, 1], np.int64)})  # still usable
    np.testing.assert_array_equal(got[0], x + 1)


# ---------------------------------------------------------------------------------------------------
# Compress: the count is computed on the device and guarded
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress_runtime_condition(target, hip_graph, axis):
    x = R.uniform(-2, 2, size=(4, 3, 5)).astype(np.float32)
    dim = x.size if axis is None else x.shape[axis]
    cond = R.uniform(size=dim) > 0.4
    attrs = {} if axis is None else {"axis": axis}
    model = _model("Compress", {"x": x, "c": cond}, opset=11, **attrs)
    prog = run_native(model, {"x": x, "c": cond}, target, hip_graph, ["compress", "guard"])
    cond2 = ~cond  # another count: the program re-specializes
    got = prog.run({"x": x, "c": cond2})
    np.testing.assert_array_equal(got[0], np.compress(cond2, x, axis=axis))


@pytest.mark.parametrize("clen", [2, 6])
def test_compress_condition_shorter_or_longer_than_the_axis(target, clen):
    x = R.uniform(-2, 2, size=(4, 3)).astype(np.float32)
    cond = np.array([True, False, True, True, False, True][:clen])
    model = _model("Compress", {"x": x, "c": cond}, opset=11, axis=0)
    run_native(model, {"x": x, "c": cond}, target, False, ["compress"])


def test_compress_literal_condition_and_empty_result(target):
    x = R.uniform(-2, 2, size=(3, 4)).astype(np.float32)
    model = _model("Compress", {"x": x}, {"c": np.array([False, True, False, True])}, opset=11, axis=1)
    run_native(model, {"x": x}, target, False, ["compress"])
    model = _model("Compress", {"x": x, "c": np.zeros(3, bool)}, opset=11, axis=0)
    run_native(model, {"x": x, "c": np.zeros(3, bool)}, target, False, ["compress"])


# ---------------------------------------------------------------------------------------------------
# NonMaxSuppression
# ---------------------------------------------------------------------------------------------------
def _boxes(B, N, center, rng):
    xy = rng.uniform(0, 10, size=(B, N, 2))
    wh = rng.uniform(0.5, 4, size=(B, N, 2))
    if center:
        return np.concatenate([xy, wh], -1).astype(np.float32)
    b = np.concatenate([xy[..., ::-1], (xy + wh)[..., ::-1]], -1)  # [y1, x1, y2, x2]
    flip = rng.uniform(size=(B, N)) < 0.3  # some boxes given by the other two corners
    b[flip] = b[flip][:, [2, 3, 0, 1]]
    return b.astype(np.float32)


NMS_CASES = [
    # B, C, N, center, max_out, iou, score
    (1, 1, 12, 0, 3, 0.5, None),
    (2, 3, 20, 0, 5, 0.3, 0.2),
    (1, 2, 30, 1, 100, 0.45, 0.0),
    (2, 2, 16, 1, 2, 0.0, None),
    (1, 4, 40, 0, 10, 1.0, 0.9),
    (3, 1, 1, 0, 4, 0.5, None),
]


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("B,C,N,center,max_out,iou,score", NMS_CASES)
def test_nms(target, hip_graph, B, C, N, center, max_out, iou, score):
    rng = np.random.default_rng(B * 100 + N)
    boxes = _boxes(B, N, center, rng)
    scores = rng.uniform(size=(B, C, N)).astype(np.float32)
    scores[..., ::5] = np.round(scores[..., ::5], 1)  # ties
    init = {"m": np.array([max_out], np.int64), "iou": np.array([iou], np.float32)}
    if score is not None:
        init["s"] = np.array([score], np.float32)
    model = _model("NonMaxSuppression", {"b": boxes, "sc": scores}, init, opset=11, center_point_box=center)
    prog = run_native(model, {"b": boxes, "sc": scores}, target, hip_graph, ["nms", "guard"])
    scores2 = np.roll(scores, 3, axis=-1)  # other data: other boxes, maybe another count
    want = ort_run(model, {"b": boxes, "sc": scores2})[0]
    np.testing.assert_array_equal(prog.run({"b": boxes, "sc": scores2})[0], want)


def test_nms_in_an_fp16_program_runs_in_float32(target):
    """fp16=True: boxes and scores become half parameters and NonMaxSuppression (float32 only) gets them
    converted back: the selection equals onnxruntime's on the half-rounded inputs."""
    import mgx_graph

    rng = np.random.default_rng(7)
    boxes = _boxes(2, 20, 0, rng)
    scores = rng.uniform(size=(2, 3, 20)).astype(np.float32)
    init = {"m": np.array([5], np.int64), "iou": np.array([0.3], np.float32), "s": np.array([0.2], np.float32)}
    model = _model("NonMaxSuppression", {"b": boxes, "sc": scores}, init, opset=11)
    prog = mgx_graph.compile(model, target=target, fp16=True)  # half parameters: half inputs are taken as given
    hb, hs = boxes.astype(np.float16), scores.astype(np.float16)
    want = ort_run(model, {"b": hb.astype(np.float32), "sc": hs.astype(np.float32)})[0]
    np.testing.assert_array_equal(prog.run({"b": hb, "sc": hs})[0], want)


def test_nms_runtime_thresholds_degenerate_boxes_and_no_max(target):
    boxes = np.array([[[0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 0, 5], [0.5, 0.5, 1.5, 1.5], [2, 2, 3, 3]]], np.float32)
    scores = np.array([[[0.9, 0.9, 0.8, 0.7, np.float32(0.6)]]], np.float32)
    feeds = {"b": boxes, "sc": scores, "m": np.array([10], np.int64), "iou": np.array([0.1], np.float32),
             "s": np.array([0.65], np.float32)}
    model = _model("NonMaxSuppression", feeds, opset=11)
    run_native(model, feeds, target, False, ["nms"])
    model = _model("NonMaxSuppression", {"b": boxes, "sc": scores}, opset=11)  # no max_output: nothing selected
    run_native(model, {"b": boxes, "sc": scores}, target, False, [])
