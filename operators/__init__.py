"""Operator definitions (``mgx_graph.operators``) and GPU kernel sources (``*.cu``).

Importing this package registers every op; :func:`make_op` builds one by its MIGraphX-style name.
"""
from .base import Operation, make_op, register_op, registered_ops  # noqa: F401
from . import pointwise, shape_ops, reduce, nn, control, random, onnx_ref  # noqa: F401  (registration)
from . import pooling  # noqa: F401
from . import conv_transpose  # noqa: F401
from . import resize  # noqa: F401
from . import fused  # noqa: F401

__all__ = ["Operation", "make_op", "register_op", "registered_ops"]
