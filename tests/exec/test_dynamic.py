"""Run-time shapes: symbolic input dims (a GPT-2 decode step with a growing KV cache) and shapes that
depend on data, each served by a guarded specialization."""
import re

import numpy as np
import pytest
from onnx import helper

import mgx_graph
from util import make_model, ort_run

R = np.random.default_rng(5)


@pytest.fixture(scope="module")
def gpt2_dynamic(model_cache):
    from mgx_graph.models import build

    try:
        return build("gpt2", kind="dynamic", n_layer=2, n_embd=64, n_head=4, vocab_size=256, max_cache_len=32,
                     cache_dir=model_cache, progress=False)
    except ImportError as e:
        pytest.skip(f"model export needs the [export] extra: {e}")


def _decode_steps(info, prog, steps=6):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(info.onnx_path), providers=["CPUExecutionProvider"])
    onames = [o.name for o in sess.get_outputs()]
    past = {i.name: np.zeros((1, 4, 0, 16), np.float32) for i in sess.get_inputs() if i.name.startswith("past")}
    ids = np.array([[3, 1, 4]], np.int64)
    for step in range(steps):
        p = next(iter(past.values())).shape[2]
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, p + ids.shape[1]), np.int64), **past}
        want = sess.run(None, feeds)
        got = prog.run(feeds)
        for g, e in zip(got, want):
            assert g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)
        past = {n.replace("present", "past_key_values"): v for n, v in zip(onames[1:], want[1:])}
        ids = np.array([[int(want[0][0, -1].argmax())]], np.int64)


def test_growing_kv_cache_one_capture_per_shape(gpt2_dynamic, target, capfd):
    prog = mgx_graph.compile(str(gpt2_dynamic.onnx_path), target=target, hip_graph=True, warmup=0, debug=True)
    _decode_steps(gpt2_dynamic, prog, 6)
    err = capfd.readouterr().err
    shapes = re.findall(r"SPECIALIZE .*past_key_values.0.key\[1, 4, (\d+), 16\]", err)
    assert shapes == ["0", "3", "4", "5", "6", "7"]  # one specialization per past length
    st = prog.stats()
    assert st["captures"] == 6 and st["fallbacks"] == 0  # warmup=0: one capture per new shape


def test_growing_kv_cache_eager_beyond_the_cap(gpt2_dynamic, capfd):
    prog = mgx_graph.compile(str(gpt2_dynamic.onnx_path), target="ref", hip_graph=True, debug=True,
                             max_specializations=2)
    _decode_steps(gpt2_dynamic, prog, 5)
    err = capfd.readouterr().err
    st = prog.stats()
    # compile() made one specialization for the default dims, decoding made 5 more: 4 evicted
    assert st["specializations"] == 2 and st["specialization_evictions"] == 4 == err.count("EVICT")
    assert st["captures"] == 0 and st["warmups"] == 5  # every shape was new: warmed up, never captured


def test_shape_from_data_is_guarded(target, capfd):
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
    model = make_model(nodes, {"x": np.zeros(6, np.float32), "shape": np.array([2, 3], np.int64)}, ["y"])
    prog = mgx_graph.compile(model, target=target, debug=True)
    x = np.arange(6, dtype=np.float32)
    for shp in ([2, 3], [3, 2], [2, 3], [6, 1]):
        feeds = {"x": x, "shape": np.array(shp, np.int64)}
        np.testing.assert_array_equal(prog.run(feeds)[0], ort_run(model, feeds)[0])
    err = capfd.readouterr().err
    assert err.count("PREFIX") == 1 and err.count("RESPECIALIZE") == 3
    assert prog.stats()["specialization_compiles"] == 3  # [2,3] was reused


def test_nonzero_count_specialization(target):
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Cast", ["nz"], ["y"], to=1)]
    model = make_model(nodes, {"x": np.zeros((3, 4), np.float32)}, ["y"])
    prog = mgx_graph.compile(model, target=target)
    for t in (0.5, -0.5, 0.5, 3.0):
        x = (R.normal(size=(3, 4)) > t).astype(np.float32)
        np.testing.assert_array_equal(prog.run({"x": x})[0], ort_run(model, {"x": x})[0])


def test_dynamic_program_rejects_a_fixed_dim_mismatch(gpt2_dynamic):
    prog = mgx_graph.compile(str(gpt2_dynamic.onnx_path), target="ref")
    bad = {"input_ids": np.zeros((1, 1), np.int64), "attention_mask": np.ones((1, 1), np.int64)}
    for i in range(2):
        for kv in ("key", "value"):
            bad[f"past_key_values.{i}.{kv}"] = np.zeros((1, 5, 0, 16), np.float32)  # 5 heads, the model has 4
    with pytest.raises(mgx_graph.ParameterError, match="past_key_values.0.key': dim 1 is fixed to 4"):
        prog.run(bad)
