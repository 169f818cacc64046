"""The ``ref`` target: numpy kernels launched as host functions on a host queue.

Instruction kernels are enqueued with ``hipLaunchHostFunc`` on the context's queue, so graph capture
records them and a graph launch replays them: the same ``graph_launch`` state machine as on a GPU.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np

from ..graph.capture_queues import CaptureQueues
from ..ir.shape import Shape
from ..operators.base import numpy_reduce
from ..passes.pass_manager import PassGroup, PipelineOptions
from ..runtime import host_runtime
from .pipeline import pipeline as shared_pipeline


def pipeline(options: PipelineOptions) -> list[PassGroup]:
    """The ``ref`` compile pipeline (:func:`mgx_graph.targets.pipeline.pipeline`): group ``gemv`` runs
    ``fuse_gemv`` alone, and ``graph`` runs here too (host functions on a host queue capture and replay
    as a GPU stream does)."""
    return shared_pipeline("ref", options)


_IGNORE = dict(over="ignore", invalid="ignore", divide="ignore", under="ignore")


def _error_settings_reader():
    """A call returning an object that identifies numpy's current floating-point error settings: the
    value of numpy's context variable of them (one C call) where numpy has one (2.x), else
    ``numpy.geterr()`` as a tuple (public, slower)."""
    try:
        from numpy._core._ufunc_config import _extobj_contextvar

        return _extobj_contextvar.get
    except ImportError:
        return lambda: tuple(sorted(np.geterr().items()))


_error_settings = _error_settings_reader()


class _OpenBlocks(threading.local):
    top = None  # the innermost on_queue block this thread entered in full (any context), or None


_open = _OpenBlocks()


class _OnQueue:
    """The block of :meth:`RefContext.on_queue` (``numpy.errstate`` of :data:`_IGNORE`).

    Entered inside the block of the same context and queue this thread entered last, with numpy's
    error settings still the ones that block set (nothing changed them in between), it does nothing;
    otherwise it enters ``numpy.errstate`` and restores the caller's settings on exit."""

    __slots__ = ("ctx", "queue", "state", "outer", "settings")

    def __init__(self, ctx, queue):
        self.ctx, self.queue, self.state, self.outer, self.settings = ctx, queue, None, None, None

    def __enter__(self):
        top = _open.top
        if top is not None and top.ctx is self.ctx and top.queue == self.queue:
            cur = _error_settings()
            if cur is top.settings or cur == top.settings:
                return self  # nested: self.state stays None, exit does nothing
        state = np.errstate(**_IGNORE)
        state.__enter__()
        self.state, self.outer, self.settings = state, top, _error_settings()
        _open.top = self
        return self

    def __exit__(self, *exc):
        state = self.state
        if state is None:
            return False
        self.state = None
        _open.top = self.outer
        state.__exit__(*exc)
        return False


class RefContext:
    """The context of one compiled program on the host (device 0, the only one); ``queue``: as
    :class:`~mgx_graph.targets.gpu.GpuContext`'s (a queue kept by the giver, or None for its own)."""

    name = "ref"
    xp = np
    reduce = staticmethod(numpy_reduce)
    device_id = 0

    def __init__(self, device_id: int | None = None, queue: int | None = None, **options):
        self.runtime = host_runtime()
        self.owns_queue = queue is None
        self.queue = self.runtime.hipStreamCreate() if queue is None else int(queue)
        self._buffers: list[int] = []
        self._capture_queues = CaptureQueues(self.runtime)

    @contextlib.contextmanager
    def on_device(self):
        """The host is the only device: nothing to select."""
        yield

    def memory_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of host memory (``hipMemGetInfo`` of the host runtime)."""
        return self.runtime.hipMemGetInfo()

    # -- memory ----------------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> int:
        ptr = self.runtime.hipMalloc(nbytes)
        self._buffers.append(ptr)
        return ptr

    def array(self, ptr: int, offset: int, shape: Shape):
        buf = self.runtime.host_buffer(ptr)
        return np.ndarray(shape.lens, dtype=shape.np_dtype, buffer=buf, offset=offset, strides=shape.byte_strides())

    def upload(self, value: np.ndarray, ptr: int, offset: int):
        arr = self.array(ptr, offset, Shape(value.dtype.name, value.shape))
        arr[...] = value
        return arr

    @staticmethod
    def data_ptr(arr) -> int:
        return arr.__array_interface__["data"][0]

    def is_device_array(self, arr) -> bool:
        return isinstance(arr, np.ndarray)

    def to_host(self, arr, queue) -> np.ndarray:
        return np.array(arr, copy=True)

    def copy_from_host(self, dst, src: np.ndarray, queue) -> None:
        self.runtime.hipMemcpyAsync(dst, src, queue)

    @staticmethod
    def matmul(a, b, out) -> None:
        np.matmul(a, b, out=out)

    def copy(self, queue, dst, src) -> None:
        self.runtime.hipLaunchHostFunc(queue, np.copyto, (dst, src))

    def fill(self, queue, dst, value) -> None:
        self.runtime.hipLaunchHostFunc(queue, dst.fill, (value,))

    # -- execution -------------------------------------------------------------------------------
    def launch(self, queue, fn, out, args, ws) -> None:
        self.runtime.hipLaunchHostFunc(queue, fn, (self, out, args, ws))

    def on_queue(self, queue):
        """numpy's floating-point errors are ignored for the block (IEEE overflow to inf, e.g. a float32
        mask of -3.4e38 in float16, is intended, as on a GPU); nested in a block of the same context
        and queue with those settings still current, it does nothing (:class:`_OnQueue`)."""
        return _OnQueue(self, queue)

    @contextlib.contextmanager
    def capture_guard(self, where: str):
        yield

    def synchronize(self, queue) -> None:
        self.runtime.hipStreamSynchronize(queue)

    def blas(self, queue):
        return None

    def capture_queue(self, queue) -> int:
        """The private queue the captures of work for ``queue`` record on (:mod:`.capture_queues`, as
        the gpu target's)."""
        return self._capture_queues.get(queue)

    def describe(self) -> dict:
        import platform

        return {"target": "ref", "platform": "host", "cpu": platform.processor() or platform.machine()}

    def close(self, queues=(), before=None) -> None:
        """Free every buffer and destroy the queue (when the context created it), after calling ``before()``
        (e.g. graph exec teardown).

        While a capture is open on the queue, on one of ``queues`` (other queues the program ran on) or
        on any queue a capture was begun on through the runtime, nothing is freed yet (``hipFree``
        during a capture would invalidate it): the runtime holds the release and makes it when those
        captures end (:meth:`Runtime.release_after_capture`)."""
        self.runtime.release_after_capture({self.queue, *queues} | self._capture_queues.queues(),
                                           lambda: self._release(before))

    def _release(self, before) -> None:
        rt = self.runtime
        if before is not None:
            before()
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
