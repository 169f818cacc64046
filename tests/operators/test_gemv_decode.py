"""A fixed-shape llama decode step with its one-row projections rewritten for the gemv kernel, against
onnxruntime running the same ONNX graph with the caches fed back.  On ``gpu`` the usual pipeline runs
(``gemv_layout``, then the gemv kernel for every one-row dot against a weight); on ``ref`` the same
``gemv_layout`` pass is put into the ref pipeline, so numpy evaluates the rewritten program."""
import numpy as np
import pytest

import mgx_graph
from mgx_graph.llm.generation import Decoder
from mgx_graph.passes import GemvLayout, PassGroup

pytestmark = pytest.mark.usefixtures("gemv_on")  # the opt-in kernel on




@pytest.fixture(scope="module")
def tiny(model_cache):
    from mgx_graph.models import build

    try:
        return build("llama", cache_dir=model_cache, progress=False, max_cache_len=16)
    except ImportError as e:  # torch / transformers missing
        pytest.skip(f"model export needs the [export] extra: {e}")


def _with_layout(monkeypatch):
    from mgx_graph.targets import ref

    plain = ref.pipeline

    def pipeline(options):
        groups = plain(options)
        names = [g.name for g in groups]
        at = names.index("gemv" if "gemv" in names else "outputs")  # before fuse_gemv, as on gpu
        return groups[:at] + [PassGroup("layout", [GemvLayout()])] + groups[at:]

    monkeypatch.setattr(ref, "pipeline", pipeline)


def test_decode_steps_with_transposed_weights_match_onnxruntime(tiny, target, monkeypatch):
    import onnxruntime as ort

    if target == "ref":
        _with_layout(monkeypatch)
    prog = mgx_graph.compile(str(tiny.onnx_path), target=target, hip_graph=False)
    dots = [i for m in prog.program.module_order() for i in m.instructions if i.op.name == "dot"]
    stored = [d for d in dots if d.inputs[1].op.name == "transpose" and d.inputs[1].inputs[0].op.name == "@literal"
              and d.inputs[1].shape.strides[-2] == 1]
    assert len(stored) >= len(dots) // 2 > 0  # the layers' projections (the LM head may already be [N, K])
    if target == "gpu":
        assert all(d.meta["kernel"].label.startswith("gemv (gemv.cu") for d in stored)
    sess = ort.InferenceSession(str(tiny.onnx_path), providers=["CPUExecutionProvider"])
    feeds = {i.name: np.zeros(i.shape, np.float32) for i in sess.get_inputs() if i.name.startswith("past")}
    names = [o.name for o in sess.get_outputs()]
    dec = Decoder(prog)
    for pos, t in enumerate([3, 17, 42, 5, 99, 8]):
        dec.step(t)
        feeds.update(input_ids=np.array([[t]], np.int64), cache_position=np.array([pos], np.int64))
        outs = sess.run(None, feeds)
        got = prog.context.to_host(dec.last_logits, prog.queue)
        np.testing.assert_allclose(got, outs[0], rtol=1e-4, atol=1e-4, err_msg=f"step {pos}")
        for n, v in zip(names[1:], outs[1:]):
            feeds[tiny.alias[n]] = v


@pytest.mark.slow
def test_smollm2_greedy_tokens_with_transposed_weights_equal_transformers(model_cache, run_shared, monkeypatch):
    """The real SmolLM2-135M (ref, float32) with every layer projection stored transposed by
    ``gemv_layout`` (merged QKV, O, merged gate/up, down): greedy tokens equal transformers' generate."""
    from mgx_graph.llm.generation import generate
    from mgx_graph.models import build
    from mgx_graph.models.oracle import chat_prompt_ids

    from shared_oracle import hf_greedy_tokens_once

    try:
        info = build("smollm2", cache_dir=model_cache, progress=False)
    except ImportError as e:
        pytest.skip(f"model export needs the [export] extra: {e}")
    ids = chat_prompt_ids(info, "What is the capital of France?")
    want = hf_greedy_tokens_once(info, ids, 16, run_shared)
    _with_layout(monkeypatch)
    monkeypatch.setenv("MIGRAPHX_DISABLE_PASSES", "fuse_gemv")  # every dot stays in the main module
    prog = mgx_graph.compile(str(info.onnx_path), target="ref")
    dots = [i for i in prog.program.get_main_module().instructions if i.op.name == "dot"]
    stored = [d for d in dots if d.inputs[1].op.name == "transpose" and d.inputs[1].shape.strides[-2] == 1]
    assert len(stored) == len(dots) == 121  # 4 per layer and the LM head (a transposed [N, K] already)
    assert generate(Decoder(prog), ids, 16, info.config["eos_token_ids"]).tokens == want
