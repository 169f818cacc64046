"""onnxruntime contrib ops used by LLM and BERT-style exports (fused normalizations, the GELU family,
RotaryEmbedding, MatMulNBits, GatherBlockQuantized, a decoder layer as onnxruntime-genai lays it out),
each a small ONNX model compiled natively (no host-evaluated ``onnx_op``) and compared with onnxruntime
CPU (or, where onnxruntime departs from its own spec, with numpy written from the spec).  The attention
ops (GroupQueryAttention, MultiHeadAttention) are in :mod:`test_contrib_llm_attention`."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mgx_graph
from nbits_util import pack_bits, quantized

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
    feeds = {"x": (rng.normal(size=xs) * 2 + 0.5).astype(dtype),
             "skip": rng.normal(size=c.get("skip", xs)).astype(dtype)}
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
GELU_CASES = {"gelu": ("Gelu", False, {}), "fast_gelu": ("FastGelu", False, {}),
              "fast_gelu_bias": ("FastGelu", True, {}), "bias_gelu": ("BiasGelu", True, {}),
              "quick_gelu": ("QuickGelu", False, {}), "quick_gelu_alpha": ("QuickGelu", False, {"alpha": -0.75})}


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
    "partial": dict(rot=8, num_heads=3),
    "partial_interleaved_bnsh": dict(rot=8, num_heads=3, four_d=True, interleaved=1),
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
def quantized_weights(rng, K, N, bits, block, zp_kind, dtype):
    """(inputs dict for B / scales / zero_points, the quantized values, zero points and scales as
    float64; :func:`nbits_util.quantized`)."""
    w = quantized(rng, K, N, bits, block, zp_kind, dtype)
    return w.inputs, w.q, w.zf, w.sf


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
    with pytest.raises(mgx_graph.ParseError, match=r"mm.*scales \[31\] must hold N \* ceil\(K / block_size\) = 32"):
        mgx_graph.compile(model, target="ref")


# ---------------------------------------------------------------------------------------------------
# a decoder layer as onnxruntime-genai's model builder lays it out
# ---------------------------------------------------------------------------------------------------
def genai_layer(B=2, D=64, N=4, Nkv=2, P=8, seed=0):
    """One int4 decoder layer: SimplifiedLayerNormalization -> packed-QKV MatMulNBits ->
    GroupQueryAttention (rotary, seqlens_k and total_sequence_length computed from attention_mask as the
    builder does) -> MatMulNBits -> SkipSimplifiedLayerNormalization -> MatMulNBits / FastGelu /
    MatMulNBits; the KV cache is a shared buffer of P rows (past_key_values.0.* / present.0.*)."""
    rng = np.random.default_rng(seed)
    H = D // N
    inits, nodes = {}, []

    def nbits(name, x, K, Nout):
        w, _, _, _ = quantized_weights(rng, K, Nout, 4, 16, "packed", np.float32)
        for k, v in w.items():
            inits[f"{name}.{k}"] = v
        nodes.append(helper.make_node("MatMulNBits", [x, f"{name}.B", f"{name}.scales", f"{name}.zero_points"],
                                      [name], domain="com.microsoft", K=K, N=Nout, bits=4, block_size=16))

    ang = np.arange(32)[:, None] * (10000.0 ** (-np.arange(H // 2) / (H // 2)))[None]
    inits.update(cos=np.cos(ang).astype(np.float32), sin=np.sin(ang).astype(np.float32),
                 ln1=rng.uniform(0.5, 1.5, D).astype(np.float32), ln2=rng.uniform(0.5, 1.5, D).astype(np.float32),
                 one=np.array(1, np.int64), axis1=np.array([1], np.int64), idx1=np.array(1, np.int64))
    nodes += [helper.make_node("ReduceSum", ["attention_mask", "axis1"], ["msum"], keepdims=0),
              helper.make_node("Sub", ["msum", "one"], ["msub"]),
              helper.make_node("Cast", ["msub"], ["seqlens_k"], to=TensorProto.INT32),
              helper.make_node("Shape", ["attention_mask"], ["mshape"]),
              helper.make_node("Gather", ["mshape", "idx1"], ["mlen"], axis=0),
              helper.make_node("Cast", ["mlen"], ["total"], to=TensorProto.INT32),
              helper.make_node("SimplifiedLayerNormalization", ["hidden", "ln1"], ["n1"], epsilon=1e-6)]
    nbits("qkv", "n1", D, (N + 2 * Nkv) * H)
    nodes.append(helper.make_node("GroupQueryAttention", ["qkv", "", "", "past_key_values.0.key",
                                                          "past_key_values.0.value", "seqlens_k", "total", "cos",
                                                          "sin"], ["attn", "present.0.key", "present.0.value"],
                                  domain="com.microsoft", num_heads=N, kv_num_heads=Nkv, do_rotary=1))
    nbits("o_proj", "attn", N * H, D)
    nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", ["o_proj", "hidden", "ln2"],
                                  ["n2", "", "", "residual"], domain="com.microsoft", epsilon=1e-6))
    nbits("up", "n2", D, 2 * D)
    nodes.append(helper.make_node("FastGelu", ["up"], ["act"], domain="com.microsoft"))
    nbits("down", "act", 2 * D, D)
    nodes.append(helper.make_node("Add", ["down", "residual"], ["out"]))

    def model(S, T):
        ins = {"hidden": np.zeros((B, S, D), np.float32), "attention_mask": np.zeros((B, T), np.int64),
               "past_key_values.0.key": np.zeros((B, Nkv, P, H), np.float32),
               "past_key_values.0.value": np.zeros((B, Nkv, P, H), np.float32)}
        return contrib_model(nodes, ins, ["out", "present.0.key", "present.0.value"], inits)

    return model


def test_genai_style_decoder_layer_prompt_then_decode(target):
    make = genai_layer()
    rng = np.random.default_rng(13)
    B, D, Nkv, P, H = 2, 64, 2, 8, 16
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], np.int64)  # the second prompt is right-padded
    feeds = {"hidden": rng.normal(size=(B, 4, D)).astype(np.float32), "attention_mask": mask,
             "past_key_values.0.key": np.zeros((B, Nkv, P, H), np.float32),
             "past_key_values.0.value": np.zeros((B, Nkv, P, H), np.float32)}
    prompt = make(4, 4)
    prog = compile_native(prompt, target)
    assert prog.alias == {"present.0.key": "past_key_values.0.key", "present.0.value": "past_key_values.0.value"}
    want = ort_outputs(prompt, feeds)
    got = prog.run(feeds)
    valid = [4, 2]
    for b, n in enumerate(valid):
        assert_matches([got[0][b, :n]], [want[0][b, :n]], np.float32, f"prompt batch {b}")
        assert_matches([got[1][b, :, :n], got[2][b, :, :n]], [want[1][b, :, :n], want[2][b, :, :n]], np.float32)
    # one decode step: the second entry continues after its 2 real tokens
    step = make(1, 5)
    feeds = {"hidden": rng.normal(size=(B, 1, D)).astype(np.float32),
             "attention_mask": np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int64),
             "past_key_values.0.key": want[1], "past_key_values.0.value": want[2]}
    want = ort_outputs(step, feeds)
    got = compile_native(step, target).run(feeds)
    assert_matches(got[:1], want[:1], np.float32, "decode output")
    for b, n in enumerate([5, 3]):
        assert_matches([got[1][b, :, :n], got[2][b, :, :n]], [want[1][b, :, :n], want[2][b, :, :n]], np.float32)


# ---------------------------------------------------------------------------------------------------
# GatherBlockQuantized
# ---------------------------------------------------------------------------------------------------
def gbq_model(rng, R, mid, C, bits, block, zp, idx_shape, dtype, idx_dtype=np.int64, name="gbq"):
    """(model, feeds, dequantized table float64 [R, *mid, C]) of one GatherBlockQuantized node whose
    indices are a graph input (values in [-R, R))."""
    nb = -(-C // block)
    per = 8 // bits
    q = rng.integers(0, 1 << bits, (R, *mid, C)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, (R, *mid, nb)).astype(dtype)
    inits = {"data": pack_bits(q, bits), "scales": scales}
    zf = np.full((R, *mid, nb), 1 << (bits - 1), np.float64)
    if zp:
        z = rng.integers(0, 1 << bits, (R, *mid, nb)).astype(np.uint8)
        padded = np.zeros((R, *mid, -(-nb // per) * per), np.uint8)
        padded[..., :nb] = z
        inits["zero_points"] = pack_bits(padded, bits)
        zf = z.astype(np.float64)
    table = (q - np.repeat(zf, block, axis=-1)[..., :C]) * np.repeat(scales.astype(np.float64), block, axis=-1)[..., :C]
    idx = rng.integers(-R, R, idx_shape).astype(idx_dtype)
    names = ["data", "ids", "scales"] + (["zero_points"] if zp else [])
    node = helper.make_node("GatherBlockQuantized", names, ["y"], domain="com.microsoft", name=name, bits=bits,
                            block_size=block, gather_axis=0, quantize_axis=len(mid) + 1)
    return contrib_model([node], {"ids": idx}, ["y"], inits), {"ids": idx}, table


GBQ = [(4, 32, 20, (), 64, False), (4, 32, 20, (), 64, True), (4, 16, 12, (), 40, True), (2, 16, 9, (), 48, True),
       (2, 32, 9, (), 40, False), (8, 16, 7, (), 40, True), (8, 32, 7, (), 32, False), (4, 16, 6, (3,), 32, True)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("bits,block,R,mid,C,zp", GBQ,
                         ids=[f"b{b}_bs{s}_R{r}_mid{len(m)}_C{c}_{'zp' if z else 'nozp'}" for b, s, r, m, c, z in GBQ])
def test_gather_block_quantized(bits, block, R, mid, C, zp, dtype, target):
    """Rows gathered by [2, 3] indices (negative ones included), dequantized: onnxruntime CPU and the
    table dequantized in numpy from the spec."""
    rng = np.random.default_rng(R + C + bits)
    model, feeds, table = gbq_model(rng, R, mid, C, bits, block, zp, (2, 3), dtype)
    prog, got = run_both(model, feeds, target, dtype, runs=2)
    assert "gather_block_quantized" in str(prog)
    np.testing.assert_allclose(got[0].astype(np.float64), table[feeds["ids"]], **TOL[dtype])


def test_gather_block_quantized_int32_scalar_and_empty_indices(target):
    rng = np.random.default_rng(3)
    for shape in ((), (0,)):
        model, feeds, table = gbq_model(rng, 10, (), 64, 4, 32, True, shape, np.float32, idx_dtype=np.int32)
        _, got = run_both(model, feeds, target, np.float32)
        assert got[0].shape == shape + (64,)
        np.testing.assert_allclose(got[0], table[feeds["ids"]], rtol=1e-5, atol=1e-6)


def test_gather_block_quantized_errors():
    rng = np.random.default_rng(4)
    model, feeds, _ = gbq_model(rng, 10, (), 64, 4, 32, False, (3,), np.float32)
    prog = mgx_graph.compile(model, target="ref")
    bad = {"ids": np.array([1, 10, 2], np.int64)}
    with pytest.raises(Exception, match="10"):
        prog.run(bad)
    np.testing.assert_allclose(prog.run(feeds)[0], ort_outputs(model, feeds)[0], rtol=1e-5, atol=1e-6)
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.zeros((10, 3), np.float32), "scales"))
    with pytest.raises(mgx_graph.ShapeError, match="scales .*\\[10, 2\\]"):
        mgx_graph.compile(model, target="ref")
    model, _, _ = gbq_model(rng, 10, (), 64, 4, 32, False, (3,), np.float32)
    model.graph.node[0].attribute[3].i = 0  # quantize_axis 0
    with pytest.raises(mgx_graph.UnsupportedOpError, match="quantize_axis"):
        mgx_graph.compile(model, target="ref")
