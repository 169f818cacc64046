"""The ``graph_launch`` operation: capture a submodule once, replay it as one graph launch.

The op's state, the graph cache of the region (warmup, capture, update, replay, fallback, eager), is
a :class:`~mgx_graph.graph_cache.GraphLaunchState`; validation mode is in
:mod:`mgx_graph.graph_validation`.
"""
from __future__ import annotations

from .graph_cache import GraphBudget, GraphLaunchState, GraphOptions  # noqa: F401  (the op's state and settings)
from .graph_validation import Validator  # noqa: F401
from .operators.base import Operation, register_op


@register_op
class GraphLaunch(Operation):
    """Runs its submodule; shape: the submodule's return shape (a tuple when it returns several)."""

    name = "graph_launch"
    capturable = False
    foldable = False

    def compute_shape(self, inputs, mods=()):
        outs = mods[0].get_output_shapes()
        return outs[0] if len(outs) == 1 else tuple(outs)
