"""fuse_norms: rewrite the decomposed RMS normalization of LLaMA-family exports into one ``rms_norm``.

Matches ``y = x * recip(sqrt(reduce_mean(pow(x, 2), last axis) + eps))`` (``div(1, .)`` and
``mul(x, x)`` accepted) and an optional elementwise weight ``y * w`` with ``w`` a literal over the last
axis.  The fused op accumulates in float32 even for half inputs (so ``quantize_fp16`` cannot overflow
in ``x**2``), and on the gpu target it is two kernels instead of seven.  The ``rms_norm`` is
inserted before the matched output and takes over its uses; the unfused instructions are left for the
``eliminate_dead_code`` that follows in the pipeline.
"""
from __future__ import annotations

import numpy as np

from ..operators import make_op
from .pass_manager import ModulePass


def _lit_scalar(ins):
    if ins.op.name != "@literal":
        return None
    v = ins.op.value
    return float(v.reshape(-1)[0]) if v.size == 1 else None


def _other(ins, x):
    a, b = ins.inputs
    return b if a is x else a if b is x else None


class FuseNorms(ModulePass):
    name = "fuse_norms"

    def apply_module(self, m, ctx=None) -> None:
        for ins in list(m.instructions):
            if ins.module is m and ins.op.name == "reduce_mean":
                self._try(m, ins)

    def _try(self, m, rm) -> None:
        sq = rm.inputs[0]
        x = None
        if sq.op.name == "pow" and _lit_scalar(sq.inputs[1]) == 2.0:
            x = sq.inputs[0]
        elif sq.op.name == "mul" and sq.inputs[0] is sq.inputs[1]:
            x = sq.inputs[0]
        if x is None or not isinstance(x.shape, type(rm.shape)) or x.shape.dtype not in ("float32", "float64",
                                                                                            "float16"):
            return
        nd = x.shape.ndim
        if [a % nd for a in rm.op.axes] != [nd - 1] or not rm.op.keepdims or len(sq.outputs) != 1 \
                or len(rm.outputs) != 1:
            return
        add = rm.outputs[0]
        if add.op.name != "add":
            return
        eps_ins = _other(add, rm)
        eps = _lit_scalar(eps_ins) if eps_ins is not None else None
        if eps is None or len(add.outputs) != 1:
            return
        sqrt = add.outputs[0]
        if sqrt.op.name != "sqrt" or len(sqrt.outputs) != 1:
            return
        rec = sqrt.outputs[0]
        if not (rec.op.name == "recip" or (rec.op.name == "div" and rec.inputs[1] is sqrt
                                           and _lit_scalar(rec.inputs[0]) == 1.0)) or len(rec.outputs) != 1:
            return
        mul = rec.outputs[0]
        if mul.op.name != "mul" or _other(mul, rec) is not x or tuple(mul.shape.lens) != tuple(x.shape.lens):
            return
        out, inputs = mul, [x]
        if len(mul.outputs) == 1 and mul.outputs[0].op.name == "mul":
            wmul = mul.outputs[0]
            w = _other(wmul, mul)
            if w is not None and w.op.name == "@literal" and tuple(w.shape.lens) in ((x.shape.lens[-1],),) \
                    and w.shape.dtype == x.shape.dtype and tuple(wmul.shape.lens) == tuple(x.shape.lens):
                out, inputs = wmul, [x, w]
        fused = m.insert_instruction(out, make_op("rms_norm", axis=-1, epsilon=float(np.float32(eps))), inputs)
        m.replace_instruction(out, fused)
