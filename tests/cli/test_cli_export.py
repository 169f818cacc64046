"""``mgx-graph export``: its argument errors (one ``mgx-graph: error:`` line each, before the builder runs),
and real exports of tiny random checkpoints made here with transformers, whose folders mgx_graph.llm.LLM
runs on ref to the same greedy tokens as onnxruntime-genai's own generator on the same folder."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

import mgx_graph
from mgx_graph.cli.main import main

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
from tiny_checkpoint import save_checkpoint  # noqa: E402
from genai_oracle import og_greedy  # noqa: E402

PROMPT = [1, 5, 9, 14, 22, 7]
NEW_TOKENS = 12


def builder_installed() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "onnx_ir", "onnxruntime_genai"))


def genai_greedy(folder: Path, prompt: list, new_tokens: int) -> list:
    """onnxruntime-genai's greedy tokens on ``folder``, on the CPU whatever provider its config names."""
    return og_greedy(folder, prompt, new_tokens, cpu=True)


def mgx_greedy(folder: Path, prompt: list, new_tokens: int) -> list:
    from mgx_graph.llm import LLM

    with LLM(str(folder), target="ref", max_length=64) as llm:
        return llm.generate(list(prompt), max_new_tokens=new_tokens).token_ids


def run(capsys, *argv):
    rc = main(["export", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mgx-graph: error: "), err
    return lines[0]


# -- argument errors: nothing is built, OUT is not made ---------------------------------------------------
def test_missing_checkpoint_folder(tmp_path, capsys):
    rc, _, err = run(capsys, tmp_path / "nothing", tmp_path / "out", "--precision", "fp32")
    assert rc == 1
    assert "CHECKPOINT_FOLDER" in one_error_line(err) and "does not exist" in err
    assert not (tmp_path / "out").exists()


def test_folder_without_config_json(tmp_path, capsys):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "model.safetensors").write_bytes(b"")
    rc, _, err = run(capsys, tmp_path / "ck", tmp_path / "out", "--precision", "fp32")
    assert rc == 1 and "no config.json" in one_error_line(err)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("config, named", [({"architectures": ["GPT2LMHeadModel"]}, "GPT2LMHeadModel"),
                                           ({"model_type": "llama"}, "no 'architectures' field"),
                                           ({"architectures": None}, "field 'architectures' is None"),
                                           ({"architectures": "Phi3ForCausalLM"},
                                            "is 'Phi3ForCausalLM'; expected a list")])
def test_unsupported_architecture(tmp_path, capsys, config, named):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text(json.dumps(config))
    rc, _, err = run(capsys, tmp_path / "ck", tmp_path / "out", "--precision", "fp32")
    line = one_error_line(err)
    assert rc == 1 and named in line and "LlamaForCausalLM" in line and "config.json" in line
    assert not (tmp_path / "out").exists()


def test_config_json_that_is_not_json(tmp_path, capsys):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text("{not json")
    rc, _, err = run(capsys, tmp_path / "ck", tmp_path / "out", "--precision", "fp32")
    assert rc == 1 and "not valid JSON" in one_error_line(err)


@pytest.mark.parametrize("precision, provider", [("fp16", "cpu"), ("fp32", "cuda")])
def test_graph_flavor_mgx_graph_does_not_run(tmp_path, capsys, precision, provider):
    """The builder makes these pairs with MultiHeadAttention / Attention and position_ids."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    rc, _, err = run(capsys, tmp_path / "ck", tmp_path / "out", "--precision", precision,
                     "--execution-provider", provider)
    line = one_error_line(err)
    assert rc == 1 and f"--precision {precision} --execution-provider {provider}" in line and "fp16 (cuda)" in line


def test_out_with_files_in_it(tmp_path, capsys):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    rc, _, err = run(capsys, tmp_path / "ck", tmp_path / "out", "--precision", "fp32")
    assert rc == 1 and "OUT" in one_error_line(err) and "files in it" in err
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("module", ["onnxruntime_genai.models.builder", "torch"])
def test_builder_missing_names_the_extra(tmp_path, capsys, monkeypatch, module):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    rc, _, err = run(capsys, tmp_path / "ck", tmp_path / "out", "--precision", "fp32")
    line = one_error_line(err)
    assert rc == 1 and f"`{module}`" in line and "pip install 'mgx_graph[genai-export]'" in line
    assert line.startswith("mgx-graph: error: export: "), line  # the message itself, no exception type name
    assert not (tmp_path / "out").exists()


def test_precision_is_required(tmp_path, capsys):
    assert main(["export", str(tmp_path), str(tmp_path / "out")]) == 2
    assert "--precision" in capsys.readouterr().err


# -- real exports -----------------------------------------------------------------------------------------
needs_builder = pytest.mark.skipif(not builder_installed(), reason="onnxruntime-genai's builder is not installed")


@pytest.fixture(scope="module")
def llama_checkpoint(tmp_path_factory):
    if not builder_installed():
        pytest.skip("onnxruntime-genai's builder is not installed")
    return save_checkpoint(tmp_path_factory.mktemp("ck") / "tiny-llama")


@needs_builder
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_export_runs_to_onnxruntime_genai_greedy_tokens(llama_checkpoint, tmp_path, capsys, precision):
    out = tmp_path / f"llama-{precision}"
    rc, stdout, err = run(capsys, llama_checkpoint, out, "--precision", precision)
    assert rc == 0, err
    assert f"-> {out}" in stdout
    assert {"genai_config.json", "model.onnx", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # the work folder is gone
    want = genai_greedy(out, PROMPT, NEW_TOKENS)
    assert len(want) == NEW_TOKENS and mgx_greedy(out, PROMPT, NEW_TOKENS) == want
    # and `mgx-graph generate` takes the folder with a text prompt (the tokenizer's chat template)
    assert main(["generate", str(out), "--target", "ref", "--prompt", "the water is", "--max-new-tokens", "4",
                 "--no-stream"]) == 0
    assert "ms/token" in capsys.readouterr().out


@needs_builder
@pytest.mark.slow
@pytest.mark.parametrize("arch", ["mistral", "qwen2", "qwen3", "phi", "phi3", "gemma", "gemma2", "granite", "olmo",
                                  "smollm3", "ernie", "nemotron", "gpt_oss"])
def test_other_architectures_run_to_onnxruntime_genai_greedy_tokens(tmp_path, capsys, arch):
    ck = save_checkpoint(tmp_path / arch, arch, seed=1)
    out = tmp_path / f"{arch}-fp32"
    rc, _, err = run(capsys, ck, out, "--precision", "fp32")
    assert rc == 0, err
    want = genai_greedy(out, PROMPT, NEW_TOKENS)
    assert mgx_greedy(out, PROMPT, NEW_TOKENS) == want


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
