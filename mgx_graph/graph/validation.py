"""Validation mode of a ``graph_launch`` region: replays checked against eager runs.

With ``GraphOptions.validate`` on, the first ``validate_first`` replays of every key and every
``validate_every``-th after also run the body eagerly and the two results are compared
(``|replay - eager| <= atol + rtol * |eager|``, NaN equal to NaN).  The state a region writes in
place (parameters bound with ``alias``) is snapshotted before the replay and restored before the
eager run, so both compute from the same inputs and the state still advances once per call.  A
mismatch disables the key: that call and every later one with the key run eagerly, and the eager
result is what the call returns.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np


class Validator:
    """Snapshots and comparisons of one region: ``state_arrays_fn()`` gives the arrays the region
    writes in place (device arrays of the context ``ctx``)."""

    def __init__(self, ctx, state_arrays_fn):
        self.ctx = ctx
        self.state_arrays_fn = state_arrays_fn

    def snapshot(self, queue):
        xp = self.ctx.xp
        with self.ctx.on_queue(queue):
            return [(a, xp.array(a, copy=True)) for a in self.state_arrays_fn()]

    def restore(self, snap, queue):
        for dst, src in snap:
            self.ctx.copy(queue, dst, src)

    def copy_outputs(self, outs, queue):
        xp = self.ctx.xp
        with self.ctx.on_queue(queue):
            return [xp.array(o, copy=True) for o in outs]

    def max_error(self, a, b, queue, rtol, atol):
        """None when every pair is within ``atol + rtol * |b|``, else the largest absolute error."""
        worst, bad = 0.0, False
        for x, y in zip(a, b):
            hx = np.asarray(self.ctx.to_host(x, queue), dtype=np.float64)
            hy = np.asarray(self.ctx.to_host(y, queue), dtype=np.float64)
            diff = np.abs(hx - hy)
            both_nan = np.isnan(hx) & np.isnan(hy)
            diff = np.where(both_nan, 0.0, diff)
            if np.any(np.isnan(diff)) or np.any(diff > atol + rtol * np.abs(hy)):
                bad = True
            if diff.size:
                worst = max(worst, float(np.nanmax(diff)) if not np.all(np.isnan(diff)) else float("inf"))
        return worst if bad else None


class ValidatedReplay:
    """The validation steps of :class:`~mgx_graph.graph.cache.GraphLaunchState` (a mixin: it uses the
    state's ``options``, ``validator``, ``rt``, ``counters``, ``trace`` and ``_disable``)."""

    options: Any  # the region's GraphOptions (mgx_graph.graph.cache, which imports this module)
    validator: Optional[Validator]

    def _validation_due(self, e) -> bool:
        if not self.options.validate or self.validator is None:
            return False
        n = e.replays
        return n < self.options.validate_first or (n - self.options.validate_first) % self.options.validate_every \
            == self.options.validate_every - 1

    def _replay_validated(self, e, key, queue, run_body, read_outputs):
        v = self.validator
        snap = v.snapshot(queue)
        self.rt.hipGraphLaunch(e.exec, queue)
        e.replays += 1
        self.counters.replays += 1
        graph_out = v.copy_outputs(e.outputs, queue)
        v.restore(snap, queue)
        run_body()
        eager_out = read_outputs()
        err = v.max_error(graph_out, eager_out, queue, self.options.rtol, self.options.atol)
        self.counters.validations += 1
        self.last_launches = 1  # the eager run's kernels are counted by the callback that ran them
        if err is None:
            self.trace("VALIDATE", e.key_str, "replay == eager")
            return eager_out
        self.counters.validation_mismatches += 1
        self._disable(key, e, f"validation mismatch: max error {err:.3g} between replay and eager")
        self.trace("VALIDATE", e.key_str, f"MISMATCH max error {err:.3g}: key disabled, eager from now on")
        return eager_out
