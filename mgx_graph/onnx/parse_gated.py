"""SwiGLU (opset 28) and CausalConvWithState (opset 27) lowered to native slice and pointwise
instructions (fused into generated kernels on the gpu target).

- SwiGLU: ``Y = A * sigmoid(alpha * A) * B`` (A, B of one shape and type).
- CausalConvWithState: ``padded = concat(past_state or 0, input)`` along the length axis [B, C, K-1+L];
  ``output[b, c, t] = bias[c] + sum_i weight[c, 0, i] * padded[b, c, t + i]`` (a depthwise, causal 1-D
  convolution; the K taps are K shifted slices), then SiLU when ``activation`` is ``silu`` / ``swish``
  (computed in float32; float16 taps accumulate in float32); ``present_state`` = the last K-1 positions of ``padded``.
  Each tap is a few instructions, so K is at most :data:`MAX_TAPS` (a weight declaring more is refused
  before any is made).

ONNX operator spec: https://onnx.ai/onnx/operators/ (SwiGLU, CausalConvWithState)
"""
from __future__ import annotations

import numpy as np

from .op_parser import attr, decode, parser, require_float, unsupported
from .parse_constant import filled

MAX_TAPS = 4096  # CausalConvWithState kernel taps unrolled into instructions, at most

@parser("SwiGLU")
def _parse_swiglu(p, m, node, ins):
    """Output Y: A's shape and type.  ParseError when A and B differ in shape or type."""
    a, b = ins[:2]
    require_float(p, a, "A")
    if a.shape.dtype != b.shape.dtype or tuple(a.shape.lens) != tuple(b.shape.lens):
        raise p.err(f"A {a.shape.brief()} and B {b.shape.brief()} must have one shape and type")
    alpha = p.lit(m, np.array(attr(node, "alpha", 1.0), a.shape.dtype))
    gate = p.add(m, "sigmoid", [p.add(m, "mul", [a, alpha])])
    return p.add(m, "mul", [p.add(m, "mul", [a, gate]), b])


def _silu(p, m, y):
    dt = y.shape.dtype
    yf = y if dt in ("float32", "float64") else p.add(m, "convert", [y], target_type="float32")
    s = p.add(m, "mul", [yf, p.add(m, "sigmoid", [yf])])
    return s if s.shape.dtype == dt else p.add(m, "convert", [s], target_type=dt)


@parser("CausalConvWithState")
def _parse_causal_conv(p, m, node, ins):
    """Outputs: output [B, C, L] and present_state [B, C, K-1], the input's type.  ParseError for
    shapes other than input [B, C, L], weight [C, 1, K], bias [C], past_state [B, C, K-1];
    UnsupportedOpError for an activation other than none / silu / swish, or a kernel over MAX_TAPS taps."""
    ins = list(ins) + [None] * (4 - len(ins))
    x, w, bias, past = ins[:4]
    require_float(p, x)
    act = decode(attr(node, "activation", b"none"))
    if act not in ("none", "silu", "swish"):
        raise unsupported(p, node, f"activation={act!r} (the spec allows none, silu, swish)")
    if x.shape.ndim != 3 or w.shape.ndim != 3 or w.shape.lens[:2] != (x.shape.lens[1], 1) or \
            w.shape.dtype != x.shape.dtype:
        raise p.err(f"input {x.shape.brief()} must be [B, C, L] and weight {w.shape.brief()} [C, 1, K] of its type")
    B, C, L = x.shape.lens
    K = w.shape.lens[2]
    if K < 1:
        raise p.err(f"weight {w.shape.brief()} has no taps: expected [C, 1, K] with K >= 1")
    if K > MAX_TAPS:
        raise unsupported(p, node, f"a kernel of {K} taps (weight {w.shape.brief()}): at most {MAX_TAPS}, each "
                                   f"tap being unrolled into instructions")
    if bias is not None and tuple(bias.shape.lens) != (C,):
        raise p.err(f"bias {bias.shape.brief()} must be [{C}]")
    if past is not None and tuple(past.shape.lens) != (B, C, K - 1):
        raise p.err(f"past_state {past.shape.brief()} must be [{B}, {C}, {K - 1}]")
    if past is None:
        past = filled(p, m, (B, C, K - 1), 0, x.shape.dtype)
    padded = p.add(m, "concat", [past, x], axis=2) if K > 1 else x
    dt = x.shape.dtype
    acc = padded if dt != "float16" else p.add(m, "convert", [padded], target_type="float32")
    if dt == "float16":  # float16 accumulates in float32 (rounded once, as the spec's Conv)
        w = p.add(m, "convert", [w], target_type="float32")
        bias = None if bias is None else p.add(m, "convert", [bias], target_type="float32")
    y = None
    for i in range(K):
        tap = p.add(m, "slice", [acc], axes=[2], starts=[i], ends=[i + L])
        wi = p.reshape(m, p.add(m, "slice", [w], axes=[2], starts=[i], ends=[i + 1]), [1, C, 1])
        term = p.add(m, "mul", [tap, wi])
        y = term if y is None else p.add(m, "add", [y, term])
    if bias is not None:
        y = p.add(m, "add", [y, p.reshape(m, bias, [1, C, 1])])
    if y.shape.dtype != dt:
        y = p.add(m, "convert", [y], target_type=dt)
    if act != "none":
        y = _silu(p, m, y)
    present = p.add(m, "slice", [padded], axes=[2], starts=[L], ends=[L + K - 1])
    # a copy of its own: a decoder binds present_state over past_state (written in place after the concat read it)
    return [y, p.add(m, "contiguous", [present])]


@parser("CausalConvWithState", domain="com.microsoft")
def _parse_causal_conv_contrib(p, m, node, ins):
    """com.microsoft::CausalConvWithState, as onnxruntime-genai's builder writes it for LFM2's short
    convolutions: the ONNX op's computation for ``ndim=1`` and ``state_window=0``; other values are an
    UnsupportedOpError naming the attribute."""
    for name, want in (("ndim", 1), ("state_window", 0)):
        if attr(node, name, want) != want:
            raise unsupported(p, node, f"attribute {name}={attr(node, name)} (only {name}={want})")
    return _parse_causal_conv(p, m, node, ins)
