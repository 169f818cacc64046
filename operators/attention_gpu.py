"""Attention over a KV cache as one kernel on the gpu target (flash-decoding), for ``decode_attention``
and the one-row steps of ``grouped_attention``.

``decode_attention.cu`` is compiled at run time through CuPy (``cupy.RawModule``: NVRTC on CUDA, hipRTC
on ROCm, the path of the fused kernels, :func:`.fused_gpu.compiled_function`), once per configuration
(element types, head sizes, rows per block, load widths, mask / length / sink options): the sizes and
strides are kernel arguments (``mgx_attn_lanes`` also compiles them in, below).  A :class:`Spec` says what one instruction computes in the kernel's terms;
:func:`make_plan` picks the launch:

* one block per (batch entry, KV head, group of up to ``ROWS`` query rows, split of the cache rows),
  ``NT`` = 256 threads, keys in chunks of 256 (one per thread for the scores);
* the G = N / Nkv query heads of a KV head share its block, so each K / V row is read once for all of
  them, straight from the cache (no repeated copy of the KV heads);
* a cache longer than ``SPLIT_ROWS`` rows is split into at most ``MAX_SPLITS`` ranges of whole chunks
  (partial max / sum / accumulated values per split in a float32 workspace
  ``[B * N * S, splits, Hv + 3]``), merged by a second kernel, ``mgx_attn_combine``: two launches,
  nothing allocated, both capturable;
* K / V rows whose head dim is contiguous are read with 16-byte loads when every row start is aligned
  (checked per launch on the data pointers: a misaligned buffer runs the element-wise variant);
* few query rows per KV head (G * S <= ``WARP_ROWS``, a value head size that is a power of two up to
  256 with G * S * max(Hv / 32, 1) <= ``WARP_ACC``; any key head size up to 256; every option) run ``mgx_attn_warp`` instead of ``mgx_attn_split``
  (unless ``MIGRAPHX_ATTN_WARP=0``): one block per (batch entry, KV head, split) of ``WARPS`` 32-lane
  groups (``MIGRAPHX_ATTN_WARPS``), each walking its own range of keys with shuffle reductions and no
  barrier in the key loop (the splits and the merge kernel as above).  Up to ``EARLY_K_ROWS`` cache rows
  it loads a key's K row together with its mask values (one memory latency less; a masked key's K row is
  then read, not used).  With ``V_EARLY`` (on unless ``MIGRAPHX_ATTN_V_EARLY=0``) each lane also loads
  the V rows it will add for a 32-key step before the scores, into registers, so the V reads overlap the
  K reads instead of waiting for the softmax weights (another memory latency less); a lane holds at
  most ``V_EARLY_ELEMS`` V elements (its rows of a step times its value columns), else the plan loads
  V after the weights as before.  SmolLM2-135M's decode step (G = 3, S = 1, H = Hv = 64, float16, 256
  cache rows) runs it as grid (3, 1) of 256 threads, 8 value columns per lane, 8 V rows held per lane
  and step (7.4 µs per call on the H200 before ``V_EARLY``, as the block kernel).

Specs whose key and value head sizes are equal and a power of two of 16-byte loads run ``mgx_attn_lanes``
(unless ``MIGRAPHX_ATTN_LANES=0``): one block per query row, each key's dot product and value sum split over
``H / (16 / itemsize)`` lanes that hold their query columns in registers, so a lane's work per key is one
16-byte load's worth of columns instead of the whole head.  A warp reads the K / V rows and mask values of
``LANES_STEPS`` key steps before any arithmetic, its offsets are 32-bit where they fit, and the sizes
and the K / V / mask strides are compiled in (the launch checks the runtime strides against them): what a
warp issues before its loads are in flight is most of its time at this size.  On SmolLM2's shape (H200,
2026-12-01, the kernel alone in a graph of 200 launches, the harness at the end of
``bench/results/h200_logs/47_*``) it takes 3.57 µs per launch against ``mgx_attn_warp``'s 6.58.

The launch checks the arrays' strides against the planned ones (a mismatch raises ValueError instead
of reading wrong elements), as the fused kernels do.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace

import numpy as np

from ..ir.shape import Shape
from ..settings import active
from .gpu_kernel import HEADER, GpuKernel, compiled_function, precompile

NT = 256  # threads per block = keys per chunk
SPLIT_ROWS = 256  # a longer cache is split over blocks (flash-decoding); MIGRAPHX_ATTN_SPLIT_ROWS overrides
MAX_SPLITS = 64
MAX_HEAD = 256  # largest key / value head size the kernel takes
MAX_ROWS = 16  # query rows per block (fewer with wide value loads: ROWS * VV <= 64 accumulators)
SMEM_LIMIT = 48 * 1024  # static shared memory of one block
WARP_ROWS = 16  # query rows per KV head (G * S) the warp kernel takes
WARPS = 8  # 32-lane groups per block of the warp kernel (fewer when its shared memory needs it); MIGRAPHX_ATTN_WARPS
MAX_WARPS = 32  # 1024 threads
WARP_ACC = 64  # value accumulators per lane of the warp kernel (rows * value columns per lane)
EARLY_K_ROWS = 2048  # up to this cache length the warp kernel loads K rows before their mask values
V_EARLY_ELEMS = 64  # V elements a lane of the warp kernel may hold in registers for V_EARLY (else V_EARLY 0)
LANES_WARPS = 8  # warps per block of mgx_attn_lanes (one block per query row)
LANES_STEPS = 8  # steps of 32 / LC keys a warp of mgx_attn_lanes reads at once (one chunk)
CTYPES = {"float16": "__half", "float32": "float"}
_HERE = os.path.dirname(os.path.abspath(__file__))

@dataclass(frozen=True)
class Spec:
    """One attention instruction in the kernel's terms (sizes, element strides, options).

    q [B, N, S, H], k [B, NKV, P, H], v [B, NKV, P, HV] and the output [B, N, S, HV] as
    (batch, head, row, column) strides; ``mask``: (b, n, s, t) strides of an additive mask / bias
    (0 for a broadcast dim) over the first ``mask_len`` keys (``mask_round``: its values rounded to ``dtype``
    first); ``key_mask``: (b, s, t) strides of a bool
    key mask; ``pos``: (b, s) strides of the query positions (causal / window); ``lengths``: a kv_len
    [B] input; ``sink_dtype``: a per-head sink logit [N]; ``smooth``: a zero logit in the denominator;
    ``empty``: what a row that sees no key gives (0 NaN, 1 zero, 2 the mean of all P values);
    ``nan_zero``: a row with a NaN or +inf logit gives 0 instead of NaN.
    """

    dtype: str
    B: int
    N: int
    NKV: int
    S: int
    P: int
    H: int
    HV: int
    q: tuple
    k: tuple
    v: tuple
    out: tuple
    scale: float
    softcap: float = 0.0
    mask_dtype: str | None = None
    mask: tuple = (0, 0, 0, 0)
    mask_len: int = 0
    mask_round: bool = False
    key_mask: tuple | None = None
    pos: tuple | None = None
    lengths: bool = False
    causal: bool = False
    window: int = 0
    sink_dtype: str | None = None
    smooth: bool = False
    empty: int = 0
    nan_zero: bool = False


def _row_width(dtype: str, cols: int, strides: tuple) -> int:
    """Elements per load of a K / V row (b, head, row, col strides): up to 16 bytes when the columns are
    contiguous and every row start stays aligned to the load; 0 when they are not contiguous."""
    if strides[3] != 1 and cols > 1:
        return 0
    w = 16 // np.dtype(dtype).itemsize
    while w > 1 and (cols % w or any(s % w for s in strides[:3])):
        w //= 2
    return w


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


@dataclass(frozen=True)
class Plan:
    """The launch of one :class:`Spec`: ``rows`` query rows per block in ``groups`` groups, ``splits``
    ranges of ``keys_per_split`` cache rows; ``vk`` / ``vv`` the K / V load widths of the vector variant
    (``kc`` / ``vc``: contiguous loads); the element-wise variant loads one element at a time.
    ``kernel``: ``mgx_attn_split``, ``mgx_attn_warp`` or ``mgx_attn_lanes``; for ``mgx_attn_warp``
    ``warps`` 32-lane groups per block, ``vv`` value columns per lane, loaded ``vw`` at a time by the vector
    variant, and ``v_early`` the V rows a lane loads per 32-key step before the scores (the kernel's ``VE``;
    0: ``V_EARLY`` off, V rows loaded once their weights are known); for ``mgx_attn_lanes`` ``warps`` warps
    per block, ``vk`` = ``vv`` the columns a lane holds (one 16-byte load) and ``branchless``: built without
    the branches that skip keyless chunks (:func:`lanes_branchless_setting`)."""

    spec: Spec
    rows: int
    groups: int
    splits: int
    keys_per_split: int
    vk: int
    vv: int
    kc: int
    vc: int
    kernel: str = "mgx_attn_split"
    warps: int = 0
    vw: int = 0
    v_early: int = 0
    branchless: int = 0
    scalars: tuple = field(default=(), compare=False)

    @property
    def block(self) -> tuple:
        return (32 * self.warps if self.kernel in ("mgx_attn_warp", "mgx_attn_lanes") else NT,)

    @property
    def grid(self) -> tuple:
        if self.kernel == "mgx_attn_lanes":  # one block per query row
            return (self.spec.B * self.spec.N * self.spec.S, self.splits)
        return (self.spec.B * self.spec.NKV * self.groups, self.splits)

    @property
    def combine_grid(self) -> tuple:
        return (self.spec.B * self.spec.N * self.spec.S,)

    @property
    def launches(self) -> int:
        return 1 + (self.splits > 1)

    def workspace(self) -> list:
        s = self.spec
        return [Shape("float32", [s.B * s.N * s.S, self.splits, s.HV + 3])] if self.splits > 1 else []

    def defines(self, vector: bool = True) -> dict:
        s = self.spec
        d = {"T": CTYPES[s.dtype], "MT": CTYPES[s.mask_dtype or s.dtype], "ST": CTYPES[s.sink_dtype or s.dtype],
             "H": s.H, "HV": s.HV, "ROWS": self.rows, "CT": min(NT, 32 * -(-s.HV // 32)),
             "HAS_MASK": int(s.mask_dtype is not None), "MASK_ROUND": int(s.mask_round), "HAS_LEN": int(s.lengths),
             "CAUSAL": int(s.causal), "WINDOW": int(s.window > 0), "KEY_MASK": int(s.key_mask is not None),
             "SINK": 1 if s.sink_dtype else 2 if s.smooth else 0, "SOFTCAP": int(s.softcap > 0),
             "EMPTY": s.empty, "NAN_ZERO": int(s.nan_zero)}
        if self.kernel == "mgx_attn_lanes":
            vk = self.vk
            d.update(ROWS=1, NT=32 * self.warps, NW=self.warps, VK=vk, KC=self.kc if vector else 0,
                     LC=s.H // vk, LU=LANES_STEPS, QS=s.S, QN=s.N, QG=s.N // s.NKV,
                     IDX="int" if _offsets_fit_int(self) else "long long", KST=s.k[2], VST=s.v[2], KSH=s.k[3],
                     VSH=s.v[3], QSH=s.q[3], MST=s.mask[3], BRANCHLESS=self.branchless, MGX_ATTN_BLOCK=0,
                     MGX_ATTN_WARP=0,
                     MGX_ATTN_LANES=1)
            return d
        if self.kernel == "mgx_attn_warp":
            vk, kc, vw, vc = (self.vk, self.kc, self.vw, self.vc) if vector else (1, 0, 1, 0)
            one = s.mask[1] == 0 and (s.S == 1 or s.mask[2] == 0)  # every row of a block reads one mask row
            d.update(NT=32 * self.warps, NW=self.warps, VK=vk, KC=kc, VV=self.vv, VW=vw, VC=vc,
                     LPR=s.HV // self.vv, VB=4 if self.rows <= 8 else 2, MASK_ONE=int(one),
                     K_EARLY=int(s.P <= EARLY_K_ROWS), V_EARLY=int(self.v_early > 0), VE=max(self.v_early, 1),
                     MGX_ATTN_BLOCK=0, MGX_ATTN_WARP=1)
            return d
        vk, vv, kc, vc = (self.vk, self.vv, self.kc, self.vc) if vector else (1, 1, 0, 0)
        nhg = s.HV // vv
        nkg = NT // nhg
        d.update(NT=NT, TPR=_pow2_floor(NT // self.rows), VK=vk, VV=vv, KC=kc, VC=vc, NHG=nhg, NKG=nkg,
                 RED=max(NT, nkg * s.HV), MGX_ATTN_BLOCK=1, MGX_ATTN_WARP=0)
        return d

    def shared_bytes(self, vector: bool = True) -> int:
        d = self.defines(vector)
        if self.kernel == "mgx_attn_lanes":
            return 4 * d["NW"] * (d["HV"] + 3)
        if self.kernel == "mgx_attn_warp":
            return 4 * d["ROWS"] * (d["H"] + d["NW"] * (d["HV"] + 2)) + 24 * d["ROWS"] + 4 * d["NW"]
        return 4 * (d["ROWS"] * (d["H"] + NT + 4) + d["RED"]) + 40 * d["ROWS"] + NT + 16

    def source(self, vector: bool = True) -> str:
        """The kernel source of this plan (``vector``: the 16-byte-load variant)."""
        body = "#define MGX_ATTN_CONFIG 1\n" + "".join(f"#define {k} {v}\n" for k, v in self.defines(vector).items())
        return HEADER + body + kernel_file()

    def split_args(self, arrays: dict, out, part) -> tuple:
        """Arguments of ``mgx_attn_split`` / ``mgx_attn_warp`` (:attr:`kernel`, one signature): the arrays
        (``q``, ``k``, ``v`` and, when the spec has them, ``mask``, ``key_mask``, ``pos``, ``kv_len``,
        ``sink``; an absent one is passed as q, never read), ``out``, the workspace ``part`` (``out`` with
        one split), then the sizes and strides."""
        q = arrays["q"]
        ptrs = tuple(q if arrays.get(r) is None else arrays[r] for r in
                     ("q", "k", "v", "mask", "key_mask", "pos", "kv_len", "sink"))
        return ptrs + (out, out if part is None else part) + self.scalars[0]

    def combine_args(self, arrays: dict, out, part) -> tuple:
        """Arguments of ``mgx_attn_combine``."""
        sink = arrays.get("sink")
        return (part, arrays["v"], arrays["q"] if sink is None else sink, out) + self.scalars[1]


def _offsets_fit_int(p: Plan) -> bool:
    """Whether every element offset ``mgx_attn_lanes`` forms for ``p`` (the last element of each input and
    output through its strides, a key row up to 64 past the cache, a chunk's step of the K / V / mask pointers,
    the workspace) is below 2^31: then the kernel computes them in 32 bits (``IDX int``)."""
    s = p.spec
    km, pos = s.key_mask or (0, 0, 0), s.pos or (0, 0)
    step = LANES_STEPS * (32 // (s.H // p.vk))  # keys a chunk moves the pointers by (LU * KPI)

    def last(lens, strides):
        return sum((n - 1) * abs(st) for n, st in zip(lens, strides))

    P = s.P + 64
    ends = [last((s.B, s.N, s.S, s.H), s.q), last((s.B, s.NKV, P, s.H), s.k), last((s.B, s.NKV, P, s.HV), s.v),
            last((s.B, s.N, s.S, P), s.mask), last((s.B, s.S, P), km), last((s.B, s.S), pos),
            last((s.B, s.N, s.S, s.HV), s.out), s.B * s.N * s.S * p.splits * (s.HV + 3), P * p.splits,
            step * max(abs(s.k[2]), abs(s.v[2]), abs(s.mask[3]))]
    return max(ends) < 2 ** 31 - 1


def _scalars(p: Plan) -> tuple:
    s = p.spec
    km = s.key_mask or (0, 0, 0)
    pos = s.pos or (0, 0)
    i64 = [s.N, s.NKV, s.S, s.P, s.mask_len, p.groups, p.keys_per_split, s.window, *s.q, *s.k, *s.v, *s.mask,
           *km, *pos, *s.out]
    split = tuple(np.int64(x) for x in i64) + (np.float32(s.scale), np.float32(s.softcap or 1.0))
    comb = tuple(np.int64(x) for x in (s.N, s.NKV, s.S, s.P, p.splits, *s.v, *s.out))
    return split, comb


def unsupported(spec: Spec) -> str:
    """Why the kernel cannot run ``spec`` ('' when it can)."""
    s = spec
    if s.dtype not in CTYPES or (s.mask_dtype or s.dtype) not in CTYPES or (s.sink_dtype or s.dtype) not in CTYPES:
        return f"types {s.dtype} / {s.mask_dtype} / {s.sink_dtype} (float16 and float32 only)"
    if not (1 <= s.H <= MAX_HEAD and 1 <= s.HV <= MAX_HEAD):
        return f"head sizes {s.H} / {s.HV} (1 .. {MAX_HEAD})"
    if s.P < 1 or s.B < 1 or s.S < 1 or s.N < 1 or s.NKV < 1 or s.N % s.NKV:
        return f"sizes B={s.B} N={s.N} Nkv={s.NKV} S={s.S} P={s.P}"
    return ""


def split_rows_setting() -> int:
    """Cache rows one block walks before the cache is split over blocks: ``MIGRAPHX_ATTN_SPLIT_ROWS``
    (the compile's setting, :func:`~mgx_graph.settings.active`) or ``SPLIT_ROWS``; at least 1."""
    return max(1, active().attn_split_rows)


def warp_kernel_setting() -> bool:
    """``MIGRAPHX_ATTN_WARP`` (the compile's setting, :func:`~mgx_graph.settings.active`): the warp kernel
    for the specs it takes (off: ``mgx_attn_split`` for every spec)."""
    return active().attn_warp


def warps_setting() -> int:
    """Warps (32-lane groups) per block of ``mgx_attn_warp``: ``MIGRAPHX_ATTN_WARPS`` (the compile's setting,
    :func:`~mgx_graph.settings.active`; default ``WARPS``), clamped to 1 .. ``MAX_WARPS`` and rounded down
    to a power of two (the planner then halves it while the block's shared memory exceeds ``SMEM_LIMIT``)."""
    return _pow2_floor(min(max(active().attn_warps, 1), MAX_WARPS))


def lanes_setting() -> bool:
    """``MIGRAPHX_ATTN_LANES`` (the compile's setting, :func:`~mgx_graph.settings.active`): ``mgx_attn_lanes``
    for the specs it takes (:func:`lanes_unsupported`; off: ``mgx_attn_warp`` / ``mgx_attn_split`` as before)."""
    return active().attn_lanes


def lanes_unsupported(spec: Spec) -> str:
    """Why ``mgx_attn_lanes`` does not take ``spec`` ('' when it does): key and value head sizes must be equal
    and split into a power of two of 16-byte loads (``H / (16 / itemsize)`` lanes per key, at most 32)."""
    vk = 16 // np.dtype(spec.dtype).itemsize
    lc = spec.H // vk if spec.H % vk == 0 else 0
    if spec.H != spec.HV or lc < 1 or lc > 32 or lc & (lc - 1):
        return f"head sizes {spec.H} / {spec.HV} (equal, {vk} times a power of two up to 32)"
    return ""


def lanes_branchless_setting() -> bool:
    """``MIGRAPHX_ATTN_LANES_BRANCHLESS`` (the compile's setting, :func:`~mgx_graph.settings.active`):
    ``mgx_attn_lanes`` compiled without the branches that skip a chunk or a warp without a visible key
    (``BRANCHLESS``: the default; the skipped work has zero weight, and without the branches the compiler
    issues each chunk's V loads with its K loads: SmolLM2-135M's fp16 decode step 0.4952 vs 0.5013 ms/token
    on an H200, bench/results/h200_logs/50; off: the branches kept)."""
    return active().attn_lanes_branchless


def _lanes_plan(spec: Spec, splits: int, kps: int, wk: int, wv: int) -> Plan:
    """The ``mgx_attn_lanes`` launch: one block per query row of ``LANES_WARPS`` warps, 16-byte loads
    (``kc``: the vector variant's K and V rows are contiguous and aligned for them)."""
    vk = 16 // np.dtype(spec.dtype).itemsize
    kc = int(wk == vk and wv == vk)
    return Plan(spec, 1, spec.N // spec.NKV * spec.S, splits, kps, vk, vk, kc, kc, "mgx_attn_lanes", LANES_WARPS,
                vk, branchless=int(lanes_branchless_setting()))


def v_early_setting() -> bool:
    """``MIGRAPHX_ATTN_V_EARLY`` (the compile's setting, :func:`~mgx_graph.settings.active`): ``mgx_attn_warp``
    loads a step's V rows together with its K rows where the registers allow (:func:`v_early_rows`; off: V
    rows loaded after the weights, every plan)."""
    return active().attn_v_early


def v_early_rows(HV: int, vv: int, warps: int, kps: int) -> int:
    """V rows one lane of ``mgx_attn_warp`` holds per 32-key step with ``V_EARLY`` (the kernel's ``VE``):
    the lane takes every (32 / LPR)-th key of a step (LPR = ``HV / vv`` lanes per V row), and a step has
    at most min(32, ceil(kps / warps)) keys (a warp's share of a split of ``kps`` keys), so
    ceil(that / (32 / LPR)) rows, at most LPR; 0 (``V_EARLY`` off) when those rows' ``vv`` columns are
    more than ``V_EARLY_ELEMS`` elements or :func:`v_early_setting` is off."""
    lpr = HV // vv
    step = min(32, -(-kps // warps))
    rows = min(lpr, -(-step // (32 // lpr)))
    return rows if v_early_setting() and rows * vv <= V_EARLY_ELEMS else 0


def warp_unsupported(spec: Spec) -> str:
    """Why ``mgx_attn_warp`` does not take ``spec`` ('' when it does): more than ``WARP_ROWS`` query
    rows per KV head, a value head size that is not a power of two up to ``MAX_HEAD``, or more than
    ``WARP_ACC`` value accumulators per lane (rows * Hv / 32)."""
    s = spec
    R = (s.N // s.NKV) * s.S
    if R > WARP_ROWS:
        return f"{R} query rows per KV head (at most {WARP_ROWS})"
    if s.HV & (s.HV - 1) or s.HV > MAX_HEAD:
        return f"value head size {s.HV} (a power of two up to {MAX_HEAD})"
    if R * max(s.HV // 32, 1) > WARP_ACC:
        return f"{R} rows of {s.HV} values ({WARP_ACC} accumulators per lane)"
    return ""


def _splits(P: int, max_splits: int) -> tuple:
    """(splits, keys per split) of a cache of ``P`` rows: one split up to ``split_rows_setting()`` rows,
    else at most ``max_splits`` ranges (whole chunks of ``NT`` keys when a range is longer than one)."""
    split_rows = split_rows_setting()
    if P <= split_rows:
        return 1, P
    splits = min(-(-P // split_rows), max(int(max_splits), 1))
    kps = -(-P // splits)
    if kps > NT:  # several chunks per split: whole chunks
        kps = NT * -(-kps // NT)
    return -(-P // kps), kps


def _warp_plan(spec: Spec, splits: int, kps: int, wk: int, wv: int) -> Plan:
    """The ``mgx_attn_warp`` launch: every query row of a KV head in one block; value columns per lane
    widened from Hv / 32 towards one 16-byte load while the accumulators allow; :func:`warps_setting`
    warps, fewer when the warps' partial rows do not fit the shared memory; the V rows held per lane
    from :func:`v_early_rows`."""
    R = (spec.N // spec.NKV) * spec.S
    vv, widest = max(spec.HV // 32, 1), 16 // np.dtype(spec.dtype).itemsize
    while vv < widest and 2 * vv <= spec.HV and 2 * vv * R <= WARP_ACC:
        vv *= 2
    p = Plan(spec, R, 1, splits, kps, max(wk, 1), vv, int(wk > 0), int(wv > 0), "mgx_attn_warp", warps_setting(),
             min(vv, wv) if wv else 1)
    while p.warps > 1 and p.shared_bytes() > SMEM_LIMIT:
        p = replace(p, warps=p.warps // 2)
    return replace(p, v_early=v_early_rows(spec.HV, vv, p.warps, kps))


def make_plan(spec: Spec, max_splits: int = MAX_SPLITS) -> Plan:
    """The launch of ``spec`` (see the module docstring; ``max_splits``: the most splits of a long cache,
    each then walking several chunks): ``mgx_attn_lanes`` when :func:`lanes_setting` is on and
    :func:`lanes_unsupported` has no reason against it, else ``mgx_attn_warp`` when :func:`warp_unsupported`
    has no reason against it and :func:`warp_kernel_setting` is on, else ``mgx_attn_split``; ValueError naming the
    reason when neither can run it (see :func:`unsupported`)."""
    why = unsupported(spec)
    if why:
        raise ValueError(f"decode attention kernel: unsupported {why}")
    wk, wv = _row_width(spec.dtype, spec.H, spec.k), _row_width(spec.dtype, spec.HV, spec.v)
    splits, kps = _splits(spec.P, max_splits)
    if lanes_setting() and not lanes_unsupported(spec):
        p = _lanes_plan(spec, splits, kps, wk, wv)
    elif warp_kernel_setting() and not warp_unsupported(spec):
        p = _warp_plan(spec, splits, kps, wk, wv)
    else:
        vk, vv = max(wk, 1), max(wv, 1)
        R = (spec.N // spec.NKV) * spec.S
        rows = min(R, MAX_ROWS, 64 // vv)
        p = Plan(spec, rows, -(-R // rows), splits, kps, vk, vv, int(wk > 0), int(wv > 0))
    if p.grid[0] >= 2 ** 31 or p.combine_grid[0] >= 2 ** 31 or max(p.shared_bytes(True), p.shared_bytes(False)) \
            > SMEM_LIMIT:
        raise ValueError(f"decode attention kernel: grid {p.grid} / shared memory {p.shared_bytes()} bytes too large")
    return replace(p, scalars=_scalars(p))


_PART = re.compile(r'^#include "(decode_attention_\w+\.cuh)"\n', re.M)


def kernel_file() -> str:
    """``decode_attention.cu`` with its kernel parts (``#include "decode_attention_*.cuh"``: the block, warp and
    lanes kernels) inlined, one source for NVRTC / hipRTC and the host emulator (nvcc / hipcc resolve the
    includes themselves when CMake's ``check_kernels`` compiles the file alone)."""
    def read(name):
        with open(os.path.join(_HERE, name)) as f:
            return f.read()

    return _PART.sub(lambda m: read(m.group(1)), read("decode_attention.cu"))


def _byte_strides(lens, strides, item) -> tuple:
    return tuple((d, s * item) for d, (n, s) in enumerate(zip(lens, strides)) if n > 1)


def attention_kernel(spec: Spec, pick, shapes: dict, label: str) -> GpuKernel:
    """The :class:`GpuKernel` of ``spec``: ``pick(args)`` gives the arrays by role (``q``, ``k``, ``v``,
    ``mask``, ``key_mask``, ``pos``, ``kv_len``, ``sink``) from the instruction's arguments; ``shapes``:
    the planned Shape of each role (strides checked per launch).  Compiles both variants now when CuPy
    is importable; raises ValueError when the kernel cannot run ``spec`` or does not compile."""
    plan = make_plan(spec)
    srcs = (plan.source(True), plan.source(False))
    names = (plan.kernel, "mgx_attn_combine")
    pdl = active().pdl  # the compile's MIGRAPHX_PDL, for the launches too
    ready = [(precompile(src, names[0], pdl), precompile(src, names[1], pdl) if plan.splits > 1 else None)
             for src in srcs]
    item = np.dtype(spec.dtype).itemsize
    wk, wv = plan.vk * item, (plan.vw if plan.kernel == "mgx_attn_warp" else plan.vv) * item
    layouts = [(r, _byte_strides(s.lens, s.strides, s.np_dtype.itemsize)) for r, s in shapes.items()]
    grid, cgrid = plan.grid, plan.combine_grid
    block, cblock = plan.block, (plan.defines()["CT"],)

    def fn(variant: int, which: int):
        got = ready[variant][which]
        return got if got is not None else compiled_function(srcs[variant], names[which], pdl)

    def run(ctx, out, args, ws):
        a = pick(args)
        a["out"] = out
        for role, want in layouts:
            st = a[role].strides
            if any(st[d] != b for d, b in want):
                raise ValueError(f"{label}: {role} has strides {st}, the kernel was planned for {dict(want)} "
                                 f"(bytes, by dim)")
        aligned = ctx.data_ptr(a["k"]) % wk == 0 and ctx.data_ptr(a["v"]) % wv == 0
        variant = 0 if aligned else 1
        part = ws[0] if plan.splits > 1 else None
        fn(variant, 0)(grid, block, plan.split_args(a, out, part))
        if part is not None:
            fn(variant, 1)(cgrid, cblock, plan.combine_args(a, out, part))

    run.plan = plan  # type: ignore[attr-defined]  # a function attribute, for inspection (tests)
    return GpuKernel(run, plan.launches, plan.workspace(), True, f"{label} (decode_attention.cu {plan.kernel}, "
                     f"{plan.splits} split{'s' if plan.splits > 1 else ''})")


def head_strides(shape: Shape, order=(0, 1, 2, 3)) -> tuple:
    """(batch, head, row, column) element strides of a 4-D ``shape`` whose dims are in ``order``; a
    dim of size 1 gets stride 0 (it is only ever read at index 0)."""
    return tuple(0 if shape.lens[d] == 1 else int(shape.strides[d]) for d in order)


def broadcast_strides(shape: Shape, target_rank: int = 4) -> tuple:
    """Strides of ``shape`` right-aligned to ``target_rank`` dims, 0 for broadcast (size-1 / missing) dims."""
    off = target_rank - shape.ndim
    return tuple(0 if i < off or shape.lens[i - off] == 1 else int(shape.strides[i - off])
                 for i in range(target_rank))
