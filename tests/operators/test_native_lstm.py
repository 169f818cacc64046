"""The ONNX LSTM against onnxruntime CPU on each target, eager and in a graph: every direction, batch 1
and 3, bias and initial states present or omitted, float32 and float16 (onnxruntime's LSTM is float32
only: it runs on the float16 values widened); the gpu kernel (``lstm.cu`` with its GEMMs,
operators/lstm_gpu.py) run on the host with ``lstm.cu`` built as C++ (tests/cu_host.py) under CuPy's
rules (tests/cupy_rules.py); and the gpu program's kernel for the op, lowered without a device."""
import os
import types

import numpy as np
import pytest
from onnx import helper, numpy_helper

import mgx_graph
from native_util import check_outputs, kernels, run_native
from util import make_model, ort_run

T, I, H = 5, 4, 6
DIRECTIONS = ["forward", "reverse", "bidirectional"]
VARIANTS = {"bias_states": dict(bias=True, h0=True, c0=True), "defaults": dict(bias=False, h0=False, c0=False),
            "bias_only": dict(bias=True, h0=False, c0=False), "h0_only": dict(bias=False, h0=True, c0=False),
            "c0_only": dict(bias=True, h0=False, c0=True)}


def lstm_model(direction="forward", B=3, bias=True, h0=True, c0=True, dtype=np.float32, seed=0, seq=T):
    """(model, feeds) of one LSTM node: W, R, B initializers; X, initial_h, initial_c fed at run time."""
    rng = np.random.default_rng(seed)
    D = 2 if direction == "bidirectional" else 1
    init = {"W": (rng.standard_normal((D, 4 * H, I)) * 0.5).astype(dtype),
            "R": (rng.standard_normal((D, 4 * H, H)) * 0.5).astype(dtype)}
    feeds = {"x": rng.standard_normal((seq, B, I)).astype(dtype)}
    names = ["x", "W", "R", "B" if bias else "", ""]
    if bias:
        init["B"] = (rng.standard_normal((D, 8 * H)) * 0.5).astype(dtype)
    for name, on in (("h0", h0), ("c0", c0)):
        if on:
            feeds[name] = rng.standard_normal((D, B, H)).astype(dtype)
        names.append(name if on else "")
    while names[-1] == "":
        names.pop()
    node = helper.make_node("LSTM", names, ["Y", "Y_h", "Y_c"], hidden_size=H, direction=direction)
    return make_model([node], feeds, ["Y", "Y_h", "Y_c"], init, opset=14), feeds


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_lstm_matches_onnxruntime(target, direction, B, variant):
    model, feeds = lstm_model(direction, B, **VARIANTS[variant])
    prog = run_native(model, feeds, target, False, ["lstm"], tol=(1e-5, 1e-5))
    if target == "gpu":
        (k,) = [k for name, k in kernels(prog) if name == "lstm"]
        D = 2 if direction == "bidirectional" else 1
        assert k.label.startswith("lstm.cu") and k.capturable and k.launches == D * (1 + 2 * T)


@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_lstm_in_a_graph_matches_onnxruntime(target, direction, B):
    """Warmups, capture and replays (4 runs) give onnxruntime's values each time."""
    model, feeds = lstm_model(direction, B, seed=1)
    run_native(model, feeds, target, True, ["lstm"], tol=(1e-5, 1e-5))


@pytest.mark.parametrize("variant", ["bias_states", "defaults"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_lstm_float16_matches_onnxruntime_on_widened_values(target, direction, variant):
    """float16 X / weights / states against onnxruntime float32 on the same values: float16 rounding
    of the gates, cell and hidden state (values below 1, a few float16 spacings apart)."""
    model16, feeds16 = lstm_model(direction, 3, dtype=np.float16, seed=2, **VARIANTS[variant])
    model32, _ = lstm_model(direction, 3, seed=2, **VARIANTS[variant])
    for i32, i16 in zip(model32.graph.initializer, model16.graph.initializer):
        i32.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(i16).astype(np.float32), i16.name))
    want = ort_run(model32, {k: v.astype(np.float32) for k, v in feeds16.items()})
    prog = mgx_graph.compile(model16, target=target, min_partition_size=1)
    got = prog.run(feeds16)
    assert [g.dtype for g in got] == [np.float16] * 3
    check_outputs([g.astype(np.float32) for g in got], want, tol=(0, 1.5e-2))


def test_lstm_empty_sequence_returns_initial_states(target):
    model, feeds = lstm_model("bidirectional", 2, seq=0, seed=3)
    got = mgx_graph.compile(model, target=target).run(feeds)
    assert got[0].shape == (0, 2, 2, H)
    np.testing.assert_array_equal(got[1], feeds["h0"])
    np.testing.assert_array_equal(got[2], feeds["c0"])


# -- the gpu kernel on the host: lstm.cu built as C++, numpy for the array library under CuPy's rules ------

@pytest.fixture
def host_lstm_cu(monkeypatch):
    """``lstm_gpu.lstm_step_function`` as ``lstm.cu`` built for the host (float32 and float64)."""
    import cu_host
    from mgx_graph.operators import lstm_gpu

    if not cu_host.available():
        pytest.skip("needs g++")
    cu = os.path.join(os.path.dirname(lstm_gpu.__file__), "lstm.cu")
    libs = {"float32": cu_host.build(cu, T="float", ACC="float"), "float64": cu_host.build(cu, T="double", ACC="double")}

    def function(dtype):
        return lambda grid, block, args: cu_host.launch(libs[dtype], "mgx_lstm_step", *args)

    monkeypatch.setattr(lstm_gpu, "lstm_step_function", function)


def run_gpu_kernel_on_host(direction, args, strided=()):
    """The gpu kernel of an ``lstm`` over numpy ``args`` (X, W, R[, B, initial_h, initial_c]) with
    :func:`cupy_rules.strict_xp` and a GEMM that checks its operands are BLAS layouts; the positions in
    ``strided`` are given as non-standard views of the same values.  Returns (outputs, launches, what
    CuPy would not do)."""
    from cupy_rules import strict_xp

    from mgx_graph.operators import make_op
    from mgx_graph.operators.gpu import _dot_kernel
    from mgx_graph.operators.gpu_lowering import table_kernel
    from mgx_graph.ir.shape import Shape

    def shape(a):
        return Shape(a.dtype.name, a.shape, [s // a.itemsize for s in a.strides])

    args = [np.asfortranarray(a) if k in strided else a for k, a in enumerate(args)]
    found = []

    def matmul(a, b, out):
        k = _dot_kernel(None, [shape(a), shape(b)], Shape(out.dtype.name, out.shape))
        if k is None or k.workspace:
            found.append(f"matmul {a.shape}/{a.strides} x {b.shape}/{b.strides} needs a copy")
        np.matmul(a, b, out=out)

    op = make_op("lstm", hidden_size=H, direction=direction)
    shapes = [shape(a) for a in args]
    out_shapes = op.compute_shape(shapes)
    k = table_kernel(op, shapes, out_shapes)
    assert k.capturable and k.label.startswith("lstm.cu")
    out = tuple(np.full(s.lens, np.nan, s.np_dtype) for s in out_shapes)
    ws = [np.full(s.lens, 7, s.np_dtype) for s in k.workspace]  # garbage: the kernel must write before reading
    k.fn(types.SimpleNamespace(xp=strict_xp(found), matmul=matmul), out, args, ws)
    return out, k.launches, found


def _args(model, feeds, B):
    """X, W, R, B, initial_h, initial_c as the parser gives them (zeros for omitted ones)."""
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    D, dt = init["W"].shape[0], feeds["x"].dtype
    return [feeds["x"], init["W"], init["R"], init.get("B", np.zeros((D, 8 * H), dt)),
            feeds.get("h0", np.zeros((D, B, H), dt)), feeds.get("c0", np.zeros((D, B, H), dt))]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_gpu_kernel_on_host_matches_onnxruntime(host_lstm_cu, direction, B, variant):
    model, feeds = lstm_model(direction, B, **VARIANTS[variant])
    got, launches, found = run_gpu_kernel_on_host(direction, _args(model, feeds, B))
    assert found == []
    assert launches == (2 if direction == "bidirectional" else 1) * (1 + 2 * T)
    check_outputs(list(got), ort_run(model, feeds), tol=(1e-5, 1e-5))


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_gpu_kernel_on_host_without_optional_inputs(host_lstm_cu, direction):
    """An ``lstm`` of 3 inputs (no bias, no initial states) or 5 (no initial_c): zero states, no bias
    terms; one fill of the cell state per direction replaces initial_c's copy."""
    model, feeds = lstm_model(direction, 2, bias=False, h0=False, c0=False, seed=4)
    args = _args(model, feeds, 2)
    want = ort_run(model, feeds)
    D = 2 if direction == "bidirectional" else 1
    for n in (3, 5):
        got, launches, found = run_gpu_kernel_on_host(direction, args[:n])
        assert found == [] and launches == D * (2 + 2 * T)
        check_outputs(list(got), want, tol=(1e-5, 1e-5))


def test_gpu_kernel_on_host_float64_against_numpy(host_lstm_cu):
    """float64 (onnxruntime's LSTM is float32 only): a numpy loop over the ONNX equations is the oracle."""
    model, feeds = lstm_model("reverse", 3, dtype=np.float64, seed=5)
    x, W, R, b, h0, c0 = _args(model, feeds, 3)
    h, c, ys = h0[0], c0[0], [None] * T
    for t in reversed(range(T)):
        g = x[t] @ W[0].T + h @ R[0].T + b[0, :4 * H] + b[0, 4 * H:]
        i, o, f = (1 / (1 + np.exp(-g[:, k * H:(k + 1) * H])) for k in range(3))
        c = f * c + i * np.tanh(g[:, 3 * H:])
        h = ys[t] = o * np.tanh(c)
    got, _, found = run_gpu_kernel_on_host("reverse", [x, W, R, b, h0, c0])
    assert found == []
    check_outputs(list(got), [np.stack(ys)[:, None], h[None], c[None]], tol=(1e-12, 1e-13))


def test_gpu_kernel_on_host_copies_non_standard_inputs(host_lstm_cu):
    """X, R and initial_c given as column-major views: each is copied into a workspace first (one launch
    each), the values are unchanged."""
    model, feeds = lstm_model("bidirectional", 3, seed=6)
    got, launches, found = run_gpu_kernel_on_host("bidirectional", _args(model, feeds, 3), strided=(0, 2, 5))
    assert found == [] and launches == 3 + 2 * (1 + 2 * T)
    check_outputs(list(got), ort_run(model, feeds), tol=(1e-5, 1e-5))


def test_gpu_program_lowers_lstm_to_its_kernel():
    """Compiled for gpu without a device (lowering only plans; lstm.cu compiles on first launch): the
    ``lstm`` instruction gets ``lstm.cu``, capturable, 2 launches a step and direction plus one GEMM a
    direction, where the array-library kernel issued 16 a step."""
    from mgx_graph.passes import PassContext, PassManager, PipelineOptions
    from mgx_graph.targets import pipeline

    model, _ = lstm_model("bidirectional", 3)
    prog = mgx_graph.parse_onnx(model)
    PassManager(pipeline("gpu", PipelineOptions()), PassContext("gpu")).run(prog)
    (ins,) = [i for i in prog.get_main_module().instructions if i.op.name == "lstm"]
    k = ins.meta["kernel"]
    assert k.label == f"lstm.cu ({2 * (1 + 2 * T)} launches)" and k.capturable
    assert k.launches == 2 * (1 + 2 * T) < ins.op.launches([i.shape for i in ins.inputs], ins.shape)
    assert [list(s.lens) for s in k.workspace] == [[T * 3, 4 * H], [3, 4 * H], [3, H]]
