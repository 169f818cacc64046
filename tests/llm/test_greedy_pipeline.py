"""Decoder.greedy_tokens: greedy decoding with each id fed back on the device and the next step queued
before the id is read back.  Checked against transformers' greedy generation and against the
step-by-step Decoder.step chain, with early stops and a cache that fills up."""
import numpy as np
import pytest

import mgx_graph
from mgx_graph.errors import MgxError
from mgx_graph.llm.generation import Decoder, generate

PROMPT = [5, 9, 2, 77, 31, 8]
SLOTS = 16


@pytest.fixture(scope="module")
def llama(model_cache):
    from mgx_graph.models import build

    try:
        return build("llama", cache_dir=model_cache, progress=False, max_cache_len=SLOTS)
    except ImportError as e:
        pytest.skip(f"model export needs the [export] extra: {e}")


def _decoder(info, target, hip_graph):
    return Decoder(mgx_graph.compile(str(info.onnx_path), target=target, hip_graph=hip_graph))


def _stepwise(dec, prompt, n):
    dec.position = 0
    for t in prompt[:-1]:
        dec.step(t, want_next=False)
    out, tok = [], prompt[-1]
    for _ in range(n):
        tok = dec.step(tok)
        out.append(tok)
    return out


def _hf_greedy(info, prompt, n):
    torch = pytest.importorskip("torch")
    from mgx_graph.models.oracle import load_torch_model

    model = load_torch_model(info)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("hip_graph", [False, True])
def test_pipelined_ids_equal_transformers_and_the_step_chain(llama, target, hip_graph):
    n = SLOTS - len(PROMPT) + 1  # to the last slot
    want = _hf_greedy(llama, PROMPT, n)
    dec = _decoder(llama, target, hip_graph)
    assert _stepwise(dec, PROMPT, n) == want
    dec.position = 0
    for t in PROMPT[:-1]:
        dec.feed(np.array([t], np.int64))
    got = list(dec.greedy_tokens(PROMPT[-1], n))
    assert got == want and dec.position == SLOTS


def test_a_count_past_the_cache_ends_when_the_cache_is_full(llama, target):
    dec = _decoder(llama, target, True)
    dec.position = 0
    for t in PROMPT[:-1]:
        dec.feed(np.array([t], np.int64))
    got = list(dec.greedy_tokens(PROMPT[-1], 100))
    assert len(got) == SLOTS - len(PROMPT) + 1 and dec.position == SLOTS
    with pytest.raises(MgxError, match="full"):
        next(dec.greedy_tokens(1, 1))


def test_stopping_early_leaves_the_position_after_the_ids_consumed(llama, target):
    dec = _decoder(llama, target, True)
    want = _stepwise(dec, PROMPT, 6)
    dec.position = 0
    for t in PROMPT[:-1]:
        dec.feed(np.array([t], np.int64))
    ids = dec.greedy_tokens(PROMPT[-1], 6)
    first = [next(ids), next(ids)]
    ids.close()  # the third step was queued ahead: its slot is written again below
    assert first == want[:2] and dec.position == len(PROMPT) + 1
    rest = list(dec.greedy_tokens(first[-1], 4))
    assert first + rest == want


def test_generate_takes_the_pipeline_for_one_greedy_row_and_matches_transformers(llama, target):
    want = _hf_greedy(llama, PROMPT, 8)
    res = generate(_decoder(llama, target, True), PROMPT, 8)
    assert res.tokens == want and res.finish_reason == "length" and res.steps == 8
    eos = want[3]
    res = generate(_decoder(llama, target, True), PROMPT, 8, eos_token_id=eos)
    assert res.tokens == want[:want.index(eos) + 1] and res.finish_reason == "eos"
    res = generate(_decoder(llama, target, False), PROMPT, 100)
    assert res.tokens == _hf_greedy(llama, PROMPT, SLOTS - len(PROMPT) + 1) and res.finish_reason == "cache_full"


def _prefill(dec, prompt):
    dec.position = 0
    for t in prompt[:-1]:
        dec.feed(np.array([t], np.int64))


def test_a_new_chain_a_feed_or_a_reset_closes_the_open_one(llama, target):
    """A generator left open (not closed) never hands its pending read-back to the next chain, and
    never moves the position the caller set since."""
    want = _hf_greedy(llama, PROMPT, 6)
    dec = _decoder(llama, target, True)
    _prefill(dec, PROMPT)
    first = dec.greedy_tokens(PROMPT[-1], 10)
    got = [next(first), next(first)]
    second = dec.greedy_tokens(got[-1], 4)  # continues from the ids consumed: the first one ends
    assert got + list(second) == want and list(first) == []
    _prefill(dec, PROMPT)
    third = dec.greedy_tokens(PROMPT[-1], 10)
    assert next(third) == want[0]
    _prefill(dec, PROMPT)  # the position set, then a feed, while the third is open
    assert list(third) == []
    assert list(dec.greedy_tokens(PROMPT[-1], 6)) == want and dec.position == len(PROMPT) + 5
    fourth = dec.greedy_tokens(PROMPT[-1], 10)
    next(fourth)
    dec.reset()
    assert list(fourth) == [] and dec.position == 0


class _Letters:
    """A tokenizer stand-in: token id i decodes to letter i % 26."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + int(i) % 26) for i in ids)


def _generate_both_ways(dec, monkeypatch, max_new, **kw):
    """generate() as it runs ("piped") and with the pipeline turned off ("plain"): per way the result,
    the streamer's pieces, the on_token ids and whether it took Decoder.sampled_tokens (the pipeline)."""
    from mgx_graph.llm import generation as gen

    calls = []
    real = Decoder.sampled_tokens
    monkeypatch.setattr(Decoder, "sampled_tokens", lambda self, *a: calls.append(a) or real(self, *a))
    text = "stop" in kw
    out = {}
    for way in ("piped", "plain"):
        if way == "plain":
            monkeypatch.setattr(gen, "_pipelines", lambda *a: False)
        n, pieces, ids = len(calls), [], []
        res = generate(dec, PROMPT, max_new, on_token=ids.append, streamer=pieces.append if text else None,
                       tokenizer=_Letters() if text else None, **kw)
        out[way] = (res, pieces, ids, len(calls) > n)
    return out["piped"], out["plain"]


@pytest.mark.parametrize("case", ["greedy", "one", "stop", "penalty", "logits", "sample"])
def test_generate_pipelines_one_row_and_gives_the_plain_loops_results(llama, target, monkeypatch, case):
    """One row (greedy, sampled or with a repetition penalty; on_token, a streamer and stop strings
    included) takes the pipeline; output_logits takes the plain loop.  Either way the results equal the
    plain loop's, and greedy ids equal transformers'."""
    want = _hf_greedy(llama, PROMPT, 8)
    kw = {"greedy": {}, "one": {}, "stop": {"stop": chr(97 + want[2] % 26)},
          "penalty": {"repetition_penalty": 1.3}, "logits": {"output_logits": True},
          "sample": {"do_sample": True, "seed": 5}}[case]
    piped, plain = _generate_both_ways(_decoder(llama, target, True), monkeypatch, 1 if case == "one" else 8, **kw)
    (res, pieces, ids, took), (base, base_pieces, base_ids, base_took) = piped, plain
    assert took == (case != "logits") and not base_took
    assert res.tokens == base.tokens and res.finish_reason == base.finish_reason
    assert ids == res.tokens and base_ids == base.tokens
    assert res.text == base.text and pieces == base_pieces and "".join(pieces) == res.text
    if case in ("greedy", "one", "stop", "logits"):
        assert res.tokens and res.tokens == want[:len(res.tokens)]
    if case == "one":
        assert res.tokens == want[:1] and res.finish_reason == "length"
    if case == "stop":
        assert res.finish_reason == "stop" and len(res.tokens) <= 3 and "".join(pieces) == res.text
    if case == "logits":
        assert [int(np.argmax(v)) for v in res.logits] == res.tokens


def test_the_w1_runner_gives_transformers_ids_and_a_typed_error_when_the_cache_is_full(llama, target):
    """bench/peer_systems.py's MgxStep (the W1 benchmark's mgx_graph runner, pipelined): prefill then
    step to the last slot gives transformers' ids, a token other than the chain's last starts a new
    chain, and a step past the cache is an MgxError, as Decoder.feed raises, not a StopIteration."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
    from peer_systems import MgxStep

    n = SLOTS - len(PROMPT) + 1
    want = _hf_greedy(llama, PROMPT, n)
    runner = MgxStep(llama.onnx_path, target, True, False)
    try:
        runner.reset()
        got = [runner.prefill(PROMPT)]
        while len(got) < n:
            got.append(runner.step(got[-1]))
        assert got == want
        with pytest.raises(MgxError, match="full"):
            runner.step(got[-1])
        runner.reset()
        got = [runner.prefill(PROMPT), runner.step(want[0]), runner.step(want[1])]
        assert got == want[:3]
    finally:
        runner.close()


class _WrittenReader:
    """A HostReader stand-in taking kernel-written ids (``start_written``, ``kernel_writable``) on the ref target: the address
    handed to the writer is the index of one of its two buffers."""

    kernel_writable = True

    def __init__(self):
        self.bufs, self.pending, self.next = [np.zeros((1, 1), np.int64) for _ in range(2)], [], 0

    def start_written(self, write, queue):
        write(self.next)
        self.pending.append(self.next)
        self.next = 1 - self.next

    def wait(self):
        return self.bufs[self.pending.pop(0)].copy()


class _CountedSlot(np.ndarray):
    fills: list = []

    def fill(self, value):
        _CountedSlot.fills.append(int(value))
        super().fill(value)


def _numpy_tail(reader):
    """An ``ArgmaxAdvance`` stand-in class writing through ``reader`` (a :class:`_WrittenReader`): numpy's argmax
    into ids and the reader's buffer, ``next_pos`` into ``pos``, as the kernel does."""

    class NumpyTail:
        def __init__(self, ctx, n, dtype):
            self.n, self.dtype = n, np.dtype(dtype)

        def __call__(self, x, ids, host, pos=None, next_pos=0):
            ids.reshape(-1)[0] = reader.bufs[host][0, 0] = int(np.argmax(x))
            if pos is not None:
                pos[...] = next_pos

    return NumpyTail


def test_the_one_kernel_tail_writes_the_slot_and_the_id_so_no_fill_is_queued(llama, monkeypatch):
    """The greedy tail as the gpu target runs it (``_greedy_tail``: the id into input_ids and the reader,
    the next slot into cache_position), here with numpy standing in for the kernel: the same ids as the
    step chain, one fill per chain (its first slot), and a later feed at another slot fills it again."""
    from mgx_graph.llm import decoder_pipeline as decoder_module

    reader = _WrittenReader()

    monkeypatch.setattr(decoder_module, "ArgmaxAdvance", _numpy_tail(reader))
    dec = _decoder(llama, "ref", True)
    want = _stepwise(dec, PROMPT, 8)
    dec._reader = reader
    slot = dec.params["cache_position"].view(_CountedSlot)
    dec.params["cache_position"] = dec.step_params["cache_position"] = slot
    dec.position = 0
    for t in PROMPT[:-1]:
        dec.feed(np.array([t], np.int64))
    _CountedSlot.fills.clear()
    chain = dec.greedy_tokens(PROMPT[-1], 8)
    got = [next(chain) for _ in range(5)]
    chain.close()
    assert got == want[:5] and _CountedSlot.fills == [len(PROMPT) - 1]
    assert dec.position == len(PROMPT) - 1 + 5 and int(slot[0]) == dec.position + 1  # one step queued ahead
    assert list(dec.greedy_tokens(want[4], 3)) == want[5:8] and _CountedSlot.fills == [len(PROMPT) - 1, dec.position - 3]
    assert _stepwise(dec, PROMPT, 8) == want  # slot 0 onwards again: every slot filled


def _tail_decoder(llama, monkeypatch):
    """A ref Decoder whose greedy chain takes the one-kernel tail path (numpy standing in for the kernel, as
    above), and the list of ``(cache_position seen by the program, Decoder.position)`` of every run."""
    from mgx_graph.llm import decoder_pipeline as decoder_module

    reader = _WrittenReader()

    monkeypatch.setattr(decoder_module, "ArgmaxAdvance", _numpy_tail(reader))
    dec = _decoder(llama, "ref", True)
    dec._reader = reader
    runs, real = [], dec.program.run_async

    def run_async(params, queue):
        runs.append((int(params["cache_position"][0]), dec.position))
        return real(params, queue)

    monkeypatch.setattr(dec.program, "run_async", run_async)
    return dec, runs


def _assert_every_run_at_its_slot(runs):
    bad = [r for r in runs if r[0] != r[1]]
    assert not bad, f"runs whose cache_position was not the Decoder's position (seen, position): {bad}"


def test_the_tail_path_runs_every_step_at_its_slot_when_the_caller_writes_the_slot_in_place(llama, monkeypatch):
    """Decoder.params is public and bench/w1_decode.py writes cache_position in place: a step run by hand after
    a chain (the slot written by the caller), then the position set back to where the chain left it, must
    not take the chain's slot as still written."""
    dec, runs = _tail_decoder(llama, monkeypatch)
    want = _stepwise(dec, PROMPT, 8)
    p = dec.params

    def by_hand(tokens):  # steps run by hand, as bench/w1_decode.py runs them
        for t in tokens:
            p["input_ids"].fill(t)
            p["cache_position"].fill(dec.position)
            dec.program.run_async(dec.step_params, dec.queue)
            dec.position += 1

    _prefill(dec, PROMPT)
    got = list(dec.greedy_tokens(PROMPT[-1], 3))  # the last tail wrote slot len(PROMPT) + 2 ahead
    mark = dec.position
    by_hand([got[-1], want[3]])
    dec.position = mark  # the caller goes back and runs the first of them again
    runs.clear()
    assert dec.step(got[-1]) == want[3]
    _assert_every_run_at_its_slot(runs)
    by_hand([want[4]])  # after a feed: the same
    dec.position = mark + 1
    runs.clear()
    assert dec.step(want[3]) == want[4]
    _assert_every_run_at_its_slot(runs)


def test_the_tail_path_with_positions_set_reset_a_full_cache_and_a_replaced_slot_array(llama, monkeypatch):
    """The one-kernel tail's slot bookkeeping against what every run reads: positions set while a chain is
    open, a reset mid-chain, a chain that fills the cache (its last tail writes the slot past the end), and
    the cache_position array replaced by the caller (bench/soak.py) after a chain."""
    dec, runs = _tail_decoder(llama, monkeypatch)
    n = SLOTS - len(PROMPT) + 1
    want = _stepwise(dec, PROMPT, n)
    _prefill(dec, PROMPT)
    chain = dec.greedy_tokens(PROMPT[-1], n)
    assert [next(chain), next(chain)] == want[:2]
    _prefill(dec, PROMPT)  # positions set (and fed) while the chain is open: it ends, yielding nothing more
    assert list(chain) == [] and list(dec.greedy_tokens(PROMPT[-1], n)) == want and dec.position == SLOTS
    with pytest.raises(MgxError, match="full"):
        next(dec.greedy_tokens(1, 1))
    dec.position = len(PROMPT) - 1  # back from a full cache: the slot after the last is in cache_position
    assert list(dec.greedy_tokens(PROMPT[-1], 4)) == want[:4]
    chain = dec.greedy_tokens(want[3], 4)
    next(chain)
    dec.reset()
    assert list(chain) == [] and dec.position == 0
    assert _stepwise(dec, PROMPT, 3) == want[:3]
    fresh = np.full_like(dec.params["cache_position"], 12345)
    dec.params["cache_position"] = dec.step_params["cache_position"] = fresh
    assert list(dec.greedy_tokens(want[2], 3)) == want[3:6]
    _assert_every_run_at_its_slot(runs)


def test_steps_by_hand_between_chains_run_at_their_slots(llama, target):
    """As above on each target's own greedy path (gpu: the ``mgx_argmax_advance`` tail and the page-locked
    reader; ref: the argmax and a copy): a chain, two steps run by hand on Decoder.params, the position set
    back, and the next step and chain give the step-by-step ids."""
    dec = _decoder(llama, target, True)
    want = _stepwise(dec, PROMPT, 8)
    p, ctx, q = dec.params, dec.ctx, dec.queue
    _prefill(dec, PROMPT)
    got = list(dec.greedy_tokens(PROMPT[-1], 3))
    mark = dec.position
    with ctx.on_queue(q):
        for t in (got[-1], want[3]):
            p["input_ids"].fill(t)
            p["cache_position"].fill(dec.position)
            dec.program.run_async(dec.step_params, q)
            dec.position += 1
    dec.position = mark
    assert got == want[:3] and list(dec.greedy_tokens(got[-1], 5)) == want[3:8]
