"""Operator definitions (``mgx_graph.operators``) and GPU kernel sources (``*.cu``).

Importing this package registers every op (:func:`make_op` builds one by its MIGraphX-style name) and
every entry of the gpu target's kernel table (:mod:`.gpu_lowering`).
"""
from .base import Operation, make_op, register_op, registered_ops  # noqa: F401
from . import pointwise, views, shape_ops, gather_scatter, reduce, nn, control, random, onnx_ref  # noqa: F401  (registration)
from . import pooling, conv_transpose, resize  # noqa: F401  (native spatial ops)
from . import normalization, index_ops, detection, activation  # noqa: F401
from . import normalization_contrib, rotary, quantized, attention, dq_lstm  # noqa: F401  (onnxruntime contrib ops)
from . import decode_attention, rotary_kv  # noqa: F401  (made by the fuse_attention / fuse_rotary_kv passes)
from . import recurrent, quantization, sampling, spectral  # noqa: F401
from . import reinterpret  # noqa: F401
from . import fused, fused_horizontal, fused_scatter  # noqa: F401  (pointwise / fused_reduce / fused_scatternd / fused_horizontal)
# the gpu target's kernel table (gpu_lowering): each module registers the entries of its family
from . import gpu, pointwise_gpu, index_gpu, topk_gpu, vision_gpu, signal_gpu, lstm_gpu, llm_gpu, fused_gpu  # noqa: F401
from . import quantized_gpu  # noqa: F401

__all__ = ["Operation", "make_op", "register_op", "registered_ops"]
