"""fuse_gemv on the tiny decode steps (``tiny`` fixture: a random llama, SmolLM2-shaped, and a gpt2):
the kernels of the gpu program after its passes (lowering runs without a device: the sources are
compiled on first launch), and the greedy tokens of the fused program against transformers (float32)
and against the unfused program (float16), on each target."""
from collections import Counter

import numpy as np
import pytest

import mgx_graph
from mgx_graph.llm.generation import Decoder, generate
from mgx_graph.passes import PassContext, PassManager, PipelineOptions
from mgx_graph.targets import pipeline


def _gpu_counts(info, disabled):
    prog = mgx_graph.parse_onnx(str(info.onnx_path))
    PassManager(pipeline("gpu", PipelineOptions(fp16=True)), PassContext("gpu"), disabled=disabled).run(prog)
    main = prog.get_main_module().instructions
    return Counter(i.op.name for i in main), [i for i in main if i.op.name == "fused_gemv"]


def test_gpu_program_kernels_before_and_after(tiny):
    """llama: per layer the input norm joins the QKV dot, the post-attention norm the gate / up dot
    and the SiLU(gate) * up after it; the final norm joins the LM head.  gpt2 (LayerNorm, GELU over a
    biased dot): nothing is fused."""
    (before, _), (after, fused) = _gpu_counts(tiny, {"fuse_gemv"}), _gpu_counts(tiny, set())
    layers = tiny.config["num_layers"]
    assert before["fused_gemv"] == 0 and before["dot"] == 4 * layers + 1
    if tiny.config["architecture"] == "gpt2":
        assert after == before
        return
    assert before["fused_reduce"] == 2 * layers + 1
    assert after["fused_gemv"] == 2 * layers + 1
    assert after["fused_reduce"] == 0
    assert after["dot"] == 2 * layers  # O and down
    assert after["pointwise"] == before["pointwise"] - layers
    for f in fused:
        k = f.meta["kernel"]
        assert k.label.startswith("fused_gemv (generated mgx_gemv_") and k.launches == 1 and k.capturable
    kinds = Counter(f.op.attr_string().split("kernel=")[1].rstrip("]") for f in fused)
    assert kinds["convert_add_rms_norm_dot_sigmoid_mul_mul"] + kinds["add_rms_norm_dot_sigmoid_mul_mul"] == layers


def _compile(info, target, fp16, monkeypatch, disabled=None):
    from mgx_graph import env

    if disabled:
        monkeypatch.setenv("MIGRAPHX_DISABLE_PASSES", disabled)
    else:
        monkeypatch.delenv("MIGRAPHX_DISABLE_PASSES", raising=False)
    env._reset_for_tests()
    try:
        return mgx_graph.compile(str(info.onnx_path), target=target, fp16=fp16, hip_graph=False)
    finally:
        monkeypatch.delenv("MIGRAPHX_DISABLE_PASSES", raising=False)
        env._reset_for_tests()


def _fused_count(prog):
    return sum(i.op.name == "fused_gemv" for m in prog.program.module_order() for i in m.instructions)


def test_fused_decode_tokens(tiny, target, monkeypatch):
    """float32: transformers' greedy tokens; float16: the unfused float16 program's tokens, and on
    ``ref`` its logits bit for bit (the submodules run the same kernels)."""
    from mgx_graph.models.oracle import hf_greedy_tokens

    prompt, n_new = [5, 9, 2, 77], 6
    eos = tiny.config["eos_token_ids"]
    llama = tiny.config["architecture"] == "llama"
    fp32 = _compile(tiny, target, False, monkeypatch)
    assert (_fused_count(fp32) > 0) == llama
    assert generate(Decoder(fp32), prompt, n_new, eos).tokens == hf_greedy_tokens(tiny, prompt, n_new)
    half = _compile(tiny, target, True, monkeypatch)
    plain = _compile(tiny, target, True, monkeypatch, "fuse_gemv")
    assert (_fused_count(half) > 0) == llama and _fused_count(plain) == 0
    assert generate(Decoder(half), prompt, n_new, eos).tokens == generate(Decoder(plain), prompt, n_new, eos).tokens
    if target == "ref":
        a, b = Decoder(half), Decoder(plain)
        for t in prompt:
            a.step(t)
            b.step(t)
            assert np.array_equal(half.context.to_host(a.last_logits, half.queue),
                                  plain.context.to_host(b.last_logits, plain.queue))


@pytest.mark.parametrize("name", ["llama"])
def test_saved_program_keeps_the_fused_gemv(name, tiny, tmp_path, monkeypatch):
    """A compiled program with fused_gemv instructions saves and loads (their submodules with them) and
    gives the same logits."""
    if tiny.config["architecture"] != name:
        pytest.skip("llama only")
    prog = _compile(tiny, "ref", True, monkeypatch)
    path = tmp_path / "step.mxr"
    prog.save(str(path))
    loaded = mgx_graph.load(str(path))
    assert _fused_count(loaded) == _fused_count(prog) > 0
    a, b = Decoder(prog), Decoder(loaded)
    for t in (3, 17):
        a.step(t)
        b.step(t)
        assert np.array_equal(prog.context.to_host(a.last_logits, prog.queue),
                              loaded.context.to_host(b.last_logits, loaded.queue))
