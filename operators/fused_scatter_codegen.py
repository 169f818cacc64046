"""CUDA / HIP C source for ``fused_scatternd`` submodules: the generated pointwise kernel of
:mod:`.fused_codegen` with a scattered store (ONNX ScatterND, reduction ``none``).

The submodule returns ``scatternd(x0, indices, updates)`` (:func:`.fused_scatter.scatter_of`):
indices of lens ``I + [q]``, updates of lens ``I + data.lens[q:]`` computed by the instructions
before it.  One thread per element ``(i, t)`` of the updates (``i`` indexing ``I``, ``t`` the trailing
dims) evaluates the updates there (:class:`.fused_codegen.KernelEmitter`, float32 compute for float16
data), reads the ``q`` indices of row ``i`` (a negative one counts from the end of its axis) and
stores the value at ``y[indices[i], t]``, addressed through the output's strides (a layout bound in
place into a parameter).  The output already holds ``data`` (the launch copies it first unless it is
the same buffer); the kernel does not read ``x0``.  An index outside its axis drops that element's
write (nothing is checked on the device; the ``ref`` target raises).  With duplicate indices the
write that lands is unspecified, as ONNX leaves it for reduction ``none``.
"""
from __future__ import annotations

from .fused_codegen import KernelEmitter, KernelSource, element_index, per_element_source, store_expr
from .fused_module import scatter_of


def _scatter_offset(em: KernelEmitter, scat, uidx, out_shape) -> tuple[str, str]:
    """(C offset expression into ``y``, C condition that every index is inside its axis) of the
    update element at ``uidx``."""
    data, indices = scat.inputs[0].shape, scat.inputs[1]
    q = indices.shape.lens[-1]
    lead = len(indices.shape.lens) - 1
    row = tuple(uidx[:lead])
    terms, inside = [], []
    for j in range(q):
        raw = em.value(indices, row + (str(j),))
        d, s = data.lens[j], out_shape.strides[j]
        p = em.fresh("p")
        em.emit(f"long long {p} = (long long)({raw});")
        em.emit(f"if ({p} < 0) {p} += {d}LL;")
        inside.append(f"{p} >= 0 && {p} < {d}LL")
        terms.append(p if s == 1 else f"{p} * {s}LL")
    for t, d, s in zip(uidx[lead:], data.lens[q:], out_shape.strides[q:]):
        if d != 1 and s != 0 and t != "0":
            terms.append(t if s == 1 else f"{t} * {s}LL")
    return " + ".join(terms) or "0", " && ".join(inside) or "true"


def scatternd_source(sub, in_shapes, out_shape) -> KernelSource:
    """The kernel of a ``fused_scatternd`` instruction over submodule ``sub`` with inputs
    ``in_shapes`` writing ``out_shape`` (data's lens: standard, or the strided layout of an in-place
    binding).  ``extent`` is the number of update elements.  Raises ValueError when an instruction
    of ``sub`` has no fused C form, ShapeError when ``sub`` is not a fused_scatternd module."""
    scat = scatter_of(sub)
    upd = scat.inputs[2]
    if tuple(scat.shape.lens) != tuple(out_shape.lens) or out_shape.dtype != scat.shape.dtype:
        raise ValueError(f"fused_scatternd: module returns {scat.shape.brief()}, instruction has "
                         f"{out_shape.brief()}")
    em = KernelEmitter(sub, in_shapes)
    uidx = element_index(em, upd.shape.lens)
    off, inside = _scatter_offset(em, scat, uidx, out_shape)
    v = em.value(upd, uidx)
    em.emit(f"if ({inside}) y[{off}] = {store_expr(v, out_shape.dtype)};")
    return per_element_source("scatternd", em, in_shapes, out_shape, upd.shape.elements())
