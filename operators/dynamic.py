"""Data-dependent shapes: what a specialization depends on.

When an output shape depends on data (``NonZero``, ``Unique``, ``TopK`` with a runtime ``k``, or a
``Reshape`` / ``Expand`` / ``ConstantOfShape`` / ``Slice`` / ``Range`` / ``Tile`` fed by runtime values),
the program is compiled for the value it sees (a *specialization*, keyed by that value) and a
``guard`` instruction re-checks the value on every run.  ``fn`` names how a tensor is reduced to the
key: its ``value``, its ``count_nonzero``, ``unique_count`` ..., or ``at_least:N`` (``max(N, value)`` of
a scalar: one specialization serves every value up to N, e.g. the total sequence length of a decode
step with a KV cache of N rows).
"""
from __future__ import annotations

from typing import Any

import numpy as np


def reduce_for_key(fn: str, value) -> np.ndarray:
    v = np.asarray(value)
    if fn == "value":
        return v.copy()
    if fn == "count_nonzero":
        return np.asarray(int(np.count_nonzero(v)), np.int64)
    if fn.startswith("unique_count"):
        axis = fn.split(":", 1)[1] if ":" in fn else "none"
        if axis == "none":
            return np.asarray(int(np.unique(v.reshape(-1)).size), np.int64)
        return np.asarray(int(np.unique(v, axis=int(axis)).shape[int(axis)]), np.int64)
    if fn == "trip_count":
        return np.asarray(int(v), np.int64)
    if fn.startswith("at_least:"):
        return np.asarray(max(int(fn.split(":", 1)[1]), int(v.reshape(-1)[0])), np.int64)
    raise ValueError(f"unknown key function {fn}")


class NeedsValue(Exception):
    """Raised by the frontend: the shape at ``node`` depends on ``fn(tensor)``, unknown at compile time."""

    program: Any  # set by the parser: the program parsed so far, which computes the tensor
    ins: Any  # set by the parser: the instruction whose value is needed

    def __init__(self, tensor: str, fn: str, node: str, guess=None, inputs=None, evaluate=None):
        self.tensor, self.fn, self.node, self.guess = tensor, fn, node, guess
        self.inputs, self.evaluate = inputs, evaluate  # several inputs evaluated together on the host
        super().__init__(f"node '{node}': output shape depends on {fn}({tensor}) at run time")

    @property
    def key(self) -> str:
        return f"{self.fn}:{self.tensor}"


class SpecializationMiss(Exception):
    """Raised by a guard at run time: the value differs from the one the program was compiled for."""

    def __init__(self, key: str, observed: np.ndarray, expected: np.ndarray):
        self.key, self.observed, self.expected = key, observed, expected
        super().__init__(f"guard {key}: run-time value {observed.tolist()} != specialized {expected.tolist()}")
