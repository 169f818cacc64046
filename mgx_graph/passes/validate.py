"""Validation of a program between compiler passes, as MIGraphX's ``module::validate``.

:func:`validate_program` checks every module reachable from ``main`` and raises
:class:`InvalidProgram` (a CompileError) naming the module and instruction at fault:

* every referenced submodule is registered in the program under its name, and no module runs itself
  (directly or through its submodules);
* each module ends with its only ``@return``, and each instruction belongs to the module that lists it;
* every input of an instruction is live (not removed) and defined before it: earlier in the same
  module, or in an enclosing module before the instruction that runs this one (a subgraph reads
  outer values directly; a module run from several places must see the value from each of them);
* consumer lists agree with input lists both ways (no dangling consumer; a consumer in a module that
  no instruction runs, garbage that ``eliminate_dead_code`` drops, is not checked);
* every shape is what ``compute_shape`` gives for the inputs (a literal: its value's shape; an
  instruction bound into a parameter's layout: that layout, ``meta["bind_layout"]``).

The cost is linear in the size of the program: a few dictionary look-ups per instruction and input,
and one ``compute_shape`` call per instruction.  Given a ``memo`` (the pass manager keeps one per
compile), an instruction whose op, attribute values, input shapes and shape are the very objects seen
at the previous validation, and that runs no submodule, keeps its verdict without a new
``compute_shape`` (a pass that changes an attribute value in place, such as a list, without giving the
instruction a new shape is not caught there).
"""
from __future__ import annotations

from ..errors import CompileError


class InvalidProgram(CompileError):
    """The program breaks an IR rule.  ``reason`` says which; ``module`` and ``instruction`` name the
    place (None when the problem is not one instruction); ``pass_name`` is the pass that left it so
    (set by the pass manager; None for the input program)."""

    def __init__(self, reason: str, module: str | None = None, instruction: str | None = None):
        self.reason, self.module, self.instruction = reason, module, instruction
        self.pass_name: str | None = None
        super().__init__(self._where() + reason)

    def _where(self) -> str:
        if self.module is None:
            return ""
        return f"module '{self.module}'" + (f", instruction {self.instruction}" if self.instruction else "") + ": "

    def blame(self, pass_name: str | None) -> "InvalidProgram":
        """The same error, its message naming the pass that produced the program."""
        self.pass_name = pass_name
        who = f"pass '{pass_name}' produced an invalid program" if pass_name else "the program given to the passes " \
                                                                                  "is invalid"
        self.args = (f"{who}: {self._where()}{self.reason}",)
        return self


def validate_program(program, memo: dict | None = None) -> None:
    """Check the IR rules listed in this module's docstring over ``program`` (a
    :class:`mgx_graph.ir.Program`); raises :class:`InvalidProgram` at the first problem found.
    ``memo``: a dict kept between validations of the same program to skip re-checking shapes of
    unchanged instructions (see the module docstring)."""
    order, entries = _reachable(program)
    pos = {id(m): {id(i): k for k, i in enumerate(m.instructions)} for m in order}
    for m in order:
        _check_module(m, pos, entries, memo)


def _reachable(program):
    """Modules reachable from main (parents first) and, per module, where it is run from:
    ``{module name: [(parent module, index of the running instruction)]}``."""
    main = program.modules.get("main")
    if main is None:
        raise InvalidProgram("the program has no module 'main'")
    order, entries, state = [], {}, {}

    def visit(m):
        state[m.name] = "open"
        order.append(m)
        for k, ins in enumerate(m.instructions):
            for sm in ins.module_inputs:
                if program.modules.get(sm.name) is not sm:
                    raise InvalidProgram(f"runs module '{sm.name}', which is not in the program "
                                         f"(modules: {', '.join(program.modules)})", m.name, _label(ins, k))
                entries.setdefault(sm.name, []).append((m, k))
                if state.get(sm.name) == "open":
                    raise InvalidProgram(f"runs module '{sm.name}', which encloses it (a cycle)", m.name,
                                         _label(ins, k))
                if sm.name not in state:
                    visit(sm)
        state[m.name] = "done"

    visit(main)
    return order, entries


def _check_module(m, pos, entries, memo) -> None:
    ret = m.get_return()
    if ret is None:
        raise InvalidProgram("has no @return as its last instruction", m.name)
    for k, ins in enumerate(m.instructions):
        if ins.op.name == "@return" and ins is not ret:
            raise InvalidProgram("a second @return before the last instruction", m.name, _label(ins, k))
        if ins.module is not m:
            raise InvalidProgram(f"is listed here but belongs to module "
                                 f"'{getattr(ins.module, 'name', None)}'", m.name, _label(ins, k))
        for v in ins.inputs:
            _check_input(m, ins, k, v, pos, entries)
        for c in ins.outputs:
            if c.module is not None and id(c.module) not in pos:
                continue  # in a module no instruction runs: garbage eliminate_dead_code drops
            cpos = pos.get(id(c.module)) if c.module is not None else None
            if cpos is None or id(c) not in cpos or ins not in c.inputs:  # identity: no Instruction.__eq__
                raise InvalidProgram(f"lists {c.op} as a consumer, which " +
                                     ("does not read it" if cpos is not None and id(c) in cpos else "was removed"),
                                     m.name, _label(ins, k))
        _check_shape(m, ins, k, memo)


def _check_input(m, ins, k, v, pos, entries) -> None:
    vpos = pos.get(id(v.module)) if v.module is not None else None
    if vpos is None or id(v) not in vpos:
        raise InvalidProgram(f"reads {v.op}, which was removed (it is in no module run from main)", m.name,
                             _label(ins, k))
    if v.module is m:
        if vpos[id(v)] >= k:
            raise InvalidProgram(f"reads {m.label_of(v)} ({v.op}), which is defined after it", m.name, _label(ins, k))
    elif not _visible(v, m, pos, entries, set()):
        raise InvalidProgram(f"reads {v.module.name}:{v.module.label_of(v)} ({v.op}), which is not defined in "
                             f"an enclosing module before the instruction that runs '{m.name}'", m.name,
                             _label(ins, k))
    if ins not in v.outputs:
        raise InvalidProgram(f"is missing from the consumers of its input {v.module.label_of(v)} ({v.op})",
                             m.name, _label(ins, k))


def _visible(v, m, pos, entries, seen) -> bool:
    """True when ``v`` (of another module) is defined before every instruction that runs ``m``, in
    the running module or further out."""
    runs = entries.get(m.name, [])
    if not runs or m.name in seen:
        return False
    seen = seen | {m.name}
    for parent, k in runs:
        if v.module is parent:
            if pos[id(parent)][id(v)] >= k:
                return False
        elif not _visible(v, parent, pos, entries, seen):
            return False
    return True


def _check_shape(m, ins, k, memo) -> None:
    name = ins.op.name
    if name in ("@param", "@return"):
        return
    if name == "@literal":
        want = ins.op.compute_shape([])
    elif "bind_layout" in ins.meta:
        want = ins.meta["bind_layout"]
    else:
        seen = _fingerprint(ins) if memo is not None and not ins.module_inputs else None
        if seen is not None:
            old = memo.get(id(ins))
            if old is not None and len(old) == len(seen) and all(a is b for a, b in zip(old, seen)):
                return
        try:
            want = ins.op.compute_shape([i.shape for i in ins.inputs], ins.module_inputs)
        except Exception as e:
            raise InvalidProgram(f"compute_shape fails on its inputs: {type(e).__name__}: {e}", m.name,
                                 _label(ins, k)) from None
        if want == ins.shape and seen is not None:
            memo[id(ins)] = seen
    if want != ins.shape:
        raise InvalidProgram(f"has shape {_brief(ins.shape)} but compute_shape gives {_brief(want)}", m.name,
                             _label(ins, k))


def _fingerprint(ins) -> tuple:
    """The objects an instruction's shape is computed from, and the shape (kept alive by the memo,
    so their ids are not reused while it holds them)."""
    return (ins, ins.op, ins.shape, *ins.op.attrs.values(), None, *(i.shape for i in ins.inputs))


def _brief(shape) -> str:
    if isinstance(shape, tuple):
        return "(" + ", ".join(_brief(s) for s in shape) + ")"
    return str(shape)


def _label(ins, k) -> str:
    lab = ins.op.parameter if ins.op.name == "@param" else f"@{k}"
    return f"{lab} ({ins.op})"
