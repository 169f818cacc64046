"""The graph_launch state machine: warmup -> capture -> replay, re-capture on a new key, fallback on
a failed capture, the env switch, and state updated in place advancing exactly once per call."""
import re

import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph import env
from mgx_graph.operators import Operation, register_op
from mgx_graph.ir.shape import Shape
from util import make_model, ort_run

R = np.random.default_rng(7)

# chains of elementwise ops stand for so many kernels here: compiled without kernel fusion
pytestmark = pytest.mark.usefixtures("unfused")


def chain_model(n=6):
    """x -> (mul w, add b, tanh) * n/3 -> y : enough kernels for one region."""
    nodes, init = [], {}
    cur = "x"
    for i in range(n // 3):
        init[f"w{i}"] = R.uniform(0.5, 1.5, size=(4,)).astype(np.float32)
        init[f"b{i}"] = R.uniform(-1, 1, size=(4,)).astype(np.float32)
        nodes += [helper.make_node("Mul", [cur, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Tanh", [f"a{i}"], [f"t{i}"])]
        cur = f"t{i}"
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    return make_model(nodes, {"x": np.zeros((3, 4), np.float32)}, ["y"], init)


def trace_events(err: str):
    return re.findall(r"\[mgx_graph\] (\w+)", err)


def test_warmup_capture_replay(target, capfd):
    model = chain_model()
    x = R.normal(size=(3, 4)).astype(np.float32)
    expect = ort_run(model, {"x": x})[0]
    prog = mgx_graph.compile(model, target=target, hip_graph=True, debug=True)
    for _ in range(6):
        np.testing.assert_allclose(prog.run({"x": x})[0], expect, rtol=1e-5, atol=1e-6)
    events = trace_events(capfd.readouterr().err)
    assert events == ["WARMUP", "WARMUP", "CAPTURE", "REPLAY", "REPLAY", "REPLAY"]
    st = prog.stats()
    assert (st["warmups"], st["captures"], st["replays"], st["fallbacks"]) == (2, 1, 3, 0)
    assert st["launches_per_run"] == 1 and st["launches_per_run_eager"] == 6
    region = st["regions"][0]
    assert region["graph_nodes"] == [region["launches_eager"]] or target != "ref"
    prog.release()


def test_warmup_count_is_configurable(target, capfd):
    prog = mgx_graph.compile(chain_model(), target=target, hip_graph=True, debug=True, warmup=0)
    x = R.normal(size=(3, 4)).astype(np.float32)
    prog.run({"x": x})
    prog.run({"x": x})
    assert trace_events(capfd.readouterr().err) == ["CAPTURE", "REPLAY"]


def test_inputs_change_between_replays(target):
    """Same buffers (program-owned), new data: every replay must see the new data."""
    model = chain_model()
    prog = mgx_graph.compile(model, target=target, hip_graph=True)
    for i in range(8):
        x = R.normal(size=(3, 4)).astype(np.float32)
        np.testing.assert_allclose(prog.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert prog.stats()["replays"] == 5


def test_new_pointer_is_a_new_key(target):
    """run_async with a freshly allocated input each call (the onnxruntime #20050 / #22583 trap):
    the key holds the device pointer, so a new buffer re-captures and outputs track the inputs."""
    model = chain_model()
    prog = mgx_graph.compile(model, target=target, hip_graph=True, warmup=1)
    xp = prog.context.xp
    xs = [R.normal(size=(3, 4)).astype(np.float32) for _ in range(3)]
    bufs = [xp.asarray(x) for x in xs]
    for rep in range(3):  # buffer 0: warmup, capture, replay
        out = prog.run_async({"x": bufs[0]})[0]
        np.testing.assert_allclose(prog.context.to_host(out, prog.queue), ort_run(model, {"x": xs[0]})[0],
                                   rtol=1e-5, atol=1e-6)
    st = prog.stats()
    assert (st["captures"], st["replays"]) == (1, 1)
    for rep in range(3):  # a second buffer: a second key; the queue is warm already, so it captures at once
        out = prog.run_async({"x": bufs[1]})[0]
        np.testing.assert_allclose(prog.context.to_host(out, prog.queue), ort_run(model, {"x": xs[1]})[0],
                                   rtol=1e-5, atol=1e-6)
    st = prog.stats()
    assert (st["warmups"], st["captures"], st["replays"]) == (1, 2, 3)
    assert st["regions"][0]["keys"] == 2
    # back to the first buffer: its graph is still cached and replays
    out = prog.run_async({"x": bufs[0]})[0]
    np.testing.assert_allclose(prog.context.to_host(out, prog.queue), ort_run(model, {"x": xs[0]})[0], rtol=1e-5,
                               atol=1e-6)
    assert prog.stats()["captures"] == 2


def test_key_holds_shape_and_dtype(target):
    """Two inputs at the same address but a different shape are different keys."""
    from mgx_graph.graph.launch import GraphLaunchState

    prog = mgx_graph.compile(chain_model(), target=target, hip_graph=True)
    state = GraphLaunchState("t", prog.context, 1, 1)
    k1 = (1, (("x0", 1000, (3, 4), "f"),))
    k2 = (1, (("x0", 1000, (4, 3), "f"),))
    k3 = (1, (("x0", 1000, (3, 4), "e"),))
    k4 = (2, (("x0", 1000, (3, 4), "f"),))
    assert len({state.key_summary(k) for k in (k1, k2, k3, k4)}) == 4


# -- forced capture failure ----------------------------------------------------------------------------
@register_op
class HostSyncProbe(Operation):
    """Test op: doubles its input, and synchronizes the queue when it is launched (a host sync, which is
    illegal while the queue is being captured).  It claims to be capturable, so the graph pass puts it
    inside a region and the capture must fail."""

    name = "test_host_sync_probe"
    alloc_free = True

    def compute_shape(self, inputs, mods=()):
        return Shape(inputs[0].dtype, inputs[0].lens)

    def on_launch(self, ctx, queue):
        ctx.runtime.hipStreamSynchronize(queue)

    def compute(self, ctx, out, args, ws):
        ctx.xp.multiply(args[0], 2, out=out)


def _with_probe(prog):
    """Insert the probe after the first kernel of main (before lowering)."""
    m = prog.get_main_module()
    first = next(i for i in m.instructions if not i.op.builtin)
    probe = m.insert_instruction(m.instructions[m.instructions.index(first) + 1], HostSyncProbe(), [first])
    for c in list(first.outputs):
        if c is not probe:
            c.inputs = [probe if i is first else i for i in c.inputs]
            probe.outputs.append(c)
    first.outputs = [probe]
    return prog


def test_failed_capture_falls_back_with_identical_output(target, capfd):
    model = chain_model(9)
    x = R.normal(size=(3, 4)).astype(np.float32)
    eager = _with_probe(mgx_graph.parse_onnx(model)).compile(target, hip_graph=False)
    graph = _with_probe(mgx_graph.parse_onnx(model)).compile(target, hip_graph=True, debug=True)
    assert "graph_launch" in graph.print()
    want = eager.run({"x": x})[0]
    for _ in range(6):
        got = graph.run({"x": x})[0]
        assert got.tobytes() == want.tobytes()
    err = capfd.readouterr().err
    events = trace_events(err)
    assert events[:4] == ["WARMUP", "WARMUP", "FALLBACK", "EAGER"]
    assert "CAPTURE" not in events and "REPLAY" not in events
    assert re.search(r"FALLBACK .*reason=.*(Synchronize|capturing|CaptureUnsupported)", err)
    st = graph.stats()
    assert st["fallbacks"] == 1 and st["captures"] == 0
    assert st["regions"][0]["failed_keys"]
    # the queue is usable afterwards: a fresh program captures fine on the same target
    ok = mgx_graph.compile(model, target=target, hip_graph=True)
    for _ in range(3):
        ok.run({"x": x})
    assert ok.stats()["captures"] == 1


def test_allocation_inside_capture_falls_back(target, capfd):
    """An instruction that allocates device memory when launched: the capture fails cleanly."""

    @register_op
    class AllocProbe(HostSyncProbe):
        name = "test_alloc_probe"

        def on_launch(self, ctx, queue):
            ptr = ctx.runtime.hipMalloc(64)
            ctx.runtime.hipFree(ptr)

    model = chain_model(9)
    prog = mgx_graph.parse_onnx(model)
    m = prog.get_main_module()
    first = next(i for i in m.instructions if not i.op.builtin)
    probe = m.insert_instruction(m.instructions[m.instructions.index(first) + 1], AllocProbe(), [first])
    for c in list(first.outputs):
        if c is not probe:
            c.inputs = [probe if i is first else i for i in c.inputs]
            probe.outputs.append(c)
    first.outputs = [probe]
    prog.compile(target, hip_graph=True, debug=True)
    x = R.normal(size=(3, 4)).astype(np.float32)
    outs = [prog.run({"x": x})[0] for _ in range(4)]
    assert all(o.tobytes() == outs[0].tobytes() for o in outs)
    assert "FALLBACK" in capfd.readouterr().err
    assert prog.stats()["fallbacks"] == 1


# -- env switch ----------------------------------------------------------------------------------------
def test_env_off_is_the_eager_path_byte_identical(target, monkeypatch):
    monkeypatch.delenv("MIGRAPHX_HIP_GRAPH", raising=False)
    model = chain_model(9)
    x = R.normal(size=(3, 4)).astype(np.float32)
    env_off = mgx_graph.compile(model, target=target)  # hip_graph=None reads the env
    plain = mgx_graph.compile(model, target=target, hip_graph=False)
    assert "graph_launch" not in env_off.print()
    assert env_off.print() == plain.print()
    for _ in range(4):
        assert env_off.run({"x": x})[0].tobytes() == plain.run({"x": x})[0].tobytes()
    assert env_off.stats()["regions"] == []


@pytest.mark.parametrize("value,on", [("1", True), ("enable", True), ("enabled", True), ("yes", True),
                                      ("TRUE", True), ("0", False), ("no", False), ("", False)])
def test_env_values(monkeypatch, value, on):
    monkeypatch.setenv("MIGRAPHX_HIP_GRAPH", value)
    prog = mgx_graph.compile(chain_model(), target="ref")
    assert ("graph_launch" in prog.print()) is on


def test_env_is_read_once(monkeypatch):
    monkeypatch.setenv("MIGRAPHX_HIP_GRAPH", "1")
    assert mgx_graph.hip_graph_from_env()
    monkeypatch.setenv("MIGRAPHX_HIP_GRAPH", "0")
    assert mgx_graph.hip_graph_from_env()  # cached, as MIGraphX does
    assert "MIGRAPHX_HIP_GRAPH" in env.get_all_envs()


def test_graph_on_matches_graph_off_bitwise(target):
    model = chain_model(9)
    x = R.normal(size=(3, 4)).astype(np.float32)
    a = mgx_graph.compile(model, target=target, hip_graph=True)
    b = mgx_graph.compile(model, target=target, hip_graph=False)
    for _ in range(5):
        assert a.run({"x": x})[0].tobytes() == b.run({"x": x})[0].tobytes()


# -- state updated in place ------------------------------------------------------------------------------
def counter_model():
    """state_out = state_in + 1 (bound in place), y = tanh(state_out) * 2 + 1."""
    nodes = [helper.make_node("Add", ["state_in", "one"], ["state_out"]),
             helper.make_node("Tanh", ["state_out"], ["t"]),
             helper.make_node("Mul", ["t", "two"], ["m"]),
             helper.make_node("Add", ["m", "one"], ["a"]),
             helper.make_node("Neg", ["a"], ["y"])]
    return make_model(nodes, {"state_in": np.zeros((2, 3), np.float32)}, ["y", "state_out"],
                      {"one": np.ones((1,), np.float32), "two": np.full((1,), 2.0, np.float32)})


def test_state_advances_once_per_call(target, capfd):
    """Warmup runs are the user's calls: after N calls the in-place state holds exactly N."""
    prog = mgx_graph.compile(counter_model(), target=target, hip_graph=True, alias={"state_out": "state_in"},
                             debug=True)
    assert prog.alias == {"state_out": "state_in"}
    xp = prog.context.xp
    state = xp.zeros((2, 3), np.float32)
    for n in range(1, 8):
        outs = prog.run_async({"state_in": state})
        host = prog.context.to_host(state, prog.queue)
        assert np.all(host == n), (n, host)
        np.testing.assert_allclose(prog.context.to_host(outs[0], prog.queue), -(np.tanh(n) * 2 + 1), rtol=1e-6)
    assert trace_events(capfd.readouterr().err) == ["WARMUP", "WARMUP", "CAPTURE"] + ["REPLAY"] * 4


def test_alias_rejects_a_late_reader():
    """Binding state_out onto state_in is illegal when state_in is read after the write."""
    nodes = [helper.make_node("Add", ["state_in", "one"], ["state_out"]),
             helper.make_node("Mul", ["state_in", "state_out"], ["y"])]
    model = make_model(nodes, {"state_in": np.zeros((2,), np.float32)}, ["y", "state_out"],
                       {"one": np.ones((1,), np.float32)})
    with pytest.raises(mgx_graph.CompileError, match="read by mul after add"):
        mgx_graph.compile(model, target="ref", alias={"state_out": "state_in"})
    prog = mgx_graph.compile(model, target="ref")  # auto-detection finds no such pair: nothing bound
    assert prog.alias == {}
