"""fuse_scatternd: a ScatterND whose updates are computed by a fused ``pointwise`` (directly or through
views of it) becomes one ``fused_scatternd`` instruction, whose kernel computes the pointwise
expression per element and stores it at the scattered position (the KV-cache write of a decode step:
RoPE of the new keys, then the scatter into the cache, in one kernel instead of two).  In the manner
of MIGraphX's fusions over ``pointwise`` modules (``fuse_reduce`` inlining a pointwise module into a
``fused_reduce``): the ``pointwise`` instruction's submodule is put back and outlined again together
with the views and the scatter, into ``<module>:fused_scatternd<N>``.

A ``scatternd`` ``s`` is fused when

* its reduction is ``none`` (``add`` / ``mul`` / ``max`` / ``min`` keep their own kernel, which
  combines duplicate indices in order as ONNX requires), it is not excluded and its types are ones the
  generated kernels support;
* its updates are ``p`` or views of ``p`` (transpose, reshape, squeeze, unsqueeze, multibroadcast,
  slice), each view read by the next alone and ``p`` by the first view (or ``s``) alone, where ``p``
  is a ``pointwise`` instruction, or a lone elementwise instruction or ``concat`` that fuse_pointwise
  left as it was (a ``convert`` of the new values): the updates are never written to memory;
* ``s``'s data is not a scalar literal and does not share memory (through views) with anything ``p``
  reads, and nothing between ``p`` and ``s`` may write in place (an ``inplace_ok`` instruction) into a
  parameter ``p`` reads: the fused kernel reads ``p``'s inputs where ``s`` stood, and may write its
  output into its data's buffer (``bind_outputs`` binds a present cache onto the past one as before).

The indices stay an input computed as before (the kernel reads them).  Results on ``ref`` are those
of the unfused instructions (the submodule runs their kernels); on ``gpu`` float16 updates are
computed in float32 as in a ``pointwise`` kernel.  ``exclude``: op names never fused (host ops).
Runs after ``fuse_pointwise``; ``MIGRAPHX_DISABLE_PASSES=fuse_scatternd`` leaves the scatters as
they are.
"""
from __future__ import annotations

from ..ir.shape import Shape
from ..operators.fused_scatter import FusedScatterND
from . import fusion


def _root(v):
    """The instruction owning ``v``'s memory through views."""
    while v.op.is_view and v.inputs:
        v = v.inputs[0]
    return v


def _only_reader(v, reader) -> bool:
    """``reader`` is the one consumer of ``v`` and reads it once."""
    return bool(v.outputs) and all(c is reader for c in v.outputs) and reader.inputs.count(v) == 1


class FuseScatterND(fusion.FusionPass):
    """The pass (see the module docstring); ``exclude``: op names never fused.  Visits every module
    but those run by fused instructions; rewrites in place, raises nothing of its own."""

    name = "fuse_scatternd"

    def apply_module(self, m, ctx=None) -> None:
        if m.program is None:
            return
        for s in [i for i in m.instructions if i.op.name == "scatternd"]:
            found = self.match(m, s)
            if found is not None:
                self._fuse(m, s, *found)

    def match(self, m, s):
        """``(p, views)`` when scatter ``s`` of module ``m`` may be fused (see the module docstring):
        ``p`` the producer of its updates, ``views`` the views from ``p`` to the updates, in order;
        None otherwise."""
        if s.op.reduction != "none" or not fusion.plain(s, self.exclude):
            return None
        data, _, upd = s.inputs
        if data.op.name == "@literal" and data.shape.elements() == 1:
            return None
        views, v, reader = [], upd, s
        while fusion.view(v, self.exclude) and _only_reader(v, reader):
            views.insert(0, v)
            v, reader = v.inputs[0], v
        if v.module is not m or not _only_reader(v, reader) or not self._producer_ok(v):
            return None
        if not self._reads_ok(m, v, s):
            return None
        return v, views

    def _producer_ok(self, p) -> bool:
        if p.op.name == "pointwise":
            sub = p.module_inputs[0] if p.module_inputs else None
            return (sub is not None and len(sub.get_return().inputs) == 1 and isinstance(p.shape, Shape)
                    and "bind_param" not in p.meta and not p.meta.get("on_host") and "pointwise" not in self.exclude)
        return fusion.elementwise(p, self.exclude) or fusion.concat(p, self.exclude)

    @staticmethod
    def _reads_ok(m, p, s) -> bool:
        """Nothing ``p`` reads shares memory with ``s``'s data, and no instruction between ``p`` and
        ``s`` may write in place into a parameter ``p`` reads."""
        roots = {id(_root(v)): _root(v) for v in p.inputs}
        if id(_root(s.inputs[0])) in roots:
            return False
        params = {k for k, r in roots.items() if r.op.name == "@param"}
        if not params:
            return True
        order = {id(i): k for k, i in enumerate(m.instructions)}
        between = m.instructions[order[id(p)] + 1:order[id(s)]]
        return not any(w.op.inplace_ok and w.inputs and id(_root(w.inputs[0])) in params for w in between)

    def _fuse(self, m, s, p, views) -> None:
        body = fusion.inline_fused(m, p)[0] if p.op.name == "pointwise" else [p]
        members = [i for i in body if i.op.name != "@literal"] + views + [s]
        fusion.outline(m, members, lambda sub: FusedScatterND(module=sub), "fused_scatternd")
        for lit in body:
            if lit.op.name == "@literal" and not lit.outputs:  # copied into the submodule by outline
                m.remove_instruction(lit)
