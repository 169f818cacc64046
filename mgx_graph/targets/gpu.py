"""The ``gpu`` target: CuPy kernels and vendor BLAS on a GPU stream (CUDA or HIP).

Every device buffer of a compiled program comes from ``hipMalloc`` through the runtime layer before
the first run and is wrapped as a CuPy array; kernels run on the context's queue (a CuPy
``ExternalStream`` over the runtime's stream).  During a capture a guard allocator is installed for
CuPy: any allocation attempt raises, which ends the capture cleanly and makes the region fall back to
eager (and names the instruction at fault).
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np

from ..errors import CaptureError
from ..graph.capture_queues import CaptureQueues
from ..ir.shape import Shape
from ..passes.pass_manager import PassGroup, PipelineOptions
from ..runtime import device_runtime
from ..runtime.blas import Blas
from .pipeline import pipeline as shared_pipeline


def pipeline(options: PipelineOptions) -> list[PassGroup]:
    """The ``gpu`` compile pipeline (:func:`mgx_graph.targets.pipeline.pipeline`): group ``layout``
    stores one-row ``dot`` weights transposed for the gemv kernel before ``fuse_gemv``."""
    return shared_pipeline("gpu", options, gemv_layout=True)


class _Guard(threading.local):
    where = ""


_guard = _Guard()


def _refuse_alloc(nbytes):
    raise CaptureError("device allocation", "hipErrorStreamCaptureUnsupported",
                       f"{nbytes} bytes requested during capture by {_guard.where or 'an instruction'}")


class _StreamRef:
    """A stream handle exposing the CUDA stream protocol (``__cuda_stream__``)."""

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


def _external_stream(cupy, ptr: int):
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        try:
            return from_external(_StreamRef(ptr))
        except Exception:
            pass
    return cupy.cuda.ExternalStream(ptr)


class _OnDevice:
    """The block of :meth:`GpuContext.on_device` (a plain context manager: no generator per use)."""

    __slots__ = ("rt", "device", "prev")

    def __init__(self, rt, device: int):
        self.rt, self.device, self.prev = rt, device, None

    def __enter__(self):
        cur = self.rt.current_device()
        if cur != self.device:
            self.rt.hipSetDevice(self.device)
            self.prev = cur
        return self

    def __exit__(self, *exc):
        if self.prev is not None:
            prev, self.prev = self.prev, None
            self.rt.hipSetDevice(prev)
        return False


class _OpenBlocks(threading.local):
    top = None  # the innermost on_queue block this thread entered in full (any context), or None


_open = _OpenBlocks()


class _OnQueue:
    """The block of :meth:`GpuContext.on_queue`: the program's device, then (made on that device the
    first time) the queue's CuPy stream.

    Entered inside a block of the same context and queue that this thread entered last (the innermost
    one), while that block's CuPy stream and the program's device are still current, it does nothing
    (entering would set what is already set and restore it on exit): a decode loop that wraps its
    ``run_async`` in ``on_queue(q)`` pays for one block, not two.  Otherwise it enters in full."""

    __slots__ = ("ctx", "queue", "device", "stream", "outer")

    def __init__(self, ctx, queue):
        self.ctx, self.queue, self.device, self.stream, self.outer = ctx, queue, None, None, None

    def __enter__(self):
        ctx = self.ctx
        top = _open.top
        if (top is not None and top.ctx is ctx and top.queue == self.queue
                and ctx.cupy.cuda.get_current_stream() is top.stream
                and ctx.runtime.current_device() == ctx.device_id):
            return self  # nested: self.device stays None, exit does nothing
        device = _OnDevice(ctx.runtime, ctx.device_id)
        device.__enter__()
        try:
            stream = ctx._stream(self.queue)
            stream.__enter__()
        except BaseException:
            device.__exit__(None, None, None)
            raise
        self.device, self.stream, self.outer = device, stream, top
        _open.top = self
        return self

    def __exit__(self, *exc):
        device = self.device
        if device is None:
            return False
        self.device = None
        _open.top = self.outer
        try:
            self.stream.__exit__(*exc)
        finally:
            device.__exit__(*exc)
        return False


class GpuContext:
    """The context of one compiled program on device ``device_id`` (None: the current device).

    Its queue, allocations and library handles live on that device: every call that creates or uses
    them runs under :meth:`on_device`, which makes the device current (``hipSetDevice``) and restores
    the caller's current device after, so a program on device 1 leaves a caller on device 0 there.

    ``queue``: a queue to run on that stays the giver's (the specializations of one dynamic-shape
    program share their dispatcher's queue); None creates one, which :meth:`close` destroys."""

    name = "gpu"

    def __init__(self, device_id: int | None = None, queue: int | None = None, **options):
        import cupy

        self.cupy = cupy
        self.xp = cupy
        self.runtime = device_runtime()
        self.device_id = self.runtime.hipGetDevice() if device_id is None else int(device_id)
        self._buffers: list[int] = []
        self._streams: dict[int, object] = {}
        self._blas: dict[int, Blas] = {}
        self._readers: list = []
        self._capture_queues = CaptureQueues(self.runtime, self._prepare_capture_queue)
        self.owns_queue = queue is None
        with self.on_device():
            self.queue = self.runtime.hipStreamCreate() if queue is None else int(queue)

    def on_device(self):
        """Make the program's device current for the block (``hipSetDevice``), then restore the one
        that was current (nothing is set when it is the same device: one cheap query of the current
        device, :meth:`Runtime.current_device`)."""
        return _OnDevice(self.runtime, self.device_id)

    def memory_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of the program's device (``hipMemGetInfo``)."""
        with self.on_device():
            return self.runtime.hipMemGetInfo()

    # -- memory ----------------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> int:
        with self.on_device():
            ptr = self.runtime.hipMalloc(nbytes)
        self._buffers.append(ptr)
        return ptr

    def array(self, ptr: int, offset: int, shape: Shape):
        cp = self.cupy
        nbytes = max(shape.bytes(), 1)
        mem = cp.cuda.UnownedMemory(ptr + offset, nbytes, self, self.device_id)
        return cp.ndarray(shape.lens, dtype=shape.np_dtype, memptr=cp.cuda.MemoryPointer(mem, 0),
                          strides=shape.byte_strides())

    def upload(self, value: np.ndarray, ptr: int, offset: int):
        arr = self.array(ptr, offset, Shape(value.dtype.name, value.shape))
        with self.on_queue(self.queue):
            arr.set(np.asarray(value, order="C"))
        return arr

    @staticmethod
    def data_ptr(arr) -> int:
        return arr.data.ptr

    def is_device_array(self, arr) -> bool:
        return isinstance(arr, self.cupy.ndarray)

    def to_host(self, arr, queue) -> np.ndarray:
        with self.on_queue(queue):
            return arr.get()

    def host_reader(self, shape, dtype, depth: int = 2):
        """A :class:`~mgx_graph.targets.host_reader.HostReader` of ``depth`` page-locked buffers of
        ``shape`` / ``dtype`` (freed with the context)."""
        from .host_reader import HostReader

        r = HostReader(self, shape, dtype, depth)
        self._readers.append(r)
        return r

    def copy_from_host(self, dst, src: np.ndarray, queue) -> None:
        if dst.size == 0:
            return
        with self.on_queue(queue):
            dst.set(np.asarray(src, order="C"))

    def copy(self, queue, dst, src) -> None:
        with self.on_queue(queue):
            self.cupy.copyto(dst, src)

    def fill(self, queue, dst, value) -> None:
        with self.on_queue(queue):
            dst.fill(value)

    # -- execution -------------------------------------------------------------------------------
    def launch(self, queue, fn, out, args, ws) -> None:
        fn(self, out, args, ws)

    def matmul(self, a, b, out) -> None:
        """``out = a @ b`` through the vendor BLAS (layouts read from the arrays; no allocation)."""
        from ..operators.gpu import blas_matmul

        blas_matmul(self, a, b, out)

    @staticmethod
    def reduce(kind: str, x, axes, out) -> None:
        """One reduction kernel into ``out`` (keepdims shape); never allocates (no CUB temporaries; a
        reduction of every element runs as one block of our own, CuPy's reduces large arrays in two
        passes over a temporary)."""
        from ..operators.gpu import full_reduction, reduction_kernel

        if x.dtype.kind == "b":  # bool: any / all (CuPy's own reductions; eager only)
            import cupy

            fn = {"max": cupy.any, "min": cupy.all}.get(kind)
            if fn is None:
                raise TypeError(f"no {kind} reduction of bool values")
            out[...] = fn(x, axis=tuple(axes), keepdims=True)
            return
        if len(axes) == x.ndim and full_reduction(kind, x, out):
            return
        reduction_kernel(kind, x.dtype.name)(x, out=out, axis=tuple(axes), keepdims=True)

    def _stream(self, queue):
        s = self._streams.get(queue)
        if s is None:
            s = self._streams[queue] = _external_stream(self.cupy, int(queue))
        return s

    def on_queue(self, queue):
        """CuPy's current stream is ``queue`` (and the program's device current) for the block."""
        return _OnQueue(self, queue)

    @contextlib.contextmanager
    def capture_guard(self, where: str):
        _guard.where = where
        with self.cupy.cuda.using_allocator(_refuse_alloc):
            yield
        _guard.where = ""

    def set_guard_where(self, where: str) -> None:
        _guard.where = where

    def synchronize(self, queue) -> None:
        self.runtime.hipStreamSynchronize(queue)

    def capture_queue(self, queue) -> int:
        """The private non-blocking queue the captures of work for ``queue`` record on
        (:mod:`.capture_queues`; made with its BLAS handle at the first call, destroyed with the
        context).  Raises DeviceError, or the BLAS binding's own error, when it cannot be made."""
        with self.on_device():
            return self._capture_queues.get(queue)

    def _prepare_capture_queue(self, q) -> None:
        if self._blas:  # the program calls BLAS: the capture queue's handle is made now, outside the capture
            self.blas(q)

    def blas(self, queue):
        b = self._blas.get(queue)
        if b is None:
            with self.on_device():
                b = self._blas[queue] = Blas(self.runtime, queue)
        return b

    def describe(self) -> dict:
        d = {"target": "gpu", "platform": self.runtime.platform, "device_id": self.device_id}
        try:
            with self.on_device():
                d["device"] = self.runtime.device_name()
                d["runtime"] = self.runtime.runtime_version()
                d["memory_total_bytes"] = self.runtime.hipMemGetInfo()[1]
        except Exception:
            pass
        d["cupy"] = self.cupy.__version__
        return d

    def close(self, queues=(), before=None) -> None:
        """Synchronize the queue and ``queues`` (other queues the program ran on), call ``before()``
        (e.g. graph exec teardown), destroy the BLAS handles, free every buffer, destroy the capture
        queues and the queue (when the context created it).

        While a capture is open on any of those queues, or on any queue a capture was begun on through
        the runtime (another program's region: a release run by the garbage collector may run on the
        capturing thread), nothing is synchronized or freed yet (either would invalidate the capture):
        the runtime holds the release and makes it when those captures end
        (:meth:`Runtime.release_after_capture`)."""
        watch = {self.queue, *queues}
        self.runtime.release_after_capture(watch | self._capture_queues.queues(),
                                           lambda: self._release(watch, before))

    def _release(self, queues, before) -> None:
        with self.on_device():
            self._release_on_device(queues, before)

    def _release_on_device(self, queues, before) -> None:
        rt = self.runtime
        for q in queues:
            if not rt.queue_alive(q):
                continue
            try:
                rt.hipStreamSynchronize(q)
            except Exception:
                pass
        if before is not None:
            before()
        for b in self._blas.values():
            b.close()
        self._blas = {}
        for r in self._readers:
            try:
                r.close()
            except Exception:
                pass
        self._readers = []
        for p in self._buffers:
            try:
                rt.hipFree(p)
            except Exception:
                pass
        self._buffers = []
        self._capture_queues.destroy()
        if not self.owns_queue:
            return
        try:
            rt.hipStreamDestroy(self.queue)
        except Exception:
            pass
