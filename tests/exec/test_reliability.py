"""The public bug log of GPU-graph executors (B01-B30 in the research notes) as tests.

Each test reproduces the mechanism behind a reported failure and asserts the right values.  Tests run
on every target where the mechanism exists on the CPU (the host queue follows the CUDA capture rules);
the ones that need a GPU are marked ``gpu``.
"""
import gc
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph.operators import Operation, register_op
from mgx_graph.ir.shape import Shape
from util import make_model, ort_run

R = np.random.default_rng(2024)

# chains of elementwise ops stand for so many kernels here: compiled without kernel fusion
pytestmark = pytest.mark.usefixtures("unfused")


def events(err):
    return re.findall(r"\[mgx_graph\] (\w+)", err)


def chain(n=6, shape=(3, 4)):
    nodes, cur = [], "x"
    for k in range(n):
        nodes.append(helper.make_node(["Neg", "Tanh", "Sigmoid"][k % 3], [cur], [f"v{k}"]))
        cur = f"v{k}"
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    return make_model(nodes, {"x": np.zeros(shape, np.float32)}, ["y"])


def matmul_model(k=16):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["t"]),
             helper.make_node("Softmax", ["t"], ["s"], axis=-1), helper.make_node("Neg", ["s"], ["y"])]
    return make_model(nodes, {"x": np.zeros((4, k), np.float32)}, ["y"], {"w": R.normal(size=(k, 8)).astype(np.float32)})


# B01: a value the host must read (Slice starts from ArgMax) -> a guard, never a silent stale replay
def test_b01_host_read_value_is_guarded_and_validated(target):
    nodes = [helper.make_node("ArgMax", ["y"], ["am"], axis=0, keepdims=1),
             helper.make_node("Slice", ["x", "am", "end", "ax"], ["s"]), helper.make_node("Neg", ["s"], ["o"])]
    model = make_model(nodes, {"x": np.zeros((8, 3), np.float32), "y": np.zeros(5, np.float32)}, ["o"],
                       {"end": np.array([100], np.int64), "ax": np.array([0], np.int64)})
    prog = mgx_graph.compile(model, target=target, hip_graph=True, validate=True, min_partition_size=1)
    for i in range(6):
        y = np.zeros(5, np.float32)
        y[i % 5] = 1.0
        feeds = {"x": R.normal(size=(8, 3)).astype(np.float32), "y": y}
        np.testing.assert_array_equal(prog.run(feeds)[0], ort_run(model, feeds)[0])
    assert prog.stats()["validation_mismatches"] == 0


# B02: very large graphs: thousands of tiny kernels captured and replayed correctly
@pytest.mark.parametrize("n", [2048, pytest.param(8192, marks=pytest.mark.gpu)])
def test_b02_large_graph(n, target):
    if n > 2048 and target != "gpu":
        pytest.skip("the 8192-node variant is for the gpu")
    model = chain(n, (16,))
    prog = mgx_graph.compile(model, target=target, hip_graph=True, warmup=1)
    x = R.normal(size=16).astype(np.float32)
    want = ort_run(model, {"x": x})[0]
    for _ in range(3):
        np.testing.assert_allclose(prog.run({"x": x})[0], want, rtol=1e-5, atol=1e-6)
    st = prog.stats()
    assert st["captures"] == 1 and st["replays"] == 1
    if prog.context.runtime.has_graph_node_count:
        assert st["regions"][0]["graph_nodes"] == [n]


# B04: warm up on the queue that is captured: a second queue gets its own warmups before its capture
def test_b04_warmup_happens_on_the_capture_queue(target, capfd):
    model = matmul_model()
    prog = mgx_graph.compile(model, target=target, hip_graph=True, debug=True)
    rt = prog.context.runtime
    qa, qb = prog.queue, rt.hipStreamCreate()
    xp = prog.context.xp
    x = xp.asarray(R.normal(size=(4, 16)).astype(np.float32))
    for q in (qa, qa, qa, qb, qb, qb):
        out = prog.run_async({"x": x}, q)[0]
        prog.context.synchronize(q)
    lines = [l for l in capfd.readouterr().err.splitlines() if "[mgx_graph]" in l]
    by_queue = {}
    for l in lines:
        by_queue.setdefault(re.search(r"queue (0x[0-9a-f]+)", l).group(1), []).append(events(l)[0])
    assert sorted(by_queue.values()) == [["WARMUP", "WARMUP", "CAPTURE", "REPLAY"], ["WARMUP", "WARMUP", "CAPTURE", "REPLAY"]] \
        or sorted(map(tuple, by_queue.values())) == [("WARMUP", "WARMUP", "CAPTURE"), ("WARMUP", "WARMUP", "CAPTURE")]
    np.testing.assert_allclose(prog.context.to_host(out, qb), ort_run(model, {"x": prog.context.to_host(x, qb)})[0],
                               rtol=1e-5, atol=1e-6)


# B05: the very first GEMM happens inside the capture (no warmup): it works or falls back cleanly
def test_b05_first_gemm_inside_capture(target):
    model = matmul_model()
    prog = mgx_graph.compile(model, target=target, hip_graph=True, warmup=0)
    x = R.normal(size=(4, 16)).astype(np.float32)
    want = ort_run(model, {"x": x})[0]
    for _ in range(4):
        np.testing.assert_allclose(prog.run({"x": x})[0], want, rtol=1e-5, atol=1e-6)
    st = prog.stats()
    assert st["captures"] + st["fallbacks"] == 1
    again = mgx_graph.compile(model, target=target, hip_graph=True)  # the context is not poisoned
    for _ in range(3):
        np.testing.assert_allclose(again.run({"x": x})[0], want, rtol=1e-5, atol=1e-6)
    assert again.stats()["captures"] == 1


# B05, on a queue given to run_async: with warmup=0 (the runners' prefill programs) its first run is a
# capture; the queue's BLAS handle and workspace are made before that run, not by its first GEMM inside it
def test_b05_first_gemm_on_a_new_queue_inside_capture(target, monkeypatch):
    model = matmul_model()
    prog = mgx_graph.compile(model, target=target, hip_graph=True, warmup=0)
    ctx = prog.context
    rt, blas, made = ctx.runtime, ctx.blas, []

    def recording_blas(queue):
        made.append((queue, rt.hipStreamIsCapturing(queue)))
        return blas(queue)

    monkeypatch.setattr(ctx, "blas", recording_blas)
    q = rt.hipStreamCreate()
    x = R.normal(size=(4, 16)).astype(np.float32)
    xd, want = ctx.xp.asarray(x), ort_run(model, {"x": x})[0]
    for _ in range(3):
        out = prog.run_async({"x": xd}, q)[0]
        np.testing.assert_allclose(ctx.to_host(out, q), want, rtol=1e-5, atol=1e-6)
    assert made and made[0] == (q, 0), made  # asked for before anything was captured on q
    st = prog.stats()
    assert (st["captures"], st["replays"], st["fallbacks"]) == (1, 2, 0), st
    prog.release()
    rt.hipStreamDestroy(q)


# B06: many re-captures (a new pointer each time): graph memory and execs stay bounded
def test_b06_recapture_memory_plateaus(target):
    if target == "gpu" and int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        pytest.skip("the device's free memory is shared with the other xdist workers: run with -n 0")
    prog = mgx_graph.compile(matmul_model(), target=target, hip_graph=True, warmup=1, max_graphs=4)
    rt = prog.context.runtime
    xp = prog.context.xp
    free = []
    keep = []  # keep every buffer alive: the allocator must not hand the same address back
    for i in range(100):
        x = xp.asarray(R.normal(size=(4, 16)).astype(np.float32))  # a new buffer every call
        keep.append(x)
        prog.run_async({"x": x})
        prog.context.synchronize(prog.queue)
        if i in (20, 99):
            gc.collect()
            free.append(rt.hipMemGetInfo()[0])
    st = prog.stats()
    assert st["regions"][0]["keys"] <= 4 and st["captures"] <= 4
    assert st["updates"] >= 90
    assert abs(free[1] - free[0]) < (8 << 20)  # no growth beyond noise between call 20 and call 100


# B06 (continued): when exec update is refused (topology changed), re-captures still stop at the cap
def test_b06_refused_updates_keep_captures_within_cap(capfd, monkeypatch):
    model = matmul_model()
    prog = mgx_graph.compile(model, target="ref", hip_graph=True, warmup=0, max_graphs=3, debug=True)
    monkeypatch.setattr(prog.context.runtime, "hipGraphExecUpdate", lambda exe, graph: False)  # all refused
    keep = []
    for _ in range(20):
        x = R.normal(size=(4, 16)).astype(np.float32)  # a new buffer (pointer) every call
        keep.append(x)
        got = prog.run_async({"x": x})[0]
        np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    st = prog.stats()
    assert st["captures"] == 3 and st["updates"] == 0 and st["fallbacks"] == 0
    assert st["eager_runs"] == 20 - 3
    err = capfd.readouterr().err
    assert "topology changed, cannot update" in err and "capture limit reached" in err


# B07: everything on device 1 while device 0 is current (needs 2 GPUs)
@pytest.mark.gpu
def test_b07_second_device():
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs 2 GPUs")
    with cupy.cuda.Device(1):
        prog = mgx_graph.compile(chain(), target="gpu", hip_graph=True)
    x = R.normal(size=(3, 4)).astype(np.float32)
    for _ in range(4):
        np.testing.assert_allclose(prog.run({"x": x})[0], ort_run(chain(), {"x": x})[0], rtol=1e-5)


# B08: an output computed on the host (Shape of an input with run-time dims) is never stale
def test_b08_host_computed_output_tracks_input(target):
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Neg", ["x"], ["n"])]
    model = make_model(nodes, {"x": np.zeros((2, 3), np.float32)}, ["s", "n"])
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    prog = mgx_graph.compile(model, target=target, hip_graph=True, warmup=0)
    for b in (2, 5, 2, 7):
        s, n = prog.run({"x": np.ones((b, 3), np.float32)})
        assert s.tolist() == [b, 3] and n.shape == (b, 3)


# B10: 50 distinct sequence lengths: captures stay under the cap, the rest runs eagerly (and says so)
def test_b10_many_shapes_capture_cap(capfd):
    model = matmul_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "seq"
    prog = mgx_graph.compile(model, target="ref", hip_graph=True, warmup=0, max_graphs=5, debug=True)
    for n in range(1, 51):
        x = R.normal(size=(n, 16)).astype(np.float32)
        np.testing.assert_allclose(prog.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    st = prog.stats()
    assert st["captures"] <= 5
    err = capfd.readouterr().err
    assert "capture limit reached" in err


# B11: random ops draw new numbers on every run, graphs or not
def test_b11_random_ops_are_not_replayed(target):
    nodes = [helper.make_node("RandomUniformLike", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"])]
    model = make_model(nodes, {"x": np.zeros((64,), np.float32)}, ["y"])
    prog = mgx_graph.compile(model, target=target, hip_graph=True, min_partition_size=1)
    outs = [prog.run({"x": np.zeros(64, np.float32)})[0] for _ in range(5)]
    for a in outs:
        assert 0.0 <= a.min() and a.max() < 1.0
    assert all(not np.array_equal(outs[i], outs[j]) for i in range(5) for j in range(i))
    text = prog.print()
    assert "random_uniform" in text and all("random_uniform" not in str(prog.modules[n]) for n in prog.modules
                                          if ":graph_launch" in n)


# B12 / B19: another thread's unsafe call during our capture
@register_op
class _OtherThread(Operation):
    name = "test_other_thread_call"
    alloc_free = True
    call = "malloc"

    def compute_shape(self, inputs, mods=()):
        return Shape(inputs[0].dtype, inputs[0].lens)

    def on_launch(self, ctx, queue):
        rt = ctx.runtime

        def other():
            try:
                if _OtherThread.call == "malloc":
                    rt.hipFree(rt.hipMalloc(64))
                else:
                    rt.hipDeviceSynchronize()
            except Exception:
                pass

        t = threading.Thread(target=other)
        t.start()
        t.join()

    def compute(self, ctx, out, args, ws):
        ctx.xp.multiply(args[0], 3, out=out)


def _with_op(model, op):
    prog = mgx_graph.parse_onnx(model)
    m = prog.get_main_module()
    first = next(i for i in m.instructions if not i.op.builtin)
    probe = m.insert_instruction(m.instructions[m.instructions.index(first) + 1], op, [first])
    for c in list(first.outputs):
        if c is not probe:
            c.inputs = [probe if i is first else i for i in c.inputs]
            probe.outputs.append(c)
    first.outputs = [probe]
    return prog


@pytest.mark.parametrize("mode,ok", [("thread_local", True), ("global", False)])
def test_b12_other_thread_malloc_during_capture(target, mode, ok):
    _OtherThread.call = "malloc"
    prog = _with_op(chain(), _OtherThread()).compile(target, hip_graph=True, capture_mode=mode)
    ref = _with_op(chain(), _OtherThread()).compile(target, hip_graph=False)
    x = R.normal(size=(3, 4)).astype(np.float32)
    for _ in range(4):
        np.testing.assert_array_equal(prog.run({"x": x})[0], ref.run({"x": x})[0])
    st = prog.stats()
    assert (st["captures"], st["fallbacks"]) == ((1, 0) if ok else (0, 1))


def test_b19_device_sync_from_another_thread_then_a_later_capture(target, capfd):
    """A device-wide sync on another thread invalidates the capture: clean fallback; once the other
    thread is quiet the key is retried (after a bounded number of calls) and captures."""
    _OtherThread.call = "sync"
    prog = _with_op(chain(), _OtherThread()).compile(target, hip_graph=True, debug=True)
    x = R.normal(size=(3, 4)).astype(np.float32)
    want = prog.run({"x": x})[0]
    prog.run({"x": x})
    prog.run({"x": x})  # capture: fails
    _OtherThread.call = "malloc"  # the other thread now does something harmless (thread-local mode)
    for _ in range(20):
        np.testing.assert_array_equal(prog.run({"x": x})[0], want)
    ev = events(capfd.readouterr().err)
    assert "FALLBACK" in ev and ev.index("CAPTURE") > ev.index("FALLBACK")
    assert "REPLAY" in ev[ev.index("CAPTURE"):]


# B13: a freshly allocated input every call: outputs track inputs
def test_b13_new_input_buffer_every_call(target):
    model = chain()
    prog = mgx_graph.compile(model, target=target, hip_graph=True)
    xp = prog.context.xp
    for _ in range(10):
        x = R.normal(size=(3, 4)).astype(np.float32)
        out = prog.run_async({"x": xp.asarray(x)})[0]
        np.testing.assert_allclose(prog.context.to_host(out, prog.queue), ort_run(model, {"x": x})[0], rtol=1e-5,
                                   atol=1e-6)


# B14: a host input mutated in place between replays
def test_b14_host_input_mutated_in_place(target):
    model = chain()
    prog = mgx_graph.compile(model, target=target, hip_graph=True)
    x = np.zeros((3, 4), np.float32)
    for i in range(6):
        x[...] = i * 0.3 - 0.5
        np.testing.assert_allclose(prog.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


# B16 is test_passes.py::test_graph_boundary_at_each_host_sync_kind (NonZero, TopK, If, Loop, ...)


# B18 / B23 / B24 / B28: nothing but kernel launches between BeginCapture and EndCapture
def test_b18_no_allocation_or_sync_inside_capture():
    from mgx_graph.runtime import host_runtime

    rt = host_runtime()
    calls = []
    orig = {}
    names = ["hipMalloc", "hipFree", "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize",
             "hipEventRecord", "hipEventCreate"]

    def wrap(name):
        f = getattr(rt, name)
        orig[name] = f

        def w(*a, **k):
            if any(st.capture is not None for st in rt._streams.values()):
                calls.append(name)
            return f(*a, **k)

        setattr(rt, name, w)

    for n in names:
        wrap(n)
    try:
        nodes = [helper.make_node("LayerNormalization", ["x", "s"], ["l"]), helper.make_node("Softmax", ["l"], ["y"])]
        model = make_model(nodes, {"x": np.zeros((4, 8), np.float32)}, ["y"], {"s": np.ones(8, np.float32)})
        prog = mgx_graph.compile(model, target="ref", hip_graph=True, warmup=0, min_partition_size=1)  # first-ever call captured
        x = R.normal(size=(4, 8)).astype(np.float32)
        for _ in range(3):
            np.testing.assert_allclose(prog.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
        assert prog.stats()["captures"] == 1
    finally:
        for n, f in orig.items():
            setattr(rt, n, f)
    assert calls == []


# B20: a smaller batch after a larger one: no stale rows
def test_b20_smaller_batch_has_no_stale_rows(target):
    model = matmul_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    prog = mgx_graph.compile(model, target=target, hip_graph=True, warmup=0)
    for n in (16, 5, 8, 5, 16):
        x = R.normal(size=(n, 16)).astype(np.float32)
        got = prog.run({"x": x})[0]
        assert got.shape == (n, 8)
        np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


# B22 + the output-lifetime design choice: run() hands out copies; run_async() hands out the program's
# own output buffers, valid until the next run, ordered on the program's queue
def test_b22_output_lifetime(target):
    model = chain()
    prog = mgx_graph.compile(model, target=target, hip_graph=True)
    xs = [R.normal(size=(3, 4)).astype(np.float32) for _ in range(2)]
    a = prog.run({"x": xs[0]})[0]
    b = prog.run({"x": xs[1]})[0]
    np.testing.assert_allclose(a, ort_run(model, {"x": xs[0]})[0], rtol=1e-5)  # a copy: not overwritten
    xp = prog.context.xp
    for _ in range(4):
        o1 = prog.run_async({"x": xp.asarray(xs[0])})[0]
        p1 = prog.context.data_ptr(o1)
        o2 = prog.run_async({"x": xp.asarray(xs[0])})[0]
        assert prog.context.data_ptr(o2) == p1  # the same static buffer
    # read on the queue (no explicit sync needed): the values of the last run
    np.testing.assert_allclose(prog.context.to_host(o2, prog.queue), ort_run(model, {"x": xs[0]})[0], rtol=1e-5)


# B26: thousands of consecutive exec updates: every output checked; a long-updated exec is refreshed
def test_b26_many_exec_updates(target):
    model = chain()
    prog = mgx_graph.compile(model, target=target, hip_graph=True, warmup=1, max_graphs=1)
    xp = prog.context.xp
    opts = prog.executor.options
    opts.max_updates_per_exec = 200
    n = 600 if target == "ref" else 10000
    for i in range(n):
        x = R.normal(size=(3, 4)).astype(np.float32)
        out = prog.run_async({"x": xp.asarray(x)})[0]
        if i % 97 == 0 or i == n - 1:
            np.testing.assert_allclose(prog.context.to_host(out, prog.queue), ort_run(model, {"x": x})[0],
                                       rtol=1e-5, atol=1e-6)
    st = prog.stats()
    assert st["updates"] >= n - 1 - n // 200 - 2
    assert st["regions"][0]["refreshes"] >= (n - 2) // 201


# B29: library handles and workspaces exist before the first capture
@pytest.mark.gpu
def test_b29_blas_ready_before_capture(gpu_target):
    model = matmul_model()
    prog = mgx_graph.compile(model, target="gpu", hip_graph=True, warmup=0)
    assert prog.queue in prog.context._blas  # created with the program, not inside a capture
    x = R.normal(size=(4, 16)).astype(np.float32)
    for _ in range(3):
        np.testing.assert_allclose(prog.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert prog.stats()["captures"] == 1


# B30: a graph that replays slower than eager is switched off (gate_slower)
def test_b30_slower_graph_is_disabled(target, capfd):
    prog = mgx_graph.compile(chain(), target=target, hip_graph=True, gate_slower=True, debug=True)
    rt = prog.context.runtime
    import time

    real = rt.hipGraphLaunch

    def slow_launch(exe, q):
        real(exe, q)
        rt.hipStreamSynchronize(q)
        time.sleep(0.05)

    x = R.normal(size=(3, 4)).astype(np.float32)
    rt.hipGraphLaunch = slow_launch
    try:
        outs = [prog.run({"x": x})[0] for _ in range(10)]
    finally:
        del rt.hipGraphLaunch
    assert all(np.array_equal(o, outs[0]) for o in outs)
    ev = events(capfd.readouterr().err)
    assert "DISABLE" in ev and ev[-1] == "EAGER"
    assert prog.stats()["regions"][0]["disabled"] == 1


# Validation mode catches a host value baked into a recorded launch (the B08/B14 class of bug)
@register_op
class _HostCounter(Operation):
    name = "test_host_counter"
    alloc_free = True
    n = 0

    def compute_shape(self, inputs, mods=()):
        return Shape(inputs[0].dtype, inputs[0].lens)

    def on_launch(self, ctx, queue):
        _HostCounter.n += 1
        self.value = float(_HostCounter.n)  # read when the kernel is enqueued (and so baked into a capture)

    def compute(self, ctx, out, args, ws):
        ctx.xp.add(args[0], getattr(self, "value", 0.0), out=out)


def test_validation_mode_disables_a_wrong_replay(target, capfd):
    """A replay that silently computes something else (as illegal captures did on HIP before ROCm 7.0):
    validation compares it with eager, reports the mismatch, returns the eager result, disables the key."""
    model = chain()
    prog = mgx_graph.compile(model, target=target, hip_graph=True, validate=True, debug=True)
    rt = prog.context.runtime
    real = rt.hipGraphLaunch

    def wrong_replay(exe, q):
        real(exe, q)
        out_buf = prog.executor.env[prog.executor.out_slots[0]]  # the region's output buffer
        prog.context.copy(q, out_buf, out_buf + 1.0) if target == "gpu" else rt.hipLaunchHostFunc(
            q, np.add, (out_buf, 1.0, out_buf))

    rt.hipGraphLaunch = wrong_replay
    try:
        x = R.normal(size=(3, 4)).astype(np.float32)
        want = ort_run(model, {"x": x})[0]
        outs = [prog.run({"x": x})[0] for _ in range(6)]
    finally:
        del rt.hipGraphLaunch
    for o in outs:  # warmup, warmup, capture (its launch validated: mismatch), eager x3
        np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-6)
    st = prog.stats()
    assert st["validation_mismatches"] == 1
    err = capfd.readouterr().err
    assert "MISMATCH" in err and events(err)[-1] == "EAGER"


def test_env_validate_and_max(monkeypatch):
    monkeypatch.setenv("MIGRAPHX_HIP_GRAPH_VALIDATE", "1")
    monkeypatch.setenv("MIGRAPHX_HIP_GRAPH_MAX", "3")
    prog = mgx_graph.compile(chain(), target="ref", hip_graph=True)
    opts = prog.executor.options
    assert opts.validate and opts.max_graphs == 3


# teardown in any order and at interpreter exit
def test_teardown_any_order_and_at_exit(target):
    progs = [mgx_graph.compile(chain(), target=target, hip_graph=True) for _ in range(3)]
    x = R.normal(size=(3, 4)).astype(np.float32)
    for p in progs:
        for _ in range(4):
            p.run({"x": x})
    progs[1].release()
    progs[1].release()  # twice is fine
    del progs[0]
    gc.collect()
    with pytest.raises(mgx_graph.MgxError, match="released"):
        progs[0].run({"x": x})
    code = ("import numpy as np, mgx_graph, sys; sys.path[:0] = ['tests', 'tests/exec']; from test_reliability import chain; "
            f"p = mgx_graph.compile(chain(), target='{target}', hip_graph=True); "
            "[p.run({'x': np.ones((3, 4), np.float32)}) for _ in range(4)]; q = p; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
