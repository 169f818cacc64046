"""ONNX frontend: an ONNX model -> an mgx_graph :class:`~mgx_graph.ir.Program`.

Built on the ``onnx`` package: ``onnx.load`` (with external data), ``onnx.numpy_helper`` for tensors
and ``onnx.shape_inference`` (with data propagation) as a cross check of every statically known output
shape.  Laid out as MIGraphX's ``src/onnx/``:

- :mod:`.onnx_parser`: the parser core (:class:`OnnxParser`, the node loop, constant folding,
  subgraphs, :func:`parse_onnx`); :mod:`.loader`: model loading, external data, :func:`symbolic_inputs`;
  :mod:`.topology`: single definition of tensor names, topological order, the nodes an output needs;
- :mod:`.op_parser`: the ``@parser(*op_types, domain=...)`` registry and attribute helpers;
- one ``parse_<family>`` module per op family, each registering its parsers when imported:
  :mod:`.parse_elementwise`, :mod:`.parse_constant`, :mod:`.parse_shape`, :mod:`.parse_nn`,
  :mod:`.parse_reduce`, :mod:`.parse_control_flow`, :mod:`.parse_dynamic`, :mod:`.parse_random`,
  :mod:`.parse_spatial` (pooling, resize, ConvTranspose, depth/space rearrangements),
  :mod:`.parse_quantization` (DynamicQuantizeLinear, ConvInteger, MatMulInteger, QuantizeLinear,
  DequantizeLinear, QLinearMatMul, QLinearConv),
  :mod:`.parse_normalization` (instance / group / mean-variance / Lp / LRN / RMS normalizations),
  :mod:`.parse_index` (Hardmax, CumSum, OneHot, Trilu, EyeLike, ReverseSequence, Compress,
  NonMaxSuppression, Einsum), :mod:`.parse_recurrent` (RNN, GRU), :mod:`.parse_sampling` (GridSample,
  RoiAlign), :mod:`.parse_signal` (DFT, STFT, Hann / Hamming / Blackman windows, MelWeightMatrix),
  :mod:`.parse_contrib` and :mod:`.parse_contrib_attention` (onnxruntime's contrib ops) and
  :mod:`.parse_generic` (the fallback: the host evaluates any other ONNX op with ``onnx.reference``).

Adding an op: copy a sibling parser in the family module it belongs to (``@parser("OpType")`` on a
function ``(p, m, node, ins)`` returning its output instruction(s)); see :mod:`.op_parser`.

ONNX operator spec: https://onnx.ai/onnx/operators/
"""
from . import (parse_constant, parse_contrib, parse_contrib_attention, parse_control_flow,  # noqa: F401
               parse_dynamic, parse_elementwise, parse_generic, parse_index, parse_nn, parse_normalization,
               parse_quantization, parse_random, parse_recurrent, parse_reduce, parse_sampling, parse_shape,
               parse_signal, parse_spatial, parse_attention, parse_loss,
               parse_gated, parse_moe)  # (registration)
from .loader import load_model, symbolic_inputs
from .onnx_parser import MAX_OPSET, MIN_OPSET, OnnxParser, fold_instruction, parse_onnx
from .op_parser import parser

__all__ = ["parse_onnx", "load_model", "symbolic_inputs", "fold_instruction", "parser", "OnnxParser",
           "MIN_OPSET", "MAX_OPSET"]
