"""The prompt in one run for the registry's own exports (``prefill.onnx``, mgx_graph/llm/prefill.py): the
logits after a prefill against transformers' full-sequence forward and against token-by-token feeding
through the decode step, for prompts of one token, a few, exactly a bucket and longer than the largest
bucket (chunks); greedy tokens against transformers' generate; rows of different lengths against each
row alone; the decode step's weights shared; prompts longer than the cache refused."""
import numpy as np
import pytest

import mgx_graph
from mgx_graph.errors import MgxError, ParameterError
from mgx_graph.llm.decoder import Decoder
from mgx_graph.llm.generation import generate
from mgx_graph.llm.prefill import plan_runs

M = 16       # cache slots of the tiny llama (conftest's `llama` fixture)
CHUNK = 8    # the largest bucket in these tests: 13 tokens run as 8 + 5 (bucket 8), 9 as 8 + 1 (the decode step)
LENGTHS = [1, 4, 5, CHUNK, 9, 13]


def _prompt(n, seed=3):
    return np.random.default_rng(seed + n).integers(0, 255, n).tolist()  # 255: the llama's eos, left out


def _torch_logits(info, ids):
    from mgx_graph.models.oracle import load_torch_model
    from mgx_graph.models.verify import reference_logits

    return reference_logits(load_torch_model(info))(ids)


@pytest.fixture(scope="module")
def llama2(model_cache):
    """The tiny llama with a step of 2 rows (the build test_generation.py makes too)."""
    from mgx_graph.models import build

    try:
        return build("llama", cache_dir=model_cache, progress=False, max_cache_len=M, batch=2)
    except ImportError as e:
        pytest.skip(f"model export needs the [export] extra: {e}")


def test_plan_runs_cover_the_tokens_within_the_cache():
    for n in range(0, 40):
        for start in range(0, 40 - n):
            runs = plan_runs(n, start, 40, CHUNK)
            assert sum(c for _, c, _ in runs) == n
            at = 0
            for first, count, S in runs:
                assert first == at and count >= 1
                at += count
                if S == 0:
                    assert count == 1 and first == n - 1  # a last single token: the decode step
                else:
                    assert 2 <= S <= CHUNK and S & (S - 1) == 0 and count <= S and start + first + S <= 40
    assert plan_runs(13, 0, 16, 8) == [(0, 8, 8), (8, 5, 8)]
    assert plan_runs(13, 0, 14, 8) == [(0, 8, 8), (8, 4, 4), (12, 1, 0)]  # bucket 8 would pass the cache end
    assert plan_runs(9, 0, 16, 8) == [(0, 8, 8), (8, 1, 0)]
    with pytest.raises(ParameterError, match="17 tokens from slot 0 do not fit the KV cache of 16 slots"):
        plan_runs(17, 0, 16, 8)


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_prefill_logits_match_transformers_and_token_by_token(llama, target, hip_graph):
    assert llama.prefill_onnx_path is not None and llama.prefill_onnx_path.is_file()
    prog = mgx_graph.compile(str(llama.onnx_path), target=target, hip_graph=hip_graph)
    one_run = Decoder(prog, prefill=llama.prefill_onnx_path, prefill_chunk=CHUNK)
    by_token = Decoder(prog)
    for n in LENGTHS:
        ids = _prompt(n)
        one_run.prefill_tokens([ids])
        got = one_run.logits_rows()[0]
        by_token.prefill_tokens([ids])
        want = by_token.logits_rows()[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{n} tokens: against token by token")
        np.testing.assert_allclose(got, _torch_logits(llama, ids)[-1], rtol=1e-4, atol=1e-4,
                                   err_msg=f"{n} tokens: against transformers")
        assert one_run.position == n
        for name, v in one_run.cache().items():  # the slots of the prompt, written in place
            np.testing.assert_allclose(v[:, :, :n], by_token.cache()[name][:, :, :n], rtol=1e-4, atol=1e-5)
    assert sorted(one_run.prefill.programs) == [4, 8]  # 4 -> 4; 5, 8 -> 8; 9 -> 8 (+ 1); 13 -> 8 + 8
    if hip_graph:
        for S, st in one_run.prefill.stats().items():
            assert st["captures"] == 1 and st["fallbacks"] == 0, (S, st)  # captured at its first run
    one_run.release()
    with pytest.raises(MgxError, match="released"):
        by_token.feed(np.array([1]))


def test_greedy_tokens_equal_token_by_token_and_transformers(llama, target):
    from mgx_graph.models.oracle import hf_greedy_tokens

    prog = mgx_graph.compile(str(llama.onnx_path), target=target, hip_graph=True)
    dec = Decoder(prog, prefill=llama.prefill_onnx_path, prefill_chunk=CHUNK)
    eos = llama.config["eos_token_ids"]
    for n in LENGTHS:
        ids, new = _prompt(n), min(3, M - n)
        res = generate(dec, ids, new, eos)
        assert res.tokens == generate(dec, ids, new, eos, prefill="tokens").tokens
        assert res.tokens == hf_greedy_tokens(llama, ids, new), n
        assert res.prefill_s > 0
    assert dec.prefill.runs >= len(LENGTHS)
    full = generate(dec, _prompt(M), 4, eos)  # the whole cache: one token, then the cache is full
    assert len(full.tokens) == 1 and full.finish_reason in ("cache_full", "eos")
    dec.release()


def test_rows_of_different_lengths_equal_each_row_alone(llama, llama2, target):
    prompts = [_prompt(13, 7), _prompt(3, 9)]
    batched = Decoder(mgx_graph.compile(str(llama2.onnx_path), target=target, hip_graph=True),
                      prefill=llama2.prefill_onnx_path, prefill_chunk=4)
    alone = Decoder(mgx_graph.compile(str(llama.onnx_path), target=target, hip_graph=True),
                    prefill=llama.prefill_onnx_path, prefill_chunk=4)
    got = generate(batched, prompts, 3, output_logits=True)
    by_token = generate(batched, prompts, 3, output_logits=True, prefill="tokens")
    for k, p in enumerate(prompts):
        want = generate(alone, p, 3, output_logits=True)
        assert got[k].tokens == want.tokens == by_token[k].tokens, k
        for a, b, c in zip(got[k].logits, want.logits, by_token[k].logits):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got[k].logits[0], _torch_logits(llama, p)[-1], rtol=1e-4, atol=1e-4)
    batched.release()
    alone.release()


def test_prompt_longer_than_the_cache_is_refused(llama):
    dec = Decoder(mgx_graph.compile(str(llama.onnx_path), target="ref"), prefill=llama.prefill_onnx_path)
    with pytest.raises(ParameterError, match=f"prompt 0 has {M + 1} tokens; the KV cache holds {M}"):
        generate(dec, _prompt(M + 1), 1)
    with pytest.raises(ParameterError, match=f"{M + 1} tokens from slot 0 do not fit the KV cache of {M} slots"):
        dec.prefill_tokens([_prompt(M + 1)])
    with pytest.raises(ParameterError, match="prefill_chunk must be a power of two"):
        Decoder(dec.program, prefill=llama.prefill_onnx_path, prefill_chunk=12)
    with pytest.raises(ParameterError, match="prefill must be 'auto'"):
        generate(dec, _prompt(3), 1, prefill="one")


def test_prefill_reads_the_decode_steps_weights(llama, target):
    prog = mgx_graph.compile(str(llama.onnx_path), target=target)
    dec = Decoder(prog, prefill=llama.prefill_onnx_path, prefill_chunk=CHUNK)
    dec.prefill_tokens([_prompt(CHUNK)])
    plan = dec.prefill.program(CHUNK).memory_plan
    # every weight matrix is the decode step's: what it uploads itself are norm weights and the bucket's
    # rotary table; the decode step's literals it does not read are its folded copy of the tied LM head
    # (the prefill reads the embedding through a transpose view instead)
    assert plan.literal_bytes < 0.05 * plan.shared_literal_bytes, plan
    assert plan.shared_literal_bytes >= 0.8 * prog.memory_plan.literal_bytes, (plan, prog.memory_plan)
    dec.release()


def test_llm_uses_the_prefill_of_a_built_folder(llama):
    from mgx_graph.llm import LLM

    with LLM(str(llama.directory), target="ref") as llm:
        assert llm.runner.prefill is not None
        ids = _prompt(9)
        res = llm.generate(ids, max_new_tokens=4)
        assert res.token_ids == llm.generate(ids, max_new_tokens=4, prefill="tokens").token_ids
        assert res.timings["prefill_s"] > 0 and llm.runner.prefill.runs == 1


@pytest.mark.gpu
def test_gpu_prefill_shares_the_gemv_layout_weights_and_captures(llama, gpu_target):
    """On gpu the decode step stores its one-row weights transposed (gemv_layout); the prefill's dots read
    them through transpose views, so nearly all of its weights are still the decode step's."""
    prog = mgx_graph.compile(str(llama.onnx_path), target=gpu_target, hip_graph=True)
    dec = Decoder(prog, prefill=llama.prefill_onnx_path, prefill_chunk=CHUNK)
    by_token = Decoder(prog)
    for n in LENGTHS:
        ids = _prompt(n)
        dec.prefill_tokens([ids])
        by_token.prefill_tokens([ids])
        np.testing.assert_allclose(dec.logits_rows(), by_token.logits_rows(), rtol=1e-3, atol=1e-3)
    plan = dec.prefill.program(CHUNK).memory_plan
    assert plan.literal_bytes < 0.05 * plan.shared_literal_bytes
    assert plan.shared_literal_bytes >= 0.8 * prog.memory_plan.literal_bytes
    st = dec.prefill.stats()[CHUNK]
    assert st["captures"] == 1 and st["fallbacks"] == 0 and st["replays"] >= 1
    dec.release()
