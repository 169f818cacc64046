"""quantize_fp16: run the program in half precision (as ``migraphx.quantize_fp16``), keeping index
arithmetic in float32.

Instructions that depend on a floating-point parameter (the activations) run in float16: float32
parameters become float16 parameters, float32 literals they use (or views of them, such as a transposed
tied embedding) get float16 copies made at compile time, and conversions to float32 among them convert to
float16.  A float32 table gathered at run-time indices stays float32 (it may hold angles: a rotary table of
``pos * inv_freq`` in half would be off by up to 2 at position 4096); it meets the activations through a
convert, as index arithmetic does.  Float values computed only from integer inputs and
literals (positions, rotary-embedding angles, masks) are index arithmetic: they stay float32, where
half precision would be too coarse (an angle of 200 rad has a float16 spacing of 0.125), and a
``convert`` to float16 is inserted where they meet the activations.  An op that computes in float32
only (``Operation.float32_only``, e.g. ``dynamic_quantize_lstm``) stays float32: a ``convert`` to float32
is inserted on each of its half inputs, and its float32 results (and their ``get_tuple_elem``) meet the
activations after it through a ``convert`` to float16, as index arithmetic does; returned as they are,
they stay float32.  Other inputs and outputs of the compiled program that were float32 become float16
(a KV cache bound in place stays in half).
Shapes are recomputed bodies first, so an ``if`` / ``loop`` takes the half results of its bodies.
"""
from __future__ import annotations

import numpy as np

from ..ir import Literal, Param
from ..operators import make_op
from .pass_manager import ModulePass

F32 = "float32"


def _is_float32(ins) -> bool:
    return not isinstance(ins.shape, tuple) and ins.shape.dtype == F32


def _is_float(ins) -> bool:
    """A float32 value, or a half one (a parameter already turned to half)."""
    return not isinstance(ins.shape, tuple) and ins.shape.dtype in (F32, "float16")


def _view_chain(ins):
    """``(literal, [views from the literal outward])`` when ``ins`` is a literal seen through one-input
    views (a transposed tied embedding read by the LM head); None otherwise."""
    chain = []
    while not isinstance(ins.op, Literal):
        if not ins.op.is_view or len(ins.inputs) != 1:
            return None
        chain.append(ins)
        ins = ins.inputs[0]
    return ins, chain[::-1]


class QuantizeFp16(ModulePass):
    name = "quantize_fp16"

    def apply(self, program, ctx=None) -> None:
        super().apply(program, ctx)
        # a control-flow instruction's shape comes from its bodies, quantized after its module:
        # recompute bodies first, then the modules that run them
        for m in reversed(program.module_order()):
            m.recompute_shapes()

    @staticmethod
    def _activations(m) -> tuple[set, set]:
        """``(act, kept)``: ids of the instructions that run in half, and of the float32-only instructions
        fed by activations (with their ``get_tuple_elem``), which stay float32 but whose users are
        activations."""
        act: set[int] = set()
        kept: set[int] = set()
        for ins in m.instructions:
            op = ins.op
            if isinstance(op, Param):
                if _is_float32(ins):
                    act.add(id(ins))
            elif op.builtin:
                continue
            elif any(id(i) in act or id(i) in kept for i in ins.inputs) or ins.module_inputs:
                stays = op.float32_only or (op.name == "get_tuple_elem" and id(ins.inputs[0]) in kept)
                (kept if stays else act).add(id(ins))
        return act, kept

    def apply_module(self, m, ctx=None) -> None:
        act, kept = self._activations(m)
        half_lits: dict = {}

        def half_literal(lit):
            h = half_lits.get(id(lit))
            if h is None:
                h = half_lits[id(lit)] = m.insert_literal(lit, lit.op.value.astype(np.float16))
            return h
        for ins in list(m.instructions):
            op = ins.op
            if isinstance(op, Param):
                if id(ins) in act:
                    ins.op = Param(op.parameter, ins.shape.with_type("float16"))
                    ins.shape = ins.op.compute_shape([])
                continue
            if id(ins) in kept and op.float32_only:  # its half inputs back to float32
                m.set_inputs(ins, [m.insert_instruction(ins, make_op("convert", target_type=F32), [i])
                                   if id(i) in act and _is_float(i) else i for i in ins.inputs])
                continue
            if op.builtin or id(ins) not in act:
                continue
            if op.name == "convert" and op.target_type == F32:
                op.attrs["target_type"] = "float16"
            new_inputs = []
            for i in ins.inputs:
                if id(i) in act or not _is_float32(i):
                    new_inputs.append(i)
                elif _view_chain(i) is not None:  # a literal, or views of one: a half copy of the literal
                    lit, views = _view_chain(i)
                    h = half_literal(lit)
                    for v in views:  # the same views over the half copy (no convert kernel per run)
                        h = m.insert_instruction(ins, make_op(v.op.name, **v.op.attrs), [h])
                    new_inputs.append(h)
                else:  # float32 index arithmetic meets the activations
                    c = m.insert_instruction(ins, make_op("convert", target_type="float16"), [i])
                    new_inputs.append(c)
            m.set_inputs(ins, new_inputs)
        m.recompute_shapes()
