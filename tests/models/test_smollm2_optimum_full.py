"""The full 30-layer SmolLM2-135M-Instruct in the optimum layout (slow: about a minute to export, more on
a loaded CPU): ``mgx-graph generate FOLDER --target ref`` prints transformers' greedy answer, graphs off
and on.  The 2-layer build's tests are in test_smollm2_optimum.py."""
from __future__ import annotations

import pytest

from optimum_cli import END_OF_TEXT, build, chat_ids, cli_text, gguf_tokenizer, hf_greedy

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def full(model_cache):
    return build(model_cache)


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
