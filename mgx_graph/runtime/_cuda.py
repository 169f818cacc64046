"""CUDA backend of the runtime layer, on ``cuda.bindings.runtime`` (cuda-bindings >= 12.9).

Every cuda-bindings call returns ``(err, *values)``; :func:`check` turns a non-zero ``err`` into a
DeviceError carrying the HIP name of the error (``cudaErrorX`` -> ``hipErrorX``).
API reference: https://nvidia.github.io/cuda-python/cuda-bindings/latest/module/runtime.html
"""
from __future__ import annotations

from .base import Runtime, check, cupy_call, hipStreamDefault, library_calls

try:  # cuda-bindings >= 12.6 layout
    from cuda.bindings import runtime as _rt
except ImportError:  # pragma: no cover - older cuda-python
    from cuda import cudart as _rt


_STREAMS: dict = {}  # stream handle (int) -> its cudaStream_t, made once (two per replayed call otherwise)
_STREAMS_KEPT = 256


def _stream(s):
    if not isinstance(s, int):
        return s
    h = _STREAMS.get(s)
    if h is None:
        if len(_STREAMS) >= _STREAMS_KEPT:
            _STREAMS.clear()
        h = _STREAMS[s] = _rt.cudaStream_t(s)
    return h


class CudaRuntime(Runtime):
    platform = "cuda"

    def __init__(self):
        super().__init__()
        self.rt = _rt
        self._pdl: dict = {}  # device -> programmatic dependent launch supported (compute capability >= 9.0)
        self._fast_calls = None  # _replay_calls: looked up at the first replay
        self._native_calls = None  # native_replay_calls: looked up once

    def _replay_calls(self) -> tuple:
        """``(graphLaunch, streamIsCapturing)`` of CuPy's runtime module where present (:meth:`cupy_runtime`),
        else ``(None, None)``: the two calls of every replay, through the cheapest binding (kept in
        ``_fast_calls``)."""
        fast = self.cupy_runtime()
        self._fast_calls = tuple(getattr(fast, n, None) if fast is not None else None
                                 for n in ("graphLaunch", "streamIsCapturing"))
        return self._fast_calls

    def native_replay_calls(self):
        """The CUDA driver's ``cuGraphLaunch`` / ``cuStreamIsCapturing`` / ``cuCtxGetDevice`` (libcuda: the
        handles of the runtime API are the driver's), or None where libcuda does not load."""
        if self._native_calls is None:
            self._native_calls = library_calls(("libcuda.so.1", "libcuda.so"),
                                               ("cuGraphLaunch", "cuStreamIsCapturing", "cuCtxGetDevice")) or False
        return self._native_calls or None

    # programmatic dependent launch (Hopper and later; CUDA programming guide, "Programmatic Dependent
    # Launch and Synchronization"; driver API cuLaunchKernelEx)
    def programmatic_launch_supported(self) -> bool:
        dev = self.hipGetDevice()
        ok = self._pdl.get(dev)
        if ok is None:
            err, major = _rt.cudaDeviceGetAttribute(_rt.cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor, dev)
            ok = self._pdl[dev] = int(err) == 0 and int(major) >= 9
        return ok

    def launch_programmatic(self, function: int, grid, block, shared: int, s, args, types) -> None:
        from cuda.bindings import driver

        cfg = driver.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (int(v) for v in grid)
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = (int(v) for v in block)
        cfg.sharedMemBytes = int(shared)
        cfg.hStream = driver.CUstream(int(s))
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        cfg.attrs = [attr]
        cfg.numAttrs = 1
        err = driver.cuLaunchKernelEx(cfg, driver.CUfunction(int(function)), (tuple(args), tuple(types)), 0)[0]
        check("cuLaunchKernelEx", err)

    # device
    def hipGetDeviceCount(self) -> int:
        err, n = _rt.cudaGetDeviceCount()
        return int(n) if int(err) == 0 else 0

    def hipSetDevice(self, dev: int) -> None:
        check("hipSetDevice", _rt.cudaSetDevice(dev)[0])

    def hipGetDevice(self) -> int:
        err, dev = _rt.cudaGetDevice()
        check("hipGetDevice", err)
        return int(dev)

    def hipDeviceSynchronize(self) -> None:
        check("hipDeviceSynchronize", _rt.cudaDeviceSynchronize()[0])

    def hipMemGetInfo(self) -> tuple[int, int]:
        err, free, total = _rt.cudaMemGetInfo()
        check("hipMemGetInfo", err)
        return int(free), int(total)

    def device_name(self) -> str:
        err, prop = _rt.cudaGetDeviceProperties(self.hipGetDevice())
        check("hipGetDeviceProperties", err)
        name = prop.name
        return (name.decode() if isinstance(name, bytes) else str(name)).rstrip("\x00")

    def runtime_version(self) -> str:
        err, v = _rt.cudaRuntimeGetVersion()
        err2, d = _rt.cudaDriverGetVersion()
        return f"cuda runtime {int(v)}, driver {int(d)}"

    # memory
    def hipMalloc(self, nbytes: int) -> int:
        err, ptr = _rt.cudaMalloc(max(int(nbytes), 1))
        check("hipMalloc", err)
        self._note_malloc(int(ptr), max(int(nbytes), 1))
        return int(ptr)

    def hipFree(self, ptr: int) -> None:
        check("hipFree", _rt.cudaFree(int(ptr))[0])
        self._note_free(ptr)

    def hipMemsetAsync(self, ptr: int, value: int, nbytes: int, s) -> None:
        check("hipMemsetAsync", _rt.cudaMemsetAsync(int(ptr), int(value), int(nbytes), _stream(s))[0])

    # streams
    def hipStreamCreate(self, flags: int = hipStreamDefault) -> int:
        """A new queue; by default blocking (``hipStreamDefault``: ordered with the legacy default
        stream), ``hipStreamNonBlocking`` for one that is not."""
        err, s = _rt.cudaStreamCreateWithFlags(int(flags))
        check("hipStreamCreate", err)
        self._note_queue(int(s), True)
        return int(s)

    def hipStreamDestroy(self, s) -> None:
        check("hipStreamDestroy", _rt.cudaStreamDestroy(_stream(s))[0])
        self._note_queue(int(s), False)

    def hipStreamSynchronize(self, s) -> None:
        check("hipStreamSynchronize", _rt.cudaStreamSynchronize(_stream(s))[0])

    def hipStreamBeginCapture(self, s, mode: int) -> None:
        check("hipStreamBeginCapture", _rt.cudaStreamBeginCapture(_stream(s), _rt.cudaStreamCaptureMode(int(mode)))[0])
        self._capture_begun(s)

    def hipStreamEndCapture(self, s):
        err, graph = _rt.cudaStreamEndCapture(_stream(s))
        if int(err) != 0 and graph is not None and int(graph) != 0:
            _rt.cudaGraphDestroy(graph)
        self._capture_ended(s)  # and the releases held back while this capture was open
        check("hipStreamEndCapture", err)
        return graph

    def hipStreamIsCapturing(self, s) -> int:
        fast = (self._fast_calls or self._replay_calls())[1]
        if fast is not None:  # once per replay: the cheapest binding
            try:
                return fast(int(s))
            except Exception:
                pass  # the error as cuda-bindings reports it, below
        err, status = _rt.cudaStreamIsCapturing(_stream(s))
        check("hipStreamIsCapturing", err)
        return int(status)

    def hipStreamGetCaptureInfo(self, s) -> tuple[int, int]:
        r = _rt.cudaStreamGetCaptureInfo(_stream(s))  # 7 values on 13.x, 6 on 12.x: use [1], [2]
        check("hipStreamGetCaptureInfo", r[0])
        return int(r[1]), int(r[2])

    def hipThreadExchangeStreamCaptureMode(self, mode: int) -> int:
        err, old = _rt.cudaThreadExchangeStreamCaptureMode(_rt.cudaStreamCaptureMode(int(mode)))
        check("hipThreadExchangeStreamCaptureMode", err)
        return int(old)

    # graphs
    def hipGraphInstantiate(self, graph):
        err, exe = _rt.cudaGraphInstantiate(graph, 0)
        check("hipGraphInstantiate", err)
        return exe

    def hipGraphGetNodeCount(self, graph) -> int:
        err, _, n = _rt.cudaGraphGetNodes(graph, 0)
        check("hipGraphGetNodes", err)
        return int(n)

    def hipGraphLaunch(self, exe, s) -> None:
        fast = (self._fast_calls or self._replay_calls())[0]
        if fast is not None:  # once per replay: the cheapest binding
            cupy_call("hipGraphLaunch", fast, int(exe), int(s))
            return
        check("hipGraphLaunch", _rt.cudaGraphLaunch(exe, _stream(s))[0])

    def hipGraphUpload(self, exe, s) -> None:
        check("hipGraphUpload", _rt.cudaGraphUpload(exe, _stream(s))[0])

    def hipGraphExecUpdate(self, exe, graph) -> bool:
        err, info = _rt.cudaGraphExecUpdate(exe, graph)
        return int(err) == 0 and int(info.result) == 0

    def hipGraphExecDestroy(self, exe) -> None:
        check("hipGraphExecDestroy", _rt.cudaGraphExecDestroy(exe)[0])

    def hipGraphDestroy(self, graph) -> None:
        check("hipGraphDestroy", _rt.cudaGraphDestroy(graph)[0])

    # pinned host memory and device-to-host copies into it (a read-back that waits for nothing queued later)
    def hipHostMalloc(self, nbytes: int) -> int:
        err, ptr = _rt.cudaMallocHost(max(int(nbytes), 1))
        check("hipHostMalloc", err)
        return int(ptr)

    def hipHostFree(self, ptr: int) -> None:
        check("hipHostFree", _rt.cudaFreeHost(int(ptr))[0])

    def hipHostGetDevicePointer(self, ptr: int) -> int:
        err, dptr = _rt.cudaHostGetDevicePointer(int(ptr), 0)
        check("hipHostGetDevicePointer", err)
        return int(dptr)

    def hipMemcpyDtoHAsync(self, dst: int, src: int, nbytes: int, s) -> None:
        kind = _rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        check("hipMemcpyDtoHAsync", _rt.cudaMemcpyAsync(int(dst), int(src), int(nbytes), kind, _stream(s))[0])

    # events
    def hipEventCreate(self):
        err, ev = _rt.cudaEventCreate()
        check("hipEventCreate", err)
        return ev

    def hipEventRecord(self, ev, s) -> None:
        check("hipEventRecord", _rt.cudaEventRecord(ev, _stream(s))[0])

    def hipEventSynchronize(self, ev) -> None:
        check("hipEventSynchronize", _rt.cudaEventSynchronize(ev)[0])

    def hipEventQuery(self, ev) -> bool:
        """True when the work before event ``ev``'s record is done (or it was never recorded), False
        while it runs (``NotReady``); any other error raises DeviceError (``hipEventQuery``)."""
        err = _rt.cudaEventQuery(ev)[0]
        if err == _rt.cudaError_t.cudaErrorNotReady:
            return False
        check("hipEventQuery", err)
        return True

    def hipEventElapsedTime(self, a, b) -> float:
        err, ms = _rt.cudaEventElapsedTime(a, b)
        check("hipEventElapsedTime", err)
        return float(ms)

    def hipEventDestroy(self, ev) -> None:
        _rt.cudaEventDestroy(ev)
