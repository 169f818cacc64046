"""Instructions and the builtin operations: ``@param`` (a named input), ``@literal`` (a constant, a
numpy array) and ``@return``."""
from __future__ import annotations

import itertools

import numpy as np

from .operation import Operation
from .shape import Shape


class Param(Operation):
    name = "@param"
    builtin = True
    foldable = False

    def __init__(self, parameter: str, shape: Shape):
        super().__init__(parameter=parameter, _shape=shape)

    def compute_shape(self, inputs, mods=()):
        return self.attrs["_shape"]

    def __str__(self):
        return f"@param:{self.parameter}"


class Literal(Operation):
    name = "@literal"
    builtin = True

    def __init__(self, value: np.ndarray):
        super().__init__(_value=np.asarray(value, order="C"))

    @property
    def value(self) -> np.ndarray:
        return self.attrs["_value"]

    def compute_shape(self, inputs, mods=()):
        v = self.value
        return Shape(v.dtype.name, v.shape)

    def __str__(self):
        v = self.value
        flat = v.reshape(-1)
        if flat.size <= 8:
            body = ", ".join(_scalar_str(x) for x in flat)
        else:
            body = ", ".join(_scalar_str(x) for x in flat[:4]) + ", ..."
        return "@literal{" + body + "}"

    def __eq__(self, other):
        return self is other

    def __hash__(self):
        return id(self)


def _scalar_str(x) -> str:
    if isinstance(x, (np.floating, float)):
        return f"{float(x):.6g}"
    return str(x.item() if hasattr(x, "item") else x)


class Return(Operation):
    name = "@return"
    builtin = True
    foldable = False

    def compute_shape(self, inputs, mods=()):
        return tuple(inputs)


class Instruction:
    """One instruction: ``op`` applied to ``inputs`` (and ``module_inputs``), output ``shape``."""

    __slots__ = ("op", "inputs", "module_inputs", "shape", "outputs", "module", "label", "meta", "__weakref__")
    _ids = itertools.count()

    def __init__(self, op: Operation, inputs: list["Instruction"], module_inputs: list, shape, module):
        self.op = op
        self.inputs = list(inputs)
        self.module_inputs = list(module_inputs)
        self.shape = shape
        self.outputs: list[Instruction] = []
        self.module = module
        self.label = ""
        self.meta: dict = {}

    @property
    def name(self) -> str:
        return self.op.name

    def is_builtin(self) -> bool:
        return self.op.builtin

    def __repr__(self) -> str:
        return f"<ins {self.module.label_of(self) if self.module else '?'} {self.op}>"
