"""The Module helpers the passes use: replace_instruction, set_inputs, run_io, move_to_submodule."""
import pytest

from mgx_graph import CompileError, Program, ShapeError
from mgx_graph.passes import validate_program

from irtools import S, assert_same_ir, op

F = S("float32", 4)


def _consumers_agree(prog):
    validate_program(prog)  # inputs and consumer lists agree both ways, shapes hold


def test_replace_instruction_moves_every_use_but_the_replacement_own():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", F)
    c = m.add_parameter("c", S("bool", 1))
    a = m.add_instruction(op("neg"), [x])
    b = m.add_instruction(op("mul"), [a, a])
    t, e = prog.create_module("then"), prog.create_module("else")
    t.add_return([t.add_instruction(op("abs"), [a])])
    e.add_return([e.add_instruction(op("sqrt"), [a])])
    r = m.add_instruction(op("if"), [c], [t, e])
    m.add_return([a, b, r])
    copy = m.insert_instruction(b, op("contiguous"), [a])  # built over a: keeps reading it
    assert m.replace_instruction(a, copy) is copy
    _consumers_agree(prog)
    assert a.outputs == [copy] and b.inputs == [copy, copy]
    assert t.instructions[0].inputs == [copy] and m.get_return().inputs[0] is copy
    with pytest.raises(ShapeError, match="still has consumers"):
        m.replace_instruction(a, copy, remove=True)


def test_replace_instruction_can_remove_the_old_one():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", F)
    a = m.add_instruction(op("neg"), [x])
    m.add_return([m.add_instruction(op("tanh"), [a])])
    m.replace_instruction(a, m.insert_instruction(a, op("abs"), [x]), remove=True)
    want = Program()
    w = want.get_main_module()
    wx = w.add_parameter("x", F)
    w.add_return([w.add_instruction(op("tanh"), [w.add_instruction(op("abs"), [wx])])])
    assert_same_ir(prog, want)
    assert a.module is None and x.outputs == [m.instructions[1]]


def test_set_inputs_keeps_consumer_lists_per_position():
    prog = Program()
    m = prog.get_main_module()
    x, y = m.add_parameter("x", F), m.add_parameter("y", F)
    a = m.add_instruction(op("mul"), [x, x])
    m.add_return([a])
    m.set_inputs(a, [x, y])  # one of the two uses of x moves to y
    assert x.outputs.count(a) == 1 and y.outputs.count(a) == 1
    m.set_inputs(a, [y, y])
    assert a not in x.outputs and y.outputs.count(a) == 2
    _consumers_agree(prog)


def _run_program():
    prog = Program()
    m = prog.get_main_module()
    x, y = m.add_parameter("x", F), m.add_parameter("y", F)
    c = m.add_parameter("c", S("bool", 1))
    a = m.add_instruction(op("add"), [x, y])
    b = m.add_instruction(op("neg"), [a])
    d = m.add_instruction(op("mul"), [b, x])
    t, e = prog.create_module("then"), prog.create_module("else")
    t.add_return([t.add_instruction(op("abs"), [b])])  # a submodule reads b from outside
    e.add_return([e.add_instruction(op("sqrt"), [x])])
    r = m.add_instruction(op("if"), [c], [t, e])
    m.add_return([d, r])
    return prog, m, [a, b, d], (x, y)


def test_run_io_lists_outside_values_and_values_read_outside():
    prog, m, run, (x, y) = _run_program()
    inputs, outputs = m.run_io(run)
    assert inputs == [x, y]          # first-use order, each once
    assert outputs == [run[1], run[2]]  # b (read by the branch) and d (returned), in run order


def test_move_to_submodule_outlines_the_run():
    prog, m, run, (x, y) = _run_program()
    sub, bound = m.move_to_submodule(run, "main:graph_launch0", op("graph_launch"))
    assert bound == {"x0": x, "x1": y} and sub is prog.modules["main:graph_launch0"]
    _consumers_agree(prog)

    want = Program()
    wm = want.get_main_module()
    wx, wy = wm.add_parameter("x", F), wm.add_parameter("y", F)
    wc = wm.add_parameter("c", S("bool", 1))
    ws = want.create_module("main:graph_launch0")
    sx, sy = ws.add_parameter("x0", F), ws.add_parameter("x1", F)
    sb = ws.add_instruction(op("neg"), [ws.add_instruction(op("add"), [sx, sy])])
    ws.add_return([sb, ws.add_instruction(op("mul"), [sb, sx])])
    gl = wm.add_instruction(op("graph_launch"), [wx, wy], [ws])
    g0 = wm.add_instruction(op("get_tuple_elem", index=0), [gl])
    g1 = wm.add_instruction(op("get_tuple_elem", index=1), [gl])
    t, e = want.create_module("then"), want.create_module("else")
    t.add_return([t.add_instruction(op("abs"), [g0])])
    e.add_return([e.add_instruction(op("sqrt"), [wx])])
    wm.add_return([g1, wm.add_instruction(op("if"), [wc], [t, e])])
    assert_same_ir(prog, want)


def test_move_to_submodule_refuses_a_run_nobody_reads():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", F)
    dead = m.add_instruction(op("neg"), [x])
    m.add_return([x])
    with pytest.raises(CompileError, match="nothing reads its results"):
        m.move_to_submodule([dead], "main:graph_launch0", op("graph_launch"))
    assert list(prog.modules) == ["main"] and dead.module is m
