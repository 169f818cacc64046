"""Lifetimes of dynamic programs: threads on one evicting dispatcher, bounded prefix programs, runs
after release, release during a caller's capture or another program's, failed compiles, and oversized shapes.

Every test that allocates reads the runtime's books (bytes handed out by ``hipMalloc``, live queues,
held releases) before and after, and asserts they come back to where they were.  Values are checked
against onnxruntime (CPU) or numpy.
"""
import contextlib
import gc
import sys
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mgx_graph
from mgx_graph.errors import CompileError, DeviceError, MgxError, ShapeError

R = np.random.default_rng(88)


# -- helpers -------------------------------------------------------------------------------------
def runtime_of(target):
    from mgx_graph.runtime import device_runtime, host_runtime

    return host_runtime() if target == "ref" else device_runtime()


def books(target) -> tuple:
    """(bytes allocated, live queues, held releases) of the target's runtime, after a gc pass."""
    gc.collect()
    c = runtime_of(target).counters()
    return c["allocated_bytes"], c["live_queues"], c["held_releases"]


def session(model):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "lifetime", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def batch_model():
    """y = tanh(x @ w + b), x: float32[N, 8] with a symbolic batch N."""
    w = numpy_helper.from_array(R.normal(size=(8, 4)).astype(np.float32), "w")
    b = numpy_helper.from_array(R.normal(size=4).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Tanh", ["a"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [w, b])


def value_shape_model(dims=("L",)):
    """y = ConstantOfShape(ReduceMax(n)) + x: the output length is a value of ``n`` (int64[L])."""
    nodes = [helper.make_node("ReduceMax", ["n"], ["m"], keepdims=1),
             helper.make_node("ConstantOfShape", ["m"], ["c"], value=helper.make_tensor("v", TensorProto.FLOAT, [1],
                                                                                      [1.5])),
             helper.make_node("Add", ["c", "x"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("n", TensorProto.INT64, list(dims)),
                          helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M"])])


def unary_model(dims, op="Relu"):
    return _model([helper.make_node(op, ["x"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])


@contextlib.contextmanager
def fast_switching():
    """Switch threads every 10 us, so runs and evictions of the threads interleave finely."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def run_threads(prog, batches_per_thread, calls, feeds, want):
    """Each thread calls ``prog.run`` ``calls`` times, cycling through its batches; returns the errors
    and the batches whose output differed from ``want``."""
    errors, wrong = [], []

    def worker(batches):
        for i in range(calls):
            b = batches[i % len(batches)]
            try:
                got = prog.run({"x": feeds[b]})[0]
            except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                errors.append(f"{type(e).__name__}: {e}")
                continue
            if got.shape != want[b].shape or not np.allclose(got, want[b], rtol=1e-5, atol=1e-6):
                wrong.append(b)

    threads = [threading.Thread(target=worker, args=(bs,)) for bs in batches_per_thread]
    with fast_switching():
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return errors, wrong


# -- 4: threads on one dynamic program whose specializations are evicted --------------------------
def test_two_threads_on_one_specialization_slot(target):
    model = batch_model()
    sess = session(model)
    feeds = {b: R.normal(size=(b, 8)).astype(np.float32) for b in range(1, 13)}
    want = {b: sess.run(None, {"x": x})[0] for b, x in feeds.items()}
    base = books(target)
    prog = mgx_graph.compile(model, target=target, hip_graph=False, max_specializations=1)
    errors, wrong = run_threads(prog, [list(range(1, 7)), list(range(7, 13))], 150, feeds, want)
    assert errors == [] and wrong == []
    st = prog.stats()
    assert st["specializations"] == 1 and st["specialization_evictions"] > 0
    prog.release()
    assert books(target) == base


# -- stress: 4 threads x 500 calls ----------------------------------------------------------------
@pytest.mark.parametrize("cap,hip_graph", [(1, False), (2, True)])
def test_four_threads_stress(target, cap, hip_graph):
    model = batch_model()
    sess = session(model)
    per_thread = [[1 + k, 5 + k, 9 + k] for k in range(4)]  # 12 distinct batches, 3 per thread
    feeds = {b: R.normal(size=(b, 8)).astype(np.float32) for bs in per_thread for b in bs}
    want = {b: sess.run(None, {"x": x})[0] for b, x in feeds.items()}
    base = books(target)
    prog = mgx_graph.compile(model, target=target, hip_graph=hip_graph, warmup=1, max_specializations=cap)
    errors, wrong = run_threads(prog, per_thread, 500, feeds, want)
    assert errors == [] and wrong == []
    st = prog.stats()
    assert st["specializations"] <= cap and st["specialization_evictions"] > 0
    c = runtime_of(target).counters()
    assert c["live_queues"] - base[1] <= cap  # the evicted ones were released, not kept
    prog.release()
    assert books(target) == base


# -- 5: prefix programs (value-dependent shapes) are bounded like specializations ------------------
def test_prefix_programs_are_bounded(target):
    cap, calls = 4, 120
    model = value_shape_model()
    sess = session(model)
    base = books(target)
    prog = mgx_graph.compile(model, target=target, hip_graph=False, max_specializations=cap)
    peak_queues = peak_bytes = 0
    for i in range(calls):
        n = R.integers(1, 40, size=1 + i % 30).astype(np.int64)  # 30 shapes of n, many values
        feeds = {"n": n, "x": R.normal(size=1).astype(np.float32)}
        got = prog.run(feeds)[0]
        exp = sess.run(None, feeds)[0]
        assert got.shape == exp.shape == (int(n.max()),)
        np.testing.assert_allclose(got, exp, rtol=1e-6)
        c = runtime_of(target).counters()
        peak_queues = max(peak_queues, c["live_queues"] - base[1])
        peak_bytes = max(peak_bytes, c["allocated_bytes"] - base[0])
    st = prog.stats()
    assert st["prefix_programs"] <= cap and st["specializations"] <= cap
    assert st["prefix_evictions"] >= 30 - cap  # one prefix program per shape of n, the oldest released
    assert st["shape_hints"] <= 8 * cap
    # one queue per kept program; each holds a few 256-byte aligned buffers (n has at most 30 elements,
    # y at most 39): the books stay at what 2 * cap programs hold, not what 2 * calls would
    assert peak_queues <= 2 * cap
    assert peak_bytes <= 2 * cap * 4096
    prog.release()
    assert books(target) == base


# -- 6: a released dynamic program raises like a released static program --------------------------
def test_released_dynamic_program_raises(target):
    model = batch_model()
    x = R.normal(size=(3, 8)).astype(np.float32)
    want = session(model).run(None, {"x": x})[0]
    base = books(target)
    static = mgx_graph.compile(model, target=target, input_dims={"x": [3, 8]}, hip_graph=False)
    dynamic = mgx_graph.compile(model, target=target, hip_graph=False)
    for p in (static, dynamic):
        np.testing.assert_allclose(p.run({"x": x})[0], want, rtol=1e-5, atol=1e-6)
        p.release()
        p.release()  # twice is fine
    compiles = dynamic.stats()["specialization_compiles"]
    for p in (static, dynamic):
        with pytest.raises(MgxError, match="the program was released"):
            p.run({"x": x})
        dev = p.context.xp.asarray(x) if p is static else x
        with pytest.raises(MgxError, match="the program was released"):
            p.run_async({"x": dev})
    with pytest.raises(MgxError, match="the program was released"):
        dynamic.run({"x": R.normal(size=(5, 8)).astype(np.float32)})  # a new shape compiles nothing
    assert dynamic.stats()["specialization_compiles"] == compiles
    assert books(target) == base


# -- 7: release() while the caller has a capture open on a queue the program used -----------------
@pytest.mark.parametrize("own_queue", [False, True])
def test_release_during_a_capture_waits_for_it(target, own_queue):
    from mgx_graph.runtime import hipStreamCaptureModeThreadLocal

    rt = runtime_of(target)
    model = unary_model([2, 3], "Neg")
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    base = books(target)
    prog = mgx_graph.compile(model, target=target, hip_graph=False)
    q = prog.queue if own_queue else rt.hipStreamCreate()
    xd = prog.context.xp.asarray(x)
    out = prog.run_async({"x": xd}, q)[0]
    np.testing.assert_array_equal(prog.context.to_host(out, q), -x)
    rt.hipStreamBeginCapture(q, hipStreamCaptureModeThreadLocal)
    graph = None
    try:
        prog.run_async({"x": xd}, q)  # recorded into the caller's graph
        prog.release()  # nothing may be freed or synchronized now
        c = rt.counters()
        assert c["held_releases"] == base[2] + 1 and c["allocated_bytes"] > base[0]
        assert rt.hipStreamIsCapturing(q) == 1  # still active, not invalidated
    finally:
        graph = rt.hipStreamEndCapture(q)  # raises if the release invalidated the capture
    assert graph is not None
    rt.hipGraphDestroy(graph)
    with pytest.raises(MgxError, match="the program was released"):
        prog.run({"x": x})
    if not own_queue:
        rt.hipStreamDestroy(q)
    assert books(target) == base  # the held release ran when the capture ended


def test_program_collected_during_another_programs_capture_waits_for_it(target, monkeypatch):
    """A dropped program collected by the garbage collector while a graph region of another program
    captures, on the capturing thread (the collector runs wherever allocations trigger it): its release
    touches none of the capturing queues, yet ``hipFree`` or a sync there would invalidate the capture.
    It is held until the capture ends; the capture succeeds and the books come back."""
    import weakref

    rt = runtime_of(target)
    model = unary_model([2, 3], "Neg")
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    base = books(target)
    dropped = mgx_graph.compile(model, target=target, hip_graph=False)
    np.testing.assert_array_equal(dropped.run({"x": x})[0], -x)
    gone = weakref.ref(dropped)
    cycle = [dropped]
    cycle.append(cycle)  # only the cyclic collector can free it now
    begin, seen = rt.hipStreamBeginCapture, []

    def begin_then_collect(s, mode):
        begin(s, mode)
        gc.collect()  # the dropped program's release runs here, inside the capture
        seen.append((gone() is None, rt.counters()["held_releases"], rt.hipStreamIsCapturing(s)))

    gc.disable()  # no automatic collection before the one inside the capture
    try:
        del dropped, cycle
        prog = mgx_graph.compile(model, target=target, hip_graph=True, warmup=0, min_partition_size=1)
        assert gone() is not None
        monkeypatch.setattr(rt, "hipStreamBeginCapture", begin_then_collect)
        np.testing.assert_array_equal(prog.run({"x": x})[0], -x)  # warmup=0: this run captures
    finally:
        gc.enable()
    assert seen and seen[0][0] and seen[0][1] >= base[2] + 1 and seen[0][2] == 1, seen  # held, still capturing
    st = prog.stats()
    assert (st["captures"], st["fallbacks"]) == (1, 0), st
    np.testing.assert_array_equal(prog.run({"x": x})[0], -x)  # a replay
    assert prog.stats()["replays"] == 1
    prog.release()
    assert books(target) == base  # the held release ran when the capture ended


# -- 8: a failed compile leaves nothing allocated and no queue open -------------------------------
@pytest.mark.parametrize("fail_at", [1, 2, 3])
def test_failed_compile_frees_everything(target, monkeypatch, fail_at):
    model = _model([helper.make_node("Add", ["x", "b"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                   [numpy_helper.from_array(R.normal(size=5).astype(np.float32), "b")])
    rt = runtime_of(target)
    base = books(target)
    calls = []
    real = rt.hipMalloc

    def failing(nbytes):
        calls.append(nbytes)
        if len(calls) == fail_at:
            raise DeviceError("hipMalloc", "hipErrorOutOfMemory", f"{nbytes} bytes requested")
        return real(nbytes)

    monkeypatch.setattr(rt, "hipMalloc", failing)
    with pytest.raises(CompileError, match=r"needs \d+ bytes of .* memory .*hipErrorOutOfMemory.*largest: "):
        mgx_graph.compile(model, target=target, hip_graph=False)
    assert len(calls) == fail_at  # scratch arena, literals, parameters: the failure came at the one asked for
    monkeypatch.setattr(rt, "hipMalloc", real)
    assert books(target) == base
    x = R.normal(size=(4, 5)).astype(np.float32)
    prog = mgx_graph.compile(model, target=target, hip_graph=False)  # nothing is poisoned
    np.testing.assert_allclose(prog.run({"x": x})[0], session(model).run(None, {"x": x})[0], rtol=1e-6)
    prog.release()
    assert books(target) == base


def test_failed_specialization_compile_frees_everything(target, monkeypatch):
    model = batch_model()
    sess = session(model)
    rt = runtime_of(target)
    base = books(target)
    prog = mgx_graph.compile(model, target=target, hip_graph=False)
    x1, x7 = (R.normal(size=(b, 8)).astype(np.float32) for b in (1, 7))
    np.testing.assert_allclose(prog.run({"x": x1})[0], sess.run(None, {"x": x1})[0], rtol=1e-5, atol=1e-6)
    before = books(target)
    real = rt.hipMalloc
    calls = []

    def failing(nbytes):
        calls.append(nbytes)
        if len(calls) == 2:
            raise DeviceError("hipMalloc", "hipErrorOutOfMemory", f"{nbytes} bytes requested")
        return real(nbytes)

    monkeypatch.setattr(rt, "hipMalloc", failing)
    with pytest.raises(CompileError, match="hipErrorOutOfMemory"):
        prog.run({"x": x7})  # batch 7 is a new specialization: its compile fails
    monkeypatch.setattr(rt, "hipMalloc", real)
    assert books(target) == before
    for x in (x7, x1):  # the program is still usable, the new shape compiles now
        np.testing.assert_allclose(prog.run({"x": x})[0], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    prog.release()
    assert books(target) == base


# -- 9: huge declared dims raise a typed error naming the parameter / instruction and the size ----
@pytest.mark.parametrize("dims,err,pattern", [
    ([10 ** 12], CompileError, r"parameter 'x' float32\[1000000000000\]: 4000000000000 bytes"),
    ([2 ** 62], ShapeError, r"parameter 'x': shape float32\[4611686018427387904\] has 4611686018427387904 "
                            r"elements \(18446744073709551616 bytes"),
    ([2 ** 33, 2 ** 33], ShapeError, r"parameter 'x': shape float32\[8589934592,8589934592\] has "
                                     r"73786976294838206464 elements"),
])
def test_huge_declared_dims_raise_typed_errors(target, dims, err, pattern):
    base = books(target)
    with pytest.raises(err, match=pattern):
        mgx_graph.compile(unary_model(dims), target=target, hip_graph=False)
    assert books(target) == base


def test_huge_intermediate_names_the_instruction(target):
    # x[1e6, 1] @ x^T[1, 1e6] is 4e12 bytes: far beyond any device, named by its instruction
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]), helper.make_node("MatMul", ["x", "t"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [10 ** 6, 1])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    base = books(target)
    with pytest.raises(CompileError, match=r"instruction main:@\d+ dot float32\[1000000,1000000\]: "
                                           r"4000000000000 bytes"):
        mgx_graph.compile(model, target=target, hip_graph=False)
    expand = _model([helper.make_node("Expand", ["x", "s"], ["y"], name="grow")],
                    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                    [numpy_helper.from_array(np.array([2 ** 40, 2 ** 40], np.int64), "s")])
    with pytest.raises(ShapeError, match=r"node 'grow' \(Expand\).*float32\[1099511627776,1099511627776\] has "
                                         r"1208925819614629174706176 elements"):
        mgx_graph.compile(expand, target=target, hip_graph=False)
    assert books(target) == base


def expand_value_model():
    """y = -Expand(x, ReduceMax(n)): the output length is a value of ``n`` (int64[1])."""
    nodes = [helper.make_node("ReduceMax", ["n"], ["m"], keepdims=1), helper.make_node("Expand", ["x", "m"], ["e"]),
             helper.make_node("Neg", ["e"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("n", TensorProto.INT64, [1]),
                          helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M"])])


@pytest.mark.parametrize("kind,pattern", [
    ("expand", r"instruction main:@\d+ neg float32\[1000000000000\]: 4000000000000 bytes"),
    # a ConstantOfShape over FOLD_LIMIT elements runs as a broadcast, not a literal: the memory plan refuses it
    ("constant_of_shape", r"the program needs 4000000000\d+ bytes of .*float32\[1000000000000\]: 4000000000000 bytes"),
])
def test_huge_value_dependent_shape_at_run_time(target, kind, pattern):
    # the output length is a run-time value: 10^12 floats cannot be specialized, smaller ones still run
    model = expand_value_model() if kind == "expand" else value_shape_model(dims=(1,))
    sess = session(model)
    base = books(target)
    prog = mgx_graph.compile(model, target=target, hip_graph=False)
    x = np.array([0.25], np.float32)
    with pytest.raises(CompileError, match=pattern):
        prog.run({"n": np.array([10 ** 12], np.int64), "x": x})
    for n in (3, 17):
        feeds = {"n": np.array([n], np.int64), "x": x}
        np.testing.assert_allclose(prog.run(feeds)[0], sess.run(None, feeds)[0], rtol=1e-6)
    prog.release()
    assert books(target) == base


def test_host_malloc_beyond_memory_is_typed():
    from mgx_graph.runtime import host_runtime

    rt = host_runtime()
    before = rt.counters()
    with pytest.raises(DeviceError, match=r"hipErrorOutOfMemory: 1152921504606846976 bytes requested"):
        rt.hipMalloc(2 ** 60)
    assert rt.counters() == before


def test_held_release_runs_when_the_capture_ends_by_stream_destroy():
    from mgx_graph.runtime import host_runtime, hipStreamCaptureModeThreadLocal

    rt = host_runtime()
    before = rt.counters()
    q = rt.hipStreamCreate()
    ptr = rt.hipMalloc(1000)
    rt.hipStreamBeginCapture(q, hipStreamCaptureModeThreadLocal)
    done = []
    assert not rt.release_after_capture([q], lambda: (rt.hipFree(ptr), done.append(1)))
    assert done == [] and rt.counters()["held_releases"] == before["held_releases"] + 1
    assert rt.run_held_releases() == before["held_releases"] + 1  # still capturing: still held
    rt.hipStreamDestroy(q)  # ends the capture (as CUDA): the held release runs, nothing is invalidated
    assert done == [1]
    assert rt.counters() == before
    assert not rt.queue_alive(q) and rt.capturing([q]) == []


def test_huge_static_constant_of_shape_is_refused_before_allocating(target):
    """A ConstantOfShape whose shape is larger than the host's memory: a typed error naming its size, raised
    before onnx's data propagation or numpy try to materialize it (an overcommitting host would kill the
    process instead of raising): over FOLD_LIMIT elements it is no literal, and the memory plan refuses it."""
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["c"], name="fill"), helper.make_node("Add", ["c", "x"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                   [numpy_helper.from_array(np.array([10 ** 12], np.int64), "s")])
    base = books(target)
    with pytest.raises(CompileError, match=r"the program needs 4000000000\d+ bytes .*float32\[1000000000000\]: "
                                           r"4000000000000 bytes"):
        mgx_graph.compile(model, target=target, hip_graph=False)
    assert books(target) == base
    x = np.array([2.0], np.float32)  # the process is intact: a small program still compiles and runs
    small = _model([helper.make_node("ConstantOfShape", ["s"], ["c"]), helper.make_node("Add", ["c", "x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                   [numpy_helper.from_array(np.array([3], np.int64), "s")])
    np.testing.assert_array_equal(mgx_graph.compile(small, target=target).run({"x": x})[0], np.full(3, 2.0, np.float32))
