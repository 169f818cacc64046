"""propagate_constant: evaluate every instruction whose inputs are all literals, on the host, and
replace it by a literal (the parser already does this while parsing; passes that create new
constant expressions run it again).  The literal takes the folded instruction's place; see
:func:`mgx_graph.ir.fold.fold_instruction` for what is folded (no control flow, no op marked
not foldable, outputs up to the fold size limit).  Raises ShapeError naming the op when folding fails."""
from __future__ import annotations

from ..ir.fold import fold_instruction
from .pass_manager import ModulePass


class PropagateConstant(ModulePass):
    name = "propagate_constant"

    def apply_module(self, m, ctx=None) -> None:
        for ins in list(m.instructions):
            if ins.module is m:
                fold_instruction(m, ins)
