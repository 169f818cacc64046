"""The pass manager: validation after every pass names the pass and the instruction; MIGRAPHX_TIME_PASSES,
MIGRAPHX_TRACE_COMPILE, MIGRAPHX_DISABLE_PASSES and MIGRAPHX_DISABLE_VALIDATE_PASSES; the target pipelines."""
import re

import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph import CompileError, Program, ShapeError, settings
from mgx_graph.ir import Instruction
from mgx_graph.passes import (EliminateDeadCode, InvalidProgram, Pass, PassGroup, PassManager, PipelineOptions,
                              validate_program)
from mgx_graph.targets import pipeline

from irtools import S, op
from util import make_model, ort_run

F = S("float32", 4)


class FnPass(Pass):
    def __init__(self, name, fn):
        self.name, self.fn = name, fn

    def apply(self, program, ctx):
        self.fn(program)


def _program():
    """x -> neg (@1) -> tanh (@2) -> @return; a then/else pair runs on c at @4 reading @1."""
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", F)
    c = m.add_parameter("c", S("bool", 1))
    a = m.add_instruction(op("neg"), [x])
    b = m.add_instruction(op("tanh"), [a])
    then, other = prog.create_module("then"), prog.create_module("else")
    then.add_return([then.add_instruction(op("abs"), [a])])
    other.add_return([other.add_instruction(op("sqrt"), [a])])
    r = m.add_instruction(op("if"), [c], [then, other])
    m.add_return([b, r])
    return prog, m, dict(x=x, c=c, a=a, b=b, r=r, then=then)


def _run_broken(name, fn):
    prog, m, ins = _program()
    validate_program(prog)  # valid before the pass
    with pytest.raises(InvalidProgram) as e:
        PassManager([EliminateDeadCode(), FnPass(name, lambda p: fn(p, m, ins))]).run(prog)
    assert e.value.pass_name == name
    return str(e.value)


def test_input_used_before_its_definition():
    msg = _run_broken("reorder", lambda p, m, i: m.move_instruction(i["b"], i["a"]))
    assert msg == ("pass 'reorder' produced an invalid program: module 'main', instruction @2 (tanh): "
                   "reads @3 (neg), which is defined after it")


def test_wrong_shape():
    def f(p, m, i):
        i["a"].shape = S("float32", 5)
    msg = _run_broken("reshape_wrongly", f)
    assert "pass 'reshape_wrongly'" in msg and "instruction @2 (neg)" in msg
    assert "has shape float_type, {5}, {1} but compute_shape gives float_type, {4}, {1}" in msg


def test_missing_submodule():
    msg = _run_broken("drop_branch", lambda p, m, i: p.remove_module("then"))
    assert "pass 'drop_branch'" in msg and "instruction @4 (if): runs module 'then', which is not in the program" in msg


def test_removed_instruction_still_referenced():
    def f(p, m, i):  # removed as remove_instruction would, but tanh still reads it
        i["a"].outputs = []
        m.remove_instruction(i["a"])
    msg = _run_broken("forget", f)
    assert "pass 'forget'" in msg and "instruction @2 (tanh): reads neg, which was removed" in msg


def test_dangling_consumer():
    def f(p, m, i):
        d = m.insert_instruction(i["b"], op("exp"), [i["x"]])
        m.instructions.remove(d)  # off the list, still on x's consumers
    msg = _run_broken("half_remove", f)
    assert "instruction x (@param:x): lists exp as a consumer, which was removed" in msg


def test_missing_return():
    msg = _run_broken("no_return", lambda p, m, i: m.instructions.pop())
    assert msg == "pass 'no_return' produced an invalid program: module 'main': has no @return as its last instruction"


def test_outer_value_defined_after_the_instruction_that_runs_the_branch():
    msg = _run_broken("late_outer", lambda p, m, i: m.move_instruction(i["r"], i["a"]))
    assert "module 'then', instruction @0 (abs): reads main:@3 (neg), which is not defined in an enclosing " \
           "module before the instruction that runs 'then'" in msg


def test_module_running_itself():
    def f(p, m, i):
        t = i["then"]
        loop = Instruction(op("if"), [i["c"]], [t, p.modules["else"]], i["a"].shape, t)
        i["c"].outputs.append(loop)
        t.instructions.insert(0, loop)
    msg = _run_broken("cycle", f)
    assert "module 'then', instruction @0 (if): runs module 'then', which encloses it (a cycle)" in msg


def test_an_invalid_input_program_is_reported_as_such():
    prog, m, ins = _program()
    ins["a"].shape = S("float32", 5)
    with pytest.raises(InvalidProgram, match=r"^the program given to the passes is invalid: module 'main', "
                                             r"instruction @2 \(neg\)") as e:
        PassManager([EliminateDeadCode()]).run(prog)
    assert e.value.pass_name is None and isinstance(e.value, CompileError)


def test_errors_a_pass_raises_propagate_unchanged():
    def f(p):
        raise ShapeError("bad shape in the pass itself")
    with pytest.raises(ShapeError, match="bad shape in the pass itself"):
        PassManager([FnPass("raiser", f)]).run(_program()[0])


def test_validation_can_be_turned_off(monkeypatch):
    def f(p):
        p.get_main_module().instructions.pop()
    PassManager([FnPass("no_return", f)], validate=False).run(_program()[0])
    monkeypatch.setenv("MIGRAPHX_DISABLE_VALIDATE_PASSES", "1")
    settings.reset()  # the table is read once per process, all variables at once
    PassManager([FnPass("no_return", f)]).run(_program()[0])


def test_validation_catches_an_attribute_changed_without_a_new_shape():
    """An op replaced in place (new op object, same instruction) is shape-checked again."""
    def f(p):
        a = [i for i in p.get_main_module() if i.op.name == "neg"][0]
        a.op = op("convert", target_type="float16")
    prog = _program()[0]
    with pytest.raises(InvalidProgram, match="pass 'retype'.*@2 \\(convert"):
        PassManager([EliminateDeadCode(), FnPass("retype", f)]).run(prog)


# -- environment variables --------------------------------------------------------------------------------
def _rms_model():
    nodes = [helper.make_node("Pow", ["x", "two"], ["p"]),
             helper.make_node("ReduceMean", ["p", "ax"], ["mean"], keepdims=1),
             helper.make_node("Add", ["mean", "eps"], ["a"]), helper.make_node("Sqrt", ["a"], ["s"]),
             helper.make_node("Reciprocal", ["s"], ["r"]), helper.make_node("Mul", ["x", "r"], ["y0"]),
             helper.make_node("Tanh", ["y0"], ["t1"]), helper.make_node("Neg", ["t1"], ["t2"]),
             helper.make_node("Tanh", ["t2"], ["t3"]), helper.make_node("Neg", ["t3"], ["y"])]
    init = {"two": np.array(2.0, np.float32), "ax": np.array([-1], np.int64), "eps": np.array(1e-5, np.float32)}
    return make_model(nodes, {"x": np.zeros((2, 8), np.float32)}, ["y"], init)


X = np.random.default_rng(5).normal(size=(2, 8)).astype(np.float32)
DEFAULT_REF = ["eliminate_dead_code", "propagate_constant", "simplify_reshapes", "fuse_norms",
               "eliminate_dead_code", "merge_dots", "fuse_attention", "fuse_reduce", "fuse_pointwise",
               "fuse_scatternd", "fuse_horizontal", "fuse_rotary_kv", "eliminate_dead_code", "fuse_gemv",
               "bind_outputs", "lowering", "memory_coloring"]


def _in_order(got, want):
    """``got`` restricted to the names in ``want``: the passes listed here keep their order, and a pass
    added to the pipeline (one line in mgx_graph/targets/pipeline.py) needs no edit of these lists."""
    return [n for n in got if n in set(want)]


def _check_values(prog):
    np.testing.assert_allclose(prog.run({"x": X})[0], ort_run(_rms_model(), {"x": X})[0], rtol=1e-5, atol=1e-6)


def test_time_passes_prints_each_pass_then_validation(monkeypatch, capfd):
    monkeypatch.setenv("MIGRAPHX_TIME_PASSES", "1")
    mgx_graph.compile(_rms_model(), target="ref", hip_graph=True)
    err = capfd.readouterr().err.splitlines()
    timed = [re.fullmatch(r"Pass (\w+): [0-9.]+ms", ln) for ln in err]
    want = DEFAULT_REF[:-1] + ["hip_graph", "memory_coloring"]
    assert _in_order([t.group(1) for t in timed if t], want) == want
    assert re.fullmatch(r"Validation: [0-9.]+ms", [ln for ln in err if ln][-1])


def test_trace_compile_prints_the_program_after_each_pass(monkeypatch, capfd):
    monkeypatch.setenv("MIGRAPHX_TRACE_COMPILE", "1")
    prog = mgx_graph.compile(_rms_model(), target="ref", hip_graph=False)
    err = capfd.readouterr().err
    blocks = re.split(r"^Pass: (\w+)\n", err, flags=re.M)[1:]
    names, texts = blocks[0::2], blocks[1::2]
    assert _in_order(names, DEFAULT_REF) == DEFAULT_REF
    assert "rms_norm" not in texts[names.index("simplify_reshapes")]
    assert "rms_norm" in texts[names.index("fuse_norms")]
    assert texts[-1].strip() == prog.print().strip()


def test_disable_passes_skips_a_pass(monkeypatch, capfd):
    monkeypatch.setenv("MIGRAPHX_DISABLE_PASSES", "fuse_norms")
    monkeypatch.setenv("MIGRAPHX_TIME_PASSES", "1")
    prog = mgx_graph.compile(_rms_model(), target="ref")
    assert "rms_norm" not in prog.print() and "reduce_mean" in prog.print()
    err = capfd.readouterr().err
    assert "Pass fuse_norms: skipped (MIGRAPHX_DISABLE_PASSES)" in err
    assert not re.search(r"^Pass fuse_norms: [0-9.]+ms", err, flags=re.M)
    _check_values(prog)


def test_disable_passes_skips_a_group(monkeypatch):
    monkeypatch.setenv("MIGRAPHX_DISABLE_PASSES", " Graph , simplify")
    prog = mgx_graph.compile(_rms_model(), target="ref", hip_graph=True)
    assert not [n for n in prog.modules if "graph_launch" in n]
    _check_values(prog)
    assert prog.stats()["captures"] == 0


@pytest.mark.parametrize("value, message", [
    ("fuse_norm", r"unknown pass or group 'fuse_norm'"),
    ("lowering", r"pass 'lowering' \(group 'lower'\) cannot be disabled"),
    ("memory", r"pass 'memory_coloring' \(group 'memory'\) cannot be disabled"),
])
def test_disable_passes_refuses_unknown_and_required_names(monkeypatch, value, message):
    monkeypatch.setenv("MIGRAPHX_DISABLE_PASSES", value)
    with pytest.raises(CompileError, match=message):
        mgx_graph.compile(_rms_model(), target="ref")


def test_without_disabled_passes_the_norm_is_fused_and_values_match():
    prog = mgx_graph.compile(_rms_model(), target="ref")
    assert "rms_norm" in prog.print()
    _check_values(prog)


# -- pipelines --------------------------------------------------------------------------------------------
def _names(groups, want=None):
    """(group, passes) of the enabled groups; with ``want`` (such a list), each group's passes restricted
    to those ``want`` lists for it (:func:`_in_order`)."""
    got = [(g.name, [p.name for p in g.passes]) for g in groups if g.enabled]
    if want is None:
        return got
    listed = dict(want)
    return [(g, _in_order(ps, listed.get(g, []))) for g, ps in got]


@pytest.mark.parametrize("tname", ["ref", "gpu"], ids=["ref-pipeline", "gpu-pipeline"])
def test_options_select_groups(tname):
    layout = [("layout", ["gemv_layout", "fuse_gemv"])] if tname == "gpu" else [("gemv", ["fuse_gemv"])]
    want = [
        ("simplify", ["eliminate_dead_code", "propagate_constant", "simplify_reshapes"]),
        ("fuse", ["fuse_norms", "eliminate_dead_code"]),
        ("fuse_kernels", ["merge_dots", "fuse_attention", "fuse_reduce", "fuse_pointwise", "fuse_scatternd",
                          "fuse_horizontal", "fuse_rotary_kv",
                          "eliminate_dead_code"]), *layout,
        ("outputs", ["bind_outputs"]),
        ("lower", ["lowering"]), ("memory", ["memory_coloring"])]
    assert _names(pipeline(tname, PipelineOptions()), want) == want
    full = pipeline(tname, PipelineOptions(fp16=True, hip_graph=True, alias={"present": "past"},
                                           host_ops=("erf",), min_partition_size=7))
    assert [g for g, _ in _names(full)] == ["simplify", "fuse", "precision", "fuse_kernels", *[g for g, _ in layout],
                                            "outputs", "lower", "graph", "memory"]
    by_name = {p.name: p for g in full for p in g.passes}
    assert by_name["lowering"].target == tname and by_name["lowering"].host_ops == {"erf"}
    assert by_name["hip_graph"].min_partition_size == 7
    assert by_name["bind_outputs"].alias == {"present": "past"}
    assert [p.name for p in full[2].passes] == ["quantize_fp16", "propagate_constant"]


def test_scheduled_and_find_follow_disabled_names():
    groups = pipeline("ref", PipelineOptions(hip_graph=True))
    pm = PassManager(groups, disabled={"fuse", "propagate_constant"})
    want = ["eliminate_dead_code", "simplify_reshapes", "merge_dots", "fuse_attention", "fuse_reduce",
            "fuse_pointwise", "fuse_scatternd", "fuse_horizontal", "fuse_rotary_kv", "eliminate_dead_code",
            "fuse_gemv", "bind_outputs", "lowering", "hip_graph", "memory_coloring"]
    assert _in_order([p.name for _, p in pm.scheduled()], want) == want
    assert pm.find("fuse_norms") is None and pm.find("hip_graph") is groups[7].passes[0]
    assert [p.name for _, p in pm.skipped()] == ["propagate_constant", "fuse_norms", "eliminate_dead_code"]


def test_bare_passes_and_groups_both_run():
    seen = []
    pm = PassManager([FnPass("one", lambda p: seen.append(1)),
                      PassGroup("g", [FnPass("two", lambda p: seen.append(2))]),
                      PassGroup("off", [FnPass("three", lambda p: seen.append(3))], enabled=False)])
    pm.run(_program()[0])
    assert seen == [1, 2]
