"""quantize_fp16 on hand-built programs: activations to half, index arithmetic stays float32."""
import numpy as np

from mgx_graph import Program
from mgx_graph.passes import QuantizeFp16

from irtools import S, assert_same_ir, lit, op, run_pass

FREQ = np.array([1.0, 0.5, 0.25, 0.125], np.float32)


def test_parameter_and_the_literal_it_meets_become_half():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 4))
    w = lit(m, FREQ)
    m.add_return([m.add_instruction(op("mul"), [x, w])])
    run_pass(QuantizeFp16(), prog)

    want = Program()
    wm = want.get_main_module()
    wx = wm.add_parameter("x", S("float16", 4))
    half = lit(wm, FREQ, "float16")  # inserted before the float32 literal, which stays
    lit(wm, FREQ)
    wm.add_return([wm.add_instruction(op("mul"), [wx, half])])
    assert_same_ir(prog, want)
    np.testing.assert_array_equal(m.instructions[1].op.value, FREQ.astype(np.float16))
    assert prog.get_output_shapes()[0].dtype == "float16"


def test_view_of_a_literal_gets_a_half_literal_under_the_same_views():
    """A tied embedding read by the LM head through a transpose: the half copy is made once at
    compile time and viewed the same way (no per-run convert of the weight)."""
    rng = np.random.default_rng(3)
    emb = rng.normal(size=(6, 4)).astype(np.float32)
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 1, 4))
    wt = m.add_instruction(op("transpose", permutation=[1, 0]), [lit(m, emb)])
    m.add_return([m.add_instruction(op("dot"), [x, wt])])
    run_pass(QuantizeFp16(), prog)
    mod = prog.get_main_module()
    assert not [i for i in mod if i.op.name == "convert"]
    dot = [i for i in mod if i.op.name == "dot"][0]
    t = dot.inputs[1]
    assert t.op.name == "transpose" and t.inputs[0].op.name == "@literal"
    np.testing.assert_array_equal(t.inputs[0].op.value, emb.astype(np.float16))
    assert t.shape.dtype == "float16" and list(t.shape.lens) == [4, 6]


def test_a_gathered_angle_table_stays_float32():
    """Angles gathered by position (pos * inv_freq, up to 4096 rad) feed cos: in half they would be off by
    up to 2 rad; the table and the gather stay float32 and cos meets x through a convert."""
    pos = np.arange(4096, dtype=np.float32)[:, None]
    table = (pos * FREQ[None, :]).astype(np.float32)
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 1, 4))
    ids = m.add_parameter("pos", S("int64", 1))
    ang = m.add_instruction(op("gather", axis=0), [lit(m, table), ids])
    m.add_return([m.add_instruction(op("mul"), [x, m.add_instruction(op("cos"), [ang])])])
    run_pass(QuantizeFp16(), prog)
    g = [i for i in prog.get_main_module() if i.op.name == "gather"][0]
    assert g.shape.dtype == "float32" and g.inputs[0].op.value.dtype == np.float32
    assert [i for i in prog.get_main_module() if i.op.name == "convert"]


def test_index_arithmetic_stays_float32_and_is_converted_where_it_meets_activations():
    def build(half):
        prog = Program()
        m = prog.get_main_module()
        x = m.add_parameter("x", S("float16" if half else "float32", 1, 4))
        pos = m.add_parameter("pos", S("int64", 1, 1))
        pf = m.add_instruction(op("convert", target_type="float32"), [pos])
        ang = m.add_instruction(op("mul"), [pf, lit(m, FREQ.reshape(1, 4))])
        c = m.add_instruction(op("cos"), [ang])
        if half:
            c = m.add_instruction(op("convert", target_type="float16"), [c])
        m.add_return([m.add_instruction(op("mul"), [x, c])])
        return prog

    prog = run_pass(QuantizeFp16(), build(half=False))
    assert_same_ir(prog, build(half=True))
    cos = [i for i in prog.get_main_module() if i.op.name == "cos"][0]
    assert cos.shape.dtype == "float32"


def test_convert_to_float32_among_activations_converts_to_half():
    def build(dtype):
        prog = Program()
        m = prog.get_main_module()
        x = m.add_parameter("x", S(dtype, 3))
        n = m.add_instruction(op("neg"), [x])
        m.add_return([m.add_instruction(op("convert", target_type=dtype), [n])])
        return prog

    assert_same_ir(run_pass(QuantizeFp16(), build("float32")), build("float16"))


def test_integer_and_double_programs_are_unchanged():
    prog = Program()
    m = prog.get_main_module()
    i = m.add_parameter("i", S("int64", 3))
    d = m.add_parameter("d", S("float64", 3))
    a = m.add_instruction(op("add"), [i, lit(m, [1, 2, 3], "int64")])
    b = m.add_instruction(op("mul"), [d, lit(m, [0.5, 1.0, 2.0], "float64")])
    m.add_return([a, b])
    before = prog.print()
    run_pass(QuantizeFp16(), prog)
    assert prog.print() == before


def test_submodule_activations_become_half():
    """A branch computing on a float32 outer value runs in half too; the if's result is half."""
    def build(dtype):
        prog = Program()
        m = prog.get_main_module()
        x = m.add_parameter("x", S(dtype, 3))
        c = m.add_parameter("c", S("bool", 1))
        t, e = prog.create_module("then"), prog.create_module("else")
        t.add_return([t.add_instruction(op("neg"), [x])])
        e.add_return([e.add_instruction(op("abs"), [x])])
        m.add_return([m.add_instruction(op("if"), [c], [t, e])])
        return prog

    prog = run_pass(QuantizeFp16(), build("float32"))
    assert_same_ir(prog, build("float16"))
    assert prog.get_output_shapes()[0].dtype == "float16"


def test_if_model_in_half_matches_onnxruntime(target):
    """End to end: an ONNX If in fp16 returns float16, and the values of onnxruntime (float32 run)."""
    import mgx_graph
    from onnx import helper
    from util import make_model, ort_run

    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["tb"])], "t", [],
                               [helper.make_tensor_value_info("tb", 1, [3])])
    else_g = helper.make_graph([helper.make_node("Abs", ["x"], ["eb"])], "e", [],
                               [helper.make_tensor_value_info("eb", 1, [3])])
    model = make_model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                       {"x": np.zeros(3, np.float32), "c": np.zeros(1, bool)}, ["y"])
    prog = mgx_graph.compile(model, target=target, fp16=True)
    x = np.array([1.5, -2.0, 3.25], np.float32)
    for c in (True, False):
        got = prog.run({"x": x.astype(np.float16), "c": np.array([c])})[0]
        want = ort_run(model, {"x": x, "c": np.array([c])})[0]
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-3)


def _dq_lstm_program(half: bool) -> Program:
    """x -> dynamic_quantize_lstm -> Y + z, Y_h returned as it is; ``half``: what quantize_fp16 makes
    of it (x and z half, x converted to float32 for the float32-only op, Y converted to half where it
    meets z, Y_h float32)."""
    rng = np.random.default_rng(5)
    T, B, I, H = 3, 2, 5, 4
    f16 = "float16" if half else "float32"
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S(f16, T, B, I))
    z = m.add_parameter("z", S(f16, T, 1, B, H))
    rest = [lit(m, rng.integers(-128, 128, (1, I, 4 * H)), "int8"), lit(m, rng.integers(-128, 128, (1, H, 4 * H)),
                                                                        "int8"),
            lit(m, np.zeros((1, 8 * H))), lit(m, np.zeros((1, B, H))), lit(m, np.zeros((1, B, H))),
            lit(m, [0.01]), lit(m, [0], "int8"), lit(m, [0.01]), lit(m, [0], "int8")]
    if half:
        x = m.add_instruction(op("convert", target_type="float32"), [x])
    lstm = m.add_instruction(op("dynamic_quantize_lstm", hidden_size=H), [x] + rest)
    y = m.add_instruction(op("get_tuple_elem", index=0), [lstm])
    yh = m.add_instruction(op("get_tuple_elem", index=1), [lstm])
    if half:
        y = m.add_instruction(op("convert", target_type="float16"), [y])
    m.add_return([m.add_instruction(op("add"), [y, z]), yh])
    return prog


def test_float32_only_op_keeps_float32_and_meets_activations_through_converts():
    prog = run_pass(QuantizeFp16(), _dq_lstm_program(half=False))
    assert_same_ir(prog, _dq_lstm_program(half=True))
    assert [s.dtype for s in prog.get_output_shapes()] == ["float16", "float32"]
    lstm = [i for i in prog.get_main_module() if i.op.name == "dynamic_quantize_lstm"][0]
    assert [s.dtype for s in lstm.shape] == ["float32"] * 3
