"""What the run time reads of a compiled program: the memory plan, and the queries over the lowered IR
that the passes and the executor share (execution order, aliases, host values, parameters written in
place, movable values, launch counts).  Below every pass, so that the executor and the graph layer
import it and not the passes themselves.
"""
from __future__ import annotations

from dataclasses import dataclass, field

CONTROL = ("graph_launch", "if", "loop")


@dataclass
class MemoryPlan:
    buffers: list = field(default_factory=list)
    offsets: dict = field(default_factory=dict)  # (id(ins), idx) -> offset
    workspace: dict = field(default_factory=dict)  # id(ins) -> [offsets]
    arena_bytes: int = 0
    literal_offsets: dict = field(default_factory=dict)  # id(ins) -> offset
    literal_bytes: int = 0
    shared_literal_bytes: int = 0  # bytes of another program's literals read from its memory (share_literals)
    largest: list = field(default_factory=list)  # [(bytes, "instruction main:@3 relu float32[...]")], largest first

    @property
    def peak_bytes(self) -> int:
        return self.arena_bytes


def linear_order(module):
    """Instructions in execution order, submodule bodies inlined before the instruction running them."""
    out = []
    for ins in module.instructions:
        if ins.op.name in CONTROL:
            for sub in ins.module_inputs:
                out.extend(linear_order(sub))
        out.append(ins)
    return out


def param_bindings(program) -> dict:
    """id(submodule @param) -> what it is bound to: ``("value", parent_ins)`` for graph_launch inputs,
    ``("loop", loop_ins, k)`` for a loop body's carried value k, ``("loopvar", loop_ins, name)`` for its
    iteration number / condition."""
    res: dict[int, tuple] = {}
    for m in program.module_order():
        for ins in m.instructions:
            if ins.op.name == "graph_launch":
                sub = ins.module_inputs[0]
                for name, v in zip(sorted(sub.get_parameter_names()), ins.inputs):
                    res[id(sub.get_parameter(name))] = ("value", v)
            elif ins.op.name == "loop":
                body = ins.module_inputs[0]
                names = ins.op.param_names
                for k, name in enumerate(names):
                    p = body.get_parameter(name)
                    if p is None:
                        continue
                    res[id(p)] = ("loopvar", ins, k) if k < 2 else ("loop", ins, k - 2)
    return res


def tuple_size(ins) -> int:
    return len(ins.shape) if isinstance(ins.shape, tuple) else 0


def value_root(ins, bindings=None, idx=None):
    """The buffer key ``(instruction, tuple index or None)`` owning the memory of ``ins``."""
    for _ in range(100000):
        op = ins.op
        if op.name == "@param":
            b = bindings.get(id(ins)) if bindings else None
            if b is None:
                return ins, None
            if b[0] == "value":
                ins = b[1]
                continue
            if b[0] == "loop":
                return b[1], b[2]
            return b[1], ("var", b[2])
        if op.name == "get_tuple_elem":
            t = ins.inputs[0]
            if t.op.name == "graph_launch":
                ins = t.module_inputs[0].get_return().inputs[op.index]
                continue
            # a view of another view/param chain ending in a tuple producer
            root, _ = value_root(t, bindings)
            return root, op.index
        if op.name == "graph_launch":
            ins = ins.module_inputs[0].get_return().inputs[0]
            continue
        if op.is_view:
            ins = ins.inputs[0]
            continue
        return ins, None
    raise RuntimeError("alias cycle")


def sub_param_map(program) -> dict:
    """id(graph_launch body @param) -> the parent instruction bound to it."""
    return {k: v[1] for k, v in param_bindings(program).items() if v[0] == "value"}


def on_host(ins) -> bool:
    return bool(ins.meta.get("on_host"))


def bound_params(ins) -> list:
    """``[(tuple index or None, parameter name)]``: the results of ``ins`` written into a parameter's
    buffer (``meta["bind_param"]``: a name for an instruction of one result, a tuple of names or None
    per element for one of a tuple of results)."""
    b = ins.meta.get("bind_param")
    if b is None:
        return []
    if isinstance(b, str):
        return [(None, b)]
    return [(k, n) for k, n in enumerate(b) if n is not None]


def launch_count(ins) -> int:
    k = ins.meta.get("kernel")
    return k.launches if k is not None else 0


def movable_values(program) -> set[int]:
    """``id`` of every instruction whose value the eval loop binds per call, so that its array (and its
    device pointer) may differ between calls: parameters (except a loop body's, bound to the loop's own
    buffers), ``graph_launch`` results, ``@return``, instructions writing into a parameter
    (``bind_param``), guards, and views of any of these.  Every other value has a fixed address for
    the program's life (a scratch-arena buffer, a literal, a host buffer)."""
    binds = param_bindings(program)
    moving: set[int] = set()
    for m in program.module_order():  # parents first: an outer value is classified before its readers
        for ins in m.instructions:
            op = ins.op
            if op.name == "@param":
                b = binds.get(id(ins))
                if b is None or b[0] not in ("loop", "loopvar"):
                    moving.add(id(ins))
            elif op.name in ("graph_launch", "@return") or "bind_param" in ins.meta:
                moving.add(id(ins))
            elif op.is_view and (op.name == "guard" or id(ins.inputs[0]) in moving):
                moving.add(id(ins))
    return moving
