"""merge_dots: ``dot`` instructions that multiply one activation by different constant weights
become one ``dot`` against the weights concatenated along N, read back through ``slice`` views.

In a transformer layer the Q, K and V projections (and the gate and up projections of a gated MLP)
all read the same normalized hidden state ``A [..., M, K]``: at decode time (M = 1) each is a GEMV
that reads its weight once, and three launches cost more than one over the concatenated weight.
The pass groups the ``dot`` instructions of a module that read the same instruction ``A`` and whose
second operand is a constant (a literal, or a chain of views over one: a transposed ``[N, K]``
weight) with the same type and the same ``[..., K]`` dims, and rewrites each group of two or more as::

    W   = @literal(concat(W_1, ..., W_n, axis=-1))          [..., K, N_1 + ... + N_n], computed now
    Y   = dot(A, W)                                          [..., M, N_1 + ... + N_n]
    Y_i = slice[axes={-1}, starts={N_1 + ... + N_{i-1}}, ends=...](Y)   a view: no kernel, no copy

The readers of the i-th ``dot`` read ``Y_i``.  A weight that is a broadcast view (a stride 0 over a
dim above 1) is not merged: the concatenation would materialize the broadcast.  When every ``dot`` of
the group is read only by one ``add`` of a constant bias that varies along N alone (a ``Linear`` with
bias) and none of those adds would be fused into its readers (an elementwise op, a reduction), the
biases are concatenated too and one ``add`` over ``Y`` replaces the n adds (the slices then view its
result); an add the fusion passes would absorb is left reading its slice, where it costs no kernel.

``Y_i`` has ``Y``'s row stride (``N_1 + ... + N_n``), so it is a standard layout only when the rows
of ``Y`` collapse to one (M = 1 with no batch dim above 1).  A ``dot`` of the group is left as it is
when a reader of it, or of a view of it, would not take its slice without a copy:

* the slice is strided and the reader is not one that reads any layout as it is (views, ``dot``,
  elementwise ops and ``concat``, which the fusion passes turn into kernels with strided loads,
  reductions and norms): e.g. ``scatternd``, whose gpu kernel wants packed updates;
* the reader's ``compute_shape`` refuses the new layout (a ``reshape`` that would need a copy);
* the value, or a view of it, is a program output in a standard layout (its own buffer today;
  sharing the merged buffer with other outputs would cost a copy in ``bind_outputs``);
* the reader is in another module, or reads its input's layout through submodules.

Runs after ``precision`` (the weights are already float16 with ``fp16=True``) and before the kernel
fusion passes, on both targets, so the ``ref`` target checks the merged program numerically;
``MIGRAPHX_DISABLE_PASSES=merge_dots`` turns it off for A/B runs.  MIGraphX does the same for dots
and convolutions of one input in ``simplify_algebra`` (``find_conv_dot_horiz_fusion``).
"""
from __future__ import annotations

import numpy as np

from ..errors import CompileError, MgxError
from ..ir.shape import Shape, standard_strides
from ..operators import make_op
from ..operators.pointwise import Pointwise
from .eliminate_dead_code import remove_unread
from .fuse_reduce import NORM_OPS, REDUCE_OPS
from .fusion import VIEWS, fused_modules
from .pass_manager import ModulePass


def constant_value(ins):
    """``(value, literal)`` when ``ins`` is a literal or a chain of views (transpose, reshape,
    squeeze, unsqueeze, multibroadcast, slice) over one: ``value`` is a numpy view of the literal's
    array with ``ins``'s lens; else None."""
    chain, v = [], ins
    while v.op.name != "@literal":
        if v.op.name not in VIEWS or not v.op.is_view or len(v.inputs) != 1 or not isinstance(v.shape, Shape):
            return None
        chain.append(v)
        v = v.inputs[0]
    value = v.op.value  # C-contiguous: the views' strides are the IR strides
    for c in reversed(chain):
        value = c.op.view(np, value, c.shape)
    return value, v


def _takes_strided(ins) -> bool:
    """A reader that takes a strided input at no extra cost on either target (no copy first): ``dot``
    (a BLAS operand with a leading dimension), elementwise ops and ``concat`` (fused into kernels with
    strided loads, or CuPy kernels over strided arrays), reductions and norms (strided rows)."""
    return isinstance(ins.op, Pointwise) or ins.op.name in ("dot", "concat") + REDUCE_OPS + NORM_OPS


def _returned_standard(ins) -> bool:
    """``ins``, or a view of it, is a program output in a standard layout: an output with a buffer of
    its own, which a slice sharing the merged buffer with other outputs could cost a copy
    (``bind_outputs``); a strided output is copied either way."""
    stack, seen = [ins], set()
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        for c in v.outputs:
            if c.op.name == "@return" and v.shape.standard():
                return True
            if c.op.is_view and c.op.name in VIEWS:
                stack.append(c)
    return False


def downstream_shapes(m, changed: dict):
    """The new output shapes of the instructions downstream of ``changed`` (``{instruction: new
    shape}``): readers are recomputed, and followed further while their shapes change.

    Returns ``{id: (instruction, new shape)}`` of every instruction whose shape changes (``changed``
    included), or None when a reader cannot take its new input: it is in another module, reads a
    submodule, has its layout bound, refuses the new layout (``compute_shape`` raises), would read a
    strided layout and is not one that takes it as it is (:func:`_takes_strided`), or is ``@return``
    reading a value that is standard before or after (a strided output is copied by ``bind_outputs``
    either way; a standard one would now share the merged buffer).  Nothing is changed."""
    new = {id(i): (i, s) for i, s in changed.items()}
    stack = [c for i in changed for c in i.outputs]
    while stack:
        c = stack.pop()
        if c.op.name == "@return" and c.module is m:
            if any(id(i) in new and (new[id(i)][1].standard() or i.shape.standard()) for i in c.inputs):
                return None
            continue
        if c.module is not m or c.op.builtin or c.module_inputs or "bind_layout" in c.meta:
            return None
        in_shapes = [new[id(i)][1] if id(i) in new else i.shape for i in c.inputs]
        strided = any(id(i) in new and not s.standard() for i, s in zip(c.inputs, in_shapes))
        if strided and not c.op.is_view and not _takes_strided(c):
            return None
        try:
            shape = c.op.compute_shape(in_shapes, c.module_inputs)
        except MgxError:
            return None
        if shape != (new[id(c)][1] if id(c) in new else c.shape):
            new[id(c)] = (c, shape)
            stack.extend(c.outputs)
    return new


def _stands_alone(ins) -> bool:
    """No reader of ``ins`` (through views) is an op the fusion passes would fuse ``ins`` into (an
    elementwise op, ``concat``, a reduction or norm): ``ins`` stays a kernel of its own."""
    stack, seen = list(ins.outputs), set()
    while stack:
        c = stack.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        if c.op.is_view and c.op.name in VIEWS:
            stack.extend(c.outputs)
        elif isinstance(c.op, Pointwise) or c.op.name in ("concat",) + REDUCE_OPS + NORM_OPS:
            return False
    return True


def _bias_of(dot):
    """``(add, bias vector [N])`` when ``dot``'s only reader is an ``add`` of a constant that, broadcast
    to the dot's output, varies along the last axis only, and that add stays a kernel of its own (were
    it fused into its readers, folding the adds would add a kernel); else None."""
    if len(dot.outputs) != 1:
        return None
    add = dot.outputs[0]
    if add.op.name != "add" or add.module is not dot.module or len(add.inputs) != 2 or \
            not isinstance(add.shape, Shape) or add.shape.lens != dot.shape.lens or add.shape.dtype != dot.shape.dtype:
        return None
    others = [i for i in add.inputs if i is not dot]
    if len(others) != 1:
        return None
    const = constant_value(others[0])
    if const is None or const[0].dtype != dot.shape.np_dtype or not _stands_alone(add):
        return None
    lens = dot.shape.lens
    full = np.broadcast_to(const[0], lens)
    vec = np.array(full.reshape(-1, lens[-1])[0])
    if not np.array_equal(full, np.broadcast_to(vec, lens), equal_nan=True):
        return None
    return add, vec


class _Member:
    """One ``dot`` of a group: its weight ``[..., K, N]`` (numpy), the literal it came from, and the
    instruction whose readers will read the slice (the dot, or its bias ``add``)."""

    def __init__(self, dot, weight, literal):
        self.dot, self.weight, self.literal = dot, weight, literal
        self.tail, self.bias = dot, None

    @property
    def n(self) -> int:
        return self.dot.shape.lens[-1]


class MergeDots(ModulePass):
    """The ``merge_dots`` pass (see the module docstring): rewrites every module in place but those
    run by fused instructions; ``min_group``: the fewest dots merged into one (at least 2).  Any
    float or integer type is merged (the weights keep theirs: float16 after ``quantize_fp16``).
    Raises CompileError only if a group's readers refuse the slices that the dry run accepted."""

    name = "merge_dots"

    def __init__(self, min_group: int = 2):
        self.min_group = max(2, int(min_group))

    def apply(self, program, ctx=None) -> None:
        skip = fused_modules(program)
        for m in program.module_order():
            if m.name not in skip:
                self.apply_module(m, ctx)

    def apply_module(self, m, ctx=None) -> None:
        for group in self._groups(m):
            self._merge_group(m, group)

    # -- finding groups --------------------------------------------------------------------------
    @staticmethod
    def _candidate(ins):
        """A ``_Member`` for a ``dot`` of a non-empty output whose second operand is a constant that
        is not a broadcast view."""
        if ins.op.name != "dot" or ins.module_inputs or len(ins.inputs) != 2 or not isinstance(ins.shape, Shape) \
                or ins.shape.elements() == 0 or not isinstance(ins.inputs[0].shape, Shape):
            return None
        if ins.inputs[1].shape.broadcasted():
            return None
        const = constant_value(ins.inputs[1])
        if const is None:
            return None
        return _Member(ins, const[0], const[1])

    def _groups(self, m) -> list[list[_Member]]:
        """Candidate dots keyed by (A, type, [..., K] of the weight), each group in program order
        (merging one group keeps the order of the others), two or more."""
        groups: dict = {}
        for ins in m.instructions:
            mem = self._candidate(ins)
            if mem is not None:
                b = ins.inputs[1].shape
                groups.setdefault((id(ins.inputs[0]), b.dtype, tuple(b.lens[:-1])), []).append(mem)
        return [g for g in groups.values() if len(g) >= self.min_group]

    def _slice_shapes(self, group) -> dict:
        """``{tail: shape of its slice of the merged output}`` (the merged output's row stride)."""
        lens = group[0].dot.shape.lens
        total = sum(mem.n for mem in group)
        strides = standard_strides(tuple(lens[:-1]) + (total,))
        return {mem.tail: Shape(mem.tail.shape.dtype, tuple(lens[:-1]) + (mem.n,), strides) for mem in group}

    def _accepted(self, m, group) -> list[_Member]:
        """The members whose readers all take their slice (each alone, then the survivors together;
        none when the survivors together do not)."""
        biases = [_bias_of(mem.dot) for mem in group]
        if all(b is not None for b in biases):
            for mem, (add, vec) in zip(group, biases):
                mem.tail, mem.bias = add, vec
        shapes = self._slice_shapes(group)
        kept = [mem for mem in group if not _returned_standard(mem.tail)
                and downstream_shapes(m, {mem.tail: shapes[mem.tail]}) is not None]
        if len(kept) < self.min_group:
            return []
        if kept != group:  # a kept member keeps its bias: the fold holds for the kept ones alone
            shapes = self._slice_shapes(kept)
        if downstream_shapes(m, shapes) is None:
            return []
        return kept

    # -- rewriting -------------------------------------------------------------------------------
    def _merge_group(self, m, group) -> None:
        group = self._accepted(m, group)
        if not group:
            return
        first = group[0].dot  # members are in program order; the first one's weight literal precedes it
        lit_anchor = group[0].literal if group[0].literal.module is m else first
        a = first.inputs[0]
        weight = np.concatenate([np.asarray(mem.weight) for mem in group], axis=-1)
        merged = m.insert_instruction(first, make_op("dot"), [a, m.insert_literal(lit_anchor, weight)])
        tail = merged
        if group[0].bias is not None:
            bias = m.insert_literal(lit_anchor, np.concatenate([mem.bias for mem in group]))
            wide = m.insert_instruction(first, make_op("multibroadcast", out_lens=list(merged.shape.lens)), [bias])
            tail = m.insert_instruction(first, make_op("add"), [merged, wide])
        shapes = self._slice_shapes(group)
        axis, start, new = merged.shape.ndim - 1, 0, {}
        for mem in group:
            s = m.insert_instruction(first, make_op("slice", axes=[axis], starts=[start], ends=[start + mem.n]),
                                     [tail])
            start += mem.n
            m.replace_instruction(mem.tail, s)
            new[s] = shapes[mem.tail]
        shapes = downstream_shapes(m, new)
        if shapes is None:  # the dry run on the same readers passed: never expected
            raise CompileError(f"merge_dots: the readers of {merged} in module '{m.name}' refuse its slices")
        for ins, shape in shapes.values():
            ins.shape = shape
        for mem in group:
            remove_unread(m, mem.tail)

