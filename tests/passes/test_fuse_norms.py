"""fuse_norms on hand-built programs: the decomposed RMS norm becomes one ``rms_norm``."""
import numpy as np
import pytest

from mgx_graph import Program
from mgx_graph.passes import FuseNorms

from irtools import S, assert_same_ir, lit, op, run_pass

EPS = 1e-5
W = np.linspace(0.5, 1.5, 8).astype(np.float32)


def _norm(m, x, square="pow", recip="recip", exponent=2.0, axes=(-1,), eps=EPS, weight=True):
    """The decomposition as exported: returns the instructions made, by name."""
    made = {}
    if square == "pow":
        made["sq"] = m.add_instruction(op("pow"), [x, lit(m, exponent)])
    else:
        made["sq"] = m.add_instruction(op("mul"), [x, x])
    made["mean"] = m.add_instruction(op("reduce_mean", axes=list(axes), keepdims=1), [made["sq"]])
    made["add"] = m.add_instruction(op("add"), [made["mean"], lit(m, eps)])
    made["sqrt"] = m.add_instruction(op("sqrt"), [made["add"]])
    if recip == "recip":
        made["rec"] = m.add_instruction(op("recip"), [made["sqrt"]])
    else:
        made["rec"] = m.add_instruction(op("div"), [lit(m, 1.0), made["sqrt"]])
    made["y"] = m.add_instruction(op("mul"), [x, made["rec"]])
    if weight:
        made["w"] = lit(m, W)
        made["wy"] = m.add_instruction(op("mul"), [made["y"], made["w"]])
    return made


def _program(**kw):
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 2, 3, 8))
    made = _norm(m, x, **kw)
    return prog, m, x, made


@pytest.mark.parametrize("weight", [True, False])
def test_pow_recip_form_is_fused(weight):
    prog, m, x, made = _program(weight=weight)
    m.add_return([made["wy" if weight else "y"]])
    run_pass(FuseNorms(), prog)

    want, w, wx, wmade = _program(weight=weight)
    out = wmade["wy" if weight else "y"]
    inputs = [wx, wmade["w"]] if weight else [wx]
    fused = w.insert_instruction(out, op("rms_norm", axis=-1, epsilon=float(np.float32(EPS))), inputs)
    w.add_return([fused])  # the unfused chain stays until dead-code elimination
    assert_same_ir(prog, want)


def test_mul_and_div_form_is_fused():
    prog, m, x, made = _program(square="mul", recip="div", weight=False)
    neg = m.add_instruction(op("neg"), [made["y"]])
    m.add_return([neg])
    run_pass(FuseNorms(), prog)

    want, w, wx, wmade = _program(square="mul", recip="div", weight=False)
    fused = w.insert_instruction(wmade["y"], op("rms_norm", axis=-1, epsilon=float(np.float32(EPS))), [wx])
    w.add_return([w.add_instruction(op("neg"), [fused])])
    assert_same_ir(prog, want)


@pytest.mark.parametrize("variant", [dict(exponent=3.0), dict(axes=(1,)), dict(eps_tensor=True)],
                         ids=["cube", "not-last-axis", "eps-not-scalar"])
def test_other_patterns_are_left_alone(variant):
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 2, 3, 8))
    kw = {k: v for k, v in variant.items() if k != "eps_tensor"}
    made = _norm(m, x, weight=False, **kw)
    if variant.get("eps_tensor"):  # the epsilon is a parameter: not a compile-time scalar
        e = m.add_parameter("eps", S("float32", 1))
        m.replace_argument(made["add"], made["add"].inputs[1], e)
    m.add_return([made["y"]])
    before = prog.print()
    run_pass(FuseNorms(), prog)
    assert prog.print() == before


def test_norm_read_twice_inside_is_not_fused():
    """The mean is also returned: fusing would drop a value someone reads."""
    prog, m, x, made = _program(weight=False)
    m.add_return([made["y"], made["mean"]])
    before = prog.print()
    run_pass(FuseNorms(), prog)
    assert prog.print() == before
