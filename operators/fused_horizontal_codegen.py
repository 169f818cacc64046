"""CUDA / HIP C source for ``fused_horizontal`` submodules: one per-element kernel over the sum of the
parts' element counts, each thread dispatching by range to the part its index falls in (a horizontal
fusion; :mod:`.fused_horizontal` describes the parts).

Part ``k`` covers ``[lo_k, lo_k + n_k)`` of the grid: a scatter part's ``n_k`` is the element count
of its updates, and its thread ``j = i - lo_k`` computes update element ``j`` and stores it at its
scattered position in ``y<k>`` (ONNX ScatterND, reduction ``none``; a negative index counts from the
end of its axis, an index outside its axis drops that element's write, as in
:mod:`.fused_scatter_codegen`); an elementwise part's ``n_k`` is its element count, and thread ``j``
stores element ``j`` of it in ``y<k>``.  Outputs are addressed through their strides (a layout bound
in place into a parameter).  Values are computed by :class:`.fused_codegen.KernelEmitter` (float32
compute for float16 data), each part in its own branch.  The kernel never reads a scatter part's
data: its output already holds the data (the launch copies it first unless it is that buffer).
"""
from __future__ import annotations

from .fused_codegen import (KernelEmitter, KernelSource, element_index, linear_offset, param_list,
                            per_element_source, store_expr)
from .fused_module import parts_of
from .fused_scatter_codegen import _scatter_offset


def part_extents(sub) -> list:
    """Element count of each part's range of the grid (updates of a scatter, the value otherwise)."""
    return [(v.inputs[2] if d is not None else v).shape.elements() for v, d in parts_of(sub)]


def _emit_part(em: KernelEmitter, v, is_scatter: bool, var: str, out_name: str, out_shape) -> None:
    if is_scatter:
        upd = v.inputs[2]
        uidx = element_index(em, upd.shape.lens, var)
        off, inside = _scatter_offset(em, v, uidx, out_shape)
        val = em.value(upd, uidx)
        em.emit(f"if ({inside}) {out_name}[{off}] = {store_expr(val, out_shape.dtype)};")
        return
    idx = element_index(em, out_shape.lens, var)
    val = em.value(v, idx)
    em.emit(f"{out_name}[{linear_offset(idx, out_shape)}] = {store_expr(val, out_shape.dtype)};")


def horizontal_source(sub, in_shapes, out_shapes) -> KernelSource:
    """The kernel of a ``fused_horizontal`` instruction over submodule ``sub`` with inputs
    ``in_shapes`` writing the tuple ``out_shapes`` (each standard, or the strided layout of an
    in-place binding).  ``extent`` is the sum of the parts' element counts.  Raises ValueError when
    an instruction of ``sub`` has no fused C form or the outputs do not match the parts, ShapeError
    when ``sub`` is not a fused_horizontal module."""
    parts = parts_of(sub)
    outs = tuple(out_shapes) if isinstance(out_shapes, tuple) else (out_shapes,)
    if len(outs) != len(parts):
        raise ValueError(f"fused_horizontal: module '{sub.name}' returns {len(parts)} values, instruction has "
                         f"{len(outs)} outputs")
    for (v, _), s in zip(parts, outs):
        if tuple(v.shape.lens) != tuple(s.lens) or v.shape.dtype != s.dtype:
            raise ValueError(f"fused_horizontal: module returns {v.shape.brief()}, instruction has {s.brief()}")
    em = KernelEmitter(sub, in_shapes)
    names = [n for _, n in param_list(in_shapes, outs)[len(in_shapes):]]
    extents = part_extents(sub)
    live = [k for k, n in enumerate(extents) if n]
    lo = 0
    for pos, k in enumerate(live):
        hi = lo + extents[k]
        last = pos == len(live) - 1
        head = "" if pos == 0 else "} else "
        em.emit(head + ("{" if last else f"if (i < {hi}LL) {{"))
        em.push()
        var = "i" if lo == 0 else em.index(f"(i - {lo}LL)")
        _emit_part(em, parts[k][0], parts[k][1] is not None, var, names[k], outs[k])
        em.pop()
        lo = hi
    if live:
        em.emit("}")
    return per_element_source("horizontal", em, in_shapes, tuple(outs), lo)


