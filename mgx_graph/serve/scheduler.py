"""In-flight batching: one engine thread owns a batched :class:`~mgx_graph.llm.runner.GenaiRunner` of B rows
and runs every request in it, each in a row of its own, between the others' decode steps.

Each loop of the engine thread:

1. frees the rows of requests that are done, cancelled (the client went away) or past their deadline;
2. **joins** waiting requests into free rows: one prefill run (the bucket S holding the longest joining
   prompt) over all B rows, in which
   * a joining row gets its prompt, right-padded, with its mask at the prompt's length: the
     GroupQueryAttention writes the S new keys / values at the row's slots ``0 .. S-1``
     (``start = max(len - S, 0) = 0``), as the runner's own prefill;
   * a **running** row gets S pad tokens with its mask at ``n + S`` (n: its tokens in the cache), so the
     attention writes them at slots ``n .. n+S-1``: past its end, slots its own next decode steps
     overwrite before they are ever attended to. Its cache rows ``0 .. n-1`` are not written, and its
     logits of this run are dropped: the run is a no-op for it;
   * a free row gets pad tokens at slots ``0 .. S-1``;
   a request joins only when every running row has room for that (``n + S <= max_length``); else it waits
   for the next loop (a row that close to the end of the cache finishes within S steps);
3. runs one **decode step** of all B rows: each busy row feeds its last token at slot n (mask n + 1); a
   free row feeds the pad token at slot 0. Each busy row's next token is the argmax (greedy, read on the
   device) or its own :class:`~mgx_graph.llm.sampling.TokenSampler`'s choice (its seed, its step count: the
   same tokens whatever the row and whoever else runs).

A request leaves its row when it ends (an end-of-sequence token, a stop string, ``max_new`` tokens, a
full cache, cancelled, timed out), so no request waits for another to finish.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import MgxError, ParameterError
from ..llm.runner import GenaiRunner, length_bucket
from ..llm.sampling import SamplingConfig, TokenSampler
from ..llm.streaming import RowText

log = logging.getLogger("mgx_graph.serve")


class QueueFull(MgxError):
    """The engine's queue of waiting requests is full (HTTP 429)."""


class ShuttingDown(MgxError):
    """The engine no longer accepts requests (HTTP 503)."""


@dataclass
class Request:
    """One generation in the engine.

    ``on_event(kind, value)`` is called from the engine thread: ``("text", piece)`` for each settled piece
    of text, then ``("done", request)`` once (``finish_reason`` set: "eos", "stop", "length",
    "cache_full", "cancelled", "timeout" or "error", with ``error`` holding the exception). It must not
    block. :meth:`cancel` may be called from any thread.
    """

    prompt: list
    max_new: int
    config: SamplingConfig = field(default_factory=SamplingConfig)
    stop: tuple = ()
    on_event: Callable = lambda kind, value: None
    timeout: float | None = None
    tokens: list = field(default_factory=list)
    finish_reason: str = ""
    error: BaseException | None = None
    text: str = ""
    sampler: Any = field(default=None, repr=False)   # its TokenSampler, set when it is admitted
    row_text: Any = field(default=None, repr=False)  # its RowText (detokenization, stop strings), likewise

    def __post_init__(self):
        self.cancelled = threading.Event()
        self.created = time.monotonic()
        self.first_token_at: float | None = None
        self.row: int | None = None
        self.length = 0  # tokens of this row in the cache
        self.last = 0    # the latest token, fed by the next decode step

    def cancel(self) -> None:
        self.cancelled.set()

    def expired(self, now: float) -> bool:
        return self.timeout is not None and now - self.created > self.timeout


class Engine:
    """Runs requests in the rows of ``runner`` (a :class:`GenaiRunner`) from one thread (see the module).

    Args: ``runner``; ``tokenizer`` (``decode(ids, skip_special_tokens=True)``); ``eos_token_ids``;
    ``max_queue``: waiting requests at most (:meth:`submit` raises QueueFull beyond it); ``pad_token_id``
    (default: the first eos id). Raises ParameterError for a runner whose rows cannot join separately.
    """

    def __init__(self, runner, tokenizer, eos_token_ids, *, max_queue: int = 64, pad_token_id: int | None = None):
        from ..llm.optimum_runner import OptimumRunner

        if not isinstance(runner, GenaiRunner) or isinstance(runner, OptimumRunner):
            raise ParameterError(f"in-flight batching needs an onnxruntime-genai folder's runner (GenaiRunner: each "
                                 f"row's cache at fixed slots), got {type(runner).__name__}")
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 0:
            raise ParameterError(f"max_queue must be an int >= 0, got {max_queue!r}")
        self.runner, self.tokenizer = runner, tokenizer
        self.eos = {int(e) for e in eos_token_ids}
        self.pad = int(pad_token_id if pad_token_id is not None else
                       (eos_token_ids[0] if len(eos_token_ids) else 0))
        self.max_queue = max_queue
        self.rows: list[Request | None] = [None] * runner.batch
        self.waiting: deque = deque()
        self.cond = threading.Condition()
        self.accepting, self._stop, self._cancel_all = True, False, False
        self.counts: Counter = Counter()
        self.steps = self.prefills = self.prefills_beside_running = 0
        self._thread: threading.Thread | None = None

    @property
    def max_length(self) -> int:
        return self.runner.max_len

    # -- other threads ----------------------------------------------------------------------------------
    def submit(self, req: Request) -> Request:
        """Queue ``req``; ShuttingDown when draining or stopped, QueueFull when ``max_queue`` wait already,
        ParameterError for an empty prompt or one the cache cannot hold with one new token."""
        if not req.prompt or len(req.prompt) >= self.max_length:
            raise ParameterError(f"the prompt has {len(req.prompt)} tokens; the cache holds {self.max_length} "
                                 f"per sequence, prompt and new tokens together")
        bad = [t for t in req.prompt if not 0 <= int(t) < self.runner.vocab_size]
        if bad:
            raise ParameterError(f"token ids must be in 0..{self.runner.vocab_size - 1}, got {bad[:5]}")
        req.sampler = TokenSampler(req.config, 1, self.runner.vocab_size)
        req.sampler.observe(0, req.prompt)
        req.row_text = RowText(self.tokenizer, req.stop, lambda piece: req.on_event("text", piece))
        with self.cond:
            if not self.accepting:
                raise ShuttingDown("the server is shutting down")
            if len(self.waiting) >= self.max_queue:
                raise QueueFull(f"{len(self.waiting)} requests are waiting (--max-queue {self.max_queue})")
            self.waiting.append(req)
            self.cond.notify()
        return req

    def start(self) -> "Engine":
        self._thread = threading.Thread(target=self._loop, name="mgx-serve-engine", daemon=True)
        self._thread.start()
        return self

    def drain(self) -> None:
        """Stop accepting requests; those queued or running go on."""
        with self.cond:
            self.accepting = False

    def stop(self, cancel: bool = True, timeout: float | None = None) -> None:
        """Stop the engine thread: with ``cancel`` every queued and running request ends "cancelled" at the
        next step, else the thread ends once they are done. Joins it (up to ``timeout`` seconds)."""
        with self.cond:
            self.accepting, self._stop, self._cancel_all = False, True, cancel
            self.cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def stats(self) -> dict:
        with self.cond:
            return {"rows": len(self.rows), "rows_busy": sum(r is not None for r in self.rows),
                    "queued": len(self.waiting), "max_length": self.max_length, "decode_steps": self.steps,
                    "prefills": self.prefills, "prefills_beside_running": self.prefills_beside_running,
                    "finished": dict(self.counts), "accepting": self.accepting,
                    "running": self._thread is not None and self._thread.is_alive()}

    # -- the engine thread ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self._stop and not self.waiting and not any(self.rows):
                    self.cond.wait()
                if self._stop and (self._cancel_all or (not self.waiting and not any(self.rows))):
                    break
            try:
                self._drop_ended()
                joining = self._take()
                if joining:
                    self._prefill(joining)
                if any(self.rows):
                    self._decode()
            except Exception as e:  # a failed run ends the requests in it, not the engine
                log.exception("engine step failed")
                for r in [r for r in self.rows if r is not None]:
                    r.error = e
                    self._finish(r, "error")
        with self.cond:
            left = [r for r in self.rows if r is not None] + list(self.waiting)
            self.waiting.clear()
        for r in left:
            self._finish(r, "cancelled")
        log.info("engine stopped: %d request(s) cancelled, %d row(s) busy", len(left),
                 sum(r is not None for r in self.rows))

    def _drop_ended(self) -> None:
        now = time.monotonic()
        for r in [r for r in self.rows if r is not None]:
            if r.cancelled.is_set() or r.expired(now):
                self._finish(r, "cancelled" if r.cancelled.is_set() else "timeout")
        with self.cond:
            ended = [r for r in self.waiting if r.cancelled.is_set() or r.expired(now)]
            for r in ended:
                self.waiting.remove(r)
        for r in ended:
            self._finish(r, "cancelled" if r.cancelled.is_set() else "timeout")

    def _take(self) -> list:
        """The waiting requests that join now, each given a free row (see the module: every running row
        must have room for the prefill's S slots past its end)."""
        M = self.max_length
        free = [b for b, r in enumerate(self.rows) if r is None]
        running = [r.length for r in self.rows if r is not None]
        take, longest = [], 0
        with self.cond:
            while free and self.waiting:
                S = length_bucket(max(longest, len(self.waiting[0].prompt)), M)
                if any(n + S > M for n in running):
                    break
                req = self.waiting.popleft()
                longest = max(longest, len(req.prompt))
                req.row = free.pop(0)
                take.append(req)
        return take

    def _prefill(self, joining: list) -> None:
        B, M, run = self.runner.batch, self.max_length, self.runner
        S = length_bucket(max(len(r.prompt) for r in joining), M)
        tokens = np.full((B, S), self.pad, np.int64)
        lengths = np.full(B, S, np.int64)  # free rows: slots 0 .. S-1
        for b, r in enumerate(self.rows):
            if r is not None:
                lengths[b] = r.length + S  # running rows: written past their end (a no-op for their cache)
        if any(r is not None for r in self.rows):
            self.prefills_beside_running += 1
        cols = np.zeros(B, np.int64)
        for r in joining:
            n = len(r.prompt)
            tokens[r.row, :n] = r.prompt
            lengths[r.row], cols[r.row], r.length = n, n - 1, n
            self.rows[r.row] = r
        logits = run.run(S, tokens, lengths)
        ids, lg = run.pick(logits, cols, any(r.sampler.needs_logits for r in joining))
        self.prefills += 1
        for r in joining:
            self._accept(r, ids, lg)

    def _decode(self) -> None:
        B = self.runner.batch
        tokens = np.full((B, 1), self.pad, np.int64)
        lengths = np.ones(B, np.int64)  # free rows: slot 0
        busy = [r for r in self.rows if r is not None]
        for r in busy:
            tokens[r.row, 0] = r.last
            r.length += 1
            lengths[r.row] = r.length
        logits = self.runner.run(1, tokens, lengths)
        ids, lg = self.runner.pick(logits, np.zeros(B, np.int64), any(r.sampler.needs_logits for r in busy))
        self.steps += 1
        for r in busy:
            self._accept(r, ids, lg)

    def _accept(self, r: Request, ids: np.ndarray, lg) -> None:
        row = int(r.row if r.row is not None else -1)
        tok = int(r.sampler.choose(lg[row:row + 1])[0]) if r.sampler.needs_logits else int(ids[row])
        r.sampler.observe(0, (tok,))
        r.tokens.append(tok)
        r.last = tok
        if r.first_token_at is None:
            r.first_token_at = time.monotonic()
        stopped = r.row_text.add(tok)
        reason = "eos" if tok in self.eos else "stop" if stopped else \
            "length" if len(r.tokens) >= r.max_new else "cache_full" if r.length >= self.max_length else ""
        if reason:
            self._finish(r, reason)

    def _finish(self, r: Request, reason: str) -> None:
        if r.row is not None and self.rows[r.row] is r:
            self.rows[r.row] = None
        r.finish_reason = reason
        try:
            r.text = r.row_text.finish() if reason not in ("cancelled", "error") else r.row_text.text
        except Exception:  # a consumer's callback failed: the request ends anyway
            log.exception("streaming the end of a request failed")
        with self.cond:
            self.counts[reason] += 1
        r.on_event("done", r)
