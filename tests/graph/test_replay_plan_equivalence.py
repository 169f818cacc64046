"""The replay plan (:mod:`mgx_graph.graph.replay`) against the full path in the cases around a replay.

Each test runs the same calls through two programs compiled alike, the second with its plan switched
off (``executor._replay_plan = None``: every call runs the eval loop), checks every call's values
against numpy and compares what the two report: counters, errors, the output objects returned.  The
cases: numpy's error settings of the caller (``ref`` runs the replay's kernels on the calling
thread), a kernel error during a replay, the outputs after a call that ran the region eagerly, LRU
updates of one exec between two keys, a capture that fell back, the slower-than-eager gate, eager
mode, ``copy=True``, inputs staged because they are the program's own output, state bound once, and
a dynamic program's specializations (their queues, also once one is evicted)."""
import warnings

import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph.graph import cache as graph_cache
from mgx_graph.errors import DeviceError
from test_host_fast_path import ALIAS, W, Stepper, _compile, _host, _stepper, _write, f, map_model, step_model
from util import make_model

R = np.random.default_rng(41)


def _twins(make):
    """Two programs from ``make()``: the first replays through its plan, the second never does."""
    a, b = make(), make()
    assert a.executor._replay_plan is not None
    b.executor._replay_plan = None
    return a, b


def _reported(prog) -> dict:
    """What the two paths must agree on: the graph counters and the run counts."""
    st = prog.stats()
    return {**prog.counters().region_dict(), **{k: st[k] for k in ("runs", "fast_path_hits", "launches_per_run")}}


def _agree(a, b) -> None:
    assert _reported(a) == _reported(b)
    assert b.stats()["replay_plan_hits"] == 0


def _device_array(target, a):
    """``a`` as an array of ``target`` (numpy on ``ref``, CuPy on ``gpu``)."""
    if target == "gpu":
        import cupy

        return cupy.asarray(a)
    return np.array(a, copy=True)


def _outcome(prog, params):
    """``("ok", host copies of the outputs)`` or ``(error type, message)`` of one ``run_async``."""
    try:
        return "ok", [_host(prog, o) for o in prog.run_async(params)]
    except Exception as e:  # noqa: BLE001 - the two paths' errors are compared
        return type(e).__name__, str(e)


# -- ref: the replay runs the kernels on the calling thread ------------------------------------------
def test_callers_numpy_error_settings_do_not_reach_the_replay(target):
    """exp(200) overflows float32 to inf by design (as on a GPU); a caller that turned numpy's floating-
    point errors into exceptions (or warnings into errors) gets inf from every call, replayed or not."""
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Mul", ["e", "w"], ["m"]),
             helper.make_node("Add", ["m", "w"], ["y"])]
    model = make_model(nodes, {"x": np.zeros((2, 3), np.float32)}, ["y"], {"w": W})
    a, b = _twins(lambda: _compile(model, target))
    xh = np.array([[200.0, 1.0, -3.0], [0.5, 150.0, 2.0]], np.float32)
    with np.errstate(over="ignore"):
        want = np.exp(xh) * W + W
    assert np.isinf(want).any()
    xs = [p.context.xp.asarray(xh) for p in (a, b)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):
            for _ in range(7):
                for prog, x in zip((a, b), xs):
                    (y,) = prog.run_async({"x": x})
                    np.testing.assert_allclose(_host(prog, y), want, rtol=1e-5)
    assert a.stats()["replay_plan_hits"] == 4
    _agree(a, b)
    a.release()
    b.release()


def test_kernel_error_in_a_replay_is_that_of_the_full_path(target):
    """An index rewritten out of range after the capture: on ``ref`` the replayed gather raises, and the
    call raises the full path's ExecutionError naming the graph_launch instruction (not the kernel's
    bare IndexError); the program stays usable and the next calls match numpy."""
    data = R.normal(size=(4, 3)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["d", "i"], ["g"]), helper.make_node("Mul", ["g", "g"], ["m"]),
             helper.make_node("Add", ["m", "g"], ["y"])]
    model = make_model(nodes, {"i": np.zeros((2,), np.int64)}, ["y"], {"d": data})
    a, b = _twins(lambda: _compile(model, target))
    idx = [p.context.xp.asarray(np.array([0, 1], np.int64)) for p in (a, b)]

    def call(ih):
        res = []
        for prog, i in zip((a, b), idx):
            prog.context.copy_from_host(i, np.asarray(ih, np.int64), prog.queue)
            res.append(_outcome(prog, {"i": i}))
        return res

    for n in range(5):
        ih = [n % 4, (n + 1) % 4]
        for kind, outs in call(ih):
            assert kind == "ok"
            np.testing.assert_allclose(outs[0], data[ih] * data[ih] + data[ih], rtol=1e-6)
    assert a.stats()["replay_plan_hits"] == 2
    got, full = call([0, 9])
    assert got[0] == full[0]  # the same outcome (a device gather need not check its indices)
    if got[0] != "ok":
        assert got[1] == full[1]
    if target == "ref":  # the host gather checks its indices
        assert got[0] == "ExecutionError" and "graph_launch" in got[1] and "out of range" in got[1]
    _agree(a, b)  # launches_per_run of the call that raised too
    for n in range(6):
        ih = [3 - n % 4, n % 4]
        for kind, outs in call(ih):
            assert kind == "ok"
            np.testing.assert_allclose(outs[0], data[ih] * data[ih] + data[ih], rtol=1e-6)
    assert a.stats()["replay_plan_hits"] > 2
    _agree(a, b)
    a.release()
    b.release()


# -- the outputs after a call that ran the region eagerly ------------------------------------------
def _transposed_state_model():
    """s = transpose(state_in) + x, state_out = transpose(s) written in place onto state_in (3, 2),
    y = tanh(s * W): the region returns a view of its own (the transpose of a value written in place),
    made anew by every eager run of the region."""
    nodes = [helper.make_node("Transpose", ["state_in"], ["r"], perm=[1, 0]),
             helper.make_node("Add", ["r", "x"], ["s"]),
             helper.make_node("Transpose", ["s"], ["state_out"], perm=[1, 0]),
             helper.make_node("Mul", ["s", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])]
    return make_model(nodes, {"x": np.zeros((2, 3), np.float32), "state_in": np.zeros((3, 2), np.float32)},
                      ["y", "state_out"], {"w": W})


@pytest.mark.parametrize("eager_call", ["validation", "caller_capture"])
def test_outputs_after_an_eager_call_are_those_of_the_full_path(target, eager_call):
    """After calls that ran the region eagerly (validated replays, a call made while the caller captured
    the queue), the first replay returns the key's cached results, not the last call's: the plan
    returns the same objects as the full path (``outs[k] is previous[k]`` alike at every call), with
    the values of numpy, the state advancing once per call."""
    opts = {"validate": True} if eager_call == "validation" else {}
    a, b = _twins(lambda: _compile(_transposed_state_model(), target, alias=ALIAS, **opts))
    xs = [p.context.xp.zeros((2, 3), np.float32) for p in (a, b)]
    states = [p.context.xp.zeros((3, 2), np.float32) for p in (a, b)]
    want, prev, same = np.zeros((2, 3), np.float32), [None, None], [[], []]
    for n in range(10):
        xh = R.normal(size=(2, 3)).astype(np.float32)
        captured = eager_call == "caller_capture" and n == 5
        if not captured:
            want = want + xh
        for k, prog in enumerate((a, b)):
            _write(prog, xs[k], xh)
            if captured:
                _run_in_callers_capture(prog, {"x": xs[k], "state_in": states[k]})
                continue
            outs = prog.run_async({"x": xs[k], "state_in": states[k]})
            np.testing.assert_allclose(_host(prog, outs[0]), np.tanh(want * W), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(_host(prog, outs[1]), want.T, rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(_host(prog, states[k]), want.T, rtol=1e-6, atol=1e-6)
            if prev[k] is not None:
                same[k].append(tuple(o is p for o, p in zip(outs, prev[k])))
            prev[k] = outs
    assert same[0] == same[1]
    # every replay that was not validated (validation runs the region eagerly too) took the plan; on the
    # H200 this program showed no plan hit, and the counters in the message tell whether it replayed
    st = a.stats()
    seen = {k: st[k] for k in ("replays", "replay_plan_hits", "captures", "validations", "fallbacks", "eager_runs")}
    validated = st["validations"] - st["captures"] if eager_call == "validation" else 0  # a capture is checked too
    assert st["replay_plan_hits"] == st["replays"] - validated, seen
    assert target != "ref" or st["replay_plan_hits"] > 0
    _agree(a, b)
    a.release()
    b.release()


def _run_in_callers_capture(prog, params) -> None:
    """``run_async(params)`` inside a capture of the program's queue by the caller (recorded into the
    caller's graph, which is destroyed unlaunched)."""
    from mgx_graph.runtime import hipStreamCaptureModeThreadLocal

    rt, q = prog.context.runtime, prog.queue
    rt.hipStreamBeginCapture(q, hipStreamCaptureModeThreadLocal)
    try:
        prog.run_async(params, q)
    finally:
        graph = rt.hipStreamEndCapture(q)
    rt.hipGraphDestroy(graph)
    prog.context.synchronize(q)


# -- the graph cache's other branches ---------------------------------------------------------------
def _step_twins(target, **kw):
    a, b = _twins(lambda: _compile(step_model(), target, alias=ALIAS, **kw))
    return [Stepper(p, p.context.xp.zeros((2, 3), np.float32), p.context.xp.zeros((2, 3), np.float32))
            for p in (a, b)]


def _call_both(steppers, x=None):
    """One call of each stepper with the same input values (each checked against numpy)."""
    xh = R.normal(size=(2, 3)).astype(np.float32)
    for s, xk in zip(steppers, x or [None, None]):
        xk = s.x if xk is None else xk
        _write(s.prog, xk, xh)
        y, st = s.prog.run_async({"x": xk, "state_in": s.state})
        s.want = s.want + xh
        np.testing.assert_allclose(_host(s.prog, y), f(s.want), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(_host(s.prog, st), s.want, rtol=1e-6, atol=1e-6)


def test_updates_between_two_keys_agree(target):
    """One exec per region (``max_graphs=1``) and two input arrays in turns of four calls: the first
    turn warms up twice, captures and replays once; each later turn's first call updates the exec in
    place for its key and its other three replay it through the plan."""
    steppers = _step_twins(target, max_graphs=1)
    other = [s.prog.context.xp.zeros((2, 3), np.float32) for s in steppers]
    for turn in range(6):
        for _ in range(4):
            _call_both(steppers, other if turn % 2 else None)
    a, b = steppers[0].prog, steppers[1].prog
    st = a.stats()
    assert st["captures"] == 1 and st["updates"] == 5 and st["replay_plan_hits"] == 1 + 5 * 3
    _agree(a, b)
    a.release()
    b.release()


class _FailingCaptures:
    """A runtime whose first ``n`` ``hipStreamBeginCapture`` calls fail (the rest delegate)."""

    def __init__(self, rt, n):
        self._rt, self._n = rt, n

    def hipStreamBeginCapture(self, queue, mode):
        if self._n > 0:
            self._n -= 1
            raise DeviceError("hipStreamBeginCapture", "hipErrorOutOfMemory", "refused by the test")
        return self._rt.hipStreamBeginCapture(queue, mode)

    def __getattr__(self, name):
        return getattr(self._rt, name)


def test_a_capture_that_fell_back_agrees(target):
    """The first capture fails: the key runs eagerly until its retry (after 3 calls), which captures;
    then the replays go through the plan.  Values, fallbacks, eager runs and replays as the full path."""
    steppers = _step_twins(target)
    for s in steppers:
        s.prog.executor.options.retry_after = 3
        region = s.prog.executor.regions[0]
        region.rt = _FailingCaptures(region.rt, 1)
    for _ in range(12):
        _call_both(steppers)
    a, b = steppers[0].prog, steppers[1].prog
    st = a.stats()
    assert (st["warmups"], st["fallbacks"], st["captures"]) == (2, 1, 1)
    assert st["replay_plan_hits"] == st["replays"] > 0
    _agree(a, b)
    a.release()
    b.release()


def test_gate_disabling_a_slow_graph_agrees(target, monkeypatch):
    """With ``gate_slower`` the first three replays are timed against the warmups; timed as slower (a
    stand-in timer: 2 ms per graph launch, 1 ms per eager run) the key is disabled and runs eagerly
    after: the plan replays those three and steps aside from then on."""

    def timed(rt, fn, queue):
        fn()
        return 2.0 if "hipGraphLaunch" in fn.__code__.co_names else 1.0

    monkeypatch.setattr(graph_cache, "_timed", timed)
    steppers = _step_twins(target, gate_slower=True)
    for _ in range(9):
        _call_both(steppers)
    a, b = steppers[0].prog, steppers[1].prog
    st = a.stats()
    assert (st["captures"], st["replays"], st["regions"][0]["disabled"]) == (1, 3, 1)
    assert st["replay_plan_hits"] == 3
    _agree(a, b)
    a.release()
    b.release()


def test_trace_eval_runs_without_the_plan(target, monkeypatch):
    """MIGRAPHX_TRACE_EVAL forces every region eager: no replay, no plan hit, numpy's values."""
    from mgx_graph import env

    monkeypatch.setenv("MIGRAPHX_TRACE_EVAL", "1")
    env._reset_for_tests()
    s = _stepper(target)
    for _ in range(6):
        s.call()
    st = s.prog.stats()
    assert (st["replays"], st["captures"], st["replay_plan_hits"]) == (0, 0, 0) and st["fast_path_hits"] == 5
    s.prog.release()


# -- what a repeated call brings -------------------------------------------------------------------
def test_copy_true_inputs_are_copied_on_every_plan_call(target):
    """``copy=True`` with an input the program cannot bind as it is (``ref``: a non-contiguous numpy
    view; ``gpu``: host memory): every repeated call copies its current contents before the replay."""
    s = _stepper(target)
    if target == "ref":
        big = np.zeros((2, 6), np.float32)
        x = big[:, ::2]
    else:
        x = np.zeros((2, 3), np.float32)
    for n in range(8):
        x[...] = R.normal(size=(2, 3)).astype(np.float32)
        y, st = s.prog.run_async({"x": x, "state_in": s.state}, copy=True)
        s.want = s.want + x
        np.testing.assert_allclose(_host(s.prog, y), f(s.want), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(_host(s.prog, s.state), s.want, rtol=1e-6, atol=1e-6)
    assert s.prog.stats()["replay_plan_hits"] == 5
    s.prog.release()


def test_own_output_fed_back_is_staged_on_every_plan_call(target):
    """The output array fed back as the next call's input (the program's own memory, staged into the
    parameter buffer every call): x_{n+1} = tanh(x_n * W) + B, as numpy iterates it."""
    a, b = _twins(lambda: _compile(map_model(), target))
    for prog in (a, b):
        x = prog.context.xp.asarray(np.full((2, 3), 0.25, np.float32))
        want = np.full((2, 3), 0.25, np.float32)
        for _ in range(8):
            (x,) = prog.run_async({"x": x})
            want = f(want)
            np.testing.assert_allclose(_host(prog, x), want, rtol=1e-5, atol=1e-6)
    assert a.stats()["replay_plan_hits"] > 0
    _agree(a, b)
    a.release()
    b.release()


def test_state_bound_once_with_the_plan(target):
    """``bind_state`` of the state: calls bring only ``x`` and replay through the plan; a new state
    binding drops the record, and the calls continue from the new array's contents."""
    prog = _compile(step_model(), target, alias=ALIAS)
    xp = prog.context.xp
    x, st1, st2 = xp.zeros((2, 3), np.float32), xp.zeros((2, 3), np.float32), xp.zeros((2, 3), np.float32)
    prog.bind_state({"state_in": st1})
    want = np.zeros((2, 3), np.float32)
    for n in range(12):
        if n == 6:
            _write(prog, st2, np.ones((2, 3), np.float32))
            prog.bind_state({"state_in": st2})
            hits, want = prog.stats()["replay_plan_hits"], np.ones((2, 3), np.float32)
        xh = R.normal(size=(2, 3)).astype(np.float32)
        _write(prog, x, xh)
        y, s = prog.run_async({"x": x})
        want = want + xh
        np.testing.assert_allclose(_host(prog, y), f(want), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(_host(prog, st2 if n >= 6 else st1), want, rtol=1e-6, atol=1e-6)
    assert hits == 3 and prog.stats()["replay_plan_hits"] > hits
    prog.release()


def test_dynamic_program_reports_plan_hits(target):
    """A dynamic program's ``stats()`` sums ``replay_plan_hits`` over its specializations, those kept
    and those released (one kept here: each new batch size evicts the last)."""
    wt = R.normal(size=(8, 4)).astype(np.float32)
    prog = _dynamic_tanh_matmul(target, wt, 1)
    assert prog.dispatcher is not None
    seen = 0
    for n in (3, 5, 3):
        xh = R.normal(size=(n, 8)).astype(np.float32)
        x = None
        for _ in range(7):
            if x is None:
                x = _device_array(target, xh)
            (y,) = prog.run_async({"x": x})
            np.testing.assert_allclose(_host(prog, y), np.tanh(xh @ wt), rtol=1e-5, atol=1e-5)
        seen += prog.dispatcher.last().executor.replay_plan_hits
        assert prog.stats()["replay_plan_hits"] == seen
    assert seen > 0 and prog.stats()["specialization_evictions"] >= 2
    prog.release()


def test_one_lone_view_after_the_region_gets_no_plan(target):
    """A region followed by one view step of its own (hand-built IR: a reshape of the region's result
    returned): the eval loop makes that view again on every run, a new object each call, so the program
    gets no plan and returns what the full path returns; values of numpy."""
    from mgx_graph.exec.executor import Executor
    from mgx_graph.operators import make_op
    from mgx_graph.passes import HipGraph, Lowering, MemoryColoring, PassContext, validate_program
    from mgx_graph.targets import make_context
    from test_graph_launch_op import _chain_program, _graph_launch, _want

    prog = _chain_program()
    pctx = PassContext(target)
    for p in (Lowering(), HipGraph()):
        p.apply(prog, pctx)
    m = prog.get_main_module()
    ret = m.get_return()
    m.set_inputs(ret, [m.insert_instruction(ret, make_op("reshape", dims=[12]), [_graph_launch(prog)])])
    MemoryColoring().apply(prog, pctx)
    validate_program(prog)
    ex = Executor(prog, pctx.result, make_context(target))
    assert ex._replay_plan is None
    xh = R.normal(size=(3, 4)).astype(np.float32)
    x, prev = ex.ctx.xp.asarray(xh), None
    for _ in range(7):
        (y,) = ex.run_async({"x": x})
        assert y is not prev  # a new view every call
        np.testing.assert_allclose(np.asarray(ex.ctx.to_host(y, ex.ctx.queue)), _want(xh).reshape(12), rtol=1e-5)
        prev = y
    st = ex.stats()
    assert st["replays"] == 4 and st["replay_plan_hits"] == 0
    ex.close()


def test_threads_on_their_own_queues(target):
    """Three threads, each with its own queue, input and state arrays, interleave their calls on one
    program (the record and the regions' last calls switch between them; a thread's run of calls
    replays through the plan): every thread's state is the sum of its own inputs, as numpy adds them."""
    import threading

    prog = _compile(step_model(), target, alias=ALIAS)
    ctx = prog.context
    with ctx.on_device():
        queues = [ctx.runtime.hipStreamCreate() for _ in range(3)]
    errors, calls, done = [], 30, [0] * len(queues)
    # the arrays are made before any thread calls: CuPy fills them on the legacy default stream, which
    # a thread's fill during another thread's capture of its (blocking) queue would make fail
    # (cudaErrorStreamCaptureImplicit; docs/api.md, queue order)
    with ctx.on_device():
        arrays = [(ctx.xp.zeros((2, 3), np.float32), ctx.xp.zeros((2, 3), np.float32)) for _ in queues]

    def worker(k, q, seed):
        rng = np.random.default_rng(seed)
        x, state = arrays[k]
        want = np.zeros((2, 3), np.float32)
        try:
            for _ in range(calls):
                xh = rng.normal(size=(2, 3)).astype(np.float32)
                ctx.copy_from_host(x, xh, q)
                prog.run_async({"x": x, "state_in": state}, q)
                want = want + xh
                got = np.asarray(ctx.to_host(state, q))
                if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
                    errors.append(f"queue {q:#x}: state {got.tolist()} != {want.tolist()}")
                done[k] += 1
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(k, q, 100 + k)) for k, q in enumerate(queues)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and done == [calls] * len(queues)
    st = prog.stats()
    assert st["runs"] == 3 * calls and st["replay_plan_hits"] <= st["replays"]
    prog.release()
    for q in queues:
        ctx.runtime.hipStreamDestroy(q)


def test_queue_and_context_follow_the_live_specialization_once_spec_0_is_evicted(target):
    """With one specialization kept, a new batch size evicts spec 0 (compiled with the program): the
    program's ``queue`` / ``context`` then belong to the specialization in use, not to the released one
    (the queue is the same one, the program's); values of numpy through them."""
    wt = R.normal(size=(8, 4)).astype(np.float32)
    prog = _dynamic_tanh_matmul(target, wt, 1)
    spec0 = prog.executor
    xh = R.normal(size=(3, 8)).astype(np.float32)
    (y,) = prog.run_async({"x": _device_array(target, xh)})
    assert spec0.released and prog.active_executor() is prog.dispatcher.last().executor
    assert not prog.active_executor().released
    np.testing.assert_allclose(_host(prog, y), np.tanh(xh @ wt), rtol=1e-5, atol=1e-5)
    prog.release()
    with pytest.raises(mgx_graph.errors.MgxError, match="released"):
        prog.queue


def _dynamic_tanh_matmul(target, wt, cap):
    """``y = tanh(x @ wt)`` with a symbolic batch dim, graphs on, at most ``cap`` specializations."""
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])],
                       {"x": np.zeros((1, 8), np.float32)}, ["y"], {"w": wt})
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    model.graph.input[0].type.tensor_type.shape.dim[0].ClearField("dim_value")
    return mgx_graph.compile(model, target=target, hip_graph=True, min_partition_size=1, max_specializations=cap)


@pytest.mark.parametrize("cap", [1, 2])
def test_every_specialization_runs_on_the_programs_one_queue(target, cap):
    """``q = prog.queue`` of a dynamic program is the queue of all its specializations, and stays alive
    while calls of other shapes evict them (cap 1: every new batch size; cap 2: the least recently used):
    a caller reading outputs on ``prog.queue`` after any call reads them after that call, and passing
    ``q`` keeps working (numpy's values).  Release destroys it; a destroyed queue of the caller's is a
    ParameterError naming it, never a launch on a destroyed stream."""
    wt = R.normal(size=(8, 4)).astype(np.float32)
    prog = _dynamic_tanh_matmul(target, wt, cap)
    q0, rt = prog.queue, prog.context.runtime
    feeds = {n: R.normal(size=(n, 8)).astype(np.float32) for n in (3, 5, 2)}
    arrays = {n: _device_array(target, xh) for n, xh in feeds.items()}
    for n in (3, 3, 3, 5, 5, 3, 2, 5, 3, 3):  # warmup, capture, replays; evictions of spec 0 and later ones
        for q in (None, q0):
            (y,) = prog.run_async({"x": arrays[n]}, q)
            np.testing.assert_allclose(_host(prog, y), np.tanh(feeds[n] @ wt), rtol=1e-5, atol=1e-5)
            assert prog.queue == q0 and rt.queue_alive(q0)
            assert {p.executor.ctx.queue for p in prog.dispatcher.specs.programs()} == {q0}
    st = prog.stats()
    assert prog.executor.released and st["specialization_evictions"] > 0 and st["replays"] > 0, st
    mine = rt.hipStreamCreate()
    rt.hipStreamDestroy(mine)
    with pytest.raises(mgx_graph.errors.ParameterError, match=f"queue {mine:#x} was destroyed"):
        prog.run_async({"x": arrays[3]}, mine)
    (y,) = prog.run_async({"x": arrays[3]})  # still usable
    np.testing.assert_allclose(_host(prog, y), np.tanh(feeds[3] @ wt), rtol=1e-5, atol=1e-5)
    prog.release()
    assert not rt.queue_alive(q0)
