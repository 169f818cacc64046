"""graph_launch as an operator that owns its behaviour: its state is made when the program is finalized,
its compute warms up / captures / replays its submodule through the eval loop's ``run`` callback, and
the graph key holds only the inputs the hip_graph pass recorded as movable.  ``if`` and ``loop`` run
their modules through the same callback.  Hand-built IR, the host runtime (CUDA's capture rules)."""
import numpy as np
import pytest

import mgx_graph
from mgx_graph import CompileError, Program, Shape
from mgx_graph.exec import eval_loop
from mgx_graph.exec.executor import Executor
from mgx_graph.graph.launch import GraphLaunchState
from mgx_graph.graph.cache import GraphOptions
from mgx_graph.operators import make_op
from mgx_graph.passes import HipGraph, Lowering, MemoryColoring, PassContext, validate_program
from mgx_graph.runtime import host_runtime
from mgx_graph.exec.steps import step_kind
from mgx_graph.targets import make_context
from test_control_flow import if_model, loop_model
from util import ort_run

R = np.random.default_rng(17)
F = Shape("float32", (3, 4))
HALF = np.full((3, 4), 0.5, np.float32)


def _chain_program():
    """y = tanh(tanh(-x) * 0.5): four kernels, inputs x (a parameter) and a literal."""
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", F)
    k = m.add_literal(HALF)
    a = m.add_instruction(make_op("neg"), [x])
    b = m.add_instruction(make_op("tanh"), [a])
    c = m.add_instruction(make_op("mul"), [b, k])
    m.add_return([m.add_instruction(make_op("tanh"), [c])])
    return prog


def _lower(prog):
    """lowering, hip_graph and memory_coloring alone (each checked); returns the compile result."""
    pctx = PassContext("ref")
    for p in (Lowering(), HipGraph(), MemoryColoring()):
        p.apply(prog, pctx)
        validate_program(prog)
    return pctx.result


def _graph_launch(prog):
    (gl,) = [i for i in prog.get_main_module().instructions if i.op.name == "graph_launch"]
    return gl


def _executor(prog, result, **options):
    return Executor(prog, result, make_context("ref"), options=GraphOptions(**options))


def _want(x):
    return np.tanh(np.tanh(-x) * 0.5)


def test_the_op_owns_its_state_and_counts_warmup_capture_replay():
    prog = _chain_program()
    result = _lower(prog)
    gl = _graph_launch(prog)
    assert gl.meta["movable_inputs"] == ["x0"] and gl.meta["fixed_inputs"] == ["x1"]  # the parameter, the literal
    assert getattr(gl.op, "state", None) is None  # no state before the program is finalized
    ex = _executor(prog, result, warmup=2)
    state = gl.op.state
    assert isinstance(state, GraphLaunchState) and ex.regions == [state]
    assert step_kind(gl, ex.buffers.movable) == "modules"
    x = R.normal(size=(3, 4)).astype(np.float32)
    for _ in range(5):
        np.testing.assert_allclose(ex.run({"x": x})[0], _want(x), rtol=1e-6, atol=1e-7)
    c = state.counters
    assert (c.warmups, c.captures, c.replays, c.eager_runs, c.fallbacks) == (2, 1, 2, 2, 0)
    (key, entry), = state.entries.items()
    # the host runtime launched the exec once after its capture and once per replay
    assert entry.exec.launches == 1 + c.replays
    # the key: the queue and the movable input only, at the pointer run() binds (the parameter buffer)
    assert key[0] == ex.ctx.queue and [item[0] for item in key[1]] == ["x0"]
    assert key[1][0][1:] == (ex.ctx.data_ptr(ex.param_buffers["x"]), (3, 4), "f")
    # the fixed input was bound once, at finalize: the submodule reads the literal's own array
    sub = gl.module_inputs[0]
    literal = gl.inputs[1]
    assert ex.loop.runner.value(sub.get_parameter("x1")) is ex.buffers.value(literal)
    np.testing.assert_array_equal(ex.buffers.value(literal), HALF)
    assert ex.stats()["regions"] == [state.stats()]
    ex.close()


def test_a_new_movable_pointer_is_a_new_key_and_outputs_follow_it():
    prog = _chain_program()
    ex = _executor(prog, _lower(prog), warmup=1)
    state = _graph_launch(prog).op.state
    xs = [R.normal(size=(3, 4)).astype(np.float32) for _ in range(2)]
    for x in xs + xs + xs:  # two arrays: each its own key (warmup once per queue, then capture, replay)
        out = ex.run_async({"x": x})[0]
        np.testing.assert_allclose(ex.ctx.to_host(out, ex.ctx.queue), _want(x), rtol=1e-6, atol=1e-7)
    c = state.counters
    assert (c.warmups, c.captures, c.replays) == (1, 2, 3) and len(state.entries) == 2
    ex.close()


def test_without_a_placement_record_every_input_is_movable():
    prog = _chain_program()
    result = _lower(prog)
    gl = _graph_launch(prog)
    del gl.meta["movable_inputs"], gl.meta["fixed_inputs"]
    ex = _executor(prog, result, warmup=0)
    x = R.normal(size=(3, 4)).astype(np.float32)
    for _ in range(2):
        np.testing.assert_allclose(ex.run({"x": x})[0], _want(x), rtol=1e-6, atol=1e-7)
    (key,) = gl.op.state.entries
    assert [item[0] for item in key[1]] == ["x0", "x1"]
    ex.close()


@pytest.mark.parametrize("movable, fixed, message", [
    (["x0"], [], r"input placement lists \['x0'\], the submodule .* has parameters \['x0', 'x1'\]"),
    ([], ["x0", "x1"], r"input\(s\) \['x0'\] recorded as fixed are bound per call"),
])
def test_a_wrong_placement_record_is_a_compile_error_naming_the_instruction(movable, fixed, message):
    prog = _chain_program()
    result = _lower(prog)
    gl = _graph_launch(prog)
    gl.meta["movable_inputs"], gl.meta["fixed_inputs"] = movable, fixed
    ctx = make_context("ref")
    with pytest.raises(CompileError, match=r"graph_launch main:@\d+: " + message):
        Executor(prog, result, ctx)
    ctx.close()


def test_an_op_is_finalized_once():
    prog = _chain_program()
    result = _lower(prog)
    ex = _executor(prog, result)
    ctx = make_context("ref")
    with pytest.raises(CompileError, match="finalized twice"):
        Executor(prog, result, ctx)
    ctx.close()
    ex.close()


def test_a_failed_capture_is_counted_by_the_op_state_and_the_results_stay_right():
    """A kernel that synchronizes the queue when launched: illegal while capturing (the host runtime
    invalidates the capture, as CUDA does), so the op's state falls back to eager."""
    prog = _chain_program()
    result = _lower(prog)
    gl = _graph_launch(prog)
    tanh = next(i for i in gl.module_inputs[0].instructions if i.op.name == "tanh")
    tanh.op.__dict__["on_launch"] = lambda ctx, queue: host_runtime().hipStreamSynchronize(queue)
    ex = _executor(prog, result, warmup=1)
    x = R.normal(size=(3, 4)).astype(np.float32)
    for _ in range(3):
        np.testing.assert_allclose(ex.run({"x": x})[0], _want(x), rtol=1e-6, atol=1e-7)
    c = gl.op.state.counters
    assert (c.warmups, c.captures, c.fallbacks, c.eager_runs) == (1, 0, 1, 3)
    assert "hipErrorStreamCaptureUnsupported" in next(iter(gl.op.state.failed.values())).reason
    ex.close()


@pytest.fixture
def run_calls(monkeypatch):
    """Every call of the eval loop's run callback, as (module name, capture)."""
    calls = []
    real = eval_loop.ModuleRunner.__call__

    def spy(self, module, queue, params=None, capture=False):
        calls.append((module.name, capture))
        return real(self, module, queue, params, capture)

    monkeypatch.setattr(eval_loop.ModuleRunner, "__call__", spy)
    return calls


def test_if_runs_the_branch_it_picks_through_the_run_callback(run_calls, target):
    model = if_model()
    prog = mgx_graph.compile(model, target=target, hip_graph=True, min_partition_size=2)
    (if_ins,) = [i for i in prog.get_main_module().instructions if i.op.name == "if"]
    then_m, else_m = (m.name for m in if_ins.module_inputs)
    for shift in (1.0, -1.0, 1.0, -1.0):
        x = R.normal(size=(3, 4)).astype(np.float32) + shift
        run_calls.clear()
        np.testing.assert_allclose(prog.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
        names = [n for n, _ in run_calls]
        taken, skipped = (then_m, else_m) if x.sum() > 0 else (else_m, then_m)  # numpy decides the branch
        assert names[0] == "main" and names.count(taken) == 1 and skipped not in names
    prog.release()


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_loop_runs_its_body_through_the_run_callback(run_calls, target, hip_graph, unfused):
    model = loop_model(scan=False)
    prog = mgx_graph.compile(model, target=target, hip_graph=hip_graph, min_partition_size=2)
    (loop_ins,) = [i for i in prog.get_main_module().instructions if i.op.name == "loop"]
    body = loop_ins.module_inputs[0].name
    trips = (3, 0, 5, 2)
    for m in trips:
        feeds = {"M": np.array(m, np.int64), "a0": R.normal(size=3).astype(np.float32)}
        first = len(run_calls)
        np.testing.assert_allclose(prog.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-5, atol=1e-6)
        assert [n for n, _ in run_calls[first:]].count(body) == m  # the condition stays true: M iterations
    if hip_graph:  # the region inside the body runs through the callback for its 2 warmups and its capture only
        (region,) = [n for n in prog.modules if n.startswith(body + ":graph_launch")]
        assert [cap for n, cap in run_calls if n == region] == [False, False, True]
        st = prog.stats()
        assert (st["warmups"], st["captures"], st["replays"]) == (2, 1, sum(trips) - 3)
    prog.release()
