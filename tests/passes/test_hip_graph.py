"""hip_graph on hand-built, lowered programs, compared with the regions built by hand (as MIGraphX's
test/gpu/hipgraphify.cpp): which runs become graph_launch submodules, their parameters and returns."""
import numpy as np
import pytest

from mgx_graph import Program
from mgx_graph.passes import HipGraph, Lowering

from irtools import S, assert_same_ir, lit, op, run_pass

F = S("float32", 4)


def _unary_chain(m, x, n, first="neg"):
    ops = [first, "tanh"] if first == "neg" else [first, "neg"]
    for k in range(n):
        x = m.add_instruction(op(ops[k % 2]), [x])
    return x


def _lowered_graph(prog, **kw):
    run_pass(Lowering("ref", **kw), prog)
    return run_pass(HipGraph(), prog)


def test_a_run_of_four_kernels_becomes_one_region():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", F)
    m.add_return([_unary_chain(m, x, 4)])
    _lowered_graph(prog)

    want = Program()
    sub = want.create_module("main:graph_launch0")
    sub.add_return([_unary_chain(sub, sub.add_parameter("x0", F), 4)])
    w = want.get_main_module()
    wx = w.add_parameter("x", F)
    w.add_return([w.add_instruction(op("graph_launch"), [wx], [sub])])
    assert_same_ir(prog, want)


def test_values_read_after_the_run_are_returned_as_a_tuple():
    def body(m, x):
        a = m.add_instruction(op("neg"), [x])
        b = m.add_instruction(op("tanh"), [a])
        c = m.add_instruction(op("neg"), [b])
        return b, m.add_instruction(op("tanh"), [c])

    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", F)
    b, d = body(m, x)
    m.add_return([d, b])
    _lowered_graph(prog)

    want = Program()
    sub = want.create_module("main:graph_launch0")
    sub.add_return(list(body(sub, sub.add_parameter("x0", F))))  # run order: b, then d
    w = want.get_main_module()
    wx = w.add_parameter("x", F)
    gl = w.add_instruction(op("graph_launch"), [wx], [sub])
    wb = w.add_instruction(op("get_tuple_elem", index=0), [gl])
    wd = w.add_instruction(op("get_tuple_elem", index=1), [gl])
    w.add_return([wd, wb])
    assert_same_ir(prog, want)


def test_literals_stay_outside_and_are_passed_in():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", F)
    a = m.add_instruction(op("neg"), [x])
    k = lit(m, [2.0, 2.0, 2.0, 2.0])
    b = m.add_instruction(op("mul"), [a, k])
    m.add_return([_unary_chain(m, b, 2, first="tanh")])
    _lowered_graph(prog)

    want = Program()
    sub = want.create_module("main:graph_launch0")
    x0, x1 = sub.add_parameter("x0", F), sub.add_parameter("x1", F)
    sa = sub.add_instruction(op("neg"), [x0])
    sub.add_return([_unary_chain(sub, sub.add_instruction(op("mul"), [sa, x1]), 2, first="tanh")])
    w = want.get_main_module()
    wx = w.add_parameter("x", F)
    wk = lit(w, [2.0, 2.0, 2.0, 2.0])
    w.add_return([w.add_instruction(op("graph_launch"), [wx, wk], [sub])])
    assert_same_ir(prog, want)


def test_parameters_bind_in_sorted_name_order():
    """Eleven inputs: parameters x0..x10 in first-use order, bound by sorted name (x10 after x1)."""
    prog = Program()
    m = prog.get_main_module()
    ps = [m.add_parameter(f"p{k}", F) for k in range(11)]
    s = ps[0]
    for p in ps[1:]:
        s = m.add_instruction(op("add"), [s, p])
    m.add_return([s])
    _lowered_graph(prog)

    sorted_names = ["x0", "x1", "x10", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "x9"]
    want = Program()
    sub = want.create_module("main:graph_launch0")
    xs = {n: sub.add_parameter(n, F) for n in sorted_names}
    s = xs["x0"]
    for k in range(1, 11):
        s = sub.add_instruction(op("add"), [s, xs[f"x{k}"]])
    sub.add_return([s])
    w = want.get_main_module()
    wps = [w.add_parameter(f"p{k}", F) for k in range(11)]
    bound = [wps[int(n[1:])] for n in sorted_names]
    w.add_return([w.add_instruction(op("graph_launch"), bound, [sub])])
    assert_same_ir(prog, want)


def test_a_host_fallback_cuts_the_run_into_two_regions():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", F)
    a = _unary_chain(m, x, 4)
    e = m.add_instruction(op("erf"), [a])
    m.add_return([_unary_chain(m, e, 4)])
    _lowered_graph(prog, host_ops=("erf",))

    want = Program()
    s0 = want.create_module("main:graph_launch0")
    s0.add_return([_unary_chain(s0, s0.add_parameter("x0", F), 4)])
    s1 = want.create_module("main:graph_launch1")
    s1.add_return([_unary_chain(s1, s1.add_parameter("x0", F), 4)])
    w = want.get_main_module()
    wx = w.add_parameter("x", F)
    g0 = w.add_instruction(op("graph_launch"), [wx], [s0])
    down = w.add_instruction(op("copy_from_gpu"), [g0])
    up = w.add_instruction(op("copy_to_gpu"), [w.add_instruction(op("erf"), [down])])
    w.add_return([w.add_instruction(op("graph_launch"), [up], [s1])])
    assert_same_ir(prog, want)


def test_short_runs_stay_and_the_pass_is_idempotent():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", F)
    m.add_return([_unary_chain(m, x, 3)])  # 3 launches < min_partition_size 4
    run_pass(Lowering("ref"), prog)
    before = prog.print()
    run_pass(HipGraph(), prog)
    assert prog.print() == before
    run_pass(HipGraph(min_partition_size=3), prog)
    once = prog.print()
    assert "main:graph_launch0" in prog.modules
    run_pass(HipGraph(min_partition_size=3), prog)
    assert prog.print() == once


def test_runs_inside_a_branch_are_wrapped():
    def build(wrapped):
        prog = Program()
        m = prog.get_main_module()
        x = m.add_parameter("x", F)
        c = m.add_parameter("c", S("bool", 1))
        t, e = prog.create_module("then"), prog.create_module("else")
        if wrapped:
            sub = prog.create_module("then:graph_launch0")
            sub.add_return([_unary_chain(sub, sub.add_parameter("x0", F), 4)])
            t.add_return([t.add_instruction(op("graph_launch"), [x], [sub])])
        else:
            t.add_return([_unary_chain(t, x, 4)])  # reads the outer x
        e.add_return([e.add_instruction(op("abs"), [x])])
        m.add_return([m.add_instruction(op("if"), [c], [t, e])])
        return prog

    assert_same_ir(_lowered_graph(build(False)), build(True))


@pytest.mark.usefixtures("unfused")
def test_region_results_run_like_the_eager_chain():
    """The wrapped program computes what numpy computes for the chain (values through the executor)."""
    import mgx_graph  # noqa: F401  (registers graph_launch)
    from onnx import helper
    from util import make_model

    nodes = [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Tanh", ["a"], ["b"]),
             helper.make_node("Neg", ["b"], ["c"]), helper.make_node("Tanh", ["c"], ["y"])]
    model = make_model(nodes, {"x": np.zeros(4, np.float32)}, ["y"])
    prog = mgx_graph.compile(model, target="ref", hip_graph=True)
    assert "main:graph_launch0" in prog.modules
    x = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    for _ in range(4):
        np.testing.assert_allclose(prog.run({"x": x})[0], np.tanh(-np.tanh(-x)), rtol=1e-6)
