"""fuse_pointwise: hand-built programs against hand-built expected programs (one ``pointwise`` per
maximal one-output group), then small ONNX models against onnxruntime and the random LLaMA decode
step (kernels per step, greedy tokens)."""
import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph import Program
from mgx_graph.operators.fused import FusedPointwise
from mgx_graph.passes import (EliminateDeadCode, FusePointwise, Lowering, PassContext, PassManager, PipelineOptions,
                              validate_program)
from mgx_graph.passes.hip_graph import launch_count
from mgx_graph.targets import pipeline

from irtools import S, assert_same_ir, lit, op, run_pass
from util import make_model, ort_run


def fused(m, inputs, body, kind="pointwise", **attrs):
    """Expected-program helper: a ``kind`` instruction over a new submodule ``<module>:<kind><n>``
    whose parameters ``x0..`` take ``inputs``; ``body(sub, params)`` builds it and returns the root."""
    n = sum(1 for name in m.program.modules if name.startswith(f"{m.name}:{kind}"))
    sub = m.program.create_module(f"{m.name}:{kind}{n}")
    params = [sub.add_parameter(f"x{k}", i.shape) for k, i in enumerate(inputs)]
    sub.add_return([body(sub, params)])
    return m.add_instruction(op(kind, module=sub, **attrs), inputs, [sub])


def fuse(prog, exclude=()):
    run_pass(FusePointwise(exclude), prog)
    return run_pass(EliminateDeadCode(), prog)


# -- IR in, IR out --------------------------------------------------------------------------------------------
def _chain_program():
    prog = Program()
    m = prog.get_main_module()
    x, y = m.add_parameter("x", S("float32", 2, 3)), m.add_parameter("y", S("float32", 3))
    a = m.add_instruction(op("mul"), [x, y])  # implicit broadcast of y
    b = m.add_instruction(op("add"), [a, lit(m, 0.5)])
    c = m.add_instruction(op("tanh"), [b])
    m.add_return([m.add_instruction(op("mul"), [c, x])])  # x read twice
    return prog


def test_chain_becomes_one_pointwise():
    prog = fuse(_chain_program())

    want = Program()
    w = want.get_main_module()
    x, y = w.add_parameter("x", S("float32", 2, 3)), w.add_parameter("y", S("float32", 3))

    def body(sub, p):
        half = lit(sub, 0.5)
        a = sub.add_instruction(op("mul"), [p[0], p[1]])
        b = sub.add_instruction(op("add"), [a, half])
        return sub.add_instruction(op("mul"), [sub.add_instruction(op("tanh"), [b]), p[0]])

    w.add_return([fused(w, [x, y], body)])
    assert_same_ir(prog, want)


def test_a_value_read_outside_is_the_root_of_its_own_group():
    """One output per group: v feeds neg and exp, so neither joins it; u joins v."""
    def program(fuse_uv):
        prog = Program()
        m = prog.get_main_module()
        x, y = m.add_parameter("x", S("float32", 4)), m.add_parameter("y", S("float32", 4))
        if fuse_uv:
            def body(s, p):
                one = lit(s, 1.0)  # scalar literals come first in the submodule
                return s.add_instruction(op("add"), [s.add_instruction(op("mul"), [p[0], p[1]]), one])

            v = fused(m, [x, y], body)
        else:
            v = m.add_instruction(op("add"), [m.add_instruction(op("mul"), [x, y]), lit(m, 1.0)])
        m.add_return([m.add_instruction(op("neg"), [v]), m.add_instruction(op("exp"), [v])])
        return prog

    assert_same_ir(fuse(program(False)), program(True))


def test_views_of_inside_values_join_views_of_outside_values_stay():
    prog = Program()
    m = prog.get_main_module()
    x, y = m.add_parameter("x", S("float32", 2, 3)), m.add_parameter("y", S("float32", 1, 1, 2))
    t = m.add_instruction(op("transpose", permutation=[1, 0]), [x])  # of a parameter: stays
    e = m.add_instruction(op("exp"), [t])
    u = m.add_instruction(op("unsqueeze", axes=[0]), [e])  # of a member: joins
    m.add_return([m.add_instruction(op("mul"), [u, y])])
    fuse(prog)

    want = Program()
    w = want.get_main_module()
    wx, wy = w.add_parameter("x", S("float32", 2, 3)), w.add_parameter("y", S("float32", 1, 1, 2))
    wt = w.add_instruction(op("transpose", permutation=[1, 0]), [wx])

    def body(sub, p):
        ue = sub.add_instruction(op("unsqueeze", axes=[0]), [sub.add_instruction(op("exp"), [p[0]])])
        return sub.add_instruction(op("mul"), [ue, p[1]])

    w.add_return([fused(w, [wt, wy], body)])
    assert_same_ir(prog, want)
    assert "x0 = @param:x0 -> float_type, {3, 2}, {1, 3}" in prog.modules["main:pointwise0"].print()  # strided


def test_rotate_half_concat_is_part_of_the_pointwise():
    def program(expected):
        prog = Program()
        m = prog.get_main_module()
        q = m.add_parameter("q", S("float32", 2, 3, 8))
        cos, sin = m.add_parameter("cos", S("float32", 8)), m.add_parameter("sin", S("float32", 8))
        q1 = m.add_instruction(op("slice", axes=[2], starts=[0], ends=[4]), [q])
        q2 = m.add_instruction(op("slice", axes=[2], starts=[4], ends=[8]), [q])

        def body(s, p):  # p: q2, q1, q, cos, sin (first use)
            cat = s.add_instruction(op("concat", axis=-1), [s.add_instruction(op("neg"), [p[0]]), p[1]])
            a = s.add_instruction(op("mul"), [p[2], p[3]])
            return s.add_instruction(op("add"), [a, s.add_instruction(op("mul"), [cat, p[4]])])

        if expected:
            m.add_return([fused(m, [q2, q1, q, cos, sin], body)])
        else:
            m.add_return([body(m, [q2, q1, q, cos, sin])])
        return prog

    assert_same_ir(fuse(program(False)), program(True))


def test_excluded_ops_split_the_chain():
    def program(expected):
        prog = Program()
        m = prog.get_main_module()
        x = m.add_parameter("x", S("float32", 5))
        t = m.add_instruction(op("tanh"), [m.add_instruction(op("neg"), [x])])
        if expected:
            y = fused(m, [t], lambda s, p: s.add_instruction(op("exp"), [s.add_instruction(op("neg"), [p[0]])]))
        else:
            y = m.add_instruction(op("exp"), [m.add_instruction(op("neg"), [t])])
        m.add_return([y])
        return prog

    assert_same_ir(fuse(program(False), exclude=("tanh",)), program(True))


def test_lone_kernels_and_other_ops_are_left_alone():
    prog = Program()
    m = prog.get_main_module()
    a, b = m.add_parameter("a", S("float32", 2, 3)), m.add_parameter("b", S("float32", 3, 4))
    d = m.add_instruction(op("dot"), [m.add_instruction(op("relu"), [a]), b])
    g = m.add_instruction(op("gather", axis=0), [d, m.add_literal(np.array([1, 0], np.int64))])
    m.add_return([m.add_instruction(op("exp"), [g])])
    before = prog.print()
    assert fuse(prog).print() == before


def test_lowering_takes_the_submodule_off_and_names_the_kernel():
    for target, label in (("ref", "host"), ("gpu", "pointwise (generated mgx_pointwise_")):
        prog = _chain_program()
        PassManager([FusePointwise(), Lowering(target)], PassContext(target)).run(prog)  # validates each pass
        ins = [i for i in prog.get_main_module().instructions if i.op.name == "pointwise"]
        assert len(ins) == 1 and ins[0].module_inputs == [] and list(prog.modules) == ["main"]
        assert str(ins[0].op) == "pointwise[module=main:pointwise0,kernel=mul_add_tanh_mul]"
        k = ins[0].meta["kernel"]
        assert k.label.startswith(label) and k.launches == 1 and k.capturable and not k.workspace


def test_in_place_only_for_an_input_read_at_its_own_element():
    def op_of(build, shapes):
        sub = Program().create_module("t")
        p = [sub.add_parameter(f"x{k}", s) for k, s in enumerate(shapes)]
        sub.add_return([build(sub, p)])
        return FusedPointwise(module=sub)

    s4, s1 = S("float32", 4), S("float32", 1)
    assert op_of(lambda m, p: m.add_instruction(op("neg"), [m.add_instruction(op("add"), p)]), [s4, s1]).inplace_ok
    assert not op_of(lambda m, p: m.add_instruction(op("add"), [p[1], p[0]]), [s1, s4]).inplace_ok  # x0 broadcast
    cat = op_of(lambda m, p: m.add_instruction(op("concat", axis=0), [m.add_instruction(op("neg"), [p[0]]), p[0]]),
                [S("float32", 2)])
    assert not cat.inplace_ok  # x0 read at another element


# -- numerics on small ONNX models ----------------------------------------------------------------------------
R = np.random.default_rng(11)


def _silu_mul_model():
    nodes = [helper.make_node("MatMul", ["x", "wg"], ["g"]), helper.make_node("MatMul", ["x", "wu"], ["u"]),
             helper.make_node("Sigmoid", ["g"], ["s"]), helper.make_node("Mul", ["g", "s"], ["silu"]),
             helper.make_node("Mul", ["silu", "u"], ["y"])]
    init = {"wg": R.normal(size=(8, 16)).astype(np.float32), "wu": R.normal(size=(8, 16)).astype(np.float32)}
    return make_model(nodes, {"x": np.zeros((1, 3, 8), np.float32)}, ["y"], init), \
        {"x": R.normal(size=(1, 3, 8)).astype(np.float32)}


def _rope_model():
    """q [1, 3, 2, 8] -> transpose -> q * cos + rotate_half(q) * sin, then * 0.25; cos / sin from positions."""
    nodes = [helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3]),
             helper.make_node("Cast", ["pos"], ["pf"], to=1), helper.make_node("Mul", ["pf", "freq"], ["ang"]),
             helper.make_node("Cos", ["ang"], ["cos"]), helper.make_node("Sin", ["ang"], ["sin"]),
             helper.make_node("Slice", ["qt", "s0", "s4", "ax"], ["q1"]),
             helper.make_node("Slice", ["qt", "s4", "s8", "ax"], ["q2"]), helper.make_node("Neg", ["q2"], ["nq2"]),
             helper.make_node("Concat", ["nq2", "q1"], ["rot"], axis=-1),
             helper.make_node("Mul", ["qt", "cos"], ["a"]), helper.make_node("Mul", ["rot", "sin"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["r"]), helper.make_node("Mul", ["r", "scale"], ["y"])]
    init = {"freq": (0.5 ** np.arange(8)).astype(np.float32), "s0": np.array([0], np.int64),
            "s4": np.array([4], np.int64), "s8": np.array([8], np.int64), "ax": np.array([-1], np.int64),
            "scale": np.array(0.25, np.float32)}
    feeds = {"q": R.normal(size=(1, 3, 2, 8)).astype(np.float32), "pos": np.array([[[5], [9], [200]]], np.int64)}
    return make_model(nodes, {"q": feeds["q"], "pos": feeds["pos"]}, ["y"], init), feeds


def _broadcast_mask_model():
    nodes = [helper.make_node("Add", ["x", "b"], ["xb"]), helper.make_node("Less", ["xb", "half"], ["m"]),
             helper.make_node("Mul", ["xb", "two"], ["x2"]), helper.make_node("Neg", ["xb"], ["nx"]),
             helper.make_node("Where", ["m", "x2", "nx"], ["w"]), helper.make_node("Relu", ["w"], ["r"]),
             helper.make_node("Sqrt", ["r"], ["y"])]
    init = {"b": R.normal(size=(4,)).astype(np.float32), "half": np.array(0.5, np.float32),
            "two": np.array(2.0, np.float32)}
    return make_model(nodes, {"x": np.zeros((2, 3, 4), np.float32)}, ["y"], init), \
        {"x": R.normal(size=(2, 3, 4)).astype(np.float32)}


def _index_model():
    nodes = [helper.make_node("Add", ["i", "k"], ["a"]), helper.make_node("Mul", ["a", "three"], ["b"]),
             helper.make_node("Mod", ["b", "seven"], ["c"]), helper.make_node("Sub", ["c", "k"], ["y"])]
    init = {"k": np.arange(5, dtype=np.int64), "three": np.array(3, np.int64), "seven": np.array(7, np.int64)}
    return make_model(nodes, {"i": np.zeros((2, 5), np.int64)}, ["y"], init), \
        {"i": R.integers(-20, 20, size=(2, 5)).astype(np.int64)}


MODELS = {"silu_mul": _silu_mul_model, "rope": _rope_model, "broadcast_mask": _broadcast_mask_model,
          "index": _index_model}
KERNELS = {"silu_mul": "sigmoid_mul_mul", "rope": "convert_mul_cos_sin_neg_concat_mul_mul_etc", "broadcast_mask":
           "add_less_mul_neg_where_relu_sqrt", "index": "add_mul_mod_sub"}


def compile_without(monkeypatch, names, model, **kw):
    """Compile with ``MIGRAPHX_DISABLE_PASSES=names`` (read afresh for this compile only)."""
    from mgx_graph import env

    monkeypatch.setenv("MIGRAPHX_DISABLE_PASSES", names)
    env._reset_for_tests()
    try:
        return mgx_graph.compile(model, **kw)
    finally:
        monkeypatch.delenv("MIGRAPHX_DISABLE_PASSES")
        env._reset_for_tests()


def _fused_kernels(prog):
    """The ``kernel=`` names of the compiled program's pointwise instructions."""
    return [str(i.op).split("kernel=")[1].rstrip("]") for i in prog.get_main_module().instructions
            if i.op.name == "pointwise"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fused_models_match_onnxruntime_and_the_unfused_program(name, target, monkeypatch):
    model, feeds = MODELS[name]()
    want = ort_run(model, feeds)[0]
    prog = mgx_graph.compile(model, target=target)
    assert KERNELS[name] in _fused_kernels(prog)
    got = prog.run(feeds)[0]
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)
    plain = compile_without(monkeypatch, "fuse_pointwise", model, target=target)
    assert _fused_kernels(plain) == []
    assert prog.stats()["launches_per_run_eager"] < plain.stats()["launches_per_run_eager"]
    if target == "ref":  # the submodule runs the very kernels of the unfused instructions
        np.testing.assert_array_equal(got, plain.run(feeds)[0])


def test_fp16_rope_matches_onnxruntime(target):
    model, feeds = _rope_model()
    want = ort_run(model, feeds)[0]
    prog = mgx_graph.compile(model, target=target, fp16=True)
    assert any("neg_concat" in k for k in _fused_kernels(prog))
    got = prog.run({"q": feeds["q"].astype(np.float16), "pos": feeds["pos"]})[0]
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-2)


def test_a_fused_writer_binds_in_place():
    """state_out = tanh(state_in + x) * 0.5 written into state_in's buffer through the pointwise."""
    nodes = [helper.make_node("Add", ["state_in", "x"], ["a"]), helper.make_node("Tanh", ["a"], ["t"]),
             helper.make_node("Mul", ["t", "half"], ["state_out"])]
    model = make_model(nodes, {"state_in": np.zeros((3, 4), np.float32), "x": np.zeros((3, 4), np.float32)},
                       ["state_out"], {"half": np.array(0.5, np.float32)})
    prog = mgx_graph.compile(model, target="ref", alias={"state_out": "state_in"})
    assert prog.alias == {"state_out": "state_in"}
    writer = [i for i in prog.get_main_module().instructions if i.op.name == "pointwise"]
    assert len(writer) == 1 and writer[0].meta.get("bind_param") == "state_in"
    s, x = R.normal(size=(3, 4)).astype(np.float32), R.normal(size=(3, 4)).astype(np.float32)
    np.testing.assert_allclose(prog.run({"state_in": s, "x": x})[0], np.tanh(s + x) * 0.5, rtol=1e-6)


# -- the decode step of a random LLaMA --------------------------------------------------------------------------
# (the `llama` fixture: tests/conftest.py)


def _gpu_launches(info, fp16, disabled=()):
    """Kernel launches per step the gpu lowering plans (no device needed to lower)."""
    prog = mgx_graph.parse_onnx(str(info.onnx_path))
    PassManager(pipeline("gpu", PipelineOptions(fp16=fp16)), PassContext("gpu"), disabled=set(disabled)).run(prog)
    validate_program(prog)
    return sum(launch_count(i) for i in prog.get_main_module().instructions)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_decode_step_kernels_per_step_drop(llama, fp16):
    fused = _gpu_launches(llama, fp16)
    unfused = _gpu_launches(llama, fp16, {"fuse_kernels"})
    no_reduce = _gpu_launches(llama, fp16, {"fuse_reduce"})
    assert fused < no_reduce < unfused
    assert fused <= 0.6 * unfused, (fused, unfused)


def test_decode_step_tokens_unchanged_on_ref(llama, monkeypatch):
    from mgx_graph.llm.generation import Decoder, generate
    from mgx_graph.models.oracle import hf_greedy_tokens

    prompt, n_new = [5, 9, 2, 77], 8
    eos = llama.config["eos_token_ids"]
    prog = mgx_graph.compile(str(llama.onnx_path), target="ref")
    fused = generate(Decoder(prog), prompt, n_new, eos)
    plain_prog = compile_without(monkeypatch, "fuse_kernels", str(llama.onnx_path), target="ref")
    plain = generate(Decoder(plain_prog), prompt, n_new, eos)
    assert fused.tokens == plain.tokens == hf_greedy_tokens(llama, prompt, n_new)
    assert prog.stats()["launches_per_run_eager"] < 0.7 * plain_prog.stats()["launches_per_run_eager"]
