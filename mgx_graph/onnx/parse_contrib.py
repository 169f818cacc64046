"""Ops of domains other than ONNX's, each registered with ``@parser(op_type, domain=...)``:
com.microsoft::DynamicQuantizeLSTM (onnxruntime's contrib op; an LSTM with int8 weights quantized per
direction, run on the host as onnxruntime's CPU kernel computes it).

onnxruntime contrib op spec: https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedOpError
from .op_parser import attr, decode, parser


@parser("DynamicQuantizeLSTM", domain="com.microsoft")
def _parse_dynamic_quantize_lstm(p, m, node, ins):
    """com.microsoft::DynamicQuantizeLSTM (onnxruntime contrib op; inputs X, W, R, B, sequence_lens,
    initial_h, initial_c, P, W_scale, W_zero_point, R_scale, R_zero_point)."""
    ins = list(ins) + [None] * (12 - len(ins))
    acts = [decode(a) for a in (attr(node, "activations") or [])]
    if (acts and acts[:3] != ["Sigmoid", "Tanh", "Tanh"]) or attr(node, "clip") is not None \
            or attr(node, "input_forget", 0) or ins[4] is not None or ins[7] is not None:
        raise UnsupportedOpError(p.node_name, node.op_type, node.domain, p.opsets.get(node.domain, 0),
                                 "only default activations, no clip / input_forget / sequence_lens / peepholes")
    if any(ins[k] is None for k in (0, 1, 2, 8, 10)):
        raise p.err("DynamicQuantizeLSTM needs X, W, R, W_scale and R_scale")
    H = attr(node, "hidden_size")
    direction = decode(attr(node, "direction", b"forward"))
    D = 2 if direction == "bidirectional" else 1
    B = ins[0].shape.lens[1]
    dt = ins[0].shape.dtype
    zeros = [p.lit(m, np.zeros((D, 8 * H), dt)), p.lit(m, np.zeros((D, B, H), dt)), p.lit(m, np.zeros((D, B, H), dt))]
    b, h0, c0 = (ins[k] if ins[k] is not None else z for k, z in zip((3, 5, 6), zeros))
    wzp = ins[9] if ins[9] is not None else p.lit(m, np.zeros((D,), ins[1].shape.dtype))
    rzp = ins[11] if ins[11] is not None else p.lit(m, np.zeros((D,), ins[2].shape.dtype))
    t = p.add(m, "dynamic_quantize_lstm", [ins[0], ins[1], ins[2], b, h0, c0, ins[8], wzp, ins[10], rzp],
              hidden_size=H, direction=direction)
    return [p.add(m, "get_tuple_elem", [t], index=k) for k in range(3)]
