"""eliminate_dead_code: remove instructions whose value nobody uses (parameters stay: they are the
program's interface; instructions with side effects, such as ``guard``, stay too), then drop the
modules no instruction runs any more.

A dropped module's instructions are taken off the consumer lists of the outer values they read, so
an outer instruction only such a module used becomes dead too and goes in the same pass.
"""
from __future__ import annotations

from .pass_manager import Pass


class EliminateDeadCode(Pass):
    name = "eliminate_dead_code"

    def apply(self, program, ctx=None) -> None:
        while True:
            for m in program.module_order():
                _remove_dead(m)
            live = {m.name for m in program.module_order()}
            dropped = [name for name in program.modules if name not in live]
            if not dropped:
                return
            for name in dropped:
                _detach(program.modules[name])
                program.remove_module(name)


def remove_unread(m, root) -> None:
    """Remove ``root`` when nothing reads it, then, transitively, its inputs in ``m`` that nothing reads
    any more (never parameters, the return, or instructions with side effects): what a rewrite leaves
    behind (the old dots of a merge, the decomposed attention a fused instruction replaced)."""
    stack = [root]
    while stack:
        ins = stack.pop()
        if ins.module is not m or ins.outputs or ins.op.name in ("@param", "@return") or ins.op.side_effects:
            continue
        inputs = list(ins.inputs)
        m.remove_instruction(ins)
        stack.extend(inputs)


def _remove_dead(m) -> None:
    changed = True
    while changed:
        changed = False
        for ins in reversed(list(m.instructions)):
            if ins.op.name in ("@return", "@param") or ins.outputs or ins.op.side_effects:
                continue
            m.remove_instruction(ins)
            changed = True


def _detach(m) -> None:
    """Take the instructions of module ``m`` (being dropped) off their inputs' consumer lists."""
    for ins in m.instructions:
        for v in ins.inputs:
            v.outputs = [o for o in v.outputs if o is not ins]
        ins.module = None
