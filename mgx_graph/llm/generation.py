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
its own slot only, so no row is ever fully masked (token by token; in a prefill run a row's padding
columns see no slot, the exports' guard after the softmax gives them zeros, and no real token reads
their slots).

The prompts run in one program run per length bucket when the decoder has a prefill step
(:mod:`mgx_graph.llm.prefill`; the first token is then chosen from its logits), else one token per
decode step (also with ``prefill="tokens"``); then tokens are chosen
(:mod:`mgx_graph.llm.sampling`: greedy or sampled) until an end-of-sequence id, a stop string
(:mod:`mgx_graph.llm.streaming`), ``max_new_tokens`` or the cache length. Per step the host writes
the step inputs on the queue (one row: two fill kernels; B rows: three host-to-device copies of
B * (max_cache_len + 2) int64 and one fill), runs the program on the queue, and reads back the B
chosen ids: the argmax (greedy) or the id the sampling rule chose on the device (gpu: the kernels of
:class:`~mgx_graph.operators.token_sampling_gpu.SampleAdvance`; ref: the host rule).  The logits rows
(B * vocab float32) are read back only with ``output_logits``, and the host rule then chooses.
One row runs pipelined, greedy or sampled (:meth:`Decoder.sampled_tokens`): the id is written on the
device into the next step's ``input_ids``, the next step is queued, and only then is the id read back
(through page-locked memory on ``gpu``), so the host's work overlaps the device's.  On ``gpu`` the
tail of a greedy step is one kernel (the argmax into ``input_ids``, into the page-locked read-back
buffer and the next slot into ``cache_position``) and that of a sampled step four, so nothing else is
queued between two steps' programs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import ParameterError
from .decoder import ONE_ROW_INPUTS, ROWS_INPUTS, Decoder, describe_host_ops, program_alias  # noqa: F401
from .sampling import SamplingConfig, TokenSampler
from .streaming import RowText, check_stop_strings

# the decode step runner lives in mgx_graph.llm.decoder; its names stay importable from here


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


# -- generation ---------------------------------------------------------------------------------------
def _as_prompts(prompt_ids, decoder: Decoder) -> tuple[list[list[int]], bool]:
    """``(prompts, single)``: one prompt (a list of ints) or several (a list of lists), checked."""
    if not all(hasattr(decoder, a) for a in ("batch", "vocab_size", "max_len")):
        raise ParameterError(f"decoder must be a Decoder or a runner of mgx_graph.llm.open_decoder.open_decoder, got "
                             f"{decoder!r:.80}")
    seq = (list, tuple, np.ndarray)
    if not isinstance(prompt_ids, seq):
        raise ParameterError(f"prompt_ids must be a list of token ids or a list of such lists, got "
                             f"{type(prompt_ids).__name__} {prompt_ids!r:.80}")
    if len(prompt_ids) == 0:
        raise ParameterError("empty prompt")
    single = not isinstance(prompt_ids[0], seq)
    if not single and not all(isinstance(p, seq) for p in prompt_ids):
        raise ParameterError("prompt_ids mixes token ids and lists: give one list of ids or a list of lists")
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


def _token_ids(value, name: str, vocab: int, many: bool = True) -> list[int]:
    """``value`` (None, a token id, or with ``many`` a list / tuple of them) as a list of ints in
    0..vocab - 1; ParameterError naming ``name`` otherwise."""
    if value is not None and not isinstance(value, (int, np.integer)) and \
            not (many and isinstance(value, (list, tuple, np.ndarray))):
        raise ParameterError(f"{name} must be a token id in 0..{vocab - 1}{' or a list of them' if many else ''}, "
                             f"got {value!r}")
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

    def prompt_block(self):
        """``(tokens [B, longest], positions [B, longest], mask [B, max_len])`` of every prompt slot at once
        (the slots of :meth:`inputs` up to the longest prompt; the mask holds each row's real slots)."""
        b = len(self.pads)
        tokens = np.full((b, self.longest), self.pad, np.int64)
        for r in range(b):
            if r < len(self.prompts):
                tokens[r, self.pads[r]:] = self.prompts[r]
                self.real[r, self.pads[r]:self.longest] = 1
        positions = np.maximum(np.arange(self.longest)[None, :] - np.asarray(self.pads, np.int64)[:, None], 0)
        return tokens, positions, self.real.copy()

    def accept(self, chosen: np.ndarray, logits: np.ndarray | None) -> None:
        """Append each unfinished row's chosen token; finish rows on eos, a stop string or max_new."""
        for r, res in enumerate(self.results):
            if self.done[r]:
                continue
            tok = int(chosen[r])
            res.tokens.append(tok)
            if self.keep_logits and logits is not None:  # logits are given whenever they are kept
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


def _one_run(decoder: Decoder, rows: _Rows, prefill: str) -> bool:
    """Whether the prompts run through the decoder's prefill programs (:mod:`mgx_graph.llm.prefill`): it has
    them, ``prefill`` is "auto", a token is to be chosen and some prompt has more than one token."""
    return prefill == "auto" and getattr(decoder, "prefill", None) is not None and rows.max_new > 0 \
        and rows.longest > 1


def _first_token(decoder: Decoder, rows: _Rows, sampler: TokenSampler) -> None:
    """Choose and accept each row's token after the prompt from the last logits (a prefill's)."""
    logits = decoder.logits_rows() if rows.keep_logits else None
    if logits is not None:
        chosen = sampler.choose(logits)
    else:
        chosen = decoder.sample_next(sampler) if sampler.needs_logits else decoder.greedy_next()
    rows.accept(chosen, logits)


def _pipelines(decoder: Decoder, rows: _Rows, sampler: TokenSampler) -> bool:
    """Whether the generation can run as :meth:`Decoder.sampled_tokens`: one row, no logits kept."""
    return (isinstance(decoder, Decoder) and not decoder.rows_interface and decoder.batch == 1
            and len(rows.prompts) == 1 and not rows.keep_logits)


def _greedy_loop(decoder: Decoder, rows: _Rows, sampler: TokenSampler, prefill: str) -> tuple[float, float, list]:
    """:func:`_decode_loop` for one row, through :meth:`Decoder.sampled_tokens` (each id chosen and fed
    back on the device, the next step queued before the id is read; greedy: the argmax tail).  With the
    prompt in one run (:func:`_one_run`) the first id comes from the prefill's logits and the chain
    starts from it."""
    t0 = time.perf_counter()
    prompt, t1, host = rows.prompts[0], None, []
    decoder.position = 0
    if _one_run(decoder, rows, prefill):
        decoder.prefill_tokens([prompt])
        host.append(decoder.last_host_s)
        _first_token(decoder, rows, sampler)
        t1 = time.perf_counter()  # decode timing starts after the first generated token
        prefill_s, start = t1 - t0, rows.last[0]
    else:
        for tok in prompt[:-1]:
            decoder.feed(np.array([tok], np.int64))
        decoder.ctx.synchronize(decoder.queue)
        prefill_s, start = time.perf_counter() - t0, prompt[-1]
    count = min(rows.max_new - len(host), decoder.max_len - decoder.position)
    if count > 0 and not rows.all_done():
        ids = decoder.sampled_tokens(int(start), count, sampler if sampler.needs_logits else None)
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


def _decode_loop(decoder: Decoder, rows: _Rows, sampler: TokenSampler, prefill: str = "auto") -> \
        tuple[float, float, list]:
    """Feed every slot (the prompts in one run with ``prefill`` "auto" and the decoder's prefill programs),
    choose tokens from the last prompt slot on; returns ``(prefill_s, decode_s, host seconds per generated
    step)``."""
    if _pipelines(decoder, rows, sampler):
        out = _greedy_loop(decoder, rows, sampler, prefill)
        _finish_rows(rows)
        return out
    t0 = time.perf_counter()
    prefill_s, t1, host, first = 0.0, None, [], 0
    decoder.position = 0
    if _one_run(decoder, rows, prefill):
        tokens, positions, mask = rows.prompt_block()
        decoder.prefill_tokens(tokens, 0, positions, mask)
        host.append(decoder.last_host_s)
        _first_token(decoder, rows, sampler)
        t1 = time.perf_counter()
        prefill_s, first = t1 - t0, rows.longest
    for slot in range(first, decoder.max_len if not rows.all_done() else first):
        if slot == rows.longest - 1:
            decoder.ctx.synchronize(decoder.queue)
            prefill_s = time.perf_counter() - t0
            if rows.max_new == 0:
                break
        decoder.feed(*rows.inputs(slot))
        if slot < rows.longest - 1:
            continue
        host.append(decoder.last_host_s)
        logits = decoder.logits_rows() if rows.keep_logits else None
        if logits is not None:
            chosen = sampler.choose(logits)
        else:
            chosen = decoder.sample_next(sampler) if sampler.needs_logits else decoder.greedy_next()
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
             streamer=None, tokenizer=None, pad_token_id: int | None = None, output_logits: bool = False,
             prefill: str = "auto"):
    """Generate from one prompt or several, with transformers' option names.

    Args:
        decoder: a :class:`Decoder` (or a :class:`~mgx_graph.llm.runner.GenaiRunner`, which prefills
            each prompt in one run); generation starts at slot 0 (a new sequence: the slots after
            the ones written are masked, so the cache needs no clearing).
        prompt_ids: one prompt (a list of token ids) or a list of up to ``decoder.batch`` prompts,
            decoded together with left padding.
        max_new_tokens: tokens to generate per prompt at most (>= 0).
        eos_token_id: an id or a list of ids that end a sequence (kept in its tokens), or None.
        on_token: ``on_token(token_id)`` for each new token (a list of such, one per prompt, with
            several prompts).
        do_sample, temperature, top_k, top_p, min_p, repetition_penalty, seed: how tokens are
            chosen (:class:`~mgx_graph.llm.sampling.SamplingConfig`; greedy by default).
        stop: a stop string or a list of them (needs ``tokenizer``); the text is cut before it
            (:mod:`mgx_graph.llm.streaming`).
        streamer: ``streamer(text)`` called with each settled piece of text (a list, one per
            prompt, with several prompts); its ``end()``, if any, is called when its sequence ends.
            Needs ``tokenizer``. :class:`~mgx_graph.llm.streaming.TextStreamer` writes to stdout.
        tokenizer: anything with ``decode(ids, skip_special_tokens=True) -> str`` (a transformers
            tokenizer); without it ``text`` stays "".
        pad_token_id: the token fed in padding slots (default: the first eos id, else 0).
        output_logits: keep each token's raw logits in ``GenerationResult.logits`` (as transformers'
            ``output_logits``; the logits rows are then read back every step).
        prefill: "auto" runs the prompts in one run per length bucket where the decoder can (a
            :class:`Decoder` with a prefill step, :mod:`mgx_graph.llm.prefill`; the folder runners
            always do); "tokens" feeds a Decoder one prompt token per decode step (for comparison).

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
    config = SamplingConfig(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                            min_p=min_p, repetition_penalty=repetition_penalty, seed=seed)
    eos = _token_ids(eos_token_id, "eos_token_id", decoder.vocab_size)
    pads = _token_ids(pad_token_id, "pad_token_id", decoder.vocab_size, many=False)
    pad = pads[0] if pads else eos[0] if eos else 0
    stops = check_stop_strings(stop)
    n = len(prompts)
    streams = _per_prompt(streamer, n, single, "streamer")
    if tokenizer is not None and not callable(getattr(tokenizer, "decode", None)):
        raise ParameterError(f"tokenizer must have decode(ids, skip_special_tokens=True) -> str, got {tokenizer!r:.80}")
    if tokenizer is None and (stops or any(streams)):
        raise ParameterError("stop strings and streamers work on text: pass tokenizer=")
    if not isinstance(output_logits, (bool, np.bool_)):
        raise ParameterError(f"output_logits must be True or False, got {output_logits!r}")
    texts = [RowText(tokenizer, stops, s) if tokenizer is not None else None for s in streams]
    sampler = TokenSampler(config, decoder.batch, decoder.vocab_size)
    rows = _Rows(decoder, prompts, int(max_new_tokens), set(eos), pad, texts, _per_prompt(on_token, n, single, "on_token"),
                 sampler, bool(output_logits))
    loop = getattr(decoder, "decode_loop", None)  # a runner with its own prefill (mgx_graph.llm.runner)
    if prefill not in ("auto", "tokens") or (loop and prefill != "auto"):
        raise ParameterError(f"prefill must be 'auto' (the prompt in one run where the decoder can) or 'tokens' "
                             f"(one decode step per prompt token; a Decoder only), got {prefill!r}")
    prefill_s, decode_s, host = loop(rows, sampler) if loop else _decode_loop(decoder, rows, sampler, prefill)
    stats = decoder.stats() if hasattr(decoder, "stats") else decoder.program.stats()
    host_us = (sum(host[1:]) / max(len(host) - 1, 1)) * 1e6 if host else 0.0
    for res, text in zip(rows.results, texts):
        res.text = text.finish() if text is not None else ""
        res.prefill_s, res.decode_s, res.host_us_per_step, res.stats = prefill_s, decode_s, host_us, stats
        res.steps = len(host)
    return rows.results[0] if single else rows.results
