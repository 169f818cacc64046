"""Rotary embeddings and attention over a KV cache: com.microsoft::RotaryEmbedding, ONNX RotaryEmbedding
(opset 23), com.microsoft::GroupQueryAttention and com.microsoft::MultiHeadAttention (what
onnxruntime-genai's model builder and onnxruntime's transformer optimizer emit for LLM and BERT-style
exports).

GroupQueryAttention becomes: (rotary_embedding on Q and K) -> kv_cache_update for present_key and
present_value (in place into past_key / past_value when those outputs are bound to them) ->
grouped_attention.  The present length is ``max(total_sequence_length, past length)``: static when
total_sequence_length is a constant (onnxruntime-genai computes it from the attention mask's shape);
otherwise the program is specialized for ``max(past length, value)``, so a decode loop over a
fixed-length cache compiles once.

onnxruntime contrib op spec: https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.fold import FOLD_LIMIT
from .op_parser import attr, parser
from .parse_contrib import MS, pad_inputs, unsupported, wanted_outputs
from .parse_constant import filled, iota


def _shape_err(p, msg) -> ShapeError:
    return ShapeError(f"node '{p.node_name}' ({p.node.op_type}): {msg}")


def _iota(p, m, n: int, lead: int = 0):
    """int64 ``0 .. n-1`` (with ``lead`` leading unit dims): a literal up to FOLD_LIMIT elements."""
    return iota(p, m, n, [1] * lead + [n])


# ---------------------------------------------------------------------------------------------------
# RotaryEmbedding
# ---------------------------------------------------------------------------------------------------
def _rotary_4d(p, m, node, x, cos, num_heads: int, rotary_dim: int):
    """(x as 4-D, heads_axis, original 3-D lens or None): a 3-D [B, S, N*H] input becomes [B, S, N, H]
    (N from ``num_heads``, else H from the cos cache: full rotation); 4-D inputs are [B, N, S, H]."""
    if x.shape.ndim == 4:
        return x, 1, None
    if x.shape.ndim != 3:
        raise _shape_err(p, f"input {x.shape.brief()} must be 3-D [B, S, hidden] or 4-D [B, N, S, H]")
    B, S, D = x.shape.lens
    if num_heads:
        H = D // num_heads
        if H == 0 or D % num_heads:
            raise _shape_err(p, f"'num_heads' = {num_heads} does not divide the hidden size {D} of input "
                                f"{x.shape.brief()}")
    else:
        if rotary_dim:
            raise _shape_err(p, "num_heads must be given with rotary_embedding_dim for a 3-D input")
        H = 2 * cos.shape.lens[-1]
        if H == 0 or D % H:
            raise _shape_err(p, f"hidden size {D} is not a multiple of the head size {H} (twice the last dim of "
                                f"cos_cache {cos.shape.brief()})")
    return p.reshape(m, x, [B, S, D // H, H]), 2, list(x.shape.lens)


def _rotary(p, m, x4, heads_axis, cos, sin, pos, interleaved, rotary_dim):
    args = [x4, cos, sin] + ([pos] if pos is not None else [])
    return p.add(m, "rotary_embedding", args, interleaved=int(interleaved), rotary_dim=int(rotary_dim),
                 heads_axis=heads_axis)


@parser("RotaryEmbedding", domain=MS)
def _parse_rotary_ms(p, m, node, ins):
    """com.microsoft::RotaryEmbedding (input, position_ids [B, S] or [1] (an offset: positions
    offset .. offset+S-1), cos_cache, sin_cache; interleaved, num_heads, rotary_embedding_dim; ``scale``
    has no effect, as in onnxruntime)."""
    x, pos, cos, sin = pad_inputs(ins, 4)
    if x is None or pos is None or cos is None or sin is None:
        raise p.err("needs the input, position_ids, cos_cache and sin_cache inputs")
    if attr(node, "is_packed_batching", 0):
        raise unsupported(p, node, "is_packed_batching")
    R = attr(node, "rotary_embedding_dim", 0)
    x4, axis, lens3 = _rotary_4d(p, m, node, x, cos, attr(node, "num_heads", 0), R)
    S = x4.shape.lens[1] if axis == 2 else x4.shape.lens[2]
    if pos.shape.dtype != "int64":
        raise _shape_err(p, f"position_ids {pos.shape.brief()} must be int64")
    if pos.shape.elements() == 1 and pos.shape.ndim == 1:
        pos = p.add(m, "add", [p.reshape(m, pos, [1, 1]), _iota(p, m, S, lead=1)])
    y = _rotary(p, m, x4, axis, cos, sin, pos, attr(node, "interleaved", 0), R)
    return p.reshape(m, y, lens3) if lens3 else y


@parser("RotaryEmbedding")
def _parse_rotary_onnx(p, m, node, ins):
    """ONNX RotaryEmbedding (opset 23: X, cos_cache, sin_cache, position_ids; interleaved, num_heads,
    rotary_embedding_dim).  Without position_ids the caches are [B, S, R/2] per token."""
    if p.opset < 23:
        raise unsupported(p, node, "RotaryEmbedding is an ai.onnx op from opset 23")
    x, cos, sin, pos = pad_inputs(ins, 4)
    if x is None or cos is None or sin is None:
        raise p.err("needs the X, cos_cache and sin_cache inputs")
    R = attr(node, "rotary_embedding_dim", 0)
    x4, axis, lens3 = _rotary_4d(p, m, node, x, cos, attr(node, "num_heads", 0), R)
    y = _rotary(p, m, x4, axis, cos, sin, pos, attr(node, "interleaved", 0), R)
    return p.reshape(m, y, lens3) if lens3 else y


# ---------------------------------------------------------------------------------------------------
# GroupQueryAttention
# ---------------------------------------------------------------------------------------------------
_GQA_INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
               "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale",
               "q_norm_weight", "k_norm_weight", "query_seqlens")
_QK_NORMS = ("q_norm_weight", "k_norm_weight")


def _check_gqa_variant(p, node, ins) -> None:
    """UnsupportedOpError for the GroupQueryAttention variants this frontend does not implement."""
    given = [n for n, i in zip(_GQA_INPUTS[12:], ins[12:]) if i is not None and n not in _QK_NORMS]
    if given:
        raise unsupported(p, node, f"input(s) {', '.join(given)} (quantized KV cache, padded chunks)")
    if (ins[14] is None) != (ins[15] is None):
        raise p.err("q_norm_weight and k_norm_weight come together (paired Q / K RMS normalization)")
    for name, ok in (("kv_cache_bit_width", (0,)), ("sliding_window_cache", (0,)), ("qk_output", (0,))):
        if attr(node, name, 0) not in ok:
            raise unsupported(p, node, f"attribute {name}={attr(node, name)}")
    for name in ("k_quant_type", "v_quant_type"):
        v = attr(node, name, b"NONE")
        if (v.decode() if isinstance(v, bytes) else v) != "NONE":
            raise unsupported(p, node, f"attribute {name}={v!r} (a quantized KV cache)")
    if wanted_outputs(node, 4)[3]:
        raise unsupported(p, node, "output output_qk")


def _split_qkv(p, m, q, k, v, N, Nkv):
    """(q [B, S, N, H], k, v [B, S, Nkv, H], H) from separate or packed (key and value absent) inputs."""
    if q.shape.ndim != 3:
        raise _shape_err(p, f"query {q.shape.brief()} must be 3-D [B, S, hidden]")
    B, S, D = q.shape.lens
    if k is None:
        if v is not None:
            raise p.err("key and value must both be given, or both be absent (packed QKV)")
        H = D // (N + 2 * Nkv)
        if H * (N + 2 * Nkv) != D:
            raise _shape_err(p, f"packed QKV width {D} is not (num_heads {N} + 2 * kv_num_heads {Nkv}) * head size")
        cut = [0, N * H, (N + Nkv) * H, D]
        q, k, v = (p.add(m, "slice", [q], axes=[2], starts=[a], ends=[b]) for a, b in zip(cut, cut[1:]))
    else:
        H = D // N
        if v is None or H * N != D:
            raise _shape_err(p, f"query width {D} is not num_heads {N} * head size, or value is missing")
        for what, t in (("key", k), ("value", v)):
            if tuple(t.shape.lens) != (B, S, Nkv * H):
                raise _shape_err(p, f"{what} {t.shape.brief()} must be [{B}, {S}, {Nkv * H}] "
                                    f"(kv_num_heads {Nkv} * head size {H})")
    return (p.reshape(m, q, [B, S, N, H]), p.reshape(m, k, [B, S, Nkv, H]), p.reshape(m, v, [B, S, Nkv, H]), H)


def _total_length(p, total, L: int, exact: bool) -> int:
    """total_sequence_length at compile time: a constant; else the value this program is specialized
    for: ``max(L, value)`` (enough for the present length when a past buffer of L rows exists) unless
    the exact value is needed."""
    if total.op.name == "@literal":
        return int(np.asarray(total.op.value).reshape(-1)[0])
    if L and not exact:
        return int(p.specialize(total, f"at_least:{L}", "total_sequence_length"))
    return int(np.asarray(p.const(total, "total_sequence_length")).reshape(-1)[0])


def _past_len(p, pk, pv, B, Nkv, H, dtype) -> int:
    if (pk is None) != (pv is None):
        raise p.err("past_key and past_value must both be given or both be absent")
    if pk is None:
        return 0
    for what, t in (("past_key", pk), ("past_value", pv)):
        s = t.shape
        if s.ndim != 4 or (s.lens[0], s.lens[1], s.lens[3]) != (B, Nkv, H) or s.lens[2] != pk.shape.lens[2] \
                or s.dtype != dtype:
            raise _shape_err(p, f"{what} {s.brief()} must be {dtype} [{B}, {Nkv}, L, {H}] (BNSH)")
    return pk.shape.lens[2]


def _positions(p, m, seqlens, B, S):
    """(kv_len [B], start [B], pos [B, S]) int64: valid cache rows after the step (seqlens_k + 1), the
    row of the first new token (max(kv_len - S, 0)) and each query row's position.  Computed once per
    module for every GroupQueryAttention node that reads the same seqlens_k (every layer of a decoder):
    later nodes reuse the instructions of the first."""
    if seqlens is None or seqlens.shape.dtype != "int32" or tuple(seqlens.shape.lens) != (B,):
        raise _shape_err(p, f"seqlens_k {seqlens.shape.brief() if seqlens is not None else 'missing'} must "
                            f"be int32 [{B}]")
    shared = p.__dict__.setdefault("_gqa_positions", {})
    key = (id(m), id(seqlens), S)
    if key in shared and shared[key][0] is seqlens:
        return shared[key][1]
    one = p.lit(m, np.array(1, np.int64))
    kv_len = p.add(m, "add", [p.add(m, "convert", [seqlens], target_type="int64"), one])
    start = p.add(m, "max", [p.add(m, "sub", [kv_len, p.lit(m, np.array(S, np.int64))]),
                             p.lit(m, np.array(0, np.int64))])
    pos = p.add(m, "add", [p.add(m, "unsqueeze", [start], axes=[1]), _iota(p, m, S, lead=1)])
    shared[key] = (seqlens, (kv_len, start, pos))
    return kv_len, start, pos


def _rotary_positions(p, m, node, pos_ids, pos, S: int, total: int):
    """The positions GroupQueryAttention rotates by: its own (``pos``), or position_ids: as given for a
    decode step, ``position_ids[0, 0] + s`` for the first prompt (as onnxruntime)."""
    if pos_ids is None:
        return pos
    if pos_ids.shape.dtype != "int64" or pos_ids.shape.ndim != 2 or pos_ids.shape.lens[1] != S:
        raise _shape_err(p, f"position_ids {pos_ids.shape.brief()} must be int64 [B, {S}]")
    if S == 1:
        return pos_ids
    if S != total:
        raise unsupported(p, node, "position_ids with a multi-token step after the first prompt")
    first = p.add(m, "slice", [pos_ids], axes=[0, 1], starts=[0, 0], ends=[1, 1])
    return p.add(m, "add", [first, _iota(p, m, S, lead=1)])


def _qk_norms(p, m, node, q4, k4, qn, kn, H: int):
    """``q4`` and ``k4`` ([B, S, heads, H]) each RMS-normalized over its head (``qk_norm_epsilon``, default
    1e-6) and scaled by ``q_norm_weight`` / ``k_norm_weight`` [H]."""
    for name, w in (("q_norm_weight", qn), ("k_norm_weight", kn)):
        if tuple(w.shape.lens) != (H,) or w.shape.dtype != q4.shape.dtype:
            raise _shape_err(p, f"{name} {w.shape.brief()} must be [{H}] of the query's type {q4.shape.dtype}")
    eps = float(attr(node, "qk_norm_epsilon", 1e-6))
    return tuple(p.add(m, "rms_norm", [p.contiguous(m, x), w], axis=-1, epsilon=eps) for x, w in ((q4, qn), (k4, kn)))


@parser("GroupQueryAttention", domain=MS)
def _parse_gqa(p, m, node, ins):
    """com.microsoft::GroupQueryAttention: outputs output [B, S, N*H], present_key / present_value
    [B, Nkv, max(total_sequence_length, past length), H] (BNSH)."""
    ins = pad_inputs(ins, len(_GQA_INPUTS))
    _check_gqa_variant(p, node, ins)
    q, k, v, pk, pv, seqlens, total, cos, sin, pos_ids, bias, sink = ins[:12]
    N, Nkv = attr(node, "num_heads", 0), attr(node, "kv_num_heads", 0)
    if q is None or total is None or N <= 0 or Nkv <= 0 or N % Nkv:
        raise p.err(f"needs query, seqlens_k and total_sequence_length, and num_heads ({N}) a positive "
                    f"multiple of kv_num_heads ({Nkv})")
    causal, window = attr(node, "causal", 1), attr(node, "local_window_size", -1)
    if not causal and window > 0:
        raise p.err("local_window_size needs causal=1")
    B, S = q.shape.lens[:2]
    q4, k4, v4, H = _split_qkv(p, m, q, k, v, N, Nkv)
    if ins[14] is not None:  # Qwen3's Q / K norms: an RMSNorm of each head, before the rotation
        q4, k4 = _qk_norms(p, m, node, q4, k4, ins[14], ins[15], H)
    L = _past_len(p, pk, pv, B, Nkv, H, q.shape.dtype)
    T = _total_length(p, total, L, exact=pos_ids is not None and S > 1)
    P = max(T, L)
    if P < S:
        raise _shape_err(p, f"the present length {P} (max of total_sequence_length {T} and the past length {L}) "
                            f"is shorter than the {S} new tokens")
    kv_len, start, pos = _positions(p, m, seqlens, B, S)
    rot_k = {}  # the keys' rotation, done by their cache write (one kernel)
    if attr(node, "do_rotary", 0):
        if cos is None or sin is None:
            raise p.err("do_rotary needs cos_cache and sin_cache")
        rp = _rotary_positions(p, m, node, pos_ids, pos, S, T)
        inter, R = attr(node, "rotary_interleaved", 0), 2 * cos.shape.lens[-1]
        q4 = _rotary(p, m, q4, 2, cos, sin, rp, inter, R)
        rot_k = dict(tables=[cos, sin, rp], rotary=1, interleaved=int(inter), rotary_dim=int(R))
    if S > 1:
        k4 = k4 if rot_k else p.contiguous(m, k4)
        v4 = p.contiguous(m, v4)
    rows = _iota(p, m, P)
    present = []
    for past, new, rot in ((pk, k4, rot_k), (pv, v4, {})):
        rot = dict(rot)
        args = ([past] if past is not None else []) + [new, start, rows] + rot.pop("tables", [])
        present.append(p.add(m, "kv_cache_update", args, present_len=P, has_past=int(past is not None), **rot))
    extra = [i for i in (bias, sink) if i is not None]
    out = p.add(m, "grouped_attention", [q4] + present + [pos, kv_len, rows] + extra,
                scale=attr(node, "scale", 0.0), softcap=attr(node, "softcap", 0.0), local_window=window, causal=causal,
                smooth=attr(node, "smooth_softmax", 0), bias=int(bias is not None), sink=int(sink is not None))
    return [out] + present


# ---------------------------------------------------------------------------------------------------
# MultiHeadAttention
# ---------------------------------------------------------------------------------------------------
def _mha_qkv(p, m, q, k, v, bias, N):
    """(q [B, S, N, H], k [B, N, L, H], v [B, N, L, Hv]; k and v may be strided views) from the supported
    layouts: 3-D q / k / v (+ bias [D + D + Dv]), packed QKV [B, S, N, 3, H], packed KV [B, L, N, 2, H],
    or a 4-D BNSH key / value (cross attention over cached keys)."""
    if q.shape.ndim == 5:
        if k is not None or v is not None or bias is not None:
            raise p.err("packed QKV [B, S, N, 3, H] takes no key, value or bias")
        B, S, n, three, H = q.shape.lens
        if n != N or three != 3:
            raise _shape_err(p, f"packed QKV {q.shape.brief()} must be [B, S, {N}, 3, H]")
        parts = [p.reshape(m, p.add(m, "slice", [q], axes=[3], starts=[j], ends=[j + 1]), [B, S, N, H])
                 for j in range(3)]
        return parts[0], p.add(m, "transpose", [parts[1]], permutation=[0, 2, 1, 3]), \
            p.add(m, "transpose", [parts[2]], permutation=[0, 2, 1, 3])
    if q.shape.ndim != 3 or k is None:
        raise _shape_err(p, "query must be 3-D [B, S, D] with a key, or packed QKV [B, S, N, 3, H]")
    B, S, D = q.shape.lens
    H = D // N
    if H * N != D:
        raise _shape_err(p, f"query width {D} is not a multiple of num_heads {N}")
    if bias is not None:
        if k.shape.ndim != 3 or v is None or v.shape.ndim != 3:
            raise p.err("bias needs 3-D query, key and value")
        Dv = v.shape.lens[2]
        if tuple(bias.shape.lens) != (2 * D + Dv,):
            raise _shape_err(p, f"bias {bias.shape.brief()} must be [{2 * D + Dv}] (query + key + value widths)")
        cut = [0, D, 2 * D, 2 * D + Dv]
        q, k, v = (p.add(m, "add", [t, p.add(m, "slice", [bias], axes=[0], starts=[a], ends=[b])])
                   for t, a, b in zip((q, k, v), cut, cut[1:]))
    q4 = p.reshape(m, q, [B, S, N, H])
    if k.shape.ndim == 5:
        if v is not None or k.shape.lens[2:] != (N, 2, H) or k.shape.lens[0] != B:
            raise _shape_err(p, f"packed KV {k.shape.brief()} must be [{B}, L, {N}, 2, {H}] with no value")
        L = k.shape.lens[1]
        kv = [p.reshape(m, p.add(m, "slice", [k], axes=[3], starts=[j], ends=[j + 1]), [B, L, N, H]) for j in (0, 1)]
        return q4, p.add(m, "transpose", [kv[0]], permutation=[0, 2, 1, 3]), \
            p.add(m, "transpose", [kv[1]], permutation=[0, 2, 1, 3])
    if v is None or k.shape.ndim != v.shape.ndim:
        raise p.err("key and value must both be given with the same rank")
    if k.shape.ndim == 4:  # BNSH already
        if k.shape.lens[0] != B or k.shape.lens[1] != N or k.shape.lens[3] != H:
            raise _shape_err(p, f"key {k.shape.brief()} must be [{B}, {N}, L, {H}] (BNSH)")
        return q4, k, v
    L, Dv = k.shape.lens[1], v.shape.lens[2]
    if k.shape.lens != (B, L, D) or v.shape.lens[:2] != (B, L) or Dv % N:
        raise _shape_err(p, f"key {k.shape.brief()} / value {v.shape.brief()} must be [{B}, L, {D}] / [{B}, L, "
                            f"a multiple of {N}]")
    k4 = p.add(m, "transpose", [p.reshape(m, k, [B, L, N, H])], permutation=[0, 2, 1, 3])
    v4 = p.add(m, "transpose", [p.reshape(m, v, [B, L, N, Dv // N])], permutation=[0, 2, 1, 3])
    return q4, k4, v4


def _mha_present(p, m, past, new):
    """The BNSH cache the attention reads: past and new concatenated over the sequence, or new."""
    if past is None:
        return p.contiguous(m, new)
    s, n = past.shape, new.shape
    if s.ndim != 4 or (s.lens[0], s.lens[1], s.lens[3]) != (n.lens[0], n.lens[1], n.lens[3]) or s.dtype != n.dtype:
        raise _shape_err(p, f"past {s.brief()} must be {n.dtype} [{n.lens[0]}, {n.lens[1]}, P, {n.lens[3]}]")
    return p.add(m, "concat", [past, new], axis=2)


def _mha_mask(p, m, kpm, B, S, T):
    """(kv_len [B] int64, key mask bool or None) from key_padding_mask: lengths [B], or 0/1 [B, T] /
    [B, S, T] (0 hides the key)."""
    full = filled(p, m, (B,), T, np.int64)
    if kpm is None:
        return full, None
    lens = tuple(kpm.shape.lens)
    if lens == (B,):
        return p.add(m, "convert", [kpm], target_type="int64"), None
    if lens not in ((B, T), (B, S, T)):
        raise _shape_err(p, f"key_padding_mask {kpm.shape.brief()} must be [{B}], [{B}, {T}] or [{B}, {S}, {T}]")
    zero = p.lit(m, np.zeros((), kpm.shape.np_dtype))
    return full, p.add(m, "not", [p.add(m, "equal", [kpm, zero])])


def _mha_positions(p, m, B: int, S: int, P: int):
    """The int64 [B, S] positions ``P .. P+S-1`` of every batch row (a literal up to FOLD_LIMIT elements)."""
    if B * S <= FOLD_LIMIT:
        return p.lit(m, np.broadcast_to(P + np.arange(S, dtype=np.int64), (B, S)).copy())
    row = p.add(m, "add", [_iota(p, m, S, lead=1), p.lit(m, np.array(P, np.int64))])
    return p.contiguous(m, p.add(m, "multibroadcast", [row], out_lens=[B, S]))


@parser("MultiHeadAttention", domain=MS)
def _parse_mha(p, m, node, ins):
    """com.microsoft::MultiHeadAttention (query, key, value, bias, key_padding_mask, attention_bias,
    past_key, past_value): outputs output [B, S, N*Hv], present_key / present_value (past and new keys
    concatenated, BNSH).  Masked keys are dropped (mask_filter_value only matters for rows with every
    key masked: their output is then the mean of the values, as with onnxruntime's -10000)."""
    q, k, v, bias, kpm, ab, pk, pv, past_len, beams = pad_inputs(ins, 10)
    if past_len is not None or beams is not None:
        raise unsupported(p, node, "past_sequence_length / cache_indirection (shared buffers, beam search)")
    if wanted_outputs(node, 4)[3]:
        raise unsupported(p, node, "output qk")
    N = attr(node, "num_heads", 0)
    if q is None or N <= 0:
        raise p.err("needs the query input and num_heads > 0")
    if (pk is None) != (pv is None):
        raise p.err("past_key and past_value must both be given or both be absent")
    q4, k4, v4 = _mha_qkv(p, m, q, k, v, bias, N)
    if pk is not None and k is not None and k.shape.ndim == 4:
        raise p.err("a BNSH key (cached cross-attention keys) takes no past_key / past_value")
    present = [_mha_present(p, m, pk, k4), _mha_present(p, m, pv, v4)]
    B, S = q4.shape.lens[:2]
    T = present[0].shape.lens[2]
    P = pk.shape.lens[2] if pk is not None else 0
    kv_len, key_mask = _mha_mask(p, m, kpm, B, S, T)
    pos = _mha_positions(p, m, B, S, P)
    extra = [i for i in (ab, key_mask) if i is not None]
    out = p.add(m, "grouped_attention", [q4] + present + [pos, kv_len, _iota(p, m, T)] + extra,
                scale=attr(node, "scale", 0.0), causal=attr(node, "unidirectional", 0), bias=int(ab is not None),
                key_mask=int(key_mask is not None))
    return [out] + present
