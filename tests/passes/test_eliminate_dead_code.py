"""eliminate_dead_code on hand-built programs: what is removed, what stays."""
import numpy as np

from mgx_graph import Program
from mgx_graph.passes import EliminateDeadCode

from irtools import S, assert_same_ir, op, run_pass


def test_removes_unused_chain_keeps_every_parameter():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 4))
    m.add_parameter("z", S("float32", 2))
    a = m.add_instruction(op("neg"), [x])
    m.add_instruction(op("abs"), [a])  # dead, and makes ``a`` dead once removed
    t = m.add_instruction(op("tanh"), [x])
    m.add_return([t])

    want = Program()
    w = want.get_main_module()
    wx = w.add_parameter("x", S("float32", 4))
    w.add_parameter("z", S("float32", 2))
    w.add_return([w.add_instruction(op("tanh"), [wx])])

    assert_same_ir(run_pass(EliminateDeadCode(), prog), want)
    assert prog.get_parameter_names() == ["x", "z"]


def test_keeps_instructions_with_side_effects():
    """A guard nobody reads stays: it checks a run-time value."""
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("int64", 1))
    m.add_instruction(op("guard", key="n", fn="value", expected=np.array([3])), [x])
    m.add_instruction(op("neg"), [x])
    m.add_return([x])

    want = Program()
    w = want.get_main_module()
    wx = w.add_parameter("x", S("int64", 1))
    w.add_instruction(op("guard", key="n", fn="value", expected=np.array([3])), [wx])
    w.add_return([wx])

    assert_same_ir(run_pass(EliminateDeadCode(), prog), want)


def _if_program(use_result: bool):
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 3))
    c = m.add_parameter("c", S("bool", 1))
    then, other = prog.create_module("then"), prog.create_module("else")
    then.add_instruction(op("exp"), [x])  # dead inside the branch
    then.add_return([then.add_instruction(op("neg"), [x])])
    other.add_return([other.add_instruction(op("abs"), [x])])
    r = m.add_instruction(op("if"), [c], [then, other])
    m.add_return([r if use_result else x])
    return prog


def test_drops_modules_no_instruction_runs():
    prog = run_pass(EliminateDeadCode(), _if_program(use_result=False))
    want = Program()
    w = want.get_main_module()
    wx = w.add_parameter("x", S("float32", 3))
    w.add_parameter("c", S("bool", 1))
    w.add_return([wx])
    assert_same_ir(prog, want)
    assert list(prog.modules) == ["main"]


def test_cleans_inside_live_submodules():
    prog = run_pass(EliminateDeadCode(), _if_program(use_result=True))
    want = Program()
    w = want.get_main_module()
    wx = w.add_parameter("x", S("float32", 3))
    wc = w.add_parameter("c", S("bool", 1))
    then, other = want.create_module("then"), want.create_module("else")
    then.add_return([then.add_instruction(op("neg"), [wx])])
    other.add_return([other.add_instruction(op("abs"), [wx])])
    w.add_return([w.add_instruction(op("if"), [wc], [then, other])])
    assert_same_ir(prog, want)
    assert sorted(prog.modules) == ["else", "main", "then"]


def test_a_clean_program_is_unchanged():
    prog = _if_program(use_result=True)
    run_pass(EliminateDeadCode(), prog)
    before = prog.print()
    run_pass(EliminateDeadCode(), prog)
    assert prog.print() == before


def test_outer_value_read_only_by_a_dropped_module_goes_too():
    """``a`` is read only inside the branches of an ``if`` whose result nobody uses: dropping the
    branches leaves ``a`` dead, and no consumer list still names their instructions."""
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 3))
    c = m.add_parameter("c", S("bool", 1))
    a = m.add_instruction(op("sqrt"), [x])
    then, other = prog.create_module("then"), prog.create_module("else")
    then.add_return([then.add_instruction(op("neg"), [a])])
    other.add_return([other.add_instruction(op("abs"), [a])])
    m.add_instruction(op("if"), [c], [then, other])
    m.add_return([x])

    want = Program()
    w = want.get_main_module()
    wx = w.add_parameter("x", S("float32", 3))
    w.add_parameter("c", S("bool", 1))
    w.add_return([wx])
    assert_same_ir(run_pass(EliminateDeadCode(), prog), want)
    assert x.outputs == [m.get_return()]
