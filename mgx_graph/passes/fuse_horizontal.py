"""fuse_horizontal: the KV-cache writes of one decoder layer and the rotation of its query become one
``fused_horizontal`` instruction (:mod:`mgx_graph.operators.fused_horizontal`): one generated kernel
over the sum of their element counts instead of one launch each (a horizontal fusion; in a decode
step each of those kernels is a few hundred threads, and its launch costs more than its work).

Candidates, in each module but those run by fused instructions:

* *scatters*: ``scatternd`` with reduction ``none`` (updates read from memory) and ``fused_scatternd``
  (updates computed in the kernel, made by ``fuse_scatternd``); a group is the scatters that read the
  same indices instruction (the position of the new token) and write different data (through views,
  different roots: the K cache and the V cache);
* *partners*: ``pointwise`` instructions of one result that read a value one of the group's scatters
  reads too (the cos / sin of the position, the query's slice of the same projection): the query's
  rotation.

A group of at least two members is fused when no member reads another (directly or through other
instructions), every instruction between the first member and the last that reads a member is a
view (those views move after the fused instruction, which stands where the last member stood),
nothing between them is a control-flow instruction, no member reads memory (through views) that a
scatter of the group writes, and nothing between them may write in place (an ``inplace_ok``
instruction) into a parameter a member reads.  The scatters of one indices value are cut into runs,
in program order, each as long as that holds (one layer's writes: a later layer's attention reads
them); each partner joins a run when the run with it still holds.  The members' submodules are put
back and outlined together, into ``<module>:fused_horizontal<N>``; its parts are returned last member
first, then the others in program order, and each reader reads its ``get_tuple_elem``.  Each scatter part stays bindable in place (``bind_outputs`` binds a present
cache onto the past one through the tuple element).

Results on ``ref`` are those of the unfused instructions (the submodule runs their kernels); on
``gpu`` float16 values are computed in float32 as in a ``pointwise`` kernel.  ``exclude``: op names
never fused (host ops).  Runs after ``fuse_scatternd``; ``MIGRAPHX_DISABLE_PASSES=fuse_horizontal``
leaves the instructions as they are.
"""
from __future__ import annotations

from ..ir.shape import Shape
from ..operators.fused_horizontal import FusedHorizontal
from ..operators.fused_module import module_params, scatter_of
from . import fusion
from .fuse_scatternd import _root
from .fusion import inline_fused

CONTROL = ("if", "loop", "graph_launch")
WRITERS = ("scatternd", "fused_scatternd", "kv_cache_update")  # input 0: the data they write (a cache)


class FuseHorizontal(fusion.FusionPass):
    """The pass (see the module docstring); ``exclude``: op names never fused.  Rewrites in place,
    raises nothing of its own."""

    name = "fuse_horizontal"

    def apply_module(self, m, ctx=None) -> None:
        if m.program is None:
            return
        groups: dict = {}
        for ins in m.instructions:
            idx = self._indices(ins)
            if idx is not None:
                groups.setdefault(id(idx), []).append(ins)
        for scatters in groups.values():
            for cluster in self._clusters(m, scatters):
                members = list(cluster)
                for p in self._partners(m, cluster):
                    if self._legal(m, members + [p]) is not None:
                        members.append(p)
                members = self._legal(m, members)
                if members is not None:
                    self._fuse(m, members)

    def _clusters(self, m, scatters) -> list:
        """The scatters of one indices value cut into runs, in program order, each as long as it may be
        fused (one decoder layer's K and V writes; a later layer's attention reads the first run)."""
        out: list = []
        cur: list = []
        for s in scatters:
            roots = {id(_root(c.inputs[0])) for c in cur}
            if cur and id(_root(s.inputs[0])) not in roots and self._legal(m, cur + [s]) is not None:
                cur.append(s)
                continue
            if cur:
                out.append(cur)
            cur = [s]
        return out + ([cur] if cur else [])

    def _indices(self, ins):
        """The indices value a fusable scatter reads (None for anything else)."""
        op = ins.op
        if op.name in self.exclude or "bind_param" in ins.meta or ins.meta.get("on_host"):
            return None
        if op.name == "scatternd":
            return ins.inputs[1] if op.reduction == "none" and fusion.plain(ins, self.exclude) else None
        if op.name == "fused_scatternd" and ins.module_inputs and isinstance(ins.shape, Shape):
            sub = ins.module_inputs[0]
            idx = scatter_of(sub).inputs[1]
            params = module_params(sub)
            return ins.inputs[params.index(idx)] if idx in params else None
        return None

    def _partners(self, m, scatters) -> list:
        read = {id(v) for s in scatters for v in s.inputs if v.op.name != "@literal"}
        out = []
        for p in m.instructions:
            if p.op.name != "pointwise" or "pointwise" in self.exclude or not p.module_inputs:
                continue
            if not isinstance(p.shape, Shape) or "bind_param" in p.meta or p.meta.get("on_host"):
                continue
            if any(id(v) in read for v in p.inputs):
                out.append(p)
        return out

    def _legal(self, m, members):
        """``members`` (in program order) when they may be fused (see the module docstring), else None."""
        if len(members) < 2:
            return None
        order = {id(i): k for k, i in enumerate(m.instructions)}
        members = sorted(members, key=lambda i: order[id(i)])
        ids = {id(i) for i in members}
        lo, hi = order[id(members[0])], order[id(members[-1])]
        dependent = set(ids)
        for ins in m.instructions[lo + 1:hi + 1]:
            reads = any(id(v) in dependent for v in ins.inputs)
            if id(ins) in ids:
                if reads:
                    return None  # a member reads another
                continue
            if ins.op.name in CONTROL:
                return None
            if reads:
                if not ins.op.is_view:
                    return None
                dependent.add(id(ins))
        return members if self._memory_ok(m, members, lo, hi) else None

    @staticmethod
    def _memory_ok(m, members, lo, hi) -> bool:
        written = {id(_root(s.inputs[0])) for s in members if s.op.name in WRITERS}
        params = set()
        for s in members:
            scatter = s.op.name in WRITERS
            for k, v in enumerate(s.inputs):
                r = _root(v)
                if (k > 0 or not scatter) and id(r) in written:
                    return False  # a member would read what a scatter of the group writes
                if r.op.name == "@param":
                    params.add(id(r))
        ids = {id(i) for i in members}
        between = [w for w in m.instructions[lo + 1:hi] if id(w) not in ids]
        return not any(w.op.inplace_ok and w.inputs and id(_root(w.inputs[0])) in params for w in between)

    def _fuse(self, m, members) -> None:
        body, outs, lits = [], [], []
        for f in members:
            if f.op.name == "scatternd":
                body.append(f)
                outs.append(f)
                continue
            sub = f.module_inputs[0]
            inner = [i for i in sub.instructions if i.op.name not in ("@param", "@return")]
            k = inner.index(sub.get_return().inputs[0])
            placed = inline_fused(m, f)[0]
            outs.append(placed[k])
            body += [i for i in placed if i.op.name != "@literal"]
            lits += [i for i in placed if i.op.name == "@literal"]
        _move_readers_after(m, body, outs[-1])
        fusion.outline(m, body, lambda sub: FusedHorizontal(module=sub), "fused_horizontal", extra=outs[:-1])
        for lit in lits:
            if not lit.outputs:  # copied into the submodule by outline
                m.remove_instruction(lit)


def _move_readers_after(m, body, last) -> None:
    """Move the views between the first instruction of ``body`` and ``last`` that read a member (the
    legality check saw they are views) to just after ``last``, keeping their order."""
    order = {id(i): k for k, i in enumerate(m.instructions)}
    ids = {id(i) for i in body}
    lo, hi = min(order[id(i)] for i in body), order[id(last)]
    dependent, moved = set(ids), []
    for ins in m.instructions[lo + 1:hi]:
        if id(ins) not in ids and any(id(v) in dependent for v in ins.inputs):
            dependent.add(id(ins))
            moved.append(ins)
    if not moved:
        return
    keep = [i for i in m.instructions if id(i) not in {id(x) for x in moved}]
    at = keep.index(last) + 1
    m.instructions = keep[:at] + moved + keep[at:]
