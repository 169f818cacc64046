"""Ops of domains other than ONNX's, each registered with ``@parser(op_type, domain=...)``, and the
contrib ops onnxruntime registers under ai.onnx names:

- com.microsoft::DynamicQuantizeLSTM (an LSTM with int8 weights quantized per direction, computed as
  onnxruntime's CPU kernel computes it, on the host or with the kernels of ``dq_lstm.cu``);
- the fused normalizations SkipLayerNormalization, SkipSimplifiedLayerNormalization (com.microsoft) and
  SimplifiedLayerNormalization (ai.onnx domain): one ``skip_layer_norm`` instruction;
- the GELU family Gelu, FastGelu, BiasGelu, QuickGelu (com.microsoft): ``add`` + ``gelu`` /
  ``quick_gelu``;
- com.microsoft::MatMulNBits (block-quantized 2 / 4 / 8-bit weights): ``matmul_nbits``;
- com.microsoft::GatherBlockQuantized (rows of a block-quantized table): ``gather_block_quantized``.

Attention and rotary embeddings are in :mod:`.parse_contrib_attention`.

onnxruntime contrib op spec: https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError, UnsupportedOpError
from .op_parser import attr, decode, parser
from .parse_constant import filled

MS = "com.microsoft"


def pad_inputs(ins, n: int) -> list:
    """The node's inputs padded with None (omitted trailing inputs) to ``n`` entries."""
    return list(ins) + [None] * (n - len(ins))


def wanted_outputs(node, n: int) -> list[bool]:
    """Which of the node's first ``n`` outputs are requested (named)."""
    return [bool(o) for o in node.output[:n]] + [False] * (n - len(node.output))


def unsupported(p, node, detail: str) -> UnsupportedOpError:
    """An UnsupportedOpError naming the node being parsed and the variant (``detail``)."""
    return UnsupportedOpError(p.node_name, node.op_type, node.domain, p.opsets.get(node.domain or "", 0), detail)


@parser("DynamicQuantizeLSTM", domain=MS)
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
    if ins[0].shape.ndim != 3 or ins[2].shape.ndim != 3:
        raise p.err(f"X {ins[0].shape.brief()} and R {ins[2].shape.brief()} must be 3-D")
    if not isinstance(H, int) or H < 1 or list(ins[2].shape.lens) != [D, H, 4 * H]:
        raise p.err(f"'hidden_size' = {H} must be an int >= 1 matching R {ins[2].shape.brief()}: expected R "
                    f"[{D}, hidden_size, 4*hidden_size] ('direction' = '{direction}')")
    B = ins[0].shape.lens[1]
    dt = ins[0].shape.dtype
    defaults = {3: (D, 8 * H), 5: (D, B, H), 6: (D, B, H)}
    b, h0, c0 = (ins[k] if ins[k] is not None else filled(p, m, lens, 0, dt) for k, lens in defaults.items())
    wzp = ins[9] if ins[9] is not None else p.lit(m, np.zeros((D,), ins[1].shape.dtype))
    rzp = ins[11] if ins[11] is not None else p.lit(m, np.zeros((D,), ins[2].shape.dtype))
    t = p.add(m, "dynamic_quantize_lstm", [ins[0], ins[1], ins[2], b, h0, c0, ins[8], wzp, ins[10], rzp],
              hidden_size=H, direction=direction)
    return [p.add(m, "get_tuple_elem", [t], index=k) for k in range(3)]


# ---------------------------------------------------------------------------------------------------
# fused normalizations
# ---------------------------------------------------------------------------------------------------
@parser("SkipLayerNormalization", "SkipSimplifiedLayerNormalization", domain=MS)
def _parse_skip_norm(p, m, node, ins):
    """com.microsoft::SkipLayerNormalization (input, skip, gamma, beta, bias) and
    SkipSimplifiedLayerNormalization (input, skip, gamma, bias); outputs output, mean, inv_std_var,
    input_skip_bias_sum.  epsilon defaults to 1e-12 as in onnxruntime."""
    simplified = node.op_type == "SkipSimplifiedLayerNormalization"
    if simplified:
        x, skip, gamma, bias = pad_inputs(ins, 4)
        beta = None
    else:
        x, skip, gamma, beta, bias = pad_inputs(ins, 5)
    if x is None or skip is None or gamma is None:
        raise p.err("needs the input, skip and gamma inputs")
    if x.shape.ndim not in (2, 3):
        raise p.err(f"input {x.shape.brief()} must be 2-D or 3-D (as onnxruntime requires)")
    want = wanted_outputs(node, 4)
    args = [x, skip, gamma] + [i for i in (beta, bias) if i is not None]
    r = p.add(m, "skip_layer_norm", args, epsilon=attr(node, "epsilon", 1e-12), simplified=int(simplified),
              axis=-1, skip=1, beta=int(beta is not None), bias=int(bias is not None), stats=int(any(want[1:])))
    if not any(want[1:]):
        return r
    return [p.add(m, "get_tuple_elem", [r], index=k) if want[k] else None for k in range(4)]


@parser("SimplifiedLayerNormalization")
def _parse_simplified_layer_norm(p, m, node, ins):
    """SimplifiedLayerNormalization (onnxruntime's ai.onnx-domain RMS normalization: X, scale; outputs
    Y, inv_std_var; axis -1 and epsilon 1e-5 by default; stash_type 1, float32 statistics)."""
    x, scale = pad_inputs(ins, 2)
    if x is None or scale is None:
        raise p.err("needs the X and scale inputs")
    if attr(node, "stash_type", 1) != 1:
        raise unsupported(p, node, f"stash_type {attr(node, 'stash_type')} (only 1: float32 statistics)")
    want = wanted_outputs(node, 2)
    r = p.add(m, "skip_layer_norm", [x, scale], epsilon=attr(node, "epsilon", 1e-5), simplified=1,
              axis=attr(node, "axis", -1), stats=int(want[1]))
    if not want[1]:
        return r
    return [p.add(m, "get_tuple_elem", [r], index=0), p.add(m, "get_tuple_elem", [r], index=2)]


# ---------------------------------------------------------------------------------------------------
# the GELU family
# ---------------------------------------------------------------------------------------------------
def _add_bias(p, m, x, bias, what="bias"):
    """``x + bias`` for a 1-D bias over the last dim (as onnxruntime requires), else ``x``."""
    if bias is None:
        return x
    if bias.shape.ndim != 1 or bias.shape.lens[0] != x.shape.lens[-1]:
        raise ShapeError(f"node '{p.node_name}' ({p.node.op_type}): {what} {bias.shape.brief()} must be 1-D "
                         f"[{x.shape.lens[-1]}] (the last dim of input {list(x.shape.lens)})")
    return p.add(m, "add", [x, bias])


@parser("Gelu", "BiasGelu", "FastGelu", "QuickGelu", domain=MS)
def _parse_gelu_family(p, m, node, ins):
    """Gelu (erf), BiasGelu (A + B, erf), FastGelu (X (+ bias), tanh approximation
    0.5 x (1 + tanh(0.7978845608 (x + 0.044715 x^3)))), QuickGelu (x sigmoid(alpha x), alpha 1.702)."""
    x, bias = pad_inputs(ins, 2)
    if x is None or (node.op_type == "BiasGelu" and bias is None):
        raise p.err("missing input")
    x = _add_bias(p, m, x, bias if node.op_type in ("BiasGelu", "FastGelu") else None)
    if node.op_type == "QuickGelu":
        return p.add(m, "quick_gelu", [x], alpha=attr(node, "alpha", 1.702))
    return p.add(m, "gelu", [x], approximate="tanh" if node.op_type == "FastGelu" else "none")


# ---------------------------------------------------------------------------------------------------
# block-quantized MatMul
# ---------------------------------------------------------------------------------------------------
@parser("MatMulNBits", domain=MS)
def _parse_matmul_nbits(p, m, node, ins):
    """com.microsoft::MatMulNBits (A, B, scales, zero_points, g_idx, bias; attributes K, N, bits,
    block_size; accuracy_level is ignored: the product runs in A's type).  ``_const_b``: B is an
    initializer (the gpu GEMV may read it before the kernel ahead of it finishes)."""
    a, b, scales, zp, g, bias = pad_inputs(ins, 6)
    if a is None or b is None or scales is None:
        raise p.err("needs the A, B and scales inputs")
    K, N, bits, bs = attr(node, "K"), attr(node, "N"), attr(node, "bits", 4), attr(node, "block_size")
    if K is None or N is None or bs is None:
        raise p.err("needs the K, N and block_size attributes")
    if bits not in (2, 4, 8) or attr(node, "weight_prepacked", 0):
        raise unsupported(p, node, f"bits {bits} / weight_prepacked {attr(node, 'weight_prepacked', 0)} "
                                   f"(bits 2, 4 or 8, not prepacked)")
    if bs < 16 or bs & (bs - 1):
        raise p.err(f"'block_size' = {bs} must be a power of 2 and >= 16 (as onnxruntime requires)")
    if a.shape.lens[-1] != K:
        raise p.err(f"'K' = {K} differs from the last dim of A {list(a.shape.lens)}")
    if 0 in b.shape.lens:
        raise unsupported(p, node, f"an empty (omitted) weight B {b.shape.brief()}")
    kb = -(-K // bs)
    if list(b.shape.lens) != [N, kb, bs * bits // 8]:
        raise p.err(f"B {list(b.shape.lens)} must be [N, ceil(K / block_size), block_size * bits / 8] = "
                    f"{[N, kb, bs * bits // 8]} for 'K' = {K}, 'N' = {N}, 'bits' = {bits}, 'block_size' = {bs}")
    if scales.shape.elements() != N * kb:
        raise p.err(f"scales {list(scales.shape.lens)} must hold N * ceil(K / block_size) = {N * kb} values")
    args = [p.contiguous(m, a), b, p.reshape(m, scales, [N, kb])]
    kind = "none"
    if zp is not None:
        kind = "packed" if zp.shape.dtype == "uint8" else "float"
        zlen = -(-kb * bits // 8) if kind == "packed" else kb
        args.append(p.reshape(m, zp, [N, zlen]) if zp.shape.elements() == N * zlen else zp)
    if g is not None:
        args.append(g)
    if bias is not None:
        args.append(bias)
    return p.add(m, "matmul_nbits", args, K=K, N=N, bits=bits, block_size=bs, zero_points=kind,
                 g_idx=int(g is not None), bias=int(bias is not None), _const_b=int(b.op.name == "@literal"))


@parser("GatherBlockQuantized", domain=MS)
def _parse_gather_block_quantized(p, m, node, ins):
    """com.microsoft::GatherBlockQuantized (data, indices, scales, zero_points; attributes bits (4),
    block_size (128), gather_axis (0), quantize_axis (1)): uint8 data, gathered on axis 0 and quantized
    along the last axis (onnxruntime's layout for uint8 data); ``gather_block_quantized``."""
    data, idx, scales, zp = pad_inputs(ins, 4)
    if data is None or idx is None or scales is None:
        raise p.err("needs the data, indices and scales inputs")
    bits, bs = attr(node, "bits", 4), attr(node, "block_size", 128)
    rank = data.shape.ndim
    g_axis, q_axis = attr(node, "gather_axis", 0), attr(node, "quantize_axis", 1)
    if data.shape.dtype != "uint8" or bits not in (2, 4, 8):
        raise unsupported(p, node, f"data {data.shape.brief()} at {bits} bits (uint8 data at 2, 4 or 8 bits)")
    if rank < 2 or g_axis % rank != 0 or q_axis % rank != rank - 1:
        raise unsupported(p, node, f"gather_axis {g_axis} / quantize_axis {q_axis} on data {data.shape.brief()} "
                                   f"(uint8 data: gather axis 0, quantize axis the last)")
    if bs < 1:
        raise ShapeError(f"node '{p.node_name}' (GatherBlockQuantized): block_size {bs} must be positive")
    args = [data, p.contiguous(m, idx), scales] + ([zp] if zp is not None else [])
    return p.add(m, "gather_block_quantized", args, bits=bits, block_size=bs, zero_points=int(zp is not None))
