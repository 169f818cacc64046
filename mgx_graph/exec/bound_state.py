"""Parameters bound once as a program's state (:meth:`mgx_graph.exec.compiled.CompiledProgram.bind_state`).

A decode step's KV cache is the same arrays every step.  Bound as state, they are validated once and
held as the executor's own views (``a.view()``: the same memory, kept alive by the view, in an object
nobody else holds, so a caller reshaping its own object in place changes nothing the program reads).
Every full bind of a ``run_async`` then binds ``{**state, **params}``, exactly what a call passing
every array would bind (copies, staging, written parameters and graph keys alike); only the record
of the call (:class:`~mgx_graph.graph.replay.CallRecord`) is the call's own: the names and objects it
brought, the state views being fixed.
"""
from __future__ import annotations

from ..errors import ParameterError
from .interop import type_name


class BoundState:
    """The state of one executor: ``views`` (parameter name -> the executor's view), ``order`` (the
    names a ``run_async`` brings: the parameters not bound, in the executor's order) and ``serial``
    (counts the bindings: which one is current)."""

    __slots__ = ("views", "order", "every", "serial")

    def __init__(self, param_order):
        self.every = list(param_order)
        self.views: dict = {}
        self.order = self.every
        self.serial = 0

    def set(self, views: dict) -> int:
        """Bind ``views`` (validated by :func:`state_views`); returns the new :attr:`serial`."""
        self.views = views
        self.order = [n for n in self.every if n not in views] if views else self.every
        self.serial += 1
        return self.serial

    def merged(self, params):
        """What a call with ``params`` binds: ``{**state, **params}`` (``params`` as it is without state)."""
        return {**self.views, **params} if self.views and isinstance(params, dict) else params

    def call_values(self, params, given):
        """The objects a call brought, in :attr:`order` order, from ``given`` (every parameter's, in the
        executor's order); None when the call named a state parameter (such a call is not recorded)."""
        if not self.views:
            return given
        if any(k in self.views for k in params):
            return None
        by_name = dict(zip(self.every, given))
        return [by_name[n] for n in self.order]


def state_views(ex, params) -> dict:
    """``{name: view}`` of ``params`` for executor ``ex``, each value checked as ``run_async`` checks it:
    the target's own array (numpy on ``ref``, CuPy on ``gpu`` device ``device_id``), C-contiguous, of
    the parameter's shape and dtype, writable when the parameter is written in place.  ``None`` gives
    ``{}``.  Raises ParameterError naming the parameter (expected vs given); touches no state."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise ParameterError(f"state must be a dict of name -> array, got {type(params).__name__}")
    unknown = [k for k in params if k not in ex.param_names]
    if unknown:
        raise ParameterError(f"unknown parameter(s) {unknown} given as state; the program takes "
                             f"{sorted(ex.param_names)}")
    ctx, views = ex.ctx, {}
    for name, s, lens, dt, shape in ex._param_checks:
        if name not in params:
            continue
        a = params[name]
        if not ctx.is_device_array(a):
            native = "cupy.ndarray" if ctx.name == "gpu" else "numpy.ndarray"
            raise ParameterError(f"parameter '{name}' (state): expected a {ctx.name} device array ({native}), "
                                 f"got {type_name(a)}")
        a, _ = ex._checked(a, name, lens, dt, shape, ctx.queue, True)
        if not a.flags.c_contiguous:
            raise ParameterError(f"parameter '{name}' (state): the array must be C-contiguous (strides "
                                 f"{a.strides})")
        ex._check_writable([(s, a)])
        views[name] = a.view()
    return views
