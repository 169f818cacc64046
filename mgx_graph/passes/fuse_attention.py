"""fuse_attention: the decomposed attention of the decode exports (``models/smollm2.py``, ``llama.py``,
``gpt2.py``: torch's scaled dot-product attention as the ONNX exporter writes it) becomes one
``decode_attention`` instruction, on the gpu target one kernel instead of the KV-head repetition
copies, two batched GEMMs, the scale / mask kernel and the softmax.

Matched, from a ``softmax`` over the last axis of x [B, N, S, P] with S <= ``max_query_rows``::

    x      = scores + mask | mask + scores | where(c, scores, -inf) | where(c, -inf, scores) | scores
    scores = dot(qs, ks) [* c | / c]           c: a scalar literal (also behind a multibroadcast)
    qs     = q [* c | / c]                     q [B, N, S, H]
    ks     = kT [* c | / c]                    kT [B, N, H, P]:  kT[b, n, h, t] = K[b, n // G, t, h]
    out    = dot(p, vr)                        vr [B, N, P, Hv]: vr[b, n, t, :] = V[b, n // G, t, :]
    p      = softmax(x) | where(isnan(softmax(x)), 0, softmax(x))   (the second: ``nan_zero``)

K [B, Nkv, P, H] and V [B, Nkv, P, Hv] (Nkv dividing N, G = N / Nkv) are values that kT and vr reach
through views and ``contiguous`` copies only (the exports' ``repeat_kv``: unsqueeze, multibroadcast,
contiguous, reshape, and the transpose of K); the farthest such value whose index map is exactly the
one above is taken, the map being checked by evaluating the views on an array of element indices laid
out as the value (so which operand is transposed, the head grouping and every reshape are verified,
not assumed).  ``scale`` is the product of the matched scalar factors; the mask must broadcast to
[B, N, S, P] (no broadcast of the scores; a ``convert`` of it to q's type is read through: the op
rounds the mask to that type), and q, K, V share one type (float16 / float32).  The values
between the first dot and ``out`` may be read only inside the pattern; anything else is left alone,
as are patterns with an op named in ``exclude`` or whose K / V repetition spans more than 2**25
elements (the index check would be too large).  The ``where(c, ., -inf)`` forms get their additive
mask as a new ``where(c, 0, -inf)`` instruction (exact: a -inf mask hides the key, see
:mod:`mgx_graph.operators.decode_attention`).

The matched instructions that nothing else reads are removed.  Runs first in the ``fuse_kernels``
group (before ``fuse_reduce`` / ``fuse_pointwise``, which would otherwise take the softmax and the
scale / mask kernels apart from the dots).  ``MIGRAPHX_DISABLE_PASSES=fuse_attention`` skips it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape
from ..operators import make_op
from . import fusion
from .eliminate_dead_code import remove_unread

if TYPE_CHECKING:
    from ..ir import Instruction

MAX_QUERY_ROWS = 16
MAX_INDEX_ELEMENTS = 1 << 25
TYPES = ("float16", "float32")
COPIES = ("contiguous",)


def _scalar(ins):
    """The value of a one-element float literal (also seen through a multibroadcast), else None."""
    if ins.op.name == "multibroadcast" and ins.inputs:
        ins = ins.inputs[0]
    if ins.op.name != "@literal":
        return None
    v = ins.op.value
    return float(v.reshape(-1)[0]) if v.size == 1 and v.dtype.kind == "f" else None


def _lens(ins) -> tuple:
    return tuple(ins.shape.lens) if isinstance(ins.shape, Shape) else ()


def _peel(v):
    """``(x, c)`` when ``v`` is ``x * c``, ``c * x`` or ``x / c`` with ``c`` a finite scalar literal and x of
    v's lens and type (no broadcast); else ``(None, 1.0)``."""
    if v.op.name not in ("mul", "div") or len(v.inputs) != 2:
        return None, 1.0
    orders = ((0, 1), (1, 0)) if v.op.name == "mul" else ((0, 1),)
    for a, b in orders:
        x, c = v.inputs[a], _scalar(v.inputs[b])
        if c is None or not np.isfinite(c) or (v.op.name == "div" and c == 0):
            continue
        if _lens(x) == _lens(v) and x.shape.dtype == v.shape.dtype:
            return x, (c if v.op.name == "mul" else 1.0 / c)
    return None, 1.0


def _users(v) -> list:
    return list({id(c): c for c in v.outputs}.values())


def _non_overlapping(shape: Shape) -> bool:
    dims = sorted((s, d) for d, s in zip(shape.lens, shape.strides) if d > 1)
    span = 1
    for s, d in dims:
        if s < span:
            return False
        span = s * d
    return True


@dataclass
class Match:
    """A matched attention: the ``decode_attention`` inputs and attributes, ``out`` (the value dot it
    replaces), ``where_mask`` ((condition, -inf first) of a where-form mask) and ``members`` (the
    instructions that may be read only inside the pattern)."""

    q: Instruction
    k: Instruction
    v: Instruction
    out: Instruction
    scale: float
    nan_zero: bool
    mask: Instruction | None = None
    where_mask: tuple | None = None
    members: list = field(default_factory=list)


class FuseAttention(fusion.FusionPass):
    """The pass (see the module docstring); ``exclude``: op names never fused (host ops);
    ``max_query_rows``: the most query rows S a fused attention takes (longer prompts keep their GEMMs).
    Rewrites in place; raises nothing of its own."""

    name = "fuse_attention"

    def __init__(self, exclude=(), max_query_rows: int = MAX_QUERY_ROWS):
        super().__init__(exclude)
        self.max_query_rows = int(max_query_rows)
        self._maps: dict = {}

    def apply_module(self, m, ctx=None) -> None:
        if m.program is None:
            return
        for ins in list(m.instructions):
            if ins.module is m and ins.op.name == "softmax":
                found = self.match(ins)
                if found is not None:
                    self._rewrite(m, found)

    # -- matching ------------------------------------------------------------------------------------
    def match(self, sm) -> Match | None:
        """The :class:`Match` of the attention around softmax instruction ``sm``, or None."""
        x = sm.inputs[0]
        if len(_lens(x)) != 4 or x.shape.dtype not in TYPES or sm.op.axis % 4 != 3:
            return None
        B, N, S, P = _lens(x)
        if S > self.max_query_rows:
            return None
        tail = self._guard(sm)
        if tail is None:
            return None
        p, nan_zero, guard = tail
        users = _users(p)
        if len(users) != 1 or users[0].op.name != "dot" or users[0].inputs[0] is not p or users[0].inputs[1] is p:
            return None
        out = users[0]
        scores, mask, wm = self._mask(x)
        if scores is None:
            return None
        members = [sm] + guard + ([x] if scores is not x else [])
        d1, scale = scores, 1.0
        pre, c = _peel(scores)
        if pre is not None and pre.op.name == "dot":
            members.append(scores)
            d1, scale = pre, c
        if d1.op.name != "dot" or _lens(d1) != (B, N, S, P):
            return None
        members.append(d1)
        q, cq = _peel(d1.inputs[0])
        kt, ck = _peel(d1.inputs[1])
        q, kt = q or d1.inputs[0], kt or d1.inputs[1]
        found = self._operands(q, kt, out, (B, N, S, P))
        if found is None:
            return None
        k, v = found
        if mask is not None and mask.op.name == "convert" and mask.shape.dtype == q.shape.dtype \
                and mask.inputs[0].shape.dtype in TYPES:
            mask = mask.inputs[0]  # the op rounds the mask to q's type itself
        return self._accept(Match(q, k, v, out, scale * cq * ck, nan_zero, mask, wm, members))

    def _accept(self, mt: Match) -> Match | None:
        """``mt`` when its members are read only inside the pattern and no op of it is excluded."""
        inside = {id(i) for i in mt.members} | {id(mt.out)}
        for ins in mt.members:
            if ins.op.name in self.exclude or any(id(c) not in inside for c in ins.outputs) \
                    or "bind_param" in ins.meta or ins.meta.get("on_host"):
                return None
        if self.exclude & {"decode_attention", "dot"}:
            return None
        return mt

    @staticmethod
    def _guard(sm):
        """``(p, nan_zero, members)``: what the value dot reads after the softmax (the softmax itself, or
        the exporter's ``where(isnan(s), 0, s)``), or None."""
        users = _users(sm)
        if len(users) == 1 and users[0].op.name == "dot":
            return sm, False, []
        if len(users) != 2:
            return None
        isn = next((u for u in users if u.op.name == "isnan"), None)
        wh = next((u for u in users if u.op.name == "where"), None)
        if isn is None or wh is None or isn.inputs != [sm] or len(wh.inputs) != 3:
            return None
        cond, zero, keep = wh.inputs
        if cond is not isn or keep is not sm or _scalar(zero) != 0.0 or _lens(wh) != _lens(sm) \
                or wh.shape.dtype != sm.shape.dtype or _users(isn) != [wh]:
            return None
        return wh, True, [isn, wh]

    @staticmethod
    def _mask(x):
        """``(scores, mask, where_mask)`` of the softmax input ``x``: the scores chain, an additive mask
        (or None) and a where-form mask (or None); ``(None, None, None)`` when x is neither."""
        lens = _lens(x)
        if x.op.name == "add" and len(x.inputs) == 2:
            for a, b in (x.inputs, x.inputs[::-1]):
                if a is b or _lens(a) != lens or b.shape.dtype not in TYPES or a.shape.dtype != x.shape.dtype:
                    continue
                off = 4 - len(_lens(b))
                pre = _peel(a)[0]
                if off >= 0 and all(d in (1, lens[i + off]) for i, d in enumerate(_lens(b))) and \
                        (a.op.name == "dot" or (pre is not None and pre.op.name == "dot")):
                    return a, b, None
            return None, None, None
        if x.op.name == "where" and len(x.inputs) == 3:
            cond, a, b = x.inputs
            if _scalar(b) == -np.inf and _lens(a) == lens and cond is not a:
                return a, None, (cond, False)
            if _scalar(a) == -np.inf and _lens(b) == lens and cond is not b:
                return b, None, (cond, True)
            return None, None, None
        return x, None, None

    def _operands(self, q, kt, out, lens):
        """``(K, V)`` bases of the dots' operands (see the module docstring), or None."""
        B, N, S, P = lens
        vr = out.inputs[1]
        if len(_lens(q)) != 4 or len(_lens(kt)) != 4 or len(_lens(vr)) != 4:
            return None
        H, Hv = _lens(q)[3], _lens(vr)[3]
        if _lens(q) != (B, N, S, H) or _lens(kt) != (B, N, H, P) or _lens(vr) != (B, N, P, Hv) \
                or _lens(out) != (B, N, S, Hv):
            return None
        k = self._base(kt, N, P, H, True)
        v = self._base(vr, N, P, Hv, False)
        if k is None or v is None or k.shape.lens[1] != v.shape.lens[1]:
            return None
        if not (q.shape.dtype == k.shape.dtype == v.shape.dtype) or q.shape.dtype not in TYPES:
            return None
        return k, v

    # -- the K / V bases ------------------------------------------------------------------------------
    def _base(self, val, N, L, D, transposed):
        """The farthest value [B, Nkv, L, D] behind ``val`` (through views and copies) whose repetition
        to N heads (transposed for K) is exactly ``val``, or None."""
        chain = [val]
        while (chain[-1].op.is_view or chain[-1].op.name in COPIES) and len(chain[-1].inputs) == 1 \
                and chain[-1].op.name != "get_tuple_elem" and chain[-1].inputs[0].module is val.module:
            chain.append(chain[-1].inputs[0])
        B = _lens(val)[0]
        for k in range(len(chain) - 1, -1, -1):
            c = chain[k]
            lens = _lens(c)
            if len(lens) != 4 or (lens[0], lens[2], lens[3]) != (B, L, D) or lens[1] < 1 or N % lens[1] \
                    or c.shape.dtype != val.shape.dtype or not _non_overlapping(c.shape):
                continue
            if self._same_map(chain[:k + 1][::-1], N, transposed):
                return c
        return None

    def _same_map(self, path, N, transposed) -> bool:
        """Whether the views / copies ``path[1:]`` applied to ``path[0]`` [B, Nkv, L, D] give the
        repetition of its heads to N (transposed: [B, N, D, L]).  Evaluated on element indices (cached
        by the path's ops and shapes)."""
        key = (tuple((str(i.op), str(i.shape)) for i in path), N, transposed)
        hit = self._maps.get(key)
        if hit is not None:
            return hit
        base, val = path[0].shape, path[-1].shape
        ok = False
        if max(base.elements(), val.elements()) <= MAX_INDEX_ELEMENTS:
            ok = _index_map_is_repeat(path, N, transposed)
        self._maps[key] = ok
        return ok

    # -- rewriting ------------------------------------------------------------------------------------
    def _rewrite(self, m, mt: Match) -> None:
        dt = mt.members[0].shape.dtype
        op = make_op("decode_attention", scale=mt.scale, mask=int(mt.mask is not None or mt.where_mask is not None),
                     nan_zero=int(mt.nan_zero))
        shapes = [mt.q.shape, mt.k.shape, mt.v.shape]
        if mt.mask is not None:
            shapes.append(mt.mask.shape)
        elif mt.where_mask is not None:
            shapes.append(Shape(dt, mt.where_mask[0].shape.lens))
        try:
            op.compute_shape(shapes)
        except ShapeError:  # not expected after the match; the pattern is left as it is
            return
        mask = mt.mask
        if mt.where_mask is not None:
            cond, neg_first = mt.where_mask
            zero = m.insert_literal(mt.out, np.zeros((), dt))
            ninf = m.insert_literal(mt.out, np.array(-np.inf, dt))
            args = [cond, ninf, zero] if neg_first else [cond, zero, ninf]
            mask = m.insert_instruction(mt.out, make_op("where"), args)
        fused = m.insert_instruction(mt.out, op, [mt.q, mt.k, mt.v] + ([mask] if mask is not None else []))
        m.replace_instruction(mt.out, fused)
        remove_unread(m, mt.out)


def _index_map_is_repeat(path, N, transposed) -> bool:
    base = path[0].shape
    B, nkv, L, D = base.lens
    dt = np.int32 if base.element_space() < 2 ** 31 else np.int64
    buf = np.full(max(base.element_space(), 1), -1, dt)
    arr = np.lib.stride_tricks.as_strided(buf, base.lens, [s * buf.itemsize for s in base.strides])
    arr[...] = np.arange(base.elements(), dtype=dt).reshape(base.lens)
    for ins in path[1:]:
        if ins.op.is_view:
            arr = ins.op.view(np, arr, ins.shape.with_type(dt))
        else:
            arr = np.ascontiguousarray(arr)
    want = np.arange(base.elements(), dtype=dt).reshape(base.lens)[:, np.arange(N) // (N // nkv)]
    if transposed:
        want = want.transpose(0, 1, 3, 2)
    return tuple(arr.shape) == tuple(want.shape) and bool(np.array_equal(arr, want))

