"""propagate_constant on hand-built programs; folded values checked against numpy."""
import numpy as np

from mgx_graph import Program
from mgx_graph.passes import PropagateConstant

from irtools import S, assert_same_ir, lit, op, run_pass

A = np.array([1.0, 2.0, 3.0], np.float32)
B = np.array([0.5, -1.0, 4.0], np.float32)


def _literals(m):
    return [i.op.value for i in m.instructions if i.op.name == "@literal"]


def test_folds_a_literal_expression_in_place():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 3))
    a, b = lit(m, A), lit(m, B)
    s = m.add_instruction(op("mul"), [a, b])
    m.add_return([m.add_instruction(op("add"), [x, s])])

    want = Program()
    w = want.get_main_module()
    wx = w.add_parameter("x", S("float32", 3))
    lit(w, A), lit(w, B)
    folded = lit(w, A * B)  # where the mul was; its inputs stay for dead-code elimination
    w.add_return([w.add_instruction(op("add"), [wx, folded])])

    assert_same_ir(run_pass(PropagateConstant(), prog), want)
    np.testing.assert_array_equal(_literals(m)[2], A * B)


def test_folds_chains_in_one_pass():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 3))
    n = m.add_instruction(op("neg"), [lit(m, A)])
    e = m.add_instruction(op("exp"), [n])
    s = m.add_instruction(op("sub"), [e, lit(m, B)])
    m.add_return([m.add_instruction(op("mul"), [x, s])])
    run_pass(PropagateConstant(), prog)

    want_value = np.exp(-A) - B
    want = Program()
    w = want.get_main_module()
    wx = w.add_parameter("x", S("float32", 3))
    lit(w, A), lit(w, -A), lit(w, np.exp(-A)), lit(w, B), lit(w, want_value)
    w.add_return([w.add_instruction(op("mul"), [wx, w.instructions[-1]])])
    assert_same_ir(prog, want)
    np.testing.assert_allclose(_literals(m)[-1], want_value, rtol=1e-6)


def test_leaves_what_reads_a_parameter_or_is_not_foldable():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 3))
    a = lit(m, A)
    y = m.add_instruction(op("add"), [x, a])
    host = m.add_instruction(op("copy_from_gpu"), [a])  # literal input, but a host copy is never folded
    m.add_return([y, host])
    before = prog.print()
    run_pass(PropagateConstant(), prog)
    assert prog.print() == before


def test_keeps_a_large_broadcast_unfolded():
    """A broadcast of one value to 64x128 would make a literal 8192 times larger: not folded."""
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 64, 128))
    b = m.add_instruction(op("multibroadcast", out_lens=[64, 128]), [lit(m, [2.0])])
    m.add_return([m.add_instruction(op("mul"), [x, b])])
    before = prog.print()
    run_pass(PropagateConstant(), prog)
    assert prog.print() == before


def test_folds_inside_submodules():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 3))
    c = m.add_parameter("c", S("bool", 1))
    then, other = prog.create_module("then"), prog.create_module("else")
    k = then.add_instruction(op("sqrt"), [lit(then, [4.0, 9.0, 16.0])])
    then.add_return([then.add_instruction(op("mul"), [x, k])])
    other.add_return([other.add_instruction(op("neg"), [x])])
    m.add_return([m.add_instruction(op("if"), [c], [then, other])])
    run_pass(PropagateConstant(), prog)

    want = Program()
    w = want.get_main_module()
    wx = w.add_parameter("x", S("float32", 3))
    wc = w.add_parameter("c", S("bool", 1))
    wt, we = want.create_module("then"), want.create_module("else")
    lit(wt, [4.0, 9.0, 16.0])
    wt.add_return([wt.add_instruction(op("mul"), [wx, lit(wt, [2.0, 3.0, 4.0])])])
    we.add_return([we.add_instruction(op("neg"), [wx])])
    w.add_return([w.add_instruction(op("if"), [wc], [wt, we])])
    assert_same_ir(prog, want)
