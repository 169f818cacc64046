"""fuse_reduce: a reduction over the innermost axis together with its elementwise producers and
consumers becomes one ``fused_reduce`` instruction over a submodule, as MIGraphX's ``fuse_reduce``
(``src/fuse_reduce.cpp``); on the gpu target it is one kernel with one block per row.

Reductions taken: ``reduce_sum`` / ``reduce_mean`` / ``reduce_max`` / ``reduce_min`` (keepdims, the
last axis only), ``softmax`` / ``logsoftmax`` over the last axis, ``rms_norm`` and ``layernorm``
normalizing the last axis only; float16 / float32 / float64 data (accumulated in float32 for float16).

From the reduction the group's root moves forward while every consumer of the root lies on a path
to the last of them (in program order) made of elementwise instructions, and that last one still has
one row per row of the reduction (its lens but the last equal the reduction input's): e.g. softmax
-> isnan -> where -> convert.  Then elementwise producers join while all their consumers are members
(a scale or mask ``add`` before softmax, ``convert`` of a weight).  The root is the group's output;
a producer with the root's lens that is also read outside, but only after the root, is a further
output (the residual sum that feeds an RMSNorm and the next residual add: the sum is written by the
norm's kernel), read through ``get_tuple_elem``.  A group that is a lone ``reduce_*`` is left as it
is (already one kernel); a lone softmax, norm or layernorm is fused (one kernel instead of two to nine).

``exclude``: op names never fused (host ops).  Runs before ``fuse_pointwise``, which then groups what
is left.  Results on ``ref`` are those of the unfused instructions (the submodule runs their kernels).
"""
from __future__ import annotations

from ..ir.shape import Shape
from ..operators.fused import FusedReduce
from ..operators.fused_exprs import FLOATS
from . import fusion

REDUCE_OPS = ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min")
NORM_OPS = ("softmax", "logsoftmax", "rms_norm", "layernorm")


def innermost_reduction(ins) -> bool:
    """A reduction this pass can fuse: over the last axis only, float data, non-empty."""
    op, x = ins.op, ins.inputs[0].shape if ins.inputs else None
    if op.name not in REDUCE_OPS + NORM_OPS or not isinstance(x, Shape) or x.ndim < 1 or x.elements() == 0:
        return False
    if x.dtype not in FLOATS or any(not isinstance(i.shape, Shape) or i.shape.dtype not in FLOATS for i in ins.inputs):
        return False
    last = x.ndim - 1
    if op.name in REDUCE_OPS:
        return bool(op.keepdims) and op._axes(x.ndim) == (last,)
    return op.axis % x.ndim == last


class FuseReduce(fusion.FusionPass):
    """The pass (see the module docstring); ``exclude``: op names never fused.  Visits every module
    but those run by fused instructions; rewrites in place, raises nothing of its own."""

    name = "fuse_reduce"

    def apply_module(self, m, ctx=None) -> None:
        if m.program is None:
            return
        for ins in list(m.instructions):
            if ins.module is m and fusion.plain(ins, self.exclude) and innermost_reduction(ins):
                self._fuse(m, ins)

    def _ok(self, ins) -> bool:
        return fusion.elementwise(ins, self.exclude)

    def _fuse(self, m, red) -> None:
        rows = tuple(red.inputs[0].shape.lens[:-1])
        members = [red]
        root = red
        while True:
            step = self._extend(m, root, members, rows)
            if step is None:
                break
            members.extend(step)
            root = step[-1]
        fusion.grow_producers(m, members, self._ok)
        extra = self._extra_outputs(m, members, root)
        if len(members) == 1 and red.op.name in REDUCE_OPS:
            return
        axes = [len(rows)]
        fusion.outline(m, members, lambda sub: FusedReduce(module=sub, axes=axes), "fused_reduce", extra)

    def _extra_outputs(self, m, members, root) -> list:
        """Producers of the group with the root's lens that are also read outside, but only after the
        root (a residual sum feeding a norm and the next residual add): they join as further outputs
        (``members`` grows in place, their own producers too); returns them."""
        order = {id(i): k for k, i in enumerate(m.instructions)}
        here, lens, extra = order[id(root)], tuple(root.shape.lens), []
        changed = True
        while changed:
            changed = False
            ids = {id(i) for i in members}
            for ins in list(members):
                for v in ins.inputs:
                    if id(v) in ids or v.module is not m or tuple(getattr(v.shape, "lens", ())) != lens \
                            or not self._ok(v):
                        continue
                    readers = [c for c in v.outputs if id(c) not in ids]
                    if readers and all(c.module is m and order[id(c)] > here for c in readers):
                        members.append(v)
                        extra.append(v)
                        ids.add(id(v))
                        changed = True
            if changed:
                fusion.grow_producers(m, members, self._ok)
        return extra

    def _extend(self, m, root, members, rows):
        """The instructions between ``root`` and the last of its consumers when the root may move
        there (see the module docstring), ending with the new root; None otherwise."""
        cons = list({id(c): c for c in root.outputs}.values())
        if not cons or any(c.module is not m or not self._ok(c) for c in cons):
            return None
        order = {id(i): k for k, i in enumerate(m.instructions)}
        last = max(cons, key=lambda c: order[id(c)])
        if tuple(last.shape.lens[:-1]) != rows or last.shape.ndim != len(rows) + 1:
            return None
        limit = order[id(last)]
        ahead, stack = {}, [root]
        while stack:  # everything reachable from root up to the last consumer
            for c in stack.pop().outputs:
                if c.module is m and id(c) not in ahead and order.get(id(c), limit + 1) <= limit:
                    ahead[id(c)] = c
                    stack.append(c)
        path, stack = {id(last): last}, [last]
        while stack:  # ... that leads to it
            for i in stack.pop().inputs:
                if id(i) in ahead and id(i) not in path:
                    path[id(i)] = i
                    stack.append(i)
        inside = {id(i) for i in members} | set(path)
        if any(id(c) not in path for c in cons) or not all(self._ok(p) for p in path.values()):
            return None
        if any(id(c) not in inside for p in path.values() if p is not last for c in p.outputs):
            return None
        return sorted(path.values(), key=lambda i: order[id(i)])
