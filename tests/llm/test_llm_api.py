"""mgx_graph.llm.LLM on a 2-layer SmolLM2 onnxruntime-genai folder (ref): text, streams and chat messages
against onnxruntime-genai's own greedy decode and the tokenizer's chat template."""
from __future__ import annotations

import pytest

from mgx_graph.errors import ParameterError
from genai_oracle import og_greedy

og = pytest.importorskip("onnxruntime_genai")
pytest.importorskip("transformers")

MAX_NEW = 5
CHAT = [{"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"}]


@pytest.fixture(scope="module")
def folder():
    from mgx_graph.models import build

    return build("smollm2-genai", progress=False, num_layers=2).directory


@pytest.fixture(scope="module")
def og_model(folder):
    return og.Model(str(folder))


@pytest.fixture(scope="module")
def llm(folder):
    from mgx_graph.llm import LLM

    with LLM(str(folder), target="ref", max_length=64, batch=2) as m:
        yield m


def test_text_prompt_matches_onnxruntime_genai(llm, og_model):
    text = "The capital of France is"
    res = llm.generate(text, max_new_tokens=MAX_NEW)
    ids = llm.tokenizer(text)["input_ids"]
    want = og_greedy(og_model, ids, MAX_NEW)
    assert res.prompt_token_ids == ids
    assert res.token_ids == want
    assert res.text == llm.tokenizer.decode(want, skip_special_tokens=True)
    assert res.finish_reason == ("stop" if want[-1] in llm.eos_token_ids else "length")
    assert res.timings["prefill_s"] > 0 and res.timings["decode_s"] >= 0


def test_several_prompts_more_than_rows(llm, og_model):
    """Three prompts over two rows: run two, then one; each gives its own greedy tokens, in order."""
    texts = ["Hello there", "One, two, three, four,", "Why is the sky blue?"]
    got = llm.generate(texts, max_new_tokens=4)
    assert [r.prompt_token_ids for r in got] == [llm.tokenizer(t)["input_ids"] for t in texts]
    for r in got:
        assert r.token_ids == og_greedy(og_model, r.prompt_token_ids, 4)


def test_stream_pieces_join_to_the_text(llm):
    stream = llm.stream("Once upon a time", max_new_tokens=8)
    pieces = list(stream)
    whole = llm.generate("Once upon a time", max_new_tokens=8)
    assert pieces and all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == whole.text == stream.result.text
    assert stream.result.token_ids == whole.token_ids


def test_stream_closed_early_frees_the_model(llm):
    stream = llm.stream("Once upon a time", max_new_tokens=40)
    next(iter(stream))
    stream.close()
    assert stream.result is None
    assert len(llm.generate("Hi", max_new_tokens=2).token_ids) <= 2  # the runner is free again


def test_chat_messages_go_through_the_chat_template(llm, og_model):
    tok = llm.tokenizer
    rendered = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    pos = [rendered.find(m["content"]) for m in CHAT]
    assert all(p >= 0 for p in pos) and pos == sorted(pos)  # every turn, in order
    want_ids = tok(rendered, add_special_tokens=False)["input_ids"]
    res = llm.generate(CHAT, max_new_tokens=MAX_NEW)
    assert res.prompt_token_ids == want_ids
    assert res.token_ids == og_greedy(og_model, want_ids, MAX_NEW)


def test_stop_string_cuts_the_text(llm, og_model):
    text = "One, two, three, four,"
    full = llm.tokenizer.decode(og_greedy(og_model, llm.tokenizer(text)["input_ids"], 8), skip_special_tokens=True)
    stop = full.strip()[-1]
    res = llm.generate(text, max_new_tokens=8, stop=stop)
    assert res.text == full[:full.find(stop)]
    assert res.finish_reason == "stop" and res.stop_reason == "stop"


def test_token_ids_prompt_and_sampling_seed(llm):
    ids = llm.tokenizer("Hello")["input_ids"]
    a = llm.generate(ids, max_new_tokens=4, do_sample=True, temperature=0.8, top_p=0.9, seed=7)
    b = llm.generate(ids, max_new_tokens=4, do_sample=True, temperature=0.8, top_p=0.9, seed=7)
    assert a.prompt_token_ids == ids and a.token_ids == b.token_ids


@pytest.mark.parametrize("call, match", [
    (lambda m: m.generate([{"role": "robot", "content": "hi"}]), "message 0"),
    (lambda m: m.generate([{"role": "user", "content": 3}]), "message 0"),
    (lambda m: m.generate("hi", max_new_tokens=2, beams=3), "unknown generation option"),
    (lambda m: m.generate(3.5), "prompt"),
    (lambda m: m.generate([]), "prompts"),
    (lambda m: m.generate("hi", max_new_tokens=-1), "max_new_tokens"),
    (lambda m: m.generate("hi", temperature=0.0, do_sample=True), "temperature"),
    (lambda m: m.stream(["a", "b"]), "one prompt"),
])
def test_bad_arguments_raise_parameter_error(llm, call, match):
    with pytest.raises(ParameterError, match=match):
        call(llm)


def test_unknown_llm_option_raises(folder):
    from mgx_graph.llm import LLM

    with pytest.raises(ParameterError, match="unknown option"):
        LLM(str(folder), target="ref", bogus=1)


@pytest.mark.parametrize("name, options", [("llama", {}), ("llama-optimum", {"max_length": 32})])
def test_token_id_prompts_on_layouts_without_a_tokenizer(name, options):
    """A registry decode step and an optimum-style folder (random-weight LLaMA, no tokenizer): token-id
    prompts give onnxruntime's greedy tokens of the same weights; text needs a tokenizer."""
    from mgx_graph.llm import LLM
    from mgx_graph.models import build
    from mgx_graph.models.oracle import ort_greedy_tokens

    prompt = [1, 2, 3, 4]
    want = ort_greedy_tokens(build("llama", progress=False), prompt, 5)
    with LLM(name, target="ref", **options) as llm:
        res = llm.generate(prompt, max_new_tokens=5)
        assert res.token_ids == want and res.text == "" and res.prompt_token_ids == prompt
        with pytest.raises(ParameterError, match="no tokenizer"):
            llm.generate("text")
