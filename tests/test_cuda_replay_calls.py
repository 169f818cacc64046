"""The CUDA backend's per-replay calls (``hipGraphLaunch``, ``hipStreamIsCapturing``) through CuPy's
runtime module, with cuda-bindings as the fallback: dispatch and error mapping, checked on stand-in
modules (no GPU needed)."""
import enum
import importlib
import sys
import types

import pytest

from mgx_graph.errors import DeviceError


class _Err(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorInvalidResourceHandle = 400


def _fake_bindings(calls):
    rt = types.ModuleType("cuda.bindings.runtime")
    rt.cudaError_t = _Err
    rt.cudaStream_t = lambda s: ("stream", s)
    rt.cudaGraphLaunch = lambda exe, s: (calls.append(("bindings.launch", exe, s)) or (_Err.cudaSuccess,))
    rt.cudaStreamIsCapturing = lambda s: (calls.append(("bindings.capturing", s)) or (_Err.cudaSuccess, 1))
    return rt


class _Exec:
    def __int__(self):
        return 0xBEEF


def _fake_cupy(calls, fail=None):
    crt = types.SimpleNamespace(is_hip=False)

    class CUDARuntimeError(RuntimeError):
        def __init__(self, status):
            super().__init__(status)
            self.status = status

    crt.CUDARuntimeError = CUDARuntimeError

    def graph_launch(exe, s):
        calls.append(("cupy.launch", exe, s))
        if fail is not None:
            raise fail(crt)

    def is_capturing(s):
        calls.append(("cupy.capturing", s))
        if fail is not None:
            raise fail(crt)
        return True

    crt.graphLaunch, crt.streamIsCapturing = graph_launch, is_capturing
    return crt


@pytest.fixture
def cuda_module(monkeypatch):
    calls = []
    pkg, bindings = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
    rt = _fake_bindings(calls)
    bindings.runtime, pkg.bindings = rt, bindings
    for name, mod in (("cuda", pkg), ("cuda.bindings", bindings), ("cuda.bindings.runtime", rt)):
        monkeypatch.setitem(sys.modules, name, mod)
    import mgx_graph.runtime as package

    # the real module (imported where a GPU exists) comes back afterwards, in sys.modules and as the
    # package's attribute
    monkeypatch.delitem(sys.modules, "mgx_graph.runtime._cuda", raising=False)
    monkeypatch.delattr(package, "_cuda", raising=False)
    mod = importlib.import_module("mgx_graph.runtime._cuda")
    yield mod, calls
    sys.modules.pop("mgx_graph.runtime._cuda", None)
    if getattr(package, "_cuda", None) is mod:
        delattr(package, "_cuda")


def _runtime(mod, crt):
    r = mod.CudaRuntime.__new__(mod.CudaRuntime)
    mod.Runtime.__init__(r)
    r.rt, r._pdl, r._crt = mod._rt, {}, crt
    return r


def test_replay_calls_go_through_cupy_when_present(cuda_module):
    mod, calls = cuda_module
    r = _runtime(mod, _fake_cupy(calls))
    r.hipGraphLaunch(_Exec(), 77)
    assert r.hipStreamIsCapturing(77) == 1
    assert calls == [("cupy.launch", 0xBEEF, 77), ("cupy.capturing", 77)]


def test_without_cupy_the_bindings_are_called(cuda_module):
    mod, calls = cuda_module
    r = _runtime(mod, None)
    exe = _Exec()
    r.hipGraphLaunch(exe, 5)
    assert r.hipStreamIsCapturing(5) == 1
    assert calls == [("bindings.launch", exe, ("stream", 5)), ("bindings.capturing", ("stream", 5))]


def test_cupy_errors_become_device_errors_with_hip_names(cuda_module):
    mod, calls = cuda_module
    r = _runtime(mod, _fake_cupy(calls, fail=lambda crt: crt.CUDARuntimeError(400)))
    with pytest.raises(DeviceError) as e:
        r.hipGraphLaunch(_Exec(), 3)
    assert e.value.call == "hipGraphLaunch" and e.value.code == "hipErrorInvalidResourceHandle"
    with pytest.raises(DeviceError) as e:
        r.hipStreamIsCapturing(3)
    assert e.value.call == "hipStreamIsCapturing" and e.value.code == "hipErrorInvalidResourceHandle"
    assert mod.hip_error_name(12345) == "hipError(12345)"


def test_an_invalidated_capture_reads_as_invalidated(cuda_module):
    from mgx_graph.runtime import hipStreamCaptureStatusInvalidated

    mod, calls = cuda_module
    r = _runtime(mod, _fake_cupy(calls, fail=lambda crt: RuntimeError("the capture sequence is invalidated")))
    assert r.hipStreamIsCapturing(9) == hipStreamCaptureStatusInvalidated


def test_cupy_built_for_hip_is_not_used(cuda_module, monkeypatch):
    mod, _ = cuda_module
    cupy, cuda = types.ModuleType("cupy"), types.ModuleType("cupy.cuda")
    cuda.runtime = types.SimpleNamespace(is_hip=True, graphLaunch=lambda *a: None)
    cupy.cuda = cuda
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    assert mod.cupy_runtime() is None
    cuda.runtime.is_hip = False
    assert mod.cupy_runtime() is cuda.runtime
