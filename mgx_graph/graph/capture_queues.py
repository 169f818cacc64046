"""The private queues a context's graph captures record on.

A ``graph_launch`` region records its capture on a queue of the context's own, one per queue the
program runs on, created non-blocking (``hipStreamNonBlocking``), and launches the graph exec on the
program's queue.  The program's queues are blocking (ordered with the legacy default stream, so a
caller's CuPy or PyTorch work there is ordered with the program's runs); but while a blocking queue
is being captured, any use of the legacy default stream in the process, from any thread, is refused
and invalidates the capture (CUDA programming guide, "Stream capture": cross-stream dependencies and
the legacy stream).  A non-blocking queue has no such tie, so another thread's ``cupy.zeros`` during
a capture neither fails nor spoils it; PyTorch's ``torch.cuda.graph`` captures on a side stream too.

Nothing runs on a capture queue: it only records, so it needs no ordering with the program's queue
(the graph's launch is ordered there as any work).  Each is created outside any capture, with
whatever the context prepares for it (the gpu target: a BLAS handle and its workspace, which cannot
be allocated during a capture): the executor makes the one of the program's queue at finalize, a
region the one of another queue at its first capture there; all are destroyed with the context.
Stream APIs are called through the runtime layer (:mod:`mgx_graph.runtime`) only.
"""
from __future__ import annotations

import threading

from ..runtime import hipStreamNonBlocking


class CaptureQueues:
    """The capture queues of one context: ``get(queue)`` gives (creating it at the first call) the
    non-blocking queue captures of work for ``queue`` record on; ``prepare(queue)`` is called on a
    new one before it is returned.  ``get`` raises DeviceError when the runtime cannot create a queue,
    or what ``prepare`` raised (nothing is kept then)."""

    def __init__(self, runtime, prepare=None):
        self.runtime, self.prepare = runtime, prepare
        self._queues: dict[int, int] = {}
        self._lock = threading.Lock()

    def get(self, queue) -> int:
        q = self._queues.get(queue)
        if q is not None:
            return q
        with self._lock:
            q = self._queues.get(queue)
            if q is None:
                q = self.runtime.hipStreamCreate(hipStreamNonBlocking)
                try:
                    if self.prepare is not None:
                        self.prepare(q)
                except BaseException:
                    self.runtime.hipStreamDestroy(q)
                    raise
                self._queues[queue] = q
            return q

    def queues(self) -> set[int]:
        """Every capture queue created and not yet destroyed."""
        return set(self._queues.values())

    def destroy(self) -> None:
        """Destroy every capture queue (errors ignored: the context is going away)."""
        with self._lock:
            queues, self._queues = list(self._queues.values()), {}
        for q in queues:
            try:
                self.runtime.hipStreamDestroy(q)
            except Exception:
                pass
