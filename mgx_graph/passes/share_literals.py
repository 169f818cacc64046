"""share_literals: the literals that another compiled program (the *owner*) holds already are read from
the owner's memory instead of being uploaded again, so two programs over one set of weights (a
decoder's prefill programs and its decode step) keep one copy of them on the device.

A literal of at least :data:`MIN_BYTES` bytes is taken from the owner when an owner literal holds the
same bytes in the same shape and type.  A literal read only as the second input of ``dot`` instructions
(a weight) is also taken from an owner literal that holds it in another layout or as a part of it, read
through views, which a BLAS GEMM takes as they are:

* the owner's literal with the last two axes swapped (the gpu target's ``gemv_layout`` stores the
  weights of one-row ``dot``s transposed; a prefill's ``dot``s have several rows and keep the exported
  layout): a ``transpose`` view of it;
* a block of columns (last axis) of the owner's literal, in either layout (``merge_dots`` may
  concatenate other weights in the two programs: Q, K and V in a decode step, Q and K in a prefill whose
  V slice would feed a strided cache write): a ``slice`` view of it.

Candidates are found by type, shape and 64 sampled elements, column blocks by their first row
(:class:`LiteralTable`); one is taken only when every byte is equal.

A shared literal gets ``meta["shared_literal"]``, the index of the owner's literal in the table:
``memory_coloring`` leaves it out of the literal area, and the executor binds it to the owner's uploaded
array (:class:`~mgx_graph.exec.program_buffers.ProgramBuffers`).  Its IR value is the owner's own host
array, so a saved program (which does not keep the mark) stores and uploads it as any literal.  The
group ``share`` runs after the layout passes and before ``outputs``, only when the compile was given an
owner (``compile(..., share_literals=program)``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..operators import make_op
from .pass_manager import Pass

#: Literals smaller than this are uploaded as they are (weights are far larger).
MIN_BYTES = 4096
SAMPLES = 64
META = "shared_literal"


def _shareable(value) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind in "biuf" and value.nbytes >= MIN_BYTES


def _bits(value: np.ndarray) -> np.ndarray:
    """``value`` viewed as unsigned ints of its item size (bytes compared, not values: -0.0 is not 0.0)."""
    return value.view(np.dtype(f"u{value.dtype.itemsize}"))


def _key(value: np.ndarray) -> tuple:
    """Type, shape and :data:`SAMPLES` elements spread over the array in its logical order."""
    idx = np.unique(np.linspace(0, value.size - 1, SAMPLES).astype(np.int64))
    return value.dtype.str, tuple(value.shape), _bits(value)[np.unravel_index(idx, value.shape)].tobytes()


def _swapped(value: np.ndarray) -> np.ndarray:
    return np.swapaxes(value, -1, -2)


class LiteralTable:
    """The literals of an owner program that others may read (see the module docstring).

    ``instructions``: the owner's ``@literal`` instructions of at least :data:`MIN_BYTES` bytes, in
    module order; ``owner``: what holds their uploaded arrays (the owner's executor, set by the compiler;
    :meth:`value` reads it)."""

    def __init__(self, program, owner: Any = None):
        self.owner = owner
        self.holder: Any = None  # kept alive with the table (the owner's compiled program)
        self.instructions: list = []
        self._keys: dict[tuple, list[tuple[int, bool]]] = {}
        self._blocks: dict[tuple, list[tuple[int, bool]]] = {}  # (type, dims but the last) -> candidates
        for m in program.module_order():
            for ins in m.instructions:
                if ins.op.name != "@literal" or not _shareable(ins.op.value):
                    continue
                k, v = len(self.instructions), ins.op.value
                self.instructions.append(ins)
                self._keys.setdefault(_key(v), []).append((k, False))
                if v.ndim >= 2:
                    self._keys.setdefault(_key(_swapped(v)), []).append((k, True))
                    for t, lv in ((False, v), (True, _swapped(v))):
                        self._blocks.setdefault((v.dtype.str, lv.shape[:-1]), []).append((k, t))

    def _logical(self, k: int, transposed: bool) -> np.ndarray:
        own = self.instructions[k].op.value
        return _swapped(own) if transposed else own

    def find(self, value: np.ndarray, dot_weight: bool) -> tuple[int, bool, int] | None:
        """``(index, transposed, column)``: owner literal ``index`` (with its last two axes swapped when
        ``transposed``) holds ``value``'s bytes from ``column`` of its last axis on; else None.  Only
        the whole literal in its own layout is tried unless ``dot_weight`` (a view of another layout or
        a column block of it is then read in its place)."""
        if not _shareable(value):
            return None
        for k, t in self._keys.get(_key(value), ()):
            if (not t or dot_weight) and np.array_equal(_bits(self._logical(k, t)), _bits(value)):
                return k, t, 0
        if not dot_weight or value.ndim < 2:
            return None
        first = _bits(value)[(0,) * (value.ndim - 1)]  # the first row: where the block may start
        n = value.shape[-1]
        for k, t in self._blocks.get((value.dtype.str, value.shape[:-1]), ()):
            own = self._logical(k, t)
            row = _bits(own)[(0,) * (own.ndim - 1)]
            for c in np.flatnonzero(row[:len(row) - n + 1] == first[0]):
                if np.array_equal(row[c:c + n], first) and np.array_equal(_bits(own[..., c:c + n]), _bits(value)):
                    return k, t, int(c)
        return None

    def value(self, k: int):
        """The owner's uploaded array of literal ``k`` (None when the owner holds none)."""
        return self.owner.buffers.value(self.instructions[k])


def _dot_weight_only(ins) -> bool:
    """Whether every reader of ``ins`` is a ``dot`` of its module reading it as the second input only."""
    return bool(ins.outputs) and all(o.op.name == "dot" and o.module is ins.module and len(o.inputs) == 2
                                     and o.inputs[1] is ins and o.inputs[0] is not ins for o in ins.outputs)


class ShareLiterals(Pass):
    """See the module docstring; ``table``: the owner's :class:`LiteralTable` (None: nothing to do)."""

    name = "share_literals"

    def __init__(self, table: LiteralTable | None):
        self.table = table

    def apply(self, program, ctx=None) -> None:
        table = self.table
        if table is None:
            return
        for m in program.module_order():
            for ins in list(m.instructions):
                if ins.op.name != "@literal" or META in ins.meta or not ins.outputs:
                    continue
                hit = table.find(ins.op.value, _dot_weight_only(ins))
                if hit is not None:
                    _rewrite(table, m, ins, *hit)


def _rewrite(table: LiteralTable, m, ins, k: int, transposed: bool, column: int) -> None:
    """Read literal ``ins`` of module ``m`` from owner literal ``k`` (``transposed`` / from ``column``)."""
    own = table.instructions[k].op.value
    new = m.insert_literal(ins, own)
    new.meta[META] = k
    nd = own.ndim
    if transposed:
        new = m.insert_instruction(ins, make_op("transpose", permutation=list(range(nd - 2)) + [nd - 1, nd - 2]),
                                   [new])
    n = ins.shape.lens[-1]
    if column or n != new.shape.lens[-1]:
        new = m.insert_instruction(ins, make_op("slice", axes=[nd - 1], starts=[column], ends=[column + n]), [new])
    m.replace_instruction(ins, new, remove=True)
