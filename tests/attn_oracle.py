"""A float64 numpy oracle of attention over a KV cache (the tests' reference for ``decode_attention``,
``grouped_attention`` and ``decode_attention.cu``), written plainly: repeat the KV heads, score, mask,
softmax row by row, weight the values."""
from __future__ import annotations

import numpy as np


def attention(q, k, v, scale, mask=None, visible=None, softcap=0.0, sink=None, smooth=False, empty="nan",
              nan_zero=False):
    """``out [B, N, S, Hv]`` for q [B, N, S, H], k [B, Nkv, P, H], v [B, Nkv, P, Hv].

    mask: additive, broadcast to [B, N, S, P] (a -inf entry hides the key); visible: bool, broadcast to
    [B, N, S, P] (False hides the key); sink: a logit per query head [N] joining the softmax (smooth: a
    zero logit); empty: what a row seeing no key gives ("nan", "zero" or "mean": the mean of all P value
    rows); nan_zero: a row with a NaN or +inf logit gives 0 instead of NaN."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    B, N, S, _ = q.shape
    G = N // k.shape[1]
    kr, vr = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    P, Hv = kr.shape[2], vr.shape[3]
    out = np.zeros((B, N, S, Hv))
    mk = np.zeros((B, N, S, P)) if mask is None else np.broadcast_to(np.asarray(mask, np.float64), (B, N, S, P))
    vis = np.ones((B, N, S, P), bool) if visible is None else np.broadcast_to(visible, (B, N, S, P))
    for b in range(B):
        for n in range(N):
            for s in range(S):
                keys = np.flatnonzero(vis[b, n, s] & (mk[b, n, s] != -np.inf))
                x = kr[b, n, keys] @ q[b, n, s] * scale
                if softcap > 0:
                    x = softcap * np.tanh(x / softcap)
                x = x + mk[b, n, s, keys]
                extra = None if sink is None and not smooth else (0.0 if sink is None else float(sink[n]))
                out[b, n, s] = _row(x, vr[b, n, keys], extra, vr[b, n], empty, nan_zero)
    return out


def _row(x, vals, extra, all_vals, empty, nan_zero):
    Hv = all_vals.shape[1]
    if np.any(np.isnan(x)) or np.any(x == np.inf):
        return np.zeros(Hv) if nan_zero else np.full(Hv, np.nan)
    if extra is not None:
        m = max(np.max(x, initial=-np.inf), extra)
        w = np.exp(x - m)
        return (w @ vals if len(x) else np.zeros(Hv)) / (w.sum() + np.exp(extra - m))
    if len(x) == 0 or np.all(x == -np.inf):
        if empty == "mean":
            return all_vals.mean(axis=0)
        return np.zeros(Hv) if empty == "zero" or nan_zero else np.full(Hv, np.nan)
    w = np.exp(x - x.max())
    return (w / w.sum()) @ vals
