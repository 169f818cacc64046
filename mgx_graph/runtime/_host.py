"""Host backend of the runtime layer (the ``ref`` target's queue).

Streams execute host functions in order (``hipLaunchHostFunc``).  Stream capture records them
instead, into a graph that can be instantiated and launched; the rules follow CUDA/HIP:

* ``hipStreamSynchronize`` on a capturing stream, or ``hipDeviceSynchronize`` while any stream
  captures, is illegal: it fails and invalidates the capture;
* ``hipMalloc`` / ``hipFree`` while this thread holds a global or thread-local capture (or any
  thread holds a global one) is illegal and invalidates the capture;
* a capture ends on the thread that began it (except in relaxed mode);
* ``hipStreamEndCapture`` of an invalidated capture fails and returns no graph;
* ``hipGraphLaunch`` into a capturing stream fails (no nested capture);
* ``hipGraphExecUpdate`` succeeds only when the new graph has the same topology (the same host
  functions in the same order) and then swaps in its arguments.
"""
from __future__ import annotations

import itertools
import os
import threading

import numpy as np

from ..errors import DeviceError
from .base import Runtime, hipStreamCaptureModeGlobal, hipStreamCaptureModeRelaxed, hipStreamCaptureModeThreadLocal


def _physical_memory() -> int:
    """Bytes of physical memory of the host (64 GiB where the system does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return 64 << 30


class _Capture:
    __slots__ = ("id", "mode", "thread", "nodes", "invalid", "reason")

    def __init__(self, cid, mode, thread):
        self.id, self.mode, self.thread = cid, mode, thread
        self.nodes: list = []
        self.invalid = False
        self.reason = ""


class _Stream:
    __slots__ = ("handle", "capture", "destroyed", "flags")

    def __init__(self, handle, flags=0):
        self.handle, self.flags = handle, flags
        self.capture: _Capture | None = None
        self.destroyed = False


class HostGraph:
    """A captured sequence of host functions (``(fn, args)`` nodes)."""

    __slots__ = ("nodes", "destroyed")

    def __init__(self, nodes):
        self.nodes = list(nodes)
        self.destroyed = False


class HostGraphExec:
    __slots__ = ("nodes", "destroyed", "launches")

    def __init__(self, nodes):
        self.nodes = list(nodes)
        self.destroyed = False
        self.launches = 0


class HostRuntime(Runtime):
    platform = "host"

    def __init__(self):
        super().__init__()
        self._lock = threading.RLock()
        self._streams: dict[int, _Stream] = {}
        self._handles = itertools.count(0x1000, 0x10)
        self._capture_ids = itertools.count(1)
        self._mem: dict[int, np.ndarray] = {}
        self._tls = threading.local()
        self.allocated_bytes = 0
        self.total_bytes = _physical_memory()

    # -- helpers ---------------------------------------------------------------------------------
    def _stream(self, s) -> _Stream:
        st = self._streams.get(int(s))
        if st is None or st.destroyed:
            raise DeviceError("hip stream", "hipErrorInvalidHandle", f"stream {s:#x} does not exist")
        return st

    def _thread_mode(self) -> int:
        return getattr(self._tls, "mode", hipStreamCaptureModeGlobal)

    def _unsafe_call(self, call: str) -> None:
        """Apply the capture rules for a 'potentially unsafe' API call (malloc, free, sync)."""
        me = threading.get_ident()
        if self._thread_mode() == hipStreamCaptureModeRelaxed:
            return
        offending = []
        for st in self._streams.values():
            c = st.capture
            if c is None or c.invalid:
                continue
            if c.mode == hipStreamCaptureModeGlobal or (c.mode == hipStreamCaptureModeThreadLocal and c.thread == me):
                offending.append(c)
        if offending:
            for c in offending:
                c.invalid = True
                c.reason = f"{call} during capture"
            raise DeviceError(call, "hipErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing")

    # -- device ----------------------------------------------------------------------------------
    def hipGetDeviceCount(self) -> int:
        return 1

    def hipDeviceSynchronize(self) -> None:
        with self._lock:
            active = [st.capture for st in self._streams.values() if st.capture and not st.capture.invalid]
            for c in active:
                c.invalid = True
                c.reason = "hipDeviceSynchronize during capture"
            if active:
                raise DeviceError("hipDeviceSynchronize", "hipErrorStreamCaptureUnsupported",
                                  "a stream is capturing")

    def hipMemGetInfo(self) -> tuple[int, int]:
        return self.total_bytes - self.allocated_bytes, self.total_bytes

    # -- memory ----------------------------------------------------------------------------------
    def hipMalloc(self, nbytes: int) -> int:
        """``nbytes`` (at least 1) of 64-byte aligned host memory; DeviceError ``hipErrorOutOfMemory``
        when the request exceeds the memory of the host or numpy cannot allocate it."""
        n = max(int(nbytes), 1)
        with self._lock:
            self._unsafe_call("hipMalloc")
            if n > self.total_bytes - self.allocated_bytes:
                raise DeviceError("hipMalloc", "hipErrorOutOfMemory",
                                  f"{n} bytes requested, {self.total_bytes - self.allocated_bytes} of "
                                  f"{self.total_bytes} bytes free")
            try:
                buf = np.zeros(n + 64, dtype=np.uint8)
            except (MemoryError, ValueError) as e:
                raise DeviceError("hipMalloc", "hipErrorOutOfMemory", f"{n} bytes requested: {e}") from None
            ptr = buf.ctypes.data
            pad = (-ptr) % 64
            buf = buf[pad:pad + n]
            ptr = buf.ctypes.data
            self._mem[ptr] = buf
            self.allocated_bytes += buf.nbytes
            self._note_malloc(ptr, buf.nbytes)
            return ptr

    def hipFree(self, ptr: int) -> None:
        with self._lock:
            self._unsafe_call("hipFree")
            buf = self._mem.pop(int(ptr), None)
            if buf is None:
                raise DeviceError("hipFree", "hipErrorInvalidValue", f"{ptr:#x} was not allocated")
            self.allocated_bytes -= buf.nbytes
            self._note_free(ptr)

    def host_buffer(self, ptr: int) -> np.ndarray:
        """The uint8 numpy array behind an allocation (host backend only)."""
        return self._mem[int(ptr)]

    def hipMemcpyAsync(self, dst: np.ndarray, src: np.ndarray, stream) -> None:
        """Copy ``src`` into ``dst`` (numpy arrays of equal shape) in stream order."""
        self.hipLaunchHostFunc(stream, np.copyto, (dst, src))

    # -- streams ---------------------------------------------------------------------------------
    def hipStreamCreate(self, flags: int = 0) -> int:
        """A new stream (``flags`` kept, see :meth:`hipStreamGetFlags`: the host has no legacy stream to
        order with)."""
        with self._lock:
            h = next(self._handles)
            self._streams[h] = _Stream(h, int(flags))
            self._note_queue(h, True)
            return h

    def hipStreamGetFlags(self, s) -> int:
        """The flags stream ``s`` was created with."""
        return self._stream(s).flags

    def hipStreamDestroy(self, s) -> None:
        with self._lock:
            st = self._stream(s)
            ended = st.capture is not None
            if ended:
                # as CUDA: destroying a capturing stream ends its capture (the graph is dropped)
                st.capture = None
            st.destroyed = True
            del self._streams[st.handle]
            self._note_queue(st.handle, False)
        if ended and self._held:
            self.run_held_releases()

    def hipStreamSynchronize(self, s) -> None:
        st = self._stream(s)
        if st.capture is not None:
            st.capture.invalid = True
            st.capture.reason = "hipStreamSynchronize during capture"
            raise DeviceError("hipStreamSynchronize", "hipErrorStreamCaptureUnsupported",
                              "operation not permitted when stream is capturing")
        # host streams run synchronously: nothing is pending

    def hipStreamQuery(self, s) -> bool:
        self.hipStreamSynchronize(s)  # raises while the stream captures, as the device runtimes do
        return True

    def hipLaunchHostFunc(self, s, fn, args=()) -> None:
        """Run ``fn(*args)`` in stream order, or record it while the stream captures."""
        st = self._streams.get(s)
        if st is None:
            st = self._stream(s)
        c = st.capture
        if c is None:
            fn(*args)
            return
        if c.invalid:
            raise DeviceError("hipLaunchHostFunc", "hipErrorStreamCaptureInvalidated", c.reason)
        c.nodes.append((fn, args))

    # -- capture ---------------------------------------------------------------------------------
    def hipStreamBeginCapture(self, s, mode: int = hipStreamCaptureModeGlobal) -> None:
        with self._lock:
            st = self._stream(s)
            if st.capture is not None:
                raise DeviceError("hipStreamBeginCapture", "hipErrorIllegalState", "stream is already capturing")
            st.capture = _Capture(next(self._capture_ids), int(mode), threading.get_ident())
        self._capture_begun(s)

    def hipStreamEndCapture(self, s) -> HostGraph:
        try:
            return self._end_capture(s)
        finally:
            self._capture_ended(s)  # and the releases held back while this capture was open

    def _end_capture(self, s) -> HostGraph:
        with self._lock:
            st = self._stream(s)
            c = st.capture
            if c is None:
                raise DeviceError("hipStreamEndCapture", "hipErrorIllegalState", "stream is not capturing")
            if c.mode != hipStreamCaptureModeRelaxed and c.thread != threading.get_ident():
                raise DeviceError("hipStreamEndCapture", "hipErrorStreamCaptureWrongThread")
            st.capture = None
            if c.invalid:
                raise DeviceError("hipStreamEndCapture", "hipErrorStreamCaptureInvalidated", c.reason)
            return HostGraph(c.nodes)

    def hipStreamIsCapturing(self, s) -> int:
        st = self._stream(s)
        if st.capture is None:
            return 0
        return 2 if st.capture.invalid else 1

    def hipStreamGetCaptureInfo(self, s) -> tuple[int, int]:
        st = self._stream(s)
        if st.capture is None:
            return 0, 0
        return (2 if st.capture.invalid else 1), st.capture.id

    def hipThreadExchangeStreamCaptureMode(self, mode: int) -> int:
        old = self._thread_mode()
        self._tls.mode = int(mode)
        return old

    # -- graphs ----------------------------------------------------------------------------------
    def hipGraphInstantiate(self, graph: HostGraph) -> HostGraphExec:
        if graph is None or graph.destroyed:
            raise DeviceError("hipGraphInstantiate", "hipErrorInvalidValue")
        return HostGraphExec(graph.nodes)

    def hipGraphGetNodeCount(self, graph: HostGraph) -> int:
        return len(graph.nodes)

    def hipGraphLaunch(self, exe: HostGraphExec, s) -> None:
        st = self._stream(s)
        if exe is None or exe.destroyed:
            raise DeviceError("hipGraphLaunch", "hipErrorInvalidValue", "graph exec was destroyed")
        if st.capture is not None:
            st.capture.invalid = True
            st.capture.reason = "hipGraphLaunch into a capturing stream"
            raise DeviceError("hipGraphLaunch", "hipErrorStreamCaptureUnsupported",
                              "cannot launch a graph into a capturing stream")
        exe.launches += 1
        for fn, args in exe.nodes:
            fn(*args)

    def hipGraphUpload(self, exe, s) -> None:
        self._stream(s)

    def hipGraphExecUpdate(self, exe: HostGraphExec, graph: HostGraph) -> bool:
        """Swap in ``graph``'s node arguments; False (no change) when the topology differs."""
        if len(exe.nodes) != len(graph.nodes) or any(a[0] is not b[0] for a, b in zip(exe.nodes, graph.nodes)):
            return False
        exe.nodes = list(graph.nodes)
        return True

    def hipGraphExecDestroy(self, exe: HostGraphExec) -> None:
        exe.destroyed = True
        exe.nodes = []

    def hipGraphDestroy(self, graph: HostGraph) -> None:
        graph.destroyed = True
        graph.nodes = []

    # -- events ----------------------------------------------------------------------------------
    def hipEventCreate(self):
        return [0.0]

    def hipEventRecord(self, ev, s) -> None:
        import time

        self.hipLaunchHostFunc(s, lambda: ev.__setitem__(0, time.perf_counter()))

    def hipEventSynchronize(self, ev) -> None:
        pass

    def hipEventQuery(self, ev) -> bool:
        return True  # the host queue ran the work before the call returned

    def hipEventElapsedTime(self, a, b) -> float:
        return (b[0] - a[0]) * 1e3

    def hipEventDestroy(self, ev) -> None:
        pass
