"""lowering on hand-built programs: the kernel each instruction runs, host fallback copies."""
import numpy as np
import pytest

from mgx_graph import CompileError, Program
from mgx_graph.passes import Lowering, PassContext
from mgx_graph.passes.lowering import Kernel

from irtools import S, assert_same_ir, lit, op, run_pass

META = ("kernel", "on_host")


def _k(label, launches, capturable=True):
    return Kernel(None, launches, [], capturable, label)


def _chain():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 2, 3))
    n = m.add_instruction(op("neg"), [x])
    t = m.add_instruction(op("transpose", permutation=[1, 0]), [n])
    y = m.add_instruction(op("tanh"), [t])
    m.add_return([y])
    return prog, (n, t, y)


def test_ref_gives_each_compute_instruction_one_host_kernel():
    prog, _ = _chain()
    ctx = PassContext("ref")
    run_pass(Lowering("ref"), prog, ctx=ctx)
    want, (n, t, y) = _chain()
    n.meta["kernel"] = _k("host", 1)
    y.meta["kernel"] = _k("host", 1)  # the transpose is a view: no kernel
    assert_same_ir(prog, want, META)
    assert ctx.result.host_fallback_ops == []


def test_target_comes_from_the_pass_context():
    prog, (n, _, _) = _chain()
    run_pass(Lowering(), prog, target="ref")
    assert n.meta["kernel"].label == "host" and n.meta["kernel"].launches == 1


def test_host_ops_run_between_copies():
    prog, _ = _chain()
    ctx = PassContext("ref")
    run_pass(Lowering("ref", host_ops=("neg",)), prog, ctx=ctx)

    want = Program()
    w = want.get_main_module()
    x = w.add_parameter("x", S("float32", 2, 3))
    down = w.add_instruction(op("copy_from_gpu"), [x])
    n = w.add_instruction(op("neg"), [down])
    up = w.add_instruction(op("copy_to_gpu"), [n])
    t = w.add_instruction(op("transpose", permutation=[1, 0]), [up])
    y = w.add_instruction(op("tanh"), [t])
    w.add_return([y])
    down.meta["on_host"] = n.meta["on_host"] = True
    n.meta["kernel"] = _k("host fallback", 0, capturable=False)
    y.meta["kernel"] = _k("host", 1)
    assert_same_ir(prog, want, META)
    assert ctx.result.host_fallback_ops == ["neg"]


def test_a_tuple_result_on_the_host_is_copied_back_per_element():
    def build(lowered):
        prog = Program()
        m = prog.get_main_module()
        x = m.add_parameter("x", S("float32", 2, 5))
        src = m.add_instruction(op("copy_from_gpu"), [x]) if lowered else x
        tk = m.add_instruction(op("topk", k=2, axis=1), [src])
        vals = []
        for k in range(2):
            g = m.add_instruction(op("get_tuple_elem", index=k), [tk])
            if lowered:
                g.meta["on_host"] = True
                g = m.add_instruction(op("copy_to_gpu"), [g])
            vals.append(g)
        m.add_return(vals)
        if lowered:
            src.meta["on_host"] = tk.meta["on_host"] = True
            tk.meta["kernel"] = _k("host fallback", 0, capturable=False)
        return prog

    prog = run_pass(Lowering("ref", host_ops=("topk",)), build(False))
    assert_same_ir(prog, build(True), META)


def test_kernels_inside_submodules_not_for_control_flow():
    def build():
        prog = Program()
        m = prog.get_main_module()
        x = m.add_parameter("x", S("float32", 3))
        c = m.add_parameter("c", S("bool", 1))
        t, e = prog.create_module("then"), prog.create_module("else")
        tn = t.add_instruction(op("neg"), [x])
        t.add_return([tn])
        ea = e.add_instruction(op("abs"), [x])
        e.add_return([ea])
        m.add_return([m.add_instruction(op("if"), [c], [t, e])])
        return prog, tn, ea

    prog, _, _ = build()
    run_pass(Lowering("ref"), prog)
    want, tn, ea = build()
    tn.meta["kernel"] = ea.meta["kernel"] = _k("host", 1)
    assert_same_ir(prog, want, META)


def test_string_tensors_off_ref_are_refused():
    prog = Program()
    m = prog.get_main_module()
    s = lit(m, np.array(["a", "b"], dtype=object), dtype=object)
    m.add_return([m.add_instruction(op("contiguous"), [s])])
    with pytest.raises(CompileError, match="string tensors run on the ref target only"):
        Lowering("gpu").apply(prog, None)


def test_every_compute_instruction_gets_a_capturable_kernel(target):
    """On each target (gpu: CuPy / vendor BLAS kernels), a plain chain lowers without host fallback."""
    prog, (n, t, y) = _chain()
    before = prog.print()
    run_pass(Lowering(target), prog)
    assert prog.print() == before
    for ins in (n, y):
        k = ins.meta["kernel"]
        assert k.launches >= 1 and k.capturable and not ins.meta.get("on_host"), (ins, k)
    assert "kernel" not in t.meta
