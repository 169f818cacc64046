"""``rotary_kv_write``: GroupQueryAttention's decode writes as one instruction (made by the
``fuse_rotary_kv`` pass, :mod:`mgx_graph.passes.fuse_rotary_kv`): the ``rotary_embedding`` of the
query and the two ``kv_cache_update`` of one layer (the key rows rotated, the value rows), which read
the same start rows and position ids.

Inputs: those of the three instructions, concatenated: the rotation's (x, cos, sin, position ids),
then the key update's (past_key, new keys, start, rows, cos, sin, position ids), then the value
update's (past_value, new values, start, rows); ``n_q`` / ``n_k`` count the first two groups.
Output: the tuple (rotated query, present key, present value), each as its instruction gives it.
The present key / value may be written into the past buffers (``inplace_input``: bound in place by
``bind_outputs``, only the new rows are written then).

Execution: ``ref`` runs the three ops' own kernels in order (the unfused results, bit for bit; an
out-of-range start or position id raises as theirs do); ``gpu`` runs one ``mgx_rotary_kv_write``
launch of ``llm_kernels.cu`` (:func:`.llm_gpu.rotary_kv_kernel`) whose grid covers the three parts.
"""
from __future__ import annotations

from ..errors import ShapeError
from .base import Operation, register_op


@register_op
class RotaryKvWrite(Operation):
    """``rotary_kv_write[rotary, key, value, n_q, n_k]``: ``rotary`` / ``key`` / ``value`` are the
    attributes of the ``rotary_embedding`` and the two ``kv_cache_update`` ops it runs (see the module
    docstring).  Raises ShapeError when the inputs do not fit the parts (their own checks)."""

    name = "rotary_kv_write"

    def __init__(self, rotary=None, key=None, value=None, n_q=4, n_k=7):
        super().__init__(rotary=dict(rotary or {}), key=dict(key or {}), value=dict(value or {}),
                         n_q=int(n_q), n_k=int(n_k))

    def parts(self) -> tuple:
        """The (rotary_embedding, kv_cache_update key, kv_cache_update value) ops."""
        from .base import make_op

        a = self.attrs
        return make_op("rotary_embedding", **a["rotary"]), make_op("kv_cache_update", **a["key"]), \
            make_op("kv_cache_update", **a["value"])

    def split(self, values) -> tuple:
        """``values`` (inputs or arguments) cut into the three parts' lists."""
        q, k = self.attrs["n_q"], self.attrs["n_k"]
        return list(values[:q]), list(values[q:q + k]), list(values[q + k:])

    def compute_shape(self, inputs, mods=()):
        parts, groups = self.parts(), self.split(inputs)
        if any(not g for g in groups):
            raise ShapeError(f"rotary_kv_write: {len(inputs)} inputs do not split into "
                             f"{self.attrs['n_q']} + {self.attrs['n_k']} + the value update's")
        return tuple(op.compute_shape(g) for op, g in zip(parts, groups))

    def inplace_input(self, index=None):
        """The past key (result 1) and past value (result 2) inputs; None for the query."""
        if index == 1:
            return self.attrs["n_q"]
        if index == 2:
            return self.attrs["n_q"] + self.attrs["n_k"]
        return None

    def workspace(self, inputs, output):
        return [w for op, g, o in zip(self.parts(), self.split(inputs), output) for w in op.workspace(g, o)]

    def compute(self, ctx, out, args, ws):
        from ..ir.shape import Shape

        ws = list(ws)
        for op, g, o in zip(self.parts(), self.split(args), out):
            n = len(op.workspace([Shape(a.dtype.name, a.shape) for a in g], Shape(o.dtype.name, o.shape)))
            op.compute(ctx, o, g, ws[:n])
            ws = ws[n:]

    def launches(self, inputs, output):
        return 1
