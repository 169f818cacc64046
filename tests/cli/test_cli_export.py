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


def export_matches_genai(tmp_path, capsys, arch: str) -> None:
    """Export a tiny random ``arch`` checkpoint (fp32) and check LLM's greedy tokens on ref against
    onnxruntime-genai's on the same folder (the architecture test files call it)."""
    ck = save_checkpoint(tmp_path / arch, arch, seed=1)
    out = tmp_path / f"{arch}-fp32"
    rc, _, err = run(capsys, ck, out, "--precision", "fp32")
    assert rc == 0, err
    want = genai_greedy(out, PROMPT, NEW_TOKENS)
    assert mgx_greedy(out, PROMPT, NEW_TOKENS) == want
