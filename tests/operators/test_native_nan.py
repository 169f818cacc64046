"""NaN and Inf in the selection ops follow onnxruntime CPU: TopK, ArgMax / ArgMin, Hardmax, Clip and
GlobalMaxPool, on each target, eager and in a graph.  GlobalMaxPool of a channel of -inf gives the
type's lowest value, as onnxruntime's pooling (it starts from numeric_limits::lowest()).

TopK is checked against a numpy oracle of the order onnxruntime's CPU kernel has from 1.32 on (NaN above
+inf, ties by the lower index; numpy's sort and PyTorch agree), and against onnxruntime itself from that
version: up to 1.31 its comparisons (``a > b``, ``a == b``) are false for NaN, so where a line holds NaN its
answer depends on which selection it runs for k (a scan for k = 1, a heap for small k, nth_element
otherwise) and follows no order.

Where onnxruntime's own answer depends on how its SIMD lanes meet the NaNs (Hardmax of long lines and
the max pooling of a line mixing NaNs and numbers), the rule implemented (docs/nan_semantics.md) is
checked against numpy instead: Hardmax marks the first maximum of the non-NaN values and gives zeros for a
line starting with NaN (onnxruntime's scalar rule, checked against it on short lines); GlobalMaxPool
skips NaN (np.fmax), NaN for a channel of NaNs only.  Max / Min / Relu propagate NaN, as onnxruntime."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from native_util import check_outputs, run_native
from util import make_model, ort_run, ort_version

R = np.random.default_rng(13)
NAN, INF = np.nan, np.inf


def _nan_rows(rows, n, p_nan=0.2, dtype=np.float32):
    x = R.standard_normal((rows, n)).astype(dtype)
    x[R.uniform(size=x.shape) < p_nan] = NAN
    x[R.uniform(size=x.shape) < 0.05] = INF
    x[R.uniform(size=x.shape) < 0.05] = -INF
    x[:, : n // 2] = np.round(x[:, : n // 2])  # ties
    x[::4, 0] = NAN  # lines starting with NaN
    x[1::5] = NAN  # lines of NaNs only
    x[2::7, :] = -INF
    return x


SMALL = np.array([[1, NAN, 3, 2], [NAN, NAN, 1, 0], [INF, NAN, -INF, 5], [1, 3, 3, NAN], [-INF, NAN, -INF, -INF],
                  [NAN, NAN, NAN, NAN], [2, 2, INF, INF]], np.float32)


def _node_model(op, x, init=None, opset=13, outs=("y",), **attrs):
    names = ["x"] + list(init or {})
    return make_model([helper.make_node(op, names, list(outs), **attrs)], {"x": x}, list(outs), init, opset=opset)


# ---------------------------------------------------------------------------------------------------
# ArgMax / ArgMin: a line starting with NaN gives 0; otherwise NaNs are skipped
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("axis,keepdims", [(1, 1), (1, 0), (0, 0), (-1, 1)])
def test_argmax_argmin_nan(target, hip_graph, op, last, axis, keepdims):
    x = np.concatenate([SMALL, _nan_rows(9, 4)])
    model = _node_model(op, x, axis=axis, keepdims=keepdims, select_last_index=last)
    run_native(model, {"x": x}, target, hip_graph, [op.lower()])


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("n", [3, 257, 1000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_argmax_argmin_long_lines(target, op, n, dtype):
    x = _nan_rows(12, n, dtype=dtype)
    for last in (0, 1):
        model = _node_model(op, x, axis=1, keepdims=0, select_last_index=last)
        run_native(model, {"x": x}, target, False, [op.lower()])


def test_argmax_middle_axis_and_ints(target):
    x = _nan_rows(24, 10).reshape(2, 12, 10)
    run_native(_node_model("ArgMax", x, axis=1, keepdims=1), {"x": x}, target, False, ["argmax"])
    xi = R.integers(-3, 3, size=(4, 9, 5)).astype(np.int32)
    for op in ("ArgMax", "ArgMin"):
        for last in (0, 1):
            model = _node_model(op, xi, axis=1, keepdims=0, select_last_index=last)
            run_native(model, {"x": xi}, target, False, [op.lower()])


# ---------------------------------------------------------------------------------------------------
# TopK: NaN ranks above +inf; ties keep the lower index first
# ---------------------------------------------------------------------------------------------------
ORT_TOPK_ORDERS_NAN = ort_version() >= (1, 32)


def _topk_oracle(x, k: int, axis: int, largest: int) -> list:
    """[values, int64 indices] of TopK by numpy: one lexicographic sort per line on (NaN first when
    ``largest`` / last otherwise, the value descending / ascending, the index ascending)."""
    xs = np.moveaxis(x, axis, -1)
    nan = np.isnan(xs)
    val = np.where(nan, 0, xs)
    pos = np.broadcast_to(np.arange(xs.shape[-1]), xs.shape)
    keys = (pos, -val, ~nan) if largest else (pos, val, nan)  # np.lexsort: the last key is the primary one
    idx = np.lexsort(keys, axis=-1)[..., :k]
    return [np.moveaxis(np.take_along_axis(xs, idx, -1), -1, axis), np.moveaxis(idx, -1, axis).astype(np.int64)]


def _run_topk(x, k, axis, largest, target, hip_graph):
    model = _node_model("TopK", x, {"k": np.array([k], np.int64)}, opset=11, outs=("v", "i"), axis=axis,
                        largest=largest)
    want = _topk_oracle(x, k, axis, largest)
    if ORT_TOPK_ORDERS_NAN:
        check_outputs(ort_run(model, {"x": x}), want, what="onnxruntime against the numpy oracle")
    run_native(model, {"x": x}, target, hip_graph, ["topk"], expect=want)


def test_topk_oracle_orders_nan_above_inf():
    v, i = _topk_oracle(np.array([[1, NAN, INF, -INF, NAN, 1]], np.float32), 6, 1, 1)
    np.testing.assert_array_equal(i, [[1, 4, 2, 0, 5, 3]])
    np.testing.assert_array_equal(_topk_oracle(np.array([[1, NAN, INF, -INF, NAN, 1]]), 6, 1, 0)[1],
                                  [[3, 0, 5, 2, 1, 4]])


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_topk_nan_inf_rows(target, hip_graph, largest, k):
    _run_topk(SMALL, k, 1, largest, target, hip_graph)


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("n,k", [(17, 5), (300, 150), (64, 64)])
def test_topk_long_lines(target, largest, n, k):
    _run_topk(_nan_rows(10, n), k, -1, largest, target, False)


def test_topk_axis0_float64_and_unsorted(target):
    x = _nan_rows(20, 4, dtype=np.float64)
    _run_topk(x, 6, 0, 1, target, False)
    # sorted=0: the order is unspecified; the set of indices per line must be the oracle's
    model = _node_model("TopK", x, {"k": np.array([6], np.int64)}, opset=11, outs=("v", "i"), axis=0, sorted=0)
    got = mgx_graph.compile(model, target=target, hip_graph=False).run({"x": x})[1]
    want = _topk_oracle(x, 6, 0, 1)[1]
    np.testing.assert_array_equal(np.sort(got, axis=0), np.sort(want, axis=0))
    if ORT_TOPK_ORDERS_NAN:
        np.testing.assert_array_equal(np.sort(ort_run(model, {"x": x})[1], axis=0), np.sort(want, axis=0))


# ---------------------------------------------------------------------------------------------------
# Hardmax
# ---------------------------------------------------------------------------------------------------
def _hardmax_oracle(x, axis):
    xs = np.moveaxis(x, axis, -1)
    out = np.zeros_like(xs)
    clean = np.where(np.isnan(xs), -INF, xs)
    top = clean.max(axis=-1, keepdims=True)
    hit = (xs == top) & ~np.isnan(xs[..., :1])  # a line starting with NaN: no maximum, all zeros
    first = hit.argmax(axis=-1)
    rows = np.nonzero(hit.any(axis=-1))
    out[rows + (first[rows],)] = 1
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [1, 0, -1])
def test_hardmax_without_nan_matches_onnxruntime(target, hip_graph, opset, axis):
    x = np.nan_to_num(_nan_rows(12, 6), nan=7.0, posinf=INF, neginf=-INF).reshape(3, 4, 6)  # ties, +-inf, no NaN
    model = _node_model("Hardmax", x, opset=opset, axis=axis)
    run_native(model, {"x": x}, target, hip_graph, ["hardmax"])


def test_hardmax_all_nan_lines_match_onnxruntime(target):
    x = np.full((3, 5), NAN, np.float32)
    x[1] = [1, 2, 2, -INF, 0]
    run_native(_node_model("Hardmax", x, axis=1), {"x": x}, target, False, ["hardmax"])


@pytest.mark.parametrize("opset,axis", [(13, 1), (13, 0), (11, 1), (11, 0)])
@pytest.mark.parametrize("n", [4, 300])
def test_hardmax_nan_first_non_nan_maximum(target, opset, axis, n):
    x = _nan_rows(16, n)
    model = _node_model("Hardmax", x, opset=opset, axis=axis)
    if opset < 13 and axis == 0:  # opset 11 coerces to 2-D at axis: one line of all elements
        want = _hardmax_oracle(x.reshape(1, -1), 1).reshape(x.shape)
    else:
        want = _hardmax_oracle(x, axis)
    run_native(model, {"x": x}, target, False, ["hardmax"], expect=[want])


@pytest.mark.parametrize("n", [2, 3])
def test_hardmax_nan_short_lines_match_onnxruntime(target, n):
    """Lines shorter than a SIMD vector: onnxruntime's maximum is a scalar scan from the first element."""
    x = _nan_rows(64, n)
    run_native(_node_model("Hardmax", x, axis=1), {"x": x}, target, False, ["hardmax"])


def test_hardmax_oracle_line_starting_with_nan():
    got = _hardmax_oracle(np.array([[NAN, 1, 2], [1, NAN, 2], [-INF, NAN, -INF], [NAN, NAN, NAN]], np.float32), 1)
    np.testing.assert_array_equal(got, [[0, 0, 0], [0, 0, 1], [1, 0, 0], [0, 0, 0]])


# ---------------------------------------------------------------------------------------------------
# Max / Min / Relu: NaN propagates
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["Max", "Min", "Relu"])
def test_elementwise_nan_matches_onnxruntime(target, op):
    a = np.array([NAN, 1, NAN, -INF, INF, 0, -0.0, 2], np.float32)
    b = np.array([1, NAN, NAN, 2, NAN, -0.0, 0, -3], np.float32)
    feeds = {"a": a, "b": b} if op != "Relu" else {"a": a}
    model = make_model([helper.make_node(op, list(feeds), ["y"])], feeds, ["y"], opset=13)
    want = ort_run(model, feeds)
    ref = {"Max": np.maximum, "Min": np.minimum}.get(op)
    check_outputs(want, [ref(a, b)] if ref else [np.maximum(a, np.float32(0))], what="onnxruntime against numpy")
    check_outputs(mgx_graph.compile(model, target=target).run(feeds), want)


# ---------------------------------------------------------------------------------------------------
# ReduceMax / ReduceMin: NaN propagates (np.max); onnxruntime agrees on lines of NaNs only and without NaN
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_nan(target, op):
    x = _nan_rows(20, 7)
    model = make_model([helper.make_node(op, ["x", "a"], ["y"], keepdims=0)], {"x": x}, ["y"],
                       {"a": np.array([1], np.int64)}, opset=18)
    want = (np.max if op == "ReduceMax" else np.min)(x, axis=1)
    got = mgx_graph.compile(model, target=target).run({"x": x})[0]
    check_outputs([got], [want])
    clean = np.where(np.isnan(x), np.float32(0), x)
    clean[1::5] = NAN  # lines of NaNs only
    check_outputs(mgx_graph.compile(model, target=target).run({"x": clean}), ort_run(model, {"x": clean}))


# ---------------------------------------------------------------------------------------------------
# Clip
# ---------------------------------------------------------------------------------------------------
CLIP_X = np.array([[1, NAN, 3, 2], [NAN, -0.0, 1, 0], [INF, NAN, -INF, 5], [-3, 3.5, 2.5, -1]], np.float32)


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("lo,hi", [(None, None), (1.5, None), (None, 2.5), (-1.0, 2.5), (NAN, 2.5), (0.5, NAN),
                                   (3.0, 1.0), (-INF, INF)])
def test_clip_bounds(target, hip_graph, lo, hi):
    init, names = {}, ["x"]
    if lo is not None:
        init["lo"] = np.array(lo, np.float32)
    if hi is not None:
        init["hi"] = np.array(hi, np.float32)
    names += ["lo" if lo is not None else ""] + (["hi"] if hi is not None else [])
    node = helper.make_node("Clip", names, ["y"])
    model = make_model([node], {"x": CLIP_X}, ["y"], init, opset=13)
    run_native(model, {"x": CLIP_X}, target, hip_graph, ["clip"])


def test_clip_runtime_bounds_and_float16(target):
    feeds = {"x": CLIP_X, "lo": np.array(-1.0, np.float32), "hi": np.array(NAN, np.float32)}
    model = make_model([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], feeds, ["y"], opset=13)
    run_native(model, feeds, target, False, ["clip"])
    x16 = np.array([[np.inf, -np.inf, np.nan, 7e4 - 6e4, 1.0]], np.float16)
    model = make_model([helper.make_node("Clip", ["x"], ["y"])], {"x": x16}, ["y"], opset=13,
                       output_types={"y": TensorProto.FLOAT16})
    run_native(model, {"x": x16}, target, False, ["clip"])


@pytest.mark.parametrize("attrs", [{}, {"min": -0.5}, {"max": 0.5}, {"min": -0.5, "max": 0.5}])
def test_clip_opset6_attributes(target, attrs):
    model = make_model([helper.make_node("Clip", ["x"], ["y"], **attrs)], {"x": CLIP_X}, ["y"], opset=6)
    run_native(model, {"x": CLIP_X}, target, False, ["clip"])


def test_clip_integers(target):
    x = np.array([-5, 0, 3, 9, 2**31 - 1], np.int32)
    for init in ({}, {"lo": np.array(-1, np.int32)}, {"lo": np.array(-1, np.int32), "hi": np.array(4, np.int32)}):
        model = make_model([helper.make_node("Clip", ["x"] + list(init), ["y"])], {"x": x}, ["y"], init, opset=13)
        run_native(model, {"x": x}, target, False, ["clip"] if init else [])


# ---------------------------------------------------------------------------------------------------
# GlobalMaxPool: NaN skipped
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_global_max_pool_skips_nan(target, hip_graph):
    x = R.standard_normal((2, 5, 4, 6)).astype(np.float32)
    x[0, 1, 2, 3] = NAN
    x[1, 3, 0, 0] = NAN
    x[1, 4] = NAN
    x[0, 2, 1, 1] = INF
    x[1, 0] = -INF
    model = make_model([helper.make_node("GlobalMaxPool", ["x"], ["y"])], {"x": x}, ["y"], opset=13)
    want = np.maximum(np.fmax.reduce(x.reshape(2, 5, 1, -1), axis=-1, keepdims=True),
                      np.finfo(np.float32).min)  # -inf -> lowest; NaN for a channel of NaNs only
    assert np.isnan(want[1, 4]) and not np.isnan(want[0, 1]) and want[0, 2] == INF
    prog = run_native(model, {"x": x}, target, hip_graph, ["pooling"], expect=[want])
    clean = np.where(np.isnan(x), np.float32(0), x)  # onnxruntime agrees wherever a channel has no NaN
    clean[1, 4] = NAN  # and on a channel of NaNs only
    check_outputs(prog.run({"x": clean}), ort_run(model, {"x": clean}))
