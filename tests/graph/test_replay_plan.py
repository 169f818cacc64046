"""The replay plan (:mod:`mgx_graph.graph.replay`): a repeated ``run_async`` of a one-region program
replays its graph without the eval loop, and gives what the full path gives.

Every call is checked against numpy (the oracle of the small decode-like step of
``test_host_fast_path``): values after the inputs are rewritten in place, the graph counters, the
trace, and the cases where the plan must step aside (validation due, the caller capturing the queue,
another object, a program with a step outside its region)."""
import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph.graph.replay import ReplayPlan
from test_host_fast_path import ALIAS, B, W, Stepper, _compile, _host, _stepper, _write, f, step_model
from util import make_model


def _plan_hits(prog) -> int:
    return prog.stats()["replay_plan_hits"]


def test_repeated_replays_take_the_plan(target):
    """From the first replay on, each repeated call is a plan hit; values, counters and the output
    objects are those of the full path."""
    s = _stepper(target)
    assert s.prog.executor._replay_plan is not None
    outs = []
    for n in range(8):
        s.call()
        outs.append(s.prog.run_async({"x": s.x, "state_in": s.state}))  # a second call, same arrays
        s.want = s.want + _host(s.prog, s.x)  # that call added x once more
    st = s.prog.stats()
    assert st["runs"] == 16 and st["fast_path_hits"] == 15
    assert (st["warmups"], st["captures"], st["fallbacks"]) == (2, 1, 0)
    assert st["replays"] == st["replay_plan_hits"] == 13  # every replay after the capture repeats a call
    assert st["launches_per_run"] == 1
    # the plan returns the very arrays the full path returns (the program's output buffers)
    assert all(a is b for a, b in zip(outs[-1], outs[-2]))
    np.testing.assert_allclose(_host(s.prog, outs[-1][0]), f(s.want), rtol=1e-5, atol=1e-6)
    s.prog.release()


def test_plan_and_full_path_agree_call_by_call(target):
    """The same inputs through two programs, one with the plan switched off: equal values, equal
    counters, at every call."""
    a, b = _stepper(target), _stepper(target)
    b.prog.executor._replay_plan = None
    for _ in range(7):
        xh = np.random.default_rng(5).normal(size=(2, 3)).astype(np.float32)
        res = []
        for s in (a, b):
            _write(s.prog, s.x, xh)
            y, st = s.prog.run_async({"x": s.x, "state_in": s.state})
            res.append((_host(s.prog, y), _host(s.prog, st)))
        np.testing.assert_array_equal(res[0][0], res[1][0])
        np.testing.assert_array_equal(res[0][1], res[1][1])
    sa, sb = a.prog.stats(), b.prog.stats()
    for k in ("runs", "fast_path_hits", "replays", "captures", "warmups", "launches_per_run"):
        assert sa[k] == sb[k], k
    assert sa["replay_plan_hits"] == 4 and sb["replay_plan_hits"] == 0
    a.prog.release()
    b.prog.release()


def test_validation_due_steps_aside(target):
    """Validation mode checks the capture and the first three replays against an eager run: the plan
    takes none of those calls, then takes the unvalidated replays."""
    s = _stepper(target, validate=True)
    for _ in range(9):
        s.call()
    st = s.prog.stats()
    assert (st["captures"], st["validations"], st["validation_mismatches"], st["replays"]) == (1, 4, 0, 6)
    assert st["replay_plan_hits"] == 3
    s.prog.release()


def test_another_object_misses_the_plan(target):
    s = _stepper(target)
    for _ in range(5):
        s.call()
    hits = _plan_hits(s.prog)
    x2 = s.prog.context.xp.zeros((2, 3), np.float32)
    s.call(x=x2)  # another array: the full path (a new key, warmup)
    assert _plan_hits(s.prog) == hits
    s.x = x2
    for _ in range(6):
        s.call()
    assert _plan_hits(s.prog) > hits  # the new key replays through the plan once captured
    s.prog.release()


def test_caller_capturing_the_queue_steps_aside(target):
    """A call made while the caller captures the queue goes into the caller's graph (the full path's
    eager branch), never a replay of the program's own exec."""
    from mgx_graph.runtime import hipStreamCaptureModeThreadLocal

    s = _stepper(target)
    for _ in range(5):
        s.call()
    prog, rt = s.prog, s.prog.context.runtime
    q = prog.queue
    hits, replays = _plan_hits(prog), prog.stats()["replays"]
    rt.hipStreamBeginCapture(q, hipStreamCaptureModeThreadLocal)
    try:
        prog.run_async({"x": s.x, "state_in": s.state}, q)
    finally:
        graph = rt.hipStreamEndCapture(q)
    rt.hipGraphDestroy(graph)
    st = prog.stats()
    assert st["replay_plan_hits"] == hits and st["replays"] == replays and st["eager_runs"] >= 1
    prog.context.synchronize(q)
    s.want = _host(prog, s.state)  # the captured run was recorded, not executed: the state stands
    s.call()
    assert _plan_hits(prog) == hits + 1
    prog.release()


def test_no_plan_for_a_step_outside_the_region(target):
    """A program whose main module has a kernel outside its region (graphs off) or no region gets no
    plan, and its repeated calls run the eval loop."""
    prog = mgx_graph.compile(step_model(), target=target, hip_graph=False, alias=ALIAS)
    assert prog.executor._replay_plan is None
    xp = prog.context.xp
    s = Stepper(prog, xp.zeros((2, 3), np.float32), xp.zeros((2, 3), np.float32))
    for _ in range(4):
        s.call()
    assert prog.stats()["replay_plan_hits"] == 0 and prog.stats()["fast_path_hits"] == 3
    prog.release()


def test_no_plan_for_views_before_the_region(target):
    """A view of a parameter ahead of the region (a reshape the region reads) is a step of its own:
    no plan; values still match numpy."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["xr"]), helper.make_node("Mul", ["xr", "w"], ["m"]),
             helper.make_node("Tanh", ["m"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])]
    model = make_model(nodes, {"x": np.zeros((6,), np.float32)}, ["y"],
                       {"w": W, "b": B, "shape": np.array([2, 3], np.int64)})
    prog = _compile(model, target)
    x = prog.context.xp.zeros((6,), np.float32)
    for n in range(6):
        xh = np.arange(6, dtype=np.float32) * (n + 1) / 7
        _write(prog, x, xh)
        (y,) = prog.run_async({"x": x})
        np.testing.assert_allclose(_host(prog, y), f(xh.reshape(2, 3)), rtol=1e-5, atol=1e-6)
    if prog.executor._replay_plan is None:
        assert prog.stats()["replay_plan_hits"] == 0
    else:  # the reshape was folded into the region: then the plan applies
        assert prog.stats()["replay_plan_hits"] > 0
    prog.release()


def test_plan_for_executor_needs_one_region():
    class Ex:  # an executor stand-in whose main module holds no instruction at all
        class program:
            @staticmethod
            def get_main_module():
                return type("M", (), {"instructions": []})()

        class buffers:
            movable, slot = set(), {}

    assert ReplayPlan.for_executor(Ex()) is None


@pytest.mark.parametrize("n_calls", [3])
def test_release_after_plan_hits_raises(target, n_calls):
    s = _stepper(target)
    for _ in range(n_calls + 4):
        s.call()
    assert _plan_hits(s.prog) > 0
    s.prog.release()
    with pytest.raises(mgx_graph.errors.MgxError, match="released"):
        s.prog.run_async({"x": s.x, "state_in": s.state})
