"""The contrib-op kernels under CuPy's rules, without a GPU: each kernel of the ops in ``STRICT`` runs with
a numpy stand-in for ``xp`` that records what CuPy would do differently (allocate: a call without
``out``; copy: an input that shares memory with ``out`` through another view object; reject: an ``out``
whose shape is not the broadcast shape, a ``take`` into another dtype, a cast ``copyto`` does not
allow) and with a ``matmul`` that asks the gpu target's GEMM planner whether the operands need a copy
(:mod:`cupy_rules`).  The results are still checked against onnxruntime."""
import numpy as np
import pytest
from cupy_rules import strict_kernels
from test_contrib_llm import assert_matches, gbq_model, genai_layer, ort_outputs
from test_contrib_llm_attention import GQA, MHA, assert_gqa_matches, gqa_model, mha_model

import mgx_graph

STRICT = {"skip_layer_norm", "rotary_embedding", "matmul_nbits", "kv_cache_update", "grouped_attention",
          "quick_gelu", "gather_block_quantized", "rotary_kv_write"}
# fuse_rotary_kv merges a decode step's query rotation and K / V cache writes into rotary_kv_write
WRITES = {"kv_cache_update", "rotary_kv_write"}


@pytest.fixture
def strict(monkeypatch):
    """Runs the kernels of STRICT ops with the stand-in; yields the list of what CuPy would not do."""
    yield strict_kernels(monkeypatch, STRICT)


@pytest.mark.parametrize("case", ["decode_shared_buffer", "decode_rotary_interleaved_packed", "decode_head_sink",
                                  "decode_local_window", "prompt_right_padded", "prompt_rotary_packed",
                                  "prompt_smooth_bias", "chunked_prompt"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
def test_group_query_attention_follows_cupy_rules(case, dtype, strict):
    found, ran = strict
    model, feeds = gqa_model(dtype=dtype, **GQA[case])
    got = mgx_graph.compile(model, target="ref", alias=None).run(feeds)
    assert_gqa_matches(got, ort_outputs(model, feeds), feeds, GQA[case].get("S", 1), dtype, case)
    assert "grouped_attention" in ran and WRITES & set(ran)
    assert found == []


def test_cache_update_in_place_follows_cupy_rules(strict):
    found, ran = strict
    model, feeds = gqa_model(past=8, total=8, seqlens=(4, 2), rotary=True)
    prog = mgx_graph.compile(model, target="ref")
    assert prog.alias == {"present_key": "past_key", "present_value": "past_value"}
    got, want = prog.run(feeds), ort_outputs(model, feeds)
    assert_matches(got[:1], want[:1], np.float32)
    # in place, the rows past each entry's length keep the buffer's values (onnxruntime's shared buffer);
    # onnxruntime's separate present output has zeros there
    for b, n in enumerate(feeds["seqlens_k"] + 1):
        assert_matches([g[b, :, :n] for g in got[1:]], [w[b, :, :n] for w in want[1:]], np.float32)
        for g, past in zip(got[1:], (feeds["past_key"], feeds["past_value"])):
            np.testing.assert_array_equal(g[b, :, n:], past[b, :, n:])
    assert {"rotary_embedding", "rotary_kv_write"} & set(ran) and found == []


@pytest.mark.parametrize("case", ["key_mask_3d", "past_causal_bias", "bnsh_kv", "value_head_size"])
def test_multi_head_attention_follows_cupy_rules(case, strict):
    found, ran = strict
    model, feeds = mha_model(**MHA[case])
    got = mgx_graph.compile(model, target="ref", alias=None).run(feeds)
    assert_matches(got, ort_outputs(model, feeds), np.float32, case)
    assert "grouped_attention" in ran and found == []


def test_norm_rotary_nbits_gelu_follow_cupy_rules(strict):
    """A decoder layer of the ops (fused norms, MatMulNBits, FastGelu, GQA with rotary), fp32."""
    found, ran = strict
    model = genai_layer()(4, 4)
    rng = np.random.default_rng(0)
    feeds = {"hidden": rng.normal(size=(2, 4, 64)).astype(np.float32), "attention_mask": np.ones((2, 4), np.int64),
             "past_key_values.0.key": np.zeros((2, 2, 8, 16), np.float32),
             "past_key_values.0.value": np.zeros((2, 2, 8, 16), np.float32)}
    got = mgx_graph.compile(model, target="ref", alias=None).run(feeds)
    assert_matches(got, ort_outputs(model, feeds), np.float32)
    assert {"skip_layer_norm", "matmul_nbits", "grouped_attention"} <= set(ran)
    assert "rotary_kv_write" in ran or {"rotary_embedding", "kv_cache_update"} <= set(ran)
    assert found == []


@pytest.mark.parametrize("bits,C,zp", [(4, 64, True), (4, 40, False), (2, 48, True), (8, 40, True)])
def test_gather_block_quantized_follows_cupy_rules(bits, C, zp, strict):
    """Whole and partial blocks, packed zero points or the default: no allocation, no aliasing copy."""
    found, ran = strict
    model, feeds, table = gbq_model(np.random.default_rng(bits + C), 9, (), C, bits, 16, zp, (2, 3), np.float32)
    got = mgx_graph.compile(model, target="ref").run(feeds)
    assert_matches(got, ort_outputs(model, feeds), np.float32)
    np.testing.assert_allclose(got[0], table[feeds["ids"]], rtol=1e-5, atol=1e-6)
    assert ran == ["gather_block_quantized"] and found == []
