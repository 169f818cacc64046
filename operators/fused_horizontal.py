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
from .fused import FusedOp
from .fused_module import module_params, parts_of  # noqa: F401


@register_op
class FusedHorizontal(FusedOp):
    """``fused_horizontal``: several independent parts (scatters into caches, elementwise values) of
    one submodule as one kernel (see the module docstring).

    Inputs: the submodule's parameters ``x0, x1, ...`` by position.  Output: a tuple of the parts'
    shapes (standard layout, or the layout of the parameter a scatter part is bound onto).  Raises
    ShapeError when the inputs do not match the parameters or the submodule is not of that form
    (:func:`parts_of`)."""

    name = "fused_horizontal"

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
