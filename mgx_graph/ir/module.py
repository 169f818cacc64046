"""A module: an ordered list of instructions with parameters, literals and one ``@return``."""
from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from ..errors import CompileError, ShapeError
from .instruction import Instruction, Literal, Param, Return
from .operation import Operation, make_op
from .shape import Shape, check_size


class Module:
    """An ordered list of instructions with parameters, literals and one ``@return``."""

    def __init__(self, name: str, program=None):  # program: the Program holding it, or None
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
    def replace_instruction(self, old: Instruction, new: Instruction, *, remove: bool = False) -> Instruction:
        """Make every consumer of ``old`` read ``new`` instead, as MIGraphX's ``replace_instruction``.

        Consumers anywhere follow (this module, submodules reading ``old`` as an outer value,
        ``@return``), except ``new`` itself, so ``new`` may be built over ``old`` (a copy of it).
        ``old`` stays until dead-code elimination, or is removed here with ``remove=True`` (ShapeError
        when ``new`` still reads it).  Returns ``new``.
        """
        if old is new:
            return new
        kept = []
        for c in list(old.outputs):
            if c is new:
                kept.append(c)
                continue
            c.inputs = [new if i is old else i for i in c.inputs]
            new.outputs.append(c)
        old.outputs = kept
        if remove:
            self.remove_instruction(old)
        return new

    def set_inputs(self, ins: Instruction, inputs: Iterable[Instruction]) -> None:
        """Give ``ins`` the arguments ``inputs`` (position by position), keeping every changed
        argument's consumer list consistent; the output shape is not recomputed."""
        inputs = list(inputs)
        for k, old in enumerate(ins.inputs):
            if k >= len(inputs) or inputs[k] is not old:
                _drop_one(old.outputs, ins)
        for k, new in enumerate(inputs):
            if k >= len(ins.inputs) or ins.inputs[k] is not new:
                new.outputs.append(ins)
        ins.inputs = inputs

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

    # -- runs and submodules ---------------------------------------------------------------------
    def run_io(self, run: list[Instruction]) -> tuple[list[Instruction], list[Instruction]]:
        """Inputs and outputs of ``run`` (instructions of this module): the values its members read
        that are not members (first-use order, each once), and the members read by something that is
        not a member (run order), be it an instruction of this module, of a submodule, or ``@return``."""
        members = {id(i) for i in run}
        inputs, seen = [], set()
        for ins in run:
            for v in ins.inputs:
                if id(v) not in members and id(v) not in seen:
                    seen.add(id(v))
                    inputs.append(v)
        outputs = [i for i in run if any(id(c) not in members for c in i.outputs)]
        return inputs, outputs

    def move_to_submodule(self, run: list[Instruction], name: str, call_op: Operation,
                          param_names: list[str] | None = None) -> tuple["Module", dict[str, Instruction]]:
        """Outline ``run`` (instructions of this module, in order) into a new submodule ``name``
        that one ``call_op`` instruction (``graph_launch``) runs from here.

        The submodule gets a parameter per input of the run (``param_names``, default ``x0, x1, ...``
        in first-use order) and returns the run's outputs.  The call takes the inputs in sorted
        parameter-name order (how ``graph_launch`` binds them) and stands before the instruction that
        followed the run's last member; consumers outside the run read the call itself (one output) or
        a ``get_tuple_elem`` of it.  Returns ``(submodule, {parameter name: outer value bound to it})``.
        Raises CompileError when the run has no output or the module belongs to no program.
        """

        inputs, outputs = self.run_io(run)
        if not outputs or self.program is None:
            raise CompileError(f"module '{self.name}': cannot outline a run of {len(run)} instruction(s) "
                               f"into '{name}': " + ("nothing reads its results" if not outputs else "no program"))
        names = list(param_names) if param_names is not None else [f"x{k}" for k in range(len(inputs))]
        sub = self.program.create_module(name)
        bound = dict(zip(names, inputs))
        pmap = {id(bound[n]): sub.add_parameter(n, bound[n].shape) for n in sorted(bound)}
        last = self.instructions.index(run[-1])
        anchor = self.instructions[last + 1] if last + 1 < len(self.instructions) else None
        for ins in run:
            self.instructions.remove(ins)
            self.set_inputs(ins, [pmap.get(id(v), v) for v in ins.inputs])
            ins.module = sub
            sub.instructions.append(ins)
        members = {id(i) for i in run}
        outside = {id(o): [c for c in o.outputs if id(c) not in members] for o in outputs}
        for o in outputs:
            o.outputs = [c for c in o.outputs if id(c) in members]
        sub.add_return(outputs)

        def place(op, args, mods=()):
            return self.add_instruction(op, args, mods) if anchor is None else \
                self.insert_instruction(anchor, op, args, mods)

        call = place(call_op, [bound[n] for n in sorted(bound)], [sub])
        for idx, o in enumerate(outputs):
            val = call if len(outputs) == 1 else place(make_op("get_tuple_elem", index=idx), [call])
            for c in outside[id(o)]:
                c.inputs = [val if i is o else i for i in c.inputs]
                val.outputs.append(c)
        return sub, bound

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


def _drop_one(lst: list, x) -> None:
    """Remove the first element of ``lst`` that is ``x`` (by identity)."""
    for k, v in enumerate(lst):
        if v is x:
            del lst[k]
            return


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
