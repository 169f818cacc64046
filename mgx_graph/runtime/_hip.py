"""HIP backend of the runtime layer, on hip-python (AMD ROCm).

hip-python returns ``(err, *values)`` like cuda-bindings.  Differences handled here:

* ``hipGraphInstantiate`` is ``(graph, pLogBuffer, bufferSize)`` in hip-python 7.x and
  ``(graph, bufferSize)`` in rocm-bindings 10.x, so ``hipGraphInstantiateWithFlags(graph, 0)`` ->
  ``(err, exec)`` is used (the same in both);
* ``hipGraphExecUpdate`` is ``(exec, graph) -> (err, errorNode, result)`` in 7.x and
  ``(exec, graph, errorNode_out) -> (err, result)`` in 10.x: the result is the last element;
* ``hipGraphGetNodes`` is not used (its generated wrapper passes an uninitialised count), so node
  counts are unavailable (reported as -1).
API reference: https://rocm.docs.amd.com/projects/hip-python/en/latest/
"""
from __future__ import annotations

from .base import Runtime, check, hipStreamDefault, library_calls


def _import_hip():
    try:  # hip-python >= 10: rocm-bindings
        from rocm.bindings import hip

        return hip
    except ImportError:
        from hip import hip

        return hip


class HipRuntime(Runtime):
    platform = "hip"
    has_graph_node_count = False

    def __init__(self, module=None):
        super().__init__()
        self.hip = module if module is not None else _import_hip()
        self._native_calls = None  # native_replay_calls: looked up once

    def native_replay_calls(self):
        """HIP's ``hipGraphLaunch`` / ``hipStreamIsCapturing`` / ``hipGetDevice`` from libamdhip64, or None
        where it does not load."""
        if self._native_calls is None:
            self._native_calls = library_calls(("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"),
                                               ("hipGraphLaunch", "hipStreamIsCapturing", "hipGetDevice")) or False
        return self._native_calls or None

    def _s(self, s):
        return self.hip.hipStream_t(int(s)) if isinstance(s, int) and hasattr(self.hip, "hipStream_t") else s

    # device
    def hipGetDeviceCount(self) -> int:
        err, n = self.hip.hipGetDeviceCount()
        return int(n) if int(err) == 0 else 0

    def hipSetDevice(self, dev: int) -> None:
        check("hipSetDevice", self.hip.hipSetDevice(dev)[0])

    def hipGetDevice(self) -> int:
        err, dev = self.hip.hipGetDevice()
        check("hipGetDevice", err)
        return int(dev)

    def hipDeviceSynchronize(self) -> None:
        check("hipDeviceSynchronize", self.hip.hipDeviceSynchronize()[0])

    def hipMemGetInfo(self) -> tuple[int, int]:
        err, free, total = self.hip.hipMemGetInfo()
        check("hipMemGetInfo", err)
        return int(free), int(total)

    def device_name(self) -> str:
        err, prop = self.hip.hipGetDeviceProperties(self.hipGetDevice())
        check("hipGetDeviceProperties", err)
        name = prop.name
        return (name.decode() if isinstance(name, bytes) else str(name)).rstrip("\x00")

    def runtime_version(self) -> str:
        err, v = self.hip.hipRuntimeGetVersion()
        return f"hip runtime {int(v)}"

    # memory
    def hipMalloc(self, nbytes: int) -> int:
        err, ptr = self.hip.hipMalloc(max(int(nbytes), 1))
        check("hipMalloc", err)
        self._note_malloc(int(ptr), max(int(nbytes), 1))
        return int(ptr)

    def hipFree(self, ptr: int) -> None:
        check("hipFree", self.hip.hipFree(int(ptr))[0])
        self._note_free(ptr)

    def hipMemsetAsync(self, ptr: int, value: int, nbytes: int, s) -> None:
        check("hipMemsetAsync", self.hip.hipMemsetAsync(int(ptr), int(value), int(nbytes), self._s(s))[0])

    # streams
    def hipStreamCreate(self, flags: int = hipStreamDefault) -> int:
        """A new queue; by default blocking (``hipStreamDefault``: ordered with the null stream),
        ``hipStreamNonBlocking`` for one that is not."""
        err, s = self.hip.hipStreamCreateWithFlags(int(flags))
        check("hipStreamCreate", err)
        self._note_queue(int(s), True)
        return int(s)

    def hipStreamDestroy(self, s) -> None:
        check("hipStreamDestroy", self.hip.hipStreamDestroy(self._s(s))[0])
        self._note_queue(int(s), False)

    def hipStreamSynchronize(self, s) -> None:
        check("hipStreamSynchronize", self.hip.hipStreamSynchronize(self._s(s))[0])

    def hipStreamBeginCapture(self, s, mode: int) -> None:
        m = self.hip.hipStreamCaptureMode(int(mode))
        check("hipStreamBeginCapture", self.hip.hipStreamBeginCapture(self._s(s), m)[0])
        self._capture_begun(s)

    def hipStreamEndCapture(self, s):
        err, graph = self.hip.hipStreamEndCapture(self._s(s))
        self._capture_ended(s)  # and the releases held back while this capture was open
        check("hipStreamEndCapture", err)
        return graph

    def hipStreamIsCapturing(self, s) -> int:
        err, status = self.hip.hipStreamIsCapturing(self._s(s))
        check("hipStreamIsCapturing", err)
        return int(status)

    def hipStreamGetCaptureInfo(self, s) -> tuple[int, int]:
        r = self.hip.hipStreamGetCaptureInfo(self._s(s))
        check("hipStreamGetCaptureInfo", r[0])
        return int(r[1]), int(r[2])

    def hipThreadExchangeStreamCaptureMode(self, mode: int) -> int:
        fn = self.hip.hipThreadExchangeStreamCaptureMode
        try:
            r = fn(self.hip.hipStreamCaptureMode(int(mode)))
        except TypeError:  # hip-python exposes no way to pass the in/out mode: report the current one
            r = fn()
        check("hipThreadExchangeStreamCaptureMode", r[0])
        return int(r[1])

    # graphs
    def hipGraphInstantiate(self, graph):
        err, exe = self.hip.hipGraphInstantiateWithFlags(graph, 0)
        check("hipGraphInstantiate", err)
        return exe

    def hipGraphGetNodeCount(self, graph) -> int:
        return -1  # see module docstring

    def hipGraphLaunch(self, exe, s) -> None:
        check("hipGraphLaunch", self.hip.hipGraphLaunch(exe, self._s(s))[0])

    def hipGraphUpload(self, exe, s) -> None:
        check("hipGraphUpload", self.hip.hipGraphUpload(exe, self._s(s))[0])

    def hipGraphExecUpdate(self, exe, graph) -> bool:
        try:
            r = self.hip.hipGraphExecUpdate(exe, graph)
        except TypeError:  # rocm-bindings 10.x: the error-node out-parameter is explicit
            r = self.hip.hipGraphExecUpdate(exe, graph, None)
        return int(r[0]) == 0 and int(r[-1]) == 0

    def hipGraphExecDestroy(self, exe) -> None:
        check("hipGraphExecDestroy", self.hip.hipGraphExecDestroy(exe)[0])

    def hipGraphDestroy(self, graph) -> None:
        check("hipGraphDestroy", self.hip.hipGraphDestroy(graph)[0])

    # events
    def hipHostMalloc(self, nbytes: int) -> int:
        err, ptr = self.hip.hipHostMalloc(max(int(nbytes), 1), 0)
        check("hipHostMalloc", err)
        return int(ptr)

    def hipHostFree(self, ptr: int) -> None:
        check("hipHostFree", self.hip.hipHostFree(int(ptr))[0])

    def hipHostGetDevicePointer(self, ptr: int) -> int:
        err, dptr = self.hip.hipHostGetDevicePointer(int(ptr), 0)
        check("hipHostGetDevicePointer", err)
        return int(dptr)

    def hipMemcpyDtoHAsync(self, dst: int, src: int, nbytes: int, s) -> None:
        kind = self.hip.hipMemcpyKind.hipMemcpyDeviceToHost
        check("hipMemcpyDtoHAsync", self.hip.hipMemcpyAsync(int(dst), int(src), int(nbytes), kind, self._s(s))[0])

    def hipEventCreate(self):
        err, ev = self.hip.hipEventCreate()
        check("hipEventCreate", err)
        return ev

    def hipEventRecord(self, ev, s) -> None:
        check("hipEventRecord", self.hip.hipEventRecord(ev, self._s(s))[0])

    def hipEventSynchronize(self, ev) -> None:
        check("hipEventSynchronize", self.hip.hipEventSynchronize(ev)[0])

    def hipEventQuery(self, ev) -> bool:
        """True when the work before event ``ev``'s record is done (or it was never recorded), False
        while it runs (``NotReady``); any other error raises DeviceError (``hipEventQuery``)."""
        err = self.hip.hipEventQuery(ev)[0]
        if err == self.hip.hipError_t.hipErrorNotReady:
            return False
        check("hipEventQuery", err)
        return True

    def hipEventElapsedTime(self, a, b) -> float:
        err, ms = self.hip.hipEventElapsedTime(a, b)
        check("hipEventElapsedTime", err)
        return float(ms)

    def hipEventDestroy(self, ev) -> None:
        self.hip.hipEventDestroy(ev)
