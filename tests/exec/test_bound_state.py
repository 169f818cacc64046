"""Parameters bound once as state (``bind_state``): later ``run_async`` calls pass only the other
parameters and replay through the fast path; every call is checked against the numpy oracle of the
small decode-like step of :mod:`test_host_fast_path` (state += x bound in place, y = tanh(state * W) + B),
and every bad state is a typed error that leaves the program usable."""
import gc
import weakref

import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from test_host_fast_path import R, _hits, _host, _stepper, _write, f
from util import make_model


def _bound(target, **kw):
    """The step program with its state array bound once; returns ``(Stepper, state array)``."""
    s = _stepper(target, **kw)
    assert s.prog.bind_state({"state_in": s.state}) == s.prog.state_serial
    return s


def _step(s, **params):
    """One call passing only ``x`` (and ``params``), checked against the numpy oracle."""
    xh = R.normal(size=(2, 3)).astype(np.float32)
    _write(s.prog, s.x, xh)
    y, out = s.prog.run_async({"x": s.x, **params})
    s.want = s.want + xh
    np.testing.assert_allclose(_host(s.prog, y), f(s.want), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_host(s.prog, out), s.want, rtol=1e-6, atol=1e-6)
    # the caller's array is the state's memory: the output bound in place wrote it
    np.testing.assert_allclose(_host(s.prog, s.state.reshape(2, 3)), s.want, rtol=1e-6, atol=1e-6)


def _stepped(target, n=3):
    """The step program with its state bound, after ``n`` calls of :func:`_step` (each checked)."""
    s = _bound(target)
    for _ in range(n):
        _step(s)
    return s


def test_bound_state_steps_replay_through_the_fast_path(target):
    """With the state bound, calls that pass x alone hit from the second call on and give what passing
    every array gives (the same counters too)."""
    s = _bound(target)
    for n in range(8):
        _step(s)
        assert _hits(s.prog) == n
    st = s.prog.stats()
    assert (st["warmups"], st["captures"], st["replays"], st["fallbacks"], st["runs"]) == (2, 1, 5, 0, 8)
    s.prog.release()


def test_reshaping_the_callers_state_array_in_place_changes_nothing(target):
    """The program holds its own view of the state: the caller's object reshaped in place (numpy: its
    dtype set too) changes neither the fast path nor the values."""
    s = _stepped(target)
    s.state.shape = (3, 2)
    if isinstance(s.state, np.ndarray):
        s.state.dtype = np.int32
        s.state = s.state.view(np.float32)  # the oracle reads the memory as float32 again
    hits = _hits(s.prog)
    for k in range(4):
        _step(s)
        assert _hits(s.prog) == hits + k + 1
    s.prog.release()


def test_a_call_naming_a_state_parameter_uses_the_array_given(target):
    """A call that also names the state parameter binds the array given for that call (the full path),
    leaving the bound state as it was; the next call without it reads the bound state again."""
    s = _stepped(target)
    other = s.prog.context.xp.asarray(R.normal(size=(2, 3)).astype(np.float32))
    other_h, bound_h = _host(s.prog, other), _host(s.prog, s.state)
    hits = _hits(s.prog)
    xh = R.normal(size=(2, 3)).astype(np.float32)
    _write(s.prog, s.x, xh)
    for _ in range(2):  # twice: such a call is not recorded, it never hits
        y, out = s.prog.run_async({"x": s.x, "state_in": other})
        other_h = other_h + xh
        np.testing.assert_allclose(_host(s.prog, y), f(other_h), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(_host(s.prog, other), other_h, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(_host(s.prog, s.state), bound_h)
    assert _hits(s.prog) == hits
    _step(s)
    _step(s)
    assert _hits(s.prog) == hits + 1
    s.prog.release()


def _bad_states(prog):
    xp = prog.context.xp
    good = xp.zeros((2, 3), np.float32)
    bad = {"an unknown name": ({"nope": good}, r"unknown parameter\(s\) \['nope'\]"),
           "not a dict": ([good], "state must be a dict of name -> array, got list"),
           "a list": ({"state_in": [[0.0] * 3] * 2},
                      rf"parameter 'state_in' \(state\): expected a {prog.target} device array .*got builtins.list"),
           "another shape": ({"state_in": xp.zeros((3, 2), np.float32)},
                             r"parameter 'state_in': expected shape \[2, 3\], got \[3, 2\]"),
           "another dtype": ({"state_in": xp.zeros((2, 3), np.float64)},
                             "parameter 'state_in': expected dtype float32, got float64"),
           "non-contiguous": ({"state_in": xp.zeros((3, 2), np.float32).T},
                              r"parameter 'state_in' \(state\): the array must be C-contiguous")}
    if prog.target == "gpu":
        bad["a host array"] = ({"state_in": np.zeros((2, 3), np.float32)},
                               r"expected a gpu device array \(cupy.ndarray\), got numpy.ndarray")
    else:
        ro = np.zeros((2, 3), np.float32)
        ro.flags.writeable = False
        bad["read-only"] = ({"state_in": ro}, "parameter 'state_in' is written in place .* read-only")
    return bad


def test_bad_state_raises_and_keeps_the_previous_state(target):
    """Every bad bind_state is a ParameterError naming the parameter (expected vs given); the program
    keeps its state, its record and its values."""
    s = _stepped(target)
    serial = s.prog.state_serial
    for what, (value, message) in _bad_states(s.prog).items():
        hits = _hits(s.prog)
        with pytest.raises(mgx_graph.ParameterError, match=message):
            s.prog.bind_state(value)
        assert s.prog.state_serial == serial, what
        _step(s)
        assert _hits(s.prog) == hits + 1, what
    s.prog.release()


def test_a_call_missing_a_parameter_raises_and_the_state_stays(target):
    s = _stepped(target)
    before = _host(s.prog, s.state)
    with pytest.raises(mgx_graph.ParameterError, match="parameter 'x' is missing"):
        s.prog.run_async({})
    with pytest.raises(mgx_graph.ParameterError, match=r"unknown parameter\(s\) \['y'\]"):
        s.prog.run_async({"x": s.x, "y": s.x})
    np.testing.assert_array_equal(_host(s.prog, s.state), before)
    hits = _hits(s.prog)
    _step(s)
    _step(s)
    assert _hits(s.prog) == hits + 1
    s.prog.release()


@pytest.mark.parametrize("drop", [None, {}])
def test_dropping_the_state_takes_every_parameter_again(target, drop):
    s = _stepped(target)
    s.prog.bind_state(drop)
    with pytest.raises(mgx_graph.ParameterError, match="parameter 'state_in' is missing"):
        s.prog.run_async({"x": s.x})
    hits = _hits(s.prog)
    s.call()
    s.call()
    assert _hits(s.prog) == hits + 1
    s.prog.release()


def test_bind_state_drops_the_record_of_the_last_call(target):
    """Calls passing every array hit; binding the state makes the next (shorter) call take the full
    path once, then hit."""
    s = _stepper(target)
    for _ in range(3):
        s.call()
    hits = _hits(s.prog)
    s.prog.bind_state({"state_in": s.state})
    _step(s)
    assert _hits(s.prog) == hits
    _step(s)
    assert _hits(s.prog) == hits + 1
    s.prog.release()


def test_run_takes_every_parameter_and_leaves_the_state(target):
    s = _stepped(target)
    before = _host(s.prog, s.state)
    xh = R.normal(size=(2, 3)).astype(np.float32)
    sh = R.normal(size=(2, 3)).astype(np.float32)
    y, state_out = s.prog.run({"x": xh, "state_in": sh})
    np.testing.assert_allclose(y, f(sh + xh), rtol=1e-5, atol=1e-6)
    with pytest.raises(mgx_graph.ParameterError, match="parameter 'state_in' is missing"):
        s.prog.run({"x": xh})
    np.testing.assert_array_equal(_host(s.prog, s.state), before)
    _step(s)
    s.prog.release()


def test_bound_state_on_two_queues(target):
    """The state is the program's, whatever the queue: calls on another queue read and write it too,
    and each queue's repeated calls hit."""
    s = _bound(target)
    ctx = s.prog.context
    with ctx.on_device():
        queue = ctx.runtime.hipStreamCreate()
    for q in (None, None, queue, queue, None):
        ctx.synchronize(s.prog.queue)
        xh = R.normal(size=(2, 3)).astype(np.float32)
        _write(s.prog, s.x, xh)
        ctx.synchronize(s.prog.queue)
        y, _ = s.prog.run_async({"x": s.x}, queue=q)
        s.want = s.want + xh
        qq = s.prog.queue if q is None else q
        np.testing.assert_allclose(_host(s.prog, y) if q is None else np.asarray(ctx.to_host(y, qq)), f(s.want),
                                   rtol=1e-5, atol=1e-6)
        ctx.synchronize(qq)
    np.testing.assert_allclose(_host(s.prog, s.state), s.want, rtol=1e-6, atol=1e-6)
    assert _hits(s.prog) == 2
    s.prog.release()
    ctx.runtime.hipStreamDestroy(queue)


def test_release_drops_the_state(target):
    s = _stepped(target, 4)
    ref = weakref.ref(s.state)
    numpy_state = isinstance(s.state, np.ndarray)
    s.state = None
    gc.collect()
    if numpy_state:
        assert ref() is not None  # the program's view keeps the caller's memory alive
    s.prog.release()
    assert s.prog.executor.state.views == {}
    with pytest.raises(mgx_graph.MgxError, match="released"):
        s.prog.bind_state({})
    with pytest.raises(mgx_graph.MgxError, match="released"):
        s.prog.run_async({"x": s.x})
    s.prog = None
    gc.collect()
    assert ref() is None


def test_a_dynamic_program_refuses_state(target):
    g = helper.make_graph([helper.make_node("Add", ["x", "s"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3]),
                           helper.make_tensor_value_info("s", TensorProto.FLOAT, ["n", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    prog = mgx_graph.compile(model, target=target)
    xp = prog.context.xp
    with pytest.raises(mgx_graph.MgxError, match="bind_state needs a static program: this one is dynamic"):
        prog.bind_state({"s": xp.zeros((4, 3), np.float32)})
    assert prog.bind_state({}) == 0 and prog.bind_state(None) == 0
    xh = R.normal(size=(4, 3)).astype(np.float32)
    (y,) = prog.run_async({"x": xp.asarray(xh), "s": xp.asarray(xh)})
    np.testing.assert_allclose(_host(prog, y), xh + xh, rtol=1e-6)
    prog.release()
