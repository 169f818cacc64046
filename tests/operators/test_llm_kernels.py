"""The one-kernel forms of rotary_embedding, kv_cache_update and skip_layer_norm (operators/llm_kernels.cu):
the kernel file built as host C++ (one thread per grid-stride loop) against numpy written from the ops'
definitions; the gpu lowering of a two-layer onnxruntime-genai style decoder (one launch per op, the
GroupQueryAttention positions computed once); that decoder against onnxruntime CPU on each target."""
import os
import shutil
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper

import cu_host
from mgx_graph.operators import llm_gpu
from test_contrib_llm import assert_matches, compile_native, contrib_model, ort_outputs

CU = os.path.join(os.path.dirname(llm_gpu.__file__), "llm_kernels.cu")
i64, i32, f32 = np.int64, np.int32, np.float32
needs_gxx = pytest.mark.skipif(not cu_host.available(), reason="no g++")


@pytest.fixture(scope="module")
def lib():
    return cu_host.build(CU, T="float")


def _rope_oracle(x, cos, sin, pos, R, interleaved):
    """x [B, S, N, H]; cos / sin [M, R/2] at pos [B, S]."""
    c, s = cos[pos][:, :, None, :], sin[pos][:, :, None, :]
    y = x.copy()
    if interleaved:
        x1, x2 = x[..., 0:R:2], x[..., 1:R:2]
        y[..., 0:R:2], y[..., 1:R:2] = x1 * c - x2 * s, x1 * s + x2 * c
    else:
        h = R // 2
        x1, x2 = x[..., :h], x[..., h:R]
        y[..., :h], y[..., h:R] = x1 * c - x2 * s, x1 * s + x2 * c
    return y


@needs_gxx
@pytest.mark.parametrize("interleaved,R", [(0, 8), (1, 8), (0, 6)])
def test_rotary_kernel_reads_a_packed_qkv_slice(lib, interleaved, R):
    rng = np.random.default_rng(interleaved * 10 + R)
    B, S, N, Nkv, H, M = 2, 3, 3, 1, 8, 16
    W = (N + 2 * Nkv) * H
    packed = rng.normal(size=(B, S, W)).astype(f32)
    k = packed[:, :, N * H:(N + Nkv) * H].reshape(B, S, Nkv, H)  # the K slice of packed QKV: strided
    ang = rng.uniform(0, 3, size=(M, R // 2))
    cos, sin = np.cos(ang).astype(f32), np.sin(ang).astype(f32)
    pos = rng.integers(0, M, size=(B, S)).astype(i64)
    y = np.zeros((B, S, Nkv, H), f32)
    flat = packed.reshape(-1)[N * H:]  # contiguous from the slice's first element
    xs = (S * W, W, H, 1)
    ys = (S * Nkv * H, Nkv * H, H, 1)
    cu_host.launch(lib, "mgx_rotary", flat, cos, sin, pos, y, i64(B), i64(S), i64(Nkv), i64(H), i64(R),
                   *map(i64, xs), *map(i64, ys), i64(S), i64(1), i64(R // 2), i64(0), i64(0), i64(1),
                   i32(1), i32(interleaved))
    want = _rope_oracle(k.astype(np.float64), cos.astype(np.float64), sin.astype(np.float64), pos, R, interleaved)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


@needs_gxx
def test_rotary_kernel_per_token_tables_heads_first(lib):
    """x [B, N, S, H] (heads_axis 1) with cos / sin [1, S, R/2] per token (no position ids)."""
    rng = np.random.default_rng(3)
    B, N, S, H = 2, 2, 4, 4
    x = rng.normal(size=(B, N, S, H)).astype(f32)
    ang = rng.uniform(0, 3, size=(1, S, H // 2))
    cos, sin = np.cos(ang).astype(f32), np.sin(ang).astype(f32)
    y = np.zeros_like(x)
    bs = (N * S * H, H, S * H, 1)  # (b, s, n, h) element strides of [B, N, S, H]
    cu_host.launch(lib, "mgx_rotary", x, cos, sin, x, y, i64(B), i64(S), i64(N), i64(H), i64(H),
                   *map(i64, bs), *map(i64, bs), i64(0), i64(0), i64(0), i64(0), i64(H // 2), i64(1),
                   i32(0), i32(0))
    xt = x.transpose(0, 2, 1, 3).astype(np.float64)
    pos = np.tile(np.arange(S), (B, 1))
    want = _rope_oracle(xt, np.cos(ang[0]), np.sin(ang[0]), pos, H, 0).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def _kv_args(B, S, Nkv, H, P, L, full, nb=None, rot=None):
    """The sizes / strides of ``mgx_kv_write`` after its four arrays; ``rot``: (cos, sin, pos, R,
    interleaved) for the rotated write, else the rotation is off (its arrays passed as never-read dummies)."""
    nb = nb or (S * Nkv * H, Nkv * H, H, 1)
    pb = (Nkv * L * H, L * H, H, 1)
    ob = (Nkv * P * H, P * H, H, 1)
    head = (i64(B), i64(S), i64(Nkv), i64(H), i64(P), i64(L), *map(i64, nb), *map(i64, pb), *map(i64, ob), i32(full))
    if rot is None:
        dummy = np.zeros(1, f32)
        return head + (dummy, dummy, np.zeros(1, i64)) + tuple(i64(0) for _ in range(7)) + (i32(0),) * 3
    cos, sin, pos, R, inter = rot
    return head + (cos, sin, pos, i64(R), i64(S), i64(1), i64(R // 2), i64(0), i64(0), i64(1), i32(1), i32(1),
                   i32(inter))


@needs_gxx
@pytest.mark.parametrize("S", [1, 3])
def test_kv_write_in_place_writes_only_the_new_rows(lib, S):
    rng = np.random.default_rng(S)
    B, Nkv, H, P = 2, 2, 4, 8
    cache = rng.normal(size=(B, Nkv, P, H)).astype(f32)
    before = cache.copy()
    new = rng.normal(size=(B, S, Nkv, H)).astype(f32)
    start = np.array([2, 5], i64)
    cu_host.launch(lib, "mgx_kv_write", cache, new, start, cache, *_kv_args(B, S, Nkv, H, P, P, 0))
    want = before.copy()
    for b in range(B):
        want[b, :, start[b]:start[b] + S] = new[b].transpose(1, 0, 2)
    np.testing.assert_array_equal(cache, want)


@needs_gxx
def test_kv_write_full_copies_the_past_and_zeroes_the_rest(lib):
    rng = np.random.default_rng(7)
    B, S, Nkv, H, P, L = 2, 2, 1, 4, 8, 6
    past = rng.normal(size=(B, Nkv, L, H)).astype(f32)
    new = rng.normal(size=(B, S, Nkv, H)).astype(f32)
    start = np.array([3, 0], i64)
    out = np.full((B, Nkv, P, H), np.nan, f32)
    cu_host.launch(lib, "mgx_kv_write", past, new, start, out, *_kv_args(B, S, Nkv, H, P, L, 1))
    want = np.zeros_like(out)
    for b in range(B):
        want[b, :, :min(start[b], L)] = past[b, :, :min(start[b], L)]
        want[b, :, start[b]:start[b] + S] = new[b].transpose(1, 0, 2)
    np.testing.assert_array_equal(out, want)


@needs_gxx
@pytest.mark.parametrize("D", [576, 7])
@pytest.mark.parametrize("simplified,skip_rows,extras", [(1, 6, False), (0, 3, True), (1, 1, True)])
def test_skip_norm_kernel(lib, simplified, skip_rows, extras, D):
    rng = np.random.default_rng(simplified + skip_rows)
    rows, eps = 6, 1e-5
    x = rng.normal(size=(rows, D)).astype(f32)
    skip = rng.normal(size=(skip_rows, D)).astype(f32)
    gamma, beta, bias = (rng.uniform(0.5, 1.5, D).astype(f32) for _ in range(3))
    y, sm = np.zeros_like(x), np.zeros_like(x)
    mean, inv = np.full(rows, -1, f32), np.full(rows, -1, f32)
    cu_host.launch(lib, "mgx_skip_norm", x, skip, gamma, beta, bias, y, mean, inv, sm, i64(rows), i64(D),
                   i64(skip_rows), f32(eps), i32(simplified), i32(1), i32(extras), i32(extras), i32(1), i32(1))
    s = x.astype(np.float64) + np.tile(skip, (rows // skip_rows, 1)) + (bias if extras else 0)
    mu = np.zeros((rows, 1)) if simplified else s.mean(axis=1, keepdims=True)
    iv = 1 / np.sqrt(((s - mu) ** 2).mean(axis=1, keepdims=True) + eps)
    want = (s - mu) * iv * gamma + (beta if extras else 0)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(sm, s, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(mean, mu[:, 0], atol=1e-5)
    np.testing.assert_allclose(inv, iv[:, 0], rtol=1e-4)


@needs_gxx
@pytest.mark.parametrize("S,inter,R", [(1, 0, 8), (2, 1, 8), (1, 0, 4)])
def test_kv_write_rotates_the_new_keys_of_a_packed_qkv_slice(lib, S, inter, R):
    """GroupQueryAttention's keys: read from the packed QKV row (strided), rotated at their positions and
    written in place as the new cache rows; the other rows keep their values."""
    rng = np.random.default_rng(S * 7 + R)
    B, N, Nkv, H, P, M = 2, 2, 1, 8, 8, 16
    W = (N + 2 * Nkv) * H
    packed = rng.normal(size=(B, S, W)).astype(f32)
    k = packed[:, :, N * H:(N + Nkv) * H].reshape(B, S, Nkv, H)
    ang = rng.uniform(0, 3, size=(M, R // 2))
    cos, sin = np.cos(ang).astype(f32), np.sin(ang).astype(f32)
    start = np.array([3, 5], i64)
    pos = (start[:, None] + np.arange(S)[None]).astype(i64)
    cache = rng.normal(size=(B, Nkv, P, H)).astype(f32)
    before = cache.copy()
    cu_host.launch(lib, "mgx_kv_write", cache, packed.reshape(-1)[N * H:], start, cache,
                   *_kv_args(B, S, Nkv, H, P, P, 0, nb=(S * W, W, H, 1), rot=(cos, sin, pos, R, inter)))
    rotated = _rope_oracle(k.astype(np.float64), cos.astype(np.float64), sin.astype(np.float64), pos, R, inter)
    want = before.astype(np.float64)
    for b in range(B):
        want[b, :, start[b]:start[b] + S] = rotated[b].transpose(1, 0, 2)
    np.testing.assert_allclose(cache, want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------------
# a two-layer decoder as onnxruntime-genai's builder lays it out (plain MatMul weights)
# ---------------------------------------------------------------------------------------------------
def genai_decoder(B=1, S=1, T=8, D=64, N=4, Nkv=2, F=96, layers=2, seed=0, dtype=np.float32):
    """Embedding-free decoder: SimplifiedLayerNormalization -> packed-QKV MatMul -> GroupQueryAttention
    (rotary; seqlens_k / total_sequence_length from attention_mask) -> MatMul -> SkipSimplified... ->
    gate / up MatMul, SiLU as Sigmoid * x, Mul -> MatMul -> SkipSimplified... into the next layer."""
    rng = np.random.default_rng(seed)
    H = D // N
    inits, nodes = {}, []
    ang = np.arange(64)[:, None] * (10000.0 ** (-np.arange(H // 2) / (H // 2)))[None]
    inits.update(cos=np.cos(ang).astype(dtype), sin=np.sin(ang).astype(dtype), one=np.array(1, np.int64),
                 axis1=np.array([1], np.int64), idx1=np.array(1, np.int64))
    nodes += [helper.make_node("ReduceSum", ["attention_mask", "axis1"], ["msum"], keepdims=0),
              helper.make_node("Sub", ["msum", "one"], ["msub"]),
              helper.make_node("Cast", ["msub"], ["seqlens_k"], to=TensorProto.INT32),
              helper.make_node("Shape", ["attention_mask"], ["mshape"]),
              helper.make_node("Gather", ["mshape", "idx1"], ["mlen"], axis=0),
              helper.make_node("Cast", ["mlen"], ["total"], to=TensorProto.INT32)]

    def w(name, *shape, scale=0.2):
        inits[name] = (rng.normal(size=shape) * scale).astype(dtype)
        return name

    hidden, resid = "hidden", None
    for i in range(layers):
        g = w(f"ln{i}a", D, scale=1.0)
        if resid is None:
            nodes.append(helper.make_node("SimplifiedLayerNormalization", [hidden, g], [f"n{i}"], epsilon=1e-5))
        else:
            nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [resid, hidden, g],
                                          [f"n{i}", "", "", f"r{i}a"], domain="com.microsoft", epsilon=1e-5))
        base = hidden if resid is None else f"r{i}a"
        nodes.append(helper.make_node("MatMul", [f"n{i}", w(f"qkv{i}", D, (N + 2 * Nkv) * H)], [f"qkv{i}o"]))
        nodes.append(helper.make_node(
            "GroupQueryAttention", [f"qkv{i}o", "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value",
                                    "seqlens_k", "total", "cos", "sin"],
            [f"att{i}", f"present.{i}.key", f"present.{i}.value"], domain="com.microsoft", num_heads=N,
            kv_num_heads=Nkv, do_rotary=1, scale=float(H) ** -0.5))
        nodes.append(helper.make_node("MatMul", [f"att{i}", w(f"o{i}", N * H, D)], [f"o{i}o"]))
        nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [base, f"o{i}o", w(f"ln{i}b", D, scale=1.0)],
                                      [f"m{i}", "", "", f"r{i}b"], domain="com.microsoft", epsilon=1e-5))
        nodes += [helper.make_node("MatMul", [f"m{i}", w(f"g{i}", D, F)], [f"g{i}o"]),
                  helper.make_node("MatMul", [f"m{i}", w(f"u{i}", D, F)], [f"u{i}o"]),
                  helper.make_node("Sigmoid", [f"g{i}o"], [f"sg{i}"]),
                  helper.make_node("Mul", [f"g{i}o", f"sg{i}"], [f"si{i}"]),
                  helper.make_node("Mul", [f"si{i}", f"u{i}o"], [f"h{i}"]),
                  helper.make_node("MatMul", [f"h{i}", w(f"d{i}", F, D)], [f"d{i}o"])]
        hidden, resid = f"d{i}o", f"r{i}b"
    nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [resid, hidden, w("lnf", D, scale=1.0)],
                                  ["out"], domain="com.microsoft", epsilon=1e-5))
    ins = {"hidden": np.zeros((B, S, D), dtype), "attention_mask": np.zeros((B, T), np.int64)}
    for i in range(layers):
        for kv in ("key", "value"):
            ins[f"past_key_values.{i}.{kv}"] = np.zeros((B, Nkv, T, H), dtype)
    outs = ["out"] + [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    return contrib_model(nodes, ins, outs, inits), (B, S, T, D, Nkv, H)


def _lower_gpu(model, disabled=()):
    """The program of ``model`` through the gpu pipeline up to lowering (no device needed)."""
    from mgx_graph.passes.compile_result import CompileResult
    from mgx_graph.onnx import parse_onnx
    from mgx_graph.passes import PassContext, PassManager, PipelineOptions
    from mgx_graph.compiler import detect_alias
    from mgx_graph.targets import gpu

    prog = parse_onnx(model)
    opts = PipelineOptions(fp16=False, hip_graph=False, alias=detect_alias(prog, prog.metadata), strict_alias=False,
                           host_ops=(), min_partition_size=4)
    groups = [g for g in gpu.pipeline(opts) if g.name not in ("graph", "memory")]
    PassManager(groups, PassContext("gpu", CompileResult(target="gpu")), disabled=set(disabled)).run(prog)
    return prog


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_decode_step_lowers_to_one_launch_per_op(dtype):
    layers = 3
    model, _ = genai_decoder(layers=layers, dtype=dtype)
    prog = _lower_gpu(model, {"fuse_rotary_kv"})  # the ops as GroupQueryAttention lowers to them
    ins = [i for i in prog.get_main_module().instructions if "kernel" in i.meta]
    by_op = {}
    for i in ins:
        by_op.setdefault(i.op.name, []).append(i)
    for name in ("rotary_embedding", "kv_cache_update", "skip_layer_norm"):
        assert by_op[name], name
        for i in by_op[name]:
            k = i.meta["kernel"]
            assert (k.launches, k.label) == (1, f"{name} (llm_kernels.cu)"), (name, k)
    # every layer's cache writes and attention read the same positions (computed once)
    assert len({id(i.inputs[2]) for i in by_op["kv_cache_update"]}) == 1
    assert len({id(i.inputs[3]) for i in by_op["grouped_attention"]}) == 1
    # per layer: 2 norms, 4 GEMMs (gate / up merged), the rotary of Q, 2 cache writes (the keys rotated
    # by theirs), attention, SiLU * up (one pointwise); once: the seqlens / positions arithmetic and the
    # final norm
    assert len(by_op["rotary_embedding"]) == layers
    assert sorted(i.op.rotary for i in by_op["kv_cache_update"]) == [0] * layers + [1] * layers
    layer = [i for i in ins if i.op.name in ("rotary_embedding", "kv_cache_update", "grouped_attention", "dot")
             or (i.op.name == "skip_layer_norm" and i is not by_op["skip_layer_norm"][-1])
             or (i.op.name == "pointwise" and i.shape.dtype == np.dtype(dtype).name)]
    launches = sum(i.meta["kernel"].launches for i in layer)
    assert launches <= 11 * layers, [(i.op.name, i.meta["kernel"].launches) for i in ins]
    once = sum(i.meta["kernel"].launches for i in ins) - launches
    assert once <= 8, [(str(i.op), i.meta["kernel"].launches) for i in ins if i not in layer]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_decode_step_writes_q_k_v_in_one_launch_per_layer(dtype):
    """With fuse_rotary_kv (the default) each layer's query rotation and K / V cache writes are one
    rotary_kv_write of one launch, both caches bound in place: two launches fewer per layer."""
    layers = 3
    model, _ = genai_decoder(layers=layers, dtype=dtype)
    fused, plain = _lower_gpu(model), _lower_gpu(model, {"fuse_rotary_kv"})
    ins = [i for i in fused.get_main_module().instructions if "kernel" in i.meta]
    writes = [i for i in ins if i.op.name == "rotary_kv_write"]
    assert len(writes) == layers and not any(i.op.name in ("rotary_embedding", "kv_cache_update") for i in ins)
    for w in writes:
        assert (w.meta["kernel"].launches, w.meta["kernel"].label) == (1, "rotary_kv_write (llm_kernels.cu)")
        assert w.meta["bind_param"][0] is None and all(w.meta["bind_param"][1:])
    launches = [sum(i.meta["kernel"].launches for i in p.get_main_module().instructions if "kernel" in i.meta)
                for p in (fused, plain)]
    assert launches[0] == launches[1] - 2 * layers


@pytest.mark.parametrize("S", [1, 5])
def test_two_layer_decoder_matches_onnxruntime(target, S):
    """A decode step (S = 1, two rows with 3 and 2 cached tokens) and a one-row prompt (S = 5) against
    onnxruntime CPU: the hidden output and the present caches' valid rows."""
    B, T = (2, 8) if S == 1 else (1, 8)
    model, (_, _, _, D, Nkv, H) = genai_decoder(B=B, S=S, T=T)
    rng = np.random.default_rng(S)
    lens = [4, 3] if S == 1 else [5]
    feeds = {"hidden": rng.normal(size=(B, S, D)).astype(f32),
             "attention_mask": (np.arange(T)[None] < np.array(lens)[:, None]).astype(np.int64)}
    for i in range(2):
        for kv in ("key", "value"):
            past = rng.normal(size=(B, Nkv, T, H)).astype(f32) if S == 1 else np.zeros((B, Nkv, T, H), f32)
            feeds[f"past_key_values.{i}.{kv}"] = past
    want = ort_outputs(model, feeds)
    prog = compile_native(model, target, alias=None)
    got = prog.run({k: v.copy() for k, v in feeds.items()})
    for b, n in enumerate(lens):
        rows = slice(0, 1) if S == 1 else slice(0, n)
        assert_matches([got[0][b, rows]], [want[0][b, rows]], np.float32, f"hidden row {b}")
        for j in range(1, 5):
            assert_matches([got[j][b, :, :n]], [want[j][b, :, :n]], np.float32, f"present {j} row {b}")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_kernel_source_compiles_for_the_device(dtype, tmp_path):
    """The source NVRTC gets (the element type's typedef, the fp16 header) builds as device code."""
    r = subprocess.run(["nvcc", "--cubin", "-x", "cu", "-", "-o", str(tmp_path / "k.cubin")],
                       input=llm_gpu.kernel_source(dtype), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
