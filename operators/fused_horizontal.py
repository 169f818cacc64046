"""``fused_horizontal``: independent results of one submodule computed by one kernel (a horizontal
fusion, made by the ``fuse_horizontal`` pass, :mod:`mgx_graph.passes.fuse_horizontal`): the KV-cache
writes of one decoder layer (the rotated new key into the K cache, the new value into the V cache)
and the rotation of the query, which read the same projection and the same position.

The instruction runs one submodule, as ``fused_scatternd`` does (:mod:`.fused_scatter`): parameters
``x0, x1, ...`` bound to its inputs by position; the submodule returns several values, each a *part*:

* a scatter part: a ``scatternd`` (reduction ``none``) whose data is a parameter read by that scatter
  alone, whose indices and updates are parameters or computed inside (elementwise instructions,
  views and ``concat``, a fused ``pointwise`` body);
* an elementwise part: any other value computed inside (a fused ``pointwise`` body).

Semantics: those of the instructions it holds (ONNX ScatterND, reduction ``none``, for the scatter
parts: the data with the rows named by the indices replaced; negative indices count from the end of
their axis; with duplicate indices the write that lands is unspecified).  The result is a tuple of
the parts' values, in the order the submodule returns them, read through ``get_tuple_elem``.  A
scatter part's result may be written into its data's buffer (``inplace_input``; ``bind_outputs``
binds a present cache onto the past one): then only its new rows are written.

Execution: ``ref`` evaluates the submodule with the ops' numpy kernels (the unfused results, bit for
bit; an index out of range raises IndexError there); ``gpu`` runs one generated kernel
(:mod:`.fused_horizontal_codegen`) over the sum of the parts' element counts, after a copy of each
scatter part's data into its result when they are not the same buffer.
"""
from __future__ import annotations

from typing import Any

from ..errors import ShapeError
from .base import register_op
from .fused import FusedOp, module_params


def parts_of(sub) -> list:
    """``[(returned instruction, data parameter position or None)]`` of a fused_horizontal submodule:
    the position (in :func:`module_params` order) of each scatter part's data, None for an
    elementwise part.  Raises ShapeError naming the module when it returns fewer than two values, a
    scatter with a reduction, a scatter whose data is not a parameter read by it alone, a parameter
    or literal as a part, or two parts over the same data parameter."""
    ret = sub.get_return()
    outs = list(ret.inputs) if ret is not None else []
    if len(outs) < 2:
        raise ShapeError(f"fused_horizontal: module '{sub.name}' must return two values or more, returns {len(outs)}")
    pos = {id(p): k for k, p in enumerate(module_params(sub))}
    parts: list[tuple[Any, int | None]] = []
    used: set[int] = set()
    for v in outs:
        if v.op.name in ("@param", "@literal"):
            raise ShapeError(f"fused_horizontal: module '{sub.name}' returns {v.op.name}: every part is computed")
        if v.op.name != "scatternd":
            parts.append((v, None))
            continue
        data = v.inputs[0]
        if v.op.reduction != "none":
            raise ShapeError(f"fused_horizontal: module '{sub.name}' returns scatternd[reduction={v.op.reduction}]; "
                             f"only reduction none is fused")
        if id(data) not in pos or any(c is not v for c in data.outputs) or v.inputs.count(data) != 1 \
                or outs.count(v) != 1 or id(data) in used:
            raise ShapeError(f"fused_horizontal: module '{sub.name}': the data of each scatter must be a parameter "
                             f"read by that scatter alone")
        used.add(id(data))
        parts.append((v, pos[id(data)]))
    return parts


@register_op
class FusedHorizontal(FusedOp):
    """``fused_horizontal``: several independent parts (scatters into caches, elementwise values) of
    one submodule as one kernel (see the module docstring).

    Inputs: the submodule's parameters ``x0, x1, ...`` by position.  Output: a tuple of the parts'
    shapes (standard layout, or the layout of the parameter a scatter part is bound onto).  Raises
    ShapeError when the inputs do not match the parameters or the submodule is not of that form
    (:func:`parts_of`)."""

    name = "fused_horizontal"
    kind = "horizontal"

    def compute_shape(self, inputs, mods=()):
        shape = super().compute_shape(inputs, mods)
        parts_of(self.submodule(mods))
        return shape

    @property
    def inplace_ok(self):
        """False: the result is a tuple; each scatter part names its input (:meth:`inplace_input`)."""
        return False

    def inplace_input(self, index=None):
        """The input holding the data of scatter part ``index`` (its result may be that buffer: the
        kernel never reads it, and nothing else in the module does), None for an elementwise part."""
        if index is None or self.module is None:
            return None
        try:
            parts = parts_of(self.module)
        except ShapeError:
            return None
        return parts[index][1] if 0 <= index < len(parts) else None
