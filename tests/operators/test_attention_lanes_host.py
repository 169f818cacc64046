"""mgx_attn_lanes (operators/decode_attention.cu) run on the host (tests/attn_host.py) against the float64 numpy
oracle (tests/attn_oracle.py), over what the planner gives it: the exports' transposed cache layout and strided
head dims (the element-wise variant), views of q, the output and the mask, 1 .. 32 lanes per key, 2 query rows,
several batch entries, 1 .. 8 query heads per KV head, splits, masks per head or broadcast (over heads, rows,
batch entries or keys), key masks, lengths, causal, window, sinks, softcap, empty rows, NaN keys and positions or
lengths past 32 bits; and the planner's choice of 32-bit offsets (``IDX``) against the offsets the kernel forms."""
import numpy as np
import pytest

from mgx_graph.operators import attention_gpu
from mgx_graph.operators.attention_gpu import Spec, broadcast_strides, head_strides, make_plan

import attn_host
from attn_host import kv_cache as _kv, shape_of as _shape
import attn_oracle

pytestmark = pytest.mark.skipif(not attn_host.available(), reason="needs g++ (C++20)")
TOL = {"float32": (2e-5, 2e-5), "float16": (2e-3, 2e-3)}
EMPTY = {0: "nan", 1: "zero", 2: "mean"}


@pytest.fixture(autouse=True)
def _lanes_on(monkeypatch):
    """mgx_attn_lanes for the specs it takes, whatever ``MIGRAPHX_ATTN_LANES`` says in the environment."""
    monkeypatch.setattr(attention_gpu, "lanes_setting", lambda: True)


@pytest.fixture(params=[False, True], ids=["branches", "branchless"])
def branchless(request, monkeypatch):
    """The lanes kernel as built by default (no branch skips a chunk or a warp without a visible key), and with
    ``MIGRAPHX_ATTN_LANES_BRANCHLESS=0`` (the branches kept)."""
    monkeypatch.setattr(attention_gpu, "lanes_branchless_setting", lambda: request.param)
    return request.param


def _case(q, k, v, out, *, mask=None, key_mask=None, pos=None, kv_len=None, causal=False, window=0, sink=None,
          smooth=False, softcap=0.0, empty=1, nan_zero=True):
    """(Spec, arrays by role, the oracle's answer) of one attention over the given arrays (any strides): the
    spec's strides are the arrays' own, as the ops take them from the instructions' shapes."""
    B, N, S, H = q.shape
    P = k.shape[2]
    scale = 1.0 / np.sqrt(H)
    arrays, spec = {"q": q, "k": k, "v": v}, {}
    vis = np.ones((B, 1, S, P), bool)
    t = np.arange(P)
    if mask is not None:
        arrays["mask"] = mask
        spec.update(mask_dtype=mask.dtype.name, mask=broadcast_strides(_shape(mask)), mask_len=P, mask_round=True)
    if key_mask is not None:  # [B, P] or [B, S, P], as grouped_attention takes it
        arrays["key_mask"] = key_mask
        km = key_mask[:, None] if key_mask.ndim == 2 else key_mask
        spec["key_mask"] = broadcast_strides(_shape(km), 3)
        vis = vis & np.broadcast_to(km, (B, S, P))[:, None]
    if kv_len is not None:
        arrays["kv_len"] = kv_len
        spec["lengths"] = True
        vis = vis & (t < kv_len[:, None, None, None])
    if causal or window:
        arrays["pos"] = pos
        spec.update(pos=broadcast_strides(_shape(pos), 2), causal=causal, window=window)
        p = np.broadcast_to(pos, (B, S))[:, None, :, None]
        vis = vis & ((t <= p) if causal else True) & ((t > p - window) if window else True)
    if sink is not None:
        arrays["sink"] = sink
        spec["sink_dtype"] = sink.dtype.name
    dt = q.dtype.name
    full = Spec(dtype=dt, B=B, N=N, NKV=k.shape[1], S=S, P=P, H=H, HV=v.shape[3], q=head_strides(_shape(q)),
                k=head_strides(_shape(k)), v=head_strides(_shape(v)), out=head_strides(_shape(out)), scale=scale,
                softcap=softcap, smooth=smooth, empty=empty, nan_zero=nan_zero, **spec)
    mr = None if mask is None else mask.astype(dt).astype(np.float64)  # the kernel rounds the mask to q's type
    want = attn_oracle.attention(q, k, v, scale, mask=mr, visible=vis, softcap=softcap, sink=sink, smooth=smooth,
                                 empty=EMPTY[empty], nan_zero=nan_zero)
    return full, arrays, want


def _run(spec, arrays, out, want, *, vector=True, max_splits=attention_gpu.MAX_SPLITS):
    """Plan ``spec`` (mgx_attn_lanes asserted), run it on the host into ``out`` (filled with 7 first) and compare
    with the oracle; returns the plan."""
    plan = make_plan(spec, max_splits)
    assert plan.kernel == "mgx_attn_lanes", plan.kernel
    assert plan.defines()["BRANCHLESS"] == int(attention_gpu.lanes_branchless_setting())
    out[...] = 7
    attn_host.run(plan, arrays, out, vector=vector)
    np.testing.assert_allclose(out.astype(np.float64), want, *TOL[spec.dtype])
    return plan


def _tail_mask(rng, B, S, P, dtype="float32"):
    """[B, 1, S, P]: 0 (every fifth key a random bias) up to a length per entry, -inf after (the exports' decode
    mask); entry 0, row 0 sees no key."""
    end = rng.integers(P // 3, P + 1, size=(B, 1, S, 1))
    m = np.where(np.arange(P) < end, 0.0, -np.inf)
    m[..., ::5] += rng.normal(size=m[..., ::5].shape)
    m[0, 0, 0] = -np.inf
    return m.astype(dtype)


LAYOUTS = [  # dtype, B, N, Nkv, S, P, H, layout: lanes per key LC = H / (16 / itemsize)
    ("float16", 2, 9, 3, 1, 300, 64, "cache"),  # SmolLM2's heads, two entries, two splits
    ("float16", 1, 8, 2, 2, 100, 64, "strided"),  # element-wise K / V (KC 0), two query rows
    ("float32", 2, 4, 1, 2, 70, 32, "strided"),
    ("float16", 1, 3, 1, 1, 600, 8, "standard"),  # LC 1: 32 keys per step, 256 per chunk; three splits
    ("float32", 2, 2, 2, 2, 50, 4, "cache"),  # LC 1 in float32
    ("float16", 2, 16, 2, 2, 90, 16, "strided"),  # LC 2, G 8
    ("float16", 1, 2, 2, 1, 90, 256, "standard"),  # LC 32 in float16, G 1
    ("float32", 2, 8, 2, 2, 300, 128, "cache"),  # fp32 head 128: 32 lanes per key, one key per step; splits
]


@pytest.mark.parametrize("dtype,B,N,Nkv,S,P,H,layout", LAYOUTS)
def test_lanes_layouts_match_numpy(dtype, B, N, Nkv, S, P, H, layout):
    """Cache layouts and lane counts, the vector variant (where the rows allow 16-byte loads) and the element-wise
    one, with the exports' tail mask (one row sees no key: 0) and NaN / inf in the rows no row sees."""
    rng = np.random.default_rng(P + H + B)
    q = rng.normal(size=(B, N, S, H)).astype(dtype)
    k, v = _kv(rng, dtype, B, Nkv, P, H, layout), _kv(rng, dtype, B, Nkv, P, H, layout)
    mask = _tail_mask(rng, B, S, P)
    hidden = np.flatnonzero(np.all(np.isneginf(mask), axis=(1, 2))[0])
    k[0, :, hidden], v[0, :, hidden] = np.nan, np.inf  # entry 0's keys no row sees: never used
    out = np.zeros((B, N, S, H), dtype)
    spec, arrays, want = _case(q, k, v, out, mask=mask)
    assert np.all(want[0, :, 0] == 0) and np.all(np.isfinite(want))
    plan = _run(spec, arrays, out, want, vector=layout != "strided")
    assert plan.kc == int(layout != "strided") and plan.defines()["LC"] == H // plan.vk
    assert plan.splits == (1 if P <= attention_gpu.SPLIT_ROWS else -(-P // plan.keys_per_split))
    if layout != "strided":  # the element-wise variant (what a misaligned cache runs) on the same plan
        _run(spec, arrays, out, want, vector=False)


def _mask_of(rng, kind, B, N, S, P):
    """A mask of ``kind`` for [B, N, S, P] attention, 30% of its entries -inf (a key row of -inf everywhere
    for ``keys``)."""
    shapes = {"heads": (B, 1, S, P), "per_head": (B, N, S, P), "batch_rows": (1, N, 1, P), "rows": (B, 1, 1, P),
              "one_d": (P,), "keys": (B, N, S, 1)}
    if kind in shapes:
        m = rng.normal(size=shapes[kind])
        m[rng.random(m.shape) < 0.3] = -np.inf
        return m.astype(np.float32)
    m = rng.normal(size=(B, N, S, P))
    m[rng.random(m.shape) < 0.3] = -np.inf
    if kind == "row_view":  # rows of a longer buffer: the row and head strides are not the contiguous ones
        buf = np.full((B, N, S, P + 37), np.nan, np.float32)
        buf[..., :P] = m
        return buf[..., :P]
    if kind == "heads_inner":  # [B, S, N, P] transposed: the head stride below the row stride
        return np.ascontiguousarray(m.transpose(0, 2, 1, 3)).astype(np.float16).transpose(0, 2, 1, 3)
    assert kind == "keys_outer"  # [P, B, N, S] transposed: the key stride is B * N * S (MST), not 1
    return np.ascontiguousarray(m.transpose(3, 0, 1, 2)).astype(np.float32).transpose(1, 2, 3, 0)


MASKS = ["heads", "per_head", "batch_rows", "rows", "one_d", "keys", "row_view", "heads_inner", "keys_outer"]


@pytest.mark.parametrize("kind", MASKS)
def test_lanes_masks_match_numpy(branchless, kind):
    """Every stride of the mask the kernel uses (batch, query head, row at run time; the key stride MST compiled
    in), for masks per head and broadcast over heads, rows, batch entries or keys, and mask views."""
    rng = np.random.default_rng(MASKS.index(kind))
    B, N, Nkv, S, P, H, dtype = 2, 6, 2, 2, 80, 64, "float16"
    q = rng.normal(size=(B, N, S, H)).astype(dtype)
    k, v = _kv(rng, dtype, B, Nkv, P, H, "cache"), _kv(rng, dtype, B, Nkv, P, H, "cache")
    mask = _mask_of(rng, kind, B, N, S, P)
    out = np.zeros((B, N, S, H), dtype)
    spec, arrays, want = _case(q, k, v, out, mask=mask)
    plan = _run(spec, arrays, out, want)
    assert plan.defines()["MST"] == spec.mask[3] == (0 if kind == "keys" else B * N * S if kind == "keys_outer" else 1)


def test_lanes_views_of_q_and_the_output_match_numpy():
    """q as a view with its head dim strided (QSH 2) and the heads of a [B, S, N, H] buffer, the output a view
    of a [B, S, N, Hv] buffer: the strides the launch is given are the views' own."""
    rng = np.random.default_rng(21)
    B, N, Nkv, S, P, H = 2, 8, 4, 2, 120, 64
    q = rng.normal(size=(B, S, N, 2 * H)).astype(np.float16)[..., ::2].transpose(0, 2, 1, 3)
    k, v = _kv(rng, "float16", B, Nkv, P, H, "standard"), _kv(rng, "float16", B, Nkv, P, H, "cache")
    buf = np.zeros((B, S, N, H), np.float16)
    out = buf.transpose(0, 2, 1, 3)
    spec, arrays, want = _case(q, k, v, out, mask=_tail_mask(rng, B, S, P, "float16"))
    assert spec.q[3] == 2 and spec.out[1] == H
    plan = _run(spec, arrays, out, want)
    assert plan.defines()["QSH"] == 2


OPTIONS = [  # dtype, B, N, Nkv, S, P, H, options
    ("float16", 2, 6, 2, 2, 90, 64, dict(kv_len=[90, 41], causal=True)),
    ("float32", 2, 4, 1, 1, 300, 32, dict(kv_len=[300, 0], causal=True, empty=2)),  # an entry without keys: mean
    ("float16", 2, 8, 2, 2, 600, 64, dict(kv_len=[600, 333], causal=True, window=100, softcap=20.0, empty=2)),
    ("float16", 1, 4, 1, 2, 64, 32, dict(kv_len=[50], causal=True, key_mask="bsp", bias=True, sink=True, empty=2)),
    ("float32", 2, 4, 4, 1, 30, 16, dict(kv_len=[30, 0], causal=True, smooth=True, empty=2)),  # 0 for entry 1
    ("float32", 2, 3, 1, 2, 40, 16, dict(key_mask="bp", window=7, causal=True, nan_zero=False, empty=0)),
    ("float16", 1, 9, 3, 1, 256, 64, dict(nan_key=True, bias=True, softcap=5.0)),  # a NaN logit: those rows 0
    ("float32", 2, 4, 2, 2, 50, 32, dict(nan_key=True, nan_zero=False, empty=0)),  # ... or NaN
]


@pytest.mark.parametrize("dtype,B,N,Nkv,S,P,H,opts", OPTIONS)
def test_lanes_options_match_numpy(branchless, dtype, B, N, Nkv, S, P, H, opts):
    """Lengths, causal positions, a window, key masks ([B, S, P] / [B, P]), a bias, sinks, smooth, softcap, empty
    rows (NaN, 0 or the mean of the values) and NaN keys, with unwritten (NaN / inf) rows past each entry's
    length."""
    opts = dict(opts)
    rng = np.random.default_rng(P + N + S)
    q = rng.normal(size=(B, N, S, H)).astype(dtype)
    k, v = _kv(rng, dtype, B, Nkv, P, H, "standard"), _kv(rng, dtype, B, Nkv, P, H, "standard")
    kw = {o: opts.pop(o) for o in ("causal", "window", "softcap", "empty", "nan_zero", "smooth") if o in opts}
    if "kv_len" in opts:
        lens = np.array(opts.pop("kv_len"), np.int64)
        kw.update(kv_len=lens, pos=np.maximum(lens[:, None] - S + np.arange(S), 0))
        for b, n in enumerate(lens):  # rows not written yet: never used (the values: unless a row's mean is)
            k[b, :, n:] = np.nan
            if kw.get("empty") != 2:
                v[b, :, n:] = np.inf
    elif kw.get("causal") or kw.get("window"):
        kw["pos"] = rng.integers(0, P, size=(B, S))
    km = opts.pop("key_mask", None)
    if km:
        kw["key_mask"] = rng.random((B, S, P) if km == "bsp" else (B, P)) < 0.8
    if opts.pop("bias", False):
        kw["mask"] = rng.normal(size=(B, N, S, P)).astype(np.float32)
    if opts.pop("sink", False):
        kw["sink"] = rng.normal(size=(N,)).astype(np.float32)
    nan_key = opts.pop("nan_key", False)
    if nan_key:
        k[0, 0, P // 2, 1] = np.nan  # seen by KV head 0's query rows of entry 0
    assert not opts, opts
    out = np.zeros((B, N, S, H), dtype)
    spec, arrays, want = _case(q, k, v, out, **kw)
    _run(spec, arrays, out, want)
    if nan_key:
        G = N // Nkv
        assert np.all(out[0, :G] == 0) if spec.nan_zero else np.all(np.isnan(out[0, :G]))


@pytest.mark.parametrize("split_rows,P,opts", [(32, 256, {}), (48, 300, dict(window=40)), (100, 500, {}),
                                               (7, 50, dict(window=9))])
def test_lanes_splits_match_numpy(monkeypatch, branchless, split_rows, P, opts):
    """``MIGRAPHX_ATTN_SPLIT_ROWS`` below the cache length: the lanes kernel's partial rows (some splits with no
    visible key under a window) merged by mgx_attn_combine."""
    monkeypatch.setattr(attention_gpu, "split_rows_setting", lambda: split_rows)
    rng = np.random.default_rng(split_rows)
    B, N, Nkv, S, H = 2, 6, 3, 2, 64
    q = rng.normal(size=(B, N, S, H)).astype(np.float16)
    k, v = _kv(rng, "float16", B, Nkv, P, H, "cache"), _kv(rng, "float16", B, Nkv, P, H, "cache")
    kw = dict(mask=_tail_mask(rng, B, S, P))
    if opts:
        kw.update(pos=rng.integers(0, P, size=(B, S)), causal=True, **opts)
    out = np.zeros((B, N, S, H), np.float16)
    spec, arrays, want = _case(q, k, v, out, **kw)
    plan = _run(spec, arrays, out, want)
    assert plan.splits > 1 and plan.launches == 2
    assert plan.keys_per_split * (plan.splits - 1) < P <= plan.keys_per_split * plan.splits


@pytest.mark.parametrize("kernel", ["lanes", "warp", "split"])
@pytest.mark.parametrize("case", ["window_past_int", "kv_len_below_int", "pos_below_int"])
def test_positions_and_lengths_past_32_bits_hide_the_keys(monkeypatch, kernel, case):
    """A query position or a length whose 64-bit value leaves no key visible (a window starting past the cache,
    a length or causal position below zero) but whose low 32 bits would: every kernel gives the empty row (the
    mean of the values here), as the oracle does, instead of attending to the keys the truncated value shows."""
    if kernel != "lanes":
        monkeypatch.setattr(attention_gpu, "lanes_setting", lambda: False)
    if kernel == "split":
        monkeypatch.setattr(attention_gpu, "warp_kernel_setting", lambda: False)
    rng = np.random.default_rng(3)
    B, N, Nkv, S, P, H = 2, 4, 2, 1, 40, 32
    q = rng.normal(size=(B, N, S, H)).astype(np.float32)
    k, v = _kv(rng, "float32", B, Nkv, P, H, "standard"), _kv(rng, "float32", B, Nkv, P, H, "standard")
    lens, pos = np.array([P, P], np.int64), np.array([[P - 1], [P - 1]], np.int64)
    if case == "window_past_int":
        pos[1, 0] = (1 << 32) + 5  # window [2^32 + 2, 2^32 + 5]: low bits 2 .. 5
    elif case == "kv_len_below_int":
        lens[1] = -(1 << 32) + 10  # low bits 10
    else:
        pos[1, 0] = -(1 << 40)  # causal end pos + 1: low bits 1
    out = np.zeros((B, N, S, H), np.float32)
    window = 4 if case == "window_past_int" else 0  # (entry 0 sees its last 4 keys, or all of them)
    spec, arrays, want = _case(q, k, v, out, kv_len=lens, pos=pos, causal=True, window=window, empty=2)
    np.testing.assert_allclose(want[1], v[1].astype(np.float64).mean(axis=1)[:, None].repeat(2, 0))
    plan = make_plan(spec)
    assert plan.kernel == {"lanes": "mgx_attn_lanes", "warp": "mgx_attn_warp", "split": "mgx_attn_split"}[kernel]
    attn_host.run(plan, arrays, out)
    np.testing.assert_allclose(out.astype(np.float64), want, *TOL["float32"])


@pytest.mark.parametrize("fits", [True, False])
def test_the_64_bit_variant_matches_numpy(monkeypatch, fits):
    """The same plan compiled with 32-bit and with 64-bit offsets (``IDX``): both equal the oracle."""
    monkeypatch.setattr(attention_gpu, "_offsets_fit_int", lambda p: fits)
    rng = np.random.default_rng(9)
    B, N, Nkv, S, P, H = 2, 6, 2, 2, 300, 64
    q = rng.normal(size=(B, N, S, H)).astype(np.float16)
    k, v = _kv(rng, "float16", B, Nkv, P, H, "cache"), _kv(rng, "float16", B, Nkv, P, H, "cache")
    out = np.zeros((B, N, S, H), np.float16)
    lens = np.array([300, 123], np.int64)
    spec, arrays, want = _case(q, k, v, out, mask=_mask_of(rng, "per_head", B, N, S, P), kv_len=lens,
                               key_mask=rng.random((B, P)) < 0.9)
    plan = _run(spec, arrays, out, want)
    assert plan.defines()["IDX"] == ("int" if fits else "long long") and plan.splits == 2


# -- the planner's 32-bit offsets (IDX) against the offsets the kernel forms --------------------------------------
def _spec(**kw) -> Spec:
    """SmolLM2's decode step (fp16, 9 query heads over 3 KV heads of 64, 256 cache rows, a float32 mask over
    [1, 1, 1, P]) with the fields given replaced."""
    P = kw.get("P", 256)
    base = dict(dtype="float16", B=1, N=9, NKV=3, S=1, P=P, H=64, HV=64, q=(0, 64, 0, 1), k=(0, P * 64, 64, 1),
                v=(0, P * 64, 64, 1), out=(0, 64, 0, 1), scale=0.125, mask_dtype="float32", mask=(0, 0, 0, 1),
                mask_len=P, mask_round=True)
    base.update(kw)
    return Spec(**base)


def _idx(spec: Spec) -> str:
    plan = make_plan(spec)
    assert plan.kernel == "mgx_attn_lanes"
    return plan.defines()["IDX"]


LIMIT = 2 ** 31


@pytest.mark.parametrize("name,big,small", [
    # the K row stride: keys up to P + 37 rows are addressed (a warp's share may start past the split, and a step
    # reads 32 / LC keys); a chunk's pointer step is LU * 32 / LC rows (32 here)
    ("k row", _spec(P=256, k=(0, 0, LIMIT // 290, 1)), _spec(P=256, k=(0, 0, LIMIT // 330, 1))),
    ("v row", _spec(P=256, v=(0, 0, LIMIT // 290, 1)), _spec(P=256, v=(0, 0, LIMIT // 330, 1))),
    ("k head", _spec(k=(0, LIMIT // 2 + 64, 64, 1)), _spec(k=(0, LIMIT // 2 - 256 * 64, 64, 1))),
    ("q batch", _spec(B=2, q=(LIMIT - 8, 64, 0, 1)), _spec(B=2, q=(LIMIT // 2, 64, 0, 1))),
    ("out head", _spec(out=(0, LIMIT // 8, 0, 1)), _spec(out=(0, LIMIT // 8 - 64, 0, 1))),
    ("mask key", _spec(P=256, mask=(0, 0, 0, LIMIT // 290)), _spec(P=256, mask=(0, 0, 0, LIMIT // 330))),
    ("mask head", _spec(mask=(0, LIMIT // 8, 0, 1)), _spec(mask=(0, LIMIT // 8 - 330, 0, 1))),
    ("key mask", _spec(key_mask=(0, 0, LIMIT // 290)), _spec(key_mask=(0, 0, LIMIT // 330))),
])
def test_offsets_past_2_31_take_64_bits(name, big, small):
    """``IDX`` is ``long long`` as soon as one offset the kernel forms reaches 2^31, and ``int`` just below."""
    assert (_idx(big), _idx(small)) == ("long long", "int"), name


def test_the_pointer_step_of_a_chunk_fits_the_offsets():
    """With one lane per key (fp16 heads of 8) a chunk is 8 steps of 32 keys: the K / V / mask pointers move by
    256 rows per chunk, so a short cache whose 256-row step passes 2^31 elements takes 64-bit offsets."""
    P = 10
    big = _spec(P=P, H=8, HV=8, N=1, NKV=1, q=(0, 0, 0, 1), out=(0, 0, 0, 1), k=(0, 0, LIMIT // 255, 1))
    small = _spec(P=P, H=8, HV=8, N=1, NKV=1, q=(0, 0, 0, 1), out=(0, 0, 0, 1), k=(0, 0, LIMIT // 257, 1))
    assert make_plan(big).defines()["LC"] == 1
    assert (_idx(big), _idx(small)) == ("long long", "int")


def test_the_split_workspace_fits_the_offsets(monkeypatch):
    """The workspace ``part`` [B * N * S, splits, Hv + 3]: its last element's offset decides too."""
    monkeypatch.setattr(attention_gpu, "split_rows_setting", lambda: 4)
    rows = LIMIT // (64 * 67)  # B * N * S rows of 64 splits of 67 floats: just past 2^31
    big, small = (_spec(B=b, P=256, q=(576, 64, 0, 1), out=(576, 64, 0, 1)) for b in (rows // 9 + 1, rows // 9 - 1))
    assert make_plan(big).splits == 64
    assert (_idx(big), _idx(small)) == ("long long", "int")
