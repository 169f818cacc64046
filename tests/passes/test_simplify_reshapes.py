"""simplify_reshapes on hand-built programs: view chains get shorter, results keep their layout."""
import numpy as np

from mgx_graph import Program
from mgx_graph.passes import SimplifyReshapes

from irtools import S, assert_same_ir, op, run_pass


def _main(*shapes):
    prog = Program()
    m = prog.get_main_module()
    return prog, m, [m.add_parameter(f"x{k}", s) for k, s in enumerate(shapes)]


def test_identity_views_are_removed():
    prog, m, (x,) = _main(S("float32", 2, 3))
    t = m.add_instruction(op("transpose", permutation=[0, 1]), [x])
    r = m.add_instruction(op("reshape", dims=[2, 3]), [t])
    m.add_return([m.add_instruction(op("neg"), [r])])

    want, w, (wx,) = _main(S("float32", 2, 3))
    w.add_return([w.add_instruction(op("neg"), [wx])])
    assert_same_ir(run_pass(SimplifyReshapes(), prog), want)


def test_transpose_pairs_compose():
    prog, m, (x, y) = _main(S("float32", 2, 3, 4), S("float32", 2, 3, 4))
    a = m.add_instruction(op("transpose", permutation=[1, 0, 2]), [x])
    a = m.add_instruction(op("transpose", permutation=[1, 0, 2]), [a])  # cancels: x itself
    b = m.add_instruction(op("transpose", permutation=[2, 0, 1]), [y])
    b = m.add_instruction(op("transpose", permutation=[0, 2, 1]), [b])  # one transpose [2, 1, 0]
    m.add_return([m.add_instruction(op("neg"), [a]), m.add_instruction(op("abs"), [b])])

    want, w, (wx, wy) = _main(S("float32", 2, 3, 4), S("float32", 2, 3, 4))
    wb = w.add_instruction(op("transpose", permutation=[2, 1, 0]), [wy])
    w.add_return([w.add_instruction(op("neg"), [wx]), w.add_instruction(op("abs"), [wb])])
    assert_same_ir(run_pass(SimplifyReshapes(), prog), want)
    assert tuple(w.instructions[2].shape.lens) == (4, 3, 2)


def test_reshape_chain_becomes_one_reshape():
    prog, m, (x,) = _main(S("float32", 2, 3, 4))
    u = m.add_instruction(op("unsqueeze", axes=[0]), [x])
    r = m.add_instruction(op("reshape", dims=[1, 6, 4]), [u])
    q = m.add_instruction(op("squeeze", axes=[0]), [r])
    m.add_return([m.add_instruction(op("neg"), [q])])

    want, w, (wx,) = _main(S("float32", 2, 3, 4))
    wr = w.add_instruction(op("reshape", dims=[6, 4]), [wx])
    w.add_return([w.add_instruction(op("neg"), [wr])])
    assert_same_ir(run_pass(SimplifyReshapes(), prog), want)


def test_a_transpose_read_twice_stays_and_squeeze_unsqueeze_cancels_on_a_strided_view():
    """``t`` is read by ``t2`` and by @return, so the pair is not composed; squeeze(unsqueeze(tr))
    of the transposed (strided) ``tr`` keeps its layout, so it goes."""
    prog, m, (x, y) = _main(S("float32", 2, 3), S("float32", 2, 3))
    t = m.add_instruction(op("transpose", permutation=[1, 0]), [x])
    t2 = m.add_instruction(op("transpose", permutation=[1, 0]), [t])
    tr = m.add_instruction(op("transpose", permutation=[1, 0]), [y])   # (3, 2), strides (1, 3)
    u = m.add_instruction(op("unsqueeze", axes=[0]), [tr])
    r = m.add_instruction(op("squeeze", axes=[0]), [u])  # squeeze(unsqueeze) of a transposed view
    m.add_return([t, t2, r])
    before = prog.print()
    run_pass(SimplifyReshapes(), prog)
    # the unsqueeze/squeeze pair cancels into an identity reshape of ``tr``, which is then removed
    want, w, (wx, wy) = _main(S("float32", 2, 3), S("float32", 2, 3))
    wt = w.add_instruction(op("transpose", permutation=[1, 0]), [wx])
    wt2 = w.add_instruction(op("transpose", permutation=[1, 0]), [wt])
    wtr = w.add_instruction(op("transpose", permutation=[1, 0]), [wy])
    w.add_return([wt, wt2, wtr])
    assert prog.print() != before
    assert_same_ir(prog, want)


def test_guard_and_tuple_views_are_left_alone():
    prog, m, (x,) = _main(S("int64", 1))
    g = m.add_instruction(op("guard", key="n", fn="value", expected=np.array([2])), [x])
    m.add_return([m.add_instruction(op("neg"), [g])])
    before = prog.print()
    run_pass(SimplifyReshapes(), prog)
    assert prog.print() == before
