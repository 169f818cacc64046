"""onnxruntime's attention contrib ops (GroupQueryAttention, MultiHeadAttention), each a small ONNX model
compiled natively and compared with onnxruntime CPU; the model builders and comparisons are those of
:mod:`test_contrib_llm`."""
import numpy as np
import pytest
from onnx import helper
from test_contrib_llm import assert_matches, compile_native, contrib_model, ort_outputs

import mgx_graph


# ---------------------------------------------------------------------------------------------------
# GroupQueryAttention
# ---------------------------------------------------------------------------------------------------
def gqa_model(B=2, S=1, N=4, Nkv=2, H=16, past=8, total=6, seqlens=(5, 3), packed=False, rotary=False,
              interleaved=0, rot_dim=None, bias=False, sink=False, pos_ids=False, dtype=np.float32,
              total_input=False, seed=0, **attrs):
    """(model, feeds) of one GroupQueryAttention node; past / present named past_key / present_key ..."""
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.normal(size=s).astype(dtype)  # noqa: E731
    q, k, v = f(B, S, N * H), f(B, S, Nkv * H), f(B, S, Nkv * H)
    feeds = {"query": np.concatenate([q, k, v], -1)} if packed else {"query": q, "key": k, "value": v}
    if past:
        feeds.update(past_key=f(B, Nkv, past, H), past_value=f(B, Nkv, past, H))
    feeds["seqlens_k"] = np.asarray(seqlens, np.int32)
    inits = {}
    (feeds if total_input else inits)["total_sequence_length"] = np.array(total, np.int32)
    names = ["query", "" if packed else "key", "" if packed else "value", "past_key" if past else "",
             "past_value" if past else "", "seqlens_k", "total_sequence_length", "", "", "", "", ""]
    if rotary:
        half = (rot_dim or H) // 2
        ang = rng.uniform(0, 2 * np.pi, (64, half))
        inits.update(cos_cache=np.cos(ang).astype(dtype), sin_cache=np.sin(ang).astype(dtype))
        names[7:9] = ["cos_cache", "sin_cache"]
    if pos_ids:
        feeds["position_ids"] = rng.integers(0, 40, (B, S)).astype(np.int64)
        names[9] = "position_ids"
    if bias:
        feeds["attention_bias"] = f(1, N, S, total)
        names[10] = "attention_bias"
    if sink:
        inits["head_sink"] = f(N)
        names[11] = "head_sink"
    while names[-1] == "":
        names.pop()
    node = helper.make_node("GroupQueryAttention", names, ["output", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=N, kv_num_heads=Nkv, do_rotary=int(rotary),
                            rotary_interleaved=interleaved, **attrs)
    model = contrib_model([node], feeds, ["output", "present_key", "present_value"], inits)
    return model, feeds


GQA = {
    "decode_shared_buffer": dict(),
    "decode_growing_cache": dict(past=5, total=6, seqlens=(5, 5)),
    "decode_no_past": dict(past=0, total=1, seqlens=(0, 0)),
    "decode_mha_heads": dict(N=2, Nkv=2),
    "decode_one_kv_head": dict(N=4, Nkv=1),
    "decode_packed_qkv": dict(packed=True),
    "decode_rotary": dict(rotary=True),
    "decode_rotary_interleaved_packed": dict(rotary=True, interleaved=1, packed=True),
    "decode_rotary_partial": dict(rotary=True, rot_dim=16, H=32, N=2, Nkv=1),
    "decode_position_ids": dict(rotary=True, pos_ids=True),
    "decode_scale_softcap": dict(scale=0.3, softcap=2.0),
    "decode_local_window": dict(total=7, seqlens=(6, 3), local_window_size=2),
    "decode_smooth_softmax": dict(smooth_softmax=1),
    "decode_head_sink": dict(sink=True),
    "decode_attention_bias": dict(bias=True),
    "decode_non_causal": dict(causal=0),
    "prompt": dict(S=5, past=0, total=5, seqlens=(4, 4)),
    "prompt_right_padded": dict(S=5, past=0, total=5, seqlens=(4, 2)),
    "prompt_into_cache_buffer": dict(S=5, past=8, total=5, seqlens=(4, 2), rotary=True),
    "prompt_rotary_packed": dict(S=5, past=0, total=5, seqlens=(4, 4), rotary=True, packed=True),
    "prompt_position_ids": dict(S=4, past=0, total=4, seqlens=(3, 3), rotary=True, pos_ids=True),
    "prompt_local_window_softcap": dict(S=6, past=0, total=6, seqlens=(5, 5), local_window_size=2, softcap=1.5),
    "prompt_smooth_bias": dict(S=5, past=0, total=5, seqlens=(4, 4), smooth_softmax=1, bias=True),
    "prompt_non_causal": dict(S=4, past=0, total=4, seqlens=(3, 3), causal=0),
    "chunked_prompt": dict(B=1, S=3, past=8, total=6, seqlens=(5,), rotary=True),
}


def _valid_rows(feeds, S):
    """Per batch entry: the query rows that are real tokens (right-padded prompts have fewer)."""
    kv = feeds["seqlens_k"].astype(np.int64) + 1
    return [int(n - max(n - S, 0)) for n in kv]


def assert_gqa_matches(got, want, feeds, S, dtype, what=""):
    """Outputs and present caches equal onnxruntime's on the rows that are defined (every present row;
    the output rows of real tokens: onnxruntime leaves padded query rows unspecified)."""
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (what, k, g.shape, w.shape)
    rows = _valid_rows(feeds, S)
    for b, n in enumerate(rows):
        assert_matches([got[0][b, :n]], [want[0][b, :n]], dtype, f"{what} output batch {b}")
    assert_matches(got[1:], want[1:], dtype, f"{what} present")


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", sorted(GQA))
def test_group_query_attention(case, dtype, target):
    kw = dict(GQA[case])
    model, feeds = gqa_model(dtype=dtype, **kw)
    want = ort_outputs(model, feeds)
    prog = compile_native(model, target, alias=None)
    text = str(prog)  # the cache writes: kv_cache_update, or with the query rotation one rotary_kv_write
    assert "grouped_attention" in text and ("kv_cache_update" in text or "rotary_kv_write" in text)
    for _ in range(2):
        got = prog.run(feeds)
        assert_gqa_matches(got, want, feeds, kw.get("S", 1), dtype, case)


def test_group_query_attention_graph_replay(target):
    """A captured decode step replays with new inputs (hip_graph on: gpu capture; ref: host replay)."""
    model, feeds = gqa_model(rotary=True)
    prog = compile_native(model, target, alias=None, hip_graph=True, min_partition_size=1)
    rng = np.random.default_rng(11)
    for step in range(4):
        feeds = dict(feeds, query=rng.normal(size=feeds["query"].shape).astype(np.float32),
                     seqlens_k=np.array([5, 2 + step % 3], np.int32))
        assert_gqa_matches(prog.run(feeds), ort_outputs(model, feeds), feeds, 1, np.float32, f"step {step}")
    st = prog.stats()
    assert st["fallbacks"] == 0, st


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_group_query_attention_decode_loop_cache_in_place(target, hip_graph):
    """A fixed-length shared past/present buffer: present_key / present_value are bound onto past_key /
    past_value, each step writes one row into the caller's buffers, and every step matches onnxruntime
    fed its own previous present."""
    B, N, Nkv, H, P = 2, 4, 2, 16, 8
    model, feeds = gqa_model(B=B, N=N, Nkv=Nkv, H=H, past=P, total=P, seqlens=(0, 0), rotary=True)
    zeros = {n: np.zeros_like(feeds[n]) for n in ("past_key", "past_value")}
    prog = compile_native(model, target, hip_graph=hip_graph, min_partition_size=1)
    assert prog.alias == {"present_key": "past_key", "present_value": "past_value"}
    ctx, queue = prog.context, prog.queue
    with ctx.on_queue(queue):
        params = {n: ctx.xp.asarray(v).copy() for n, v in dict(feeds, **zeros).items()}
    ort_feeds = dict(feeds, **zeros)
    rng = np.random.default_rng(12)
    for step in range(6):
        q = rng.normal(size=feeds["query"].shape).astype(np.float32)
        k = rng.normal(size=feeds["key"].shape).astype(np.float32)
        seqlens = np.array([step, min(step, 3)], np.int32)  # the second entry stops growing: its row 3 is rewritten
        ort_feeds.update(query=q, key=k, seqlens_k=seqlens)
        out, pres_k, pres_v = ort_outputs(model, ort_feeds)
        ort_feeds.update(past_key=pres_k, past_value=pres_v)
        for name, val in (("query", q), ("key", k), ("seqlens_k", seqlens)):
            ctx.copy_from_host(params[name], val, queue)
        got = prog.run_async(params, queue)
        assert_matches([ctx.to_host(got[0], queue)], [out], np.float32, f"step {step} output")
        for name, want in (("past_key", pres_k), ("past_value", pres_v)):
            assert_matches([ctx.to_host(params[name], queue)], [want], np.float32, f"step {step} {name}")
    if hip_graph:
        assert prog.stats()["fallbacks"] == 0


def test_group_query_attention_total_length_input_specializes_once():
    """total_sequence_length given at run time: one specialization (for max(cache length, value))
    serves every decode step of a fixed-length cache."""
    model, feeds = gqa_model(past=8, total=6, total_input=True)
    prog = compile_native(model, "ref")
    for total, seqlens in ((6, (5, 3)), (7, (6, 6)), (8, (7, 2))):
        f = dict(feeds, total_sequence_length=np.array(total, np.int32), seqlens_k=np.array(seqlens, np.int32))
        assert_gqa_matches(prog.run(f), ort_outputs(model, f), f, 1, np.float32, f"total {total}")
    assert prog.dispatcher.compiles == 1


@pytest.mark.parametrize("change,match", [
    (dict(attr=("kv_cache_bit_width", 4)), "kv_cache_bit_width"),
    (dict(attr=("k_quant_type", "PER_TENSOR")), "k_quant_type"),
    (dict(attr=("sliding_window_cache", 1)), "sliding_window_cache"),
    (dict(input=(16, "seqlens_k")), "query_seqlens"),
    (dict(output="qk"), "output_qk"),
])
def test_group_query_attention_unsupported_variants(change, match):
    model, _ = gqa_model()
    node = model.graph.node[0]
    if "attr" in change:
        node.attribute.append(helper.make_attribute(*change["attr"]))
    if "input" in change:
        idx, name = change["input"]
        while len(node.input) <= idx:
            node.input.append("")
        node.input[idx] = name
    if "output" in change:
        node.output.append(change["output"])
    with pytest.raises(mgx_graph.UnsupportedOpError, match=match) as e:
        mgx_graph.compile(model, target="ref")
    assert (e.value.op_type, e.value.domain) == ("GroupQueryAttention", "com.microsoft")


def test_group_query_attention_bad_shapes():
    model, _ = gqa_model(N=4, Nkv=3)
    with pytest.raises(mgx_graph.ParseError, match=r"num_heads \(4\).*kv_num_heads \(3\)"):
        mgx_graph.compile(model, target="ref")
    model, feeds = gqa_model()
    model.graph.input[[i.name for i in model.graph.input].index("past_key")].type.tensor_type.shape.dim[3].dim_value = 8
    with pytest.raises(mgx_graph.ShapeError, match=r"past_key float32\[2,2,8,8\].*\[2, 2, L, 16\]"):
        mgx_graph.compile(model, target="ref")


def test_group_query_attention_seqlens_beyond_cache_raises():
    model, feeds = gqa_model(past=8, total=8)
    prog = compile_native(model, "ref", alias=None)
    with pytest.raises(mgx_graph.ExecutionError, match="no room"):
        prog.run(dict(feeds, seqlens_k=np.array([8, 3], np.int32)))
    ok = dict(feeds, seqlens_k=np.array([7, 3], np.int32))
    assert_gqa_matches(prog.run(ok), ort_outputs(model, ok), ok, 1, np.float32)


# ---------------------------------------------------------------------------------------------------
# MultiHeadAttention
# ---------------------------------------------------------------------------------------------------
def mha_model(B=2, S=3, L=4, N=2, H=8, Hv=8, past=0, layout="separate", bias=False, mask=None, attn_bias=False,
              dtype=np.float32, seed=0, **attrs):
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.normal(size=s).astype(dtype)  # noqa: E731
    T = past + L
    names = [""] * 8
    if layout == "packed_qkv":
        feeds = {"query": f(B, S, N, 3, H)}
        names[0] = "query"
    elif layout == "packed_kv":
        feeds = {"query": f(B, S, N * H), "key": f(B, L, N, 2, H)}
        names[:2] = ["query", "key"]
    elif layout == "bnsh_kv":
        feeds = {"query": f(B, S, N * H), "key": f(B, N, L, H), "value": f(B, N, L, Hv)}
        names[:3] = ["query", "key", "value"]
    else:
        feeds = {"query": f(B, S, N * H), "key": f(B, L, N * H), "value": f(B, L, N * Hv)}
        names[:3] = ["query", "key", "value"]
    inits = {}
    if bias:
        inits["bias"] = f(2 * N * H + N * Hv)
        names[3] = "bias"
    if mask == "lengths":
        feeds["key_padding_mask"] = np.array([T, 2, T - 1][:B], np.int32)
    elif mask in ("2d", "3d"):
        mk = (rng.uniform(size=(B, T) if mask == "2d" else (B, S, T)) > 0.3).astype(np.int32)
        mk[..., 0] = 1
        feeds["key_padding_mask"] = mk
    if mask:
        names[4] = "key_padding_mask"
    if attn_bias:
        feeds["attention_bias"] = f(1, N, S, T)
        names[5] = "attention_bias"
    if past:
        feeds.update(past_key=f(B, N, past, H), past_value=f(B, N, past, Hv))
        names[6:8] = ["past_key", "past_value"]
    while names[-1] == "":
        names.pop()
    outs = ["output", "present_key", "present_value"] if past else ["output"]
    node = helper.make_node("MultiHeadAttention", names, outs, domain="com.microsoft", num_heads=N, **attrs)
    return contrib_model([node], feeds, outs, inits), feeds


MHA = {
    "self": dict(S=4, L=4), "cross": dict(), "value_head_size": dict(Hv=16), "bias": dict(bias=True),
    "key_lengths": dict(mask="lengths"), "key_mask_2d": dict(mask="2d"), "key_mask_3d": dict(mask="3d"),
    "attention_bias": dict(attn_bias=True), "scale": dict(scale=0.2), "causal": dict(S=4, L=4, unidirectional=1),
    "packed_qkv": dict(S=4, L=4, layout="packed_qkv"), "packed_kv": dict(layout="packed_kv"),
    "bnsh_kv": dict(layout="bnsh_kv"), "decode_past": dict(S=1, L=1, past=5, mask="2d"),
    "past_causal_bias": dict(S=2, L=2, past=5, unidirectional=1, attn_bias=True, bias=True),
}


def unpacked_mha(case, dtype):
    """The packed layouts (which onnxruntime CPU does not implement) and the same inputs unpacked into
    separate 3-D query / key / value: (packed model, its feeds, separate model, its feeds)."""
    model, feeds = mha_model(dtype=dtype, **MHA[case])
    sep, _ = mha_model(dtype=dtype, **dict(MHA[case], layout="separate"))
    B, S = feeds["query"].shape[:2]
    if MHA[case]["layout"] == "packed_qkv":
        qkv = feeds["query"]
        parts = [qkv[:, :, :, j].reshape(B, S, -1) for j in range(3)]
    else:
        kv = feeds["key"]
        parts = [feeds["query"]] + [kv[:, :, :, j].reshape(B, kv.shape[1], -1) for j in range(2)]
    return model, feeds, sep, dict(zip(("query", "key", "value"), parts))


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", sorted(MHA))
def test_multi_head_attention(case, dtype, target):
    if MHA[case].get("layout", "separate").startswith("packed"):
        model, feeds, sep, sep_feeds = unpacked_mha(case, dtype)
        want = ort_outputs(sep, sep_feeds)
    else:
        model, feeds = mha_model(dtype=dtype, **MHA[case])
        want = ort_outputs(model, feeds)
    prog = compile_native(model, target, alias=None)
    assert "grouped_attention" in str(prog)
    for _ in range(2):
        assert_matches(prog.run(feeds), want, dtype, case)


def test_multi_head_attention_unsupported_qk_output():
    model, _ = mha_model()
    model.graph.node[0].output.extend(["", "", "qk"])
    with pytest.raises(mgx_graph.UnsupportedOpError, match="qk"):
        mgx_graph.compile(model, target="ref")


def _with_qk_norms(model, N, Nkv, H, dtype, seed=7, eps=1e-6):
    """(the model with q_norm_weight / k_norm_weight inputs on its GroupQueryAttention, the same model with the
    norms as explicit SimplifiedLayerNormalization nodes per head before it: onnxruntime CPU runs only that)."""
    import copy

    from onnx import numpy_helper

    rng = np.random.default_rng(seed)
    weights = {"q_norm_weight": (1 + 0.2 * rng.normal(size=H)).astype(dtype),
               "k_norm_weight": (1 + 0.2 * rng.normal(size=H)).astype(dtype)}
    fused = copy.deepcopy(model)
    node = fused.graph.node[0]
    while len(node.input) < 16:
        node.input.append("")
    node.input[14:16] = list(weights)
    node.attribute.append(helper.make_attribute("qk_norm_epsilon", eps))
    fused.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in weights.items())
    explicit = copy.deepcopy(model)
    gqa = explicit.graph.node[0]
    pre = []
    for name, heads, w in (("query", N, "q_norm_weight"), ("key", Nkv, "k_norm_weight")):
        shape4, shape3 = f"{name}_heads_shape", f"{name}_flat_shape"
        explicit.graph.initializer.extend([numpy_helper.from_array(np.array([0, 0, heads, H], np.int64), shape4),
                                           numpy_helper.from_array(np.array([0, 0, heads * H], np.int64), shape3)])
        pre += [helper.make_node("Reshape", [name, shape4], [f"{name}_heads"]),
                helper.make_node("SimplifiedLayerNormalization", [f"{name}_heads", w], [f"{name}_normed"], axis=-1,
                                 epsilon=eps),
                helper.make_node("Reshape", [f"{name}_normed", shape3], [f"{name}_norm"])]
        gqa.input[0 if name == "query" else 1] = f"{name}_norm"
    explicit.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in weights.items())
    nodes = pre + list(explicit.graph.node)
    del explicit.graph.node[:]
    explicit.graph.node.extend(nodes)
    return fused, explicit


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", ["decode_rotary", "decode_shared_buffer", "prompt_into_cache_buffer"])
def test_group_query_attention_qk_norms(case, dtype):
    """Qwen3's per-head Q / K RMS norms (q_norm_weight, k_norm_weight, as the builder's CUDA graphs write them):
    equal to onnxruntime CPU running the same norms as SimplifiedLayerNormalization nodes before the
    attention (its CPU kernel of GroupQueryAttention does not take the norm inputs)."""
    kw = dict(GQA[case])
    model, feeds = gqa_model(dtype=dtype, **kw)
    fused, explicit = _with_qk_norms(model, 4, 2, 16, dtype)
    want = ort_outputs(explicit, feeds)
    got = mgx_graph.compile(fused, target="ref").run(feeds)
    S = kw.get("S", 1)
    for b, (n, kv) in enumerate(zip(_valid_rows(feeds, S), feeds["seqlens_k"].astype(np.int64) + 1)):
        # the cache rows of the sequence (onnxruntime leaves the rest of this model's present unspecified)
        assert_matches([got[0][b, :n], got[1][b, :, :kv], got[2][b, :, :kv]],
                       [want[0][b, :n], want[1][b, :, :kv], want[2][b, :, :kv]], dtype, f"{case} batch {b}")


def test_group_query_attention_one_norm_alone_is_refused():
    model, _ = gqa_model()
    fused, _ = _with_qk_norms(model, 4, 2, 16, np.float32)
    fused.graph.node[0].input[15] = ""
    with pytest.raises(mgx_graph.ParseError, match="q_norm_weight and k_norm_weight come together"):
        mgx_graph.compile(fused, target="ref")
