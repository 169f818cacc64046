"""decode_attention, and grouped_attention's one-row (decode) steps, against a float64 numpy oracle
(tests/attn_oracle.py) on every target: the gpu target runs decode_attention.cu, split over the cache past
256 rows.  Random q / k / v / masks, GQA ratios 1, 3 and 4, cache lengths 1 .. 1000, float32 and float16,
rows that see no key, strided inputs (the exports' cache layout), and the errors of bad shapes.  The decode
shapes of few query rows per KV head (G = 1, 3, 4, 8; S = 1, 2; H = 64, 128) on the gpu target take
mgx_attn_warp (checked by the kernel label); the planner's choice (kernel, grid, block) is checked on the
host without a GPU."""
import numpy as np
import pytest

import mgx_graph
from mgx_graph import Program, Shape
from mgx_graph.operators import make_op
from mgx_graph.operators.gpu_lowering import table_kernel

import attn_oracle

TOL = {"float32": (1e-5, 1e-5), "float16": (3e-3, 3e-3)}


def _run(target, op, feeds: dict, views=None, labels=None):
    """Compile and run one ``op`` instruction over parameters ``feeds`` (``views``: {name: (op, shape of the
    parameter)}: the parameter is given in that shape and viewed by the op before the instruction;
    ``labels``: a list that gets the label of each ``op`` instruction's kernel)."""
    prog = Program()
    m = prog.get_main_module()
    args = []
    for name, a in feeds.items():
        view = (views or {}).get(name)
        p = m.add_parameter(name, Shape(a.dtype.name, a.shape if view is None else view[1]))
        args.append(p if view is None else m.add_instruction(view[0], [p]))
    m.add_return([m.add_instruction(op, args)])
    prog.compile(target=target)
    if labels is not None:
        labels += [i.meta["kernel"].label for md in prog.module_order() for i in md.instructions
                   if i.op.name == op.name]
    try:
        return prog.run(feeds if not views else {n: np.ascontiguousarray(views[n][2]) if n in views else a
                                                 for n, a in feeds.items()})[0]
    finally:
        prog.release()


def _mask(rng, B, S, P, dtype, heads=1):
    m = rng.normal(size=(B, heads, S, P))
    m[rng.random(m.shape) < 0.3] = -np.inf
    m[..., 0] = 0.0  # every row sees a key, except the one made empty below
    m[0, 0, 0, :] = -np.inf
    return m.astype(dtype)


CASES = [  # B, N, Nkv, S, P, H, Hv
    (1, 3, 3, 1, 1, 16, 16),  # one cached row, no grouping
    (1, 9, 3, 1, 7, 64, 64),  # SmolLM2's heads, GQA 3
    (2, 8, 2, 1, 256, 32, 32),  # GQA 4, a full single split
    (1, 12, 4, 2, 1000, 64, 32),  # GQA 3, four splits, two query rows
    (1, 4, 1, 3, 300, 80, 48),  # GQA 4 (one KV head), odd head sizes
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("B,N,Nkv,S,P,H,Hv", CASES)
def test_matches_numpy(target, dtype, B, N, Nkv, S, P, H, Hv):
    rng = np.random.default_rng(P + N)
    q = rng.normal(size=(B, N, S, H)).astype(dtype)
    k, v = rng.normal(size=(B, Nkv, P, H)).astype(dtype), rng.normal(size=(B, Nkv, P, Hv)).astype(dtype)
    mask = _mask(rng, B, S, P, dtype)
    scale = 1.0 / np.sqrt(H)
    op = make_op("decode_attention", scale=scale, mask=1, nan_zero=1)
    got = _run(target, op, {"q": q, "k": k, "v": v, "mask": mask})
    assert got.shape == (B, N, S, Hv) and got.dtype == dtype
    want = attn_oracle.attention(q, k, v, scale, mask=mask, nan_zero=True)
    np.testing.assert_allclose(got.astype(np.float64), want, *TOL[dtype])
    assert np.all(got[0, :, 0] == 0)  # the row with every key masked


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_without_mask_and_with_softcap(target, dtype):
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=s).astype(dtype) * 3 for s in ((1, 6, 1, 32), (1, 2, 40, 32), (1, 2, 40, 32)))
    op = make_op("decode_attention", scale=0.5, softcap=5.0)
    got = _run(target, op, {"q": q, "k": k, "v": v})
    np.testing.assert_allclose(got.astype(np.float64), attn_oracle.attention(q, k, v, 0.5, softcap=5.0), *TOL[dtype])


def test_a_row_that_sees_no_key_is_nan_without_the_guard(target):
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=s).astype("float32") for s in ((1, 4, 1, 16), (1, 2, 300, 16), (1, 2, 300, 16)))
    mask = _mask(rng, 1, 1, 300, "float32")
    got = _run(target, make_op("decode_attention", scale=0.25, mask=1), {"q": q, "k": k, "v": v, "mask": mask})
    assert np.all(np.isnan(got[0, :, 0]))


def test_hidden_cache_rows_are_not_read(target):
    """A -inf mask hides a key: NaN / inf in its K / V rows (cache rows never written) does not leak."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=s).astype("float16") for s in ((1, 6, 1, 64), (1, 2, 400, 64), (1, 2, 400, 64)))
    mask = np.zeros((1, 1, 1, 400), np.float16)
    mask[..., 123:] = -np.inf
    k[:, :, 123:] = np.nan
    v[:, :, 123:] = np.inf
    got = _run(target, make_op("decode_attention", scale=0.125, mask=1, nan_zero=1),
               {"q": q, "k": k, "v": v, "mask": mask})
    want = attn_oracle.attention(q, k[:, :, :123], v[:, :, :123], 0.125)
    np.testing.assert_allclose(got.astype(np.float64), want, *TOL["float16"])


def test_a_float32_mask_is_rounded_to_half(target):
    """What add(scores, convert(mask)) adds: -3.4e38 is -inf in half, so a row masked with it is empty."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.normal(size=s).astype("float16") for s in ((1, 3, 1, 16), (1, 1, 8, 16), (1, 1, 8, 16)))
    mask = np.where(np.arange(8) <= 4, 0, np.finfo(np.float32).min).astype(np.float32).reshape(1, 1, 1, 8)
    got = _run(target, make_op("decode_attention", scale=0.25, mask=1, nan_zero=1),
               {"q": q, "k": k, "v": v, "mask": mask})
    want = attn_oracle.attention(q, k[:, :, :5], v[:, :, :5], 0.25)
    np.testing.assert_allclose(got.astype(np.float64), want, *TOL["float16"])


def test_strided_query_and_cache_layouts(target):
    """q as a transpose of [B, S, N, H]; K / V as transposes of [P, B, Nkv, H] (the scatternd layout)."""
    rng = np.random.default_rng(5)
    B, N, Nkv, S, P, H = 2, 8, 2, 1, 600, 64
    qb = rng.normal(size=(B, S, N, H)).astype("float16")
    kb, vb = (rng.normal(size=(P, B, Nkv, H)).astype("float16") for _ in range(2))
    mask = _mask(rng, B, S, P, "float16", heads=N)
    q, k, v = qb.transpose(0, 2, 1, 3), kb.transpose(1, 2, 0, 3), vb.transpose(1, 2, 0, 3)
    t = make_op("transpose", permutation=[0, 2, 1, 3])
    tc = make_op("transpose", permutation=[1, 2, 0, 3])
    views = {"q": (t, qb.shape, qb), "k": (tc, kb.shape, kb), "v": (tc, vb.shape, vb)}
    got = _run(target, make_op("decode_attention", scale=0.125, mask=1, nan_zero=1),
               {"q": q, "k": k, "v": v, "mask": mask}, views)
    want = attn_oracle.attention(q, k, v, 0.125, mask=mask, nan_zero=True)
    np.testing.assert_allclose(got.astype(np.float64), want, *TOL["float16"])


@pytest.mark.parametrize("inputs,match", [
    ([("float32", (1, 4, 1, 8)), ("float32", (1, 3, 5, 8)), ("float32", (1, 3, 5, 8))], "Nkv dividing 4"),
    ([("float32", (1, 4, 1, 8)), ("float16", (1, 2, 5, 8)), ("float16", (1, 2, 5, 8))], "key"),
    ([("float32", (1, 4, 1, 8)), ("float32", (1, 2, 5, 8)), ("float32", (1, 2, 6, 8))], "value"),
    ([("float64", (1, 4, 1, 8)), ("float64", (1, 2, 5, 8)), ("float64", (1, 2, 5, 8))], "query"),
    ([("float32", (1, 4, 1, 8)), ("float32", (1, 2, 5, 8)), ("float32", (1, 2, 5, 8)), ("float32", (1, 2, 1, 5))],
     "mask"),
])
def test_bad_shapes_raise(inputs, match):
    op = make_op("decode_attention", scale=1.0, mask=int(len(inputs) == 4))
    with pytest.raises(mgx_graph.ShapeError, match=match):
        op.compute_shape([Shape(d, s) for d, s in inputs])


# -- grouped_attention, one row per batch entry ----------------------------------------------------------------
GROUPED = [  # dtype, B, N, Nkv, P, H, kv_len, options
    ("float32", 2, 6, 2, 20, 16, [20, 7], {}),
    ("float16", 1, 9, 3, 256, 64, [200], {}),
    ("float16", 2, 8, 2, 1000, 64, [1000, 333], dict(local_window=100, softcap=20.0)),
    ("float32", 2, 4, 1, 64, 32, [50, 0], dict(bias=40, sink=True)),  # an entry that sees no key: the sink alone
    ("float32", 2, 4, 4, 30, 16, [30, 0], {}),  # no key, no sink: the mean of all the values
]


@pytest.mark.parametrize("dtype,B,N,Nkv,P,H,kv_len,opts", GROUPED)
def test_grouped_one_row_steps_match_numpy(target, dtype, B, N, Nkv, P, H, kv_len, opts):
    rng = np.random.default_rng(P + B)
    q = rng.normal(size=(B, 1, N, H)).astype(dtype)
    k, v = rng.normal(size=(B, Nkv, P, H)).astype(dtype), rng.normal(size=(B, Nkv, P, H)).astype(dtype)
    lens = np.array(kv_len, np.int64)
    pos = (lens - 1).reshape(B, 1)
    feeds = {"q": q, "k": k, "v": v, "pos": pos, "kv_len": lens, "rows": np.arange(P, dtype=np.int64)}
    window, softcap = opts.get("local_window", -1), opts.get("softcap", 0.0)
    t = np.arange(P)
    vis = (t < lens[:, None]) & (t <= pos) & ((t > pos - window) if window > 0 else True)
    mask = None
    if opts.get("bias"):
        feeds["bias"] = rng.normal(size=(B, N, 1, opts["bias"])).astype(dtype)
        mask = np.concatenate([feeds["bias"].astype(np.float64), np.zeros((B, N, 1, P - opts["bias"]))], -1)
    if opts.get("sink"):
        feeds["sink"] = rng.normal(size=(N,)).astype(dtype)
    op = make_op("grouped_attention", local_window=window, softcap=softcap, bias=int("bias" in feeds),
                 sink=int("sink" in feeds))
    got = _run(target, op, feeds)
    want = attn_oracle.attention(q.transpose(0, 2, 1, 3), k, v, 1.0 / np.sqrt(H), mask=mask, visible=vis[:, None, None],
                                 softcap=softcap, sink=feeds.get("sink"), empty="mean")
    np.testing.assert_allclose(got.astype(np.float64), want.transpose(0, 2, 1, 3).reshape(B, 1, N * H), *TOL[dtype])


# -- the warp kernel (mgx_attn_warp): few query rows per KV head ----------------------------------------------------
def _decode_kernel() -> str:
    """The kernel the planner gives these decode shapes (equal head sizes of 64 / 128): ``mgx_attn_lanes``
    while ``MIGRAPHX_ATTN_LANES`` is on (the default), else ``mgx_attn_warp``."""
    from mgx_graph.operators.attention_gpu import lanes_setting

    return "mgx_attn_lanes" if lanes_setting() else "mgx_attn_warp"


@pytest.fixture(params=["lanes", "lanes-branches", "warp"])
def decode_kernel_setting(request, monkeypatch, target):
    """Both decode kernels on the gpu target: ``MIGRAPHX_ATTN_LANES`` unset (``mgx_attn_lanes``, built without
    branches by default and with them under ``MIGRAPHX_ATTN_LANES_BRANCHLESS=0``) and ``0`` (``mgx_attn_warp``);
    other targets run once."""
    from mgx_graph import env

    if request.param != "lanes":
        if target != "gpu":
            pytest.skip("the kernel setting is the gpu planner's")
        if request.param == "warp":
            monkeypatch.setenv("MIGRAPHX_ATTN_LANES", "0")
        else:
            monkeypatch.setenv("MIGRAPHX_ATTN_LANES_BRANCHLESS", "0")
    env._reset_for_tests()
    yield request.param
    env._reset_for_tests()


@pytest.fixture
def warp_planner(monkeypatch):
    """``MIGRAPHX_ATTN_LANES=0``: the planner as it is for specs ``mgx_attn_lanes`` does not take."""
    from mgx_graph import env

    monkeypatch.setenv("MIGRAPHX_ATTN_LANES", "0")
    env._reset_for_tests()
    yield
    env._reset_for_tests()


def _tail_mask(rng, B, S, P, visible):
    """float32 [B, 1, S, P]: 0 (every seventh key a random bias) up to ``visible[b]`` keys, -inf after (the
    exports' decode mask); entry 0, row 0 sees no key."""
    m = np.where(np.arange(P) < np.asarray(visible)[:, None, None, None], 0.0, -np.inf) * np.ones((B, 1, S, P))
    m[..., ::7] += rng.normal(size=m[..., ::7].shape)
    m[0, 0, 0] = -np.inf
    return m.astype(np.float32)


WARP_DECODE = [(G, S, H, dtype) for G in (1, 3, 4, 8) for S in (1, 2) for H in (64, 128)
               for dtype in ("float16", "float32")]


@pytest.mark.parametrize("G,S,H,dtype", WARP_DECODE)
def test_decode_shapes_take_the_warp_kernel(target, decode_kernel_setting, G, S, H, dtype):
    """decode_attention with the exports' float32 mask (-inf tail, one row masked whole), a NaN in a
    visible key of entry 1's KV head 0 (its rows give 0: nan_zero) and unwritten (NaN / inf) rows past the
    visible keys; softcap on every other shape; 256 cache rows (one split) or 300 (two, merged)."""
    rng = np.random.default_rng(G * 100 + S * 10 + H)
    B, Nkv, P = 2, 3 if G == 3 else 2, 256 if H == 64 else 300
    softcap = 10.0 if (G + S) % 2 else 0.0
    q = rng.normal(size=(B, G * Nkv, S, H)).astype(dtype)
    k, v = rng.normal(size=(B, Nkv, P, H)).astype(dtype), rng.normal(size=(B, Nkv, P, H)).astype(dtype)
    visible = [20, 130]
    mask = _tail_mask(rng, B, S, P, visible)
    k[1, 0, 5, 7] = np.nan
    for b, n in enumerate(visible):
        k[b, :, n:], v[b, :, n:] = np.nan, np.inf
    scale = 1.0 / np.sqrt(H)
    labels = []
    op = make_op("decode_attention", scale=scale, softcap=softcap, mask=1, nan_zero=1)
    got = _run(target, op, {"q": q, "k": k, "v": v, "mask": mask}, labels=labels)
    if target == "gpu":
        assert len(labels) == 1 and _decode_kernel() in labels[0], labels
    want = attn_oracle.attention(q, k, v, scale, mask=mask.astype(dtype), softcap=softcap, nan_zero=True)
    assert np.all(want[1, :G] == 0) and np.all(want[0, :, 0] == 0)  # the NaN key's rows, the masked row
    np.testing.assert_allclose(got.astype(np.float64), want, *TOL[dtype])


@pytest.mark.parametrize("G,H,dtype", [(G, H, d) for G in (1, 3, 4, 8) for H in (64, 128)
                                       for d in ("float16", "float32")])
def test_grouped_decode_steps_take_the_warp_kernel(target, decode_kernel_setting, G, H, dtype):
    """grouped_attention's one-row steps (kv_len, causal) with unwritten key rows past an entry's length
    (NaN: never used), an entry without keys (the mean of all values) and softcap on half the shapes."""
    rng = np.random.default_rng(G * 10 + H)
    B, Nkv, P = 3, 2, 200
    N = G * Nkv
    lens = np.array([P, 77, 0], np.int64)
    q = rng.normal(size=(B, 1, N, H)).astype(dtype)
    k, v = rng.normal(size=(B, Nkv, P, H)).astype(dtype), rng.normal(size=(B, Nkv, P, H)).astype(dtype)
    k[1, :, 77:] = np.nan
    pos = (lens - 1).reshape(B, 1)
    softcap = 15.0 if G % 2 else 0.0
    feeds = {"q": q, "k": k, "v": v, "pos": pos, "kv_len": lens, "rows": np.arange(P, dtype=np.int64)}
    labels = []
    got = _run(target, make_op("grouped_attention", softcap=softcap), feeds, labels=labels)
    if target == "gpu":
        assert len(labels) == 1 and _decode_kernel() in labels[0], labels
    t = np.arange(P)
    vis = (t < lens[:, None]) & (t <= pos)
    want = attn_oracle.attention(q.transpose(0, 2, 1, 3), k, v, 1.0 / np.sqrt(H), visible=vis[:, None, None],
                                 softcap=softcap, empty="mean")
    want = want.transpose(0, 2, 1, 3).reshape(B, 1, N * H)
    assert np.all(np.isfinite(want[:2]))
    np.testing.assert_allclose(got.astype(np.float64), want, *TOL[dtype])


def _shape_of(a) -> Shape:
    return Shape(a.dtype.name, a.shape, tuple(s // a.itemsize for s in a.strides))


def _gpu_plan(op, arrays):
    shapes = [_shape_of(a) for a in arrays]
    kern = table_kernel(op, shapes, op.compute_shape(shapes))
    return kern, kern.fn.plan


def test_the_planner_picks_the_warp_kernel_for_smollm2s_decode_step(warp_planner):
    """SmolLM2-135M's fp16 decode step (9 query heads over 3 KV heads, 64-wide heads, a float32 mask over
    256 cache rows): one launch of mgx_attn_warp, a block of 8 warps per KV head, 8 value columns per lane
    (16-byte K and V loads), the mask read once per key; no GPU needed (the plan only)."""
    q = np.zeros((1, 9, 1, 64), np.float16)
    k = v = np.zeros((1, 3, 256, 64), np.float16)
    mask = np.zeros((1, 1, 1, 256), np.float32)
    kern, plan = _gpu_plan(make_op("decode_attention", scale=0.125, mask=1, nan_zero=1), [q, k, v, mask])
    assert (plan.kernel, plan.grid, plan.block, plan.splits, kern.launches) == ("mgx_attn_warp", (3, 1), (256,), 1, 1)
    d = plan.defines()
    assert (d["ROWS"], d["NW"], d["VK"], d["VV"], d["VW"], d["LPR"], d["MASK_ONE"]) == (3, 8, 8, 8, 8, 8, 1)
    assert (d["HAS_MASK"], d["MASK_ROUND"], d["NAN_ZERO"], d["EMPTY"], d["HAS_LEN"], d["CAUSAL"]) == (1, 1, 1, 1, 0, 0)
    assert kern.label == "decode_attention (decode_attention.cu mgx_attn_warp, 1 split)"
    assert "mgx_attn_warp" in plan.source() and "MGX_ATTN_WARP 1" in plan.source()


@pytest.mark.parametrize("N,Nkv,S,H,Hv,P,dtype,want", [
    (8, 1, 2, 128, 128, 256, "float32", ("mgx_attn_warp", (1, 1), (128,), 1)),  # 16 rows: 4 warps fit
    (9, 3, 1, 64, 64, 1000, "float16", ("mgx_attn_warp", (3, 4), (256,), 4)),  # 4 splits, then the merge
    (32, 1, 1, 64, 64, 64, "float16", ("mgx_attn_split", (4, 1), (256,), 1)),  # 32 rows per KV head: 4 groups
    (6, 2, 1, 64, 48, 64, "float16", ("mgx_attn_split", (2, 1), (256,), 1)),  # Hv not a power of two
    (16, 1, 1, 256, 256, 64, "float16", ("mgx_attn_split", (2, 1), (256,), 1)),  # 16 rows of 256 values: 2 groups
])
def test_the_planners_choice_of_kernel_grid_and_block(warp_planner, N, Nkv, S, H, Hv, P, dtype, want):
    q = np.zeros((1, N, S, H), dtype)
    k, v = np.zeros((1, Nkv, P, H), dtype), np.zeros((1, Nkv, P, Hv), dtype)
    kern, plan = _gpu_plan(make_op("decode_attention", scale=0.1), [q, k, v])
    assert (plan.kernel, plan.grid, plan.block, plan.splits) == want
    assert kern.launches == 1 + (plan.splits > 1) and plan.kernel in kern.label


def test_migraphx_attn_warp_0_selects_the_block_kernel(warp_planner, monkeypatch):
    from mgx_graph import env

    monkeypatch.setenv("MIGRAPHX_ATTN_WARP", "0")
    env._reset_for_tests()
    q, k = np.zeros((1, 9, 1, 64), np.float16), np.zeros((1, 3, 256, 64), np.float16)
    kern, plan = _gpu_plan(make_op("decode_attention", scale=0.125), [q, k, k])
    assert (plan.kernel, plan.grid, plan.block) == ("mgx_attn_split", (3, 1), (256,))
    assert "mgx_attn_split" in kern.label


def _smollm2_plan():
    q = np.zeros((1, 9, 1, 64), np.float16)
    k = np.zeros((1, 3, 256, 64), np.float16)
    mask = np.zeros((1, 1, 1, 256), np.float32)
    return _gpu_plan(make_op("decode_attention", scale=0.125, mask=1, nan_zero=1), [q, k, k, mask])[1]


def test_v_early_is_planned_for_smollm2s_decode_step_unless_turned_off(warp_planner, monkeypatch):
    """V_EARLY by default: each lane holds its 8 V rows of a 32-key step (8 lanes per 64-wide V row, so every
    4th key), 64 halves; ``MIGRAPHX_ATTN_V_EARLY=0`` plans the V loads after the weights."""
    from mgx_graph import env

    d = _smollm2_plan().defines()
    assert (d["V_EARLY"], d["VE"], d["LPR"], d["VV"]) == (1, 8, 8, 8)
    assert "#define V_EARLY 1" in _smollm2_plan().source()
    monkeypatch.setenv("MIGRAPHX_ATTN_V_EARLY", "0")
    env._reset_for_tests()
    plan = _smollm2_plan()
    assert (plan.v_early, plan.defines()["V_EARLY"], plan.kernel, plan.block) == (0, 0, "mgx_attn_warp", (256,))


@pytest.mark.parametrize("N,Nkv,S,H,Hv,P,dtype,warps,want", [
    (9, 3, 1, 64, 64, 256, "float16", 8, 8),  # 32-key steps, every 4th key a lane's: 8 rows of 8 halves
    (9, 3, 1, 64, 64, 256, "float16", 16, 4),  # 16 keys per warp: 4 rows
    (9, 3, 1, 64, 64, 40, "float16", 8, 2),  # 5 keys per warp: 2 rows
    (2, 1, 1, 128, 128, 256, "float16", 8, 0),  # 16 lanes per V row: 16 rows of 8 halves, over the limit
    (2, 1, 1, 128, 128, 256, "float16", 16, 8),  # 16 keys per warp: 8 rows of 8, at the limit
    (1, 1, 1, 128, 128, 64, "float32", 8, 8),  # 32 lanes per V row, 8 keys per warp: 8 rows of 4 floats
    (1, 1, 1, 128, 128, 256, "float32", 8, 0),  # 32 rows of 4 floats
])
def test_the_v_rows_a_lane_holds(warp_planner, monkeypatch, N, Nkv, S, H, Hv, P, dtype, warps, want):
    """``VE``: the V rows a lane holds for one step (the keys of a step it adds), 0 (V_EARLY off) where
    they are more than ``V_EARLY_ELEMS`` elements."""
    from mgx_graph import env

    monkeypatch.setenv("MIGRAPHX_ATTN_WARPS", str(warps))
    env._reset_for_tests()
    q = np.zeros((1, N, S, H), dtype)
    k, v = np.zeros((1, Nkv, P, H), dtype), np.zeros((1, Nkv, P, Hv), dtype)
    plan = _gpu_plan(make_op("decode_attention", scale=0.1), [q, k, v])[1]
    d = plan.defines()
    assert (plan.kernel, plan.warps, plan.v_early, d["V_EARLY"]) == ("mgx_attn_warp", warps, want, int(want > 0))
    assert want * d["VV"] <= 64 and (want == 0 or want * (32 // d["LPR"]) >= min(32, -(-P // warps)))


@pytest.mark.parametrize("setting,want", [("2", 2), ("4", 4), ("16", 16), ("32", 32), ("3", 2), ("12", 8),
                                          ("1", 1), ("", 8)])
def test_migraphx_attn_warps_sets_the_warps_per_block(warp_planner, monkeypatch, setting, want):
    """``MIGRAPHX_ATTN_WARPS``: a power of two in 1 .. 32 (rounded down; unset or empty: the default 8)."""
    from mgx_graph import env

    monkeypatch.setenv("MIGRAPHX_ATTN_WARPS", setting)
    env._reset_for_tests()
    plan = _smollm2_plan()
    assert (plan.kernel, plan.warps, plan.block, plan.defines()["NW"], plan.defines()["NT"]) == \
        ("mgx_attn_warp", want, (32 * want,), want, 32 * want)


@pytest.mark.parametrize("setting", ["64", "0", "-4", "many"])
def test_migraphx_attn_warps_out_of_range_is_a_parameter_error(monkeypatch, setting):
    """A value outside 1 .. 32 (or not a number) names the variable instead of being clamped or ignored."""
    from mgx_graph import ParameterError, env, settings

    monkeypatch.setenv("MIGRAPHX_ATTN_WARPS", setting)
    env._reset_for_tests()
    with pytest.raises(ParameterError, match=f"MIGRAPHX_ATTN_WARPS='{setting}': expected an integer in 1 .. 32"):
        settings.current()


def test_migraphx_attn_warps_is_cut_to_the_shared_memory(warp_planner, monkeypatch):
    """16 query rows of 128 float32 values: 32 warps' partial rows would need about 275 KB of shared memory,
    4 fit in 48 KiB."""
    from mgx_graph import env
    from mgx_graph.operators.attention_gpu import SMEM_LIMIT

    monkeypatch.setenv("MIGRAPHX_ATTN_WARPS", "32")
    env._reset_for_tests()
    q, k = np.zeros((1, 8, 2, 128), np.float32), np.zeros((1, 1, 200, 128), np.float32)
    plan = _gpu_plan(make_op("decode_attention", scale=0.1), [q, k, k])[1]
    assert plan.kernel == "mgx_attn_warp" and plan.warps == 4 and plan.block == (128,)
    assert plan.shared_bytes() <= SMEM_LIMIT < 2 * plan.shared_bytes()


def test_the_planner_picks_the_lanes_kernel_for_smollm2s_decode_step():
    """By default SmolLM2's fp16 decode step runs mgx_attn_lanes: one block of 8 warps per query head (grid 9),
    8 lanes per key (64 columns in 16-byte loads), 8 key steps read at once, the planned sizes and strides
    compiled in, 32-bit offsets."""
    q = np.zeros((1, 9, 1, 64), np.float16)
    k = v = np.zeros((1, 3, 256, 64), np.float16)
    mask = np.zeros((1, 1, 1, 256), np.float32)
    kern, plan = _gpu_plan(make_op("decode_attention", scale=0.125, mask=1, nan_zero=1), [q, k, v, mask])
    assert (plan.kernel, plan.grid, plan.block, plan.splits, kern.launches) == ("mgx_attn_lanes", (9, 1), (256,), 1, 1)
    d = plan.defines()
    assert (d["NW"], d["VK"], d["LC"], d["LU"], d["QS"], d["QN"], d["QG"], d["IDX"]) == (8, 8, 8, 8, 1, 9, 3, "int")
    assert (d["KST"], d["VST"], d["KSH"], d["VSH"], d["QSH"], d["MST"]) == (64, 64, 1, 1, 1, 1)
    assert kern.label == "decode_attention (decode_attention.cu mgx_attn_lanes, 1 split)"


@pytest.mark.parametrize("N,Nkv,S,H,Hv,P,dtype,want", [
    (8, 1, 2, 128, 128, 256, "float32", ("mgx_attn_lanes", (16, 1), (256,), 1)),  # 32 lanes per key
    (9, 3, 1, 64, 64, 1000, "float16", ("mgx_attn_lanes", (9, 4), (256,), 4)),  # 4 splits, then the merge
    (32, 1, 1, 64, 64, 64, "float16", ("mgx_attn_lanes", (32, 1), (256,), 1)),  # many rows: one block each
    (6, 2, 1, 64, 48, 64, "float16", ("mgx_attn_split", (2, 1), (256,), 1)),  # H != Hv: not lanes
    (4, 2, 1, 4, 4, 64, "float16", ("mgx_attn_warp", (2, 1), (256,), 1)),  # under one 16-byte load: not lanes
])
def test_the_lanes_kernels_plans(N, Nkv, S, H, Hv, P, dtype, want):
    q = np.zeros((1, N, S, H), dtype)
    k, v = np.zeros((1, Nkv, P, H), dtype), np.zeros((1, Nkv, P, Hv), dtype)
    kern, plan = _gpu_plan(make_op("decode_attention", scale=0.1), [q, k, v])
    assert (plan.kernel, plan.grid, plan.block, plan.splits) == want
    assert kern.launches == 1 + (plan.splits > 1) and plan.kernel in kern.label


def test_the_lanes_kernel_takes_64_bit_offsets_where_int_would_overflow():
    """A K row stride of 2^23 elements over 300 rows passes 2^31: ``IDX`` is ``long long`` (offsets in 64 bits)."""
    from mgx_graph.operators import attention_gpu as ag

    base = dict(dtype="float16", B=1, N=2, NKV=1, S=1, P=300, H=64, HV=64, q=(128, 64, 0, 1), out=(128, 64, 0, 1),
                scale=0.125)
    small = ag.make_plan(ag.Spec(k=(300 * 64, 300 * 64, 64, 1), v=(300 * 64, 300 * 64, 64, 1), **base))
    big = ag.make_plan(ag.Spec(k=(300 << 23, 300 << 23, 1 << 23, 1), v=(300 * 64, 300 * 64, 64, 1), **base))
    assert small.kernel == big.kernel == "mgx_attn_lanes"
    assert (small.defines()["IDX"], big.defines()["IDX"]) == ("int", "long long")


def test_a_query_without_heads_gets_no_kernel():
    """N = 0 query heads: the planner names the sizes (ValueError) instead of compiling a lanes kernel that
    divides by N / NKV = 0; the op then runs the array-library evaluation (a warning says so)."""
    from mgx_graph.operators import attention_gpu as ag

    spec = ag.Spec(dtype="float16", B=1, N=0, NKV=1, S=1, P=8, H=64, HV=64, q=(0, 64, 0, 1), k=(512, 512, 64, 1),
                   v=(512, 512, 64, 1), out=(0, 64, 0, 1), scale=0.125)
    with pytest.raises(ValueError, match="N=0"):
        ag.make_plan(spec)
