"""Native RNN and GRU against onnxruntime CPU on each target, eager and in a graph: every direction, bias /
initial state present or not, sequence_lens, clip, linear_before_reset, every activation with its alpha /
beta, batch-major layout (onnxruntime lacks it: its time-major result, transposed, is the oracle), float64
and float16; typed errors for bad attributes and shapes."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mgx_graph
from mgx_graph.errors import ExecutionError, ParseError, ShapeError
from native_util import run_native
from util import make_model, ort_run

R = np.random.default_rng(11)
T, B, I, H = 4, 3, 5, 6
ACTS = ["Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid", "Elu",
        "Softsign", "Softplus"]


def rnn_model(op, direction="forward", bias=True, h0=True, seq=None, layout=0, dtype=np.float32, opset=22,
              **attrs):
    """(model, feeds) of one RNN / GRU node with weights as initializers; ``seq``: sequence_lens fed at run time."""
    D = 2 if direction == "bidirectional" else 1
    G = 3 if op == "GRU" else 1
    x = R.standard_normal((T, B, I) if layout == 0 else (B, T, I)).astype(dtype)
    init = {"W": (R.standard_normal((D, G * H, I)) * 0.5).astype(dtype),
            "R": (R.standard_normal((D, G * H, H)) * 0.5).astype(dtype)}
    feeds = {"x": x}
    names = ["x", "W", "R"]
    if bias:
        init["B"] = R.standard_normal((D, 2 * G * H)).astype(dtype)
    names.append("B" if bias else "")
    if seq is not None:
        feeds["seq"] = np.array(seq, np.int32)
    names.append("seq" if seq is not None else "")
    if h0:
        feeds["h0"] = R.standard_normal((D, B, H) if layout == 0 else (B, D, H)).astype(dtype)
    names.append("h0" if h0 else "")
    while names[-1] == "":
        names.pop()
    node = helper.make_node(op, names, ["Y", "Y_h"], hidden_size=H, direction=direction, layout=layout, **attrs)
    return make_model([node], feeds, ["Y", "Y_h"], init, opset=opset), feeds


OPS = {"RNN": "rnn", "GRU": "gru"}


@pytest.mark.parametrize("variant", ["defaults", "bias_h0", "seq_lens", "clip", "seq_lens_clip"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("op", ["RNN", "GRU"])
def test_directions(target, op, direction, variant):
    kw = {"defaults": dict(bias=False, h0=False), "bias_h0": {}, "seq_lens": dict(seq=[4, 2, 3]),
          "clip": dict(clip=0.6), "seq_lens_clip": dict(seq=[1, 4, 3], clip=1.5, bias=False)}[variant]
    model, feeds = rnn_model(op, direction, **kw)
    run_native(model, feeds, target, False, [OPS[op]], tol=(1e-4, 1e-5))


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("seq", [None, [2, 4, 1]])
def test_gru_linear_before_reset(target, direction, seq):
    model, feeds = rnn_model("GRU", direction, seq=seq, linear_before_reset=1)
    run_native(model, feeds, target, False, ["gru"], tol=(1e-4, 1e-5))


@pytest.mark.parametrize("act", ACTS)
def test_rnn_activations(target, act):
    model, feeds = rnn_model("RNN", "forward", activations=[act], activation_alpha=[0.7], activation_beta=[0.3])
    run_native(model, feeds, target, False, ["rnn"], tol=(1e-4, 1e-5))


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_hidden_activations(target, act, lbr):
    model, feeds = rnn_model("GRU", "forward", activations=["Sigmoid", act], activation_alpha=[0.7],
                             activation_beta=[0.3], linear_before_reset=lbr)
    run_native(model, feeds, target, False, ["gru"], tol=(1e-4, 1e-5))


@pytest.mark.parametrize("act", ["HardSigmoid", "ScaledTanh", "Softsign", "Tanh", "Affine"])
def test_gru_gate_activations(target, act):
    model, feeds = rnn_model("GRU", "reverse", activations=[act, "Tanh"], activation_alpha=[0.4], activation_beta=[0.2])
    run_native(model, feeds, target, False, ["gru"], tol=(1e-4, 1e-5))


@pytest.mark.parametrize("op,acts,alpha,beta", [
    ("RNN", ["LeakyRelu", "HardSigmoid"], [0.1, 0.3], [0.4]),      # beta goes to HardSigmoid: consumed in order
    ("RNN", ["Tanh", "HardSigmoid"], [0.3], [0.6]),
    ("RNN", ["Elu", "LeakyRelu"], None, None),                     # onnxruntime's defaults: 1.0 and 0.01
    ("RNN", ["HardSigmoid", "Affine"], [0.25, 0.5], [0.5]),        # Affine's beta runs out: 0
    ("GRU", ["HardSigmoid", "Elu", "Sigmoid", "LeakyRelu"], [0.3, 0.9], [0.4]),
    ("GRU", ["Sigmoid", "ScaledTanh", "HardSigmoid", "Affine"], [1.5, 0.3, 0.8], [0.7, 0.4, 0.1]),
    ("GRU", ["HardSigmoid", "Tanh", "HardSigmoid", "Elu"], None, None),
], ids=["rnn_order", "rnn_skip_tanh", "rnn_defaults", "rnn_runs_out", "gru_order", "gru_full", "gru_defaults"])
def test_alpha_beta_consumed_in_order(target, op, acts, alpha, beta):
    extra = {k: v for k, v in (("activation_alpha", alpha), ("activation_beta", beta)) if v is not None}
    model, feeds = rnn_model(op, "bidirectional", activations=acts, **extra)
    run_native(model, feeds, target, False, [OPS[op]], tol=(1e-4, 1e-5))


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("op", ["RNN", "GRU"])
def test_layout_batch_major(target, op, direction, hip_graph):
    """layout 1 (X [B, T, I], Y [B, T, D, H], Y_h [B, D, H]): onnxruntime has no kernel for it, so its result
    for the time-major model on the transposed inputs, transposed back, is the oracle."""
    model, feeds = rnn_model(op, direction, seq=[3, 4, 2], layout=1)
    ref_model, _ = rnn_model(op, direction, seq=[3, 4, 2], layout=0)
    for t in ("W", "R", "B"):  # the same weights in both models
        dst = next(i for i in ref_model.graph.initializer if i.name == t)
        dst.CopyFrom(next(i for i in model.graph.initializer if i.name == t))
    tm = {"x": feeds["x"].transpose(1, 0, 2), "seq": feeds["seq"], "h0": feeds["h0"].transpose(1, 0, 2)}
    y, yh = ort_run(ref_model, tm)
    run_native(model, feeds, target, hip_graph, [OPS[op]], tol=(1e-4, 1e-5),
               expect=[y.transpose(2, 0, 1, 3), yh.transpose(1, 0, 2)])


@pytest.mark.parametrize("op", ["RNN", "GRU"])
def test_graph_mode(target, op):
    model, feeds = rnn_model(op, "bidirectional", seq=[4, 1, 3], clip=2.0)
    run_native(model, feeds, target, True, [OPS[op]], tol=(1e-4, 1e-5))


STRICT_CASES = {"seq_lens_clip": dict(seq=[4, 1, 3], clip=2.0), "clip": dict(clip=0.8),
                "defaults": dict(bias=False, h0=False)}


@pytest.mark.parametrize("op,kw", [(op, kw) for op in ("RNN", "GRU") for kw in STRICT_CASES.values()] + [
    ("GRU", dict(seq=[3, 4, 2], linear_before_reset=1)),
    ("RNN", dict(activations=["LeakyRelu", "Softsign"], activation_alpha=[0.3], clip=1.5)),
    ("GRU", dict(activations=["HardSigmoid", "ThresholdedRelu", "Sigmoid", "Elu"], activation_alpha=[0.3, 0.5, 0.2],
                 seq=[2, 4, 1]))],
    ids=[f"{op}-{k}" for op in ("RNN", "GRU") for k in STRICT_CASES] + ["GRU-seq_lens_lbr", "RNN-activations",
                                                                         "GRU-activations"])
def test_kernels_follow_cupy_rules(op, kw, monkeypatch):
    """The gpu path of both ops (the same compute, with CuPy for ``xp``) under CuPy's rules on the host
    (:mod:`cupy_rules`): no call allocates and no input overlaps its ``out`` through another view (CuPy
    would copy it: an allocation, refused while a graph captures).  Values still against onnxruntime."""
    from cupy_rules import strict_kernels

    found, ran = strict_kernels(monkeypatch, {OPS[op]})
    model, feeds = rnn_model(op, "bidirectional", **kw)
    run_native(model, feeds, "ref", False, [OPS[op]], tol=(1e-4, 1e-5))
    assert ran == [OPS[op]] and found == []


@pytest.mark.parametrize("op", ["RNN", "GRU"])
def test_float64_against_numpy(target, op):
    """float64 (onnxruntime's RNN is float32 only): a numpy loop over the ONNX equations is the oracle."""
    model, feeds = rnn_model(op, "reverse", dtype=np.float64)
    init = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    W, Rw, b = init["W"][0], init["R"][0], init["B"][0]
    h = feeds["h0"][0]
    ys = [None] * T
    for t in reversed(range(T)):
        xt = feeds["x"][t]
        if op == "RNN":
            h = np.tanh(xt @ W.T + h @ Rw.T + b[:H] + b[H:])
        else:
            g = xt @ W.T + b[:3 * H]
            rr = h @ Rw[:2 * H].T + b[3 * H:5 * H]
            z = 1 / (1 + np.exp(-(g[:, :H] + rr[:, :H])))
            r = 1 / (1 + np.exp(-(g[:, H:2 * H] + rr[:, H:])))
            hh = np.tanh(g[:, 2 * H:] + (r * h) @ Rw[2 * H:].T + b[5 * H:])
            h = (1 - z) * hh + z * h
        ys[t] = h
    want = [np.stack(ys)[:, None], h[None]]
    run_native(model, feeds, target, False, [OPS[op]], tol=(1e-10, 1e-12), expect=want)


@pytest.mark.parametrize("op", ["RNN", "GRU"])
def test_float16_close_to_float32(target, op):
    model16, feeds16 = rnn_model(op, "bidirectional", dtype=np.float16)
    model32, _ = rnn_model(op, "bidirectional")
    for i32, i16 in zip(model32.graph.initializer, model16.graph.initializer):
        i32.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(i16).astype(np.float32), i16.name))
    want = ort_run(model32, {k: v.astype(np.float32) for k, v in feeds16.items()})
    run_native(model16, feeds16, target, False, [OPS[op]], tol=(2e-2, 2e-2),
               expect=[w.astype(np.float16) for w in want])


def test_sequence_lens_out_of_range_at_run_time():
    """A length past seq_length raises ExecutionError on the host (as onnxruntime does); the program stays
    usable for the next run."""
    model, feeds = rnn_model("GRU", "forward", seq=[4, 5, 1])
    prog = mgx_graph.compile(model, target="ref")
    with pytest.raises(ExecutionError, match=r"sequence_lens value 5 is outside \[0, 4\]"):
        prog.run(feeds)
    good = dict(feeds, seq=np.array([4, 3, 1], np.int32))
    np.testing.assert_allclose(prog.run(good)[1], ort_run(model, good)[1], rtol=1e-4, atol=1e-5)


def _bad(op="RNN", **kw):
    model, _ = rnn_model(op, kw.pop("direction", "forward"), **kw)
    return model


@pytest.mark.parametrize("model,err,match", [
    (lambda: _bad(activations=["Relu", "Tanh", "Tanh"]), ParseError, r"'activations' = .* 3 entries, expected 1"),
    (lambda: _bad("GRU", activations=["Sigmoid"]), ParseError, r"1 entries, expected 2"),
    (lambda: _bad(activations=["Gelu"]), ParseError, r"activation 'Gelu' is not one of"),
    (lambda: _bad("GRU", clip=-1.0), ParseError, r"'clip' = -1.0 must be positive"),
], ids=["act_count", "gru_act_count", "act_name", "clip"])
def test_bad_attributes(model, err, match):
    with pytest.raises(err, match=match):
        mgx_graph.compile(model(), target="ref")


def test_bad_direction_and_layout():
    model, _ = rnn_model("RNN", "forward")
    next(a for a in model.graph.node[0].attribute if a.name == "direction").s = b"sideways"
    with pytest.raises(ParseError, match=r"'direction' = 'sideways' is not one of"):
        mgx_graph.compile(model, target="ref")
    model, _ = rnn_model("GRU", "forward")
    next(a for a in model.graph.node[0].attribute if a.name == "layout").i = 2
    with pytest.raises(ParseError, match=r"'layout' = 2 is not 0"):
        mgx_graph.compile(model, target="ref")


def test_bad_shapes():
    model, feeds = rnn_model("GRU", "bidirectional")
    w = next(i for i in model.graph.initializer if i.name == "W")
    w.dims[1] = 2 * H  # W of an RNN-sized gate count
    w.raw_data = w.raw_data[:2 * int(np.prod(w.dims)) * 2]
    with pytest.raises(ParseError, match=r"W \[2, 12, 5\] must be \[2, 18, 5\]"):
        mgx_graph.compile(model, target="ref")
    x = np.zeros((T, B, I), np.int32)
    node = helper.make_node("RNN", ["x", "W", "R"], ["Y"], hidden_size=H)
    bad = make_model([node], {"x": x}, ["Y"], {"W": np.zeros((1, H, I), np.int32), "R": np.zeros((1, H, H), np.int32)},
                     output_types={"Y": TensorProto.INT32})
    with pytest.raises(ParseError, match=r"parameter 'X'\) has type tensor\(int32\): expected one of "
                                         r"tensor\(double\), tensor\(float\), tensor\(float16\)"):
        mgx_graph.compile(bad, target="ref")


def test_hidden_size_mismatch():
    model, _ = rnn_model("RNN", "forward")
    next(a for a in model.graph.node[0].attribute if a.name == "hidden_size").i = H + 1
    with pytest.raises(ParseError, match=r"R \[1, 6, 6\] must be \[1, 7, 7\].*'hidden_size' = 7"):
        mgx_graph.compile(model, target="ref")


def test_literal_sequence_lens_checked_at_parse_time():
    model, feeds = rnn_model("RNN", "forward")
    node = model.graph.node[0]
    node.input[:] = ["x", "W", "R", "", "L"]
    model.graph.initializer.append(helper.make_tensor("L", TensorProto.INT32, [B], [1, 9, 2]))
    with pytest.raises(ParseError, match=r"sequence_lens \[1, 9, 2\] has values outside \[0, 4\]"):
        mgx_graph.compile(model, target="ref")
