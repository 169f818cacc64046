"""Real ONNX models from PyPI packages (OCR, YOLO, file-type detection, captcha OCR, voice activity)
against onnxruntime CPU, on every target, eager and with graphs, within each model's stated tolerance."""
import numpy as np
import pytest

import mgx_graph
from mgx_graph.models.oracle import ort_cpu_options
from mgx_graph.models.pypi import REAL_MODELS, errors, model_path, random_feeds

pytestmark = pytest.mark.slow


def compare(got, want, m):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=m.rtol, atol=m.atol)
        if m.argmax_axis is not None:
            np.testing.assert_array_equal(g.argmax(m.argmax_axis), w.argmax(m.argmax_axis))
    return errors(got, want)


def onnxruntime_case(name, model_cache):
    """``(model entry, .onnx path, seeded random feeds, onnxruntime CPU's outputs)`` of real model ``name``;
    the test skipped when the model cannot be fetched."""
    import onnxruntime as ort

    m = REAL_MODELS[name]
    try:
        path = model_path(name, model_cache)
    except RuntimeError as e:
        pytest.skip(str(e))
    sess = ort.InferenceSession(path, ort_cpu_options(), providers=["CPUExecutionProvider"])
    feeds = random_feeds(sess, m.input_dims, m.int_high)
    return m, path, feeds, sess.run(None, feeds)


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_real_model_matches_onnxruntime(name, target, hip_graph, model_cache):
    m, path, feeds, want = onnxruntime_case(name, model_cache)
    prog = mgx_graph.compile(path, target=target, hip_graph=hip_graph,
                             input_dims={k: list(v.shape) for k, v in feeds.items()})
    for _ in range(4 if hip_graph else 1):
        compare(prog.run(feeds), want, m)
    st = prog.stats()
    assert st["fallbacks"] == 0
    if hip_graph:
        assert st["captures"] >= 1 and st["replays"] >= 1
