"""The pipelined steps of :class:`mgx_graph.llm.decoder.Decoder`: one row decoded with each step's id chosen on
the device (the greedy argmax, or :mod:`mgx_graph.llm.sampling`'s rule) and written into the next step's
``input_ids``, read back while the next step is already queued."""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..errors import MgxError, ParameterError
from ..operators.index_ops import FLOATS, ArgmaxAdvance


class PipelinedSteps:
    """Mixed into :class:`~mgx_graph.llm.decoder.Decoder` (its ``params``, ``ctx``, ``queue``, ``position``,
    ``max_len``, ``last_logits``, ``rows_interface``, ``_chain``, ``_advance`` and ``_run_at_position``)."""

    # the decoder's attributes this mixin uses (set by Decoder.__init__)
    ctx: Any
    queue: Any
    params: dict
    batch: int
    vocab_size: int
    position: int
    max_len: int
    rows_interface: bool
    last_logits: Any
    _chain: Callable[[], Any] | None  # weak reference to the open greedy_tokens generator
    _slot_written: tuple | None

    if TYPE_CHECKING:  # the decoder's (and SampledSteps') methods this mixin uses
        def _run_at_position(self, q) -> None: ...

        def _queue_sample_tail(self, sampler, reader) -> None: ...

        def _argmax_into(self, out) -> None: ...

        def _check_open(self) -> None: ...

    def greedy_tokens(self, token: int, count: int):
        """Greedy decoding of up to ``count`` ids from ``token``, fed at slot :attr:`position` of a
        one-row step, pipelined: each step's argmax is written on the device into ``input_ids`` (the
        next step's input) and read back through page-locked memory
        (:class:`~mgx_graph.targets.host_reader.HostReader`) while the next step is already queued,
        so the host's work for a step overlaps the device's run of the step before it.

        A generator of ints.  Closing it early (``close()``, leaving a ``for`` loop) waits for the
        step queued ahead, which wrote the slot after the last id yielded; :attr:`position` then
        counts the slots of the ids consumed (the next feed writes that slot again), unless it was
        set in the meantime.  Another ``greedy_tokens`` call, :meth:`feed`, :meth:`step` and
        :meth:`reset` close an open generator first (it then yields nothing more), so two never
        share the read-back buffers; :attr:`params` must not be written while it is open (the step
        queued next takes its slot from the step before on the device).  It ends early when the cache
        is full.  :attr:`last_logits`
        belongs to the step queued ahead, not to the last id yielded.  Raises MgxError on a step
        of several rows."""
        return self.sampled_tokens(token, count, None)

    def sampled_tokens(self, token: int, count: int, sampler):
        """:meth:`greedy_tokens` with the next id chosen by ``sampler`` (a
        :class:`~mgx_graph.llm.sampling.TokenSampler` of one row, fresh: its seen mask is the prompt's;
        None: greedy), by the rule's kernels on the device (gpu:
        :class:`~mgx_graph.operators.token_sampling_gpu.SampleAdvance`) or by the sampler on the host
        (ref), so a sampled row pipelines as a greedy one.  Each step advances ``sampler.step``."""
        if self.rows_interface:
            raise MgxError(f"this decode step takes {self.batch} rows with an attention mask: use Decoder.feed")
        check_token(token, self.vocab_size)
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise ParameterError(f"count must be an int >= 0, got {count!r}")
        self._check_open()
        self._end_chain()
        chain = self._greedy_chain(int(token), int(count), sampler)
        self._chain = weakref.ref(chain)
        return chain

    def _end_chain(self) -> None:
        """Close the open :meth:`greedy_tokens` generator, if any."""
        chain = self._chain() if self._chain is not None else None
        self._chain = None
        if chain is not None:
            chain.close()

    def _greedy_chain(self, token: int, count: int, sampler=None):
        reader = self._id_reader()
        start, queued, yielded = self.position, 0, 0
        try:
            self._queue_greedy_step(token, reader, sampler)
            queued = 1
            while yielded < queued:
                if queued < count and self.position < self.max_len:
                    self._queue_greedy_step(None, reader, sampler)
                    queued += 1
                tok = int(reader.wait().reshape(-1)[0])
                yielded += 1
                yield tok
        finally:
            while reader.pending:
                reader.wait()
            if self.position == start + queued:  # not set by the caller since
                self.position = start + yielded
            self._slot_written = None  # the caller may write params between calls: the next step fills

    def _id_reader(self):
        r = getattr(self, "_reader", None)
        if r is None:
            make = getattr(self.ctx, "host_reader", None)
            shape = self.params["input_ids"].shape
            r = self._reader = make(shape, np.int64) if make is not None else _CopyReader(self.ctx)
        return r

    def _queue_greedy_step(self, token, reader, sampler=None) -> None:
        """Queue one step (``token`` None: its id is already in ``input_ids``), its argmax (or the id
        ``sampler`` chooses: :meth:`_queue_sample_tail`) into ``input_ids`` and the read-back of that id."""
        self._check_open()  # a generator made before the program was released writes nothing after it
        if self.position >= self.max_len:
            raise MgxError(f"the KV cache is full ({self.max_len} positions)")
        p, ctx, q = self.params, self.ctx, self.queue
        ids = p["input_ids"]
        with ctx.on_queue(q):
            if token is not None:
                ids.fill(int(token))
            self._run_at_position(q)
            tail = self._greedy_tail(reader) if sampler is None else None
            if sampler is not None:
                self._queue_sample_tail(sampler, reader)
            elif tail is not None:  # one kernel: the id into input_ids and the reader, the next slot
                slot, logits, nxt = p["cache_position"], self.last_logits, self.position + 1
                reader.start_written(lambda host: tail(logits, ids, host, slot, nxt), q)
                self._slot_written = (slot, nxt)
            else:
                self._argmax_into(ids.reshape(1))
                reader.start(ids, q)
        self.position += 1

    def _greedy_tail(self, reader):
        """The :class:`~mgx_graph.operators.index_ops.ArgmaxAdvance` of this step's logits when the
        reader takes kernel-written results (page-locked memory, gpu), the logits are one contiguous
        float row and ``input_ids`` / ``cache_position`` are int64 (the kernel writes one int64 to each),
        else None (argmax, then a read-back copy)."""
        logits, p = self.last_logits, self.params
        if not getattr(reader, "kernel_writable", False) or logits.dtype.name not in FLOATS or \
                not logits.flags.c_contiguous or p["input_ids"].dtype != np.int64 or \
                p["cache_position"].dtype != np.int64:
            return None
        tail = self._advance
        if tail is None or tail.dtype != logits.dtype or tail.n != logits.size:
            tail = self._advance = ArgmaxAdvance(self.ctx, logits.size, logits.dtype)
        return tail


def check_token(token, vocab: int) -> None:
    if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= token < vocab:
        raise ParameterError(f"token must be a token id in 0..{vocab - 1}, got {token!r}")


class _CopyReader:
    """:class:`~mgx_graph.targets.host_reader.HostReader`'s interface on a context without page-locked
    read-back (``ref``): the copy is made at ``start``."""

    def __init__(self, ctx):
        self.ctx, self.pending = ctx, []

    def start(self, arr, queue) -> None:
        self.pending.append(np.asarray(self.ctx.to_host(arr, queue)).copy())

    def wait(self) -> np.ndarray:
        return self.pending.pop(0)
