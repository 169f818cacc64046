"""fuse_converts: shorten chains of ``convert`` instructions (each one a kernel).

* a ``convert`` to its input's own type (standard layout) is removed: it would copy the values unchanged;
* ``convert(convert(x, B), C)``, the inner one read only by the outer, becomes ``convert(x, C)`` when
  every value of ``x``'s type A is exact in B (A -> B widens: float16 -> float32, int8 -> int32,
  int16 -> float32, bool -> anything...): the outer conversion then sees the values of ``x`` themselves.
  A narrowing inner step (float32 -> float16 -> float32 rounds) is kept.
"""
from __future__ import annotations

import numpy as np

from ..operators import make_op
from .pass_manager import ModulePass


def exact_in(a: str, b: str) -> bool:
    """Whether every value of numpy type ``a`` is represented exactly in type ``b``."""
    try:
        da, db = np.dtype(a), np.dtype(b)
    except TypeError:
        return False  # a type numpy does not name (bfloat16, float8): no rule
    if da == db or da.kind == "b":
        return True
    if not np.can_cast(da, db, "safe"):
        return False
    if da.kind in "iu" and db.kind == "f":
        return da.itemsize * 8 - (da.kind == "i") <= np.finfo(db).nmant + 1  # the integer fits the mantissa
    return True


class FuseConverts(ModulePass):
    name = "fuse_converts"

    def apply_module(self, m, ctx=None) -> None:
        changed = True
        while changed:
            changed = False
            for ins in list(m.instructions):
                if ins.module is m and ins.op.name == "convert" and self._fuse(m, ins):
                    changed = True

    def _fuse(self, m, ins) -> bool:
        x = ins.inputs[0]
        if isinstance(x.shape, tuple):
            return False
        if x.shape.dtype == ins.shape.dtype and x.shape.standard():
            m.replace_instruction(ins, x, remove=True)
            return True
        if x.op.name == "convert" and len(x.outputs) == 1 and not isinstance(x.inputs[0].shape, tuple) \
                and exact_in(x.inputs[0].shape.dtype, x.shape.dtype):
            new = m.insert_instruction(ins, make_op("convert", target_type=ins.shape.dtype), [x.inputs[0]])
            m.replace_instruction(ins, new, remove=True)
            m.remove_instruction(x)
            return True
        return False
