"""Attention with a KV cache: the ops behind onnxruntime's com.microsoft::GroupQueryAttention and
MultiHeadAttention.

``kv_cache_update`` writes a step's keys (or values) into the cache at each batch entry's position
(in place into the past buffer when the present output is bound to it); ``grouped_attention`` computes
``softmax(scale * Q K^T (+ bias), masked) V`` for grouped heads: the G = num_heads / kv_num_heads query
heads that share a KV head are stacked into the rows of one GEMM, so K and V are never repeated.
Both are written against ``xp`` with preplanned workspaces (no allocation: capturable) and run their
GEMMs through ``ctx.matmul`` (vendor BLAS on the gpu target).

Source: onnxruntime ContribOperators.md (GroupQueryAttention, MultiHeadAttention) and onnxruntime's CPU
kernel (gqa_attention_base.h): a batch entry ``b`` holds ``kv_len[b] = seqlens_k[b] + 1`` tokens after
the step, its new tokens start at row ``past[b] = kv_len[b] - S`` (0 for the first prompt), query row
``s`` sits at position ``past[b] + s`` and sees keys ``t <= past[b] + s``, ``t < kv_len[b]`` and, with a
local window W, ``t > past[b] + s - W``.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape
from .base import Operation, check_inputs, register_op
from .gather_scatter import _same_buffer
from .normalization_contrib import FLOATS


def _check_index(name: str, what: str, v: Shape, lens) -> None:
    if v.dtype != "int64" or tuple(v.lens) != tuple(lens):
        raise ShapeError(f"{name}: {what} {v.brief()} must be int64 {list(lens)}")


@register_op
class KvCacheUpdate(Operation):
    """present [B, Nkv, P, H] = the past cache with this step's rows written at each batch entry's start.

    Inputs: past [B, Nkv, L, H] (L <= P; absent when ``has_past`` is 0), new [B, S, Nkv, H] (any strides
    when S is 1 or ``rotary`` is set, else standard layout), start [B] int64 (the cache row of each
    entry's first new token), rows [P] int64 (0, 1, ..., P-1); with ``rotary`` then cos, sin and
    position ids [B or 1, S] as :class:`~.rotary.RotaryEmbedding` takes them (``interleaved``,
    ``rotary_dim``): the new rows are rotated first (GroupQueryAttention's keys, rotated and written
    in one kernel).  Row t of entry b is ``new[b, t - start[b]]`` for ``start[b] <= t < start[b] + S``;
    otherwise ``past[b, :, t]`` for ``t < start[b]`` and 0 beyond.
    When the output is the past buffer itself (bound in place, ``inplace_ok``) only the new rows are
    written: the others keep their values (onnxruntime's shared past/present buffer).

    Raises ShapeError for inconsistent shapes; at run time on the ref target a start that does not
    leave room for the S new rows raises (an ExecutionError naming the instruction); the gpu target
    does not check (rows past P are dropped).
    """

    name = "kv_cache_update"
    inplace_ok = True
    alloc_free = True

    def __init__(self, present_len=0, has_past=1, rotary=0, interleaved=0, rotary_dim=0):
        super().__init__(present_len=int(present_len), has_past=int(has_past), rotary=int(rotary),
                         interleaved=int(interleaved), rotary_dim=int(rotary_dim))

    def rotation(self):
        """The :class:`~.rotary.RotaryEmbedding` applied to the new rows (``rotary`` set)."""
        from .rotary import RotaryEmbedding

        return RotaryEmbedding(interleaved=self.interleaved, rotary_dim=self.rotary_dim, heads_axis=2)

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 3 + self.has_past + 3 * self.rotary)
        past = inputs[0] if self.has_past else None
        new, start, rows = inputs[self.has_past:self.has_past + 3]
        if new.ndim != 4 or new.dtype not in FLOATS:
            raise ShapeError(f"{self.name}: new rows {new.brief()} must be float [B, S, Nkv, H]")
        B, S, Nkv, H = new.lens
        P = self.present_len
        if past is not None and (past.dtype != new.dtype or past.ndim != 4 or past.lens[2] > P
                                 or (past.lens[0], past.lens[1], past.lens[3]) != (B, Nkv, H)):
            raise ShapeError(f"{self.name}: past {past.brief()} does not match [{B}, {Nkv}, <= {P}, {H}] "
                             f"{new.dtype} of the new rows {list(new.lens)}")
        _check_index(self.name, "start", start, (B,))
        _check_index(self.name, "rows", rows, (P,))
        if self.rotary:
            self.rotation().compute_shape([new] + list(inputs[-3:]))
        return Shape(new.dtype, [B, Nkv, P, H])

    def _rot_inputs(self, inputs):
        return [inputs[self.has_past]] + list(inputs[-3:])

    def workspace(self, inputs, output):
        new = inputs[self.has_past]
        B, S, Nkv, H = new.lens
        P = self.present_len
        ws = [Shape("int64", [B, P]), Shape("bool", [B, P]), Shape("bool", [B, P])]
        if S > 1:
            ws += [Shape("int64", [B, P]), Shape(new.dtype, [B, P, Nkv, H])]
        if self.rotary:  # the rotated rows (standard layout), then the rotation's own scratch
            rot = self._rot_inputs(inputs)
            ws += [Shape(new.dtype, new.lens)] + self.rotation().workspace(rot, Shape(new.dtype, new.lens))
        return ws

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        past = args[0] if self.has_past else None
        new, start, rows = args[self.has_past:self.has_past + 3]
        B, S = new.shape[0], new.shape[1]
        P = out.shape[2]
        if self.rotary:
            k = 3 + 2 * (S > 1)
            self.rotation().compute(ctx, ws[k], [new] + list(args[-3:]), ws[k + 1:])
            new = ws[k]
        rel, is_new, tmp = ws[:3]
        if xp is np and B and (start.min() < 0 or start.max() + S > P):
            bad = int(start.max())
            raise IndexError(f"a cache entry starting at row {bad} has no room for {S} new row(s) in a present "
                             f"length of {P} (seqlens_k + 1 exceeds the cache length)")
        xp.subtract(rows, start[:, None], out=rel)  # row index relative to the first new row
        xp.greater_equal(rel, 0, out=is_new)
        xp.less(rel, S, out=tmp)
        xp.logical_and(is_new, tmp, out=is_new)
        if past is None or not _same_buffer(out, past):
            out.fill(0)
            if past is not None and past.shape[2]:
                L = past.shape[2]
                xp.less(rel[:, :L], 0, out=tmp[:, :L])
                xp.copyto(out[:, :, :L], past, where=tmp[:, None, :L, None])
        if S == 1:
            src = new.transpose(0, 2, 1, 3)  # [B, Nkv, 1, H]: broadcast over the rows
        else:
            idx, gathered = ws[3], ws[4]
            xp.clip(rel, 0, S - 1, out=idx)
            for b in range(B):
                xp.take(new[b], idx[b], axis=0, out=gathered[b])
            src = gathered.transpose(0, 2, 1, 3)
        xp.copyto(out, src, where=is_new[:, None, :, None])

    def launches(self, inputs, output):
        new = inputs[self.has_past]
        B, S = new.lens[:2]
        rot = self.rotation().launches(self._rot_inputs(inputs), None) if self.rotary else 0
        return 5 + (2 if self.has_past else 1) + (1 + B if S > 1 else 0) + rot


@register_op
class Attention(Operation):
    """``out[B, S, N*H] = softmax(mask(scale * Q K^T -> softcap -> + bias)) V`` over a KV cache, with the
    G = N / Nkv query heads of one KV head stacked into the rows of one GEMM (K / V never repeated).

    Inputs: q [B, S, N, H] (any strides), k [B, Nkv, P, H], v [B, Nkv, P, Hv] (standard layout), pos
    [B, S] int64 (the position of each query row), kv_len [B] int64 (valid cache rows per entry), rows
    [P] int64 (0 .. P-1); then, per the flags, bias (broadcastable to [B, N, S, T], T <= P: added to the
    first T keys), sink [N] (a per-head logit added to the softmax denominator) and key_mask (bool
    [B, P] or [B, S, P]: False hides the key).  Key t is seen by query (b, s) when ``t < kv_len[b]``,
    the key mask allows it and, with ``causal``, ``t <= pos[b, s]`` and, with a ``local_window`` W > 0,
    ``t > pos[b, s] - W``.  ``scale`` 0 means 1/sqrt(H); ``softcap`` > 0 applies
    ``softcap * tanh(x / softcap)``; ``smooth`` adds a zero logit (exp(-max)) to the denominator.
    The softmax runs in float32; the GEMMs in the input type.  Output: [B, S, N*Hv], q's type.
    Raises ShapeError for inconsistent shapes, a non-standard k / v layout or bad index inputs.
    """
    uses_blas = True  # its kernel calls ctx.matmul: the queue's BLAS handle must exist before a capture

    name = "grouped_attention"
    alloc_free = True

    def __init__(self, scale=0.0, softcap=0.0, local_window=-1, causal=1, smooth=0, bias=0, sink=0, key_mask=0):
        super().__init__(scale=float(scale), softcap=float(softcap), local_window=int(local_window),
                         causal=int(causal), smooth=int(smooth), bias=int(bias), sink=int(sink),
                         key_mask=int(key_mask))

    def optional_inputs(self, items):
        """(bias, sink, key_mask) from the inputs after the first six (None for an absent one)."""
        it = iter(items[6:])
        return tuple(next(it) if flag else None for flag in (self.bias, self.sink, self.key_mask))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 6 + self.bias + self.sink + self.key_mask)
        q, k, v, pos, kv_len, rows = inputs[:6]
        if q.ndim != 4 or q.dtype not in FLOATS:
            raise ShapeError(f"{self.name}: query {q.brief()} must be float [B, S, N, H]")
        B, S, N, H = q.lens
        if k.ndim != 4 or v.ndim != 4 or k.lens[:3] != v.lens[:3] or k.dtype != q.dtype or v.dtype != q.dtype \
                or k.lens[0] != B or k.lens[3] != H or N % max(k.lens[1], 1) or not (k.standard() and v.standard()):
            raise ShapeError(f"{self.name}: key {k.brief()} / value {v.brief()} do not match query {q.brief()} "
                             f"(want standard-layout [{B}, Nkv dividing {N}, P, {H}] / [{B}, Nkv, P, Hv])")
        P = k.lens[2]
        _check_index(self.name, "positions", pos, (B, S))
        _check_index(self.name, "kv_len", kv_len, (B,))
        _check_index(self.name, "rows", rows, (P,))
        b, sink, km = self.optional_inputs(inputs)
        if b is not None and (b.ndim != 4 or b.dtype not in FLOATS or b.lens[0] not in (1, B)
                              or b.lens[1] not in (1, N) or b.lens[2] != S or b.lens[3] > P):
            raise ShapeError(f"{self.name}: attention bias {b.brief()} must be [{B} or 1, {N} or 1, {S}, <= {P}]")
        if sink is not None and (sink.lens != (N,) or sink.dtype not in FLOATS):
            raise ShapeError(f"{self.name}: head sink {sink.brief()} must be float [{N}]")
        if km is not None and (km.dtype != "bool" or tuple(km.lens) not in ((B, P), (B, S, P))):
            raise ShapeError(f"{self.name}: key mask {km.brief()} must be bool [{B}, {P}] or [{B}, {S}, {P}]")
        return Shape(q.dtype, [B, S, N * v.lens[3]])

    def workspace(self, inputs, output):
        q, k, v = inputs[:3]
        B, S, N, H = q.lens
        Nkv, P = k.lens[1], k.lens[2]
        G = N // Nkv
        ws = [Shape(q.dtype, [B, Nkv, G, S, H]),       # q grouped by KV head
              Shape(q.dtype, [B, Nkv, G, S, P]),       # scores, then probabilities (input type)
              Shape("float32", [B, Nkv, G, S, 1]),     # row max
              Shape("float32", [B, Nkv, G, S, 1]),     # row sum
              Shape("bool", [B, S, P]), Shape("bool", [B, S, P]), Shape("int64", [B, S]),
              Shape(q.dtype, [B, Nkv, G, S, v.lens[3]])]  # probabilities @ V
        if q.dtype != "float32":
            ws.append(Shape("float32", [B, Nkv, G, S, P]))  # float32 softmax
        return ws

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        q, k, v, pos, kv_len, rows = args[:6]
        bias, sink, key_mask = self.optional_inputs(args)
        B, S, N, H = q.shape
        Nkv, P, Hv = k.shape[1], k.shape[2], v.shape[3]
        G = N // Nkv
        qg, sc, mx, den, keep, tmp, lo, ov = ws[:8]
        pf = ws[8] if len(ws) > 8 else sc
        if xp is np and B and kv_len.max() > P:
            raise IndexError(f"seqlens_k + 1 = {int(kv_len.max())} exceeds the cache length {P}")
        # q [B, S, Nkv, G, H] -> [B, Nkv, G, S, H]
        q5 = xp.lib.stride_tricks.as_strided(
            q, (B, S, Nkv, G, H), (q.strides[0], q.strides[1], G * q.strides[2], q.strides[2], q.strides[3]))
        xp.copyto(qg, q5.transpose(0, 2, 3, 1, 4))
        ctx.matmul(qg.reshape(B * Nkv, G * S, H), k.reshape(B * Nkv, P, H).transpose(0, 2, 1),
                   sc.reshape(B * Nkv, G * S, P))
        if pf is not sc:
            xp.copyto(pf, sc)
        xp.multiply(pf, np.float32(self.scale or 1.0 / np.sqrt(H)), out=pf)
        if self.softcap > 0:
            xp.multiply(pf, np.float32(1.0 / self.softcap), out=pf)
            xp.tanh(pf, out=pf)
            xp.multiply(pf, np.float32(self.softcap), out=pf)
        if bias is not None:
            pn = pf.reshape(B, N, S, P)[..., :bias.shape[3]]
            xp.add(pn, bias, out=pn)
        self._mask(xp, pf, pos, kv_len, rows, key_mask, keep, tmp, lo)
        self._softmax(ctx, pf, sink, mx, den)
        if pf is not sc:
            xp.copyto(sc, pf)
        ctx.matmul(sc.reshape(B * Nkv, G * S, P), v.reshape(B * Nkv, P, Hv), ov.reshape(B * Nkv, G * S, Hv))
        xp.copyto(out.reshape(B, S, Nkv, G, Hv), ov.transpose(0, 3, 1, 2, 4))

    def _mask(self, xp, pf, pos, kv_len, rows, key_mask, keep, tmp, lo):
        """Scores of the keys a query row does not see -> the lowest float32 (exp underflows to 0)."""
        xp.less(rows, kv_len[:, None, None], out=keep)
        if key_mask is not None:
            xp.logical_and(keep, key_mask if key_mask.ndim == 3 else key_mask[:, None, :], out=keep)
        if self.causal:
            xp.less_equal(rows, pos[:, :, None], out=tmp)
            xp.logical_and(keep, tmp, out=keep)
        if self.local_window > 0:
            xp.subtract(pos, self.local_window, out=lo)
            xp.greater(rows, lo[:, :, None], out=tmp)
            xp.logical_and(keep, tmp, out=keep)
        xp.logical_not(keep, out=tmp)
        xp.copyto(pf, np.finfo(np.float32).min, where=tmp[:, None, None])

    def _softmax(self, ctx, pf, sink, mx, den):
        """In-place softmax over the last axis of pf [B, Nkv, G, S, P]; a sink logit per head (or 0 with
        ``smooth``) joins the max and the denominator."""
        xp = ctx.xp
        B, Nkv, G = pf.shape[:3]
        ctx.reduce("max", pf, (4,), mx)
        s = None
        if sink is not None:
            s = sink.reshape(1, Nkv, G, 1, 1)
        elif self.smooth:
            s = np.float32(0)
        if s is not None:
            xp.maximum(mx, s, out=mx)
        xp.subtract(pf, mx, out=pf)
        xp.exp(pf, out=pf)
        ctx.reduce("sum", pf, (4,), den)
        if s is not None:  # + exp(sink - max), formed in mx
            xp.subtract(s, mx, out=mx)
            xp.exp(mx, out=mx)
            xp.add(den, mx, out=den)
        xp.true_divide(pf, den, out=pf)

    def launches(self, inputs, output):
        n = 2 + 2 + 1 + 2 + 2 + 5 + 1 + 2  # copies, GEMMs, scale, mask, softmax, output
        n += 3 * (self.softcap > 0) + self.bias + 2 * self.causal + 3 * (self.local_window > 0)
        n += 4 * (self.sink or self.smooth) + 2 * (inputs[0].dtype != "float32") + self.key_mask
        return n
