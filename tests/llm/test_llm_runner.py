"""onnxruntime-genai folders (made by its own model builder) run by mgx_graph.llm.runner: greedy tokens
against onnxruntime-genai's generator, the decode step captured once, one capture per prefill bucket."""
from __future__ import annotations

import re

import numpy as np
import pytest

from mgx_graph.errors import ParameterError
from mgx_graph.llm.generation import generate
from mgx_graph.llm.runner import GenaiLayout, GenaiRunner, length_bucket
from genai_oracle import og_greedy

og = pytest.importorskip("onnxruntime_genai")
PROMPT = [1, 9690, 28, 378, 3575, 282, 4649, 314, 260]  # <|im_start|>... token ids of SmolLM2's vocabulary


def genai_folder(**options):
    from mgx_graph.models import build

    return build("smollm2-genai", progress=False, **options).directory


def test_length_bucket():
    assert [length_bucket(n, 64) for n in (1, 2, 3, 5, 16, 17, 64)] == [1, 2, 4, 8, 16, 32, 64]
    assert length_bucket(40, 48) == 48


def test_not_a_genai_folder_raises(tmp_path):
    with pytest.raises(ParameterError, match="genai_config.json"):
        GenaiLayout.read(tmp_path)
    (tmp_path / "genai_config.json").write_text('{"model": {}}')
    with pytest.raises(ParameterError, match="field 'model.decoder': expected a JSON object, got missing"):
        GenaiLayout.read(tmp_path)


def test_max_length_beyond_context_raises():
    folder = genai_folder(num_layers=2)
    with pytest.raises(ParameterError, match="context length"):
        GenaiRunner(folder, max_length=10 ** 6, target="ref")


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_small_genai_folder_matches_onnxruntime_genai(target, hip_graph):
    """A 2-layer folder: the same greedy tokens as onnxruntime-genai, for one prompt and again for a
    second one (the cache is reused without clearing)."""
    folder = genai_folder(num_layers=2)
    runner = GenaiRunner(folder, max_length=32, target=target, hip_graph=hip_graph)
    for prompt in (PROMPT, PROMPT[:4]):
        want = og_greedy(folder, prompt, 10)
        res = generate(runner, prompt, 10)
        assert res.tokens == want, (prompt, res.tokens, want)
    runner.release()


def test_batch_rows_match_their_single_runs(target):
    """Two prompts of different lengths in one batch: each row gives onnxruntime-genai's tokens for it."""
    folder = genai_folder(num_layers=2)
    runner = GenaiRunner(folder, batch=2, max_length=32, target=target)
    prompts = [PROMPT, PROMPT[2:5]]
    got = generate(runner, prompts, 8)
    for p, res in zip(prompts, got):
        assert res.tokens == og_greedy(folder, p, 8)
    runner.release()


def test_trace_one_capture_for_decode_and_per_prefill_bucket(monkeypatch, capfd):
    """MIGRAPHX_HIP_GRAPH_DEBUG: the decode step is captured once and replayed; each prefill bucket is
    captured on its first run and replayed when a later prompt falls into it."""
    monkeypatch.setenv("MIGRAPHX_HIP_GRAPH_DEBUG", "1")
    folder = genai_folder(num_layers=2)
    runner = GenaiRunner(folder, max_length=32, target="ref", hip_graph=True)
    capfd.readouterr()
    n_new = 6
    for prompt in (PROMPT, PROMPT[:7], PROMPT[:3]):  # buckets 16, 8, 4
        generate(runner, prompt, n_new, eos_token_id=None)
    err = capfd.readouterr().err
    captures = re.findall(r"CAPTURE .* key=(\w+)", err)
    replays = re.findall(r"REPLAY .* key=(\w+)", err)
    assert sorted(runner.programs) == [1, 4, 8, 16]
    assert len(captures) == 4 and len(set(captures)) == 4, err  # decode + 3 buckets
    decode_key = re.findall(r"WARMUP .* key=(\w+)", err)[0]
    assert decode_key in captures
    decode_runs = 3 * (n_new - 1)
    assert replays.count(decode_key) == decode_runs - 3, err  # 2 warmups and 1 capture
    st = runner.stats()
    assert st["captures"] == 4 and st["fallbacks"] == 0
    # the 16 bucket again: replayed, not captured
    generate(runner, PROMPT[:10], 2)
    err = capfd.readouterr().err
    assert "CAPTURE" not in err and err.count("REPLAY") == 2
    runner.release()


def test_cli_counts_what_it_lists_outside_the_program(capsys):
    """A genai folder: per run two copies (ids, mask) and the argmax, counted as listed."""
    from mgx_graph.cli.main import main
    from util import outside_the_program

    argv = ["generate", str(genai_folder(num_layers=2)), "--target", "ref", "--no-stream", "--max-new-tokens", "2",
            "--prompt", "Hi"]
    capsys.readouterr()
    assert main(argv) == 0
    assert outside_the_program(capsys.readouterr().out) == (3, [(2, "copies"), (1, "argmax")])


@pytest.mark.slow
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph"])
def test_cli_fp32_folder_same_tokens_as_onnxruntime_genai(graphs, capsys):
    """`mgx-graph generate FOLDER --target ref` on the full fp32 folder prints onnxruntime-genai's
    greedy answer to the chat prompt."""
    from transformers import AutoTokenizer

    from mgx_graph.cli.main import main

    folder = genai_folder(precision="fp32")
    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    want = og_greedy(folder, ids, 12)
    argv = ["generate", str(folder), "--target", "ref", "--no-stream", "--max-new-tokens", "12",
            "--prompt", "What is the capital of France?"] + (["--hip-graph"] if graphs else [])
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == tok.decode(want, skip_special_tokens=True), out
    assert f"generated: {len(want)}" in out
    runner = GenaiRunner(folder, max_length=64, target="ref", hip_graph=graphs)
    assert generate(runner, ids, 12, eos_token_id=runner.layout.eos_token_ids).tokens == want
    runner.release()


@pytest.mark.slow
def test_int4_folder_same_answer_as_onnxruntime_genai():
    """The int4 folder (MatMulNBits, the tied embedding a GatherBlockQuantized): the same answer text as
    onnxruntime-genai int4."""
    from transformers import AutoTokenizer

    folder = genai_folder(precision="int4")
    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = list(np.asarray(tok("The capital of France is", add_special_tokens=False)["input_ids"]))
    want = og_greedy(folder, ids, 10)
    runner = GenaiRunner(folder, max_length=32, target="ref")
    res = generate(runner, [int(i) for i in ids], 10, tokenizer=tok, eos_token_id=runner.layout.eos_token_ids)
    assert res.text == tok.decode(want, skip_special_tokens=True)
    runner.release()
