"""GatherND and ScatterND on their native kernels (``gathernd.cu``, ``scatternd.cu`` on the gpu target)
against onnxruntime CPU, on each target, eager and in a graph: batch_dims, negative indices, index
tuples of 1 to 3 values, element sizes of 1, 2, 4 and 8 bytes, strided inputs (a Transpose in front: on
the gpu they are copied into a workspace first, still captured).  The scalars ``gathernd.cu`` is given
are checked on the host by a numpy replay of its index arithmetic."""
import numpy as np
import pytest
from onnx import helper

from mgx_graph.operators.index_gpu import gathernd_geometry
from native_util import run_native
from util import make_model, ort_run

R = np.random.default_rng(23)

GATHER_CASES = {  # data, indices, batch_dims
    "q2": (R.standard_normal((3, 4, 2)).astype(np.float32), np.array([[0, 1], [2, 3], [-1, -4]], np.int64), 0),
    "q1_negative": (R.standard_normal((5, 3)).astype(np.float32), np.array([[-1], [0], [3], [-5]], np.int64), 0),
    "q3_scalar_rows": (R.standard_normal((2, 3, 4)).astype(np.float32), np.array([[1, 2, 3], [0, -1, 0]], np.int64), 0),
    "batch1": (R.standard_normal((2, 3, 4)).astype(np.float32), np.array([[[1], [0]], [[2], [2]]], np.int64), 1),
    "batch2": (R.standard_normal((2, 3, 4, 5)).astype(np.float32), R.integers(-4, 4, size=(2, 3, 1, 1)), 2),
    "bool_mask_rows": (R.uniform(size=(2, 16)) < 0.5,
                       np.stack(np.meshgrid(np.arange(2), np.arange(16), indexing="ij"), -1).reshape(2, 1, 1, 16, 2), 0),
    "float16": (R.standard_normal((4, 6)).astype(np.float16), np.array([[3], [1], [-2]], np.int64), 0),
    "int64": (R.integers(-100, 100, size=(4, 3, 2)), np.array([[[1, 2]], [[3, 0]]], np.int64), 0),
}


def _gather_model(data, idx, batch_dims, transpose=False, idx_input=False):
    nodes, src = [], "x"
    if transpose:  # the GatherND reads a strided view
        nodes.append(helper.make_node("Transpose", ["x"], ["xt"], perm=list(range(data.ndim))[::-1]))
        src = "xt"
    nodes.append(helper.make_node("GatherND", [src, "i"], ["y"], batch_dims=batch_dims))
    x = data.transpose() if transpose else data
    inputs = {"x": x, "i": idx} if idx_input else {"x": x}
    return make_model(nodes, inputs, ["y"], None if idx_input else {"i": idx}, opset=13), inputs


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("case", list(GATHER_CASES))
def test_gathernd(target, hip_graph, case):
    data, idx, b = GATHER_CASES[case]
    model, feeds = _gather_model(data, idx, b)
    run_native(model, feeds, target, hip_graph, ["gathernd"])


@pytest.mark.parametrize("case", ["q2", "batch1", "bool_mask_rows"])
def test_gathernd_strided_data_and_run_time_indices(target, case):
    data, idx, b = GATHER_CASES[case]
    model, feeds = _gather_model(data, idx, b, transpose=True, idx_input=True)
    run_native(model, feeds, target, True, ["gathernd"])


@pytest.mark.parametrize("case", list(GATHER_CASES))
def test_gathernd_kernel_geometry(case):
    """The index arithmetic of ``gathernd.cu`` replayed by numpy on the scalars the kernel is given."""
    data, idx, b = GATHER_CASES[case]
    n, slice_, rows, bstride, q, *rest = gathernd_geometry(data.shape, idx.shape, b)
    dims, strides = np.array(rest[:q]), np.array(rest[4:4 + q])
    e = np.arange(n)
    row = e // slice_
    v = idx.reshape(-1, q)[row].astype(np.int64)
    v = np.clip(np.where(v < 0, v + dims, v), 0, dims - 1)
    off = (row // rows) * bstride + (e - row * slice_) + (v * strides).sum(axis=1)
    want = ort_run(_gather_model(data, idx, b)[0], {"x": data})[0]
    assert n == want.size
    np.testing.assert_array_equal(data.reshape(-1)[off].reshape(want.shape), want)


def _scatter_model(data, idx, upd, strided_upd=False, strided_idx=False):
    nodes, names = [], ["x", "i", "u"]
    if strided_upd:
        nodes.append(helper.make_node("Transpose", ["u"], ["ut"], perm=list(range(upd.ndim))[::-1]))
        names[2] = "ut"
        upd = upd.transpose()
    if strided_idx:
        nodes.append(helper.make_node("Transpose", ["i"], ["it"], perm=list(range(idx.ndim))[::-1]))
        names[1] = "it"
        idx = idx.transpose()
    nodes.append(helper.make_node("ScatterND", names, ["y"]))
    feeds = {"x": data, "i": idx, "u": upd}
    return make_model(nodes, feeds, ["y"], opset=13), feeds


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("strided_upd,strided_idx", [(True, False), (False, True), (True, True)],
                         ids=["strided_updates", "strided_indices", "both"])
def test_scatternd_strided_inputs(target, hip_graph, strided_upd, strided_idx):
    """A cache-style update of rows of [6, 2, 4, 3] (six distinct rows, two of them negative), its updates
    and / or indices given as transposed views."""
    data = R.standard_normal((6, 2, 4, 3)).astype(np.float32)
    idx = np.array([[[0], [5]], [[2], [-3]], [[1], [-2]]], np.int64)
    upd = R.standard_normal((3, 2, 2, 4, 3)).astype(np.float32)
    model, feeds = _scatter_model(data, idx, upd, strided_upd, strided_idx)
    run_native(model, feeds, target, hip_graph, ["scatternd"])


GATHER_ELEMENTS_CASES = {  # data, indices, axis
    "axis0": (R.standard_normal((4, 3)).astype(np.float32), R.integers(-4, 4, size=(2, 3)), 0),
    "axis1_smaller": (R.standard_normal((3, 5)).astype(np.float32), R.integers(-5, 5, size=(2, 4)), 1),
    "axis_neg_3d": (R.standard_normal((2, 3, 4)).astype(np.float32), R.integers(0, 4, size=(2, 3, 6)), -1),
    "float16_int32": (R.standard_normal((3, 4, 2)).astype(np.float16),
                      R.integers(-3, 3, size=(3, 2, 2)).astype(np.int32), 0),
    "int64_data": (R.integers(-9, 9, size=(5, 2)), R.integers(0, 2, size=(5, 7)), 1),
}


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("transpose", [False, True], ids=["standard", "strided"])
@pytest.mark.parametrize("case", list(GATHER_ELEMENTS_CASES))
def test_gather_elements(target, hip_graph, transpose, case):
    """GatherElements (run-time indices, negative ones included; data read through a Transpose's
    strides) against onnxruntime; on the gpu one captured kernel."""
    data, idx, axis = GATHER_ELEMENTS_CASES[case]
    nodes, src, x = [], "x", data
    if transpose:
        x = np.ascontiguousarray(data.transpose())
        nodes.append(helper.make_node("Transpose", ["x"], ["xt"], perm=list(range(data.ndim))[::-1]))
        src = "xt"
    nodes.append(helper.make_node("GatherElements", [src, "i"], ["y"], axis=axis))
    feeds = {"x": x, "i": idx}
    run_native(make_model(nodes, feeds, ["y"], opset=13), feeds, target, hip_graph, ["gather_elements"],
               tol=(0, 0))
