"""Read-back of small device arrays that waits for nothing queued after it.

``ctx.to_host`` copies into pageable host memory, which the driver does synchronously: the host waits
for everything queued before *and* the copy, so it cannot read a step's result while the next step is
already queued.  A :class:`HostReader` copies into page-locked host memory (``hipHostMalloc``) with
``hipMemcpyDtoHAsync`` and records an event after the copy: :meth:`HostReader.wait` waits for that
event only, so a decode loop can queue step t + 1 and then read step t's id while step t + 1 runs.
The runtime calls are :class:`mgx_graph.runtime.Runtime`'s (CUDA: ``cudaMallocHost`` /
``cudaMemcpyAsync`` / ``cudaEventRecord``; HIP: their ``hip`` namesakes).
"""
from __future__ import annotations

import ctypes
from collections import deque

import numpy as np

from .. import settings as mgx_settings
from ..errors import DeviceError, ParameterError


def poll_setting() -> bool:
    """``MIGRAPHX_HOST_READER_POLL`` (read once): ``1`` makes :meth:`HostReader.wait` poll its event
    (``hipEventQuery`` until it completes) on the calling thread instead of ``hipEventSynchronize``
    (off by default)."""
    return mgx_settings.current().host_reader_poll


class HostReader:
    """``depth`` page-locked buffers of ``shape`` / ``dtype`` on ``ctx``'s device, used in turn.

    ``start(arr, queue)`` queues a copy of device array ``arr`` (C-contiguous, of ``shape`` and
    ``dtype``) into the next buffer and records an event after it; ``start_written(write, queue)``
    queues ``write(address)``, a kernel writing the next buffer through its device address (page-locked
    memory is mapped into the device's address space: ``hipHostGetDevicePointer``), and the event after
    it, so no copy is queued at all; ``wait()`` waits for the oldest start and returns a new numpy array
    holding it.  At most ``depth`` starts may be pending (a further one is a ParameterError: the buffer
    is still being read); ``wait()`` with none pending is a ParameterError too.  ``close()`` frees the
    buffers (the context also does when it is released); a start after it is a ParameterError.
    ``poll`` (None: :func:`poll_setting`): ``wait()`` polls the event (``hipEventQuery``) instead of
    blocking in ``hipEventSynchronize``."""

    def __init__(self, ctx, shape, dtype, depth: int = 2, poll: bool | None = None):
        self.ctx, self.rt = ctx, ctx.runtime
        self.poll = poll_setting() if poll is None else bool(poll)
        self.shape, self.dtype = tuple(int(d) for d in shape), np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.depth = int(depth)
        self.ptrs, self.events, self.views, self.device_ptrs = [], [], [], []
        with ctx.on_device():
            for _ in range(self.depth):
                ptr = self.rt.hipHostMalloc(self.nbytes)
                self.ptrs.append(ptr)
                self.device_ptrs.append(self._device_address(ptr))
                self.events.append(self.rt.hipEventCreate())
                buf = (ctypes.c_byte * max(self.nbytes, 1)).from_address(ptr)
                self.views.append(np.frombuffer(buf, self.dtype, count=self.nbytes // self.dtype.itemsize)
                                  .reshape(self.shape))
        self.pending: deque = deque()
        self.next = 0
        self.closed = False

    def _device_address(self, ptr: int):
        """The device address of buffer ``ptr``, or None where the platform maps no page-locked memory
        (then only :meth:`start` reads back: :attr:`kernel_writable` is False)."""
        try:
            return self.rt.hipHostGetDevicePointer(ptr)
        except DeviceError:
            return None

    @property
    def kernel_writable(self) -> bool:
        """Whether :meth:`start_written` can run: every buffer has a device address."""
        return bool(self.device_ptrs) and all(p is not None for p in self.device_ptrs)

    def _check_free(self) -> None:
        if self.closed:
            raise ParameterError("HostReader: closed (its buffers are freed)")
        if len(self.pending) >= self.depth:
            raise ParameterError(f"HostReader: {self.depth} read-backs pending already (wait() first)")

    def _started(self, k: int) -> None:
        self.next = (k + 1) % self.depth
        self.pending.append(k)

    def start_written(self, write, queue) -> None:
        """Queue ``write(address)`` (it queues a kernel on the current queue that writes ``shape`` /
        ``dtype`` C-contiguous at device address ``address``, an int) and an event after it, both on
        ``queue``: ``write`` runs with ``queue`` current (``ctx.on_queue``), so its kernel is ordered
        before the event even when the caller is not inside ``on_queue(queue)``.  When ``write``
        raises, nothing is pending and the same buffer is used next.  ParameterError when the buffers
        have no device address (:attr:`kernel_writable`)."""
        self._check_free()
        if not self.kernel_writable:
            raise ParameterError("HostReader: the page-locked buffers have no device address here (use start)")
        k = self.next
        with self.ctx.on_queue(queue):
            write(self.device_ptrs[k])
            self.rt.hipEventRecord(self.events[k], queue)
        self._started(k)

    def start(self, arr, queue) -> None:
        """Queue a copy of device array ``arr`` (C-contiguous, ``shape`` / ``dtype``) into the next buffer
        and an event after it, on ``queue``.  Raises ParameterError for another array, when ``depth``
        read-backs are pending or after :meth:`close`."""
        self._check_free()
        if tuple(arr.shape) != self.shape or arr.dtype != self.dtype or not arr.flags.c_contiguous:
            raise ParameterError(f"HostReader: array {arr.dtype}{list(arr.shape)} (C-contiguous "
                                 f"{self.dtype}{list(self.shape)} expected)")
        k = self.next
        with self.ctx.on_device():
            self.rt.hipMemcpyDtoHAsync(self.ptrs[k], self.ctx.data_ptr(arr), self.nbytes, queue)
            self.rt.hipEventRecord(self.events[k], queue)
        self._started(k)

    def wait(self) -> np.ndarray:
        """Wait for the oldest pending read-back (its event only: ``hipEventQuery`` in a loop on the
        calling thread when :attr:`poll`, else ``hipEventSynchronize``) and return a new numpy array of
        ``shape`` / ``dtype`` holding it.  Raises ParameterError when none is pending, DeviceError when
        the runtime reports an error for the event (the read-back is then no longer pending)."""
        if not self.pending:
            raise ParameterError("HostReader: no read-back pending (start() or start_written() first)")
        k = self.pending.popleft()
        if self.poll:
            query, ev = self.rt.hipEventQuery, self.events[k]
            while not query(ev):
                pass
        else:
            self.rt.hipEventSynchronize(self.events[k])
        return self.views[k].copy()

    def close(self) -> None:
        """Free the buffers and events (after the pending copies are done; their values are dropped).
        A second call does nothing."""
        self.closed = True
        ptrs, events, self.ptrs, self.events, self.views = self.ptrs, self.events, [], [], []
        self.device_ptrs = []
        self.pending.clear()
        with self.ctx.on_device():
            for ev in events:
                self.rt.hipEventSynchronize(ev)
                self.rt.hipEventDestroy(ev)
            for ptr in ptrs:
                self.rt.hipHostFree(ptr)
