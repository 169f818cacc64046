"""eliminate_dead_code: remove instructions whose value nobody uses (parameters stay: they are the
program's interface; instructions with side effects, such as ``guard``, stay too), then drop the
modules no instruction runs any more."""
from __future__ import annotations

from .pass_manager import Pass


class EliminateDeadCode(Pass):
    name = "eliminate_dead_code"

    def apply(self, program, ctx=None) -> None:
        for m in program.module_order():
            changed = True
            while changed:
                changed = False
                for ins in reversed(list(m.instructions)):
                    if ins.op.name in ("@return", "@param") or ins.outputs or ins.op.side_effects:
                        continue
                    m.remove_instruction(ins)
                    changed = True
        # drop modules no longer referenced
        live = {m.name for m in program.module_order()}
        for name in list(program.modules):
            if name not in live:
                program.remove_module(name)
