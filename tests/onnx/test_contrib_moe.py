"""com.microsoft::MoE (mixture of experts) against onnxruntime CPU: the top-k routing, SwiGLU (interleaved, with
onnxruntime-genai's GPT-OSS limit / alpha / beta) and the other activations, with and without biases, for
few rows (the gathered-experts composition) and many (every expert over every row), 2-D and 3-D inputs;
then the variants refused by name and the shapes checked."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h

import mgx_graph
from util import ort_run

E, HID, INNER = 4, 8, 6
GPT_OSS = dict(swiglu_fusion=1, swiglu_limit=7.0, activation_alpha=1.702, activation_beta=1.0)


def moe_model(x_lens, k=2, act="swiglu", biases=True, seed=0, **attrs):
    """A one-node MoE model with random experts; returns (model, feeds)."""
    rng = np.random.default_rng(seed)
    n1 = 2 * INNER if act == "swiglu" else INNER
    rows = int(np.prod(x_lens[:-1]))
    inits = {"W1": rng.normal(size=(E, n1, HID)), "W2": rng.normal(size=(E, HID, INNER)) / 2}
    if biases:
        inits.update(b1=rng.normal(size=(E, n1)), b2=rng.normal(size=(E, HID)))
    names = ["x", "r", "W1", "b1" if biases else "", "W2", "b2" if biases else ""]
    node = h.make_node("MoE", names, ["y"], domain="com.microsoft", k=k, activation_type=act, **attrs)
    g = h.make_graph([node], "moe", [h.make_tensor_value_info("x", TP.FLOAT, list(x_lens)),
                                     h.make_tensor_value_info("r", TP.FLOAT, [rows, E])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)],
                     [onnx.numpy_helper.from_array(v.astype(np.float32), n) for n, v in inits.items()])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 18), h.make_opsetid("com.microsoft", 1)], ir_version=10)
    feeds = {"x": rng.normal(size=x_lens).astype(np.float32), "r": rng.normal(size=(rows, E)).astype(np.float32)}
    return model, feeds


def _check(model, feeds):
    want = ort_run(model, feeds)[0]
    got = mgx_graph.compile(model, target="ref").run(feeds)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 3, 16], ids=lambda r: f"rows{r}")  # rows * k <= E: gathered experts
@pytest.mark.parametrize("normalize", [1, 0])
def test_gpt_oss_swiglu_matches_onnxruntime(rows, normalize):
    _check(*moe_model([rows, HID], normalize_routing_weights=normalize, **GPT_OSS))


@pytest.mark.parametrize("act", ["silu", "gelu", "relu", "identity"])
@pytest.mark.parametrize("rows", [1, 5])
def test_other_activations_match_onnxruntime(act, rows):
    _check(*moe_model([rows, HID], act=act, normalize_routing_weights=1, seed=3))


@pytest.mark.parametrize("k", [1, 3, 4])
def test_k_and_no_biases_and_a_3d_input(k):
    _check(*moe_model([2, 3, HID], k=k, biases=False, normalize_routing_weights=1, seed=k, **GPT_OSS))


def test_swiglu_without_a_limit_matches_onnxruntime():
    _check(*moe_model([3, HID], swiglu_fusion=1, activation_alpha=1.0, activation_beta=0.0, seed=5))


@pytest.mark.parametrize("logits", [[1, 1, 0, 0], [0, 1, 1, 1], [0, 0, 0, 0]])
@pytest.mark.parametrize("k", [1, 2])
def test_tied_router_logits_pick_the_experts_onnxruntime_picks(logits, k):
    """Among equal logits onnxruntime takes the higher expert id: so does mgx_graph (few rows and many)."""
    for rows in (1, 3):
        model, feeds = moe_model([rows, HID], k=k, normalize_routing_weights=1, seed=11, **GPT_OSS)
        feeds["r"] = np.tile(np.asarray(logits, np.float32), (rows, 1))
        _check(model, feeds)


def test_separate_gate_weights_are_refused_by_name():
    model, _ = moe_model([1, HID], swiglu_fusion=0)
    with pytest.raises(mgx_graph.UnsupportedOpError, match="fc3_experts_weights, swiglu_fusion=0"):
        mgx_graph.compile(model, target="ref")


@pytest.mark.parametrize("change, says", [
    (lambda m: m.graph.node[0].attribute.extend([h.make_attribute("use_sparse_mixer", 1)]), "use_sparse_mixer=1"),
    (lambda m: _set_attr(m, "activation_type", b"tanh"), "activation_type='tanh'"),
    (lambda m: _set_attr(m, "swiglu_fusion", 3), "swiglu_fusion=3 \\(1: interleaved"),
])
def test_unsupported_variants_name_the_attribute(change, says):
    model, _ = moe_model([1, HID], **GPT_OSS)
    change(model)
    with pytest.raises(mgx_graph.UnsupportedOpError, match=says):
        mgx_graph.compile(model, target="ref")


def _set_attr(model, name, value):
    for a in model.graph.node[0].attribute:
        if a.name == name:
            a.CopyFrom(h.make_attribute(name, value))


@pytest.mark.parametrize("k", [0, 5])
def test_k_out_of_range_is_a_parse_error(k):
    model, _ = moe_model([1, HID], k=k, **GPT_OSS)
    with pytest.raises(mgx_graph.ParseError, match=rf"attribute k={k} must be in 1..{E}"):
        mgx_graph.compile(model, target="ref")


def test_weights_in_another_layout_are_a_parse_error_naming_the_input():
    """fc1 stored [E, hidden, fc1] (an older layout): refused with the expected layout, never a wrong value."""
    model, _ = moe_model([1, HID], **GPT_OSS)
    w1 = next(t for t in model.graph.initializer if t.name == "W1")
    w1.CopyFrom(onnx.numpy_helper.from_array(np.zeros((E, HID, 2 * INNER), np.float32), "W1"))
    with pytest.raises(mgx_graph.ParseError, match=r"fc1_experts_weights .* must be \[experts, fc1 size, 8\]"):
        mgx_graph.compile(model, target="ref")
