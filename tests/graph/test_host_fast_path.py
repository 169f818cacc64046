"""The fast path of a repeated ``run_async``: the same array objects, unchanged, on the same queue reuse
the previous call's bindings, staging decisions and graph key (``stats()["fast_path_hits"]``).

Every case checks the values against numpy (the oracle of the small decode-like step below) on every
call: a hit must give what the full path gives, a change of object, pointer, shape, dtype, queue or
``copy`` must miss, inputs that overlap the program's memory are still staged, and the graph of
each key replays for that key.  Graphs on, ``min_partition_size=1`` so the small programs become a
region whose later calls replay."""
import gc
import re
import weakref

import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from mgx_graph.graph.cache import GraphLaunchState
from mgx_graph.graph.launch import GraphKey
from util import make_model

R = np.random.default_rng(23)
W = R.uniform(0.5, 1.5, size=(2, 3)).astype(np.float32)
B = R.uniform(-1.0, 1.0, size=(2, 3)).astype(np.float32)
ALIAS = {"state_out": "state_in"}


def step_model():
    """state_out = state_in + x (bound in place onto state_in), y = tanh(state_out * W) + B."""
    nodes = [helper.make_node("Add", ["state_in", "x"], ["state_out"]),
             helper.make_node("Mul", ["state_out", "w"], ["m"]),
             helper.make_node("Tanh", ["m"], ["t"]),
             helper.make_node("Add", ["t", "b"], ["y"])]
    z = np.zeros((2, 3), np.float32)
    return make_model(nodes, {"x": z, "state_in": z}, ["y", "state_out"], {"w": W, "b": B})


def map_model():
    """y = tanh(x * W) + B (one input, one output of the same shape: an output can be fed back)."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["t"]),
             helper.make_node("Add", ["t", "b"], ["y"])]
    return make_model(nodes, {"x": np.zeros((2, 3), np.float32)}, ["y"], {"w": W, "b": B})


def f(v):
    return np.tanh(v * W) + B


def _compile(model, target, **kw):
    return mgx_graph.compile(model, target=target, hip_graph=True, min_partition_size=1, **kw)


def _host(prog, a):
    return np.asarray(prog.context.to_host(a, prog.queue))


def _write(prog, a, value):
    """Rewrite the contents of ``a`` in place (same object, same pointer)."""
    prog.context.copy_from_host(a, np.asarray(value, np.float32), prog.queue)


class Stepper:
    """Runs the step program on ``params`` and checks every call against the numpy oracle."""

    def __init__(self, prog, x, state):
        self.prog, self.x, self.state = prog, x, state
        self.want = np.zeros((2, 3), np.float32)

    def call(self, x=None, state=None, **kw):
        """One step; with ``queue=q`` the input is written and the outputs read on ``q``, after the
        program's queue drained (two queues are ordered by nothing else), and ``q`` drains after."""
        x = self.x if x is None else x
        state = self.state if state is None else state
        ctx, q = self.prog.context, kw.get("queue")
        if q is not None:
            ctx.synchronize(self.prog.queue)
        q = self.prog.queue if q is None else q
        xh = R.normal(size=(2, 3)).astype(np.float32)
        ctx.copy_from_host(x, xh, q)
        y, s = self.prog.run_async({"x": x, "state_in": state}, **kw)
        self.want = self.want + xh
        for got, want, rtol in ((y, f(self.want), 1e-5), (state, self.want, 1e-6), (s, self.want, 1e-6)):
            np.testing.assert_allclose(np.asarray(ctx.to_host(got, q)), want, rtol=rtol, atol=1e-6)
        ctx.synchronize(q)


def _stepper(target, **kw):
    prog = _compile(step_model(), target, alias=ALIAS, **kw)
    xp = prog.context.xp
    return Stepper(prog, xp.zeros((2, 3), np.float32), xp.zeros((2, 3), np.float32))


def _hits(prog) -> int:
    return prog.stats()["fast_path_hits"]


def test_repeated_calls_take_the_fast_path(target):
    """The same arrays (in a new dict each call, contents rewritten) hit from the second call on; the
    graph warms up, captures once and replays as without the fast path."""
    s = _stepper(target)
    for n in range(8):
        s.call()
        assert _hits(s.prog) == n
    st = s.prog.stats()
    assert (st["warmups"], st["captures"], st["replays"], st["fallbacks"]) == (2, 1, 5, 0)
    assert st["runs"] == 8
    s.prog.release()


def test_trace_and_counters_are_those_of_the_full_path(target, capfd):
    s = _stepper(target, debug=True)
    for _ in range(7):
        s.call()
    events = re.findall(r"\[mgx_graph\] (\w+)", capfd.readouterr().err)
    assert events == ["WARMUP", "WARMUP", "CAPTURE"] + ["REPLAY"] * 4
    assert _hits(s.prog) == 6
    assert s.prog.stats()["replay_plan_hits"] == 4  # the replays took the replay plan, with the same trace
    s.prog.release()


def _other_object(s):
    return {"x": s.x.view()}  # the same memory, another array object


def _other_pointer(s):
    return {"x": s.prog.context.xp.zeros((2, 3), np.float32)}


@pytest.mark.parametrize("change", ["object", "pointer", "queue", "copy"])
def test_any_change_misses(target, change):
    """A call with another object (even over the same memory), another pointer, another queue or the
    copy flag set runs the full path; repeating the changed call hits again."""
    s = _stepper(target)
    for _ in range(4):
        s.call()
    hits = _hits(s.prog)
    kw, queue = {}, None
    if change == "object":
        kw = _other_object(s)
    elif change == "pointer":
        kw = _other_pointer(s)
    elif change == "queue":
        ctx = s.prog.context
        with ctx.on_device():
            queue = ctx.runtime.hipStreamCreate()
        kw = {"queue": queue}
    else:
        kw = {"copy": True}
    s.call(**kw)
    assert _hits(s.prog) == hits
    s.call(**kw)
    assert _hits(s.prog) == hits + 1
    s.prog.release()
    if queue is not None:
        s.prog.context.runtime.hipStreamDestroy(queue)


@pytest.mark.parametrize("attr", ["shape", "dtype"])
def test_an_array_changed_in_place_is_checked_again(target, attr):
    """numpy lets shape and dtype be set on an existing array (CuPy its shape): the same object with
    another shape or dtype is refused as on the full path (ParameterError, nothing advanced), and the
    restored array runs the full path once, then hits."""
    s = _stepper(target)
    if attr == "dtype" and not isinstance(s.x, np.ndarray):
        pytest.skip("a CuPy array's dtype cannot be set")
    for _ in range(4):
        s.call()
    hits = _hits(s.prog)
    before = _host(s.prog, s.state)
    setattr(s.x, attr, (3, 2) if attr == "shape" else np.int32)
    with pytest.raises(mgx_graph.ParameterError, match=f"parameter 'x': expected {attr}"):
        s.prog.run_async({"x": s.x, "state_in": s.state})
    np.testing.assert_array_equal(_host(s.prog, s.state), before)
    setattr(s.x, attr, (2, 3) if attr == "shape" else np.float32)
    s.call()
    assert _hits(s.prog) == hits
    s.call()
    assert _hits(s.prog) == hits + 1
    s.prog.release()


def test_a_read_only_state_is_refused_after_hits(target):
    s = _stepper(target)
    if not isinstance(s.state, np.ndarray):
        pytest.skip("CuPy arrays have no writeable flag")
    for _ in range(4):
        s.call()
    s.state.flags.writeable = False
    with pytest.raises(mgx_graph.ParameterError, match="written in place .* read-only"):
        s.prog.run_async({"x": s.x, "state_in": s.state})
    s.state.flags.writeable = True
    s.call()
    s.prog.release()


def test_a_new_array_every_call_never_hits(target):
    """Arrays made for one call and dropped after it (their ids free for the next one) always run the
    full path, with their own values."""
    prog = _compile(map_model(), target)
    xp = prog.context.xp
    for _ in range(12):
        xh = R.normal(size=(2, 3)).astype(np.float32)
        x = xp.asarray(xh)
        (y,) = prog.run_async({"x": x})
        np.testing.assert_allclose(_host(prog, y), f(xh), rtol=1e-5, atol=1e-6)
        del x, y
        gc.collect()
    assert _hits(prog) == 0
    prog.release()


def test_an_output_fed_back_is_staged_on_the_fast_path(target):
    """y fed back as x: program memory the run overwrites, so it is copied into x's buffer first, on
    every call, hits included."""
    prog = _compile(map_model(), target)
    x0 = R.normal(size=(2, 3)).astype(np.float32)
    (y,) = prog.run_async({"x": prog.context.xp.asarray(x0)})
    want = f(x0)
    for _ in range(8):
        (y,) = prog.run_async({"x": y})
        want = f(want)
        np.testing.assert_allclose(_host(prog, y), want, rtol=1e-5, atol=1e-6)
    assert _hits(prog) == 7
    assert prog.stats()["replays"] >= 5
    prog.release()


def test_release_after_hits_raises_and_lets_the_arrays_go(target):
    s = _stepper(target)
    for _ in range(4):
        s.call()
    assert _hits(s.prog) == 3
    s.prog.release()
    with pytest.raises(mgx_graph.MgxError, match="released"):
        s.prog.run_async({"x": s.x, "state_in": s.state})
    ref = weakref.ref(s.x)
    s.x = None
    gc.collect()
    assert ref() is None  # the released program keeps no reference to the last call's input


def test_two_buffer_sets_replay_their_own_graphs(target):
    """Two sets of buffers in the pattern A A B B A A B B A B: each repeat hits, each key change finds
    (or captures) the graph of that key, and each set's state advances only on its own calls."""
    prog = _compile(step_model(), target, alias=ALIAS)
    xp = prog.context.xp
    sets = {k: Stepper(prog, xp.zeros((2, 3), np.float32), xp.zeros((2, 3), np.float32)) for k in "AB"}
    pattern = "AABBAABBAB"
    for k in pattern:
        sets[k].call()
    st = prog.stats()
    assert st["fast_path_hits"] == sum(a == b for a, b in zip(pattern, pattern[1:]))
    assert st["captures"] == 2 and st["fallbacks"] == 0
    assert st["replays"] == len(pattern) - 4  # two warmups, two captures
    assert st["regions"][0]["keys"] == 2
    prog.release()


def test_run_between_run_async_calls_rebinds(target):
    """``run`` binds the parameter buffers: the next run_async with the arrays of before runs the full
    path and reads the caller's arrays again."""
    s = _stepper(target)
    for _ in range(4):
        s.call()
    hits = _hits(s.prog)
    xh = R.normal(size=(2, 3)).astype(np.float32)
    sh = R.normal(size=(2, 3)).astype(np.float32)
    y, state_out = s.prog.run({"x": xh, "state_in": sh})
    np.testing.assert_allclose(y, f(sh + xh), rtol=1e-5, atol=1e-6)
    s.call()
    assert _hits(s.prog) == hits
    s.call()
    assert _hits(s.prog) == hits + 1
    s.prog.release()


def test_validation_mode_checks_replays_on_the_fast_path(target):
    """Validation mode compares the capture and the first three replays of a key with an eager run,
    then every 100th: hits change none of it."""
    s = _stepper(target, validate=True)
    for _ in range(9):
        s.call()
    st = s.prog.stats()
    assert st["fast_path_hits"] == 8
    assert (st["captures"], st["validations"], st["validation_mismatches"], st["replays"]) == (1, 4, 0, 6)
    s.prog.release()


def test_converted_inputs_run_the_full_path(target):
    """Objects converted per call (here torch tensors through DLPack) make no record: no hit."""
    torch = pytest.importorskip("torch")
    prog = _compile(map_model(), target)
    xh = R.normal(size=(2, 3)).astype(np.float32)
    x = torch.from_numpy(xh)
    for _ in range(5):
        (y,) = prog.run_async({"x": x}, copy=target != "ref")
        np.testing.assert_allclose(_host(prog, y), f(xh), rtol=1e-5, atol=1e-6)
    assert _hits(prog) == 0
    prog.release()


def test_a_dynamic_program_counts_the_hits_of_its_specializations(target):
    g = helper.make_graph([helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Neg", ["t"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    prog = mgx_graph.compile(model, target=target)
    xh = R.normal(size=(4, 3)).astype(np.float32)
    x = prog.context.xp.asarray(xh)  # spec 0 (n = 1) exists: its context makes the array
    for _ in range(5):
        (y,) = prog.run_async({"x": x})
        np.testing.assert_allclose(_host(prog, y), -np.tanh(xh), rtol=1e-5, atol=1e-6)
    assert prog.stats()["fast_path_hits"] == 4
    prog.release()


def test_graph_key_is_the_plain_tuple():
    """A GraphKey equals, hashes and prints as its tuple, so traces and stats name keys as before."""
    items = (("x0", 0x1000, (2, 3), "f"), ("x1", 0x2000, (4,), "e"))
    key, plain = GraphKey(0x10, items), (0x10, items)
    assert key == plain and hash(key) == hash(plain) and repr(key) == repr(plain)
    assert GraphLaunchState.key_summary(key) == GraphLaunchState.key_summary(plain)
    assert {plain: 1}[key] == 1 and {key: 2}[plain] == 2
    assert GraphKey(0x10, items[:1]) != key


# -- the device check of a gpu run (a fake runtime and stream: the logic runs everywhere) ----------------
class _FakeRuntime:
    def __init__(self, current):
        self.current, self.calls = current, []

    def current_device(self):
        self.calls.append("get")
        return self.current

    def hipSetDevice(self, dev):
        self.calls.append(("set", dev))
        self.current = dev


class _FakeStream:
    def __init__(self, rt, log):
        self.rt, self.log, self.device = rt, log, rt.current  # a CuPy stream belongs to the current device

    def __enter__(self):
        self.log.append(("enter", self.rt.current))

    def __exit__(self, *exc):
        self.log.append(("exit", self.rt.current))


class _FakeGpuContext:
    def __init__(self, rt, device_id):
        self.runtime, self.device_id, self.log, self.streams = rt, device_id, [], {}

    def _stream(self, queue):
        if queue not in self.streams:
            self.streams[queue] = _FakeStream(self.runtime, self.log)
        return self.streams[queue]


def test_gpu_queue_block_queries_the_device_once_and_sets_it_only_when_needed():
    from mgx_graph.targets.gpu import GpuContext

    rt = _FakeRuntime(current=1)
    ctx = _FakeGpuContext(rt, device_id=1)
    for _ in range(3):
        with GpuContext.on_queue(ctx, 7):
            assert rt.current == 1
    assert rt.calls == ["get"] * 3  # the program's device was current: one query per block, no set
    assert ctx.log == [("enter", 1), ("exit", 1)] * 3 and ctx.streams[7].device == 1

    rt.current = 0  # the caller moved to another device between two calls
    with GpuContext.on_queue(ctx, 7):
        assert rt.current == 1
    assert rt.current == 0 and rt.calls[3:] == ["get", ("set", 1), ("set", 0)]


def test_gpu_queue_block_restores_the_device_after_an_error_and_makes_streams_on_its_device():
    from mgx_graph.targets.gpu import GpuContext

    rt = _FakeRuntime(current=0)
    ctx = _FakeGpuContext(rt, device_id=2)
    with pytest.raises(ZeroDivisionError):
        with GpuContext.on_queue(ctx, 9):
            assert rt.current == 2
            1 / 0
    assert rt.current == 0
    assert ctx.streams[9].device == 2  # made once the program's device was current
    assert ctx.log == [("enter", 2), ("exit", 2)]
    with GpuContext.on_device(ctx):
        assert rt.current == 2
    assert rt.current == 0


def test_current_device_falls_back_to_hip_get_device():
    from mgx_graph.runtime import Runtime

    class Plain(Runtime):
        platform = "host"

        def hipGetDevice(self):
            return 3

    assert Plain().current_device() == 3


@pytest.mark.gpu
def test_current_device_is_hip_get_device(gpu_target):
    from mgx_graph.runtime import device_runtime

    rt = device_runtime()
    assert rt.current_device() == rt.hipGetDevice()


# -- nested on_queue blocks of the same queue (a fake runtime and CuPy stream stack for gpu) -----------------
class _FakeCuda:
    """CuPy's current stream per device of the thread (``get_current_stream``)."""

    def __init__(self, rt):
        self.rt, self.current = rt, {}

    def get_current_stream(self):
        return self.current.get(self.rt.current, "null")


class _StackStream(_FakeStream):
    def __init__(self, rt, log, cuda):
        super().__init__(rt, log)
        self.cuda, self.prev = cuda, []

    def __enter__(self):
        super().__enter__()
        self.prev.append(self.cuda.get_current_stream())
        self.cuda.current[self.rt.current] = self

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.cuda.current[self.rt.current] = self.prev.pop()


class _NestingGpuContext(_FakeGpuContext):
    def __init__(self, rt, device_id, cuda=None):
        super().__init__(rt, device_id)
        self.cuda = cuda or _FakeCuda(rt)
        self.cupy = type("cupy", (), {"cuda": self.cuda})

    def _stream(self, queue):
        if queue not in self.streams:
            self.streams[queue] = _StackStream(self.runtime, self.log, self.cuda)
        return self.streams[queue]


def _gpu_on_queue(ctx, q):
    from mgx_graph.targets.gpu import GpuContext

    return GpuContext.on_queue(ctx, q)


def test_gpu_nested_block_of_the_same_queue_does_nothing():
    rt = _FakeRuntime(current=0)
    ctx = _NestingGpuContext(rt, device_id=1)
    with _gpu_on_queue(ctx, 7):
        stream = ctx.streams[7]
        calls, log = list(rt.calls), list(ctx.log)
        for _ in range(3):
            with _gpu_on_queue(ctx, 7):
                assert rt.current == 1 and ctx.cuda.get_current_stream() is stream
        assert rt.calls == calls + ["get"] * 3  # one device query per nested block, no set
        assert ctx.log == log  # the stream was not entered again
        assert ctx.cuda.get_current_stream() is stream
    assert rt.current == 0 and ctx.cuda.current[1] == "null"
    assert rt.calls[-1] == ("set", 0) and ctx.log[-1] == ("exit", 1)


def test_gpu_nested_blocks_that_change_something_enter_in_full():
    """Another queue, another context, a stream or device the caller made current in between: the
    nested block enters and restores exactly what was current before it."""
    rt = _FakeRuntime(current=0)
    ctx = _NestingGpuContext(rt, device_id=1)
    other_ctx = _NestingGpuContext(rt, device_id=1, cuda=ctx.cuda)
    with _gpu_on_queue(ctx, 7):
        s7 = ctx.streams[7]
        with _gpu_on_queue(ctx, 8):  # another queue
            assert ctx.cuda.get_current_stream() is ctx.streams[8]
            n = len(ctx.log)
            with _gpu_on_queue(ctx, 8):  # nested in the innermost block of queue 8: free
                pass
            assert len(ctx.log) == n
            with _gpu_on_queue(ctx, 7):  # queue 7 is not the innermost block: entered in full
                assert ctx.cuda.get_current_stream() is s7
            assert ctx.cuda.get_current_stream() is ctx.streams[8]
        assert ctx.cuda.get_current_stream() is s7
        with _gpu_on_queue(other_ctx, 7):  # another context, the same queue number
            assert ctx.cuda.get_current_stream() is other_ctx.streams[7]
        assert ctx.cuda.get_current_stream() is s7
        mine = _StackStream(rt, [], ctx.cuda)
        with mine:  # the caller's own stream made current inside the block
            n = len(ctx.log)
            with _gpu_on_queue(ctx, 7):
                assert ctx.cuda.get_current_stream() is s7
            assert len(ctx.log) == n + 2 and ctx.cuda.get_current_stream() is mine
        rt.hipSetDevice(0)  # the caller moved to another device inside the block
        with _gpu_on_queue(ctx, 7):
            assert rt.current == 1 and ctx.cuda.get_current_stream() is s7
        assert rt.current == 0
        rt.hipSetDevice(1)
        with pytest.raises(ZeroDivisionError):
            with _gpu_on_queue(ctx, 7):
                1 / 0
        assert rt.current == 1 and ctx.cuda.get_current_stream() is s7
    assert rt.current == 0 and ctx.cuda.current[1] == "null"


def test_ref_nested_block_of_the_same_queue_keeps_the_error_settings():
    from mgx_graph.targets import ref

    ctx = ref.RefContext.__new__(ref.RefContext)
    caller = np.geterr()
    with ctx.on_queue(1):
        inside = np.geterr()
        assert inside == {"over": "ignore", "invalid": "ignore", "divide": "ignore", "under": "ignore"}
        top = ref._open.top
        with ctx.on_queue(1) as b:
            assert b.state is None and ref._open.top is top and np.geterr() == inside
        with np.errstate(over="raise"):  # the caller changed the settings inside the block
            with ctx.on_queue(1) as b:
                assert b.state is not None and np.geterr() == inside
            assert np.geterr()["over"] == "raise"
        with ctx.on_queue(2) as b:  # another queue
            assert b.state is not None
        with pytest.raises(ZeroDivisionError):
            with ctx.on_queue(1):
                1 / 0
        assert np.geterr() == inside and ref._open.top is top
    assert np.geterr() == caller and ref._open.top is None
