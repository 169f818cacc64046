"""fuse_gemv: a one-row ``dot`` against a constant weight, the RMSNorm that computes its input and the
elementwise epilogue that reads its result become one ``fused_gemv`` instruction over a submodule, in
the manner of MIGraphX's fusions over ``fused_reduce`` / ``pointwise`` modules: the fused
instructions' submodules are put back into the module and outlined again together with the ``dot``.

A ``dot`` ``d`` is taken when the gemv kernel would run it (:func:`gemv_dot`: one row, batch dims of 1,
float16 / float32, a weight that is a literal or views over one, K-contiguous on ``gpu`` where
``gemv_layout`` ran before, or one ``gemv_layout`` would store so elsewhere; x at most the kernel's
shared-memory row, ``MIGRAPHX_GEMV`` not 0), and with it

* the prologue: ``d``'s input is the normalized row of a ``fused_reduce`` whose reduction is
  ``rms_norm`` of float16 / float32 data over one row (its lens but the last are 1), read by ``d`` alone (directly, or through a
  ``get_tuple_elem`` of index 0 when the ``fused_reduce`` has further outputs: the residual sum, whose
  readers must all come after the fused group's last instruction);
* the epilogue: every reader of ``d`` is a ``slice`` of its last axis only (step 1, all of one length
  L), each read by one ``pointwise`` ``e`` alone, whose submodule holds elementwise instructions only,
  whose result is one row of L columns and whose other inputs are defined before the group starts
  (SiLU(gate) * up over the merged gate / up projection).

At least one of the two must be present.  The ``fused_gemv`` instruction stands where the group's last
instruction stood; its submodule returns the epilogue's (or the dot's) result, then the prologue's
further outputs, read through ``get_tuple_elem`` as ``fused_reduce`` does.  On ``ref`` the values are
those of the unfused instructions (the submodule runs their kernels); on ``gpu`` one kernel
(:mod:`mgx_graph.operators.fused_gemv_codegen`).  ``exclude``: op names never fused (host ops).  Runs
after ``gemv_layout`` on gpu, after the kernel fusions on ref; ``MIGRAPHX_DISABLE_PASSES=fuse_gemv``
leaves the program as it was.
"""
from __future__ import annotations

from ..ir.shape import Shape
from ..operators.fused import FusedGemv
from . import fusion

NORMS = ("rms_norm",)


def gemv_dot(d, target: str, exclude=()):
    """``(plan, sx, sw)`` of the gemv kernel for ``dot`` instruction ``d`` (see the module docstring),
    None when it would not run it; on a target other than ``gpu`` a weight stored with N contiguous is
    judged as ``gemv_layout`` would store it (transposed)."""
    from ..operators.gemv_gpu import _constant, gemv_enabled, gemv_plan_for, weight_layout
    from .gemv_layout import transposed_shape

    if d.op.name != "dot" or len(d.inputs) != 2 or not fusion.plain(d, exclude) or not gemv_enabled():
        return None
    a, b = d.inputs
    if not _constant(b) or b.shape.ndim < 2:
        return None
    wshape = b.shape
    if target != "gpu" and weight_layout(wshape.lens, wshape.strides) is None:
        wshape = transposed_shape(wshape)
    got = gemv_plan_for([a.shape, wshape], d.shape)
    if got is None or not got[0].defines()["XS"]:  # the row must fit the kernel's shared memory
        return None
    return got


def _fused(ins, name: str, exclude) -> bool:
    return (ins.op.name == name and bool(ins.module_inputs) and name not in exclude
            and "bind_param" not in ins.meta and not ins.meta.get("on_host"))


def _prologue(d, exclude):
    """``(p, reader)``: the ``fused_reduce`` ``p`` whose normalized row ``d`` reads (``reader``: the
    ``get_tuple_elem`` in between, or None), or None."""
    from ..operators.fused_reduce_codegen import reduction_of

    a = d.inputs[0]
    reader = None
    if a.op.name == "get_tuple_elem":
        if a.op.index != 0 or not a.inputs:
            return None
        reader, a = a, a.inputs[0]
    if not _fused(a, "fused_reduce", exclude) or d.inputs.count(d.inputs[0]) != 1:
        return None
    if [c for c in d.inputs[0].outputs] != [d]:
        return None
    sub = a.module_inputs[0]
    try:
        red = reduction_of(sub)
    except ValueError:
        return None
    if red.op.name not in NORMS or red.inputs[0].shape.dtype == "float64" or \
            any(n != 1 for n in red.inputs[0].shape.lens[:-1]):  # float statistics, one row
        return None
    tupled = isinstance(a.shape, tuple)
    if tupled != (reader is not None):
        return None
    if tupled and any(c.op.name != "get_tuple_elem" for c in a.outputs):
        return None
    return a, reader


def _epilogue(m, d, start, exclude):
    """``(e, slices)``: the ``pointwise`` ``e`` reading ``d`` through ``slices`` alone, or None.
    ``start``: the first instruction of the group (``e``'s other inputs are defined before it)."""
    slices = list({id(c): c for c in d.outputs}.values())
    if not slices or any(s.op.name != "slice" or not s.op.is_view or len(s.inputs) != 1 for s in slices):
        return None
    last, lens = d.shape.ndim - 1, None
    for s in slices:
        bounds = s.op._bounds(d.shape)
        if len(bounds) != 1 or bounds[0][0] != last or bounds[0][1].step != 1:
            return None
        if lens is not None and tuple(s.shape.lens) != lens:
            return None
        lens = tuple(s.shape.lens)
    readers = {id(c): c for s in slices for c in s.outputs}
    if len(readers) != 1:
        return None
    e = next(iter(readers.values()))
    if not _fused(e, "pointwise", exclude) or not isinstance(e.shape, Shape) or tuple(e.shape.lens) != lens:
        return None
    sub = e.module_inputs[0]
    if len(sub.get_return().inputs) != 1 or not all(
            i.op.builtin or fusion.elementwise(i, exclude) for i in sub.instructions):
        return None
    order = {id(i): k for k, i in enumerate(m.instructions)}
    ids = {id(s) for s in slices}
    if any(id(v) not in ids and (v.module is not m or order[id(v)] >= order[id(start)]) for v in e.inputs):
        return None
    return e, slices


class FuseGemv(fusion.FusionPass):
    """The pass (see the module docstring); ``exclude``: op names never fused.  Visits every module
    but those run by fused instructions; rewrites in place, raises nothing of its own."""

    name = "fuse_gemv"

    def apply_module(self, m, ctx=None) -> None:
        if m.program is None:
            return
        target = ctx.target if ctx is not None else "ref"
        for d in [i for i in m.instructions if i.op.name == "dot"]:
            found = self.match(m, d, target)
            if found is not None:
                self._fuse(m, d, *found)

    def match(self, m, d, target: str = "gpu"):
        """``(prologue, epilogue)`` for dot ``d`` of ``m`` (each None when absent: see the module
        docstring; ``prologue`` is ``(fused_reduce, get_tuple_elem or None)``, ``epilogue`` is
        ``(pointwise, slices)``), or None when ``d`` is not fused."""
        if d.module is not m or gemv_dot(d, target, self.exclude) is None:
            return None
        pro = _prologue(d, self.exclude)
        if pro is not None and pro[0].module is not m:
            pro = None
        epi = _epilogue(m, d, pro[0] if pro else d, self.exclude)
        if pro is None and epi is None:
            return None
        if pro is not None and isinstance(pro[0].shape, tuple):
            order = {id(i): k for k, i in enumerate(m.instructions)}
            end = order[id(epi[0] if epi else d)]
            later = [c for g in pro[0].outputs if g is not pro[1] for c in g.outputs]
            if any(c.module is not m or order[id(c)] <= end for c in later):  # a reader of the residual sum
                if epi is None:                                                # before the group's end
                    return None
                epi = None
                end = order[id(d)]
                if any(order[id(c)] <= end for c in later):
                    return None
        return pro, epi

    def _fuse(self, m, d, pro, epi) -> None:
        members, extra = [], []
        if pro is not None:
            placed, returned = fusion.inline_fused(m, pro[0])
            members += [i for i in placed if i.op.name != "@literal"]
            extra = [r for r in returned[1:] if any(c.module is m for c in r.outputs)]
        members.append(d)
        body: list = []
        if epi is not None:
            e, slices = epi
            members += slices
            body, _ = fusion.inline_fused(m, e)
            members += [i for i in body if i.op.name != "@literal"]
        fusion.outline(m, members, lambda sub: FusedGemv(module=sub), "fused_gemv", extra)
        for lit in (placed if pro is not None else []) + body:
            if lit.op.name == "@literal" and not lit.outputs:  # copied into the submodule by outline
                m.remove_instruction(lit)
