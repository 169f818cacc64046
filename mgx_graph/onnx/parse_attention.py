"""ONNX Attention (opsets 23-25) lowered to native instructions: two batched ``dot`` GEMMs around an
additive bias, a softcap and a ``softmax`` (the pointwise and reduce parts fuse into generated kernels
on the gpu target).

``Y = softmax(softcap(scale * Q K^T) + bias) V`` with ``Q``, ``K`` each pre-multiplied by ``sqrt(scale)``
in the input type (as the spec's function body).  Grouped heads (``q_num_heads`` a multiple of
``kv_num_heads``) are computed as ``[B, Nkv, G, S, H] x [B, Nkv, 1, H, T]``: K and V are broadcast, never
repeated.  The bias is the attention mask (boolean: False -> -inf; float: added; a last dim shorter than
the total length is padded with -inf), plus -inf where ``is_causal`` (bottom-right aligned: query ``i``
sees key ``j <= i + offset``), the sliding window (``left_window_size`` / ``right_window_size``, opset
25) or ``nonpad_kv_seqlen`` (opset 24) hide the key.  ``offset`` is the past length, else
``nonpad_kv_seqlen[b] - S``, else 0.  A query row whose bias is -inf everywhere outputs 0 (and 0 in the
mode-3 ``qk_matmul_output``).  present_key / present_value are the past concatenated with K / V.

ONNX operator spec: https://onnx.ai/onnx/operators/onnx__Attention.html (and onnx.reference's
op_attention.py for the composition order of softcap, mask and the fully-masked-row guard).
"""
from __future__ import annotations

import numpy as np

from ..ir.shape import onnx_dtype
from .op_parser import FLOATS, attr, parser, unsupported
from .parse_constant import filled, iota

_INPUTS = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")


def _to_bnsh(p, m, x, heads, what):
    """A 3-D [B, S, heads*H] input as [B, heads, S, H]; a 4-D one as is."""
    s = x.shape
    if s.ndim == 4:
        return x
    name = "q_num_heads" if what == "Q" else "kv_num_heads"
    if s.ndim != 3 or not heads or s.lens[2] % heads:
        raise p.err(f"{what} {s.brief()} must be 4-D [B, N, S, H], or 3-D [B, S, N*H] with '{name}' = {heads} "
                    f"dividing the hidden size")
    B, S, D = s.lens
    return p.add(m, "transpose", [p.reshape(m, x, [B, S, heads, D // heads])], permutation=[0, 2, 1, 3])


def _inputs(p, m, node, ins):
    """(q, k, v [B, N*, S*, H*], mask, past_key, past_value, nonpad) checked against each other."""
    ins = list(ins) + [None] * (len(_INPUTS) - len(ins))
    q, k, v, mask, pk, pv, nonpad = ins[:7]
    if q is None or k is None or v is None:
        raise p.err("needs the Q, K and V inputs")
    if q.shape.dtype not in FLOATS or k.shape.dtype != q.shape.dtype or v.shape.dtype != q.shape.dtype:
        raise p.err(f"Q, K, V must share one float type, got {q.shape.dtype}, {k.shape.dtype}, {v.shape.dtype}")
    if not (q.shape.ndim == k.shape.ndim == v.shape.ndim):
        raise p.err(f"Q {q.shape.brief()}, K {k.shape.brief()}, V {v.shape.brief()} must have the same rank")
    if (pk is None) != (pv is None):
        raise p.err("past_key and past_value must both be given or both be absent")
    if nonpad is not None and pk is not None:
        raise p.err("nonpad_kv_seqlen cannot be combined with past_key / past_value")
    N, Nkv = attr(node, "q_num_heads", 0), attr(node, "kv_num_heads", 0)
    if q.shape.ndim == 4 and (N or Nkv):
        raise p.err("q_num_heads and kv_num_heads must not be given for 4-D inputs")
    q, k, v = _to_bnsh(p, m, q, N, "Q"), _to_bnsh(p, m, k, Nkv, "K"), _to_bnsh(p, m, v, Nkv, "V")
    B, N, S, H = q.shape.lens
    if k.shape.lens[0] != B or k.shape.lens[3] != H or v.shape.lens[:3] != k.shape.lens[:3] \
            or N % max(k.shape.lens[1], 1):
        raise p.err(f"K {k.shape.brief()} / V {v.shape.brief()} do not match Q {q.shape.brief()} (want "
                    f"[{B}, Nkv dividing {N}, T, {H}] / [{B}, Nkv, T, Hv])")
    for what, t, want in (("past_key", pk, k), ("past_value", pv, v)):
        if t is not None and (t.shape.ndim != 4 or t.shape.dtype != q.shape.dtype or
                              (t.shape.lens[0], t.shape.lens[1], t.shape.lens[3]) !=
                              (want.shape.lens[0], want.shape.lens[1], want.shape.lens[3])):
            raise p.err(f"{what} {t.shape.brief()} does not match {want.shape.brief()} outside the sequence axis")
    if nonpad is not None and (nonpad.shape.dtype not in ("int64", "int32") or tuple(nonpad.shape.lens) != (B,)):
        raise p.err(f"nonpad_kv_seqlen {nonpad.shape.brief()} must be int64 [{B}]")
    return q, k, v, mask, pk, pv, nonpad


def _scaled(p, m, x, scale):
    return p.add(m, "mul", [x, p.lit(m, np.array(scale, dtype=x.shape.dtype))])


def _allowed(p, m, node, S, T, past, nonpad):
    """The boolean [S, T] (or [B, 1, S, T] with nonpad_kv_seqlen) of keys the causal / window / padding
    rules let each query row see, or None when no rule applies."""
    causal = attr(node, "is_causal", 0)
    left, right = attr(node, "left_window_size", -1), attr(node, "right_window_size", -1)
    if left < -1 or right < -1:
        raise p.err(f"left_window_size={left} / right_window_size={right} must be -1 or >= 0")
    if not causal and left < 0 and right < 0 and nonpad is None:
        return None
    i, j = iota(p, m, S, [S, 1]), iota(p, m, T, [1, T])
    if nonpad is not None:  # per-batch offset nonpad[b] - S: [B, 1, 1]
        np64 = p.add(m, "convert", [nonpad], target_type="int64") if nonpad.shape.dtype != "int64" else nonpad
        B = nonpad.shape.lens[0]
        off = p.add(m, "sub", [p.reshape(m, np64, [B, 1, 1]), p.lit(m, np.array(S, np.int64))])
        pos = p.add(m, "add", [i, off])  # [B, S, 1]
    else:
        pos = p.add(m, "add", [i, p.lit(m, np.array(past, np.int64))])  # [S, 1]
    diff = p.add(m, "sub", [pos, j])  # query position - key index
    terms = []
    if causal:
        terms.append(p.add(m, "greater_equal", [diff, p.lit(m, np.array(0, np.int64))]))
    if left >= 0:
        terms.append(p.add(m, "less_equal", [diff, p.lit(m, np.array(left, np.int64))]))
    if right >= 0:
        terms.append(p.add(m, "greater_equal", [diff, p.lit(m, np.array(-right, np.int64))]))
    if nonpad is not None:
        terms.append(p.add(m, "less", [j, p.reshape(m, np64, [B, 1, 1])]))
    ok = terms[0]
    for t in terms[1:]:
        ok = p.add(m, "logical_and", [ok, t])
    if nonpad is not None:
        ok = p.reshape(m, ok, [B, 1] + list(ok.shape.lens[1:]))  # [B, 1, S or 1, T]
    return ok


def _mask_bias(p, m, mask, T, dtype):
    """(float bias in ``dtype`` or None, boolean keep or None) from attn_mask, padded to T keys."""
    if mask is None:
        return None, None
    s = mask.shape
    if s.ndim < 1 or s.lens[-1] > T:
        raise p.err(f"attn_mask {s.brief()} must have a last dim <= the total sequence length {T}")
    if s.dtype != "bool" and s.dtype not in FLOATS:
        raise p.err(f"attn_mask {s.brief()} must be bool or float")
    if s.lens[-1] < T:
        pad = filled(p, m, tuple(s.lens[:-1]) + (T - s.lens[-1],), False if s.dtype == "bool" else -np.inf, s.dtype)
        mask = p.add(m, "concat", [mask, pad], axis=s.ndim - 1)
    if s.dtype == "bool":
        return None, mask
    return (mask if s.dtype == dtype else p.add(m, "convert", [mask], target_type=dtype)), None


def _bias(p, m, node, mask, S, T, past, nonpad, dtype):
    """The additive bias (``dtype``, broadcastable to [B, N, S, T]) or None."""
    fbias, keep = _mask_bias(p, m, mask, T, dtype)
    allowed = _allowed(p, m, node, S, T, past, nonpad)
    if allowed is not None:
        keep = allowed if keep is None else p.add(m, "logical_and", [keep, allowed])
    if keep is None:
        return fbias
    ninf = p.add(m, "where", [keep, p.lit(m, np.array(0, dtype)), p.lit(m, np.array(-np.inf, dtype))])
    return ninf if fbias is None else p.add(m, "add", [fbias, ninf])


def _softcap(p, m, x, cap):
    dt = x.shape.dtype
    y = p.add(m, "tanh", [p.add(m, "mul", [x, p.lit(m, np.array(1.0 / cap, dt))])])
    return p.add(m, "mul", [y, p.lit(m, np.array(cap, dt))])


def _probabilities(p, m, node, qk, bias):
    """(probabilities in qk's type, the qk_matmul_output value): softmax in ``softmax_precision``
    (default: qk's type), fully masked rows zeroed."""
    mode = attr(node, "qk_matmul_output_mode", 0)
    if mode not in (0, 1, 2, 3):
        raise unsupported(p, node, f"qk_matmul_output_mode={mode} (the spec allows 0-3)")
    dt = qk.shape.dtype
    x = qk if bias is None else p.add(m, "add", [qk, bias])  # bias may be wider (a float mask)
    with_bias = x
    prec = attr(node, "softmax_precision", None)
    sdt = onnx_dtype(prec) if prec is not None else x.shape.dtype
    if sdt not in FLOATS:
        raise unsupported(p, node, f"softmax_precision={prec} ({sdt}: float16/32/64 are implemented)")
    if x.shape.dtype != sdt:
        x = p.add(m, "convert", [x], target_type=sdt)
    prob = p.add(m, "softmax", [x], axis=-1)
    if bias is not None:
        row_max = p.add(m, "reduce_max", [bias], axes=[-1], keepdims=1)
        dead = p.add(m, "isinf", [row_max], detect_positive=0, detect_negative=1)
        prob = p.add(m, "where", [dead, p.lit(m, np.array(0, sdt)), prob])
    qk_out = prob if mode == 3 else (with_bias if mode == 2 else qk)
    cast = [t if t.shape.dtype == dt else p.add(m, "convert", [t], target_type=dt) for t in (prob, qk_out)]
    return cast[0], cast[1]


@parser("Attention")
def _parse_attention(p, m, node, ins):
    """ai.onnx Attention: outputs Y (Q's layout: [B, N, S, Hv] or [B, S, N*Hv]), present_key,
    present_value ([B, Nkv, past + S_kv, H*]) and qk_matmul_output ([B, N, S, T], per
    ``qk_matmul_output_mode``).  ParseError for inconsistent inputs; UnsupportedOpError for a
    qk_matmul_output_mode or softmax_precision outside the spec."""
    if p.opset < 23:
        raise unsupported(p, node, "Attention is an ai.onnx op from opset 23")
    rank3 = ins[0] is not None and ins[0].shape.ndim == 3
    q, k, v, mask, pk, pv, nonpad = _inputs(p, m, node, ins)
    past = pk.shape.lens[2] if pk is not None else 0
    if pk is not None:
        k = p.add(m, "concat", [pk, k], axis=2)
        v = p.add(m, "concat", [pv, v], axis=2)
    B, N, S, H = q.shape.lens
    Nkv, T, Hv = k.shape.lens[1], k.shape.lens[2], v.shape.lens[3]
    G = N // Nkv
    dt = q.shape.dtype
    scale = attr(node, "scale", None)
    root = np.sqrt(np.float64(1.0 / np.sqrt(H) if scale is None else scale))
    qs = p.reshape(m, _scaled(p, m, q, root), [B, Nkv, G, S, H])
    kt = p.add(m, "transpose", [p.reshape(m, _scaled(p, m, k, root), [B, Nkv, 1, T, H])],
               permutation=[0, 1, 2, 4, 3])
    qk = p.reshape(m, p.add(m, "dot", [qs, kt]), [B, N, S, T])
    cap = attr(node, "softcap", 0.0)
    if cap and cap > 0:
        qk = _softcap(p, m, qk, cap)
    wide = mask.shape.dtype if mask is not None and mask.shape.dtype in FLOATS and \
        np.dtype(mask.shape.dtype).itemsize > np.dtype(dt).itemsize else dt
    bias = _bias(p, m, node, mask, S, T, past, nonpad, wide)
    prob, qk_out = _probabilities(p, m, node, qk, bias)
    y = p.add(m, "dot", [p.reshape(m, prob, [B, Nkv, G, S, T]), p.reshape(m, v, [B, Nkv, 1, T, Hv])])
    y = p.reshape(m, y, [B, N, S, Hv])
    if rank3:
        y = p.reshape(m, p.add(m, "transpose", [y], permutation=[0, 2, 1, 3]), [B, S, N * Hv])
    return [y, k, v, qk_out]
