"""Outputs of run_async and the memory they share (or must not share) with inputs and literals.

The rule: every ``run_async`` output is a contiguous buffer owned by the program, valid until the
next run; the only exception is an output bound with ``alias=``, which is the caller's parameter
buffer.  Inputs that overlap the program's own memory (an output fed back, a view into one, another
parameter's buffer) are staged at bind time and give the values onnxruntime gives.  Every case runs
with graphs off and on (``min_partition_size=1`` so the small graphs become graph_launch regions and
the later calls replay)."""
import numpy as np
import pytest
from onnx import helper

import mgx_graph
from util import make_model, ort_run

GRAPH = pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
X6 = np.array([0.3, -1.2, 2.5, 0.0, -0.7, 1.9], np.float32)


def _compile(model, target, hip_graph, **kw):
    return mgx_graph.compile(model, target=target, hip_graph=hip_graph, min_partition_size=1, **kw)


def _host(prog, a):
    return prog.context.to_host(a, prog.queue)


def _span(prog, a):
    p = prog.context.data_ptr(a)
    return p, p + a.nbytes


def _shares(prog, a, b) -> bool:
    (a0, a1), (b0, b1) = _span(prog, a), _span(prog, b)
    return a0 < b1 and b0 < a1


def _assert_replayed(prog, hip_graph):
    st = prog.stats()
    if hip_graph:
        assert st["regions"] and st["replays"] >= 1, st
    else:
        assert st["regions"] == []


def softmax_model():
    """Y = X - Softmax(X, axis=0): the softmax workspace and Y can share arena bytes."""
    return make_model([helper.make_node("Softmax", ["X"], ["S"], axis=0), helper.make_node("Sub", ["X", "S"], ["Y"])],
                      {"X": X6}, ["Y"])


def roll_model():
    """Y = roll(X, -2) as Concat(Slice(X, 2:), Slice(X, :2))."""
    nodes = [helper.make_node("Slice", ["X", "s0", "e0"], ["A"]), helper.make_node("Slice", ["X", "s1", "e1"], ["B"]),
             helper.make_node("Concat", ["A", "B"], ["Y"], axis=0)]
    init = {"s0": np.array([2], np.int64), "e0": np.array([6], np.int64), "s1": np.array([0], np.int64),
            "e1": np.array([2], np.int64)}
    return make_model(nodes, {"X": X6}, ["Y"], init)


@GRAPH
@pytest.mark.parametrize("build", [softmax_model, roll_model], ids=["softmax", "roll"])
def test_output_fed_back_as_input(target, hip_graph, build):
    """Defect 1: out = run_async(X)[0]; run_async(X=out) ... matches onnxruntime run on the same chain."""
    model = build()
    prog = _compile(model, target, hip_graph)
    cur = prog.context.xp.asarray(X6)
    want = X6
    for step in range(8):
        out = prog.run_async({"X": cur})[0]
        want = ort_run(model, {"X": want})[0]
        np.testing.assert_allclose(_host(prog, out), want, rtol=1e-5, atol=1e-6, err_msg=f"step {step}")
        cur = out
    _assert_replayed(prog, hip_graph)


def two_row_model():
    """Y[2, 6] = [X - Softmax(X); 2 X], W = X + C (read after Y is written) and the constant C[6]
    (an initializer) as outputs."""
    nodes = [helper.make_node("Softmax", ["X"], ["S"], axis=0), helper.make_node("Sub", ["X", "S"], ["A"]),
             helper.make_node("Mul", ["X", "two"], ["B"]),
             helper.make_node("Unsqueeze", ["A", "ax"], ["A1"]), helper.make_node("Unsqueeze", ["B", "ax"], ["B1"]),
             helper.make_node("Concat", ["A1", "B1"], ["Y"], axis=0), helper.make_node("Add", ["X", "C"], ["W"])]
    init = {"two": np.array([2.0], np.float32), "ax": np.array([0], np.int64),
            "C": np.array([0.5, -0.25, 1.5, -2.0, 0.75, 3.0], np.float32)}
    return make_model(nodes, {"X": X6}, ["Y", "W", "C"], init)


@GRAPH
def test_views_into_outputs_and_a_literal_output_fed_back(target, hip_graph):
    """Defect 1: inputs that are a row view into an output (arena) or the constant output, fed back."""
    model = two_row_model()
    prog = _compile(model, target, hip_graph)
    cur = prog.context.xp.asarray(X6)
    want = X6
    for step in range(9):
        y, w, c = prog.run_async({"X": cur})
        want_y, want_w, want_c = ort_run(model, {"X": want})
        np.testing.assert_allclose(_host(prog, y), want_y, rtol=1e-5, atol=1e-6, err_msg=f"Y step {step}")
        np.testing.assert_allclose(_host(prog, w), want_w, rtol=1e-5, atol=1e-6, err_msg=f"W step {step}")
        np.testing.assert_array_equal(_host(prog, c), want_c)
        # feed back row 0, row 1 or the constant output in turn
        cur, want = [(y[0], want_y[0]), (y[1], want_y[1]), (c, want_c)][step % 3]
    _assert_replayed(prog, hip_graph)


@GRAPH
def test_parameter_buffers_passed_for_other_parameters(target, hip_graph):
    """Defect 1: the program's own parameter buffers swapped between two parameters (each one read
    before either is overwritten), and a parameter's own buffer passed for itself."""
    a0 = np.array([1.0, -2.0, 0.5], np.float32)
    b0 = np.array([0.25, 4.0, -1.0], np.float32)
    model = make_model([helper.make_node("Div", ["A", "B"], ["Q"]), helper.make_node("Softmax", ["Q"], ["Y"], axis=0)],
                       {"A": a0, "B": b0}, ["Y"])
    prog = _compile(model, target, hip_graph)
    np.testing.assert_allclose(prog.run({"A": a0, "B": b0})[0], ort_run(model, {"A": a0, "B": b0})[0], rtol=1e-5)
    pa, pb = prog.param_buffer("A"), prog.param_buffer("B")
    for step in range(6):
        ha, hb = _host(prog, pa), _host(prog, pb)  # what the buffers hold before the call
        assert not np.array_equal(ha, hb)
        if step % 2:
            y = prog.run_async({"A": pa, "B": pb})[0]  # each its own buffer
            want = ort_run(model, {"A": ha, "B": hb})[0]
        else:
            y = prog.run_async({"A": pb, "B": pa})[0]  # swapped
            want = ort_run(model, {"A": hb, "B": ha})[0]
        np.testing.assert_allclose(_host(prog, y), want, rtol=1e-5, atol=1e-6, err_msg=f"step {step}")


def test_run_with_host_inputs_in_the_program_memory():
    """run() (host inputs, ref: numpy arrays) given the program's own buffers and outputs as inputs:
    every input is read before any parameter buffer is overwritten."""
    a0 = np.array([1.0, -2.0, 0.5], np.float32)
    b0 = np.array([0.25, 4.0, -1.0], np.float32)
    model = make_model([helper.make_node("Div", ["A", "B"], ["Y"])], {"A": a0, "B": b0}, ["Y"])
    prog = mgx_graph.compile(model, target="ref", hip_graph=False)
    prog.run({"A": a0, "B": b0})
    got = prog.run({"A": prog.param_buffer("B"), "B": prog.param_buffer("A")})[0]
    np.testing.assert_allclose(got, ort_run(model, {"A": b0, "B": a0})[0], rtol=1e-6)
    y = prog.run_async({"A": prog.param_buffer("A"), "B": prog.param_buffer("B")})[0]  # b0 / a0, in the arena
    want = ort_run(model, {"A": ort_run(model, {"A": b0, "B": a0})[0], "B": a0})[0]
    np.testing.assert_allclose(prog.run({"A": y, "B": prog.param_buffer("B")})[0], want, rtol=1e-6)


def constant_outputs_model():
    """Y = X + C; outputs Y, C (an initializer), K (a Constant node) and N (Shape(X), folded)."""
    k = np.array([[7, -3], [2, 9]], np.int64)
    nodes = [helper.make_node("Add", ["X", "C"], ["Y"]),
             helper.make_node("Constant", [], ["K"], value=helper.make_tensor("k", 7, [2, 2], k.reshape(-1))),
             helper.make_node("Shape", ["X"], ["N"])]
    return make_model(nodes, {"X": X6}, ["Y", "C", "K", "N"],
                      {"C": np.array([1.0, 2.0, -3.0, 0.5, 0.0, 4.0], np.float32)})


@GRAPH
def test_constant_outputs_written_by_the_caller(target, hip_graph):
    """Defect 2: writing into constant outputs never changes later runs (or later constant outputs)."""
    model = constant_outputs_model()
    prog = _compile(model, target, hip_graph)
    xbuf = prog.context.xp.zeros(6, np.float32)  # one input buffer, new values every call
    for step in range(7):
        x = (X6 * (step + 1)).astype(np.float32)
        want = ort_run(model, {"X": x})
        xbuf[...] = prog.context.xp.asarray(x)
        outs = prog.run_async({"X": xbuf})
        for name, got, w in zip(["Y", "C", "K", "N"], outs, want):
            np.testing.assert_allclose(_host(prog, got), w, rtol=1e-6, err_msg=f"{name} step {step}")
        for o in outs:
            o[...] = 100
    _assert_replayed(prog, hip_graph)


def views_model():
    """Z = Identity(X), T = Transpose(X), R = Reshape(X) (all views of the parameter)."""
    nodes = [helper.make_node("Identity", ["X"], ["Z"]), helper.make_node("Transpose", ["X"], ["T"], perm=[1, 0]),
             helper.make_node("Reshape", ["X", "shape"], ["R"])]
    return make_model(nodes, {"X": np.zeros((2, 3), np.float32)}, ["Z", "T", "R"],
                      {"shape": np.array([3, 2], np.int64)})


@GRAPH
def test_view_outputs_are_program_buffers(target, hip_graph):
    """Defect 3: Identity / Transpose / Reshape outputs are contiguous program buffers, not the caller's
    input, and keep their values when the input is written after the run."""
    model = views_model()
    prog = _compile(model, target, hip_graph)
    xp = prog.context.xp
    rng = np.random.default_rng(3)
    x = xp.zeros((2, 3), np.float32)  # one input buffer, new values every call
    for step in range(6):
        xh = rng.normal(size=(2, 3)).astype(np.float32)
        x[...] = xp.asarray(xh)
        outs = prog.run_async({"X": x})
        want = ort_run(model, {"X": xh})
        x[...] = -7  # the caller reuses its input buffer
        for name, got, w in zip(["Z", "T", "R"], outs, want):
            assert got is not x and not _shares(prog, got, x), name
            assert got.flags.c_contiguous, name
            np.testing.assert_array_equal(_host(prog, got), w, err_msg=f"{name} step {step}")
    # two outputs never share a buffer either
    for i in range(3):
        for j in range(i):
            assert not _shares(prog, outs[i], outs[j])
    _assert_replayed(prog, hip_graph)


@pytest.mark.usefixtures("unfused")
def test_outputs_are_copied_at_compile_time():
    """The copies are instructions of the program (so a graph captures them), one per borrowed output."""
    prog = mgx_graph.compile(views_model(), target="ref", hip_graph=False)
    ret = prog.get_main_module().get_return()
    assert [i.op.name for i in ret.inputs] == ["contiguous"] * 3
    prog = mgx_graph.compile(softmax_model(), target="ref", hip_graph=False)
    assert [i.op.name for i in prog.get_main_module().get_return().inputs] == ["sub"]


def state_model():
    """state_out = state_in + 1 (bound in place), y = state_out * 3, and the unchanged input echoed."""
    nodes = [helper.make_node("Add", ["state_in", "one"], ["state_out"]),
             helper.make_node("Mul", ["state_out", "three"], ["y"]),
             helper.make_node("Identity", ["state_in"], ["echo"])]
    return make_model(nodes, {"state_in": np.zeros((2, 3), np.float32)}, ["y", "state_out", "echo"],
                      {"one": np.ones((1,), np.float32), "three": np.full((1,), 3.0, np.float32)})


@GRAPH
def test_alias_output_is_the_parameter_buffer(target, hip_graph):
    """The exception: an alias= output is the caller's parameter buffer, passed back every call without
    being staged (it advances exactly once per call), while other outputs stay program buffers."""
    model = state_model()
    prog = _compile(model, target, hip_graph, alias={"state_out": "state_in"})
    assert prog.alias == {"state_out": "state_in"}
    state = prog.context.xp.zeros((2, 3), np.float32)
    want_state = np.zeros((2, 3), np.float32)
    for n in range(1, 8):
        y, out, echo = prog.run_async({"state_in": state})
        want = ort_run(model, {"state_in": want_state})
        want_state = want[1]
        assert _span(prog, out) == _span(prog, state)
        np.testing.assert_array_equal(_host(prog, state), want[1])
        np.testing.assert_allclose(_host(prog, y), want[0], rtol=1e-6)
        np.testing.assert_array_equal(_host(prog, echo), want[2])  # the value before the in-place write
        assert not _shares(prog, echo, state)
        state = out
    assert np.all(want_state == 7)
    _assert_replayed(prog, hip_graph)


def test_output_viewing_an_overwritten_parameter_is_refused():
    """An output that can only be read after its parameter is overwritten in place is a CompileError."""
    nodes = [helper.make_node("Add", ["state_in", "one"], ["state_out"]),
             helper.make_node("Reshape", ["state_in", "shape"], ["echo"])]
    model = make_model(nodes, {"state_in": np.zeros((2, 3), np.float32)}, ["state_out", "echo"],
                       {"one": np.ones((1,), np.float32), "shape": np.array([3, 2], np.int64)})
    with pytest.raises(mgx_graph.CompileError, match="read by contiguous after add"):
        mgx_graph.compile(model, target="ref", alias={"state_out": "state_in"})
