"""onnxruntime contrib ops used by LLM and BERT-style exports (fused normalizations, the GELU family,
RotaryEmbedding, MatMulNBits, GroupQueryAttention), each a small ONNX model compiled natively (no
host-evaluated ``onnx_op``) and compared with onnxruntime CPU (or, where onnxruntime departs from
its own spec, with numpy written from the spec)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mgx_graph

NP2ONNX = {np.dtype(k): v for k, v in {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
                                        "int64": TensorProto.INT64, "int32": TensorProto.INT32,
                                        "uint8": TensorProto.UINT8}.items()}
TOL = {np.float32: dict(rtol=1e-4, atol=1e-5), np.float16: dict(rtol=1e-2, atol=5e-3)}


def contrib_model(nodes, inputs: dict, outputs: list, inits: dict | None = None, opset: int = 21):
    """A model over ``nodes`` with graph inputs named and shaped as ``inputs`` (name -> array), untyped
    outputs ``outputs``, initializers ``inits``; opsets ai.onnx ``opset`` and com.microsoft 1."""
    ins = [helper.make_tensor_value_info(n, NP2ONNX[a.dtype], list(a.shape)) for n, a in inputs.items()]
    outs = [helper.make_value_info(n, onnx.TypeProto()) for n in outputs]
    g = helper.make_graph(nodes, "contrib", ins, outs,
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m


def ort_outputs(model, feeds):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def compile_native(model, target, **kw):
    """Compile and check that every node became native instructions (nothing left to onnx.reference)."""
    prog = mgx_graph.compile(model, target=target, **kw)
    assert "onnx_op" not in str(prog)
    return prog


def assert_matches(got, want, dtype, what=""):
    """Same shapes and types, values within the dtype's tolerance (for float16 the absolute tolerance
    scales with the output's magnitude: half rounding of a sum is relative to its terms)."""
    assert len(got) == len(want), what
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (what, k, g.shape, w.shape, g.dtype, w.dtype)
        tol = dict(TOL[dtype])
        if dtype == np.float16 and w.size:
            tol["atol"] *= max(1.0, float(np.abs(w.astype(np.float64)).max()))
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), err_msg=f"{what} output {k}", **tol)


def run_both(model, feeds, target, dtype, runs=1, **kw):
    want = ort_outputs(model, feeds)
    prog = compile_native(model, target, **kw)
    for _ in range(runs):
        got = prog.run(feeds)
        assert_matches(got, want, dtype)
    return prog, got


# ---------------------------------------------------------------------------------------------------
# fused normalizations
# ---------------------------------------------------------------------------------------------------
SKIP_CASES = {
    "layer": dict(op="SkipLayerNormalization"),
    "layer_beta_bias_stats": dict(op="SkipLayerNormalization", beta=True, bias=True, outs=4),
    "layer_sum_only": dict(op="SkipLayerNormalization", bias=True, outs=(0, 3)),
    "layer_skip_2d": dict(op="SkipLayerNormalization", beta=True, skip=(5, 16)),
    "layer_skip_batch1": dict(op="SkipLayerNormalization", skip=(1, 5, 16), outs=4),
    "layer_2d_input": dict(op="SkipLayerNormalization", x=(6, 16), skip=(6, 16), beta=True, outs=4),
    "simplified": dict(op="SkipSimplifiedLayerNormalization"),
    "simplified_bias_stats": dict(op="SkipSimplifiedLayerNormalization", bias=True, outs=4),
    "simplified_inv_std_sum": dict(op="SkipSimplifiedLayerNormalization", outs=(0, 2, 3)),
    "simplified_2d_input": dict(op="SkipSimplifiedLayerNormalization", x=(6, 16), skip=(6, 16), bias=True),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", sorted(SKIP_CASES))
def test_skip_layer_norm(case, dtype, target):
    c = SKIP_CASES[case]
    rng = np.random.default_rng(1)
    xs = c.get("x", (2, 5, 16))
    D = xs[-1]
    feeds = {"x": (rng.normal(size=xs) * 2 + 0.5).astype(dtype), "skip": rng.normal(size=c.get("skip", xs)).astype(dtype)}
    inits = {"gamma": rng.normal(size=D).astype(dtype)}
    names = ["x", "skip", "gamma"]
    if c["op"] == "SkipLayerNormalization":
        names.append("beta" if c.get("beta") else "")
        if c.get("beta"):
            inits["beta"] = rng.normal(size=D).astype(dtype)
    if c.get("bias"):
        names.append("bias")
        inits["bias"] = rng.normal(size=D).astype(dtype)
    outs = c.get("outs", 1)
    keep = list(range(outs)) if isinstance(outs, int) else list(outs)
    onames = [f"o{k}" if k in keep else "" for k in range(max(keep) + 1)]
    node = helper.make_node(c["op"], names, onames, domain="com.microsoft", epsilon=1e-5)
    model = contrib_model([node], feeds, [n for n in onames if n], inits)
    prog, _ = run_both(model, feeds, target, dtype)
    assert "skip_layer_norm" in str(prog)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("axis,inv_std", [(-1, False), (-1, True), (1, True), (2, False)])
def test_simplified_layer_norm(axis, inv_std, dtype, target):
    rng = np.random.default_rng(2)
    x = (rng.normal(size=(2, 3, 8)) * 3).astype(dtype)
    scale = rng.normal(size=x.shape[axis % 3:]).astype(dtype)
    outs = ["y", "inv"] if inv_std else ["y"]
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], outs, axis=axis, epsilon=1e-6)
    model = contrib_model([node], {"x": x}, outs, {"scale": scale})
    run_both(model, {"x": x}, target, dtype)


def test_skip_layer_norm_bad_gamma_names_node():
    x = np.zeros((2, 3, 8), np.float32)
    node = helper.make_node("SkipLayerNormalization", ["x", "x", "gamma"], ["y"], domain="com.microsoft", name="ln1")
    model = contrib_model([node], {"x": x}, ["y"], {"gamma": np.ones(7, np.float32)})
    with pytest.raises(mgx_graph.ShapeError, match=r"ln1.*gamma.*\[7\]"):
        mgx_graph.compile(model, target="ref")


# ---------------------------------------------------------------------------------------------------
# the GELU family
# ---------------------------------------------------------------------------------------------------
GELU_CASES = {"gelu": ("Gelu", False, {}), "fast_gelu": ("FastGelu", False, {}), "fast_gelu_bias": ("FastGelu", True, {}),
              "bias_gelu": ("BiasGelu", True, {}), "quick_gelu": ("QuickGelu", False, {}),
              "quick_gelu_alpha": ("QuickGelu", False, {"alpha": -0.75})}


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", sorted(GELU_CASES))
def test_gelu_family(case, dtype, target):
    op, bias, attrs = GELU_CASES[case]
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(2, 3, 16)) * 4).astype(dtype)
    x[0, 0, :3] = [-30, 30, 0]  # saturated tails
    inits = {"b": rng.normal(size=16).astype(dtype)} if bias else {}
    node = helper.make_node(op, ["x", "b"] if bias else ["x"], ["y"], domain="com.microsoft", **attrs)
    run_both(contrib_model([node], {"x": x}, ["y"], inits), {"x": x}, target, dtype, runs=2)


def test_fast_gelu_bias_must_be_1d():
    x = np.zeros((2, 3, 16), np.float32)
    node = helper.make_node("FastGelu", ["x", "b"], ["y"], domain="com.microsoft", name="fg")
    model = contrib_model([node], {"x": x}, ["y"], {"b": np.ones((3, 16), np.float32)})
    with pytest.raises(mgx_graph.ShapeError, match=r"fg.*bias.*1-D \[16\]"):
        mgx_graph.compile(model, target="ref")


# ---------------------------------------------------------------------------------------------------
# RotaryEmbedding
# ---------------------------------------------------------------------------------------------------
def rotary_caches(rng, max_pos, half, dtype):
    ang = rng.uniform(0, 2 * np.pi, (max_pos, half))
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


ROTARY_MS = {
    "bsd": dict(), "bsd_interleaved": dict(interleaved=1), "bnsh": dict(four_d=True),
    "bnsh_interleaved": dict(four_d=True, interleaved=1), "offset": dict(offset=True),
    "partial": dict(rot=8, num_heads=3), "partial_interleaved_bnsh": dict(rot=8, num_heads=3, four_d=True, interleaved=1),
    "scale_ignored": dict(scale=0.5),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", sorted(ROTARY_MS))
def test_rotary_embedding_contrib(case, dtype, target):
    c = ROTARY_MS[case]
    rng = np.random.default_rng(4)
    B, S, N, H = 2, 5, 3, 16
    R = c.get("rot", H)
    x = rng.normal(size=(B, N, S, H) if c.get("four_d") else (B, S, N * H)).astype(dtype)
    pos = np.array([7], np.int64) if c.get("offset") else rng.integers(0, 32, (B, S)).astype(np.int64)
    cos, sin = rotary_caches(rng, 32, R // 2, dtype)
    attrs = {k: c[k] for k in ("interleaved", "scale", "num_heads") if k in c}
    if "rot" in c:
        attrs["rotary_embedding_dim"] = R
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft", **attrs)
    model = contrib_model([node], {"x": x, "pos": pos}, ["y"], {"cos": cos, "sin": sin})
    prog, _ = run_both(model, {"x": x, "pos": pos}, target, dtype)
    assert "rotary_embedding" in str(prog)


ROTARY_ONNX = {"bsd": dict(), "bsd_interleaved": dict(interleaved=1), "bnsh": dict(four_d=True),
               "no_position_ids": dict(no_pos=True), "no_position_ids_bnsh": dict(no_pos=True, four_d=True),
               "partial": dict(rot=8), "partial_interleaved": dict(rot=8, interleaved=1)}


@pytest.mark.parametrize("case", sorted(ROTARY_ONNX))
def test_rotary_embedding_onnx23(case, target):
    c = ROTARY_ONNX[case]
    rng = np.random.default_rng(5)
    B, S, N, H = 2, 4, 2, 16
    R = c.get("rot", H)
    x = rng.normal(size=(B, N, S, H) if c.get("four_d") else (B, S, N * H)).astype(np.float32)
    cos, sin = rotary_caches(rng, 20, R // 2, np.float32)
    pos = rng.integers(0, 20, (B, S)).astype(np.int64)
    attrs = {"interleaved": c.get("interleaved", 0)}
    if not c.get("four_d"):
        attrs["num_heads"] = N
    if "rot" in c:
        attrs["rotary_embedding_dim"] = R
    feeds = {"x": x}
    if c.get("no_pos"):
        feeds.update(cos=cos[pos], sin=sin[pos])  # per-token caches [B, S, R/2]
        node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"], **attrs)
        model = contrib_model([node], feeds, ["y"], opset=23)
    else:
        feeds["pos"] = pos
        node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], **attrs)
        model = contrib_model([node], feeds, ["y"], {"cos": cos, "sin": sin}, opset=23)
    run_both(model, feeds, target, np.float32)


def test_rotary_position_out_of_range_raises_and_program_stays_usable():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(1, 3, 32)).astype(np.float32)
    cos, sin = rotary_caches(rng, 8, 8, np.float32)
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft")
    model = contrib_model([node], {"x": x, "pos": np.zeros((1, 3), np.int64)}, ["y"], {"cos": cos, "sin": sin})
    prog = compile_native(model, "ref")
    with pytest.raises(mgx_graph.ExecutionError, match=r"position id 8 is out of range \[0, 8\)"):
        prog.run({"x": x, "pos": np.array([[0, 8, 1]], np.int64)})
    good = {"x": x, "pos": np.array([[0, 7, 1]], np.int64)}
    np.testing.assert_allclose(prog.run(good)[0], ort_outputs(model, good)[0], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------------
# MatMulNBits
# ---------------------------------------------------------------------------------------------------
def pack_bits(vals, bits):
    """uint8 values < 2^bits along the last axis -> bytes, the first value in the low bits."""
    per = 8 // bits
    v = vals.reshape(vals.shape[:-1] + (-1, per)).astype(np.uint8)
    out = np.zeros(v.shape[:-1], np.uint8)
    for j in range(per):
        out |= (v[..., j] << (bits * j)).astype(np.uint8)
    return out


def quantized_weights(rng, K, N, bits, block, zp_kind, dtype):
    """(inputs dict for B / scales / zero_points, and the dequantized weight [N, K] per the spec)."""
    kb = -(-K // block)
    q = rng.integers(0, 1 << bits, (N, kb * block)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, (N, kb)).astype(dtype)
    w = {"B": pack_bits(q, bits).reshape(N, kb, block * bits // 8), "scales": scales.reshape(-1)}
    if zp_kind == "packed":
        z = rng.integers(0, 1 << bits, (N, kb)).astype(np.uint8)
        zb = -(-kb * bits // 8)
        padded = np.zeros((N, zb * (8 // bits)), np.uint8)
        padded[:, :kb] = z
        w["zero_points"] = pack_bits(padded, bits).reshape(-1)
        zf = z.astype(np.float64)
    elif zp_kind == "float":
        zf = rng.uniform(0, (1 << bits) - 1, (N, kb)).astype(dtype)
        w["zero_points"] = zf.reshape(-1)
        zf = zf.astype(np.float64)
    else:
        zf = np.full((N, kb), 1 << (bits - 1), np.float64)
    return w, q, zf, scales.astype(np.float64)


NBITS = [(4, 32, 64, 16, "none"), (4, 32, 64, 16, "packed"), (4, 16, 48, 8, "float"), (4, 16, 40, 8, "packed"),
         (4, 128, 256, 10, "packed"), (2, 32, 64, 16, "packed"), (2, 16, 40, 8, "float"), (8, 32, 64, 16, "packed"),
         (8, 16, 40, 8, "none")]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("bits,block,K,N,zp", NBITS, ids=[f"b{b}_bs{s}_K{k}_N{n}_{z}" for b, s, k, n, z in NBITS])
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
def test_matmul_nbits(bits, block, K, N, zp, bias, dtype, target):
    rng = np.random.default_rng(K + N + bits)
    w, _, _, _ = quantized_weights(rng, K, N, bits, block, zp, dtype)
    names = ["a", "B", "scales", "zero_points" if zp != "none" else "", "", "bias" if bias else ""]
    if bias:
        w["bias"] = rng.normal(size=N).astype(dtype)
    a = rng.normal(size=(2, 3, K)).astype(dtype)
    node = helper.make_node("MatMulNBits", names, ["y"], domain="com.microsoft", K=K, N=N, bits=bits,
                            block_size=block, accuracy_level=1)
    prog, _ = run_both(contrib_model([node], {"a": a}, ["y"], w), {"a": a}, target, dtype, runs=2)
    assert "matmul_nbits" in str(prog)


@pytest.mark.parametrize("zp", ["none", "float", "packed"])
def test_matmul_nbits_g_idx(zp, target):
    """g_idx (act-order): block of each k from g_idx.  onnxruntime CPU ignores packed uint8 zero points
    when g_idx is given (it uses 2^(bits-1)), so that case is checked against the spec in numpy."""
    rng = np.random.default_rng(7)
    K, N, bits, block = 64, 12, 4, 16
    w, q, zf, sc = quantized_weights(rng, K, N, bits, block, zp, np.float32)
    g = rng.integers(0, K // block, K).astype(np.int32)
    w["g_idx"] = g
    a = rng.normal(size=(3, K)).astype(np.float32)
    names = ["a", "B", "scales", "zero_points" if zp != "none" else "", "g_idx"]
    node = helper.make_node("MatMulNBits", names, ["y"], domain="com.microsoft", K=K, N=N, bits=bits, block_size=block)
    model = contrib_model([node], {"a": a}, ["y"], w)
    got = compile_native(model, target).run({"a": a})[0]
    want = a.astype(np.float64) @ ((q[:, :K] - zf[:, g]) * sc[:, g]).T
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if zp != "packed":
        np.testing.assert_allclose(got, ort_outputs(model, {"a": a})[0], rtol=1e-4, atol=1e-5)


def test_matmul_nbits_bad_scales_shape():
    rng = np.random.default_rng(8)
    w, _, _, _ = quantized_weights(rng, 64, 16, 4, 32, "none", np.float32)
    w["scales"] = w["scales"][:-1]
    node = helper.make_node("MatMulNBits", ["a", "B", "scales"], ["y"], domain="com.microsoft", name="mm",
                            K=64, N=16, bits=4, block_size=32)
    model = contrib_model([node], {"a": np.zeros((2, 64), np.float32)}, ["y"], w)
    with pytest.raises(mgx_graph.ShapeError, match="mm"):
        mgx_graph.compile(model, target="ref")
