"""bind_outputs: write selected program outputs into the buffer of an input parameter (in place).

A fixed-shape decode step exports the KV cache as ``past_*`` inputs and ``present_*`` outputs of
identical shape; ONNX has no in-place semantics, so the update is a ``ScatterND`` producing a new
tensor.  Binding ``present -> past`` makes that ScatterND write into the caller's cache buffer: the
cache never moves, no copy is made, and one captured graph serves every token.

The binding is legal only when nothing reads the parameter after the instruction that writes it;
otherwise :class:`CompileError` names the reader.  ``alias`` maps output names to parameter names.

The pass also gives every other output a standard-layout buffer of its own in the scratch arena
(:func:`copy_outputs`): an output that is a literal, a parameter, a view of either, a view into a
parameter written in place, a non-standard view or memory already returned as another output gets
a ``contiguous`` copy, so ``run_async`` never hands out a literal, the caller's input or a strided
view, and a graph capture records the copy like any other kernel.
"""
from __future__ import annotations

import json
import re

from ..errors import CompileError
from ..ir.shape import Shape
from ..operators import make_op
from .analysis import bound_params, value_root
from .pass_manager import Pass

_PATTERNS = [
    (re.compile(r"^present\.(.+)$"), r"past_key_values.\1"),
    (re.compile(r"^present_key_values\.(.+)$"), r"past_key_values.\1"),
    (re.compile(r"^present_(.+)$"), r"past_\1"),
    (re.compile(r"^(.*)cache_out(.*)$"), r"\1cache_in\2"),
    (re.compile(r"^(.*)_out$"), r"\1_in"),
]


def detect_alias(program, model_metadata: dict | None = None) -> dict[str, str]:
    """Output -> parameter pairs to bind in place, from the model's ``mgx_graph.alias`` metadata or,
    failing that, from the usual KV-cache names (``present.N.key`` -> ``past_key_values.N.key``,
    ``present_*`` -> ``past_*``, ``*cache_out*`` -> ``*cache_in*``), keeping only pairs whose shapes and
    types are identical."""
    m = program.get_main_module()
    shapes = m.get_parameter_shapes()
    outs = dict(zip(m.output_names, m.get_output_shapes()))
    if model_metadata and "mgx_graph.alias" in model_metadata:
        raw = json.loads(model_metadata["mgx_graph.alias"])
        return {o: p for o, p in raw.items() if o in outs and p in shapes}
    found = {}
    for o, s in outs.items():
        for pat, rep in _PATTERNS:
            if pat.match(o):
                p = pat.sub(rep, o)
                if p in shapes and shapes[p].lens == s.lens and shapes[p].dtype == s.dtype:
                    found[o] = p
                    break
    return found


def _readers(param):
    """Instructions that read ``param`` directly or through views."""
    out, stack, seen = [], [param], set()
    while stack:
        v = stack.pop()
        for c in v.outputs:
            if id(c) in seen or c.op.name == "@return":
                continue
            seen.add(id(c))
            if c.op.is_view:
                stack.append(c)
            else:
                out.append((c, v))
    return out


class BindOutputs(Pass):
    """Bind ``alias`` pairs (output name -> parameter name) in place; with ``strict`` a pair that
    cannot be bound raises CompileError, otherwise it is recorded in ``skipped`` with the reason.
    Records the pairs bound and skipped in the compile result (``ctx.result.alias`` /
    ``alias_skipped``) when run with a pass context."""

    name = "bind_outputs"
    required = True  # it also copies outputs that would expose a literal or the caller's input

    def __init__(self, alias: dict[str, str], strict: bool = True):
        self.alias = dict(alias or {})
        self.strict = strict
        self.bound: dict[str, str] = {}
        self.skipped: dict[str, str] = {}

    def apply(self, program, ctx=None) -> None:
        m = program.get_main_module()
        ret = m.get_return()
        names = m.output_names
        copy_outputs(m, skip=set(self.alias))  # before binding: the readers they add are checked
        order = {id(i): n for n, i in enumerate(m.instructions)}
        taken: set = set()
        for out_name, pname in self.alias.items():
            try:
                self._bind(m, ret, names, order, out_name, pname, taken)
                self.bound[out_name] = pname
            except CompileError as e:
                if self.strict:
                    raise
                self.skipped[out_name] = str(e)
        copy_outputs(m, skip=set(self.bound))
        if ctx is not None:
            ctx.result.alias = dict(self.bound)
            ctx.result.alias_skipped = dict(self.skipped)

    def _bind(self, m, ret, names, order, out_name, pname, taken):
        if out_name not in names:
            raise CompileError(f"alias: '{out_name}' is not an output of the program (outputs: {', '.join(names)})")
        p = m.get_parameter(pname)
        if p is None:
            raise CompileError(f"alias: '{pname}' is not a parameter of the program")
        o = ret.inputs[names.index(out_name)]
        if tuple(o.shape.lens) != tuple(p.shape.lens) or o.shape.dtype != p.shape.dtype:
            raise CompileError(f"alias: output '{out_name}' ({o.shape.brief()}) and parameter '{pname}' "
                               f"({p.shape.brief()}) differ in shape or type")
        w, k = _writer(o)
        if w.op.builtin or w.op.is_view:
            raise CompileError(f"alias: output '{out_name}' is produced by {w.op.name}, which cannot write in place")
        if sum(1 for i in ret.inputs if i is o) > 1 or (id(w), k) in taken or k in dict(bound_params(w)):
            raise CompileError(f"alias: output '{out_name}' is returned twice or already bound")
        if pname in program_bound(m):
            raise CompileError(f"alias: parameter '{pname}' is already bound to another output")
        # the layout the writer gets inside the parameter's buffer
        j = w.op.inplace_input(k)
        src = w.inputs[j] if j is not None and j < len(w.inputs) else None
        elem = w.shape if k is None else w.shape[k]
        chain_ok = (src is not None and _layout_chain_to(src, p)
                    and tuple(src.shape.lens) == tuple(elem.lens) and not src.shape.broadcasted())
        layout = src.shape if chain_ok else p.shape
        if not chain_ok and (w is not o or k is not None):
            raise CompileError(f"alias: output '{out_name}' is a view of {w.op.name}, whose input is not a "
                               f"layout view of '{pname}'")
        pos = order[id(w)]
        for reader, via in _readers(p):
            if reader is w:
                if not (chain_ok and w.inputs[j] is via and sum(1 for i in w.inputs if i is via) == 1):
                    raise CompileError(f"alias: {w.op.name} producing '{out_name}' reads '{pname}' in a way that "
                                       f"cannot run in place")
                continue
            if order.get(id(reader), -1) > pos:
                raise CompileError(f"alias: parameter '{pname}' is read by {reader.op.name} after {w.op.name} "
                                   f"writes '{out_name}' into it")
        old, kept = {}, w.meta.get("bind_layout")
        try:
            old = _relayout(m, w, layout, k)
            if tuple(o.shape.lens) != tuple(p.shape.lens) or not _same_layout(o.shape, p.shape):
                raise CompileError(f"alias: output '{out_name}' would not land in '{pname}' with the same layout")
        except Exception as e:
            for ins, shp in old.items():
                ins.shape = shp
            if kept is None:
                w.meta.pop("bind_layout", None)
            else:
                w.meta["bind_layout"] = kept
            if isinstance(e, CompileError):
                raise
            raise CompileError(f"alias: binding '{out_name}' onto '{pname}' breaks a later view: {e}") from None
        if k is None:
            w.meta["bind_param"] = pname
        else:
            names_k = list(w.meta.get("bind_param") or (None,) * len(w.shape))
            names_k[k] = pname
            w.meta["bind_param"] = tuple(names_k)
        taken.add((id(w), k))


def _writer(o):
    """``(instruction, tuple index or None)`` writing output ``o``: layout-only views stripped off, and
    a ``get_tuple_elem`` of an instruction of several results taken to that instruction's element."""
    w = o
    while w.op.name in _LAYOUT_VIEWS:
        w = w.inputs[0]
    if w.op.name == "get_tuple_elem" and w.inputs and isinstance(w.inputs[0].shape, tuple) \
            and not w.inputs[0].op.builtin:
        return w.inputs[0], w.op.index
    return w, None


_LAYOUT_VIEWS = ("transpose", "reshape", "squeeze", "unsqueeze")


def _layout_chain_to(x, p) -> bool:
    while x is not p:
        if x.op.name not in _LAYOUT_VIEWS:
            return False
        x = x.inputs[0]
    return True


def _same_layout(a, b) -> bool:
    return all(d == 1 or sa == sb for d, sa, sb in zip(a.lens, a.strides, b.strides))


def _relayout(m, w, layout, k=None):
    """Give ``w`` (its result ``k`` of a tuple) the strided ``layout`` and recompute the shapes
    downstream; returns the old shapes."""
    old = {w: w.shape}
    if k is not None:
        layout = tuple(layout if n == k else s for n, s in enumerate(w.shape))
    w.meta["bind_layout"] = layout
    w.shape = layout
    affected, stack = set(), [w]
    while stack:
        v = stack.pop()
        for c in v.outputs:
            if id(c) not in affected and c.op.name != "@return":
                affected.add(id(c))
                stack.append(c)
    for ins in m.instructions:
        if id(ins) in affected:
            old[ins] = ins.shape
            ins.shape = ins.op.compute_shape([i.shape for i in ins.inputs], ins.module_inputs)
    return old


def program_bound(m):
    """Names of the parameters the instructions of ``m`` write into."""
    return [n for i in m.instructions for _, n in bound_params(i)]


def copy_outputs(m, skip=()) -> None:
    """Insert a ``contiguous`` copy for each output of module ``m`` (names in ``skip`` left as they are)
    whose memory is not a standard-layout arena buffer of its own: a literal, a parameter or a view of
    one, a value written in place into a parameter (``bind_param``), a non-standard view, or a buffer
    already returned by another output (the outputs in ``skip`` count as returned first).  The copy
    goes right after the value, so it reads the value before anything later overwrites it.

    Raises CompileError when an output views a parameter that an earlier instruction already
    overwrote in place (the value returned would not be the parameter's input value)."""
    ret = m.get_return()
    names = list(m.output_names)
    outs = list(ret.inputs)
    seen = {_root_key(o) for n, o in zip(names, outs) if n in skip and isinstance(o.shape, Shape)}
    for k, (name, o) in enumerate(zip(names, outs)):
        if name in skip or not isinstance(o.shape, Shape):
            continue
        root, key = value_root(o), _root_key(o)
        borrowed = root[0].op.name in ("@param", "@literal") or root[1] in dict(bound_params(root[0]))
        if not (borrowed or key in seen or not o.shape.standard()):
            seen.add(key)
            continue
        pos = m.instructions.index(o) + 1
        while m.instructions[pos].op.name == "@param":
            pos += 1
        if root[0].op.name == "@param":
            _check_not_overwritten(m, name, root[0], pos)
        c = m.insert_instruction(m.instructions[pos], make_op("contiguous"), [o])
        ret.inputs[k] = c
        c.outputs.append(ret)
        drop = next(j for j, x in enumerate(o.outputs) if x is ret)
        del o.outputs[drop]
        seen.add(_root_key(c))


def _root_key(o):
    root, idx = value_root(o)
    return id(root), idx


def _check_not_overwritten(m, out_name, p, pos) -> None:
    for w in m.instructions[:pos]:
        if any(n == p.op.parameter for _, n in bound_params(w)):
            raise CompileError(f"output '{out_name}' is a view of parameter '{p.op.parameter}', which {w.op.name} "
                               f"overwrites in place before the view is read; return it before the in-place "
                               f"write or drop the alias")
