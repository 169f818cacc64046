"""TopK on each target, eager and in a graph, against numpy / Python oracles and onnxruntime (CPU, from 1.32,
whose order is the same: NaN above +inf, ties by the lower index): element types float16 / float32 /
float64 / int32 / int64 / uint8, every axis of a 3-D tensor, k from 1 to the line, -0.0 tied with 0.0 (the
value returned bit for bit), sorted=0, a strided (transposed) input, a line of length 1 and lines longer
than the gpu kernel's shared memory holds (its global-workspace slots).  On the gpu target the kernel must
be ``topk.cu`` and capturable."""
import numpy as np
import pytest
from onnx import helper

import mgx_graph
from native_util import check_outputs, kernels, run_native
from test_native_nan import ORT_TOPK_ORDERS_NAN, _nan_rows, _topk_oracle
from util import make_model, ort_run

R = np.random.default_rng(29)


def topk_oracle(x, k: int, axis: int, largest: int) -> list:
    """[values, int64 indices] of TopK: floats by the lexsort oracle of test_native_nan; integers by
    Python's sort of each line on (the value as a Python int, negated for ``largest``; the index), which
    cannot overflow at the type's minimum."""
    if x.dtype.kind == "f":
        return _topk_oracle(x, k, axis, largest)
    xs = np.moveaxis(x, axis, -1)
    flat = xs.reshape(-1, xs.shape[-1])
    idx = np.array([sorted(range(flat.shape[1]), key=lambda i: (-int(r[i]) if largest else int(r[i]), i))[:k]
                    for r in flat], np.int64).reshape(xs.shape[:-1] + (k,))
    return [np.moveaxis(np.take_along_axis(xs, idx, -1), -1, axis), np.moveaxis(idx, -1, axis)]


def _model(x, k, axis, largest, sorted_=1, transpose=None):
    nodes, src = [], "x"
    if transpose is not None:
        nodes.append(helper.make_node("Transpose", ["x"], ["xt"], perm=list(transpose)))
        src = "xt"
    nodes.append(helper.make_node("TopK", [src, "k"], ["v", "i"], axis=axis, largest=largest, sorted=sorted_))
    return make_model(nodes, {"x": x}, ["v", "i"], {"k": np.array([k], np.int64)}, opset=11)


def _check_topk(x, k, axis, largest, target, hip_graph=False, transpose=None):
    model = _model(x, k, axis, largest, transpose=transpose)
    want = topk_oracle(x if transpose is None else np.transpose(x, transpose), k, axis, largest)
    if ORT_TOPK_ORDERS_NAN or not (x.dtype.kind == "f" and np.isnan(x).any()):
        check_outputs(ort_run(model, {"x": x}), want, tol=(0, 0), what="onnxruntime against the oracle")
    prog = run_native(model, {"x": x}, target, hip_graph, ["topk"], tol=(0, 0), expect=want)
    got = prog.run({"x": x})[0]
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want[0]))  # -0.0 returned as -0.0
    if target == "gpu":
        labels = [kern.label for name, kern in kernels(prog) if name == "topk"]
        assert labels and all(lab.startswith("topk.cu") for lab in labels), labels
    return prog


def _data(dtype, shape):
    if np.dtype(dtype).kind == "f":
        x = _nan_rows(int(np.prod(shape[:-1])), shape[-1], dtype=dtype).reshape(shape)
        x.reshape(-1)[:: 7] = -0.0
        x.reshape(-1)[3:: 11] = 0.0
        return x
    info = np.iinfo(dtype)
    x = R.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)
    x.reshape(-1)[::3] = R.integers(0, 3, size=x.reshape(-1)[::3].shape)  # ties
    x.reshape(-1)[1::13] = info.min
    x.reshape(-1)[2::17] = info.max
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("largest", [1, 0])
def test_topk_dtypes_axes(target, dtype, axis, largest):
    x = _data(dtype, (4, 6, 9))
    n = x.shape[axis]
    for k in sorted({1, (n + 1) // 2, n}):
        _check_topk(x, k, axis, largest, target)


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("largest", [1, 0])
def test_topk_signed_zero_ties(target, hip_graph, largest):
    x = np.array([[0.0, -0.0, 1.0, -0.0, 0.0, -1.0], [-0.0, -0.0, 0.0, np.nan, -np.inf, 0.0]], np.float32)
    prog = _check_topk(x, 6, 1, largest, target, hip_graph)
    idx = prog.run({"x": x})[1]
    zeros = [[0, 1, 3, 4], [0, 1, 2, 5]]  # positions of +-0.0 in each row: ranked by index alone
    for row, z in zip(idx, zeros):
        assert [int(i) for i in row if i in z] == z, idx


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_topk_transposed_input(target, hip_graph):
    x = _data(np.float32, (5, 7, 3))
    for axis, largest in ((1, 1), (2, 0)):
        _check_topk(x, 3, axis, largest, target, hip_graph, transpose=(2, 0, 1))


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("n,k", [(4100, 7), (5000, 5000)])
def test_topk_lines_past_shared_memory(target, hip_graph, n, k):
    x = _data(np.float32, (3, n))
    prog = _check_topk(x, k, 1, 1, target, hip_graph)
    if target == "gpu":
        assert any(kern.label == "topk.cu bitonic (global workspace)" for _, kern in kernels(prog))


def test_topk_line_of_one_and_full_k(target):
    _check_topk(_data(np.float64, (6, 1)), 1, 1, 1, target)
    _check_topk(_data(np.int64, (1, 300)), 300, 1, 0, target)


def test_topk_unsorted_selects_the_oracle_set(target):
    x = _data(np.float32, (3, 40))
    model = _model(x, 12, 1, 1, sorted_=0)
    v, i = mgx_graph.compile(model, target=target, hip_graph=False).run({"x": x})
    want = topk_oracle(x, 12, 1, 1)
    np.testing.assert_array_equal(np.sort(i, axis=1), np.sort(want[1], axis=1))
    np.testing.assert_array_equal(v.view(np.uint32), np.take_along_axis(x, i, 1).view(np.uint32))
    if ORT_TOPK_ORDERS_NAN:
        np.testing.assert_array_equal(np.sort(ort_run(model, {"x": x})[1], axis=1), np.sort(want[1], axis=1))


def test_gpu_lowering_plans_topk_cu():
    """The gpu lowering (no device needed) picks topk.cu, capturable: a standard copy of a transposed input
    first (two launches), slots in shared memory up to 4096 elements, else two [lines, p] workspaces; an
    element type without a key (bool) keeps the generic kernel."""
    from mgx_graph import Program, Shape
    from mgx_graph.operators.base import make_op
    from mgx_graph.passes import Lowering

    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", Shape("float16", [5, 7, 3]))
    xt = m.add_instruction(make_op("transpose", permutation=[2, 0, 1]), [x])
    views = m.add_instruction(make_op("topk", k=3, axis=1), [xt])
    y = m.add_parameter("y", Shape("int64", [2, 4097]))
    long = m.add_instruction(make_op("topk", k=3, axis=1, largest=0), [y])
    flags = m.add_instruction(make_op("topk", k=1, axis=0), [m.add_parameter("b", Shape("bool", [4]))])
    m.add_return([views, long, flags])
    Lowering("gpu").apply(prog, None)
    k = views.meta["kernel"]
    assert (k.label, k.launches, k.capturable) == ("topk.cu bitonic (shared memory)", 2, True)
    assert [(s.dtype, tuple(s.lens), s.standard()) for s in k.workspace] == [("float16", (3, 5, 7), True)]
    k = long.meta["kernel"]
    assert (k.label, k.launches, k.capturable) == ("topk.cu bitonic (global workspace)", 1, True)
    assert [(s.dtype, tuple(s.lens)) for s in k.workspace] == [("uint64", (2, 8192)), ("uint32", (2, 8192))]
    assert not flags.meta["kernel"].label.startswith("topk.cu")
