"""quantize_fp16: run the program in half precision (as ``migraphx.quantize_fp16``), keeping index
arithmetic in float32.

Instructions that depend on a floating-point parameter (the activations) run in float16: float32
parameters become float16 parameters, float32 literals they use get float16 copies, and conversions
to float32 among them convert to float16.  Float values computed only from integer inputs and
literals (positions, rotary-embedding angles, masks) are index arithmetic: they stay float32, where
half precision would be too coarse (an angle of 200 rad has a float16 spacing of 0.125), and a
``convert`` to float16 is inserted where they meet the activations.  Inputs and outputs of the
compiled program that were float32 become float16 (a KV cache bound in place stays in half).
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


class QuantizeFp16(ModulePass):
    name = "quantize_fp16"

    def apply(self, program, ctx=None) -> None:
        super().apply(program, ctx)
        # a control-flow instruction's shape comes from its bodies, quantized after its module:
        # recompute bodies first, then the modules that run them
        for m in reversed(program.module_order()):
            m.recompute_shapes()

    def apply_module(self, m, ctx=None) -> None:
        act = set()
        for ins in m.instructions:
            op = ins.op
            if isinstance(op, Param):
                if _is_float32(ins):
                    act.add(id(ins))
            elif op.builtin:
                continue
            elif any(id(i) in act for i in ins.inputs) or ins.module_inputs:
                act.add(id(ins))
        half_lits = {}
        for ins in list(m.instructions):
            op = ins.op
            if isinstance(op, Param):
                if id(ins) in act:
                    ins.op = Param(op.parameter, ins.shape.with_type("float16"))
                    ins.shape = ins.op.compute_shape([])
                continue
            if op.builtin or id(ins) not in act:
                continue
            if op.name == "convert" and op.target_type == F32:
                op.attrs["target_type"] = "float16"
            new_inputs = []
            for i in ins.inputs:
                if id(i) in act or not _is_float32(i):
                    new_inputs.append(i)
                elif isinstance(i.op, Literal):
                    h = half_lits.get(id(i))
                    if h is None:
                        h = half_lits[id(i)] = m.insert_literal(i, i.op.value.astype(np.float16))
                    new_inputs.append(h)
                else:  # float32 index arithmetic meets the activations
                    c = m.insert_instruction(ins, make_op("convert", target_type="float16"), [i])
                    new_inputs.append(c)
            m.set_inputs(ins, new_inputs)
        m.recompute_shapes()
