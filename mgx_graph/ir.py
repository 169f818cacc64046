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
from __future__ import annotations

import itertools
from typing import Iterable, Iterator

import numpy as np

from .errors import ShapeError
from .operators.base import Operation
from .shape import Shape, check_size


# ---------------------------------------------------------------------------------------------------
# builtins
# ---------------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------------
# instruction / module / program
# ---------------------------------------------------------------------------------------------------
class Instruction:
    """One instruction: ``op`` applied to ``inputs`` (and ``module_inputs``), output ``shape``."""

    __slots__ = ("op", "inputs", "module_inputs", "shape", "outputs", "module", "label", "meta", "__weakref__")
    _ids = itertools.count()

    def __init__(self, op: Operation, inputs: list["Instruction"], module_inputs: list["Module"], shape, module):
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


class Module:
    """An ordered list of instructions with parameters, literals and one ``@return``."""

    def __init__(self, name: str, program: "Program | None" = None):
        self.name = name
        self.program = program
        self.instructions: list[Instruction] = []
        self.output_names: list[str] = []

    # -- iteration -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.instructions)

    def __len__(self) -> int:
        return len(self.instructions)

    # -- construction ----------------------------------------------------------------------------
    def _make(self, op, inputs, module_inputs, shape=None) -> Instruction:
        inputs = list(inputs)
        if shape is None:
            in_shapes = [i.shape for i in inputs]
            try:
                shape = op.compute_shape(in_shapes, list(module_inputs))
            except ShapeError as e:
                desc = ", ".join(s.brief() if isinstance(s, Shape) else "tuple" for s in in_shapes)
                raise ShapeError(f"{e} [instruction {op} in module '{self.name}', inputs ({desc})]") from None
        check_size(shape, f"parameter '{op.parameter}'" if op.name == "@param" else
                   f"instruction {op.name} in module '{self.name}'")
        ins = Instruction(op, inputs, list(module_inputs), shape, self)
        for i in inputs:
            i.outputs.append(ins)
        return ins

    def add_parameter(self, name: str, shape: Shape) -> Instruction:
        if any(i.op.name == "@param" and i.op.parameter == name for i in self.instructions):
            raise ShapeError(f"module '{self.name}': parameter '{name}' defined twice")
        ins = self._make(Param(name, shape), [], [])
        self.instructions.insert(self._param_pos(), ins)
        return ins

    def _param_pos(self) -> int:
        n = 0
        for i in self.instructions:
            if i.op.name != "@param":
                break
            n += 1
        return n

    def add_literal(self, value) -> Instruction:
        ins = self._make(Literal(np.asarray(value)), [], [])
        self.instructions.append(ins)
        return ins

    def add_instruction(self, op: Operation, inputs: Iterable[Instruction] = (), module_inputs=()) -> Instruction:
        ins = self._make(op, inputs, module_inputs)
        ret = self.get_return()
        if ret is not None:
            self.instructions.insert(self.instructions.index(ret), ins)
        else:
            self.instructions.append(ins)
        return ins

    def insert_instruction(self, before: Instruction, op: Operation, inputs=(), module_inputs=()) -> Instruction:
        ins = self._make(op, inputs, module_inputs)
        self.instructions.insert(self.instructions.index(before), ins)
        return ins

    def insert_literal(self, before: Instruction, value) -> Instruction:
        ins = self._make(Literal(np.asarray(value)), [], [])
        self.instructions.insert(self.instructions.index(before), ins)
        return ins

    def add_return(self, values: list[Instruction], names: list[str] | None = None) -> Instruction:
        old = self.get_return()
        if old is not None:
            self.remove_instruction(old)
        ins = self._make(Return(), values, [])
        self.instructions.append(ins)
        if names is not None:
            self.output_names = list(names)
        return ins

    # -- rewriting -------------------------------------------------------------------------------
    def replace_instruction(self, old: Instruction, new: Instruction) -> None:
        """Make every consumer of ``old`` use ``new`` instead (``old`` stays until DCE)."""
        if old is new:
            return
        for c in list(old.outputs):
            c.inputs = [new if i is old else i for i in c.inputs]
            new.outputs.append(c)
        old.outputs = []

    def replace_argument(self, consumer: Instruction, old: Instruction, new: Instruction) -> None:
        consumer.inputs = [new if i is old else i for i in consumer.inputs]
        if consumer in old.outputs and old not in consumer.inputs:
            old.outputs = [o for o in old.outputs if o is not consumer]
        new.outputs.append(consumer)

    def remove_instruction(self, ins: Instruction) -> None:
        if ins.outputs:
            raise ShapeError(f"module '{self.name}': cannot remove {ins.op} which still has consumers")
        for i in ins.inputs:
            i.outputs = [o for o in i.outputs if o is not ins]
        self.instructions.remove(ins)
        ins.module = None

    def move_instruction(self, ins: Instruction, before: Instruction) -> None:
        self.instructions.remove(ins)
        self.instructions.insert(self.instructions.index(before), ins)

    def recompute_shapes(self) -> None:
        """Recompute every output shape in order (after a pass changed types)."""
        for ins in self.instructions:
            if ins.op.name in ("@param", "@literal"):
                continue
            if "bind_layout" in ins.meta:
                ins.shape = ins.meta["bind_layout"]
                continue
            ins.shape = ins.op.compute_shape([i.shape for i in ins.inputs], ins.module_inputs)

    # -- queries ---------------------------------------------------------------------------------
    def get_return(self) -> Instruction | None:
        if self.instructions and self.instructions[-1].op.name == "@return":
            return self.instructions[-1]
        return None

    def get_parameter(self, name: str) -> Instruction | None:
        for i in self.instructions:
            if i.op.name == "@param" and i.op.parameter == name:
                return i
        return None

    def get_parameter_names(self) -> list[str]:
        return [i.op.parameter for i in self.instructions if i.op.name == "@param"]

    def get_parameter_shapes(self) -> dict[str, Shape]:
        return {i.op.parameter: i.shape for i in self.instructions if i.op.name == "@param"}

    def get_output_shapes(self) -> list:
        r = self.get_return()
        return [i.shape for i in r.inputs] if r else []

    # -- printing --------------------------------------------------------------------------------
    def label_of(self, ins: Instruction) -> str:
        if ins.op.name == "@param":
            return ins.op.parameter
        try:
            return f"@{self.instructions.index(ins)}"
        except ValueError:
            return "@?"

    def print(self, file=None) -> str:
        lines = [f'module: "{self.name}"']
        labels = {}
        for n, ins in enumerate(self.instructions):
            labels[id(ins)] = ins.op.parameter if ins.op.name == "@param" else f"@{n}"
        for ins in self.instructions:
            lab = labels[id(ins)]
            if ins.op.name == "@param":
                lines.append(f"{lab} = {ins.op} -> {_shape_str(ins.shape)}")
                continue
            args = ",".join(labels.get(id(i)) or _outer_label(i) for i in ins.inputs)
            mods = ""
            if ins.module_inputs:
                mods = ", [" + ", ".join(m.name for m in ins.module_inputs) + "]"
            call = f"({args})" if ins.inputs or ins.op.name == "@return" else ""
            if ins.op.name == "@return":
                lines.append(f"{lab} = @return{call}")
            else:
                lines.append(f"{lab} = {ins.op}{call}{mods} -> {_shape_str(ins.shape)}")
        text = "\n".join(lines) + "\n"
        if file is not None:
            file.write(text)
        return text

    def __str__(self) -> str:
        return self.print()


def _outer_label(ins) -> str:
    """Label of an instruction of an enclosing module (a subgraph reading an outer value)."""
    m = ins.module
    if m is None:
        return "?"
    if ins.op.name == "@param":
        return f"{m.name}:{ins.op.parameter}"
    return f"{m.name}:@{m.instructions.index(ins)}"


def _shape_str(shape) -> str:
    if isinstance(shape, tuple):
        return "[" + ", ".join(_shape_str(s) for s in shape) + "]"
    return str(shape)


class Program:
    """A set of modules with a root module ``main``.

    Created by :func:`mgx_graph.parse_onnx`; :meth:`compile` runs the passes and lowers it to a
    target, after which :meth:`run` / :meth:`run_async` execute it.
    """

    def __init__(self):
        self.modules: dict[str, Module] = {}
        self.create_module("main")
        self._compiled = None  # set by compile()

    def create_module(self, name: str) -> Module:
        if name in self.modules:
            raise ShapeError(f"module '{name}' already exists")
        m = Module(name, self)
        self.modules[name] = m
        return m

    def remove_module(self, name: str) -> None:
        self.modules.pop(name, None)

    def get_main_module(self) -> Module:
        return self.modules["main"]

    def module_order(self) -> list[Module]:
        """Modules reachable from main, children before parents are not guaranteed: parents first."""
        seen, order = set(), []

        def visit(m: Module):
            if m.name in seen:
                return
            seen.add(m.name)
            order.append(m)
            for ins in m.instructions:
                for sm in ins.module_inputs:
                    visit(sm)

        visit(self.get_main_module())
        return order

    # MIGraphX-style queries
    def get_parameter_names(self) -> list[str]:
        return self.get_main_module().get_parameter_names()

    def get_parameter_shapes(self) -> dict[str, Shape]:
        return self.get_main_module().get_parameter_shapes()

    def get_output_shapes(self) -> list:
        return self.get_main_module().get_output_shapes()

    def get_output_names(self) -> list[str]:
        return list(self.get_main_module().output_names)

    def print(self, file=None) -> str:
        text = "".join(m.print() + "\n" for m in self.module_order())
        if file is not None:
            file.write(text)
        return text

    def __str__(self) -> str:
        return self.print()

    def instruction_count(self) -> int:
        return sum(len(m) for m in self.module_order())

    # compile/run are attached in program.py to keep this module free of target code
