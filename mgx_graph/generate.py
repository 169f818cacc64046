"""Text generation with a fixed-shape decode step compiled by mgx_graph.

The step program takes ``input_ids``, ``cache_position`` and the KV cache, and returns ``logits``
plus the updated cache, which the program's alias binds onto the cache inputs: the cache buffers
are allocated once on the device, never move, and are updated in place. Two step interfaces:

* one row: ``input_ids`` int64 [1, 1], ``cache_position`` int64 [1];
* B rows (a ``batch=B`` build, :func:`mgx_graph.models.export.make_static_step_module`):
  ``input_ids`` [B, 1], ``cache_position`` [1] (the slot written in every row),
  ``attention_mask`` int64 [B, max_cache_len], ``position_ids`` int64 [B, 1].

Several prompts are left-padded to the longest and decoded in lockstep, one slot per step: a
row's padding slots are masked out of its attention and its positions count from its first real
token, so each row gets the tokens it would get alone. A padding step (and every step of a row
that has finished, which keeps stepping with the pad token until all rows are done) attends to
its own slot only, so no row is ever fully masked.

Each prompt is fed one token per step (prefill through the decode step), then tokens are chosen
(:mod:`mgx_graph.sampling`: greedy or sampled) until an end-of-sequence id, a stop string
(:mod:`mgx_graph.streaming`), ``max_new_tokens`` or the cache length. Per step the host writes
the step inputs on the queue (one row: two fill kernels; B rows: three host-to-device copies of
B * (max_cache_len + 2) int64 and one fill), runs the program on the queue, and reads back either
B argmax ids (greedy) or the B logits rows (sampling or a repetition penalty: B * vocab float32).
One greedy row runs pipelined (:meth:`Decoder.greedy_tokens`): the argmax is written on the device
into the next step's ``input_ids``, the next step is queued, and only then is the id read back
(through page-locked memory on ``gpu``), so the host's work overlaps the device's.
"""
from __future__ import annotations

import contextlib
import time
import weakref
from dataclasses import dataclass, field

import numpy as np

from .errors import MgxError, ParameterError
from .operators.index_ops import FLOATS, argmax_rows
from .sampling import SamplingConfig, TokenSampler
from .streaming import RowText, check_stop_strings

ONE_ROW_INPUTS = ("input_ids", "cache_position")
ROWS_INPUTS = ("input_ids", "cache_position", "attention_mask", "position_ids")


def program_alias(program) -> dict:
    """``{output name: parameter name}`` that ``program`` writes in place (its KV cache binding)."""
    return dict(program.alias)


@dataclass
class GenerationResult:
    """One generated sequence.

    Attributes:
        prompt_tokens: tokens of its prompt.
        tokens: the generated token ids (an end-of-sequence id that ended it included).
        text: their decoded text, cut before a stop string ("" without a tokenizer).
        finish_reason: "eos", "stop" (a stop string), "length" (max_new_tokens) or "cache_full".
        logits: with ``output_logits=True``, the raw logits (float32 [vocab]) each token was chosen
            from, one per token; else empty.
        prefill_s: seconds to feed the prompt but its last token (all rows together).
        decode_s: seconds from the first generated token to the last (all rows together).
        host_us_per_step: mean host µs per program run (``run_async``) after the first new token.
        stats: the program's stats after the generation.
        steps: decode steps that chose tokens (all rows together: the longest row's token count).
    """

    prompt_tokens: int
    tokens: list = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""
    logits: list = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    host_us_per_step: float = 0.0
    stats: dict = field(default_factory=dict)
    steps: int = 0

    @property
    def ms_per_token(self) -> float:
        n = max(self.steps - 1, 1) if self.steps else max(len(self.tokens) - 1, 1)
        return self.decode_s * 1e3 / n

    @property
    def tokens_per_s(self) -> float:
        return 1e3 / self.ms_per_token if self.ms_per_token else 0.0


class Decoder:
    """Runs a compiled decode step (a :class:`~mgx_graph.compiled.CompiledProgram`) one slot at a time.

    ``program`` has the parameters of one of the two interfaces of the module docstring and an
    output ``logits`` ([B, 1, vocab]); every other parameter is cache state, which must be bound in
    place to an output (the program's alias). Every array lives in a buffer allocated once
    (``params``: the step inputs, rewritten in place each step, and the cache), so graph capture and
    replay see fixed pointers. A static program gets the cache arrays bound once as its state
    (:meth:`~mgx_graph.compiled.CompiledProgram.bind_state`; the program reads and writes their
    memory) and each step passes only the step inputs (``step_params``); a dynamic one is passed every
    array each step.

    Attributes: ``batch`` (rows B), ``vocab_size``, ``max_len`` (cache slots), ``position`` (slots
    written so far), ``last_logits`` (the device array of the last step's logits), ``last_host_s``.
    Raises MgxError when the program does not have that interface.
    """

    def __init__(self, program):
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
        """:attr:`host_op_parts` of a greedy one-row generation (:meth:`greedy_tokens`): one fill
        (the slot) and the id's read-back copy; the id itself is written on the device."""
        return self.host_op_parts if self.rows_interface else ((1, "fill"), (1, "read-back copy"))

    @property
    def host_ops(self) -> str:
        """:attr:`host_op_parts` as text (what the CLI reports next to launches/token)."""
        return describe_host_ops(self.host_op_parts)

    def reset(self) -> None:
        self._end_chain()
        with self.ctx.on_queue(self.queue):
            for n, a in self.params.items():
                a.fill(0)
        self.position = 0

    def step(self, token: int, want_next: bool = True):
        """Feed ``token`` at the current position of a one-row step; returns the greedy next token
        id (or None). Raises MgxError on a step of several rows (use :meth:`feed`)."""
        if self.rows_interface:
            raise MgxError(f"this decode step takes {self.batch} rows with an attention mask: use Decoder.feed")
        self.feed(np.array([token], np.int64))
        return int(self.greedy_next()[0]) if want_next else None

    def feed(self, tokens, positions=None, mask=None) -> None:
        """Run the step at slot :attr:`position` (then advanced by one).

        ``tokens`` int [B]; for a step of several rows also ``positions`` int [B] (each row's
        position id) and ``mask`` int [B, max_len] (1 where a row attends to a slot). A one-row
        step ignores them (its position is the slot). Raises MgxError when the cache is full.
        """
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
        :attr:`last_host_s`) and keep its logits; inside ``on_queue(q)``."""
        self.params["cache_position"].fill(self.position)
        with self._state_lock:
            step = self._step_params()
            h0 = time.perf_counter()
            outs = self.program.run_async(step, q)
            self.last_host_s = time.perf_counter() - h0
        self.last_logits = outs[self.logits_index]

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
        share the read-back buffers.  It ends early when the cache is full.  :attr:`last_logits`
        belongs to the step queued ahead, not to the last id yielded.  Raises MgxError on a step
        of several rows."""
        if self.rows_interface:
            raise MgxError(f"this decode step takes {self.batch} rows with an attention mask: use Decoder.feed")
        self._end_chain()
        chain = self._greedy_chain(int(token), int(count))
        self._chain = weakref.ref(chain)
        return chain

    def _end_chain(self) -> None:
        """Close the open :meth:`greedy_tokens` generator, if any."""
        chain = self._chain() if self._chain is not None else None
        self._chain = None
        if chain is not None:
            chain.close()

    def _greedy_chain(self, token: int, count: int):
        reader = self._id_reader()
        start, queued, yielded = self.position, 0, 0
        try:
            self._queue_greedy_step(token, reader)
            queued = 1
            while yielded < queued:
                if queued < count and self.position < self.max_len:
                    self._queue_greedy_step(None, reader)
                    queued += 1
                tok = int(reader.wait().reshape(-1)[0])
                yielded += 1
                yield tok
        finally:
            while reader.pending:
                reader.wait()
            if self.position == start + queued:  # not set by the caller since
                self.position = start + yielded

    def _id_reader(self):
        r = getattr(self, "_reader", None)
        if r is None:
            make = getattr(self.ctx, "host_reader", None)
            shape = self.params["input_ids"].shape
            r = self._reader = make(shape, np.int64) if make is not None else _CopyReader(self.ctx)
        return r

    def _queue_greedy_step(self, token, reader) -> None:
        """Queue one step (``token`` None: its id is already in ``input_ids``), its argmax into
        ``input_ids`` and the read-back of that id."""
        if self.position >= self.max_len:
            raise MgxError(f"the KV cache is full ({self.max_len} positions)")
        p, ctx, q = self.params, self.ctx, self.queue
        ids = p["input_ids"]
        with ctx.on_queue(q):
            if token is not None:
                ids.fill(int(token))
            self._run_at_position(q)
            self._argmax_into(ids.reshape(1))
            reader.start(ids, q)
        self.position += 1

    def greedy_next(self) -> np.ndarray:
        """The argmax of the last step's logits per row (int64 [B]): one device argmax, one read-back of
        B ids (it waits for the step)."""
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
        host = self.ctx.to_host(self.last_logits, self.queue)
        return np.asarray(host, np.float32).reshape(self.batch, -1)

    def cache(self) -> dict:
        """Host copies of the cache state (for tests)."""
        self.ctx.synchronize(self.queue)
        return {n: self.ctx.to_host(a, self.queue) for n, a in self.params.items() if n not in self.inputs}



class _CopyReader:
    """:class:`~mgx_graph.targets.host_reader.HostReader`'s interface on a context without page-locked
    read-back (``ref``): the copy is made at ``start``."""

    def __init__(self, ctx):
        self.ctx, self.pending = ctx, []

    def start(self, arr, queue) -> None:
        self.pending.append(np.asarray(self.ctx.to_host(arr, queue)).copy())

    def wait(self) -> np.ndarray:
        return self.pending.pop(0)


def describe_host_ops(parts) -> str:
    """``((3, "copies"), (1, "fill"))`` -> ``"3 copies, 1 fill"``."""
    return ", ".join(f"{n} {what}" for n, what in parts)


# -- generation ---------------------------------------------------------------------------------------
def _as_prompts(prompt_ids, decoder: Decoder) -> tuple[list[list[int]], bool]:
    """``(prompts, single)``: one prompt (a list of ints) or several (a list of lists), checked."""
    if len(prompt_ids) == 0:
        raise ParameterError("empty prompt")
    single = not isinstance(prompt_ids[0], (list, tuple, np.ndarray))
    prompts = [list(prompt_ids)] if single else [list(p) for p in prompt_ids]
    if len(prompts) > decoder.batch:
        raise ParameterError(f"{len(prompts)} prompts given; this decode step takes at most {decoder.batch} rows "
                             f"(build the model with batch={len(prompts)})")
    for k, p in enumerate(prompts):
        if not p:
            raise ParameterError(f"prompt {k} is empty")
        bad = [t for t in p if isinstance(t, bool) or not isinstance(t, (int, np.integer))
               or not 0 <= int(t) < decoder.vocab_size]
        if bad:
            raise ParameterError(f"prompt {k}: token ids must be ints in 0..{decoder.vocab_size - 1}, got {bad[:5]}")
        if len(p) > decoder.max_len:
            raise ParameterError(f"prompt {k} has {len(p)} tokens; the KV cache holds {decoder.max_len}")
    return [[int(t) for t in p] for p in prompts], single


def _per_prompt(value, n: int, single: bool, name: str) -> list:
    """A callable (one prompt) or a list of n callables / None (several) as a list of n entries."""
    if value is None:
        return [None] * n
    if single and callable(value):
        return [value]
    if isinstance(value, (list, tuple)) and len(value) == n and all(v is None or callable(v) for v in value):
        return list(value)
    want = "a callable" if single else f"a list of {n} callables (one per prompt)"
    raise ParameterError(f"{name} must be {want}, got {value!r}")


def _token_ids(value, name: str, vocab: int) -> list[int]:
    items = [] if value is None else [value] if isinstance(value, (int, np.integer)) else list(value)
    for t in items:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= int(t) < vocab:
            raise ParameterError(f"{name} must be token ids in 0..{vocab - 1}, got {t!r}")
    return [int(t) for t in items]


class _Rows:
    """The state of the B rows of one generation (left padding, masks, results, stopping)."""

    def __init__(self, decoder: Decoder, prompts, max_new, eos, pad, texts, on_token, sampler, keep_logits=False):
        b, m = decoder.batch, decoder.max_len
        self.prompts, self.max_new, self.eos, self.pad = prompts, max_new, eos, pad
        self.texts, self.on_token, self.sampler, self.keep_logits = texts, on_token, sampler, keep_logits
        self.longest = max(len(p) for p in prompts)
        n = len(prompts)
        self.pads = [self.longest - len(p) for p in prompts] + [self.longest] * (b - n)  # extra rows: all padding
        self.real = np.zeros((b, m), np.int64)   # slots holding a row's own tokens
        self.last = np.full(b, pad, np.int64)    # each row's latest token
        self.done = [False] * n + [True] * (b - n)
        self.results = [GenerationResult(prompt_tokens=len(p)) for p in prompts]
        for r, p in enumerate(prompts):
            sampler.observe(r, p)

    def inputs(self, slot: int):
        """``(tokens, positions, mask)`` of slot ``slot`` (see the module docstring)."""
        b = len(self.pads)
        tokens = np.full(b, self.pad, np.int64)
        for r in range(b):
            if slot < self.longest:
                if slot >= self.pads[r]:
                    tokens[r] = self.prompts[r][slot - self.pads[r]]
                    self.real[r, slot] = 1
            elif not self.done[r]:
                tokens[r] = self.last[r]
                self.real[r, slot] = 1
        positions = np.maximum(slot - np.asarray(self.pads, np.int64), 0)
        mask = self.real.copy()
        mask[:, slot] = 1
        return tokens, positions, mask

    def accept(self, chosen: np.ndarray, logits: np.ndarray | None) -> None:
        """Append each unfinished row's chosen token; finish rows on eos, a stop string or max_new."""
        for r, res in enumerate(self.results):
            if self.done[r]:
                continue
            tok = int(chosen[r])
            res.tokens.append(tok)
            if self.keep_logits:
                res.logits.append(logits[r].copy())
            self.last[r] = tok
            self.sampler.observe(r, (tok,))
            if self.on_token[r] is not None:
                self.on_token[r](tok)
            stopped = self.texts[r].add(tok) if self.texts[r] is not None else False
            reason = "eos" if tok in self.eos else "stop" if stopped else \
                "length" if len(res.tokens) >= self.max_new else ""
            if reason:
                res.finish_reason, self.done[r] = reason, True

    def all_done(self) -> bool:
        return all(self.done)


def _pipelines(decoder: Decoder, rows: _Rows, sampler: TokenSampler) -> bool:
    """Whether the generation can run as :meth:`Decoder.greedy_tokens`: one row, greedy, no logits kept."""
    return (isinstance(decoder, Decoder) and not decoder.rows_interface and decoder.batch == 1
            and len(rows.prompts) == 1 and not sampler.needs_logits and not rows.keep_logits)


def _greedy_loop(decoder: Decoder, rows: _Rows) -> tuple[float, float, list]:
    """:func:`_decode_loop` for one greedy row, through :meth:`Decoder.greedy_tokens` (each id fed
    back on the device, the next step queued before the id is read)."""
    t0 = time.perf_counter()
    prompt = rows.prompts[0]
    decoder.position = 0
    for tok in prompt[:-1]:
        decoder.feed(np.array([tok], np.int64))
    decoder.ctx.synchronize(decoder.queue)
    prefill_s, t1, host = time.perf_counter() - t0, None, []
    count = min(rows.max_new, decoder.max_len - decoder.position)
    if count > 0:
        ids = decoder.greedy_tokens(int(prompt[-1]), count)
        try:
            for tok in ids:
                host.append(decoder.last_host_s)
                if t1 is None:
                    t1 = time.perf_counter()  # decode timing starts after the first generated token
                rows.accept(np.array([tok], np.int64), None)
                if rows.all_done():
                    break
        finally:
            ids.close()
    return prefill_s, (time.perf_counter() - t1 if t1 else 0.0), host


def _finish_rows(rows: _Rows) -> None:
    for r, res in enumerate(rows.results):
        if not rows.done[r]:
            res.finish_reason = "length" if rows.max_new == 0 else "cache_full"


def _decode_loop(decoder: Decoder, rows: _Rows, sampler: TokenSampler) -> tuple[float, float, list]:
    """Feed every slot, choose tokens from the last prompt slot on; returns ``(prefill_s, decode_s,
    host seconds per generated step)``."""
    if _pipelines(decoder, rows, sampler):
        out = _greedy_loop(decoder, rows)
        _finish_rows(rows)
        return out
    t0 = time.perf_counter()
    prefill_s, t1, host = 0.0, None, []
    decoder.position = 0
    for slot in range(decoder.max_len):
        if slot == rows.longest - 1:
            decoder.ctx.synchronize(decoder.queue)
            prefill_s = time.perf_counter() - t0
            if rows.max_new == 0:
                break
        decoder.feed(*rows.inputs(slot))
        if slot < rows.longest - 1:
            continue
        host.append(decoder.last_host_s)
        logits = decoder.logits_rows() if sampler.needs_logits or rows.keep_logits else None
        chosen = sampler.choose(logits) if logits is not None else decoder.greedy_next()
        if t1 is None:
            t1 = time.perf_counter()  # decode timing starts after the first generated token
        rows.accept(chosen, logits)
        if rows.all_done():
            break
    _finish_rows(rows)
    return prefill_s, (time.perf_counter() - t1 if t1 else 0.0), host


def generate(decoder: Decoder, prompt_ids, max_new_tokens: int = 32, eos_token_id=None, on_token=None, *,
             do_sample: bool = False, temperature: float = 1.0, top_k: int | None = 50, top_p: float = 1.0,
             min_p: float | None = None, repetition_penalty: float = 1.0, seed: int | None = None, stop=None,
             streamer=None, tokenizer=None, pad_token_id: int | None = None, output_logits: bool = False):
    """Generate from one prompt or several, with transformers' option names.

    Args:
        decoder: a :class:`Decoder` (or a :class:`~mgx_graph.llm_runner.GenaiRunner`, which prefills
            each prompt in one run); generation starts at slot 0 (a new sequence: the slots after
            the ones written are masked, so the cache needs no clearing).
        prompt_ids: one prompt (a list of token ids) or a list of up to ``decoder.batch`` prompts,
            decoded together with left padding.
        max_new_tokens: tokens to generate per prompt at most (>= 0).
        eos_token_id: an id or a list of ids that end a sequence (kept in its tokens), or None.
        on_token: ``on_token(token_id)`` for each new token (a list of such, one per prompt, with
            several prompts).
        do_sample, temperature, top_k, top_p, min_p, repetition_penalty, seed: how tokens are
            chosen (:class:`~mgx_graph.sampling.SamplingConfig`; greedy by default).
        stop: a stop string or a list of them (needs ``tokenizer``); the text is cut before it
            (:mod:`mgx_graph.streaming`).
        streamer: ``streamer(text)`` called with each settled piece of text (a list, one per
            prompt, with several prompts); its ``end()``, if any, is called when its sequence ends.
            Needs ``tokenizer``. :class:`~mgx_graph.streaming.TextStreamer` writes to stdout.
        tokenizer: anything with ``decode(ids, skip_special_tokens=True) -> str`` (a transformers
            tokenizer); without it ``text`` stays "".
        pad_token_id: the token fed in padding slots (default: the first eos id, else 0).
        output_logits: keep each token's raw logits in ``GenerationResult.logits`` (as transformers'
            ``output_logits``; the logits rows are then read back every step).

    Returns:
        A :class:`GenerationResult` for one prompt, a list of them (in prompt order) for a list.

    Raises:
        ParameterError: an empty prompt or one longer than the cache, a token id outside the
            vocabulary, more prompts than rows, an option out of range, stop strings or a
            streamer without a tokenizer.
        MgxError: from the decoder (the program's own errors).
    """
    prompts, single = _as_prompts(prompt_ids, decoder)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
        raise ParameterError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    config = SamplingConfig(do_sample=bool(do_sample), temperature=temperature, top_k=top_k, top_p=top_p,
                            min_p=min_p, repetition_penalty=repetition_penalty, seed=seed)
    eos = _token_ids(eos_token_id, "eos_token_id", decoder.vocab_size)
    pad = _token_ids(pad_token_id, "pad_token_id", decoder.vocab_size)
    pad = pad[0] if pad else eos[0] if eos else 0
    stops = check_stop_strings(stop)
    n = len(prompts)
    streams = _per_prompt(streamer, n, single, "streamer")
    if tokenizer is None and (stops or any(streams)):
        raise ParameterError("stop strings and streamers work on text: pass tokenizer=")
    texts = [RowText(tokenizer, stops, s) if tokenizer is not None else None for s in streams]
    sampler = TokenSampler(config, decoder.batch, decoder.vocab_size)
    rows = _Rows(decoder, prompts, int(max_new_tokens), set(eos), pad, texts, _per_prompt(on_token, n, single, "on_token"),
                 sampler, bool(output_logits))
    loop = getattr(decoder, "decode_loop", None)  # a runner with its own prefill (mgx_graph.llm_runner)
    prefill_s, decode_s, host = loop(rows, sampler) if loop else _decode_loop(decoder, rows, sampler)
    stats = decoder.stats() if hasattr(decoder, "stats") else decoder.program.stats()
    host_us = (sum(host[1:]) / max(len(host) - 1, 1)) * 1e6 if host else 0.0
    for res, text in zip(rows.results, texts):
        res.text = text.finish() if text is not None else ""
        res.prefill_s, res.decode_s, res.host_us_per_step, res.stats = prefill_s, decode_s, host_us, stats
        res.steps = len(host)
    return rows.results[0] if single else rows.results
