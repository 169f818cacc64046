"""Greedy text generation with a fixed-shape decode step compiled by mgx_graph.

The step program takes ``input_ids [1,1]``, ``cache_position [1]`` and the KV cache, and returns
``logits`` plus the updated cache, which ``alias`` binds onto the cache inputs: the cache buffers are
allocated once on the device, never move, and are updated in place.  The prompt is fed one token
per step (prefill through the decode step), then tokens are generated until an end-of-sequence id,
``max_new_tokens`` or the cache length.  Per step the host writes two scalars on the queue (two
fill kernels), runs the program on the queue, and reads back one argmax.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .errors import MgxError


@dataclass
class GenerationResult:
    prompt_tokens: int
    tokens: list = field(default_factory=list)
    text: str = ""
    prefill_s: float = 0.0
    decode_s: float = 0.0
    host_us_per_step: float = 0.0
    stats: dict = field(default_factory=dict)

    @property
    def ms_per_token(self) -> float:
        n = max(len(self.tokens) - 1, 1)
        return self.decode_s * 1e3 / n

    @property
    def tokens_per_s(self) -> float:
        return 1e3 / self.ms_per_token if self.ms_per_token else 0.0


class Decoder:
    """Runs a compiled decode step (a :class:`~mgx_graph.compiled.CompiledProgram`) token by token.

    ``program`` must have parameters ``input_ids`` (int64 [1,1]) and ``cache_position`` (int64 [1])
    and an output ``logits`` ([1,1,vocab]); every other parameter is treated as cache state and
    must be bound in place to an output (``program.alias``).
    Raises MgxError when the program does not have that interface.
    """

    def __init__(self, program):
        self.program = program
        shapes = program.get_parameter_shapes()
        for name in ("input_ids", "cache_position"):
            if name not in shapes:
                raise MgxError(f"decode step has no '{name}' parameter (parameters: {sorted(shapes)})")
        names = program.get_output_names()
        if "logits" not in names:
            raise MgxError(f"decode step has no 'logits' output (outputs: {names})")
        self.logits_index = names.index("logits")
        bound = set(program.alias.values())
        state = [n for n in shapes if n not in ("input_ids", "cache_position")]
        unbound = [n for n in state if n not in bound]
        if unbound:
            raise MgxError(f"decode step state {unbound} is not bound in place to an output; compile with "
                           f"alias={{output: parameter}}")
        ctx = program.context
        xp = ctx.xp
        self.xp, self.ctx = xp, ctx
        self.queue = program.queue
        with ctx.on_queue(self.queue):
            self.params = {n: xp.zeros(shapes[n].lens, dtype=shapes[n].np_dtype) for n in shapes}
        ctx.synchronize(self.queue)
        self.max_len = min(shapes[n].lens[2] for n in state) if state else 1 << 30
        self.position = 0

    def reset(self) -> None:
        with self.ctx.on_queue(self.queue):
            for n, a in self.params.items():
                a.fill(0)
        self.position = 0

    def step(self, token: int, want_next: bool = True):
        """Feed ``token`` at the current position; returns the greedy next token id (or None)."""
        if self.position >= self.max_len:
            raise MgxError(f"the KV cache is full ({self.max_len} positions)")
        xp, p = self.xp, self.params
        with self.ctx.on_queue(self.queue):
            p["input_ids"].fill(int(token))
            p["cache_position"].fill(self.position)
            h0 = time.perf_counter()
            outs = self.program.run_async(p, self.queue)
            self.last_host_s = time.perf_counter() - h0
            self.last_logits = outs[self.logits_index]
            self.position += 1
            if not want_next:
                return None
            nxt = xp.argmax(outs[self.logits_index].reshape(-1))
            return int(nxt)  # device -> host: waits for the step

    def cache(self) -> dict:
        """Host copies of the cache state (for tests)."""
        self.ctx.synchronize(self.queue)
        return {n: self.ctx.to_host(a, self.queue) for n, a in self.params.items()
                if n not in ("input_ids", "cache_position")}


def generate(decoder: Decoder, prompt_ids: list[int], max_new_tokens: int, eos_ids=(), on_token=None
             ) -> GenerationResult:
    """Greedy generation; ``on_token(token_id)`` is called for each new token as it arrives."""
    if not prompt_ids:
        raise MgxError("empty prompt")
    res = GenerationResult(prompt_tokens=len(prompt_ids))
    eos = set(int(e) for e in eos_ids)
    t0 = time.perf_counter()
    for t in prompt_ids[:-1]:
        decoder.step(t, want_next=False)
    decoder.ctx.synchronize(decoder.queue)
    res.prefill_s = time.perf_counter() - t0
    tok = prompt_ids[-1]
    t1 = None
    host = []
    for i in range(max_new_tokens):
        if decoder.position >= decoder.max_len:
            break
        nxt = decoder.step(tok)
        host.append(decoder.last_host_s)
        if i == 0:
            t1 = time.perf_counter()  # decode timing starts after the first generated token
        res.tokens.append(nxt)
        if on_token is not None:
            on_token(nxt)
        if nxt in eos:
            break
        tok = nxt
    res.decode_s = time.perf_counter() - t1 if t1 else 0.0
    res.host_us_per_step = (sum(host[1:]) / max(len(host) - 1, 1)) * 1e6 if host else 0.0
    res.stats = decoder.program.stats()
    return res
