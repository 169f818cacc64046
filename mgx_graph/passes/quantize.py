"""quantize_fp16: run the program in half precision (as ``migraphx.quantize_fp16``).

float32 literals become float16, float32 parameters become float16 parameters, and conversions to
float32 convert to float16 instead; shapes are then recomputed.  Inputs and outputs of the compiled
program are therefore float16 where they were float32 (a KV cache bound in place stays in half).
"""
from __future__ import annotations

import numpy as np

from ..ir import Literal, Param


class QuantizeFp16:
    name = "quantize_fp16"

    def __call__(self, program) -> None:
        for m in program.module_order():
            for ins in m.instructions:
                op = ins.op
                if isinstance(op, Literal) and op.value.dtype == np.float32:
                    ins.op = Literal(op.value.astype(np.float16))
                    ins.shape = ins.op.compute_shape([])
                elif isinstance(op, Param) and ins.shape.dtype == "float32":
                    ins.op = Param(op.parameter, ins.shape.with_type("float16"))
                    ins.shape = ins.op.compute_shape([])
                elif op.name == "convert" and op.target_type == "float32":
                    op.attrs["target_type"] = "float16"
            m.recompute_shapes()
