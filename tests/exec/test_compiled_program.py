"""One compiled-program type over static and dynamic-shape programs, one counters type behind the
stats() of both, and the typed compile result; ir.Program.compile keeps working for code that
compiles in place, and nothing is added onto the IR program by compiling or running it."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from mgx_graph import CompiledProgram, CompileError, CompileResult, GraphCounters, MgxError
from mgx_graph.compiler import compile_program
from util import ort_run

R = np.random.default_rng(23)


def _chain(dims):
    """y = tanh(-tanh(-x)) over x of ``dims`` (a str is a symbolic dim): 4 kernels, one region."""
    nodes = [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Tanh", ["a"], ["b"]),
             helper.make_node("Neg", ["b"], ["c"]), helper.make_node("Tanh", ["c"], ["y"])]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def _run(prog, model, n_rows):
    x = R.normal(size=(n_rows, 4)).astype(np.float32)
    np.testing.assert_allclose(prog.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-6, atol=1e-7)


def _counter_part(st):
    return {k: st[k] for k in GraphCounters.program_keys()}


def test_counters_are_defined_once():
    keys = GraphCounters.program_keys()
    assert "refreshes" not in keys and "disabled" not in keys  # reported per region only
    a, b = GraphCounters(captures=1, replays=4), GraphCounters(captures=2, refreshes=1)
    t = GraphCounters.total([a, b])
    assert (t.captures, t.replays, t.refreshes) == (3, 4, 1) and (a.captures, b.captures) == (1, 2)
    assert set(t.region_dict()) == set(keys) | {"refreshes", "disabled"}


def test_static_and_dynamic_stats_come_from_the_same_counters_type(target, unfused):
    static_model, dynamic_model = _chain([2, 4]), _chain(["n", 4])
    static = mgx_graph.compile(static_model, target=target, hip_graph=True)
    dynamic = mgx_graph.compile(dynamic_model, target=target, hip_graph=True, warmup=1, max_specializations=1)
    assert isinstance(static, CompiledProgram) and isinstance(dynamic, CompiledProgram)
    assert static.dispatcher is None and dynamic.dispatcher is not None
    for _ in range(4):
        _run(static, static_model, 2)
    for rows in (2, 2, 2, 3, 3):  # [2, 4]: warmup, capture, replay; [3, 4] evicts it: warmup, capture
        _run(dynamic, dynamic_model, rows)
    st_s, st_d = static.stats(), dynamic.stats()
    c_s, c_d = static.counters(), dynamic.counters()
    assert type(c_s) is GraphCounters and type(c_d) is GraphCounters
    assert _counter_part(st_s) == c_s.program_dict() and _counter_part(st_d) == c_d.program_dict()
    for k in GraphCounters.program_keys():  # a static program's totals are its regions' sums
        assert st_s[k] == sum(r[k] for r in st_s["regions"])
    assert (c_s.warmups, c_s.captures, c_s.replays, c_s.fallbacks) == (2, 1, 1, 0)
    # the evicted specialization's counts stay in the totals
    assert (c_d.warmups, c_d.captures, c_d.replays) == (2, 2, 1) and st_d["specializations"] == 1
    static.release()
    dynamic.release()


def test_the_compile_result_is_typed(target, unfused):
    model = _chain([2, 4])
    prog = mgx_graph.compile(model, target=target, hip_graph=True)
    r = prog.result
    assert isinstance(r, CompileResult)
    assert (r.target, r.hip_graph, r.fp16, r.alias, r.alias_skipped) == (target, True, False, {}, {})
    assert r.host_fallback_ops == [] and prog.host_fallback_ops is r.host_fallback_ops
    assert r.memory_plan.arena_bytes == prog.stats()["scratch_bytes"] and prog.memory_plan is r.memory_plan
    assert "main:graph_launch0" in prog.print() and str(prog) == prog.program.print()
    prog.release()


def test_program_compile_in_place_keeps_working(target):
    model = _chain([2, 4])
    ir_prog = mgx_graph.parse_onnx(model)
    assert not ir_prog.is_compiled()
    with pytest.raises(MgxError, match="not compiled"):
        ir_prog.run({"x": np.zeros((2, 4), np.float32)})
    compiled = ir_prog.compile(target, hip_graph=True)
    assert compiled is ir_prog.compiled and ir_prog.is_compiled()
    x = R.normal(size=(2, 4)).astype(np.float32)
    want = ort_run(model, {"x": x})[0]
    for _ in range(3):
        np.testing.assert_allclose(ir_prog.run({"x": x})[0], want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(compiled.run({"x": x})[0], want, rtol=1e-6, atol=1e-7)
    assert ir_prog.stats() == compiled.stats() and compiled.stats()["runs"] == 4
    assert ir_prog.queue == compiled.queue and ir_prog.context is compiled.context
    with pytest.raises(CompileError, match="already compiled"):
        ir_prog.compile(target)
    with pytest.raises(CompileError, match="already compiled"):  # a lowered program, compiled again
        compile_program(ir_prog, target)
    ir_prog.release()
    with pytest.raises(MgxError, match="released"):
        ir_prog.run({"x": x})


def test_compiling_and_running_add_no_attribute_to_the_ir_program(target):
    model = _chain([2, 4])
    ir_prog = mgx_graph.parse_onnx(model)
    before = set(vars(ir_prog))
    ir_prog.compile(target, hip_graph=True)
    for _ in range(3):
        ir_prog.run({"x": np.ones((2, 4), np.float32)})
    assert set(vars(ir_prog)) == before == {"modules", "metadata", "symbolic_inputs", "compiled"}
    ir_prog.release()


def test_a_dynamic_program_before_its_first_run(target):
    """No specialization can be compiled before a run (the shape of y depends on the value of s):
    the program says so instead of giving a context; its queue exists already, and the run and its
    outputs are on it."""
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"])]
    g = helper.make_graph(nodes, "r", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6]),
                                       helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    prog = mgx_graph.compile(model, target=target)
    assert prog.dispatcher is not None and not prog.is_compiled()
    with pytest.raises(MgxError, match="specialized at its first run"):
        prog.context
    q = prog.queue
    feeds = {"x": np.arange(6, dtype=np.float32), "s": np.array([3, 2], np.int64)}
    np.testing.assert_array_equal(prog.run(feeds)[0], ort_run(model, feeds)[0])
    assert prog.context is prog.active_executor().ctx  # the specialization that ran
    assert prog.queue == q == prog.context.queue
    prog.release()
    with pytest.raises(MgxError, match="released"):
        prog.run(feeds)
    with pytest.raises(MgxError, match="released"):
        prog.queue


@pytest.mark.parametrize("alias", ["Auto", "", "y=x"])
def test_an_alias_string_other_than_auto_is_a_parameter_error(alias):
    """alias is a dict, None or "auto": another string is refused by name, not a ValueError from dict()."""
    with pytest.raises(mgx_graph.ParameterError, match="alias must be a dict, None or 'auto'"):
        mgx_graph.compile(_chain([2, 4]), target="ref", alias=alias)
