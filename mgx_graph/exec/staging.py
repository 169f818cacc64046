"""Input staging: inputs that overlap the program's own memory are copied into its parameter buffers.

A compiled program owns three device allocations: the scratch arena (every intermediate, every
output, kernel workspaces), the literal area and the parameter area (the parameter buffers that
``run`` uploads into); string (object) values live on the host and are not checked.  A
``run_async`` input that lies in any of them (an output of an earlier run fed back, a view into one,
a parameter buffer passed for another parameter) could be overwritten before the run has read it:
the kernels of the run write the arena, and staging writes parameter buffers.  Such an input is
*staged* at bind time: copied on the run's queue into the parameter's own buffer, which the run then
reads instead.  The copy is ordered after the earlier run that produced the value and before every
kernel of this run, on the eager and the graph path alike (a staged input always binds the same
pointer, so a graph captured for it replays).

An input that is exactly its parameter's own buffer (``program.param_buffer(name)``) is never
staged; neither is memory the program does not own, e.g. a KV cache the caller bound with
``alias=`` and passes back every step.

The check is a comparison of each input's byte range ``[data_ptr, data_ptr + nbytes)`` with the
owned ranges, computed once; the verdict for an input array is remembered while the same array
object is passed again for the same parameter (an array's data pointer and size cannot change
while it is referenced).
"""
from __future__ import annotations


def byte_span(ptr: int, a) -> tuple[int, int]:
    """``[lo, hi)``: the bytes array ``a`` (data pointer ``ptr``, any strides) may touch."""
    if a.flags.c_contiguous or a.size == 0:
        return ptr, ptr + a.nbytes
    lo = hi = ptr
    for d, st in zip(a.shape, a.strides):
        if st < 0:
            lo += (d - 1) * st
        else:
            hi += (d - 1) * st
    return lo, hi + a.itemsize


class InputStaging:
    """The owned byte ranges of one executor and the per-call overlap check.

    ``ranges``: ``[(lo, hi)]`` byte ranges (device pointers, ``hi`` exclusive) the program owns;
    ``own``: parameter slot -> ``(data pointer, buffer)`` of that parameter's own buffer.
    """

    __slots__ = ("ctx", "ranges", "lo", "hi", "own", "param_range", "_verdicts")

    def __init__(self, ctx, ranges, own, param_range):
        self.ctx = ctx
        self.ranges = tuple(sorted((int(lo), int(hi)) for lo, hi in ranges if hi > lo))
        self.lo = min((lo for lo, _ in self.ranges), default=0)
        self.hi = max((hi for _, hi in self.ranges), default=0)
        self.own = own
        self.param_range = param_range
        self._verdicts: dict = {}

    @classmethod
    def for_executor(cls, ex) -> "InputStaging":
        """Collect the owned ranges of a finalized :class:`~mgx_graph.exec.executor.Executor`."""
        ctx, plan = ex.ctx, ex.plan
        ptr = ctx.data_ptr
        ranges = []
        if ex.arena is not None:
            ranges.append((ex.arena, ex.arena + plan.arena_bytes))
        if ex.literals is not None:
            ranges.append((ex.literals, ex.literals + plan.literal_bytes))
        own = {}
        param_hi = ex.param_area
        for name, s, shape in ex.param_specs:
            buf = ex.param_buffers[name]
            if shape.dtype == "object":
                continue
            own[s] = (ptr(buf), buf)
            param_hi = max(param_hi, ptr(buf) + buf.nbytes)
        param_range = (ex.param_area, param_hi)
        ranges.append(param_range)
        return cls(ctx, ranges, own, param_range)

    def overlaps(self, a) -> bool:
        """Whether the bytes of array ``a`` (any layout) share any byte with the owned ranges."""
        p, e = byte_span(self.ctx.data_ptr(a), a)
        if p >= self.hi or e <= self.lo:
            return False
        return any(p < hi and e > lo for lo, hi in self.ranges)

    def check(self, values) -> list:
        """``values``: ``[(slot, array)]`` of validated device inputs; returns ``[(slot, array, buffer)]``
        of those to stage (empty in the usual case).  No state of the program is touched."""
        verdicts, ptr, lo, hi = self._verdicts, self.ctx.data_ptr, self.lo, self.hi
        staged = []
        for s, a in values:
            hit = verdicts.get(s)
            if hit is None or hit[0] is not a:
                p = ptr(a)
                far = p >= hi or p + a.nbytes <= lo  # outside the span of all owned ranges
                hit = verdicts[s] = (a, False if far else self._needs_staging(s, a, p))
            if hit[1]:
                staged.append((s, a, self.own[s][1]))
        return staged

    def _needs_staging(self, s, a, p) -> bool:
        own = self.own.get(s)
        if own is None or not self.overlaps(a):
            return False  # host strings, or memory the program does not own
        return p != own[0]  # exactly its own buffer (shape and dtype were checked before)

    def stage(self, queue, staged, env) -> None:
        """Copy each staged input into its parameter buffer on ``queue`` and bind the buffer.

        A source inside the parameter area may be the destination of another staged input: such
        sources are copied aside first (in stream order), so every copy reads the caller's value."""
        ctx = self.ctx
        lo, hi = self.param_range
        ptr = ctx.data_ptr
        srcs = []
        with ctx.on_queue(queue):
            for s, a, buf in staged:
                p = ptr(a)
                srcs.append(ctx.xp.array(a, copy=True) if p < hi and p + a.nbytes > lo else a)
        for (s, _, buf), src in zip(staged, srcs):
            ctx.copy(queue, buf, src)
            env[s] = buf

    def clear(self) -> None:
        self._verdicts = {}
