"""Captures record on the context's private non-blocking queue and replay on the program's queue.

The program's queue is blocking (ordered with the legacy default stream); a capture recorded on it
would make any legacy-stream use elsewhere in the process fail and spoil the capture (CUDA programming
guide, "Stream capture").  So each region records on the context's capture queue for the call's queue
(:mod:`mgx_graph.graph.capture_queues`, created ``hipStreamNonBlocking``) and launches the exec on the
call's queue.  Every case checks the values against numpy on calls with new inputs (a launch that
escaped the capture would run once, at capture time, and leave later replays wrong)."""
import sys
import threading

import numpy as np
import pytest
from onnx import helper

from mgx_graph.errors import DeviceError
from mgx_graph.runtime import hipStreamNonBlocking
from test_host_fast_path import ALIAS, R, _compile, _host, f, step_model
from util import make_model


def _steps(prog, n, queue=None):
    """``n`` calls of the step model with new inputs, each checked against numpy."""
    ctx, q = prog.context, prog.queue if queue is None else queue
    xp = ctx.xp
    x, state = xp.zeros((2, 3), np.float32), xp.zeros((2, 3), np.float32)
    want = np.zeros((2, 3), np.float32)
    for k in range(n):
        xh = R.normal(size=(2, 3)).astype(np.float32)
        ctx.copy_from_host(x, xh, q)
        y, _ = prog.run_async({"x": x, "state_in": state}, **({} if queue is None else {"queue": queue}))
        want = want + xh
        ctx.synchronize(q)
        np.testing.assert_allclose(np.asarray(ctx.to_host(y, q)), f(want), rtol=1e-5, atol=1e-6, err_msg=f"call {k}")


def _begun_on(rt, monkeypatch):
    """The queues ``hipStreamBeginCapture`` is called on, in order."""
    seen, begin = [], rt.hipStreamBeginCapture

    def spy(s, mode):
        seen.append(int(s))
        return begin(s, mode)

    monkeypatch.setattr(rt, "hipStreamBeginCapture", spy)
    return seen


def test_capture_records_on_a_private_nonblocking_queue_and_replays_on_the_programs(monkeypatch):
    prog = _compile(step_model(), "ref", alias=ALIAS)
    rt = prog.context.runtime
    seen = _begun_on(rt, monkeypatch)
    _steps(prog, 6)
    st = prog.stats()
    assert st["captures"] == 1 and st["replays"] >= 3 and st["fallbacks"] == 0, st
    assert len(seen) == 1 and seen[0] != prog.queue
    assert seen[0] == prog.context.capture_queue(prog.queue)  # one per queue, kept
    assert rt.hipStreamGetFlags(seen[0]) == hipStreamNonBlocking
    assert rt.hipStreamGetFlags(prog.queue) == 0
    prog.release()


def test_each_queue_gets_its_own_capture_queue_and_release_destroys_them(monkeypatch):
    from mgx_graph.runtime import host_runtime

    rt = host_runtime()
    base = rt.counters()["live_queues"]
    prog = _compile(step_model(), "ref", alias=ALIAS)
    # the program's queue and its capture queue, made at compile time: a first capture allocates nothing
    assert rt.counters()["live_queues"] == base + 2 and len(prog.context._capture_queues.queues()) == 1
    seen = _begun_on(rt, monkeypatch)
    other = rt.hipStreamCreate()
    _steps(prog, 5)
    _steps(prog, 5, queue=other)
    assert len(seen) == 2 and len(set(seen)) == 2 and not {prog.queue, other} & set(seen)
    assert set(seen) == prog.context._capture_queues.queues()
    assert rt.counters()["live_queues"] == base + 4  # the caller's queue and its capture queue too
    prog.release()
    assert rt.counters()["live_queues"] == base + 1  # the program's queue and both capture queues gone
    assert all(not rt.queue_alive(q) for q in seen)
    rt.hipStreamDestroy(other)


def _refusing_nonblocking(rt, monkeypatch):
    create = rt.hipStreamCreate

    def refuse_nonblocking(flags=0):
        if flags == hipStreamNonBlocking:
            raise DeviceError("hipStreamCreate", "hipErrorOutOfMemory")
        return create(flags)

    monkeypatch.setattr(rt, "hipStreamCreate", refuse_nonblocking)


def test_no_capture_queue_means_the_capture_records_on_the_queue_itself(monkeypatch, capfd):
    """No capture queue can be made, at compile time or at the capture: the program compiles, the capture
    records on the queue itself (traced) and the replays are right."""
    monkeypatch.setenv("MIGRAPHX_HIP_GRAPH_DEBUG", "1")
    from mgx_graph.runtime import host_runtime

    rt = host_runtime()
    base = rt.counters()["live_queues"]
    _refusing_nonblocking(rt, monkeypatch)
    prog = _compile(step_model(), "ref", alias=ALIAS)
    seen = _begun_on(rt, monkeypatch)
    _steps(prog, 6)
    st = prog.stats()
    assert st["captures"] == 1 and st["fallbacks"] == 0 and seen == [prog.queue], (st, seen)
    assert "capturing on the queue itself" in capfd.readouterr().err
    prog.release()
    assert rt.counters()["live_queues"] == base


def test_a_capture_queue_whose_preparation_fails_otherwise_records_on_the_queue_itself(monkeypatch, capfd):
    """Making the capture queue's BLAS handle can fail with the binding's own error, not a DeviceError:
    neither the compile nor a call may fail (a call did, on every call after the warmups); the capture
    records on the queue itself, the replays are right and the failed queue is destroyed."""
    monkeypatch.setenv("MIGRAPHX_HIP_GRAPH_DEBUG", "1")
    from mgx_graph.runtime import host_runtime
    from mgx_graph.graph import capture_queues

    rt = host_runtime()
    live = rt.counters()["live_queues"]
    init = capture_queues.CaptureQueues.__init__

    def fail(q):
        raise RuntimeError("CUBLAS_STATUS_ALLOC_FAILED")

    monkeypatch.setattr(capture_queues.CaptureQueues, "__init__", lambda self, runtime, prepare=None: init(self, runtime, fail))
    prog = _compile(step_model(), "ref", alias=ALIAS)
    seen = _begun_on(rt, monkeypatch)
    _steps(prog, 6)
    st = prog.stats()
    assert st["captures"] == 1 and st["fallbacks"] == 0 and st["replays"] >= 3 and seen == [prog.queue], (st, seen)
    assert "capturing on the queue itself" in capfd.readouterr().err
    assert prog.context._capture_queues.queues() == set()
    prog.release()
    assert rt.counters()["live_queues"] == live


def test_blas_gives_its_workspace_back_when_no_handle_can_be_made():
    from mgx_graph.runtime import host_runtime
    from mgx_graph.runtime.blas import Blas

    rt = host_runtime()
    q = rt.hipStreamCreate()
    before = rt.counters()
    with pytest.raises(DeviceError, match="no BLAS for platform host"):
        Blas(rt, q, workspace_bytes=1 << 20)  # the workspace is allocated before the handle
    assert rt.counters() == before
    rt.hipStreamDestroy(q)


def _fake_blas_bindings(monkeypatch, platform, made, destroyed):
    """Stand-in vendor bindings whose handle is made but whose stream cannot be set."""
    import types

    if platform == "cuda":
        def set_stream(handle, stream):
            raise RuntimeError("CUBLAS_STATUS_INVALID_VALUE")

        lib = types.SimpleNamespace(create=lambda: made.append(object()) or made[-1], set_stream=set_stream,
                                    destroy=destroyed.append)
        names, attrs = ("nvmath", "nvmath.bindings"), {"cublas": lib}
    else:
        lib = types.SimpleNamespace(hipblasCreate=lambda: (0, made.append(object()) or made[-1]),
                                    hipblasSetStream=lambda handle, stream: (7,), hipblasDestroy=destroyed.append)
        names, attrs = ("rocm", "rocm.bindings"), {"hipblas": lib, "hip": types.SimpleNamespace(hipStream_t=int)}
    top, sub = types.ModuleType(names[0]), types.ModuleType(names[1])
    for k, v in attrs.items():
        setattr(sub, k, v)
    top.bindings = sub
    monkeypatch.setitem(sys.modules, names[0], top)
    monkeypatch.setitem(sys.modules, names[1], sub)


@pytest.mark.parametrize("platform", ["cuda", "hip"])
def test_blas_destroys_a_handle_it_cannot_set_up(monkeypatch, platform):
    """A handle made whose stream cannot be set is destroyed, and the workspace freed: a capture queue's
    handle that fails is tried again at the next capture, and each try leaked a handle."""
    import types

    from mgx_graph.runtime import host_runtime
    from mgx_graph.runtime.blas import Blas

    made, destroyed = [], []
    _fake_blas_bindings(monkeypatch, platform, made, destroyed)
    rt = host_runtime()
    runtime = types.SimpleNamespace(platform=platform, hipMalloc=rt.hipMalloc, hipFree=rt.hipFree)
    before = rt.counters()["allocated_bytes"]
    with pytest.raises((RuntimeError, DeviceError)):
        Blas(runtime, 1234, workspace_bytes=1 << 20)
    assert len(made) == 1 and destroyed == made
    assert rt.counters()["allocated_bytes"] == before


@pytest.mark.parametrize("platform,module,extra", [("cuda", "nvmath", "cuda"), ("hip", "hip", "rocm")])
def test_blas_without_its_binding_is_a_device_error_naming_the_extra(monkeypatch, platform, module, extra):
    """No nvmath-python (CUDA) or hip-python (ROCm): a DeviceError naming the package and the extra to
    install, not an ImportError from inside a GEMM, and the workspace goes back."""
    import types

    from mgx_graph.runtime import host_runtime
    from mgx_graph.runtime.blas import Blas

    for name in ("nvmath", "nvmath.bindings", "rocm", "rocm.bindings", "hip"):
        monkeypatch.setitem(sys.modules, name, None)  # import of a None entry raises ImportError
    rt = host_runtime()
    runtime = types.SimpleNamespace(platform=platform, hipMalloc=rt.hipMalloc, hipFree=rt.hipFree)
    before = rt.counters()["allocated_bytes"]
    with pytest.raises(DeviceError, match=rf"{module}.*cannot be imported.*mgx_graph\[{extra}\]"):
        Blas(runtime, 1234, workspace_bytes=1 << 20)
    assert rt.counters()["allocated_bytes"] == before


def test_a_failed_prepare_leaves_no_capture_queue():
    from mgx_graph.runtime import host_runtime
    from mgx_graph.graph.capture_queues import CaptureQueues

    rt = host_runtime()
    live = rt.counters()["live_queues"]

    def fail(q):
        raise DeviceError("hipMalloc", "hipErrorOutOfMemory")

    cq = CaptureQueues(rt, fail)
    with pytest.raises(DeviceError, match="hipErrorOutOfMemory"):
        cq.get(1234)
    assert cq.queues() == set() and rt.counters()["live_queues"] == live


def _matmul_model():
    """y = tanh(x @ W + b): a BLAS call in the captured region."""
    w = R.normal(size=(8, 16)).astype(np.float32)
    b = R.normal(size=(16,)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Tanh", ["a"], ["y"])]
    return make_model(nodes, {"x": np.zeros((4, 8), np.float32)}, ["y"], {"w": w, "b": b}), w, b


def test_gpu_blas_in_a_capture_runs_on_the_capture_queues_handle(gpu_target, monkeypatch):
    import cupy

    model, w, b = _matmul_model()
    prog = _compile(model, gpu_target)
    seen = _begun_on(prog.context.runtime, monkeypatch)
    x = cupy.zeros((4, 8), np.float32)
    for k in range(6):
        xh = R.normal(size=(4, 8)).astype(np.float32)
        prog.context.copy_from_host(x, xh, prog.queue)
        (y,) = prog.run_async({"x": x})
        np.testing.assert_allclose(_host(prog, y), np.tanh(xh @ w + b), rtol=1e-4, atol=1e-5, err_msg=f"call {k}")
    st = prog.stats()
    assert st["captures"] == 1 and st["replays"] >= 3 and st["fallbacks"] == 0, st
    assert len(seen) == 1 and seen[0] != prog.queue and seen[0] in prog.context._blas
    prog.release()


def test_gpu_default_stream_used_by_another_thread_during_capture(gpu_target, monkeypatch):
    """Another thread adds on the legacy default stream while the region captures: its add runs, the
    capture holds (no fallback), and the replays are right."""
    import cupy

    prog = _compile(step_model(), gpu_target, alias=ALIAS)
    rt = prog.context.runtime
    begin, seen = rt.hipStreamBeginCapture, []
    other = cupy.zeros(4, np.float32)
    other += 1  # compiles the kernel before any capture
    cupy.cuda.Stream.null.synchronize()

    def use_the_default_stream():
        try:
            with cupy.cuda.Stream.null:
                other.__iadd__(1)
            seen.append(None)
        except Exception as ex:  # noqa: BLE001 - recorded and asserted below
            seen.append(ex)

    def begin_then_other_thread(queue, mode):
        begin(queue, mode)
        if not seen:  # the first capture only
            t = threading.Thread(target=use_the_default_stream)
            t.start()
            t.join()

    monkeypatch.setattr(rt, "hipStreamBeginCapture", begin_then_other_thread)
    _steps(prog, 8)
    stats = prog.stats()
    assert seen == [None], (seen, stats)
    assert stats["fallbacks"] == 0 and stats["captures"] == 1 and stats["replays"] >= 4, stats
    cupy.cuda.Stream.null.synchronize()
    np.testing.assert_array_equal(other.get(), np.full(4, 2, np.float32))  # the other thread's add ran
    prog.release()
