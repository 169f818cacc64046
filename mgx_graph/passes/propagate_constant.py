"""propagate_constant: evaluate every instruction whose inputs are all literals, on the host, and
replace it by a literal (the parser already does this while parsing; passes that create new
constant expressions run it again)."""
from __future__ import annotations


class PropagateConstant:
    name = "propagate_constant"

    def __call__(self, program) -> None:
        from ..onnx_frontend import fold_instruction

        for m in program.module_order():
            for ins in list(m.instructions):
                if ins.module is m:
                    fold_instruction(m, ins)
