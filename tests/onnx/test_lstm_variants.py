"""LSTM attributes and inputs beside the default form of tests/operators/test_native_lstm.py: what runs (peepholes
and layout 1 on the host, a constant sequence_lens of T everywhere, the default activations written out
for both directions) against onnxruntime CPU, and what nothing here computes (activations other than the
defaults in either direction, clip, input_forget, a constant sequence_lens other than T) as an
UnsupportedOpError naming the node and the attribute, and a fed sequence_lens other than T as an
ExecutionError of that run, where the host fallback (onnx.reference, whose LSTM ignores them) gave
other values than onnxruntime."""
import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph.errors import ExecutionError, ParseError, UnsupportedOpError
from native_util import check_outputs
from util import make_model, ort_run

T, B, I, H = 5, 3, 4, 6


def _model(direction="bidirectional", *, seq=None, peepholes=False, layout=0, attrs=None, seed=0):
    """(model, feeds) of one LSTM node named ``lstm0`` with W, R, B (and P) initializers, X, initial_h,
    initial_c fed; ``seq``: sequence_lens, ``"input"`` for an int32 [B] input of T - b for row b, or
    an array for an initializer."""
    rng = np.random.default_rng(seed)
    D = 2 if direction == "bidirectional" else 1
    init = {"W": (rng.standard_normal((D, 4 * H, I)) * 0.5).astype(np.float32),
            "R": (rng.standard_normal((D, 4 * H, H)) * 0.5).astype(np.float32),
            "B": (rng.standard_normal((D, 8 * H)) * 0.5).astype(np.float32)}
    xs, hs = ((B, T, I), (B, D, H)) if layout else ((T, B, I), (D, B, H))
    feeds = {"x": rng.standard_normal(xs).astype(np.float32), "h0": rng.standard_normal(hs).astype(np.float32),
             "c0": rng.standard_normal(hs).astype(np.float32)}
    names = ["x", "W", "R", "B", "", "h0", "c0"]
    if isinstance(seq, str):
        feeds["sl"] = (T - np.arange(B)).astype(np.int32)
        names[4] = "sl"
    elif seq is not None:
        init["sl"], names[4] = np.asarray(seq, np.int32), "sl"
    if peepholes:
        init["P"] = (rng.standard_normal((D, 3 * H)) * 0.5).astype(np.float32)
        names.append("P")
    kw = dict(attrs or {}, **({"layout": 1} if layout else {}))
    node = helper.make_node("LSTM", names, ["Y", "Y_h", "Y_c"], name="lstm0", hidden_size=H, direction=direction,
                            **kw)
    return make_model([node], feeds, ["Y", "Y_h", "Y_c"], init, opset=14), feeds


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_peepholes_match_onnxruntime(target, direction):
    model, feeds = _model(direction, peepholes=True)
    got = mgx_graph.compile(model, target=target).run(feeds)
    check_outputs(got, ort_run(model, feeds), tol=(1e-5, 1e-5))


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_layout_1_matches_onnxruntime_on_the_transposed_model(target, direction):
    """onnxruntime takes layout 0 only: its outputs for the batch-major values transposed, transposed back."""
    model, feeds = _model(direction, layout=1, seed=1)
    plain, _ = _model(direction, seed=1)
    want = ort_run(plain, {k: np.ascontiguousarray(v.transpose(1, 0, 2)) for k, v in feeds.items()})
    want = [want[0].transpose(2, 0, 1, 3), want[1].transpose(1, 0, 2), want[2].transpose(1, 0, 2)]
    got = mgx_graph.compile(model, target=target).run(feeds)
    check_outputs(got, want, tol=(1e-5, 1e-5))


def test_constant_full_sequence_lens_and_written_out_defaults_run_natively(target):
    model, feeds = _model(seq=[T] * B, attrs={"activations": ["Sigmoid", "Tanh", "Tanh"] * 2}, seed=2)
    prog = mgx_graph.compile(model, target=target)
    assert "lstm" in prog.print() and "onnx_op" not in prog.print()
    check_outputs(prog.run(feeds), ort_run(model, feeds), tol=(1e-5, 1e-5))


@pytest.mark.parametrize("case, attrs, seq, match", [
    ("reverse activations", {"activations": ["Sigmoid", "Tanh", "Tanh", "Sigmoid", "Relu", "Relu"]}, None,
     "activations"),
    ("forward activations", {"activations": ["HardSigmoid", "Tanh", "Tanh", "Sigmoid", "Tanh", "Tanh"]}, None,
     "activations"),
    ("clip", {"clip": 0.5}, None, "clip=0.5"),
    ("input_forget", {"input_forget": 1}, None, "input_forget=1"),
    ("sequence_lens constant", {}, [T, 2, 1], "sequence_lens")])
def test_what_nothing_computes_is_an_unsupported_op_error(case, attrs, seq, match):
    model, feeds = _model(attrs=attrs, seq=seq, seed=3)
    want = ort_run(model, feeds)  # onnxruntime takes each of them
    plain = ort_run(_model(seed=3)[0], {k: v for k, v in feeds.items() if k != "sl"})
    assert max(float(np.max(np.abs(w - p))) for w, p in zip(want, plain)) > 1e-3, case  # it changes the values
    with pytest.raises(UnsupportedOpError, match=f"lstm0.*{match}"):
        mgx_graph.compile(model, target="ref")


def test_fed_sequence_lens_runs_when_full_and_raises_otherwise(target):
    """A sequence_lens input (on the host): T in every row gives onnxruntime's values; shorter rows are an
    ExecutionError naming the node and the values, and the program then runs again."""
    model, feeds = _model(seq="input", seed=4)
    prog = mgx_graph.compile(model, target=target)
    full = dict(feeds, sl=np.full(B, T, np.int32))
    check_outputs(prog.run(full), ort_run(model, full), tol=(1e-5, 1e-5))
    want = ort_run(model, feeds)
    assert max(float(np.max(np.abs(w - f))) for w, f in zip(want, ort_run(model, full))) > 1e-3
    with pytest.raises(ExecutionError, match=r"lstm0.*sequence_lens \[5, 4, 3\], expected 5"):
        prog.run(feeds)
    check_outputs(prog.run(full), ort_run(model, full), tol=(1e-5, 1e-5))


@pytest.mark.parametrize("name, index, lens", [("R", 2, (1, 4 * H, H + 1)), ("B", 3, (1, 8 * H - 2)),
                                               ("initial_h", 5, (1, B, H + 1)), ("initial_c", 6, (1, B + 1, H))])
def test_input_of_other_lens_is_a_parse_error_at_compile(name, index, lens):
    """An input of other lens than X, W and hidden_size give (onnx's checker does not look): a ParseError
    naming it with the expected lens, where the gpu kernel would read past the bias or the cell state."""
    model, feeds = _model("forward", seed=5)
    tensor = model.graph.node[0].input[index]
    for init in model.graph.initializer:
        if init.name == tensor:
            init.CopyFrom(helper.make_tensor(tensor, init.data_type, lens, np.zeros(lens, np.float32).reshape(-1)))
    for inp in model.graph.input:
        if inp.name == tensor:
            inp.CopyFrom(helper.make_tensor_value_info(tensor, inp.type.tensor_type.elem_type, list(lens)))
    with pytest.raises(ParseError, match=rf"lstm0.*{name} \[{', '.join(map(str, lens))}\] must be"):
        mgx_graph.compile(model, target="ref")
