"""The IR, in MIGraphX's terms: a program holds modules; a module is an ordered list of
instructions; an instruction applies an operation to input instructions (and, for ops such as
``graph_launch`` or ``if``, to submodules) and has an output shape.

Builtins are ``@param`` (a named input), ``@literal`` (a constant, a numpy array) and ``@return``.
``print(program)`` gives one instruction per line, like ``migraphx-driver read``::

    module: "main"
    x = @param:x -> float_type, {2, 3}, {3, 1}
    @1 = @literal{0.5} -> float_type, {1}, {1}
    @2 = multibroadcast[out_lens={2, 3}](@1) -> float_type, {2, 3}, {0, 0}
    @3 = mul(x,@2) -> float_type, {2, 3}, {3, 1}
    @4 = @return(@3)
"""
from .instruction import Instruction, Literal, Param, Return  # noqa: F401
from .module import Module  # noqa: F401
from .operation import Operation  # noqa: F401
from .program import Program  # noqa: F401
from .shape import Shape  # noqa: F401
