"""fuse_pointwise: maximal groups of elementwise instructions become one ``pointwise`` instruction
over a submodule, as MIGraphX's ``fuse_pointwise`` (``src/fuse_pointwise.cpp``).

Walking a module from its end, each elementwise instruction (or ``concat``) not yet grouped is the
root of a group that grows over its producers: elementwise ops (unary / binary ops, ``convert``,
``where``, masks, SiLU, residual adds, ...), ``concat`` (the concat-of-halves of rotate_half becomes
a gather of its inputs) and views (transpose, reshape, squeeze, unsqueeze, multibroadcast, slice)
of values computed inside the group.  A producer joins only when all its consumers are in the group,
so each group has **one output**, its root (a value also read outside the group starts a group of
its own); views of outside values stay outside and are read through their strides.  A group of
one kernel instruction is left as it is.  The instructions move into ``<module>:pointwise<n>``; the
``pointwise`` instruction takes the root's place (see :mod:`mgx_graph.passes.fusion`).

``exclude``: op names never fused (the target's host ops).  Modules run by fused instructions are
not visited.  Results are those of the unfused instructions on ``ref`` (the submodule runs their
kernels); on ``gpu`` the generated kernel computes in float32 for float16 data.
"""
from __future__ import annotations

from ..operators.fused import FusedPointwise
from . import fusion


class FusePointwise(fusion.FusionPass):
    """The pass (see the module docstring); ``exclude``: op names never fused.  Visits every module
    but those run by fused instructions; rewrites in place, raises nothing of its own."""

    name = "fuse_pointwise"

    def apply_module(self, m, ctx=None) -> None:
        if m.program is None:
            return
        groups: list = []
        grouped: set[int] = set()
        for ins in reversed(list(m.instructions)):  # roots last to first: each group is maximal
            if id(ins) in grouped or not self._root_ok(ins):
                continue
            members = self.group(m, ins, grouped)
            if sum(1 for i in members if not i.op.is_view) >= 2:
                groups.append(members)
                grouped.update(id(i) for i in members)
        for members in reversed(groups):  # outlined first to last (modules numbered in program order)
            fusion.outline(m, members, lambda sub: FusedPointwise(module=sub), "pointwise")

    def _root_ok(self, ins) -> bool:
        return fusion.elementwise(ins, self.exclude) or fusion.concat(ins, self.exclude)

    def _member_ok(self, ins) -> bool:
        return self._root_ok(ins) or fusion.view(ins, self.exclude)

    def group(self, m, root, grouped=frozenset()) -> list:
        """The members of the group rooted at ``root`` (root included): producers (not in
        ``grouped``) joined while all their consumers are members, then views of outside values
        taken out again."""
        members = [root]
        fusion.grow_producers(m, members, lambda i: id(i) not in grouped and self._member_ok(i))
        changed = True
        while changed:
            ids = {id(i) for i in members}
            out = [i for i in members if i.op.is_view and id(i.inputs[0]) not in ids]
            members = [i for i in members if i not in out]
            changed = bool(out)
        return members
