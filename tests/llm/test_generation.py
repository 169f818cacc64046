"""Generation options: sampling against transformers' logits processors and a numpy reference of the
same rules, stop strings, text streaming, and batched left-padded decoding against batch-1 runs and
transformers' generate."""
import string

import numpy as np
import pytest

import mgx_graph
from mgx_graph.errors import ParameterError
from mgx_graph.llm.generation import Decoder, generate
from mgx_graph.llm.sampling import SamplingConfig, TokenSampler, process_logits
from mgx_graph.llm.streaming import RowText

TINY = {"gpt2": dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, max_cache_len=16),
        "llama": dict(max_cache_len=16)}
PROMPTS = [[5, 9, 2, 77, 31, 8], [100, 3]]  # different lengths: the second is left-padded by 4


def _build(cache, name, **extra):
    from mgx_graph.models import build

    try:
        return build(name, cache_dir=cache, progress=False, **TINY[name], **extra)
    except ImportError as e:  # torch / transformers missing
        pytest.skip(f"model export needs the [export] extra: {e}")


@pytest.fixture(scope="module")
def llama(model_cache):
    return _build(model_cache, "llama")


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def pair(request, model_cache):
    """(batch-1 build, batch-2 build) of the same weights."""
    return _build(model_cache, request.param), _build(model_cache, request.param, batch=2)


# -- sampling: transformers' processors and a numpy reference -----------------------------------------
CONFIGS = [
    dict(repetition_penalty=1.3, temperature=0.7, top_k=20, top_p=0.8),
    dict(temperature=1.5, top_k=5),
    dict(top_p=0.5, top_k=None),
    dict(repetition_penalty=0.7, top_k=None, top_p=0.95, min_p=0.05),
    dict(top_k=1000, temperature=0.3, min_p=0.2),
    dict(top_k=1),
    dict(repetition_penalty=1.5, top_k=None),  # nothing filtered: every penalized logit is compared
    dict(repetition_penalty=0.5, top_k=None, temperature=2.0),
]


def _hf_chain(cfg):
    from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                        TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

    chain = []
    if cfg.get("repetition_penalty", 1.0) != 1.0:
        chain.append(RepetitionPenaltyLogitsProcessor(cfg["repetition_penalty"]))
    if cfg.get("temperature", 1.0) != 1.0:
        chain.append(TemperatureLogitsWarper(cfg["temperature"]))
    if cfg.get("top_k", 50):
        chain.append(TopKLogitsWarper(cfg.get("top_k", 50)))
    if cfg.get("top_p", 1.0) < 1.0:
        chain.append(TopPLogitsWarper(cfg["top_p"]))
    if cfg.get("min_p") is not None:
        chain.append(MinPLogitsWarper(cfg["min_p"]))
    return chain


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_processors_match_transformers(cfg, rng):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    scores = (rng.standard_normal((4, 300)) * 3).astype(np.float32)
    history = rng.integers(0, 300, size=(4, 12))
    seen = np.zeros((4, 300), bool)
    np.put_along_axis(seen, history, True, axis=1)
    want = torch.from_numpy(scores.copy())
    for proc in _hf_chain(cfg):
        want = proc(torch.from_numpy(history), want)
    want = want.numpy()
    got = process_logits(scores, seen, SamplingConfig(do_sample=True, **cfg))
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    kept = np.isfinite(want)
    assert kept.sum(axis=1).min() >= 1
    np.testing.assert_allclose(got[kept], want[kept], rtol=1e-6, atol=0)
    assert not np.array_equal(got, scores)  # every config changes something


def _u(seed, step, row):
    """The draw's u: word 0 of Philox4x32-10 at counter (step, row) under the seed, to 24 bits."""
    from test_sampling_rule import _philox_plain

    return (_philox_plain((step & 0xFFFFFFFF, step >> 32, row, 0), (seed & 0xFFFFFFFF, seed >> 32))[0] >> 8) / 2**24


def _reference_next(scores, seen_rows, cfg, seed, step):
    """The rules as the sampling module states them, written out per row with plain Python."""
    out = []
    for r, (row, seen) in enumerate(zip(scores.astype(np.float64), seen_rows)):
        s = row.copy()
        p = cfg.get("repetition_penalty", 1.0)
        for t in set(seen):
            s[t] = s[t] * p if s[t] < 0 else s[t] / p
        s = s.astype(np.float32).astype(np.float64)
        s = s / cfg.get("temperature", 1.0)
        k = cfg.get("top_k", 50)
        if k:
            kth = sorted(s, reverse=True)[min(k, len(s)) - 1]
            s = np.where(s < kth, -np.inf, s)

        def probs(x):
            e = np.exp(x - x.max())
            return e / e.sum()

        top_p = cfg.get("top_p", 1.0)
        if top_p < 1.0:
            pr = probs(s)
            order = sorted(range(len(s)), key=lambda i: s[i])  # ascending
            total, drop = 0.0, set()
            for i in order[:-1]:
                total += pr[i]
                if total <= 1 - top_p:
                    drop.add(i)
            s = np.array([-np.inf if i in drop else v for i, v in enumerate(s)])
        if cfg.get("min_p") is not None:
            pr = probs(s)
            s = np.where(pr < cfg["min_p"] * pr.max(), -np.inf, s)
        pr = probs(s)
        u = _u(seed, step, r) * pr.sum()
        acc = 0.0
        for i, q in enumerate(pr):
            acc += q
            if acc > u:
                out.append(i)
                break
    return out


@pytest.mark.parametrize("cfg", CONFIGS[:5] + CONFIGS[6:], ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_seeded_sampling_is_reproducible_and_matches_a_numpy_reference(cfg, rng):
    steps = [(rng.standard_normal((3, 200)) * 2).astype(np.float32) for _ in range(25)]
    prompts = [list(rng.integers(0, 200, size=5)) for _ in range(3)]

    def run(seed):
        sampler = TokenSampler(SamplingConfig(do_sample=True, seed=seed, **cfg), 3, 200)
        for r, p in enumerate(prompts):
            sampler.observe(r, p)
        picked = []
        for scores in steps:
            nxt = sampler.choose(scores)
            for r, t in enumerate(nxt):
                sampler.observe(r, [t])
            picked.append(nxt.tolist())
        return picked

    seen = [list(p) for p in prompts]
    want = []
    for n, scores in enumerate(steps):
        nxt = _reference_next(scores, seen, cfg, 7, n)
        for r, t in enumerate(nxt):
            seen[r].append(t)
        want.append(nxt)
    assert run(7) == want
    assert run(7) == run(7)
    assert run(8) != want  # the seed matters


def test_sampling_options_are_checked():
    for bad in (dict(temperature=0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1), dict(top_k=2.5),
                dict(repetition_penalty=0), dict(min_p=2), dict(seed=-1), dict(temperature=float("nan"))):
        with pytest.raises(ParameterError, match=next(iter(bad))):
            SamplingConfig(do_sample=True, **bad)


# -- generation on a random-weight decoder ------------------------------------------------------------
class Chars:
    """A tokenizer for the 256-token random models: token t is one letter or digit."""

    ALPHABET = string.ascii_letters + string.digits

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.ALPHABET[int(t) % len(self.ALPHABET)] for t in ids)


class Bytes:
    """Token t is the byte t (UTF-8 text; a split character decodes to U+FFFD)."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(int(t) for t in ids).decode("utf-8", errors="replace")


def _compile(info, target, hip_graph=False):
    return mgx_graph.compile(str(info.onnx_path), target=target, hip_graph=hip_graph)


def test_greedy_with_repetition_penalty_matches_transformers(llama, target):
    torch = pytest.importorskip("torch")
    from mgx_graph.models.oracle import load_torch_model

    model = load_torch_model(llama)
    prompt, eos = PROMPTS[0], llama.config["eos_token_ids"]
    ids = torch.tensor([prompt])
    for penalty in (0.6, 1.3):
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=10, repetition_penalty=penalty, eos_token_id=eos, pad_token_id=eos[0])
        want = out[0, len(prompt):].tolist()
        res = generate(Decoder(_compile(llama, target)), prompt, 10, eos, repetition_penalty=penalty)
        assert res.tokens == want, penalty
        plain = generate(Decoder(_compile(llama, target)), prompt, 10, eos)
        assert plain.tokens != want, penalty  # the penalty changed the answer


def test_sampled_generation_matches_the_reference_on_onnxruntime_logits(llama, target):
    """Seeded sampling through the compiled step gives the tokens that the numpy reference picks from
    onnxruntime's logits of the same sequence."""
    import onnxruntime as ort

    cfg = dict(temperature=0.9, top_k=40, top_p=0.9, repetition_penalty=1.2)
    prompt = PROMPTS[0]
    res = generate(Decoder(_compile(llama, target)), prompt, 8, do_sample=True, seed=11, **cfg)
    again = generate(Decoder(_compile(llama, target)), prompt, 8, do_sample=True, seed=11, **cfg)
    assert res.tokens == again.tokens and len(res.tokens) == 8
    sess = ort.InferenceSession(str(llama.onnx_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    shapes = {i.name: i.shape for i in sess.get_inputs()}
    feeds = {n: np.zeros(s, np.float32) for n, s in shapes.items() if n.startswith("past")}
    seq, want = list(prompt), []
    for pos in range(len(prompt) + 7):
        feeds.update(input_ids=np.array([[seq[pos]]], np.int64), cache_position=np.array([pos], np.int64))
        outs = dict(zip(names, sess.run(None, feeds)))
        for n in names[1:]:
            feeds[llama.alias[n]] = outs[n]
        if pos >= len(prompt) - 1:  # the reference picks from these logits, with every token so far seen
            want.append(_reference_next(outs["logits"][0], [seq], cfg, 11, len(want))[0])
            seq.append(res.tokens[len(want) - 1])  # then the sequence goes on with our pick
    assert res.tokens == want


def test_stop_string_ends_generation_and_is_cut(llama, target):
    prog = _compile(llama, target)
    full = generate(Decoder(prog), PROMPTS[0], 10, tokenizer=Chars())
    assert len(full.text) == 10 and full.finish_reason == "length"
    stop = full.text[5:7]
    at = full.text.find(stop)
    pieces = []
    res = generate(Decoder(prog), PROMPTS[0], 10, stop=["@@", stop], tokenizer=Chars(), streamer=pieces.append)
    assert res.finish_reason == "stop"
    assert res.text == full.text[:at]
    assert res.tokens == full.tokens[:at + len(stop)]  # up to the token that completed the stop string
    assert "".join(pieces) == res.text
    with pytest.raises(ParameterError, match="tokenizer"):
        generate(Decoder(prog), PROMPTS[0], 4, stop="x")
    none = generate(Decoder(prog), PROMPTS[0], 0)
    assert (none.tokens, none.finish_reason) == ([], "length")
    short = generate(Decoder(prog), PROMPTS[0], 100)  # 6 prompt slots of 16: 11 tokens, then the cache is full
    assert short.tokens == full.tokens[:10] + short.tokens[10:] and len(short.tokens) == 11
    assert short.finish_reason == "cache_full"
    assert generate(Decoder(prog), PROMPTS[0], 10).tokens == full.tokens  # still usable


def test_streamed_text_is_exactly_the_final_text(llama, target):
    prog = _compile(llama, target)
    pieces = []
    res = generate(Decoder(prog), PROMPTS[0], 10, tokenizer=Bytes(), streamer=pieces.append)
    assert "".join(pieces) == res.text == Bytes().decode(res.tokens)
    assert all(not p.endswith("\ufffd") for p in pieces[:-1])


def _byte_level_bpe(corpus):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([corpus] * 4, trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


class _HfLike:
    def __init__(self, tok):
        self.tok = tok

    def decode(self, ids, skip_special_tokens=True):
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("text", ["Grüße aus Köln — 東京 🎉🎉 done.", "naïve café, ok? 😀 ünïcödé\n\nend"])
def test_streaming_keeps_multibyte_characters_whole(text):
    tok = _byte_level_bpe("hello world " * 20)  # multi-byte characters stay split into byte tokens
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text
    assert any("\ufffd" in tok.decode(ids[:k]) for k in range(1, len(ids)))  # some prefix ends mid-character
    pieces = []
    rt = RowText(_HfLike(tok), streamer=pieces.append)
    for t in ids:
        rt.add(t)
        joined = "".join(pieces)
        assert "\ufffd" not in joined and text.startswith(joined)
    assert rt.finish() == text and "".join(pieces) == text


class _Words:
    """Word tokens, each followed by a space, then transformers' clean_up_tokenization (" ," -> ","):
    a token's text depends on the next one."""

    WORDS = ["Hello", ",", "world", ".", "it", "'s", "fine", "!", "ok", "?"]

    def decode(self, ids, skip_special_tokens=True):
        text = "".join(self.WORDS[i] + " " for i in ids)
        for a, b in ((" ,", ","), (" .", "."), (" 's", "'s"), (" !", "!"), (" ?", "?")):
            text = text.replace(a, b)
        return text


def test_streaming_waits_for_text_the_next_token_may_change():
    words = _Words()
    assert not words.decode([0, 1]).startswith(words.decode([0]))  # "Hello " -> "Hello, "
    pieces = []
    rt = RowText(words, stop=("fine!",), streamer=pieces.append)
    for k in range(10):
        if rt.add(k):
            break
        assert words.decode(range(k + 1)).startswith("".join(pieces))
    assert k == 7  # "fine" + "!" completes the stop string
    final = rt.finish()
    assert final == "Hello, world. it's " and "".join(pieces) == final


# -- batches with left padding ------------------------------------------------------------------------
@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_batch_of_two_equals_two_single_runs(pair, target, hip_graph):
    from mgx_graph.models.oracle import hf_greedy_tokens

    one, two = pair
    assert two.config["batch"] == 2 and "attention_mask" in two.inputs and "batch" not in one.config
    eos = one.config["eos_token_ids"]
    p1 = _compile(one, target, hip_graph)
    alone = [generate(Decoder(p1), p, 8, eos, output_logits=True) for p in PROMPTS]
    singles = [r.tokens for r in alone]
    assert singles == [hf_greedy_tokens(one, p, 8) for p in PROMPTS]
    p2 = _compile(two, target, hip_graph)
    res = generate(Decoder(p2), PROMPTS, 8, eos, output_logits=True)
    assert [r.tokens for r in res] == singles
    for r, a in zip(res, alone):  # the same distributions, not only the same argmax
        np.testing.assert_allclose(np.stack(r.logits), np.stack(a.logits), rtol=1e-4, atol=1e-4)
    assert [r.prompt_tokens for r in res] == [6, 2]
    st = p2.stats()
    if hip_graph:
        runs = len(PROMPTS[0]) + max(map(len, singles)) - 1  # every prompt slot, then each new token but the last
        assert (st["captures"], st["fallbacks"]) == (1, 0) and st["replays"] == runs - 3
    # a row that ends early (at its eos) keeps stepping padded; the other row is unchanged
    stop_id = singles[1][2]
    early = generate(Decoder(p2), PROMPTS, 8, [stop_id])
    assert early[1].tokens == singles[1][:singles[1].index(stop_id) + 1] and early[1].finish_reason == "eos"
    cut = singles[0].index(stop_id) + 1 if stop_id in singles[0] else 8
    assert early[0].tokens == singles[0][:cut]
    # one prompt on the two-row step: the spare row is padding
    assert generate(Decoder(p2), [PROMPTS[1]], 8, eos)[0].tokens == singles[1]


def test_batch_of_two_lowers_to_one_gpu_graph_region(pair):
    """The gpu lowering of the two-row step (no device needed to lower): the mask's GatherND and the cache
    ScatterNDs with strided updates have capturable kernels, so nothing cuts the step into several graph
    regions (each captured on its own, as the gpu graph run of the test above counted them)."""
    from mgx_graph.passes import PassContext, PassManager, PipelineOptions
    from mgx_graph.passes.bind_outputs import detect_alias
    from mgx_graph.targets import pipeline

    for info in pair:
        prog = mgx_graph.parse_onnx(str(info.onnx_path))
        opts = PipelineOptions(hip_graph=True, alias=detect_alias(prog, prog.metadata), strict_alias=False)
        PassManager(pipeline("gpu", opts), PassContext("gpu")).run(prog)
        main = prog.get_main_module()
        regions = [main.label_of(i) for i in main.instructions if i.op.name == "graph_launch"]
        cut = [f"{main.label_of(i)} {i.op.name}: {i.meta['kernel'].label}" for i in main.instructions
               if "kernel" in i.meta and not i.meta["kernel"].capturable]
        assert len(regions) == 1 and cut == [], (info.name, regions, cut)


def test_batch_rows_follow_their_own_options(pair, target):
    one, two = pair
    prog = _compile(two, target)
    full = generate(Decoder(prog), PROMPTS, 10, tokenizer=Chars())
    stop = full[1].text[3:5]
    pieces = ([], [])
    res = generate(Decoder(prog), PROMPTS, 10, tokenizer=Chars(), stop=stop,
                   streamer=[pieces[0].append, pieces[1].append])
    for r, f, p in zip(res, full, pieces):
        at = f.text.find(stop)
        assert r.text == (f.text[:at] if at >= 0 else f.text) and "".join(p) == r.text
    assert res[1].finish_reason == "stop"
    with pytest.raises(ParameterError, match="at most 2 rows"):
        generate(Decoder(prog), PROMPTS * 2, 4)
    with pytest.raises(ParameterError, match="one per prompt"):
        generate(Decoder(prog), PROMPTS, 4, tokenizer=Chars(), streamer=print)
    with pytest.raises(ParameterError, match="prompt 1: token ids"):
        generate(Decoder(prog), [PROMPTS[0], [1, 999]], 4)
    assert [r.tokens for r in generate(Decoder(prog), PROMPTS, 10)] == [f.tokens for f in full]


def test_batch_option_leaves_one_row_builds_as_they_were(tmp_path):
    from mgx_graph.models import model_dir
    from mgx_graph.models.llama import normalize_options

    for name, opts in TINY.items():
        assert model_dir(name, cache_dir=tmp_path, batch=1, **opts) == model_dir(name, cache_dir=tmp_path, **opts)
        assert model_dir(name, cache_dir=tmp_path, batch=2, **opts) != model_dir(name, cache_dir=tmp_path, **opts)
    assert "batch" not in normalize_options({}) and normalize_options({"batch": 3})["batch"] == 3
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="batch"):
            normalize_options({"batch": bad})
    with pytest.raises(ValueError, match="kind='static'"):
        model_dir("gpt2", cache_dir=tmp_path, kind="dynamic", batch=2)


def test_one_row_build_has_the_one_row_interface(llama):
    assert list(llama.inputs)[:3] == ["input_ids", "cache_position", "past_key_values.0.key"]
    assert llama.inputs["input_ids"][0] == [1, 1] and "batch" not in llama.options


# -- the command line ---------------------------------------------------------------------------------
def test_cli_batches_prompts_and_streams_one(pair, capsys, tmp_path):
    from mgx_graph.cli.main import main

    one, two = pair
    prog = _compile(one, "ref")
    singles = [generate(Decoder(prog), p, 6, one.config["eos_token_ids"]).tokens for p in PROMPTS]
    args = ["generate", str(two.directory), "--target", "ref", "--max-new-tokens", "6"]
    assert main(args + ["--prompt", " ".join(map(str, PROMPTS[0])), "--prompt", " ".join(map(str, PROMPTS[1]))]) == 0
    out = capsys.readouterr().out
    for k, toks in enumerate(singles):
        assert f"[{k + 1}] " + " ".join(map(str, toks)) + " \n" in out
    assert "batch 2" in out and "generated: 6, 6 (length, length)" in out
    f = tmp_path / "prompts.txt"
    f.write_text(" ".join(map(str, PROMPTS[1])) + "\n")
    stop = f" {singles[1][2]} "
    assert main(args + ["--batch-prompts", str(f), "--stop", stop]) == 0
    out = capsys.readouterr().out
    full = "".join(f"{t} " for t in singles[1])
    assert out.startswith(full[:full.find(stop)] + "\n")  # streamed, cut before the stop string
    assert "(stop)" in out
    assert main(["generate", str(one.directory), "--target", "ref", "--prompt", "1 2", "--prompt", "3"]) == 1
    assert "takes 1 row(s); build it with batch=2" in capsys.readouterr().err


def test_cli_counts_what_it_lists_outside_the_program(pair, capsys):
    """One greedy row: one fill (the position), the argmax written into the next step's ids and the
    id's read-back copy; B rows: three copies (ids, positions, mask),
    one fill (the slot) and the argmax, or the logits read back when sampling."""
    from mgx_graph.cli.main import main
    from util import outside_the_program

    one, two = pair
    base = ["--target", "ref", "--no-stream", "--max-new-tokens", "2", "--prompt", "1 2"]
    cases = [([str(one.directory)], [(1, "fill"), (1, "read-back copy"), (1, "argmax")]),
             ([str(two.directory), "--prompt", "3"], [(3, "copies"), (1, "fill"), (1, "argmax")]),
             ([str(two.directory), "--prompt", "3", "--do-sample", "--seed", "1"],
              [(3, "copies"), (1, "fill"), (1, "logits read-back")])]
    for argv, want in cases:
        capsys.readouterr()
        assert main(["generate", *argv, *base]) == 0
        n, parts = outside_the_program(capsys.readouterr().out)
        assert parts == want and n == sum(k for k, _ in want), (argv, n, parts)
