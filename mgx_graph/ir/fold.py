"""Constant folding of one instruction: an instruction whose inputs are all literals becomes a literal
(the parser folds while parsing; the ``propagate_constant`` pass folds again after the passes that
create constant expressions)."""
from __future__ import annotations

from ..errors import ShapeError
from .instruction import Instruction
from .module import Module

FOLD_LIMIT = 1 << 22  # largest literal (elements) that constant folding may create


def fold_instruction(m: Module, ins: Instruction) -> Instruction:
    """Replace ``ins`` by a literal when all its inputs are literals (constant propagation).

    Not folded: builtins, ops with submodules or not foldable, tuple results, results over
    ``FOLD_LIMIT`` elements.  Raises ShapeError when evaluating the op fails."""
    op = ins.op
    if not op.foldable or op.builtin or ins.module_inputs or not ins.inputs:
        return ins
    if any(i.op.name != "@literal" for i in ins.inputs):
        return ins
    if isinstance(ins.shape, tuple):
        return ins
    n_out = ins.shape.elements()
    n_in = sum(i.shape.elements() for i in ins.inputs)
    if n_out > FOLD_LIMIT or (op.name == "multibroadcast" and n_out > max(4 * n_in, 4096)):
        return ins
    vals = [i.op.value for i in ins.inputs]
    try:
        value = op.fold(vals, [i.shape for i in ins.inputs], ins.shape)
    except Exception as e:
        raise ShapeError(f"constant folding of {op} failed: {type(e).__name__}: {e}") from None
    lit = m.insert_literal(ins, value)
    m.replace_instruction(ins, lit)
    m.remove_instruction(ins)
    return lit
