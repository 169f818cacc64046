"""simplify_reshapes: shorten chains of view instructions (no kernels either way).

* a view whose output has its input's lens and layout is removed (identity transpose, reshape to the
  same dims, squeeze/unsqueeze that cancel out);
* ``transpose(transpose(x))`` becomes one transpose with the composed permutation (or ``x``);
* a chain of reshape / squeeze / unsqueeze over ``x`` becomes one ``reshape`` of ``x`` when ``x``'s
  layout allows the final dims without a copy.

Fewer instructions means fewer per-call view steps and shorter printed programs; results are
unchanged (views compute nothing).
"""
from __future__ import annotations

from ..operators import make_op
from ..operators.views import reshape_strides
from .pass_manager import ModulePass

_RESHAPE_LIKE = ("reshape", "squeeze", "unsqueeze")


def _same_layout(a, b) -> bool:
    return tuple(a.lens) == tuple(b.lens) and all(d == 1 or x == y for d, x, y in zip(a.lens, a.strides, b.strides))


class SimplifyReshapes(ModulePass):
    name = "simplify_reshapes"

    def apply_module(self, m, ctx=None) -> None:
        changed = True
        while changed:
            changed = False
            for ins in list(m.instructions):
                if ins.module is not m or not ins.op.is_view or ins.op.name in ("guard", "get_tuple_elem"):
                    continue
                if self._simplify(m, ins):
                    changed = True

    def _simplify(self, m, ins) -> bool:
        x = ins.inputs[0]
        if isinstance(x.shape, tuple) or "bind_layout" in ins.meta:
            return False
        op = ins.op.name
        if op in ("transpose",) + _RESHAPE_LIKE and _same_layout(ins.shape, x.shape) \
                and ins.shape.dtype == x.shape.dtype:
            m.replace_instruction(ins, x, remove=True)
            return True
        if op == "transpose" and x.op.name == "transpose" and len(x.outputs) == 1:
            inner = x.op.permutation
            perm = [inner[p] for p in ins.op.permutation]
            src = x.inputs[0]
            if perm == list(range(len(perm))):
                new = src
            else:
                new = m.insert_instruction(ins, make_op("transpose", permutation=perm), [src])
            m.replace_instruction(ins, new, remove=True)
            m.remove_instruction(x)
            return True
        if op in _RESHAPE_LIKE and x.op.name in _RESHAPE_LIKE and len(x.outputs) == 1:
            src = x.inputs[0]
            if isinstance(src.shape, tuple) or reshape_strides(src.shape, ins.shape.lens) is None:
                return False
            new = m.insert_instruction(ins, make_op("reshape", dims=list(ins.shape.lens)), [src])
            m.replace_instruction(ins, new, remove=True)
            m.remove_instruction(x)
            return True
        return False
