"""``fused_scatternd``: a ScatterND whose ``updates`` are computed in the same kernel (made by the
``fuse_scatternd`` pass, :mod:`mgx_graph.passes.fuse_scatternd`).

The instruction runs one submodule, as ``pointwise`` does (:mod:`.fused`): parameter ``x0`` is the
scatter's ``data``, the other parameters the values the updates and the indices are read from.  The
submodule ends in one ``scatternd`` (reduction ``none``) whose data operand is ``x0`` itself, whose
indices come from outside the group, and whose updates are computed by the elementwise instructions,
views and ``concat`` before it (a fused ``pointwise`` body: RoPE of the new keys, a ``convert``).

Semantics: those of the unfused ``scatternd`` (ONNX ScatterND, reduction ``none``): the output is
``data`` with the rows named by ``indices`` replaced by the updates; negative indices count from the
end of their axis; with duplicate indices the write that lands is unspecified (ONNX).  Bound in place
(``bind_outputs``: the present KV cache written into the past buffer) the output is ``x0``'s buffer and
only the new rows are written.

Execution: ``ref`` evaluates the submodule with the ops' numpy kernels (the unfused results, bit for
bit; an index out of range raises IndexError there); ``gpu`` runs one generated kernel
(:mod:`.fused_scatter_codegen`): one thread per element of the updates computes it and stores it at
its scattered position, after a copy of ``data`` into the output when they are not the same buffer.
"""
from __future__ import annotations

from ..errors import ShapeError
from .base import register_op
from .fused import FusedOp
from .fused_module import module_params, scatter_of  # noqa: F401


@register_op
class FusedScatterND(FusedOp):
    """``fused_scatternd``: a ScatterND (reduction ``none``) over ``x0`` with the elementwise
    instructions computing its updates, as one kernel (see the module docstring).

    Inputs: the submodule's parameters ``x0`` (data), ``x1, ...`` by position.  Output: data's lens and
    type (standard layout, or the layout of the parameter it is bound onto).  Raises ShapeError when
    the inputs do not match the parameters or the submodule is not of that form (:func:`scatter_of`)."""

    name = "fused_scatternd"

    def compute_shape(self, inputs, mods=()):
        shape = super().compute_shape(inputs, mods)
        scatter_of(self.submodule(mods))
        return shape

    @property
    def inplace_ok(self):
        """True: the kernel never reads ``x0`` (the data), and ``x0`` feeds nothing but the scatter
        (:func:`scatter_of`), so the output may be ``x0``'s buffer."""
        sub = self.module
        if sub is None:
            return False
        try:
            scatter_of(sub)
        except ShapeError:
            return False
        return True
