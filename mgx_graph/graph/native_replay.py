"""The native replay: a repeated replay of a one-region program in one C call (``cpp/replay.c``).

On a device target, a repeated ``run_async`` that the replay plan (:mod:`mgx_graph.graph.replay_plan`) replays
still runs about twenty Python calls: the repeated-call check (:mod:`mgx_graph.graph.call_record`), the plan's
checks, the graph state's replay branch and the counters.  Once the plan has replayed the same call
twice in a row, :func:`arm` hands a :class:`mgx_graph._native.Replay` to the executor, which calls it
first on every ``run_async``.  It holds the launch, capture-status and current-device functions of the
runtime (:meth:`mgx_graph.runtime.Runtime.native_replay_calls`), the graph exec and the queue, and as
data every check the Python path makes and every update it applies:

* checks: both locks free (taken without blocking, as the Python path would take them), the call's
  parameters the recorded objects with their recorded layouts (a numpy array's shape, strides and
  dtype, a device array's shape; the arrays written in place still writeable) in a dict of the
  recorded size, the same
  queue, ``copy`` false, the executor open with the same record and plan, the region's last call, bind
  epoch and inputs unchanged, the key's exec the only one cached and the same, no eager mode, no
  validation, no slower-than-eager gate pending, no debug trace, the region's result value in its slot,
  the device current, no capture open on the queue;
* updates: the executor's ``runs`` / ``fast_path_hits`` / ``replay_plan_hits``, the state's ``calls`` and
  ``counters.replays``, the entry's ``replays``, ``last_launches`` / ``last_event``, the eval loop's
  ``launches`` and the context's current queue; the outputs are the list the plan would return.

When a check fails, or the launch returns an error, the call returns None having changed nothing and
the executor drops it and runs the Python path (which raises what it would raise); results, counters,
trace and errors are those of the Python path either way.  Arming needs the ``_native`` module (built
from ``cpp/replay.c`` at install when a C compiler is present) and ``MIGRAPHX_NATIVE_REPLAY`` unset or true
(:func:`available`).  A C object that was dropped without having replayed once counts as cold; after
:data:`COLD_LIMIT` cold ones in a row the plan stops arming (a loop whose calls all miss would otherwise
pay the arming on every call).  ``Replay.hits`` counts the calls an object replayed.
"""
from __future__ import annotations

import numpy as np

from .. import settings as mgx_settings

try:
    from .. import _native
except ImportError:  # built without a C compiler: the Python path replays
    _native = None  # type: ignore[assignment]  # no module: available() says so before any use

IS, EQ, LEN = 0, 1, 2  # how an attribute check compares (cpp/replay.c)
COLD_LIMIT = 2  # C objects dropped in a row without a replay before the plan stops arming


def available(settings=None) -> bool:
    """Whether the native replay can arm here: the module is built and ``MIGRAPHX_NATIVE_REPLAY`` of
    ``settings`` (a compiled program's; default: :func:`mgx_graph.settings.current`) is on.  On by
    default: 9.9 against 15-33 host us per W1 step on an H200, 2026-12-03."""
    return _native is not None and (settings or mgx_settings.current()).native_replay


def _stable(ex, state, entry, rec) -> bool:
    """Whether nothing in the call's path would take another branch than the plain replay."""
    opts = state.options
    return (rec is not None and not rec.copies and not rec.staged and not rec.copy
            and not ex._rebind_per_run and not ex.released and not state.debug and not state.force_eager
            and (not opts.validate or state.validator is None) and len(state.entries) == 1
            and (not opts.gate_slower or len(entry.times) >= 3) and entry.exec is not None)


def _result_checks(plan, state, entry, env) -> tuple | None:
    """``(items, attrs)``: checks that the region's result value is what the plan would compute and
    what its slot holds (one result: the cached list's first array; several: the state's last result
    pair, whose tuple ``result_of`` returns while it is that pair), or None when the slot holds another
    value."""
    outs = entry.outputs
    result = plan.region.op.result_of(outs)
    if env[plan.out] is not result:
        return None
    items = [(env, plan.out, result)]
    if plan.region.op._single:
        return items + [(outs, 0, result)], []
    return items, [(state, "last_result", state.last_result, IS)]


def arm(ex, plan, state, key, queue: int):
    """The :class:`mgx_graph._native.Replay` of the call just replayed by ``plan`` on ``queue`` (the
    executor's lock held), or None when it cannot be armed (see the module docstring)."""
    rt, rec, entry = ex.ctx.runtime, ex._record, state.entries.get(key)
    calls = rt.native_replay_calls()
    handle = rt.native_handle(entry.exec) if entry is not None else None
    if calls is None or handle is None or plan.device is None or not _stable(ex, state, entry, rec):
        return None
    env, loop, last = ex.env, ex.loop, state.last_call
    checks = _result_checks(plan, state, entry, env)
    if checks is None or rec.queue != queue:
        return None
    results, result_attrs = checks
    names = rec.names
    attrs = ((ex, "released", False, IS), (ex, "_record", rec, IS), (ex, "_replay_plan", plan, IS),
             (ex, "_rebind_per_run", False, IS), (ex, "loop", loop, IS), (loop, "epoch", last[1], EQ),
             (loop, "runner", loop.runner, IS), (loop.runner, "_env", env, IS),
             (state, "last_call", last, IS), (state, "entries", state.entries, IS), (state, "entries", 1, LEN),
             (state, "force_eager", state.force_eager, IS), (state, "debug", state.debug, IS),
             (state, "options", state.options, IS), (state.options, "validate", state.options.validate, EQ),
             (state, "validator", state.validator, IS),
             (state.options, "gate_slower", state.options.gate_slower, EQ), (entry, "times", len(entry.times), LEN),
             (entry, "exec", entry.exec, IS), (entry, "outputs", entry.outputs, IS),
             (state, "counters", state.counters, IS), (ex, "ctx", ex.ctx, IS), *result_attrs)
    items = tuple([(state.entries, key, entry), *[(env, s, a) for s, a in zip(plan.slots, last[2])], *results])
    counts = ((ex, "runs"), (ex, "fast_path_hits"), (ex, "replay_plan_hits"), (state, "calls"),
              (state.counters, "replays"), (entry, "replays"))
    sets = ((ex.ctx, "current_queue", queue), (state, "last_launches", 1), (state, "last_event", "REPLAY"),
            (loop, "launches", plan.launches + 1))
    return _native.Replay(*calls, handle, queue, plan.device, ex.ctx, (ex.lock, state.lock), names,
                          tuple(rec.values), _layouts(rec), tuple(rec.writeable), attrs, items, counts, sets,
                          loop.runner._returns[plan.main.name], env)


def _layouts(rec) -> tuple:
    """Per recorded value, the attributes :meth:`~mgx_graph.graph.call_record.CallRecord.matches` compares and
    their recorded values: shape, strides and dtype of a numpy array, the shape of a device array."""
    host, device = iter(rec.layouts), iter(rec.shapes)
    return tuple((("shape", "strides", "dtype"), tuple(next(host))) if isinstance(v, np.ndarray)
                 else (("shape",), (next(device),)) for v in rec.values)
