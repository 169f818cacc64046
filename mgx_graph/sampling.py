"""The next token from a decode step's logits: greedy, or sampled with a temperature, top-k,
top-p (nucleus), min-p and a repetition penalty, as transformers' ``generate`` does.

Order, as in transformers' ``GenerationMixin._get_logits_processor`` (transformers 5.x,
``generation/utils.py``; the processors are in ``generation/logits_process.py``):

1. repetition penalty (``RepetitionPenaltyLogitsProcessor``) -- applied greedy or not: the
   logit of every token already seen in the row (its prompt and what it generated so far) is
   divided by the penalty when it is positive (zero included) and multiplied by it when negative;
2. only when sampling (``do_sample``), the warpers: temperature (``TemperatureLogitsWarper``:
   logits / temperature), top-k (``TopKLogitsWarper``: logits below the k-th largest become
   -inf; ties with it stay), top-p (``TopPLogitsWarper``: sorted ascending, the tokens whose
   cumulative softmax probability is <= 1 - top_p become -inf, the most likely one always stays),
   min-p (``MinPLogitsWarper``: tokens whose probability is below min_p times the top
   probability become -inf).

Then greedy decoding takes the first index of the largest logit. Sampling takes, per row in row
order, one draw ``u = rng.random()`` (a float64 in [0, 1)) from a ``numpy.random.Generator``
made once per generation with ``numpy.random.default_rng(seed)``, and picks the first token
whose cumulative probability exceeds ``u`` times the total: the probabilities are the float64
softmax of the processed logits (a -inf logit has probability 0 and is never picked), summed in
vocabulary order. The same seed and logits give the same tokens.

All arrays here are host (numpy) arrays: logits float32 [B, vocab], tokens int64 [B]. Where the
logits live on a device, the decoder reads back the logits rows once per step when
:attr:`TokenSampler.needs_logits` (B * vocab * 4 bytes; 192 KiB per row for a 49152-token
vocabulary) and otherwise only the B argmax ids.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import ParameterError


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
        seed: seed of the generation's ``numpy.random.Generator`` (None: fresh OS entropy).

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


# -- the processors, in transformers' order ------------------------------------------------------------
def repetition_penalty(scores: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """``scores`` float32 [B, V] with every seen token's logit divided by ``penalty`` when >= 0 and
    multiplied by it when < 0; ``seen`` bool [B, V]. Returns a new array."""
    penalized = np.where(scores < 0, scores * np.float32(penalty), scores / np.float32(penalty))
    return np.where(seen, penalized, scores).astype(np.float32, copy=False)


def temperature(scores: np.ndarray, value: float) -> np.ndarray:
    """``scores / value`` in float32."""
    return (scores / np.float32(value)).astype(np.float32, copy=False)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Logits below the row's k-th largest become -inf (ties with it are kept); k is capped at V."""
    v = scores.shape[-1]
    k = min(int(k), v)
    kth = np.partition(scores, v - k, axis=-1)[:, v - k:v - k + 1]
    return np.where(scores < kth, np.float32(-np.inf), scores)


def _softmax64(scores: np.ndarray) -> np.ndarray:
    x = scores.astype(np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(m), m, 0.0))
    return e / np.sum(e, axis=-1, keepdims=True)


def top_p(scores: np.ndarray, p: float) -> np.ndarray:
    """Sorted ascending, the tokens whose cumulative probability is <= 1 - p become -inf; the most
    likely token always stays."""
    order = np.argsort(scores, axis=-1, kind="stable")
    ordered = np.take_along_axis(scores, order, axis=-1)
    cumulative = np.cumsum(_softmax64(ordered), axis=-1)
    drop_sorted = cumulative <= 1.0 - p
    drop_sorted[:, -1] = False
    drop = np.zeros_like(drop_sorted)
    np.put_along_axis(drop, order, drop_sorted, axis=-1)
    return np.where(drop, np.float32(-np.inf), scores)


def min_p(scores: np.ndarray, value: float) -> np.ndarray:
    """Tokens whose probability is below ``value`` times the row's top probability become -inf
    (the most likely token always stays)."""
    probs = _softmax64(scores)
    drop = probs < value * np.max(probs, axis=-1, keepdims=True)
    drop[np.arange(len(scores)), np.argmax(probs, axis=-1)] = False
    return np.where(drop, np.float32(-np.inf), scores)


def process_logits(scores: np.ndarray, seen: np.ndarray | None, config: SamplingConfig) -> np.ndarray:
    """Apply the processors of ``config`` in transformers' order (module docstring) to ``scores``
    float32 [B, V]; ``seen`` bool [B, V] marks each row's seen tokens (needed with a repetition
    penalty). Returns float32 [B, V]; the input is not modified."""
    out = np.asarray(scores, dtype=np.float32)
    if config.repetition_penalty != 1.0 and seen is not None:
        out = repetition_penalty(out, seen, config.repetition_penalty)
    if not config.do_sample:
        return out
    if config.temperature != 1.0:
        out = temperature(out, config.temperature)
    if config.top_k:
        out = top_k(out, config.top_k)
    if config.top_p < 1.0:
        out = top_p(out, config.top_p)
    if config.min_p is not None:
        out = min_p(out, config.min_p)
    return out


def draw(scores: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per row of processed ``scores`` [B, V]: the first index whose float64 cumulative
    softmax probability exceeds ``rng.random()`` times the row total (int64 [B])."""
    probs = _softmax64(scores)
    out = np.empty(len(probs), np.int64)
    for b, row in enumerate(probs):
        c = np.cumsum(row)
        out[b] = min(int(np.searchsorted(c, rng.random() * c[-1], side="right")), len(row) - 1)
    return out


class TokenSampler:
    """Chooses the next token of ``batch`` rows over a vocabulary of ``vocab_size`` tokens.

    One per generation: it holds the seeded ``numpy.random.Generator`` and, with a repetition
    penalty, each row's seen tokens (bool [batch, vocab_size], fed by :meth:`observe`).
    """

    def __init__(self, config: SamplingConfig, batch: int, vocab_size: int):
        self.config = config
        self.vocab_size = int(vocab_size)
        self.rng = np.random.default_rng(config.seed)
        self.seen = np.zeros((batch, vocab_size), bool) if config.repetition_penalty != 1.0 else None

    @property
    def needs_logits(self) -> bool:
        """True when the logits rows are needed on the host (sampling or a repetition penalty);
        False when a device argmax of the raw logits is the answer."""
        return self.config.do_sample or self.seen is not None

    def observe(self, row: int, token_ids) -> None:
        """Mark ``token_ids`` as seen in ``row`` (for the repetition penalty)."""
        if self.seen is not None:
            self.seen[row, np.asarray(list(token_ids), np.int64)] = True

    def choose(self, scores: np.ndarray) -> np.ndarray:
        """The next token of each row (int64 [B]) from raw logits ``scores`` [B, V] (any float dtype)."""
        scores = np.asarray(scores, dtype=np.float32).reshape(-1, self.vocab_size)
        processed = process_logits(scores, self.seen, self.config)
        if self.config.do_sample:
            return draw(processed, self.rng)
        return np.argmax(processed, axis=-1).astype(np.int64)
