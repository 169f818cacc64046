"""The parameters a program writes in place: the instructions bound to them (``bind_param``, set by
``bind_outputs``) and the views through which those instructions write.

A writer bound to a parameter (the present KV cache written into the past buffer) must write into the
array the caller passed for that parameter, in the layout the writer was planned with.  Before a run
:meth:`WrittenParameters.bind` puts, for every writer, the parameter's current array (a strided view
of it when the planned layout is not standard, made once per array) into the writer's value slot; a
writer returning a tuple (a fused instruction writing several caches) gets a tuple of those views and
of arena buffers for its results that are not bound.
"""
from __future__ import annotations

from ..passes.analysis import bound_params


class WrittenParameters:
    """The bound writers of a program's modules; ``slots``: the parameter slots written in place."""

    def __init__(self, buffers, plan, main):
        slot = buffers.slot
        self.ctx = buffers.ctx
        writers = [i for m in buffers.modules for i in m.instructions if "bind_param" in i.meta]
        self.writers = writers
        self.single = [(slot[id(i)], slot[id(main.get_parameter(i.meta["bind_param"]))], i.shape)
                       for i in writers if not isinstance(i.shape, tuple)]
        self.tuples = [(slot[id(i)], self._tuple_elements(buffers, plan, i, main)) for i in writers
                       if isinstance(i.shape, tuple)]
        self.slots = {ps for _, ps, _ in self.single} | \
            {ps for _, elems in self.tuples for ps, _, _ in elems if ps is not None}
        self.views: dict = {}

    @staticmethod
    def _tuple_elements(buffers, plan, ins, main) -> list:
        """``[(parameter slot or None, layout, own array or None)]`` per result of ``ins``, a tuple
        writer with some results bound into parameters: a bound one is written into its parameter's
        array (in ``layout``), the others into their arena buffers."""
        names = dict(bound_params(ins))
        return [(buffers.slot[id(main.get_parameter(names[k]))], s, None) if k in names else
                (None, s, buffers.ctx.array(buffers.arena, plan.offsets[(id(ins), k)], s))
                for k, s in enumerate(ins.shape)]

    def bind(self, env) -> None:
        """Every writer's slot of ``env`` reads its parameter's current array (see the module docstring)."""
        for bs, ps, layout in self.single:
            env[bs] = self._view(bs, env[ps], layout)
        for bs, elems in self.tuples:
            vals = tuple(own if ps is None else self._view((bs, k), env[ps], layout)
                         for k, (ps, layout, own) in enumerate(elems))
            old = env[bs]
            if not (isinstance(old, tuple) and all(x is y for x, y in zip(old, vals))):
                env[bs] = vals  # a new tuple only when an array changed (its views are remade then)

    def _view(self, key, a, layout):
        """``a`` (a parameter's array) in ``layout``: a strided view of it, made once per array."""
        hit = self.views.get(key)
        if hit is not None and hit[0] is a:
            return hit[1]
        v = a if layout.standard() else self.ctx.xp.lib.stride_tricks.as_strided(a, layout.lens, layout.byte_strides())
        self.views[key] = (a, v)
        return v

    def forget_views(self) -> None:
        self.views = {}
