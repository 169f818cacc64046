"""Parameters given as torch tensors, DLPack and CUDA Array Interface objects (mgx_graph.exec.interop), on
every target: values against onnxruntime fed numpy, "no copy" shown by pointers and by an output bound
in place that writes the caller's memory, one copy with ``copy=True``, typed errors naming the
parameter, and staging of an output fed back through another array type."""
import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph.exec.interop import to_target
from test_graph_launch import counter_model
from test_output_lifetime import X6, roll_model
from util import make_model, ort_run

torch = pytest.importorskip("torch")
R = np.random.default_rng(5)


def two_input_model():
    """y = tanh(table[ids] * x + 1): a float32 and an int64 input."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["g"], axis=0), helper.make_node("Mul", ["g", "x"], ["m"]),
             helper.make_node("Add", ["m", "one"], ["a"]), helper.make_node("Tanh", ["a"], ["y"])]
    return make_model(nodes, {"x": np.zeros((2, 3), np.float32), "ids": np.zeros((2,), np.int64)}, ["y"],
                      {"table": R.normal(size=(5, 3)).astype(np.float32), "one": np.ones((1,), np.float32)})


class DLPackOnly:
    """An array seen only through DLPack (``__dlpack__`` / ``__dlpack_device__``), as JAX arrays are."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class CudaArrayOnly:
    """Device memory seen only through ``__cuda_array_interface__`` (Numba style)."""

    def __init__(self, a):
        self._a = a

    @property
    def __cuda_array_interface__(self):
        return self._a.__cuda_array_interface__


class FakeDevice:
    """Claims DLPack memory on ``(device type, id)``; exporting it would fail the test."""

    def __init__(self, dev):
        self.dev = dev
        self.shape, self.dtype = (2, 3), np.dtype(np.float32)

    def __dlpack__(self, **kw):
        raise AssertionError("exported memory the program cannot use")

    def __dlpack_device__(self):
        return self.dev


def _feeds():
    return {"x": R.normal(size=(2, 3)).astype(np.float32), "ids": np.array([4, 1], np.int64)}


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_torch_cpu_tensors_in_run_match_onnxruntime(target, hip_graph):
    model = two_input_model()
    prog = mgx_graph.compile(model, target=target, hip_graph=hip_graph, min_partition_size=1)
    for _ in range(4):  # graphs: warmup, warmup, capture, replay
        feeds = _feeds()
        got = prog.run({n: torch.from_numpy(a.copy()) for n, a in feeds.items()})
        assert isinstance(got[0], np.ndarray)
        np.testing.assert_allclose(got[0], ort_run(model, feeds)[0], rtol=1e-6, atol=1e-6)
    if hip_graph:
        assert prog.stats()["replays"] >= 1


def test_run_async_takes_torch_cpu_tensors_on_ref_and_copies_them_on_request(target):
    model = two_input_model()
    prog = mgx_graph.compile(model, target=target)
    feeds = _feeds()
    tensors = {n: torch.from_numpy(a.copy()) for n, a in feeds.items()}
    want = ort_run(model, feeds)[0]
    if target == "ref":  # host memory is the ref target's memory: bound as it is
        outs = prog.run_async(tensors)
    else:
        with pytest.raises(mgx_graph.ParameterError, match=r"parameter '(x|ids)': expected a gpu device array .* "
                                                           r"in host memory \(run_async\(\.\.\., copy=True\)"):
            prog.run_async(tensors)
        outs = prog.run_async(tensors, copy=True)
    assert isinstance(outs[0], prog.context.xp.ndarray)
    np.testing.assert_allclose(prog.context.to_host(outs[0], prog.queue), want, rtol=1e-6, atol=1e-6)


def test_dlpack_input_is_bound_without_a_copy(target):
    """A DLPack-only view of the program's kind of array: the converted array has the caller's pointer, and
    an output bound in place (alias) writes the caller's memory, run after run."""
    prog = mgx_graph.compile(counter_model(), target=target, hip_graph=True, alias={"state_out": "state_in"},
                             min_partition_size=1)
    ctx = prog.context
    state = ctx.xp.zeros((2, 3), np.float32)
    wrapped = DLPackOnly(state)
    arr, on_device = to_target(ctx, wrapped, "state_in", prog.queue)
    assert on_device and ctx.data_ptr(arr) == ctx.data_ptr(state)
    for n in range(1, 6):
        outs = prog.run_async({"state_in": wrapped})
        np.testing.assert_array_equal(ctx.to_host(state, prog.queue), np.full((2, 3), n, np.float32))
        np.testing.assert_allclose(ctx.to_host(outs[0], prog.queue), np.full((2, 3), -(np.tanh(n) * 2 + 1)),
                                   rtol=1e-6)
    assert prog.stats()["replays"] >= 1  # the caller's pointer is the graph key: replays write it too


def test_torch_tensor_on_ref_is_a_zero_copy_view():
    prog = mgx_graph.compile(counter_model(), target="ref", alias={"state_out": "state_in"})
    t = torch.zeros(2, 3)
    arr, on_device = to_target(prog.context, t, "state_in")
    assert on_device and arr.__array_interface__["data"][0] == t.data_ptr()
    for _ in range(3):
        prog.run_async({"state_in": t})
    assert torch.equal(t, torch.full((2, 3), 3.0))  # written in place by the program
    out = prog.run({"state_in": t})  # run copies: the caller's tensor is never written
    assert torch.equal(t, torch.full((2, 3), 3.0))
    np.testing.assert_array_equal(out[1], np.full((2, 3), 4.0, np.float32))


@pytest.mark.gpu
def test_cuda_array_interface_input_is_bound_without_a_copy(gpu_target):
    prog = mgx_graph.compile(counter_model(), target=gpu_target, alias={"state_out": "state_in"})
    ctx = prog.context
    state = ctx.xp.zeros((2, 3), np.float32)
    arr, on_device = to_target(ctx, CudaArrayOnly(state), "state_in", prog.queue)
    assert on_device and arr.data.ptr == state.data.ptr
    prog.run_async({"state_in": CudaArrayOnly(state)})
    prog.run_async({"state_in": CudaArrayOnly(state)})
    np.testing.assert_array_equal(ctx.to_host(state, prog.queue), np.full((2, 3), 2, np.float32))


def test_non_contiguous_input_needs_copy_true(target):
    model = two_input_model()
    prog = mgx_graph.compile(model, target=target)
    feeds = _feeds()
    wide = prog.context.xp.asarray(np.repeat(feeds["x"], 2, axis=1))
    view = DLPackOnly(wide[:, ::2])
    ids = prog.context.xp.asarray(feeds["ids"])
    with pytest.raises(mgx_graph.ParameterError, match=r"parameter 'x': device array must be C-contiguous"):
        prog.run_async({"x": view, "ids": ids})
    outs = prog.run_async({"x": view, "ids": ids}, copy=True)
    np.testing.assert_allclose(prog.context.to_host(outs[0], prog.queue), ort_run(model, feeds)[0], rtol=1e-6,
                               atol=1e-6)
    strided = torch.from_numpy(np.repeat(feeds["x"], 2, axis=1))[:, ::2]
    np.testing.assert_allclose(prog.run({"x": strided, "ids": torch.from_numpy(feeds["ids"])})[0],
                               ort_run(model, feeds)[0], rtol=1e-6, atol=1e-6)


def test_bad_inputs_are_typed_errors_naming_the_parameter(target):
    model = two_input_model()
    prog = mgx_graph.compile(model, target=target)
    feeds = _feeds()
    ids = torch.from_numpy(feeds["ids"])
    bad = [
        ({"x": torch.from_numpy(feeds["x"]).double(), "ids": ids},
         r"parameter 'x': expected dtype float32, got float64"),
        ({"x": torch.zeros(3, 2), "ids": ids}, r"parameter 'x': expected shape \[2, 3\], got \[3, 2\]"),
        ({"x": torch.zeros(2, 3, requires_grad=True), "ids": ids}, r"parameter 'x': cannot read the torch\.Tensor"),
        ({"x": torch.zeros(2, 3, dtype=torch.bfloat16), "ids": ids}, r"parameter 'x': cannot read the torch\.Tensor"),
        ({"x": feeds["x"], "ids": FakeDevice((2, 7))}, r"parameter 'ids': the .*FakeDevice given is (in cuda device "
                                                        r"7 memory|on device 7; the program runs on device 0)"),
        ({"x": feeds["x"], "ids": FakeDevice((12, 0))}, r"parameter 'ids': .*FakeDevice given is in DLPack device "
                                                         r"type 12"),
    ]
    for params, msg in bad:
        for run in (prog.run, lambda p: prog.run_async(p, copy=True)):
            with pytest.raises(mgx_graph.ParameterError, match=msg):
                run(params)
    np.testing.assert_allclose(prog.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-6, atol=1e-6)  # still usable


def test_read_only_memory_for_a_parameter_written_in_place_is_refused():
    prog = mgx_graph.compile(counter_model(), target="ref", alias={"state_out": "state_in"})
    frozen = np.zeros((2, 3), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(mgx_graph.ParameterError, match=r"parameter 'state_in' is written in place .* read-only"):
        prog.run_async({"state_in": frozen})
    out = prog.run({"state_in": frozen})  # run copies it into the program's own buffer
    np.testing.assert_array_equal(out[1], np.ones((2, 3), np.float32))
    assert not frozen.any()


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_an_output_fed_back_through_dlpack_is_staged(target, hip_graph):
    """roll(X, -2) fed its own output through another array type: the converted array still lies in the
    program's arena, so it is staged and every call gives onnxruntime's values."""
    model = roll_model()
    prog = mgx_graph.compile(model, target=target, hip_graph=hip_graph, min_partition_size=1)
    want = X6
    out = prog.run_async({"X": prog.context.xp.asarray(X6)})[0]
    for _ in range(5):
        want = ort_run(model, {"X": want})[0]
        np.testing.assert_allclose(prog.context.to_host(out, prog.queue), want)
        out = prog.run_async({"X": DLPackOnly(out)})[0]
