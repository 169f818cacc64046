"""``decode_attention``: ``softmax(scale * Q K^T + mask) V`` over a KV cache whose heads are shared by
groups of query heads (GQA), as one instruction: what the ``fuse_attention`` pass makes of the
decomposed attention of the decode exports (dot with a repeated / broadcast KV head, scale, mask add,
softmax, the exporter's ``where(isnan(p), 0, p)``, dot).

With G = N / Nkv and float32 arithmetic on inputs read in their own type::

    x[b, n, s, t] = softcap(scale * sum_h q[b, n, s, h] * k[b, n // G, t, h]) + round(mask[b, n, s, t])
    out[b, n, s, :] = sum_t softmax_t(x)[b, n, s, t] * v[b, n // G, t, :]

``softcap(y) = c * tanh(y / c)`` when ``softcap`` = c > 0 (else y); ``round`` rounds a mask value to q's
type (a float32 mask of a float16 attention is what ``add(scores, convert(mask))`` adds).  A key whose
mask value is -inf is *hidden*: its K and V rows are never used (the gpu kernels may load them, never
add them), so a NaN or infinity in an unused cache row never reaches the result, and a zero weight adds
nothing.  A row that sees no key, or has a NaN
or +inf logit, is NaN, as the softmax of the unfused program gives; with ``nan_zero`` it is 0, as the
exporter's ``where(isnan(p), 0, p)`` after the softmax gives.  The gpu target runs one kernel
(:mod:`.attention_gpu`, two with a cache of more than 256 rows); the ref target the numpy code below.

Source: the scaled dot-product attention of torch.nn.functional.scaled_dot_product_attention (what the
exports decompose), with the KV-head repetition of transformers' ``repeat_kv``.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape
from .base import Operation, check_inputs, register_op

HALF_FLOATS = ("float16", "float32")


@register_op
class DecodeAttention(Operation):
    """Inputs: q [B, N, S, H], k [B, Nkv, P, H], v [B, Nkv, P, Hv] (any strides; float16 or float32, one
    type), and with ``mask`` an additive mask (float16 / float32, rank <= 4, broadcast to [B, N, S, P]
    with numpy's rules; its values rounded to q's type).  ``scale``: the factor of Q K^T (as given: no
    default from H); ``softcap`` > 0 caps the scaled logits; ``nan_zero``: rows that would be NaN give 0.
    Output: [B, N, S, Hv], q's type.  Raises ShapeError naming the input at fault (rank, type, a Nkv
    that does not divide N, mismatched P / H / B, a mask that does not broadcast)."""

    name = "decode_attention"

    def __init__(self, scale=1.0, softcap=0.0, mask=0, nan_zero=0):
        super().__init__(scale=float(scale), softcap=float(softcap), mask=int(mask), nan_zero=int(nan_zero))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 3 + self.mask)
        q, k, v = inputs[:3]
        if q.ndim != 4 or q.dtype not in HALF_FLOATS:
            raise ShapeError(f"{self.name}: query {q.brief()} must be float16 / float32 [B, N, S, H]")
        B, N, S, H = q.lens
        if k.ndim != 4 or k.dtype != q.dtype or k.lens[0] != B or k.lens[3] != H or k.lens[1] < 1 or N % k.lens[1]:
            raise ShapeError(f"{self.name}: key {k.brief()} must be {q.dtype} [{B}, Nkv dividing {N}, P, {H}] "
                             f"for query {q.brief()}")
        if v.ndim != 4 or v.dtype != q.dtype or tuple(v.lens[:3]) != tuple(k.lens[:3]):
            raise ShapeError(f"{self.name}: value {v.brief()} must be {q.dtype} [{', '.join(map(str, k.lens[:3]))}, "
                             f"Hv] for key {k.brief()}")
        if self.mask:
            mk, full = inputs[3], (B, N, S, k.lens[2])
            off = 4 - mk.ndim
            if mk.dtype not in HALF_FLOATS or off < 0 or \
                    any(d not in (1, full[i + off]) for i, d in enumerate(mk.lens)):
                raise ShapeError(f"{self.name}: mask {mk.brief()} must be float16 / float32 and broadcast to "
                                 f"{list(full)}")
        return Shape(q.dtype, [B, N, S, v.lens[3]])

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        q, k, v = args[:3]
        B, N, S, H = q.shape
        Nkv, P, Hv = k.shape[1], k.shape[2], v.shape[3]
        G = N // Nkv
        f32, inf = np.float32, np.float32(np.inf)
        qg = q.astype(f32).reshape(B, Nkv, G * S, H)  # query heads grouped by their KV head (a copy)
        x = xp.matmul(qg, k.astype(f32).transpose(0, 1, 3, 2)).reshape(B, N, S, P)
        x *= f32(self.scale)
        if self.softcap > 0:
            x = f32(self.softcap) * xp.tanh(x / f32(self.softcap))
        if self.mask:
            mk = xp.broadcast_to(args[3].astype(q.dtype).astype(f32), (B, N, S, P))
            x += mk
            x = xp.where(mk == -inf, -inf, x)  # a hidden key stays hidden whatever its score
        bad = xp.isnan(x) | (x == inf)
        row_bad = bad.any(axis=-1)
        x = xp.where(bad, -inf, x)
        m = x.max(axis=-1, keepdims=True)
        empty = m[..., 0] == -inf
        p = xp.exp(x - xp.where(m == -inf, f32(0), m))  # hidden keys: exp(-inf) = 0
        den = p.sum(axis=-1, keepdims=True)
        vf = v.astype(f32)
        pg = p.reshape(B, Nkv, G * S, P)
        if bool(xp.isfinite(vf).all()):
            o = xp.matmul(pg, vf)
        else:  # a zero weight adds nothing, even against a non-finite value
            w = pg[..., None]
            o = (w * xp.where(w > 0, vf[:, :, None], f32(0))).sum(axis=-2)
        o = o.reshape(B, N, S, Hv) / xp.where(den == 0, f32(1), den)
        fill = f32(0) if self.nan_zero else f32(np.nan)
        o = xp.where((row_bad | empty)[..., None], fill, o)
        out[...] = o.astype(out.dtype)

    def launches(self, inputs, output):
        return 16  # the array-library evaluation (the gpu kernel reports its own)
