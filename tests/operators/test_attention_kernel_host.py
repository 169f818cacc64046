"""decode_attention.cu run on the host (tests/attn_host.py: each block's threads as fibers, barriers
for __syncthreads, 32-lane shuffles) against the float64 numpy oracle: the plans of decode_attention (masks,
NaN rows, cache layouts, splits) and of one-row grouped_attention steps (lengths, causal, window, key mask,
bias, sink, smooth, softcap, empty rows), each with mgx_attn_warp where it applies and with mgx_attn_split;
the warp kernel over the decode shapes (1 .. 16 query rows per KV head, head sizes 64 / 128), with its V rows
loaded together with the K rows (V_EARLY) and after the weights, and with 1 .. 32 warps per block."""
import dataclasses

import numpy as np
import pytest

from mgx_graph.operators import attention_gpu
from mgx_graph.operators.attention_gpu import Spec, broadcast_strides, head_strides, make_plan

import attn_host
from attn_host import kv_cache as _kv, shape_of as _shape
import attn_oracle

pytestmark = pytest.mark.skipif(not attn_host.available(), reason="needs g++ (C++20)")
TOL = {"float32": (2e-5, 2e-5), "float16": (2e-3, 2e-3)}


KERNELS = {"warp-v_early": ("mgx_attn_warp", True), "warp-v_late": ("mgx_attn_warp", False),
           "split": ("mgx_attn_split", False), "lanes": ("mgx_attn_lanes", True),
           "lanes-branchless": ("mgx_attn_lanes", True)}


@pytest.fixture(autouse=True)
def _warp_kernel_unless_asked(monkeypatch):
    """mgx_attn_lanes off (``MIGRAPHX_ATTN_LANES=0``) unless a test asks for it through ``kernel``: the tests
    named after the warp kernel check its plans, which the lanes kernel would otherwise take."""
    monkeypatch.setattr(attention_gpu, "lanes_setting", lambda: False)


@pytest.fixture(params=list(KERNELS))
def kernel(request, monkeypatch):
    """The kernel the planner is asked for: the warp kernel where it applies, with V rows loaded together with
    the K rows where the registers allow (V_EARLY) or after the weights (``MIGRAPHX_ATTN_V_EARLY=0``), the
    block kernel for every spec (what ``MIGRAPHX_ATTN_WARP=0`` selects), or the lanes kernel where it applies
    (the default; with ``MIGRAPHX_ATTN_LANES_BRANCHLESS`` or without)."""
    name, early = KERNELS[request.param]
    if name == "mgx_attn_split":
        monkeypatch.setattr(attention_gpu, "warp_kernel_setting", lambda: False)
    elif name == "mgx_attn_lanes":
        monkeypatch.setattr(attention_gpu, "lanes_setting", lambda: True)
        monkeypatch.setattr(attention_gpu, "lanes_branchless_setting", lambda: request.param == "lanes-branchless")
    else:
        monkeypatch.setattr(attention_gpu, "v_early_setting", lambda: early)
    return request.param


def _check_v_early(plan, early):
    """V_EARLY as asked where a lane's held rows fit V_EARLY_ELEMS, the held rows covering a whole step."""
    d = plan.defines()
    kpi, step = 32 // d["LPR"], min(32, -(-plan.keys_per_split // d["NW"]))
    fits = -(-step // kpi) * d["VV"] <= attention_gpu.V_EARLY_ELEMS
    assert d["V_EARLY"] == int(early and fits), (d["V_EARLY"], early, fits)
    if d["V_EARLY"]:
        assert d["VE"] * kpi >= step and d["VE"] <= d["LPR"] and d["VE"] * d["VV"] <= attention_gpu.V_EARLY_ELEMS


def _check_kernel(plan, kernel):
    name, early = KERNELS[kernel]
    if name == "mgx_attn_lanes":
        if not attention_gpu.lanes_unsupported(plan.spec):
            assert plan.kernel == name, (plan.kernel, kernel)
            assert plan.defines()["BRANCHLESS"] == int(kernel == "lanes-branchless")
            return
        name = "mgx_attn_warp"
    takes = not attention_gpu.warp_unsupported(plan.spec)
    assert plan.kernel == (name if takes else "mgx_attn_split"), (plan.kernel, kernel)
    if plan.kernel == "mgx_attn_warp":
        _check_v_early(plan, early)


def _decode(rng, dtype, B, N, Nkv, S, P, H, Hv, layout="standard", nan_zero=True, max_splits=64):
    q = rng.normal(size=(B, N, S, H)).astype(dtype)
    k, v = _kv(rng, dtype, B, Nkv, P, H, layout), _kv(rng, dtype, B, Nkv, P, Hv, layout)
    m = rng.normal(size=(B, 1, S, P))
    m[rng.random(m.shape) < 0.3] = -np.inf
    m[0, 0, 0, :] = -np.inf  # a row that sees no key
    m = m.astype(dtype)
    out = np.full((B, N, S, Hv), 7, dtype)
    scale = 1.0 / np.sqrt(H)
    spec = Spec(dtype=dtype, B=B, N=N, NKV=Nkv, S=S, P=P, H=H, HV=Hv, q=head_strides(_shape(q)),
                k=head_strides(_shape(k)), v=head_strides(_shape(v)), out=head_strides(_shape(out)), scale=scale,
                mask_dtype=dtype, mask=broadcast_strides(_shape(m)), mask_len=P, mask_round=True,
                empty=int(nan_zero), nan_zero=nan_zero)
    want = attn_oracle.attention(q, k, v, scale, mask=m, empty="zero" if nan_zero else "nan", nan_zero=nan_zero)
    return make_plan(spec, max_splits), {"q": q, "k": k, "v": v, "mask": m}, out, want


DECODE = [  # dtype, B, N, Nkv, S, P, H, Hv, layout, max_splits
    ("float32", 1, 9, 3, 1, 16, 64, 64, "cache", 64),
    ("float16", 1, 9, 3, 1, 300, 64, 64, "cache", 64),
    ("float16", 2, 8, 2, 2, 1000, 32, 32, "standard", 2),  # two splits of two chunks each
    ("float32", 1, 4, 4, 3, 7, 16, 24, "strided", 64),
    ("float16", 1, 32, 1, 1, 40, 80, 48, "standard", 64),  # 32 query rows per KV head: 4 row groups
    ("float16", 1, 6, 2, 1, 70, 64, 32, "strided", 64),  # the warp kernel over element-wise K / V loads
    ("float32", 2, 4, 1, 1, 90, 32, 64, "strided", 64),
]


@pytest.mark.parametrize("dtype,B,N,Nkv,S,P,H,Hv,layout,max_splits", DECODE)
def test_decode_plan_matches_numpy(kernel, dtype, B, N, Nkv, S, P, H, Hv, layout, max_splits):
    plan, arrays, out, want = _decode(np.random.default_rng(P), dtype, B, N, Nkv, S, P, H, Hv, layout,
                                      max_splits=max_splits)
    _check_kernel(plan, kernel)
    assert plan.splits == (1 if P <= attention_gpu.SPLIT_ROWS else -(-P // plan.keys_per_split))
    attn_host.run(plan, arrays, out, vector=layout != "strided")
    np.testing.assert_allclose(out.astype(np.float64), want, *TOL[dtype])
    assert np.all(out[0, :, 0] == 0)  # the row with every key masked (nan_zero)


@pytest.mark.parametrize("split_rows,P,want_splits", [(64, 256, 4), (48, 300, 7), (100, 1000, 10)])
def test_splits_shorter_than_a_chunk_match_numpy(monkeypatch, split_rows, P, want_splits):
    """MIGRAPHX_ATTN_SPLIT_ROWS below the chunk size (256 keys): splits of part of a chunk, merged."""
    monkeypatch.setattr(attention_gpu, "split_rows_setting", lambda: split_rows)
    plan, arrays, out, want = _decode(np.random.default_rng(P), "float16", 1, 9, 3, 1, P, 64, 64, "cache")
    assert plan.splits == want_splits and plan.launches == 2
    assert plan.keys_per_split * (plan.splits - 1) < P <= plan.keys_per_split * plan.splits
    attn_host.run(plan, arrays, out, vector=True)
    np.testing.assert_allclose(out.astype(np.float64), want, *TOL["float16"])


def test_element_wise_variant_matches_the_vector_one():
    plan, arrays, out, want = _decode(np.random.default_rng(3), "float16", 1, 6, 2, 1, 300, 64, 64, "cache")
    assert (plan.vk, plan.vv, plan.kc, plan.vc) == (8, 8, 1, 1)
    attn_host.run(plan, arrays, out, vector=False)
    np.testing.assert_allclose(out.astype(np.float64), want, *TOL["float16"])


def test_nan_rows_and_hidden_non_finite_values():
    rng = np.random.default_rng(5)
    plan, arrays, out, want = _decode(rng, "float32", 1, 4, 2, 1, 300, 16, 16, nan_zero=False)
    m, k, v = arrays["mask"], arrays["k"], arrays["v"]
    hidden = np.flatnonzero(m[0, 0, 0] == -np.inf)
    v[0, :, hidden] = np.inf  # every key of row 0 is hidden: these values must not be read
    m[0, 0, 0, 5] = 0.0
    k[0, 1, 5, 0] = np.nan  # key 5 seen by heads 2, 3: their row is NaN
    v[0, 0, 5] = 1.0
    want = attn_oracle.attention(arrays["q"], k, v, plan.spec.scale, mask=m)
    attn_host.run(plan, arrays, out)
    assert np.all(np.isnan(out[0, 2:, 0])) and np.all(np.isfinite(out[0, :2, 0]))
    np.testing.assert_allclose(out, want, 2e-5, 2e-5)


def _grouped(rng, dtype, B, N, Nkv, P, H, *, kv_len, window=0, softcap=0.0, bias_len=0, sink=False,
             smooth=False, key_mask=False, max_splits=64):
    q = rng.normal(size=(B, 1, N, H)).astype(dtype)
    k, v = _kv(rng, dtype, B, Nkv, P, H, "standard"), _kv(rng, dtype, B, Nkv, P, H, "standard")
    lens = np.array(kv_len, np.int64)
    pos = (lens - 1).reshape(B, 1)
    t = np.arange(P)
    vis = (t < lens[:, None]) & (t <= pos) & ((t > pos - window) if window > 0 else True)
    arrays = {"q": q, "k": k, "v": v, "pos": pos, "kv_len": lens}
    spec = dict(pos=(1, 0) if B > 1 else (0, 0), lengths=True, causal=True, window=window, softcap=softcap, empty=2)
    mask = None
    if key_mask:
        km = rng.random((B, P)) < 0.8
        arrays["key_mask"], vis = km, vis & km
        spec["key_mask"] = (P if B > 1 else 0, 0, 1)
    if bias_len:
        bias = rng.normal(size=(B, N, 1, bias_len)).astype("float32")
        arrays["mask"] = bias
        mask = np.concatenate([bias, np.zeros((B, N, 1, P - bias_len), np.float32)], axis=-1)
        spec.update(mask_dtype="float32", mask=broadcast_strides(_shape(bias)), mask_len=bias_len)
    if sink:
        arrays["sink"] = rng.normal(size=(N,)).astype("float32")
        spec["sink_dtype"] = "float32"
    out = np.full((B, 1, N * H), 7, dtype)
    scale = 1.0 / np.sqrt(H)
    full = Spec(dtype=dtype, B=B, N=N, NKV=Nkv, S=1, P=P, H=H, HV=H, q=head_strides(_shape(q), (0, 2, 1, 3)),
                k=head_strides(_shape(k)), v=head_strides(_shape(v)), out=(N * H if B > 1 else 0, H, 0, 1),
                scale=scale, smooth=smooth, **spec)
    want = attn_oracle.attention(q.transpose(0, 2, 1, 3), k, v, scale, mask=mask, visible=vis[:, None, None],
                                 softcap=softcap, sink=arrays.get("sink"), smooth=smooth, empty="mean")
    return make_plan(full, max_splits), arrays, out, want.transpose(0, 2, 1, 3).reshape(B, 1, N * H)


GROUPED = [  # dtype, B, N, Nkv, P, H, options
    ("float32", 2, 6, 2, 20, 16, dict(kv_len=[20, 0])),  # an entry with no key: the mean of all values
    ("float16", 2, 8, 2, 600, 64, dict(kv_len=[600, 333], window=100, softcap=20.0, max_splits=2)),
    ("float16", 1, 4, 1, 64, 32, dict(kv_len=[50], key_mask=True, bias_len=40, sink=True)),
    ("float32", 2, 4, 4, 30, 16, dict(kv_len=[30, 0], smooth=True)),  # smooth: the empty entry gives 0
]


@pytest.mark.parametrize("dtype,B,N,Nkv,P,H,opts", GROUPED)
def test_grouped_plan_matches_numpy(kernel, dtype, B, N, Nkv, P, H, opts):
    plan, arrays, out, want = _grouped(np.random.default_rng(P), dtype, B, N, Nkv, P, H, **opts)
    _check_kernel(plan, kernel)
    attn_host.run(plan, arrays, out)
    np.testing.assert_allclose(out.astype(np.float64), want, *TOL[dtype])


def test_the_plans_the_ops_make_match_numpy():
    """The kernels the gpu kernel table's entries for decode_attention and grouped_attention plan (their
    specs from the instructions' shapes: strides, roles, options), run on the host."""
    from mgx_graph.operators import make_op
    from mgx_graph.operators.gpu_lowering import table_kernel

    rng = np.random.default_rng(11)
    B, N, Nkv, P, H = 2, 6, 2, 300, 32
    q = rng.normal(size=(B, 1, N, H)).astype("float16")  # grouped layout [B, S, N, H]
    kb, vb = (rng.normal(size=(P, B, Nkv, H)).astype("float16") for _ in range(2))
    k, v = kb.transpose(1, 2, 0, 3), vb.transpose(1, 2, 0, 3)
    mask = _decode(rng, "float32", B, N, Nkv, 1, P, H, H)[1]["mask"]
    qd = q.transpose(0, 2, 1, 3)  # [B, N, 1, H] view
    op = make_op("decode_attention", scale=0.2, mask=1, nan_zero=1)
    shapes = [_shape(a) for a in (qd, k, v, mask)]
    kern = table_kernel(op, shapes, op.compute_shape(shapes))
    out = np.full((B, N, 1, H), 7, np.float16)
    attn_host.run(kern.fn.plan, {"q": qd, "k": k, "v": v, "mask": mask}, out)
    want = attn_oracle.attention(qd, k, v, 0.2, mask=mask.astype(np.float16), nan_zero=True)
    np.testing.assert_allclose(out.astype(np.float64), want, *TOL["float16"])

    lens = np.array([P, 120], np.int64)
    pos, sink = (lens - 1).reshape(B, 1), rng.normal(size=(N,)).astype("float32")
    kc, vc = np.ascontiguousarray(k), np.ascontiguousarray(v)
    op = make_op("grouped_attention", local_window=50, sink=1)
    shapes = [_shape(a) for a in (q, kc, vc, pos, lens, np.arange(P), sink)]
    kern = table_kernel(op, shapes, op.compute_shape(shapes))
    out = np.full((B, 1, N * H), 7, np.float16)
    attn_host.run(kern.fn.plan, {"q": q, "k": kc, "v": vc, "pos": pos, "kv_len": lens, "sink": sink}, out)
    t = np.arange(P)
    vis = (t < lens[:, None]) & (t <= pos) & (t > pos - 50)
    want = attn_oracle.attention(qd, kc, vc, 1 / np.sqrt(H), visible=vis[:, None, None], sink=sink)
    np.testing.assert_allclose(out.astype(np.float64), want.transpose(0, 2, 1, 3).reshape(B, 1, N * H),
                               *TOL["float16"])


# -- mgx_attn_warp (few query rows per KV head), and mgx_attn_split on the same cases ---------------------------
def _warp_case(rng, dtype, G, S, H, Hv, P, *, Nkv=2, B=1, mask="tail", causal=False, kv_len=None, softcap=0.0,
               nan_key=False, nan_zero=True, empty_row=False, garbage=False):
    """A spec of G * S query rows per KV head with its arrays and the oracle's answer.  ``mask``: None, ``tail``
    (float32 [B, 1, 1, P], 0 up to a position per entry, -inf after: the exports' decode mask, rounded to
    ``dtype``) or ``per_head`` ([B, N, S, P] of ``dtype``, 30% -inf); ``causal`` / ``kv_len``: positions P - S ..
    P - 1 and lengths per entry; ``nan_key``: a NaN in a K row only heads of KV head 0 see; ``empty_row``: query
    row (b 0, head 0, s 0) sees no key; ``garbage``: NaN keys and infinite values in the cache rows no row
    sees (rows never written; with ``tail`` the first two keys too), which must not leak."""
    N = G * Nkv
    q = rng.normal(size=(B, N, S, H)).astype(dtype)
    k, v = rng.normal(size=(B, Nkv, P, H)).astype(dtype), rng.normal(size=(B, Nkv, P, Hv)).astype(dtype)
    arrays, spec, vis, m = {"q": q, "k": k, "v": v}, {}, np.ones((B, 1, S, P), bool), None
    if mask == "tail":
        end = rng.integers(P // 10, P // 2 + 1, size=B) if P > 10 else np.full(B, P)
        m = np.where(np.arange(P) < end[:, None], 0.0, -np.inf).astype(np.float32).reshape(B, 1, 1, P)
        m[:, :, :, ::7] = rng.normal(size=m[:, :, :, ::7].shape) + m[:, :, :, ::7]
        if garbage:  # the first keys hidden too: a warp's first row is then one nobody sees
            m[..., :2] = -np.inf
    elif mask == "per_head":
        m = rng.normal(size=(B, N, S, P))
        m[rng.random(m.shape) < 0.3] = -np.inf
        m[..., -1] = 0.0
        m = m.astype(dtype)
    if m is not None:
        if empty_row:
            m = np.broadcast_to(m, (B, N, S, P)).copy() if m.shape[1] == 1 else m
            m[0, 0, 0] = -np.inf
        arrays["mask"] = m
        spec.update(mask_dtype=m.dtype.name, mask=broadcast_strides(_shape(m)), mask_len=P, mask_round=True)
    if causal or kv_len is not None:
        lens = np.array(kv_len if kv_len is not None else [P] * B, np.int64)
        pos = np.maximum(lens[:, None] - S + np.arange(S), 0) if causal else np.zeros((B, S), np.int64)
        arrays.update(kv_len=lens, pos=pos.astype(np.int64))
        t = np.arange(P)
        vis = (t < lens[:, None, None]) & ((t <= pos[:, :, None]) if causal else True)
        vis = vis[:, None]
        spec.update(lengths=True, causal=causal, pos=(S if B > 1 else 0, 1 if S > 1 else 0))
    if garbage:
        open_ = np.broadcast_to(vis, (B, N, S, P)) & (np.broadcast_to(m, (B, N, S, P)) != -np.inf if m is not None
                                                      else True)
        b_, t_ = np.nonzero(~open_.any(axis=(1, 2)))
        assert len(t_) > 0
        k[b_, :, t_] = np.nan
        v[b_, :, t_] = np.inf
    if nan_key:
        seen = np.flatnonzero(vis[0, 0, 0] & ((m[0, 0, 0] if m is not None else 0) != -np.inf))
        k[0, 0, seen[len(seen) // 2], 3] = np.nan
    out = np.full((B, N, S, Hv), 7, dtype)
    scale = 1.0 / np.sqrt(H)
    full = Spec(dtype=dtype, B=B, N=N, NKV=Nkv, S=S, P=P, H=H, HV=Hv, q=head_strides(_shape(q)),
                k=head_strides(_shape(k)), v=head_strides(_shape(v)), out=head_strides(_shape(out)), scale=scale,
                softcap=softcap, empty=int(nan_zero), nan_zero=nan_zero, **spec)
    mr = None if m is None else m.astype(dtype).astype(np.float64)  # the kernel rounds the mask to dtype
    want = attn_oracle.attention(q, k, v, scale, mask=mr, visible=vis, softcap=softcap,
                                 empty="zero" if nan_zero else "nan", nan_zero=nan_zero)
    return full, arrays, out, want


WARP = [  # dtype, G, S, H, Hv, P, options
    ("float16", 3, 1, 64, 64, 256, dict(Nkv=3, garbage=True)),  # SmolLM2-135M's decode step
    ("float32", 1, 1, 128, 128, 256, dict(B=2, garbage=True)),
    ("float16", 4, 2, 64, 64, 100, dict(mask="per_head", empty_row=True)),
    ("float32", 8, 2, 128, 128, 200, dict(mask=None, nan_key=True, nan_zero=False)),  # 16 rows: 4 warps
    ("float16", 8, 1, 128, 128, 300, dict(softcap=8.0, nan_key=True)),  # two splits, merged
    ("float16", 3, 2, 64, 64, 90, dict(mask=None, causal=True, kv_len=[90, 41], B=2, garbage=True)),
    ("float32", 4, 1, 64, 32, 50, dict(kv_len=[50, 0], B=2, nan_zero=False)),  # an entry without keys: NaN
    ("float16", 1, 1, 80, 16, 33, dict(mask="per_head")),  # odd key head size, 16 values: 2 lanes per row
    ("float16", 4, 1, 64, 64, 1000, dict(max_splits=1)),  # one block: 4 steps of 32 keys per warp
    ("float32", 3, 2, 128, 64, 700, dict(mask="per_head", max_splits=2, softcap=5.0)),  # 2 splits of 512 keys
]


@pytest.mark.parametrize("dtype,G,S,H,Hv,P,opts", WARP)
def test_warp_kernel_decode_shapes_match_numpy(kernel, dtype, G, S, H, Hv, P, opts):
    opts = dict(opts)
    max_splits = opts.pop("max_splits", attention_gpu.MAX_SPLITS)
    spec, arrays, out, want = _warp_case(np.random.default_rng(P + G), dtype, G, S, H, Hv, P, **opts)
    plan = make_plan(spec, max_splits)
    _check_kernel(plan, kernel)
    attn_host.run(plan, arrays, out)
    np.testing.assert_allclose(out.astype(np.float64), want, *TOL[dtype])
    if opts.get("empty_row"):
        assert np.all(out[0, 0, 0] == 0)
    if opts.get("nan_key"):  # KV head 0's query rows saw the NaN logit
        bad = out[0, :G, 0]
        assert np.all(bad == 0) if spec.nan_zero else np.all(np.isnan(bad))


@pytest.fixture(params=[True, False], ids=["v_early", "v_late"])
def v_early(request, monkeypatch):
    """``MIGRAPHX_ATTN_V_EARLY`` on (the default) or off, for the warp kernel's plans."""
    monkeypatch.setattr(attention_gpu, "v_early_setting", lambda: request.param)
    return request.param


def test_warp_kernel_element_wise_variant_and_cache_layout(v_early):
    """The exports' transposed cache layout, run by the element-wise variant (a misaligned cache) and the
    vector one: both equal the oracle."""
    rng = np.random.default_rng(8)
    plan, arrays, out, want = _decode(rng, "float16", 1, 9, 3, 1, 256, 64, 64, "cache")
    assert plan.kernel == "mgx_attn_warp" and (plan.vk, plan.vw, plan.kc, plan.vc) == (8, 8, 1, 1)
    assert plan.defines()["V_EARLY"] == int(v_early) and plan.v_early == (8 if v_early else 0)
    for vector in (True, False):
        out[...] = 7
        attn_host.run(plan, arrays, out, vector=vector)
        np.testing.assert_allclose(out.astype(np.float64), want, *TOL["float16"])


@pytest.mark.parametrize("split_rows", [32, 64])
def test_warp_kernel_splits_match_numpy(monkeypatch, split_rows, v_early):
    """MIGRAPHX_ATTN_SPLIT_ROWS below the cache length: the warp kernel's partial rows merged by
    mgx_attn_combine."""
    monkeypatch.setattr(attention_gpu, "split_rows_setting", lambda: split_rows)
    spec, arrays, out, want = _warp_case(np.random.default_rng(split_rows), "float16", 3, 1, 64, 64, 256, Nkv=3)
    plan = make_plan(spec)
    assert plan.kernel == "mgx_attn_warp" and plan.splits == 256 // split_rows and plan.launches == 2
    _check_v_early(plan, v_early)
    attn_host.run(plan, arrays, out)
    np.testing.assert_allclose(out.astype(np.float64), want, *TOL["float16"])


@pytest.mark.parametrize("case", [WARP[0], WARP[2], WARP[5]])
def test_warp_kernel_with_k_loaded_after_the_mask(monkeypatch, case, v_early):
    """Past ``EARLY_K_ROWS`` cache rows a K row is loaded only for a key the mask leaves visible (K_EARLY 0):
    the same answers, unwritten rows included."""
    monkeypatch.setattr(attention_gpu, "EARLY_K_ROWS", 8)
    dtype, G, S, H, Hv, P, opts = case
    spec, arrays, out, want = _warp_case(np.random.default_rng(P + G), dtype, G, S, H, Hv, P, **opts)
    plan = make_plan(spec)
    assert plan.kernel == "mgx_attn_warp" and plan.defines()["K_EARLY"] == 0
    _check_v_early(plan, v_early)
    attn_host.run(plan, arrays, out)
    np.testing.assert_allclose(out.astype(np.float64), want, *TOL[dtype])


@pytest.mark.parametrize("warps", [1, 2, 16, 32])
@pytest.mark.parametrize("case", [WARP[0], WARP[2], WARP[9]])
def test_warp_kernel_warps_per_block_match_numpy(monkeypatch, case, warps, v_early):
    """``MIGRAPHX_ATTN_WARPS``: other warp counts per block (other key ranges per warp, other steps, other V rows
    held per lane), V loaded early and late, unwritten cache rows included."""
    monkeypatch.setattr(attention_gpu, "warps_setting", lambda: warps)
    dtype, G, S, H, Hv, P, opts = case
    opts = dict(opts)
    max_splits = opts.pop("max_splits", attention_gpu.MAX_SPLITS)
    spec, arrays, out, want = _warp_case(np.random.default_rng(P + G + warps), dtype, G, S, H, Hv, P, **opts)
    plan = make_plan(spec, max_splits)
    assert plan.kernel == "mgx_attn_warp" and plan.block == (32 * plan.warps,) and plan.warps <= warps
    assert plan.warps == warps or plan.shared_bytes() * 2 > attention_gpu.SMEM_LIMIT
    _check_v_early(plan, v_early)
    attn_host.run(plan, arrays, out)
    np.testing.assert_allclose(out.astype(np.float64), want, *TOL[dtype])


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("case", [WARP[0], WARP[8], WARP[9]])
def test_warp_kernel_keys_past_the_held_v_rows_match_numpy(case, rows):
    """A V_EARLY plan holding fewer V rows per lane than a step has keys (VE below what the planner picks):
    the held rows are added from registers, the step's other keys loaded after the weights, as one sum."""
    dtype, G, S, H, Hv, P, opts = case
    opts = dict(opts)
    max_splits = opts.pop("max_splits", attention_gpu.MAX_SPLITS)
    spec, arrays, out, want = _warp_case(np.random.default_rng(P + G + rows), dtype, G, S, H, Hv, P, **opts)
    plan = make_plan(spec, max_splits)
    assert plan.v_early > rows
    plan = dataclasses.replace(plan, v_early=rows)
    d = plan.defines()
    assert (d["V_EARLY"], d["VE"]) == (1, rows)
    attn_host.run(plan, arrays, out)
    np.testing.assert_allclose(out.astype(np.float64), want, *TOL[dtype])
