"""`mgx-graph export` of tiny random checkpoints of more architectures (bench/tiny_checkpoint.py), each run
by mgx_graph.llm.LLM on ref to onnxruntime-genai's greedy tokens on the same folder: Granite, OLMo,
SmolLM3, ERNIE 4.5, Nemotron, GPT-OSS; HunYuan's position_ids, LFM2's convolution states, Qwen3's fp16 Q / K
norms. The export tests are split over files so that pytest-xdist's workers share them."""
from __future__ import annotations

import json

import pytest

import mgx_graph
from test_cli_export import (NEW_TOKENS, PROMPT, export_matches_genai, genai_greedy, mgx_greedy, needs_builder,
                             run, save_checkpoint)


@needs_builder
@pytest.mark.slow
@pytest.mark.parametrize("arch", ["granite", "olmo", "smollm3", "ernie", "nemotron", "gpt_oss"])
def test_architecture_runs_to_onnxruntime_genai_greedy_tokens(tmp_path, capsys, arch):
    export_matches_genai(tmp_path, capsys, arch)


@needs_builder
@pytest.mark.slow
def test_a_folder_with_position_ids_runs_rows_of_different_lengths(tmp_path, capsys):
    """HunYuan's builder graph takes ``position_ids`` besides the mask: one run per prompt, and two prompts of
    different lengths in one batch, each row to onnxruntime-genai's greedy tokens."""
    from mgx_graph.llm import LLM

    ck = save_checkpoint(tmp_path / "hunyuan", "hunyuan", seed=1)
    out = tmp_path / "hunyuan-fp32"
    rc, _, err = run(capsys, ck, out, "--precision", "fp32")
    assert rc == 0, err
    assert "position_ids" in json.loads((out / "genai_config.json").read_text())["model"]["decoder"]["inputs"]
    prompts = [PROMPT, PROMPT[2:5]]
    want = [genai_greedy(out, p, NEW_TOKENS) for p in prompts]
    assert mgx_greedy(out, prompts[0], NEW_TOKENS) == want[0]
    with LLM(str(out), target="ref", max_length=64, batch=2) as llm:
        got = llm.generate([list(p) for p in prompts], max_new_tokens=NEW_TOKENS)
    assert [r.token_ids for r in got] == want


@needs_builder
@pytest.mark.slow
def test_a_folder_with_convolution_state_runs_prompt_after_prompt(tmp_path, capsys):
    """LFM2: short-convolution layers keep a state of the last tokens (past / present conv, written in place).
    Each prompt is prefilled at its own length and starts from an empty state: two prompts one after the
    other, with graphs on, each give onnxruntime-genai's greedy tokens; a batch of two rows is refused."""
    from mgx_graph.llm import LLM

    ck = save_checkpoint(tmp_path / "lfm2", "lfm2", seed=1)
    out = tmp_path / "lfm2-fp32"
    rc, _, err = run(capsys, ck, out, "--precision", "fp32")
    assert rc == 0, err
    prompts = [PROMPT, PROMPT[2:5]]
    want = [genai_greedy(out, p, NEW_TOKENS) for p in prompts]
    with LLM(str(out), target="ref", max_length=64, hip_graph=True) as llm:
        assert [llm.generate(list(p), max_new_tokens=NEW_TOKENS).token_ids for p in prompts] == want
    with pytest.raises(mgx_graph.ParameterError, match="batch must be 1 .* convolution layers"):
        LLM(str(out), target="ref", max_length=64, batch=2)


@needs_builder
@pytest.mark.slow
def test_the_cuda_flavoured_fp16_graph_with_qk_norms_runs(tmp_path, capsys):
    """Qwen3's fp16 export (the builder's CUDA graph: GroupQueryAttention with q_norm_weight / k_norm_weight,
    which onnxruntime-genai's CPU kernel refuses) decodes on ref to the fp32 folder's onnxruntime-genai tokens."""
    ck = save_checkpoint(tmp_path / "qwen3", "qwen3", seed=2)
    folders = {}
    for precision in ("fp32", "fp16"):
        folders[precision] = tmp_path / f"qwen3-{precision}"
        rc, _, err = run(capsys, ck, folders[precision], "--precision", precision)
        assert rc == 0, err
    import onnx

    graph = onnx.load(str(folders["fp16"] / "model.onnx"), load_external_data=False).graph
    gqa = next(n for n in graph.node if n.op_type == "GroupQueryAttention")
    assert all(gqa.input[14:16]), "the graph was to hold the Q / K norm inputs"
    assert mgx_greedy(folders["fp16"], PROMPT, NEW_TOKENS) == genai_greedy(folders["fp32"], PROMPT, NEW_TOKENS)
