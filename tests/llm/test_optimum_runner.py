"""Dynamic-past (optimum-style) exports run by mgx_graph.llm.optimum_runner over a fixed sliding window:
greedy tokens against transformers' own ``generate`` of the same torch model."""
from __future__ import annotations

import pytest

from mgx_graph.errors import ParameterError
from mgx_graph.llm.generation import generate
from mgx_graph.llm.open_decoder import open_decoder
from mgx_graph.llm.optimum_runner import OptimumRunner, read_folder

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
PROMPTS = ([5, 17, 99, 3, 42], [7, 8], [200, 1, 13, 64, 9, 31, 77, 150, 2])


@pytest.fixture(scope="module")
def folder():
    from mgx_graph.models import build

    return build("llama-optimum", progress=False)


def hf_greedy(info, prompt, n: int) -> list[int]:
    """transformers' greedy continuation (no eos stop) of ``prompt`` by the exported torch model."""
    from mgx_graph.models.llama_optimum import load_torch_model

    model = load_torch_model(info)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=info.config["pad_token_id"])
    return out[0, len(prompt):].tolist()


def test_folder_interface(folder):
    names = list(folder.inputs)
    assert names[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert folder.inputs["past_key_values.0.key"][0] == ["batch", 2, "past", 16]
    assert folder.outputs["present.0.key"][0] == ["batch", 2, "past + seq", 16]
    assert (folder.directory / "config.json").is_file()
    sizes = read_folder(folder.directory)
    assert (sizes["num_layers"], sizes["num_kv_heads"], sizes["head_size"], sizes["vocab_size"]) == (2, 2, 16, 256)


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_same_greedy_tokens_as_transformers(folder, target, hip_graph):
    """Three prompts (three prefill buckets) through one runner: transformers' tokens each time; with
    graphs on, the decode step is captured once and replayed."""
    runner = OptimumRunner(folder.directory, max_length=32, target=target, hip_graph=hip_graph)
    for prompt in PROMPTS:
        assert generate(runner, prompt, 12, eos_token_id=None).tokens == hf_greedy(folder, prompt, 12), prompt
    st = runner.stats()
    assert sorted(runner.programs) == [1, 2, 8, 16]
    if hip_graph:
        assert st["decode"]["captures"] == 1 and st["decode"]["replays"] == 3 * 11 - 3 and st["fallbacks"] == 0
    runner.release()


def test_batch_rows_match_transformers(folder, target):
    runner = OptimumRunner(folder.directory, batch=3, max_length=32, target=target)
    got = generate(runner, list(PROMPTS), 8, eos_token_id=None)
    for p, res in zip(PROMPTS, got):
        assert res.tokens == hf_greedy(folder, p, 8), p
    runner.release()


def test_window_full_stops_the_row(folder):
    runner = OptimumRunner(folder.directory, max_length=8, target="ref")
    res = generate(runner, PROMPTS[0], 10, eos_token_id=None)
    assert res.finish_reason == "cache_full" and len(res.tokens) == 8 - len(PROMPTS[0]) + 1
    assert res.tokens == hf_greedy(folder, PROMPTS[0], len(res.tokens))


def test_open_decoder_detects_the_layout(folder, tmp_path):
    runner, tok, eos, _ = open_decoder(str(folder.directory), target="ref", max_length=16)
    assert isinstance(runner, OptimumRunner) and runner.max_len == 16 and tok is None and eos == [255]
    runner.release()
    context = read_folder(folder.directory)["context_length"]
    runner, *_ = open_decoder(str(folder.directory), target="ref")  # the default window fits the context
    assert runner.max_len == min(64, context)
    runner.release()
    with pytest.raises(ParameterError, match="config.json"):
        read_folder(tmp_path)
    with pytest.raises(ParameterError, match="max_length"):
        OptimumRunner(folder.directory, max_length=10 ** 6, target="ref")


def test_cli_generate_optimum_folder(folder, capsys):
    from mgx_graph.cli.main import main

    want = hf_greedy(folder, PROMPTS[0], 6)
    argv = ["generate", str(folder.directory), "--target", "ref", "--no-stream", "--max-new-tokens", "6",
            "--prompt", " ".join(map(str, PROMPTS[0]))]
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.split()[:len(want)] == [str(t) for t in want], out
    assert f"generated: {len(want)}" in out
    from util import outside_the_program

    L = read_folder(folder.directory)["num_layers"]
    # three copies (ids, mask, positions), one window copy per cache tensor (key and value per layer), argmax
    assert outside_the_program(out) == (3 + 2 * L + 1, [(3, "copies"), (2 * L, "window copies"), (1, "argmax")])


def test_fp16_window_follows_the_program_and_matches_torch(folder, target):
    """Under fp16 the cache buffers take the compiled program's float16 parameters; the prefill logits
    and the logits of a decode step over the slid window agree with the float32 torch model within
    0.05 (about 1% of the logits' scale of ~5; float16 keeps 11 significant bits, and two layers of
    half arithmetic put the observed gap near 0.01)."""
    import numpy as np

    from mgx_graph.models.llama_optimum import load_torch_model

    runner = OptimumRunner(folder.directory, max_length=16, target=target, fp16=True)
    assert runner.program.fp16
    assert {str(a.dtype) for a in runner.state.values()} == {"float16"}
    prompt = PROMPTS[0]
    tokens, _ = runner.prefill_rows([prompt], 8, 0)
    host = lambda a: np.asarray(runner.ctx.to_host(a, runner.queue), np.float32)  # noqa: E731
    first = host(runner.run(8, tokens, np.array([len(prompt)])))[0, 8 - len(prompt):]
    nxt = int(first[-1].argmax())
    step = host(runner.run(1, np.array([[nxt]]), np.array([len(prompt) + 1])))[0]
    with torch.no_grad():
        want = load_torch_model(folder)(torch.tensor([prompt + [nxt]])).logits[0].numpy()
    assert np.isfinite(first).all() and np.isfinite(step).all()
    np.testing.assert_allclose(first, want[:len(prompt)], rtol=0, atol=0.05)
    np.testing.assert_allclose(step, want[len(prompt):], rtol=0, atol=0.05)
    runner.release()


def test_cli_generate_optimum_fp16(capsys):
    from mgx_graph.cli.main import main

    argv = ["generate", "llama-optimum", "--target", "ref", "--fp16", "--no-stream", "--max-new-tokens", "3",
            "--prompt", " ".join(map(str, PROMPTS[0]))]
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "(fp16)" in out and "generated: 3" in out, out
