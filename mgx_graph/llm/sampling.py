"""The next token from a decode step's logits: greedy, or sampled with a temperature, top-k,
top-p (nucleus), min-p and a repetition penalty, in transformers' order.

The rule, per row of logits (float16 / float32 cast to float32), step ``n`` of a generation (0 for
its first generated token) and row ``r``:

1. repetition penalty (as transformers' ``RepetitionPenaltyLogitsProcessor``), applied greedy or
   not: the logit ``x`` of every token already seen in the row (its prompt and what it generated so
   far) becomes ``x / penalty`` when ``x >= 0`` and ``x * penalty`` when ``x < 0`` (float32);
2. greedy decoding stops here and takes the first index of the largest value;
3. sampling divides by the temperature (float32) giving ``s``; ``m = max(s)``, ``e_i = exp(s_i - m)``;
4. top-k (``0 < k < V``): keep ``s_i >= t_k``, the k-th largest value (ties with it are kept, as
   transformers' ``TopKLogitsWarper``); ``Z`` is the sum of ``e`` over what top-k keeps (all: ``V``);
5. top-p (``p < 1``): keep token i when the ``e``-mass of the kept tokens with a value *strictly*
   greater than ``s_i`` is ``< p * Z`` (transformers' ``TopPLogitsWarper`` with ties kept together:
   the most likely token always stays);
6. min-p: keep ``e_i >= min_p`` (transformers' ``MinPLogitsWarper``: below ``min_p`` times the top
   probability is dropped);
7. the draw: ``u = (x0 >> 8) * 2**-24`` with ``x0`` the first word of Philox4x32-10 (Salmon et al.
   2011, the generator of cuRAND and PyTorch) keyed by the 64-bit seed ``(seed & 0xffffffff, seed >> 32)``
   at counter ``(n & 0xffffffff, n >> 32, r, 0)``; the token is the first index (vocabulary order)
   whose cumulative kept ``e`` exceeds ``u`` times the kept total (the last kept one when rounding
   leaves none).

Each filter is a threshold on ``s``, so no sort is needed: the gpu target runs the rule as kernels
after the program's logits (:mod:`mgx_graph.operators.token_sampling_gpu`), writing the id on the
device, and gives the tokens of this numpy implementation up to float rounding at a boundary (sums
in another order, ``expf``).  The same seed, steps and logits give the same tokens on every run.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ParameterError

SEED_MAX = (1 << 64) - 1


def _number(name: str, value, low: float, high: float, low_open: bool = False) -> float:
    """``value`` as a float in [low, high] (``(low, high]`` with ``low_open``); ParameterError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ParameterError(f"{name} must be a number, got {value!r}")
    v = float(value)
    bad_low = v <= low if low_open else v < low
    if not np.isfinite(v) or bad_low or v > high:
        lo = "(" if low_open else "["
        raise ParameterError(f"{name} must be in {lo}{low:g}, {high:g}], got {value!r}")
    return v


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen; names and defaults as in transformers' ``GenerationConfig``.

    Attributes:
        do_sample: sample (True) or take the argmax (False, default).
        temperature: > 0; logits are divided by it when sampling (1.0: unchanged).
        top_k: keep the k most likely tokens when sampling (50); None or 0: no top-k.
        top_p: keep the smallest set of most likely tokens whose probability adds up to at least
            top_p, in (0, 1] (1.0: no top-p).
        min_p: in [0, 1]; drop tokens less likely than min_p times the most likely one (None: off).
        repetition_penalty: > 0; 1.0 is off (see the module docstring for the rule).
        seed: the Philox key of the draws, an int in [0, 2**64 - 1] (None: fresh OS entropy).

    Raises ParameterError (naming the option, expected vs given) for a value out of range.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = 50
    top_p: float = 1.0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.do_sample, (bool, np.bool_)):
            raise ParameterError(f"do_sample must be True or False, got {self.do_sample!r}")
        _number("temperature", self.temperature, 0.0, np.inf, low_open=True)
        _number("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _number("repetition_penalty", self.repetition_penalty, 0.0, np.inf, low_open=True)
        if self.min_p is not None:
            _number("min_p", self.min_p, 0.0, 1.0)
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0):
            raise ParameterError(f"top_k must be a non-negative int or None, got {k!r}")
        s = self.seed
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0):
            raise ParameterError(f"seed must be a non-negative int or None, got {s!r}")
        if s is not None and int(s) > SEED_MAX:
            raise ParameterError(f"seed must be at most 2**64 - 1 ({SEED_MAX}), got {s!r}")



# -- the rule ------------------------------------------------------------------------------------------
def repetition_penalty(scores: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """``scores`` float32 [B, V] with every seen token's logit divided by ``penalty`` when >= 0 and
    multiplied by it when < 0; ``seen`` bool [B, V]. Returns a new array."""
    penalized = np.where(scores < 0, scores * np.float32(penalty), scores / np.float32(penalty))
    return np.where(seen, penalized, scores).astype(np.float32, copy=False)


def temperature(scores: np.ndarray, value: float) -> np.ndarray:
    """``scores / value`` in float32."""
    return (scores / np.float32(value)).astype(np.float32, copy=False)


def _weights(s: np.ndarray) -> np.ndarray:
    """``e = exp(s - max(s))`` per row in float64 (a -inf value weighs 0)."""
    x = s.astype(np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        return np.exp(x - np.where(np.isfinite(m), m, 0.0))


def _mass_above(s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Per element, the sum of ``e`` over the row's elements with a strictly greater ``s``."""
    order = np.argsort(-s, axis=-1, kind="stable")
    vs = np.take_along_axis(s, order, axis=-1)
    es = np.take_along_axis(e, order, axis=-1)
    before = np.cumsum(es, axis=-1) - es  # mass of the elements sorted before each one
    pos = np.arange(s.shape[-1])
    start = np.concatenate([np.ones((len(s), 1), bool), vs[:, 1:] != vs[:, :-1]], axis=-1)
    first = np.maximum.accumulate(np.where(start, pos, 0), axis=-1)  # where each run of ties starts
    above_sorted = np.take_along_axis(before, first, axis=-1)
    out = np.empty_like(above_sorted)
    np.put_along_axis(out, order, above_sorted, axis=-1)
    return out


def kept(s: np.ndarray, config: "SamplingConfig") -> np.ndarray:
    """bool [B, V]: the tokens that top-k, top-p and min-p keep (steps 4-6 of the module docstring)
    of the penalized, temperature-scaled ``s`` float32 [B, V]."""
    s = np.asarray(s, np.float32)
    v = s.shape[-1]
    e = _weights(s)
    keep = np.ones(s.shape, bool)
    k = config.top_k or 0
    if 0 < k < v:
        kth = np.partition(s, v - k, axis=-1)[:, v - k:v - k + 1]
        keep &= s >= kth
    if config.top_p < 1.0:
        ek = np.where(keep, e, 0.0)
        z = np.sum(ek, axis=-1, keepdims=True)
        keep &= _mass_above(s, ek) < config.top_p * z
    if config.min_p is not None:
        keep &= e >= config.min_p
    return keep


def process_logits(scores: np.ndarray, seen: np.ndarray | None, config: SamplingConfig) -> np.ndarray:
    """Steps 1-6 of the module docstring on ``scores`` float32 [B, V] (``seen`` bool [B, V]: each row's
    seen tokens, used with a repetition penalty): float32 [B, V] with every dropped token at -inf.
    The input is not modified."""
    out = np.asarray(scores, dtype=np.float32)
    if config.repetition_penalty != 1.0 and seen is not None:
        out = repetition_penalty(out, seen, config.repetition_penalty)
    if not config.do_sample:
        return out
    if config.temperature != 1.0:
        out = temperature(out, config.temperature)
    return np.where(kept(out, config), out, np.float32(-np.inf))


_PHILOX_M = (0xD2511F53, 0xCD9E8D57)
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)
_U32 = np.uint64(0xFFFFFFFF)


def philox4x32(counter, key) -> np.ndarray:
    """Philox4x32-10 of ``counter`` uint [..., 4] under ``key`` (two 32-bit words): uint32 [..., 4]."""
    c = [np.asarray(counter, np.uint64)[..., j] & _U32 for j in range(4)]
    k0, k1 = np.uint64(int(key[0]) & 0xFFFFFFFF), np.uint64(int(key[1]) & 0xFFFFFFFF)
    m0, m1 = np.uint64(_PHILOX_M[0]), np.uint64(_PHILOX_M[1])
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(_PHILOX_W[0])) & _U32, (k1 + np.uint64(_PHILOX_W[1])) & _U32
        p0, p1 = m0 * c[0], m1 * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _U32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _U32]
    return np.stack(c, axis=-1).astype(np.uint32)


def uniforms(seed: int, step: int, rows: int) -> np.ndarray:
    """The draw's ``u`` (float64 in [0, 1), a multiple of 2**-24) of rows ``0..rows-1`` at ``step``."""
    counter = np.zeros((rows, 4), np.uint64)
    counter[:, 0], counter[:, 1], counter[:, 2] = step & 0xFFFFFFFF, step >> 32, np.arange(rows)
    x0 = philox4x32(counter, (seed & 0xFFFFFFFF, seed >> 32))[:, 0]
    return (x0 >> np.uint32(8)).astype(np.float64) * 2.0 ** -24


def draw(scores: np.ndarray, u: np.ndarray) -> np.ndarray:
    """One token per row of processed ``scores`` [B, V] (dropped tokens at -inf) for ``u`` [B]: the first
    index whose float64 cumulative ``exp(s - max)`` exceeds ``u`` times the row total (int64 [B])."""
    w = _weights(np.asarray(scores, np.float32))
    out = np.empty(len(w), np.int64)
    for b, row in enumerate(w):
        c = np.cumsum(row)
        i = int(np.searchsorted(c, u[b] * c[-1], side="right"))
        out[b] = i if i < len(row) else int(np.flatnonzero(row)[-1])
    return out


def _entropy_seed() -> int:
    lo, hi = (int(w) for w in np.random.SeedSequence().generate_state(2, np.uint32))
    return lo | (hi << 32)


class TokenSampler:
    """Chooses the next token of ``batch`` rows over a vocabulary of ``vocab_size`` tokens (host rule).

    One per generation: it holds the seed (:attr:`seed`, drawn from OS entropy when the config has
    none), the step counter (:attr:`step`: :meth:`choose` and :meth:`next_step` advance it) and, with
    a repetition penalty, each row's seen tokens (bool [batch, vocab_size], fed by :meth:`observe`).
    """

    def __init__(self, config: SamplingConfig, batch: int, vocab_size: int):
        self.config = config
        self.vocab_size = int(vocab_size)
        self.batch = int(batch)
        self.seed = int(config.seed) if config.seed is not None else _entropy_seed()
        self.step = 0
        self.seen = np.zeros((batch, vocab_size), bool) if config.repetition_penalty != 1.0 else None

    @property
    def needs_logits(self) -> bool:
        """True when the rule needs more than the argmax of the raw logits (sampling or a repetition
        penalty): the host reads the logits rows, or the gpu target runs the rule's kernels."""
        return self.config.do_sample or self.seen is not None

    def observe(self, row: int, token_ids) -> None:
        """Mark ``token_ids`` as seen in ``row`` (for the repetition penalty)."""
        if self.seen is not None:
            self.seen[row, np.asarray(list(token_ids), np.int64)] = True

    def next_step(self) -> int:
        """The step of the next choice (its Philox counter), and the counter advanced."""
        self.step += 1
        return self.step - 1

    def choose(self, scores: np.ndarray) -> np.ndarray:
        """The next token of each row (int64 [B]) from raw logits ``scores`` [B, V] (any float dtype)."""
        scores = np.asarray(scores, dtype=np.float32).reshape(-1, self.vocab_size)
        processed = process_logits(scores, self.seen, self.config)
        step = self.next_step()
        if self.config.do_sample:
            return draw(processed, uniforms(self.seed, step, len(processed)))
        return np.argmax(processed, axis=-1).astype(np.int64)
