"""fuse_rotary_kv: GroupQueryAttention's decode writes of one layer, the ``rotary_embedding`` of the
query and the two ``kv_cache_update`` (the rotated key rows, the value rows), become one
``rotary_kv_write`` instruction (:mod:`mgx_graph.operators.rotary_kv`): one launch of
``llm_kernels.cu`` instead of three.  Done as a pass rather than in the lowering so that the present
caches stay values of the program bound in place as before (``bind_outputs`` binds each through its
tuple element) and the ref target runs the very same instruction.

A key update ``k`` (``rotary`` set, with a past) is fused with the value update ``v`` (no rotation,
with a past into another buffer) that reads the same start rows and the same row indices, and the
rotation ``r`` of the query (with position ids) that reads the same cos / sin tables and position
ids as ``k``, when the legality rules of ``fuse_horizontal`` hold for the three (no one reads
another, only views read them between the first and the last, which move after the fused
instruction; no one reads a buffer ``k`` or ``v`` writes).  The fused instruction stands where the
last of them stood; each reader reads its ``get_tuple_elem``.  ``MIGRAPHX_DISABLE_PASSES=fuse_rotary_kv``
leaves them as they are.
"""
from __future__ import annotations

from ..operators import make_op
from .fuse_horizontal import FuseHorizontal, _move_readers_after


class FuseRotaryKv(FuseHorizontal):
    """The pass (see the module docstring); rewrites in place, raises nothing of its own."""

    name = "fuse_rotary_kv"

    def apply_module(self, m, ctx=None) -> None:
        if m.program is None or "kv_cache_update" in self.exclude:
            return
        for k in [i for i in m.instructions if self._key_update(i)]:
            found = self._match(m, k)
            if found is not None:
                self._replace(m, *found)

    @staticmethod
    def _key_update(i) -> bool:
        op = i.op
        return op.name == "kv_cache_update" and bool(op.rotary) and bool(op.has_past) and len(i.inputs) == 7 \
            and "bind_param" not in i.meta and not i.meta.get("on_host")

    def _match(self, m, k):
        start, rows = k.inputs[2], k.inputs[3]
        v = next((i for i in m.instructions if i.op.name == "kv_cache_update" and not i.op.rotary and i.op.has_past
                  and len(i.inputs) == 4 and i.inputs[2] is start and i.inputs[3] is rows and i is not k
                  and "bind_param" not in i.meta), None)
        tables = k.inputs[4:]
        r = next((i for i in m.instructions if i.op.name == "rotary_embedding" and len(i.inputs) == 4
                  and all(a is b for a, b in zip(i.inputs[1:], tables)) and "bind_param" not in i.meta), None)
        if v is None or r is None or "rotary_embedding" in self.exclude:
            return None
        members = self._legal(m, [r, k, v])
        return None if members is None else (r, k, v, members)

    @staticmethod
    def _replace(m, r, k, v, members) -> None:
        last = members[-1]
        _move_readers_after(m, members, last)
        op = make_op("rotary_kv_write", rotary=r.op.attrs, key=k.op.attrs, value=v.op.attrs,
                     n_q=len(r.inputs), n_k=len(k.inputs))
        anchor = m.instructions[m.instructions.index(last) + 1]
        fused = m.insert_instruction(anchor, op, list(r.inputs) + list(k.inputs) + list(v.inputs))
        for n, old in enumerate((r, k, v)):
            elem = m.insert_instruction(anchor, make_op("get_tuple_elem", index=n), [fused])
            m.replace_instruction(old, elem, remove=True)
