"""The runtime layer: the host backend's capture rules, and the HIP backend driven through a stand-in
for hip-python (no AMD GPU here) plus a check of the real hip-python API when it is installed."""
import enum
import threading

import numpy as np
import pytest

from mgx_graph.errors import DeviceError
from mgx_graph.graph.launch import GraphLaunchState
from mgx_graph.runtime import (hipStreamCaptureModeGlobal, hipStreamCaptureModeRelaxed,
                               hipStreamCaptureModeThreadLocal, host_runtime)
from mgx_graph.runtime._hip import HipRuntime


# -- host backend ----------------------------------------------------------------------------------------
def test_host_capture_records_and_replays():
    rt = host_runtime()
    s = rt.hipStreamCreate()
    box = []
    rt.hipStreamBeginCapture(s, hipStreamCaptureModeThreadLocal)
    rt.hipLaunchHostFunc(s, box.append, (1,))
    rt.hipLaunchHostFunc(s, box.append, (2,))
    assert box == [] and rt.hipStreamIsCapturing(s) == 1
    g = rt.hipStreamEndCapture(s)
    assert rt.hipGraphGetNodeCount(g) == 2
    e = rt.hipGraphInstantiate(g)
    rt.hipGraphLaunch(e, s)
    rt.hipGraphLaunch(e, s)
    assert box == [1, 2, 1, 2]
    rt.hipGraphExecDestroy(e)
    rt.hipGraphDestroy(g)
    rt.hipStreamDestroy(s)


def test_host_sync_during_capture_invalidates():
    rt = host_runtime()
    s = rt.hipStreamCreate()
    rt.hipStreamBeginCapture(s, hipStreamCaptureModeThreadLocal)
    with pytest.raises(DeviceError, match="hipErrorStreamCaptureUnsupported"):
        rt.hipStreamSynchronize(s)
    assert rt.hipStreamIsCapturing(s) == 2  # invalidated
    with pytest.raises(DeviceError, match="hipErrorStreamCaptureInvalidated"):
        rt.hipLaunchHostFunc(s, print, ())
    with pytest.raises(DeviceError, match="hipErrorStreamCaptureInvalidated"):
        rt.hipStreamEndCapture(s)
    assert rt.hipStreamIsCapturing(s) == 0  # the stream is usable again
    rt.hipStreamSynchronize(s)
    rt.hipStreamDestroy(s)


@pytest.mark.parametrize("mode,other_thread_breaks", [(hipStreamCaptureModeThreadLocal, False),
                                                      (hipStreamCaptureModeGlobal, True)])
def test_host_malloc_rules_by_capture_mode(mode, other_thread_breaks):
    rt = host_runtime()
    s = rt.hipStreamCreate()
    rt.hipStreamBeginCapture(s, mode)
    with pytest.raises(DeviceError):  # this thread: illegal in both modes
        rt.hipMalloc(16)
    with pytest.raises(DeviceError):
        rt.hipStreamEndCapture(s)  # already invalidated by the malloc
    rt.hipStreamBeginCapture(s, mode)
    errors = []

    def other():
        try:
            rt.hipFree(rt.hipMalloc(16))
        except DeviceError as e:
            errors.append(e)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert bool(errors) is other_thread_breaks
    if other_thread_breaks:
        with pytest.raises(DeviceError):
            rt.hipStreamEndCapture(s)
    else:
        rt.hipStreamEndCapture(s)
    rt.hipStreamDestroy(s)


def test_host_relaxed_mode_allows_malloc():
    rt = host_runtime()
    s = rt.hipStreamCreate()
    old = rt.hipThreadExchangeStreamCaptureMode(hipStreamCaptureModeRelaxed)
    try:
        rt.hipStreamBeginCapture(s, hipStreamCaptureModeRelaxed)
        rt.hipFree(rt.hipMalloc(16))
        rt.hipStreamEndCapture(s)
    finally:
        rt.hipThreadExchangeStreamCaptureMode(old)
        rt.hipStreamDestroy(s)


def test_host_end_capture_on_wrong_thread_fails():
    rt = host_runtime()
    s = rt.hipStreamCreate()
    rt.hipStreamBeginCapture(s, hipStreamCaptureModeThreadLocal)
    out = []
    t = threading.Thread(target=lambda: out.append(pytest.raises(DeviceError, rt.hipStreamEndCapture, s)))
    t.start()
    t.join()
    assert "WrongThread" in str(out[0].value)
    rt.hipStreamEndCapture(s)
    rt.hipStreamDestroy(s)


def test_host_graph_launch_into_capturing_stream_fails():
    rt = host_runtime()
    s, s2 = rt.hipStreamCreate(), rt.hipStreamCreate()
    rt.hipStreamBeginCapture(s2, hipStreamCaptureModeThreadLocal)
    g = rt.hipStreamEndCapture(s2)
    e = rt.hipGraphInstantiate(g)
    rt.hipStreamBeginCapture(s, hipStreamCaptureModeThreadLocal)
    with pytest.raises(DeviceError):
        rt.hipGraphLaunch(e, s)
    with pytest.raises(DeviceError):
        rt.hipStreamEndCapture(s)


def test_host_exec_update_needs_same_topology():
    rt = host_runtime()
    s = rt.hipStreamCreate()
    got = []
    kernel = got.append  # one "kernel" function: same function, new arguments

    def cap(*vals):
        rt.hipStreamBeginCapture(s, hipStreamCaptureModeThreadLocal)
        for v in vals:
            rt.hipLaunchHostFunc(s, kernel, (v,))
        return rt.hipStreamEndCapture(s)

    e = rt.hipGraphInstantiate(cap(1, 2))
    assert rt.hipGraphExecUpdate(e, cap(3, 4))
    rt.hipGraphLaunch(e, s)
    assert got == [3, 4]
    assert not rt.hipGraphExecUpdate(e, cap(5))


# -- HIP backend through a stand-in hip module ----------------------------------------------------------
class hipError_t(enum.IntEnum):
    hipSuccess = 0
    hipErrorInvalidValue = 1
    hipErrorNotReady = 600
    hipErrorStreamCaptureUnsupported = 900
    hipErrorStreamCaptureInvalidated = 901


class hipStreamCaptureMode(enum.IntEnum):
    hipStreamCaptureModeGlobal = 0
    hipStreamCaptureModeThreadLocal = 1
    hipStreamCaptureModeRelaxed = 2


class FakeHip:
    """hip-python's calling convention: every call returns (hipError_t, *outs).  ``style`` picks the
    7.x or the 10.x (rocm-bindings) signature of hipGraphExecUpdate."""

    hipStreamCaptureMode = hipStreamCaptureMode

    def __init__(self, style="7"):
        self.style = style
        self.calls = []
        self.capturing = {}
        self.next = 100

    def _h(self):
        self.next += 1
        return self.next

    @staticmethod
    def hipStream_t(v):
        return int(v)

    def hipGetDeviceCount(self):
        return hipError_t.hipSuccess, 1

    def hipStreamCreateWithFlags(self, flags):
        self.calls.append(("hipStreamCreateWithFlags", flags))
        return hipError_t.hipSuccess, self._h()

    def hipStreamDestroy(self, s):
        return (hipError_t.hipSuccess,)

    def hipStreamSynchronize(self, s):
        if s in self.capturing:
            self.capturing[s]["bad"] = True
            return (hipError_t.hipErrorStreamCaptureUnsupported,)
        return (hipError_t.hipSuccess,)

    def hipStreamBeginCapture(self, s, mode):
        assert isinstance(mode, hipStreamCaptureMode)
        self.calls.append(("hipStreamBeginCapture", int(mode)))
        self.capturing[s] = {"nodes": [], "bad": False}
        return (hipError_t.hipSuccess,)

    def hipStreamEndCapture(self, s):
        c = self.capturing.pop(s)
        if c["bad"]:
            return hipError_t.hipErrorStreamCaptureInvalidated, None
        return hipError_t.hipSuccess, list(c["nodes"])

    def hipStreamIsCapturing(self, s):
        return hipError_t.hipSuccess, 1 if s in self.capturing else 0

    def hipStreamGetCaptureInfo(self, s):
        return hipError_t.hipSuccess, 1 if s in self.capturing else 0, 7

    def hipGraphInstantiateWithFlags(self, graph, flags):
        self.calls.append(("hipGraphInstantiateWithFlags", flags))
        return hipError_t.hipSuccess, {"nodes": list(graph)}

    def hipGraphLaunch(self, exe, s):
        self.calls.append(("hipGraphLaunch",))
        for fn in exe["nodes"]:
            fn()
        return (hipError_t.hipSuccess,)

    def hipGraphExecUpdate(self, exe, graph, *err_node):
        if self.style == "10" and not err_node:
            raise TypeError("hipGraphExecUpdate() takes exactly 3 positional arguments")
        ok = len(exe["nodes"]) == len(graph)
        if ok:
            exe["nodes"] = list(graph)
        res = 0 if ok else 2
        return (hipError_t.hipSuccess, None, res) if self.style == "7" else (hipError_t.hipSuccess, res)

    def hipMemGetInfo(self):
        return hipError_t.hipSuccess, 1 << 30, 1 << 31

    def hipGraphExecDestroy(self, exe):
        return (hipError_t.hipSuccess,)

    def hipGraphDestroy(self, g):
        return (hipError_t.hipSuccess,)

    # a stand-in for a kernel launch on a stream
    def launch(self, s, fn):
        if s in self.capturing:
            self.capturing[s]["nodes"].append(fn)
        else:
            fn()


class _Ctx:
    def __init__(self, rt):
        from mgx_graph.graph.capture_queues import CaptureQueues

        self.runtime = rt
        self.capture_queue = CaptureQueues(rt).get

    def capture_guard(self, where):
        import contextlib

        return contextlib.nullcontext()


@pytest.mark.parametrize("style", ["7", "10"])
def test_hip_backend_runs_the_graph_launch_state_machine(style):
    fake = FakeHip(style)
    rt = HipRuntime(module=fake)
    assert rt.hipGetDeviceCount() == 1
    q = rt.hipStreamCreate()
    assert ("hipStreamCreateWithFlags", 0) in fake.calls  # hipStreamDefault: ordered with the null stream
    state = GraphLaunchState("main:graph_launch0", _Ctx(rt), body_launches=2, n_instructions=2)
    acc = np.zeros(1)
    calls = []

    def body(s=q):
        fake.launch(s, lambda: acc.__iadd__(1))
        fake.launch(s, lambda: calls.append("k2"))

    key = (q, (("x0", 1234, (4,), "f"),))
    for _ in range(5):
        state.execute(key, q, body, body, lambda: [acc])
    assert acc[0] == 5  # warmup, warmup, capture(+launch), replay, replay: each computed once
    c = state.counters
    assert (c.warmups, c.captures, c.replays, c.fallbacks) == (2, 1, 2, 0)
    assert ("hipStreamBeginCapture", 1) in fake.calls  # thread-local capture mode
    assert ("hipStreamCreateWithFlags", 1) in fake.calls  # the capture queue: hipStreamNonBlocking
    assert ("hipGraphInstantiateWithFlags", 0) in fake.calls
    assert state.stats()["graph_nodes"] == [-1]  # hipGraphGetNodes is not trusted on hip-python
    # exec update with both signatures
    e = state.entries[key].exec
    assert rt.hipGraphExecUpdate(e, [lambda: None, lambda: None])
    assert not rt.hipGraphExecUpdate(e, [lambda: None])


def test_hip_backend_event_query_reports_not_ready_done_and_errors():
    """``hipEventQuery`` through hip-python's convention (``(hipError_t,)``, the enum on the module):
    ``hipErrorNotReady`` is False, success True, any other error a DeviceError with the HIP name."""
    fake = FakeHip()
    fake.hipError_t = hipError_t
    answers = [hipError_t.hipErrorNotReady, hipError_t.hipSuccess, hipError_t.hipErrorInvalidValue]
    fake.hipEventQuery = lambda ev: (answers.pop(0),)
    rt = HipRuntime(module=fake)
    assert rt.hipEventQuery(7) is False
    assert rt.hipEventQuery(7) is True
    with pytest.raises(DeviceError, match="hipEventQuery.*hipErrorInvalidValue"):
        rt.hipEventQuery(7)


def test_hip_backend_failed_capture_falls_back():
    fake = FakeHip()
    rt = HipRuntime(module=fake)
    q = rt.hipStreamCreate()
    state = GraphLaunchState("r", _Ctx(rt), 1, 1, warmup=0)
    acc = np.zeros(1)

    def body(s=q):
        fake.launch(s, lambda: acc.__iadd__(1))
        rt.hipStreamSynchronize(s)  # illegal while capturing: raises DeviceError with the HIP name

    for _ in range(3):
        state.execute((q, ()), q, body, body, lambda: [acc])
    assert acc[0] == 3 and state.counters.fallbacks == 1 and state.counters.captures == 0
    assert "hipErrorStreamCaptureUnsupported" in next(iter(state.failed.values())).reason


# -- the real hip-python API (when installed) -----------------------------------------------------------
def _real_hip_modules():
    mods = []
    try:
        from rocm.bindings import hip as h10  # noqa: F401

        mods.append(("rocm.bindings", h10))
    except Exception:
        pass
    try:
        from hip import hip as h7  # noqa: F401

        mods.append(("hip-python", h7))
    except Exception:
        pass
    return mods


USED = ["hipGetDeviceCount", "hipSetDevice", "hipGetDevice", "hipDeviceSynchronize", "hipMemGetInfo",
        "hipGetDeviceProperties", "hipRuntimeGetVersion", "hipMalloc", "hipFree", "hipMemsetAsync",
        "hipStreamCreateWithFlags", "hipStreamDestroy", "hipStreamSynchronize", "hipStreamBeginCapture",
        "hipStreamEndCapture", "hipStreamIsCapturing", "hipStreamGetCaptureInfo", "hipGraphInstantiateWithFlags",
        "hipGraphLaunch", "hipGraphUpload", "hipGraphExecUpdate", "hipGraphExecDestroy", "hipGraphDestroy",
        "hipEventCreate", "hipEventRecord", "hipEventSynchronize", "hipEventQuery", "hipEventElapsedTime",
        "hipEventDestroy", "hipError_t",
        "hipStreamCaptureMode", "hipStream_t", "hipThreadExchangeStreamCaptureMode",
        "hipHostMalloc", "hipHostFree", "hipHostGetDevicePointer", "hipMemcpyAsync", "hipMemcpyKind"]


@pytest.mark.parametrize("name,mod", _real_hip_modules() or [pytest.param(None, None, marks=pytest.mark.skip(
    reason="hip-python / rocm-bindings-hip not installed"))])
def test_real_hip_python_has_every_call_we_use(name, mod):
    missing = [n for n in USED if not hasattr(mod, n)]
    assert not missing, f"{name} lacks {missing}"
    first = mod.hipGraphInstantiateWithFlags.__doc__.splitlines()[0]
    assert first.startswith("hipGraphInstantiateWithFlags(graph,") and first.count(",") == 1
    assert [m.name for m in mod.hipStreamCaptureMode][:3] == ["hipStreamCaptureModeGlobal",
                                                              "hipStreamCaptureModeThreadLocal",
                                                              "hipStreamCaptureModeRelaxed"]
    assert int(mod.hipStream_t(0x1234)) == 0x1234
    assert int(mod.hipError_t.hipErrorNotReady) == 600  # HipRuntime.hipEventQuery's "still running"


def test_real_hipblas_has_every_call_we_use():
    try:
        from hip import hip, hipblas
    except Exception:
        pytest.skip("hip-python with hipblas not installed")
    for n in ["hipblasCreate", "hipblasSetStream", "hipblasSetWorkspace", "hipblasGemmStridedBatchedEx",
              "hipblasDestroy"]:
        assert hasattr(hipblas, n), n
    assert hipblas.hipblasGemmStridedBatchedEx.__doc__.count(",") >= 22
    assert hip.hipDataType.HIP_R_16F is not None and hipblas.hipblasComputeType_t.HIPBLAS_COMPUTE_32F


# -- the replay's calls through CuPy's runtime module ----------------------------------------------------
def test_cupy_call_raises_device_errors_with_the_hip_name():
    from mgx_graph.runtime import DeviceError, cupy_call

    def failing(*args):
        raise RuntimeError("cudaErrorInvalidValue: invalid argument")

    with pytest.raises(DeviceError, match="hipGraphLaunch failed with hipErrorInvalidValue") as e:
        cupy_call("hipGraphLaunch", failing, 1, 2)
    assert e.value.code == "hipErrorInvalidValue"
    assert cupy_call("x", lambda a, b: a + b, 1, 2) == 3
    with pytest.raises(TypeError):  # not a runtime error: raised as it is
        cupy_call("x", lambda a: a + "s", 1)


def test_host_runtime_has_no_cupy_module():
    from mgx_graph.runtime import host_runtime

    assert host_runtime().cupy_runtime() is None


@pytest.mark.gpu
def test_cuda_capture_status_and_launch_through_cupy_agree_with_cuda_bindings(gpu_target):
    """On CUDA, hipStreamIsCapturing and hipGraphLaunch go through CuPy's runtime: the status during a capture
    is the one cuda-bindings reports, the replay computes, and a bad exec is a DeviceError."""
    import cupy

    from mgx_graph.runtime import DeviceError, device_runtime, hipStreamCaptureStatusActive
    from mgx_graph.runtime._cuda import _rt, _stream

    rt = device_runtime()
    if rt.platform != "cuda":
        pytest.skip("the CuPy path is the CUDA backend's")
    assert rt.cupy_runtime() is not None
    s = rt.hipStreamCreate()
    x = cupy.zeros(4, cupy.float32)
    with cupy.cuda.ExternalStream(s):
        x += 1  # the kernel loaded before the capture
        rt.hipStreamSynchronize(s)
        rt.hipStreamBeginCapture(s, 1)
        assert rt.hipStreamIsCapturing(s) == hipStreamCaptureStatusActive == int(_rt.cudaStreamIsCapturing(_stream(s))[1])
        x += 1
        graph = rt.hipStreamEndCapture(s)
    assert rt.hipStreamIsCapturing(s) == 0
    exe = rt.hipGraphInstantiate(graph)
    for _ in range(3):
        rt.hipGraphLaunch(exe, s)
    rt.hipStreamSynchronize(s)
    assert x.get().tolist() == [4.0] * 4
    with pytest.raises(DeviceError, match="hipGraphLaunch"):
        rt.hipGraphLaunch(0, s)
    rt.hipGraphExecDestroy(exe)
    rt.hipGraphDestroy(graph)
    rt.hipStreamDestroy(s)
