"""memory_coloring on hand-built, lowered programs: the IR is unchanged and the plan (offsets,
arena and literal bytes) is the one worked out by hand from the liveness rules (256-byte alignment,
first fit by ascending start)."""
import numpy as np

from mgx_graph import Program
from mgx_graph.passes import Lowering, MemoryColoring, PassContext

from irtools import S, lit, op, run_pass


def _plan(prog):
    run_pass(Lowering("ref"), prog)
    before = prog.print()
    ctx = PassContext("ref")
    run_pass(MemoryColoring(), prog, ctx=ctx)
    assert prog.print() == before  # the pass only plans
    return ctx.result.memory_plan


def test_a_chain_reuses_the_buffer_freed_two_steps_back():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 4))
    a = m.add_instruction(op("neg"), [x])    # position 1, read at 2
    b = m.add_instruction(op("tanh"), [a])   # position 2, read at 3
    c = m.add_instruction(op("neg"), [b])    # position 3, an output: lives to the end
    m.add_return([c])
    plan = _plan(prog)
    assert plan.offsets == {(id(a), None): 0, (id(b), None): 256, (id(c), None): 0}
    assert plan.arena_bytes == 512 and plan.literal_bytes == 0


def test_a_view_keeps_its_buffer_alive():
    """``t`` views ``a`` and is read at position 4, so ``a`` lives to 4 and ``b`` cannot take its bytes."""
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 2, 2))
    a = m.add_instruction(op("neg"), [x])
    t = m.add_instruction(op("transpose", permutation=[1, 0]), [a])
    b = m.add_instruction(op("tanh"), [x])
    c = m.add_instruction(op("add"), [t, b])
    m.add_return([c])
    plan = _plan(prog)
    assert plan.offsets == {(id(a), None): 0, (id(b), None): 256, (id(c), None): 512}
    assert plan.arena_bytes == 768


def test_literals_go_to_their_own_area():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 100))
    small = lit(m, [1.0, 2.0, 3.0, 4.0])
    big = lit(m, np.arange(100, dtype=np.float32))
    s = m.add_instruction(op("add"), [x, big])         # 400 bytes, an output
    n = m.add_instruction(op("neg"), [small])          # read by the mul
    p = m.add_instruction(op("mul"), [n, small])       # an output
    m.add_return([s, p])
    plan = _plan(prog)
    assert plan.literal_offsets == {id(small): 0, id(big): 256}
    assert plan.literal_bytes == 256 + 512  # 16 bytes and 400 bytes, each rounded up to 256
    # literals take no arena bytes: s [0, 512), then n and p, alive together, after it
    assert plan.offsets == {(id(s), None): 0, (id(n), None): 512, (id(p), None): 768}


def test_values_a_branch_reads_live_until_the_if_finishes():
    """``a`` is read inside the then-branch; the branch runs at the ``if``, so ``a`` lives to it and
    ``b`` (defined before the ``if``) cannot reuse its bytes."""
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 4))
    cond = m.add_parameter("c", S("bool", 1))
    a = m.add_instruction(op("neg"), [x])
    b = m.add_instruction(op("tanh"), [x])
    t, e = prog.create_module("then"), prog.create_module("else")
    ta = t.add_instruction(op("abs"), [a])
    t.add_return([ta])
    eb = e.add_instruction(op("sqrt"), [b])
    e.add_return([eb])
    r = m.add_instruction(op("if"), [cond], [t, e])
    m.add_return([r])
    plan = _plan(prog)
    offs = {k[0]: v for k, v in plan.offsets.items()}
    live = [id(a), id(b), id(ta), id(eb), id(r)]
    assert set(offs) == set(live)
    # a, b, the branch results and the if's own result all overlap in time: five distinct slots
    assert sorted(offs.values()) == [0, 256, 512, 768, 1024]
    assert plan.arena_bytes == 1280
