"""The decode step runner: a compiled fixed-shape decode step (:mod:`mgx_graph.llm.generation`'s two step
interfaces) run one slot at a time over a KV cache allocated once on the device.

:class:`Decoder` owns the step's parameter buffers (the step inputs rewritten in place each step and
the cache bound once as the program's state), feeds tokens (:meth:`Decoder.feed`, :meth:`Decoder.step`)
and runs a greedy row pipelined (:meth:`Decoder.greedy_tokens`).  The generation loop over it
(prompts, sampling, stop strings) is :func:`mgx_graph.llm.generation.generate`.
"""
from __future__ import annotations

import contextlib
import time

import numpy as np

from ..errors import MgxError, ParameterError
from ..operators.index_ops import FLOATS, argmax_rows
from .decoder_pipeline import PipelinedSteps, check_token
from .decoder_sampling import SampledSteps
from .prefill import DEFAULT_CHUNK, Prefill, plan_runs

ONE_ROW_INPUTS = ("input_ids", "cache_position")
ROWS_INPUTS = ("input_ids", "cache_position", "attention_mask", "position_ids")


def program_alias(program) -> dict:
    """``{output name: parameter name}`` that ``program`` writes in place (its KV cache binding)."""
    return dict(program.alias)


class Decoder(PipelinedSteps, SampledSteps):
    """Runs a compiled decode step (a :class:`~mgx_graph.exec.compiled.CompiledProgram`) one slot at a time.

    ``program`` has the parameters of one of the two interfaces of the module docstring and an
    output ``logits`` ([B, 1, vocab]); every other parameter is cache state, which must be bound in
    place to an output (the program's alias). Every array lives in a buffer allocated once
    (``params``: the step inputs, rewritten in place each step, and the cache), so graph capture and
    replay see fixed pointers. A static program gets the cache arrays bound once as its state
    (:meth:`~mgx_graph.exec.compiled.CompiledProgram.bind_state`; the program reads and writes their
    memory) and each step passes only the step inputs (``step_params``); a dynamic one is passed every
    array each step.

    With ``prefill`` (the prefill step of the same model, ``ModelInfo.prefill_onnx_path``), prompts run in
    one program run per bucket of up to ``prefill_chunk`` tokens (:class:`~mgx_graph.llm.prefill.Prefill`,
    :meth:`prefill_tokens`) instead of one decode step per token; the buckets' programs read the decode
    step's weights and write this decoder's cache.

    Attributes: ``batch`` (rows B), ``vocab_size``, ``max_len`` (cache slots), ``position`` (slots
    written so far), ``last_logits`` (the device array of the last step's logits), ``last_host_s``,
    ``prefill`` (the :class:`~mgx_graph.llm.prefill.Prefill`, or None).
    Raises MgxError when the program does not have that interface, ParameterError for a bad
    ``prefill`` / ``prefill_chunk``.
    """

    def __init__(self, program, prefill=None, prefill_chunk: int = DEFAULT_CHUNK):
        if not callable(getattr(program, "get_parameter_shapes", None)):
            raise ParameterError(f"Decoder takes a compiled program (mgx_graph.compile), got {program!r:.80}")
        self.program = program
        shapes = program.get_parameter_shapes()
        self.rows_interface = "attention_mask" in shapes or "position_ids" in shapes
        inputs = ROWS_INPUTS if self.rows_interface else ONE_ROW_INPUTS
        for name in inputs:
            if name not in shapes:
                raise MgxError(f"decode step has no '{name}' parameter (parameters: {sorted(shapes)})")
        names = program.get_output_names()
        if "logits" not in names:
            raise MgxError(f"decode step has no 'logits' output (outputs: {names})")
        self.logits_index = names.index("logits")
        self.batch = int(shapes["input_ids"].lens[0])
        if self.batch != 1 and not self.rows_interface:
            raise MgxError(f"decode step input_ids has {self.batch} rows but no 'attention_mask' / 'position_ids' "
                           f"parameters (a step of several rows takes both)")
        self.vocab_size = int(program.get_output_shapes()[self.logits_index].lens[-1])
        bound = set(program_alias(program).values())
        state = [n for n in shapes if n not in inputs]
        unbound = [n for n in state if n not in bound]
        if unbound:
            raise MgxError(f"decode step state {unbound} is not bound in place to an output; compile with "
                           f"alias={{output: parameter}}")
        self.inputs = inputs
        ctx = program.context
        self.xp, self.ctx = ctx.xp, ctx
        self.queue = program.queue
        with ctx.on_queue(self.queue):
            self.params = {n: ctx.xp.zeros(shapes[n].lens, dtype=shapes[n].np_dtype) for n in shapes}
        ctx.synchronize(self.queue)
        self._state = {n: self.params[n] for n in state}
        self._serial = None  # the program's state_serial of the cache bound here (None: every array passed)
        self.step_params = self.params
        self._state_lock = contextlib.nullcontext()  # held across a step's rebind and run (bind_state)
        self._bind_cache()
        self.max_len = min(shapes[n].lens[2] for n in state) if state else 1 << 30
        if self.rows_interface:
            self.max_len = min(self.max_len, int(shapes["attention_mask"].lens[1]))
        self.position = 0
        self.last_logits = None
        self.last_host_s = 0.0
        self._chain = None  # weak reference to the open greedy_tokens generator
        self._slot_written = None  # (cache_position array, the slot queued into it), or None: unknown
        self._advance = None  # the ArgmaxAdvance of the greedy tail (gpu), made at its first use
        self._sample = None  # the SampleAdvance of the sampling tail (gpu), made at its first use
        self._seen_of = None  # the TokenSampler whose seen mask the device holds
        self.prefill = Prefill(self, prefill, prefill_chunk) if prefill is not None else None

    def _bind_cache(self) -> None:
        """A static program gets the cache arrays bound once as its state (``bind_state``) and each
        step passes only :attr:`step_params`; a dynamic one keeps taking every array."""
        bind = getattr(self.program, "bind_state", None)
        if bind is None or getattr(self.program, "dispatcher", None) is not None or not self._state:
            return
        self._serial = bind(self._state)
        self.step_params = {n: self.params[n] for n in self.inputs}
        lock = getattr(getattr(self.program, "executor", None), "lock", None)
        if lock is not None:  # the executor's lock: no other bind between this step's rebind and its run
            self._state_lock = lock

    def _step_params(self) -> dict:
        """What a step passes to ``run_async``: the step inputs, with the cache bound again when
        something else (another Decoder of the same program) bound other state since.  Called with
        the program's lock held (:meth:`_run_at_position`), so no other thread binds before the run."""
        if self._serial is not None and self.program.state_serial != self._serial:
            self._serial = self.program.bind_state(self._state)
        return self.step_params

    @property
    def host_op_parts(self) -> tuple:
        """The launches per step outside the program, as ``((count, what), ...)``: B rows: three
        host-to-device copies and one fill; one row: two fills (the next token's read is not included)."""
        return ((3, "copies"), (1, "fill")) if self.rows_interface else ((2, "fills"),)

    @property
    def greedy_op_parts(self) -> tuple:
        """:attr:`host_op_parts` of a greedy one-row generation (:meth:`greedy_tokens`), besides its
        argmax: on a target with page-locked read-back (gpu) none (the argmax kernel writes the id,
        its host copy and the next slot: :class:`~mgx_graph.operators.index_ops.ArgmaxAdvance`), else
        one fill (the slot) and the id's read-back copy; the id itself is written on the device."""
        if self.rows_interface:
            return self.host_op_parts
        return () if getattr(self.ctx, "host_reader", None) is not None else ((1, "fill"), (1, "read-back copy"))

    @property
    def host_ops(self) -> str:
        """:attr:`host_op_parts` as text (what the CLI reports next to launches/token)."""
        return describe_host_ops(self.host_op_parts)

    def reset(self) -> None:
        """Close an open :meth:`greedy_tokens` generator, zero every array of :attr:`params` (the step
        inputs and the cache, queued on the program's queue) and set :attr:`position` to 0."""
        self._check_open()
        self._end_chain()
        with self.ctx.on_queue(self.queue):
            for n, a in self.params.items():
                a.fill(0)
        self._slot_written = None
        self.position = 0

    def step(self, token: int, want_next: bool = True):
        """Feed ``token`` at the current position of a one-row step; returns the greedy next token
        id (or None). Raises MgxError on a step of several rows (use :meth:`feed`)."""
        if self.rows_interface:
            raise MgxError(f"this decode step takes {self.batch} rows with an attention mask: use Decoder.feed")
        check_token(token, self.vocab_size)
        self.feed(np.array([token], np.int64))
        return int(self.greedy_next()[0]) if want_next else None

    def feed(self, tokens, positions=None, mask=None) -> None:
        """Run the step at slot :attr:`position` (then advanced by one).

        ``tokens`` int [B]; for a step of several rows also ``positions`` int [B] (each row's
        position id) and ``mask`` int [B, max_len] (1 where a row attends to a slot). A one-row
        step ignores them (its position is the slot). Raises MgxError when the cache is full.
        """
        _check_rows(self, tokens, positions, mask)
        self._check_open()
        self._end_chain()
        if self.position >= self.max_len:
            raise MgxError(f"the KV cache is full ({self.max_len} positions)")
        p, ctx, q = self.params, self.ctx, self.queue
        with ctx.on_queue(q):
            if self.rows_interface:
                ctx.copy_from_host(p["input_ids"], np.ascontiguousarray(tokens, np.int64).reshape(self.batch, 1), q)
                ctx.copy_from_host(p["position_ids"], np.ascontiguousarray(positions, np.int64).reshape(self.batch, 1),
                                   q)
                ctx.copy_from_host(p["attention_mask"], np.ascontiguousarray(mask, np.int64), q)
            else:
                p["input_ids"].fill(int(np.asarray(tokens).reshape(-1)[0]))
            self._run_at_position(q)
        self.position += 1

    def _run_at_position(self, q) -> None:
        """Write the slot into ``cache_position``, run the program on ``q`` (the call timed into
        :attr:`last_host_s`) and keep its logits; inside ``on_queue(q)``.  The slot is not written
        again when the greedy tail of the step before, in the same open chain, queued it into the same
        array already (:meth:`_queue_greedy_step`).  Its callers (:meth:`feed`, :meth:`_queue_greedy_step`)
        check the program is open before they write the step's inputs."""
        slot, done = self.params["cache_position"], self._slot_written
        self._slot_written = None  # used once: by the step queued right after the tail
        if done is None or done[0] is not slot or done[1] != self.position:
            slot.fill(self.position)
        with self._state_lock:
            step = self._step_params()
            h0 = time.perf_counter()
            outs = self.program.run_async(step, q)
            self.last_host_s = time.perf_counter() - h0
        self.last_logits = outs[self.logits_index]

    def greedy_next(self) -> np.ndarray:
        """The argmax of the last step's logits per row (int64 [B]): one device argmax, one read-back of
        B ids (it waits for the step)."""
        self._check_open()
        with self.ctx.on_queue(self.queue):
            ids = self.xp.empty((self.batch,), np.int64)
            self._argmax_into(ids)
            return np.asarray(self.ctx.to_host(ids, self.queue), np.int64).reshape(-1)

    def _argmax_into(self, out) -> None:
        """``out`` (int64 [B]) = the argmax of each row of the last logits, on the current queue: one
        kernel of the target (:func:`~mgx_graph.operators.index_ops.argmax_rows`) for float rows in
        standard layout, else the array library's argmax."""
        rows = self.last_logits.reshape(out.shape[0], -1)
        if rows.dtype.name in FLOATS and rows.flags.c_contiguous and out.flags.c_contiguous:
            argmax_rows(self.ctx, rows, out)
        else:
            self.xp.argmax(rows, axis=1, out=out)

    def logits_rows(self) -> np.ndarray:
        """The last step's logits as host float32 [B, vocab] (one read-back of B * vocab values; it
        waits for the step)."""
        self._check_open()
        host = self.ctx.to_host(self.last_logits, self.queue)
        return np.asarray(host, np.float32).reshape(self.batch, -1)

    def prefill_tokens(self, tokens, start: int = 0, positions=None, mask=None) -> None:
        """Write ``tokens`` (int [B, n], one row: a list) into the cache from slot ``start`` in one run per
        bucket (:meth:`~mgx_graph.llm.prefill.Prefill.run`: ``positions`` [B, n] and ``mask`` [B, max_len]
        for several rows); :attr:`last_logits` then holds the logits of the last token and :attr:`position`
        is ``start + n``.  Without :attr:`prefill` each token runs through the decode step.  Raises
        ParameterError when the tokens do not fit the cache."""
        self._check_open()
        tokens = np.asarray(tokens, np.int64).reshape(self.batch, -1)
        if self.prefill is not None:
            self.prefill.run(tokens, start, positions, mask)
            return
        plan_runs(tokens.shape[1], start, self.max_len, 2)  # the same check
        for k in range(tokens.shape[1]):
            self.position = start + k
            row_mask = None if mask is None else np.array(mask, np.int64, copy=True)
            if row_mask is not None:
                row_mask[:, start + k] = 1
            self.feed(tokens[:, k], None if positions is None else np.asarray(positions)[:, k], row_mask)

    def _check_open(self) -> None:
        """MgxError once the decode step was released (here or by another owner of the program): its
        parameter arrays are views of freed memory, which no write or read may touch."""
        if self.program.released:
            raise MgxError("the decode step's program was released")

    def release(self) -> None:
        """Release the prefill programs, then the decode step."""
        if self.prefill is not None:
            self.prefill.release()
        self.program.release()

    def cache(self) -> dict:
        """Host copies of the cache state (for tests)."""
        self._check_open()
        self.ctx.synchronize(self.queue)
        return {n: self.ctx.to_host(a, self.queue) for n, a in self.params.items() if n not in self.inputs}



def _check_rows(dec: "Decoder", tokens, positions, mask) -> None:
    """ParameterError when the step inputs of :meth:`Decoder.feed` do not have the step's sizes."""
    want = [("tokens", tokens, dec.batch)]
    if dec.rows_interface:
        want += [("positions", positions, dec.batch), ("mask", mask, int(dec.params["attention_mask"].size))]
    for name, a, n in want:
        if a is None or np.size(a) != n:
            raise ParameterError(f"{name} must hold {n} values for this decode step, got "
                                 f"{None if a is None else np.shape(a)}")


def describe_host_ops(parts) -> str:
    """``((3, "copies"), (1, "fill"))`` -> ``"3 copies, 1 fill"``."""
    return ", ".join(f"{n} {what}" for n, what in parts)
