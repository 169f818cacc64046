"""gemv_layout: store the constant weight of a one-row ``dot`` transposed, so the gpu GEMV reads it
with K contiguous.

The gemv kernel (:mod:`mgx_graph.operators.gemv_gpu`) reads ``W [..., K, N]`` as ``W^T [N, K]``
rows, 16 bytes at a time along K.  A weight exported as ``[K, N]`` row-major (a ``MatMul`` initializer,
or the concatenation of ``merge_dots``) has N contiguous instead, so for each ``dot`` the kernel would
take (one row, batch dims of 1, float16 / float32, ``MIGRAPHX_GEMV`` not 0) whose weight is a literal,
or a chain of views over one, read by that ``dot`` alone, the pass rewrites::

    W  = @literal(w)                          [..., K, N], N contiguous
    Y  = dot(X, W)
into
    Wt = @literal(swapaxes(w, -1, -2))        [..., N, K], computed now, contiguous
    W  = transpose[permutation={.., -1, -2}](Wt)   [..., K, N] with strides {.., 1, K}: a view
    Y  = dot(X, W)

A weight whose K dim is contiguous already (a transposed ``[N, K]`` initializer, the LM head of a
tied embedding) and a literal that other instructions read too (which would then be stored twice)
are left as they are.  The values are unchanged: the ``ref`` target evaluates the rewritten program
with numpy, and a BLAS GEMM takes the transposed operand as well.  Runs on the gpu target only,
after the kernel fusion passes (``merge_dots`` has concatenated the weights); nothing folds the view
back into a literal after it.
"""
from __future__ import annotations

import numpy as np

from ..ir.shape import Shape
from ..operators import make_op
from .fusion import VIEWS
from .pass_manager import ModulePass


def _weight_chain(w):
    """``[w, ..., literal]`` when ``w`` is a literal or a chain of single-input views over one in which
    every instruction has one reader; else None."""
    chain, v = [w], w
    while v.op.name != "@literal":
        if v.op.name not in VIEWS or not v.op.is_view or len(v.inputs) != 1:
            return None
        v = v.inputs[0]
        chain.append(v)
    if any(len(c.outputs) != 1 for c in chain) or any(c.module is not w.module for c in chain):
        return None
    return chain


def transposed_shape(b: Shape) -> Shape:
    """``b [..., K, N]`` as the view of a contiguous ``[..., N, K]``: strides ``{.., 1, K}``."""
    lens = list(b.lens)
    K, N = lens[-2], lens[-1]
    strides = [N * K * int(np.prod(lens[i + 1:-2], dtype=np.int64)) for i in range(len(lens) - 2)] + [1, K]
    return Shape(b.dtype, lens, strides)


class GemvLayout(ModulePass):
    """See the module docstring."""

    name = "gemv_layout"

    def apply_module(self, m, ctx=None) -> None:
        from ..operators.gemv_gpu import gemv_enabled, gemv_plan_for, weight_layout

        if not gemv_enabled():
            return
        for ins in list(m.instructions):
            if ins.op.name != "dot" or len(ins.inputs) != 2:
                continue
            a, b = ins.inputs
            if not isinstance(b.shape, Shape) or b.shape.ndim < 2:
                continue
            if weight_layout(b.shape.lens, b.shape.strides) is not None:  # K contiguous already
                continue
            if gemv_plan_for([a.shape, transposed_shape(b.shape)], ins.shape) is None:
                continue
            chain = _weight_chain(b)
            if chain is not None:
                self._rewrite(m, ins, chain)

    @staticmethod
    def _rewrite(m, dot, chain) -> None:
        from .merge_dots import constant_value

        b, literal = chain[0], chain[-1]
        value = constant_value(b)[0]
        stored = np.ascontiguousarray(np.swapaxes(value, -1, -2))
        nd = stored.ndim
        perm = list(range(nd - 2)) + [nd - 1, nd - 2]
        new_lit = m.insert_literal(literal, stored)
        view = m.insert_instruction(dot, make_op("transpose", permutation=perm), [new_lit])
        m.set_inputs(dot, [dot.inputs[0], view])
        for c in chain:
            m.remove_instruction(c)
