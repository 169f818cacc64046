"""Helpers shared by ``fuse_pointwise`` and ``fuse_reduce``: which instructions may join a fused
kernel, growing a group over its producers, and outlining a group into a submodule run by one
fused instruction (``pointwise`` / ``fused_reduce``).

A group has one output, its *root*: every other member has all its consumers inside the group, so
outlining never creates a cycle and the fused instruction can stand where the root stood (every
input of the group is defined before it).  ``fuse_reduce`` may add further outputs, members read
outside only after the root (their readers then read a ``get_tuple_elem`` of the fused instruction).  Scalar literals the members read are copied into the
submodule (they become constants of the generated kernel); every other outside value becomes a
parameter ``x0, x1, ...`` of the submodule, bound by position to the fused instruction's inputs, in
first-use order except that the root's first input, when it comes from outside, is ``x0`` (so a root
that could write in place into its first input still can: see ``inplace_ok``).
"""
from __future__ import annotations

from ..ir.shape import Shape
from ..operators.fused_exprs import SUPPORTED, op_body
from ..operators.fused_module import VIEW_NAMES, module_params
from ..operators.pointwise import Pointwise
from .pass_manager import ModulePass

VIEWS = VIEW_NAMES  # the views a fused kernel reads through
MAX_MEMBERS = 256  # a group stops growing here (one generated kernel's source stays small)


def plain(ins, exclude=()) -> bool:
    """An instruction a generated kernel can hold at all: a non-builtin op not in ``exclude`` (host
    ops), with no submodule, not bound to a parameter, non-empty single result and inputs of the
    numeric / bool types the kernels support."""
    op = ins.op
    if op.builtin or op.name in exclude or ins.module_inputs or "bind_param" in ins.meta or ins.meta.get("on_host"):
        return False
    shapes = [ins.shape] + [i.shape for i in ins.inputs]
    return all(isinstance(s, Shape) and s.dtype in SUPPORTED for s in shapes) and ins.shape.elements() > 0


def elementwise(ins, exclude=()) -> bool:
    """An elementwise op (a ``Pointwise``) with a fused C body for its types (see
    :func:`mgx_graph.operators.fused_exprs.op_body`)."""
    return plain(ins, exclude) and isinstance(ins.op, Pointwise) and \
        op_body(ins.op, [i.shape.dtype for i in ins.inputs], ins.shape.dtype) is not None


def view(ins, exclude=()) -> bool:
    return plain(ins, exclude) and ins.op.name in VIEWS and ins.op.is_view


def concat(ins, exclude=()) -> bool:
    return plain(ins, exclude) and ins.op.name == "concat"


def grow_producers(m, members: list, ok, limit: int = MAX_MEMBERS) -> None:
    """Add to ``members`` (in place) every producer in ``m`` for which ``ok(instruction)`` holds
    and all of whose consumers are members, until none is left or ``limit`` members are reached."""
    ids = {id(i) for i in members}
    changed = True
    while changed and len(members) < limit:
        changed = False
        for ins in list(members):
            for v in ins.inputs:
                if id(v) in ids or v.module is not m or not ok(v):
                    continue
                if len(members) < limit and all(id(c) in ids for c in v.outputs):
                    ids.add(id(v))
                    members.append(v)
                    changed = True


def module_name(program, base: str) -> str:
    n = 0
    while f"{base}{n}" in program.modules:
        n += 1
    return f"{base}{n}"


def _group_inputs(members, ids, root):
    """Outside values the members read (first use; the root's first input first) and the scalar
    literals among them (copied into the submodule)."""
    inputs, lits, seen = [], [], set()
    for ins in members:
        for v in ins.inputs:
            if id(v) in ids or id(v) in seen:
                continue
            seen.add(id(v))
            (lits if v.op.name == "@literal" and v.shape.elements() == 1 else inputs).append(v)
    if root.inputs and any(v is root.inputs[0] for v in inputs):  # the root's first input stays first:
        inputs.remove(root.inputs[0])                             # an in-place binding of the root holds
        inputs.insert(0, root.inputs[0])
    return inputs, lits


def outline(m, members: list, make_op, kind: str, extra=()):
    """Move ``members`` (instructions of ``m``; the last in program order is the root) into a new
    submodule ``<module>:<kind><n>`` run by the instruction ``make_op(submodule)``, which takes the
    root's place.  Only the root, and the members in ``extra`` (further outputs, read outside only
    after the root), may be read outside the group: with extras the submodule returns the root then
    the extras, and their outside readers read ``get_tuple_elem`` of the fused instruction.  Returns
    the fused instruction."""
    from ..operators import make_op as make

    order = {id(i): k for k, i in enumerate(m.instructions)}
    members = sorted(members, key=lambda i: order[id(i)])
    root, ids = members[-1], {id(i) for i in members}
    outs = [root] + sorted(extra, key=lambda i: order[id(i)])
    inputs, lits = _group_inputs(members, ids, root)
    sub = m.program.create_module(module_name(m.program, f"{m.name}:{kind}"))
    mapping = {id(v): sub.add_parameter(f"x{k}", v.shape) for k, v in enumerate(inputs)}
    mapping.update({id(v): sub.add_literal(v.op.value) for v in lits})
    anchor = m.instructions[order[id(root)] + 1]
    outside = {id(o): [c for c in o.outputs if id(c) not in ids] for o in outs}
    m.instructions = [i for i in m.instructions if id(i) not in ids]
    for ins in members:
        m.set_inputs(ins, [mapping.get(id(v), v) for v in ins.inputs])
        ins.module = sub
        sub.instructions.append(ins)
    for o in outs:
        o.outputs = [c for c in o.outputs if id(c) in ids]
    sub.add_return(outs)
    fused = m.insert_instruction(anchor, make_op(sub), inputs, [sub])
    for k, o in enumerate(outs):
        val = fused if len(outs) == 1 else m.insert_instruction(anchor, make("get_tuple_elem", index=k), [fused])
        readers = outside[id(o)]
        for c in {id(c): c for c in readers}.values():
            c.inputs = [val if i is o else i for i in c.inputs]
        val.outputs.extend(readers)
    return fused


def fused_modules(program) -> set:
    """Names of the modules run by fused instructions (never fused again themselves)."""
    return {ins.module_inputs[0].name for m in program.module_order() for ins in m.instructions
            if getattr(ins.op, "fused", False) and ins.module_inputs}


class FusionPass(ModulePass):
    """Base of the fusion passes: ``exclude`` (op names never fused); visits every module but those run by
    fused instructions (their bodies are already one kernel) through ``apply_module``."""

    def __init__(self, exclude=()):
        self.exclude = frozenset(exclude or ())

    def apply(self, program, ctx=None) -> None:
        skip = fused_modules(program)
        for m in program.module_order():
            if m.name not in skip:
                self.apply_module(m, ctx)


def inline_fused(m, f) -> tuple[list, list]:
    """Put the instructions of fused instruction ``f``'s submodule back into ``m`` where ``f`` stands
    (parameters bound to ``f``'s inputs; its readers, or the readers of its ``get_tuple_elem`` s, read
    the returned values); ``f`` and its submodule leave the program.  Returns ``(placed, returned)``:
    the instructions placed in order, and the values standing for the returned ones."""
    sub = f.module_inputs[0]
    env = {id(p): v for p, v in zip(module_params(sub), f.inputs)}
    placed = []
    for ins in sub.instructions:
        if ins.op.name in ("@param", "@return"):
            continue
        if ins.op.name == "@literal":
            new = m.insert_literal(f, ins.op.value)
        else:
            new = m.insert_instruction(f, ins.op, [env[id(i)] for i in ins.inputs], ins.module_inputs)
        env[id(ins)] = new
        placed.append(new)
    returned = [env[id(r)] for r in sub.get_return().inputs]
    if isinstance(f.shape, tuple):
        for g in list({id(c): c for c in f.outputs}.values()):
            m.replace_instruction(g, returned[g.op.index], remove=True)
    else:
        m.replace_instruction(f, returned[0])
    m.remove_instruction(f)
    m.program.remove_module(sub.name)
    return placed, returned
