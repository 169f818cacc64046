"""The sampled steps of :class:`mgx_graph.llm.decoder.Decoder`: the id chosen by :mod:`mgx_graph.llm.sampling`'s
rule after the program's logits, by the rule's kernels on a device target
(:class:`~mgx_graph.operators.token_sampling_gpu.SampleAdvance`, no logits read) or by the host rule on
the read logits (``ref``)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..operators.index_ops import FLOATS
from ..operators.token_sampling_gpu import SampleAdvance


class SampledSteps:
    """Mixed into :class:`~mgx_graph.llm.decoder.Decoder` (its ``params``, ``ctx``, ``queue``, ``last_logits``,
    ``batch``, ``vocab_size``, ``_sample`` and ``_seen_of``)."""

    # the decoder's attributes this mixin uses (set by Decoder.__init__)
    xp: Any
    ctx: Any
    queue: Any
    params: dict
    batch: int
    vocab_size: int
    position: int
    rows_interface: bool
    last_logits: Any
    _slot_written: tuple | None

    if TYPE_CHECKING:  # the decoder's methods this mixin uses
        @property
        def host_op_parts(self) -> tuple: ...

        def logits_rows(self) -> np.ndarray: ...

        def _check_open(self) -> None: ...

    def sample_op_parts(self, do_sample: bool) -> tuple:
        """:attr:`host_op_parts` of a sampled (or, ``do_sample`` False, penalized greedy) generation with
        the choice of the id: on ``ref`` the logits read back for the host rule; on a device target the
        rule's kernels (four; penalized greedy: one), which for one row with page-locked read-back also
        write the id's host copy and the next slot (:meth:`sampled_tokens`)."""
        if self.xp is np:
            return (*self.host_op_parts, (1, "logits read-back"))
        kernels = (4 if do_sample else 1, "sampling kernels")
        if self.rows_interface:
            return (*self.host_op_parts, kernels, (1, "read-back copy"))
        return (kernels,) if getattr(self.ctx, "host_reader", None) is not None else \
            ((1, "fill"), kernels, (1, "read-back copy"))

    def _sample_kernel(self, sampler):
        """The :class:`~mgx_graph.operators.token_sampling_gpu.SampleAdvance` for the last logits on a
        device target (float rows in standard layout), holding ``sampler``'s seen mask, or None (the
        host rule: ``ref``)."""
        logits = self.last_logits
        if self.xp is np or logits.dtype.name not in FLOATS or not logits.flags.c_contiguous:
            return None
        dev = self._sample
        if dev is None or dev.dtype != logits.dtype:
            dev = self._sample = SampleAdvance(self.ctx, self.batch, self.vocab_size, logits.dtype)
            self._seen_of = None
        if self._seen_of is not sampler:  # a new generation: its prompts' seen mask
            if sampler.seen is not None:
                dev.set_seen(sampler.seen, self.queue)
            self._seen_of = sampler
        return dev

    def _queue_sample_tail(self, sampler, reader) -> None:
        """Queue the sampled (or penalized greedy) id of the last step into ``input_ids`` and its
        read-back through ``reader``, inside ``on_queue``: the rule's kernels on a device target (the id
        written into page-locked memory where the reader takes it, with the next slot), else the host
        rule on the read logits (the id then marked seen at once: the next step is chosen before the
        caller sees this id)."""
        ids, q = self.params["input_ids"], self.queue
        dev = self._sample_kernel(sampler)
        if dev is None:
            chosen = sampler.choose(self.logits_rows())
            sampler.observe(0, chosen[:1])
            self.ctx.copy_from_host(ids, chosen.reshape(ids.shape), q)
            reader.start(ids, q)
            return
        logits, cfg, seed, step = self.last_logits, sampler.config, sampler.seed, sampler.next_step()
        if getattr(reader, "kernel_writable", False):
            slot, nxt = self.params["cache_position"], self.position + 1
            reader.start_written(lambda host: dev(logits, ids, cfg, seed, step, host, slot, nxt), q)
            self._slot_written = (slot, nxt)
        else:
            dev(logits, ids, cfg, seed, step)
            reader.start(ids, q)

    def sample_next(self, sampler) -> np.ndarray:
        """The ids ``sampler`` chooses from the last step's logits (int64 [B]), by the rule's kernels on a
        device target (one read-back of B ids, no logits read) or on the host (ref).  The device keeps
        its own seen mask, taken from ``sampler`` at the first call of a generation and updated with each
        id; ``sampler.step`` advances."""
        self._check_open()
        with self.ctx.on_queue(self.queue):
            dev = self._sample_kernel(sampler)
            if dev is None:
                return sampler.choose(self.logits_rows())
            ids = self.xp.empty((self.batch,), np.int64)
            dev(self.last_logits, ids, sampler.config, sampler.seed, sampler.next_step())
            return np.asarray(self.ctx.to_host(ids, self.queue), np.int64).reshape(-1)
