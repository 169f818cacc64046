"""The native replay (``cpp/replay.c``, armed by :mod:`mgx_graph.graph.replay`) against the Python path.

On ``ref`` the three C calls it makes (launch, capture status, current device) are ctypes callbacks
into the host runtime, and the program's replay plan is made to look like a device target's (device 0,
no queue block), so the C object arms and replays the host graph exec.  Every call's values are
checked against numpy (:class:`test_host_fast_path.Stepper`) and the counters against a twin program
that replays through the Python path only.  Then each check of the C object is made to fail in turn (a
new array, a capture open on the queue, a failing launch, another device current, a lock held by
another thread, the program released): the call returns what the Python path returns, and the C
object never launches when a check fails.  The gpu test runs the same steps on the device."""
import ctypes
import gc
import sys
import threading

import numpy as np
import pytest

from mgx_graph.graph import replay as native_replay
from mgx_graph.errors import MgxError
from test_host_fast_path import R, _host, _stepper, _write, f

pytestmark = pytest.mark.skipif(native_replay._native is None, reason="mgx_graph._native not built (no C compiler)")

LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
STATUS = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))
DEVICE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))


class HostCalls:
    """The three C calls over a host runtime: ``launches`` counts the launches, ``fail`` makes the
    launch return an error, ``capturing`` / ``device`` are what the other two report."""

    def __init__(self, rt):
        self.rt, self.execs, self.launches = rt, {}, 0
        self.fail, self.capturing, self.device = False, None, 0

        def launch(exe, stream):
            if self.fail:
                return 1
            self.launches += 1
            self.rt.hipGraphLaunch(self.execs[exe], stream or 0)
            return 0

        def status(stream, out):
            out[0] = self.rt.hipStreamIsCapturing(stream or 0) if self.capturing is None else self.capturing
            return 0

        def device(out):
            out[0] = self.device
            return 0

        self.fns = (LAUNCH(launch), STATUS(status), DEVICE(device))  # kept alive with this object

    def addresses(self):
        return tuple(ctypes.cast(fn, ctypes.c_void_p).value for fn in self.fns)

    def handle(self, exe):
        self.execs[id(exe)] = exe
        return id(exe)


def _native_stepper(monkeypatch, switch_on=True):
    """A ref Stepper whose replay plan arms the native replay through :class:`HostCalls` (``switch_on``:
    as with ``MIGRAPHX_NATIVE_REPLAY=1``; else the environment decides)."""
    s = _stepper("ref")
    ex = s.prog.executor
    calls = HostCalls(ex.ctx.runtime)
    monkeypatch.setattr(ex.ctx.runtime, "native_replay_calls", calls.addresses, raising=False)
    monkeypatch.setattr(ex.ctx.runtime, "native_handle", calls.handle, raising=False)
    plan = ex._replay_plan
    plan.device, plan.block, plan.query = 0, None, lambda: 0
    plan.native = True if switch_on else native_replay.available()  # switch_on: MIGRAPHX_NATIVE_REPLAY=1
    return s, calls


def _reported(prog) -> dict:
    st = prog.stats()
    return {**prog.counters().region_dict(),
            **{k: st[k] for k in ("runs", "fast_path_hits", "replay_plan_hits", "launches_per_run")}}


def test_armed_replays_agree_with_the_python_path(monkeypatch):
    """From the third replay on the C object replays (its launches counted by the stand-in), every value
    as numpy computes it, every counter as the Python path's twin reports it."""
    s, calls = _native_stepper(monkeypatch)
    twin = _stepper("ref")
    twin.prog.executor._replay_plan.device = None  # a host target's plan: never armed
    for n in range(12):
        s.call()
        twin.call()
        assert _reported(s.prog) == _reported(twin.prog), f"call {n}"
    ex = s.prog.executor
    assert ex._native is not None and calls.launches >= 5 and ex._native.hits == calls.launches
    st = s.prog.stats()
    assert (st["captures"], st["replays"], st["fallbacks"]) == (1, 9, 0)


def _armed(monkeypatch):
    s, calls = _native_stepper(monkeypatch)
    for _ in range(8):
        s.call()
    assert s.prog.executor._native is not None
    return s, calls


def test_a_new_array_runs_the_python_path(monkeypatch):
    """A new array (another pointer: another graph key) is the Python path's call; with two execs cached
    (their LRU order moves) the C object stays unarmed and the values stay right."""
    s, calls = _armed(monkeypatch)
    before = calls.launches
    s.x = s.prog.context.xp.zeros((2, 3), np.float32)
    for _ in range(5):
        s.call()  # values checked: the Python path bound the new array
    assert calls.launches == before and s.prog.executor._native is None
    assert s.prog.stats()["captures"] == 2


def test_it_arms_again_after_a_miss(monkeypatch):
    """A miss drops the C object; the Python path's replay of the same record, call and exec (the mark
    of the replay before) arms a new one at once."""
    s, calls = _armed(monkeypatch)
    first, before = s.prog.executor._native, calls.launches
    calls.device = 1  # one call: another device current for the C object only
    s.call()
    assert calls.launches == before  # the Python path replayed
    assert s.prog.executor._native is not None and s.prog.executor._native is not first
    calls.device = 0
    for _ in range(4):
        s.call()
    assert calls.launches == before + 4


@pytest.mark.parametrize("break_", ["capturing", "launch fails", "other device"])
def test_a_failing_check_or_launch_changes_nothing(monkeypatch, break_):
    """The C object returns None without a launch (or after a failed one) and before any counter moves;
    the Python path then gives the values and counts of a normal call."""
    s, calls = _armed(monkeypatch)
    native = s.prog.executor._native
    params = {"x": s.x, "state_in": s.state}
    if break_ == "capturing":
        calls.capturing = 1
    elif break_ == "launch fails":
        calls.fail = True
    else:
        calls.device = 1
    before, reported = calls.launches, _reported(s.prog)
    assert native(params, None, False) is None
    assert calls.launches == before and _reported(s.prog) == reported
    calls.capturing, calls.fail, calls.device = None, False, 0
    s.call()
    assert _reported(s.prog)["runs"] == reported["runs"] + 1


def test_another_last_result_of_the_region_is_refused(monkeypatch):
    """With several results the region's value is the tuple of the state's last result pair: once that
    pair is another (equal) one, the C object refuses and the Python path gives the values."""
    s, calls = _armed(monkeypatch)
    ex = s.prog.executor
    state = ex._replay_plan.state
    assert state.n_results > 1
    outs, result = state.last_result
    state.last_result = native_replay.RegionResult(list(outs), tuple(result))
    before = calls.launches
    assert ex._native({"x": s.x, "state_in": s.state}, None, False) is None and calls.launches == before
    s.call()


def test_a_lock_held_by_another_thread_is_not_waited_for(monkeypatch):
    s, calls = _armed(monkeypatch)
    ex = s.prog.executor
    native, params = ex._native, {"x": s.x, "state_in": s.state}
    held, done = threading.Event(), threading.Event()

    def hold():
        with ex.lock:
            held.set()
            done.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    try:
        before = calls.launches
        assert native(params, None, False) is None and calls.launches == before
    finally:
        done.set()
        t.join()
    s.call()  # the lock is free again: a normal call


def test_other_parameters_queue_or_copy_are_refused(monkeypatch):
    s, calls = _armed(monkeypatch)
    native, q = s.prog.executor._native, s.prog.queue
    good = {"x": s.x, "state_in": s.state}
    before = calls.launches
    for params, queue, copy in [({"x": s.x}, None, False), ({**good, "extra": s.x}, None, False),
                                ({"x": s.state, "state_in": s.state}, None, False), (good, q + 1, False),
                                (good, None, True), (list(good.values()), None, False)]:
        assert native(params, queue, copy) is None
    assert calls.launches == before
    xh = R.normal(size=(2, 3)).astype(np.float32)
    _write(s.prog, s.x, xh)
    s.want = s.want + xh
    y, _ = native(good, q, False)  # the queue named as the default one
    np.testing.assert_allclose(_host(s.prog, y), f(s.want), rtol=1e-5, atol=1e-6)
    assert calls.launches == before + 1


def test_a_reshaped_array_is_refused(monkeypatch):
    s, calls = _armed(monkeypatch)
    native = s.prog.executor._native
    x = s.x
    x.shape = (3, 2)
    try:
        assert native({"x": x, "state_in": s.state}, None, False) is None
    finally:
        x.shape = (2, 3)


def test_release_drops_it_and_raises(monkeypatch):
    s, calls = _armed(monkeypatch)
    native = s.prog.executor._native
    s.prog.release()
    assert s.prog.executor._native is None
    assert native({"x": s.x, "state_in": s.state}, None, False) is None
    with pytest.raises(MgxError, match="released"):
        s.prog.run_async({"x": s.x, "state_in": s.state})


def test_bad_construction_is_a_typed_error():
    Replay = native_replay._native.Replay
    base = [1, 1, 1, 0, 0, 0, None, (), (), (), (), (), (), (), (), (), len, []]
    with pytest.raises(ValueError, match="address is 0"):
        Replay(0, *base[1:])
    with pytest.raises(ValueError, match="differ in length"):
        Replay(*base[:8], ("x",), (), (), *base[11:])
    with pytest.raises(ValueError, match="differ in length"):
        Replay(*base[:8], ("x",), (None,), (), *base[11:])
    with pytest.raises(TypeError):
        Replay(*base[:7], [], *base[8:])
    with pytest.raises(TypeError, match="positional"):
        Replay(*base, extra=1)


def _pair(monkeypatch):
    """An armed program and its twin (replaying through the Python path only), 8 calls each."""
    s, calls = _native_stepper(monkeypatch)
    twin = _stepper("ref")
    twin.prog.executor._replay_plan.device = None
    for _ in range(8):
        s.call()
        twin.call()
    assert s.prog.executor._native is not None
    return s, twin, calls


def _toggle(state, change) -> None:
    if change == "validation due":
        state.options.validate, state.options.validate_first = True, 10 ** 6
    elif change == "gate pending":
        state.options.gate_slower = True
        state.eager_times.clear()  # (what the eager calls stored there is not a time with the gate off)
    elif change == "debug trace":
        state.debug = True
    else:
        state.force_eager = True


@pytest.mark.parametrize("change", ["validation due", "gate pending", "debug trace", "eager mode"])
def test_a_state_switched_after_arming_runs_the_python_path(monkeypatch, capsys, change):
    """Validation, the slower-than-eager gate, the debug trace or eager mode switched on once the C object
    is armed: the calls are the Python path's (the gate's three timed replays, then the C object again),
    with the twin's counters, trace lines and gate times."""
    s, twin, calls = _pair(monkeypatch)
    for p in (s, twin):
        _toggle(p.prog.executor.regions[0], change)
    before = calls.launches
    capsys.readouterr()
    for n in range(5):
        s.call()
        lines = capsys.readouterr().err.count("\n")
        twin.call()
        assert _reported(s.prog) == _reported(twin.prog) and lines == capsys.readouterr().err.count("\n"), n
    assert calls.launches == before + (2 if change == "gate pending" else 0)
    times = [[len(e.times) for e in p.prog.executor.regions[0].entries.values()] for p in (s, twin)]
    assert times[0] == times[1]


def _state_step(p):
    xh = R.normal(size=(2, 3)).astype(np.float32)
    _write(p.prog, p.x, xh)
    y, _ = p.prog.run_async({"x": p.x})
    p.want = p.want + xh
    np.testing.assert_allclose(_host(p.prog, y), f(p.want), rtol=1e-5, atol=1e-6)


def test_state_bound_then_bound_again(monkeypatch):
    """With the state bound once the C object arms on the call's one array; binding the state again (a
    new array) is the Python path's, every value and counter as the twin's."""
    s, calls = _native_stepper(monkeypatch)
    twin = _stepper("ref")
    twin.prog.executor._replay_plan.device = None
    for round_ in range(2):
        for p in (s, twin):
            p.state = p.prog.context.xp.array(_host(p.prog, p.state))
            p.prog.bind_state({"state_in": p.state})
        before = calls.launches
        for n in range(8):
            _state_step(s)
            _state_step(twin)
            assert _reported(s.prog) == _reported(twin.prog), (round_, n)
        assert calls.launches > before if round_ == 0 else calls.launches == before  # round 1: two keys cached


_O = type("_O", (), {"a": 1})()
_MALFORMED = {  # spec position -> a value whose rows the C object would read past (crash) or misapply
    "layouts: a row not a tuple": (10, (None,)),
    "layouts: names and values of two lengths": (10, ((("a", "b"), (1,)),)),
    "attrs: a row not a tuple": (12, ([_O, "a", 1, 0],)), "attrs: a row of three": (12, ((_O, "a", 1),)),
    "attrs: an unknown mode": (12, ((_O, "a", 1, 3),)), "attrs: len() against a str": (12, ((_O, "a", "1", 2),)),
    "attrs: a name not str": (12, ((_O, 1, 1, 0),)), "items: a row of two": (13, (([1], 0),)),
    "counts: a row of one": (14, ((_O,),)), "sets: a row of two (a set that deletes)": (15, ((_O, "a"),)),
    "returns: not callable": (16, 3),
}


@pytest.mark.parametrize("case", sorted(_MALFORMED))
def test_a_malformed_spec_is_refused_at_construction(case):
    """Each row of the checks and updates is read by position on every call: a row of the wrong shape is
    a ValueError / TypeError at construction, not a crash (or a deleted attribute) at the first call."""
    at, value = _MALFORMED[case]
    spec = [1, 1, 1, 0, 0, 0, _O, (), ("x",), (_O,), ((("a",), (1,)),), (), (), (), (), (), len, []]
    native_replay._native.Replay(*spec)  # well-formed
    spec[at] = value
    if at == 10:
        spec[8], spec[9] = ("x",) * len(value), (_O,) * len(value)
    with pytest.raises((ValueError, TypeError), match="Replay: "):
        native_replay._native.Replay(*spec)
    assert _O.a == 1


@pytest.mark.parametrize("value,armed", [("1", True), ("0", False), (None, True)])
def test_the_environment_turns_it_off(monkeypatch, value, armed):
    """On by default; ``MIGRAPHX_NATIVE_REPLAY=0`` keeps every replay on the Python path."""
    from mgx_graph import env

    env._reset_for_tests()
    try:
        if value is None:
            monkeypatch.delenv("MIGRAPHX_NATIVE_REPLAY", raising=False)
        else:
            monkeypatch.setenv("MIGRAPHX_NATIVE_REPLAY", value)
        s, calls = _native_stepper(monkeypatch, switch_on=False)
        for _ in range(8):
            s.call()
        assert (s.prog.executor._native is not None) is armed and (calls.launches > 0) is armed
    finally:
        env._reset_for_tests()


def test_objects_that_never_replay_stop_the_arming(monkeypatch):
    """A C object whose check fails on every call (here: another device current for it) is dropped
    unused; after COLD_LIMIT such objects in a row the plan arms no more, and every call is the
    Python path's."""
    s, calls = _native_stepper(monkeypatch)
    armed = []
    real = native_replay.arm
    monkeypatch.setattr(native_replay, "arm", lambda *a: armed.append(1) or real(*a))
    calls.device = 1
    for _ in range(12):
        s.call()
    assert len(armed) == native_replay.COLD_LIMIT and calls.launches == 0
    assert s.prog.executor._native is None


@pytest.mark.parametrize("switch_on", [True, False])
def test_a_new_binding_keeps_no_reference_to_the_last_record(monkeypatch, switch_on):
    """After a full bind (a new array) nothing holds the last call's record, so nothing keeps its arrays
    alive: not the plan's mark of its last replay, not the C object armed from it (native replay on or
    off)."""
    from mgx_graph import env

    if not switch_on:
        monkeypatch.setenv("MIGRAPHX_NATIVE_REPLAY", "0")
        env._reset_for_tests()
    s, calls = _native_stepper(monkeypatch, switch_on=switch_on)
    for _ in range(8):
        s.call()
    ex = s.prog.executor
    old = ex._record
    assert old is not None and (ex._native is not None) is switch_on
    s.x = s.prog.context.xp.zeros((2, 3), np.float32)
    s.call()
    gc.collect()
    assert ex._record is not old and sys.getrefcount(old) == 2  # `old` and getrefcount's argument


class _DeviceArray:
    """What the C object reads of a device array: its shape (CuPy's one settable layout attribute)."""

    def __init__(self, shape):
        self.shape = shape


def test_a_device_array_is_checked_by_its_shape_alone():
    """The layouts of a record's device values compare the shape (a tuple) as one attribute; a call with
    the same object replays and counts, one reshaped in place does not."""
    from types import SimpleNamespace

    x = _DeviceArray((1, 1))
    h = np.zeros((2, 3), np.float32)
    rec = native_replay.CallRecord(("h", "x"), (h, x), 7, False, {"h"}, [], [])
    layouts = rec.native_layouts()
    assert layouts == ((("shape", "strides", "dtype"), ((2, 3), (12, 4), np.dtype(np.float32))),
                       (("shape",), ((1, 1),)))
    launched = []
    fns = (LAUNCH(lambda e, q: launched.append((e, q)) or 0), STATUS(lambda q, o: o.__setitem__(0, 0) or 0),
           DEVICE(lambda o: o.__setitem__(0, 0) or 0))
    counter = SimpleNamespace(n=0, queue=7)
    replay = native_replay._native.Replay(
        *(ctypes.cast(f, ctypes.c_void_p).value for f in fns), 5, 7, 0, counter, (threading.RLock(),),
        ("h", "x"), (h, x), layouts, (h,), (), (), ((counter, "n"),), ((counter, "last", "set"),),
        lambda env: env[1:], ["a", "b", "c"])
    assert replay({"h": h, "x": x}, None, False) == ["b", "c"]
    assert launched == [(5, 7)] and counter.n == 1 and counter.last == "set" and replay.hits == 1
    x.shape = (1,)
    assert replay({"h": h, "x": x}, 7, False) is None and replay.hits == 1 and counter.n == 1
    x.shape = (1, 1)
    h.flags.writeable = False  # a parameter written in place must stay writeable
    assert replay({"h": h, "x": x}, 7, False) is None and launched == [(5, 7)]


@pytest.mark.gpu
def test_gpu_native_replay_agrees_with_the_python_path(gpu_target, monkeypatch):
    """On the device (the driver's calls): armed after two plan replays, the values as numpy computes
    them and the counters as a twin replaying through the Python path reports them."""
    s, twin = _stepper("gpu"), _stepper("gpu")
    s.prog.executor._replay_plan.native = True  # MIGRAPHX_NATIVE_REPLAY on (the default)
    twin.prog.executor._replay_plan.native = False  # MIGRAPHX_NATIVE_REPLAY=0
    for n in range(12):
        s.call()
        twin.call()
        assert _reported(s.prog) == _reported(twin.prog), f"call {n}"
    native = s.prog.executor._native
    assert native is not None and native.hits >= 5 and twin.prog.executor._native is None
    s.x = s.prog.context.xp.zeros((2, 3), np.float32)
    s.call()
    assert s.prog.executor._native is None
