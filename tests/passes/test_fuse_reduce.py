"""fuse_reduce: a reduction over the innermost axis with its elementwise producers and consumers
becomes one ``fused_reduce``; hand-built programs against hand-built expected programs, then small
ONNX models (RMSNorm, masked softmax, LayerNorm, x - max) against onnxruntime."""
import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph import Program
from mgx_graph.passes import EliminateDeadCode, FuseReduce, Lowering, PassContext, PassManager

from irtools import S, assert_same_ir, lit, op, run_pass
from test_fuse_pointwise import compile_without, fused
from util import make_model, ort_run


def want_module(m, inputs, body, kind="fused_reduce"):
    """Expected-program helper: the submodule ``<module>:<kind><n>`` returning ``body``'s list."""
    n = sum(1 for name in m.program.modules if name.startswith(f"{m.name}:{kind}"))
    sub = m.program.create_module(f"{m.name}:{kind}{n}")
    sub.add_return(body(sub, [sub.add_parameter(f"x{k}", i.shape) for k, i in enumerate(inputs)]))
    return sub


def fuse(prog, exclude=()):
    run_pass(FuseReduce(exclude), prog)
    return run_pass(EliminateDeadCode(), prog)


# -- IR in, IR out --------------------------------------------------------------------------------------------
def _masked_softmax(m, x, mask):
    """scale, mask add, softmax, NaN guard, convert: the attention probabilities of the decode step."""
    half, zero = lit(m, 0.5, "float16"), lit(m, 0.0, "float16")
    s = m.add_instruction(op("mul"), [x, half])
    a = m.add_instruction(op("add"), [s, m.add_instruction(op("convert", target_type="float16"), [mask])])
    y = m.add_instruction(op("softmax", axis=-1), [a])
    w = m.add_instruction(op("where"), [m.add_instruction(op("isnan"), [y]), zero, y])
    return m.add_instruction(op("convert", target_type="float32"), [w])


def test_softmax_takes_its_scale_mask_and_nan_guard():
    def program(expected):
        prog = Program()
        m = prog.get_main_module()
        x, mask = m.add_parameter("x", S("float16", 1, 2, 1, 8)), m.add_parameter("mask", S("float32", 1, 1, 1, 8))
        if expected:
            m.add_return([fused(m, [x, mask], lambda s, p: _masked_softmax(s, p[0], p[1]), "fused_reduce", axes=[3])])
        else:
            m.add_return([_masked_softmax(m, x, mask)])
        return prog

    assert_same_ir(fuse(program(False)), program(True))


def test_rms_norm_takes_its_weight_and_the_convert_after_it():
    def body(m, x, w):
        return m.add_instruction(op("convert", target_type="float32"),
                                 [m.add_instruction(op("rms_norm", axis=-1, epsilon=1e-5), [x, w])])

    def program(expected):
        prog = Program()
        m = prog.get_main_module()
        x, w = m.add_parameter("x", S("float16", 1, 1, 64)), m.add_parameter("w", S("float16", 64))
        m.add_return([fused(m, [x, w], lambda s, p: body(s, *p), "fused_reduce", axes=[2]) if expected
                      else body(m, x, w)])
        return prog

    assert_same_ir(fuse(program(False)), program(True))


def test_a_residual_read_again_after_the_norm_is_a_second_output():
    """h = a + b feeds the norm and, later, the next residual add: the norm's kernel writes h too."""
    def program(expected):
        prog = Program()
        m = prog.get_main_module()
        a, b = m.add_parameter("a", S("float32", 2, 16)), m.add_parameter("b", S("float32", 2, 16))
        w, c = m.add_parameter("w", S("float32", 16)), m.add_parameter("c", S("float32", 2, 16))
        if expected:
            def body(s, p):
                h = s.add_instruction(op("add"), [p[0], p[1]])
                return [s.add_instruction(op("rms_norm", axis=-1), [h, p[2]]), h]

            sub = want_module(m, [a, b, w], body)
            f = m.add_instruction(op("fused_reduce", module=sub, axes=[1]), [a, b, w], [sub])
            r, h = (m.add_instruction(op("get_tuple_elem", index=k), [f]) for k in (0, 1))
        else:
            h = m.add_instruction(op("add"), [a, b])
            r = m.add_instruction(op("rms_norm", axis=-1), [h, w])
        m.add_return([r, m.add_instruction(op("mul"), [h, c])])
        return prog

    assert_same_ir(fuse(program(False)), program(True))


def test_a_residual_read_before_the_norm_stays_outside():
    def program(expected):
        prog = Program()
        m = prog.get_main_module()
        a, b = m.add_parameter("a", S("float32", 2, 16)), m.add_parameter("b", S("float32", 2, 16))
        w = m.add_parameter("w", S("float32", 16))
        h = m.add_instruction(op("add"), [a, b])
        early = m.add_instruction(op("neg"), [h])
        if expected:
            r = fused(m, [h, w], lambda s, p: s.add_instruction(op("rms_norm", axis=-1), p), "fused_reduce",
                      axes=[1])
        else:
            r = m.add_instruction(op("rms_norm", axis=-1), [h, w])
        m.add_return([r, early])
        return prog

    assert_same_ir(fuse(program(False)), program(True))


def test_x_minus_max_is_one_group():
    def body(m, x):
        return m.add_instruction(op("sub"), [x, m.add_instruction(op("reduce_max", axes=[1]), [x])])

    def program(expected):
        prog = Program()
        m = prog.get_main_module()
        x = m.add_parameter("x", S("float32", 3, 10))
        if expected:
            m.add_return([fused(m, [x], lambda s, p: body(s, s.add_instruction(op("exp"), [p[0]])), "fused_reduce",
                                axes=[1])])
        else:
            m.add_return([body(m, m.add_instruction(op("exp"), [x]))])
        return prog

    assert_same_ir(fuse(program(False)), program(True))


def test_other_reductions_are_left_alone():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 4, 6))
    outs = [m.add_instruction(op("softmax", axis=0), [x]),                    # not the innermost axis
            m.add_instruction(op("reduce_sum", axes=[-1]), [x]),              # a lone reduce: one kernel already
            m.add_instruction(op("neg"), [m.add_instruction(op("reduce_mean", axes=[0, 1]), [x])]),
            m.add_instruction(op("reduce_max", axes=[1], keepdims=0), [x])]
    r = m.add_instruction(op("reduce_sum", axes=[1]), [x])                       # its consumer has other rows
    outs.append(m.add_instruction(op("mul"), [r, m.add_parameter("z", S("float32", 3, 4, 1))]))
    m.add_return(outs)
    before = prog.print()
    assert fuse(prog).print() == before


def test_excluded_reductions_stay():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 2, 8))
    m.add_return([m.add_instruction(op("neg"), [m.add_instruction(op("softmax", axis=-1), [x])])])
    before = prog.print()
    assert fuse(prog, exclude=("softmax",)).print() == before


@pytest.mark.parametrize("target", ["ref", "gpu"], ids=["ref-lowering", "gpu-lowering"])  # lowering needs no device
def test_lowered_to_one_kernel(target):
    prog = Program()
    m = prog.get_main_module()
    x, mask = m.add_parameter("x", S("float16", 1, 2, 1, 8)), m.add_parameter("mask", S("float32", 1, 1, 1, 8))
    m.add_return([_masked_softmax(m, x, mask)])
    PassManager([FuseReduce(), EliminateDeadCode(), Lowering(target)], PassContext(target)).run(prog)
    names = [i.op.name for i in prog.get_main_module().instructions if not i.op.builtin]
    assert names == ["fused_reduce"] and list(prog.modules) == ["main"]
    ins = next(i for i in prog.get_main_module().instructions if i.op.name == "fused_reduce")
    assert str(ins.op) == ("fused_reduce[axes={3},module=main:fused_reduce0,"
                           "kernel=mul_convert_add_softmax_isnan_where_convert]")
    k = ins.meta["kernel"]
    assert k.launches == 1 and k.capturable and k.label.startswith("host" if target == "ref" else "reduce (generated")


# -- numerics on small ONNX models ----------------------------------------------------------------------------
R = np.random.default_rng(3)


def _rms_model():
    nodes = [helper.make_node("Add", ["a", "b"], ["x"]), helper.make_node("Pow", ["x", "two"], ["p"]),
             helper.make_node("ReduceMean", ["p", "ax"], ["mean"], keepdims=1),
             helper.make_node("Add", ["mean", "eps"], ["e"]), helper.make_node("Sqrt", ["e"], ["s"]),
             helper.make_node("Reciprocal", ["s"], ["r"]), helper.make_node("Mul", ["x", "r"], ["n"]),
             helper.make_node("Mul", ["n", "w"], ["y"])]
    init = {"two": np.array(2.0, np.float32), "ax": np.array([-1], np.int64), "eps": np.array(1e-5, np.float32),
            "w": R.uniform(0.5, 1.5, size=48).astype(np.float32)}
    shape = (2, 3, 48)
    feeds = {"a": R.normal(size=shape).astype(np.float32), "b": R.normal(size=shape).astype(np.float32)}
    return make_model(nodes, {k: v for k, v in feeds.items()}, ["y"], init), feeds


def _softmax_model():
    nodes = [helper.make_node("Less", ["pos", "limit"], ["keep"]),
             helper.make_node("Where", ["keep", "zero", "ninf"], ["mask"]),
             helper.make_node("Mul", ["s", "scale"], ["ss"]), helper.make_node("Add", ["ss", "mask"], ["a"]),
             helper.make_node("Softmax", ["a"], ["p"], axis=-1), helper.make_node("IsNaN", ["p"], ["bad"]),
             helper.make_node("Where", ["bad", "zero", "p"], ["y"])]
    init = {"pos": np.arange(40, dtype=np.int64).reshape(1, 1, 1, 40), "zero": np.array(0.0, np.float32),
            "ninf": np.array(-3.4028234663852886e38, np.float32), "scale": np.array(0.125, np.float32)}
    feeds = {"s": R.normal(size=(1, 3, 2, 40)).astype(np.float32), "limit": np.array([[[[23]]]], np.int64)}
    return make_model(nodes, feeds, ["y"], init), feeds


def _layernorm_model():
    nodes = [helper.make_node("Mul", ["x", "g"], ["xg"]),
             helper.make_node("LayerNormalization", ["xg", "scale", "bias"], ["n"], axis=-1, epsilon=1e-5),
             helper.make_node("Relu", ["n"], ["y"])]
    init = {"g": R.normal(size=(1, 33)).astype(np.float32), "scale": R.normal(size=33).astype(np.float32),
            "bias": R.normal(size=33).astype(np.float32)}
    feeds = {"x": R.normal(size=(4, 33)).astype(np.float32)}
    return make_model(nodes, feeds, ["y"], init, opset=17), feeds


def _max_model():
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
             helper.make_node("ReduceMax", ["t", "ax"], ["m"], keepdims=1),
             helper.make_node("Sub", ["t", "m"], ["d"]), helper.make_node("Exp", ["d"], ["y"])]
    feeds = {"x": R.normal(size=(37, 5)).astype(np.float32)}
    return make_model(nodes, feeds, ["y"], {"ax": np.array([-1], np.int64)}), feeds


MODELS = {"rms_norm": (_rms_model, "add_rms_norm"),
          "masked_softmax": (_softmax_model, "less_where_mul_add_softmax_isnan_where"),
          "layernorm": (_layernorm_model, "mul_layernorm_relu"), "x_minus_max": (_max_model, "reduce_max_sub_exp")}


def _reduce_kernels(prog):
    return [str(i.op).split("kernel=")[1].rstrip("]") for i in prog.get_main_module().instructions
            if i.op.name == "fused_reduce"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fused_models_match_onnxruntime_and_the_unfused_program(name, target, monkeypatch):
    build, kernel = MODELS[name]
    model, feeds = build()
    want = ort_run(model, feeds)[0]
    prog = mgx_graph.compile(model, target=target)
    assert kernel in _reduce_kernels(prog)
    got = prog.run(feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    plain = compile_without(monkeypatch, "fuse_reduce", model, target=target)
    assert _reduce_kernels(plain) == []
    if target == "ref":
        np.testing.assert_array_equal(got, plain.run(feeds)[0])


@pytest.mark.parametrize("name", ["rms_norm", "masked_softmax"])
def test_fp16_matches_onnxruntime(name, target):
    build, kernel = MODELS[name]
    model, feeds = build()
    want = ort_run(model, feeds)[0]
    prog = mgx_graph.compile(model, target=target, fp16=True)
    assert len(_reduce_kernels(prog)) == 1
    half = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()}
    np.testing.assert_allclose(prog.run(half)[0].astype(np.float32), want, rtol=1e-2, atol=1e-2)


def test_a_fused_reduce_writer_binds_in_place():
    """state_out = state_in + softmax(y): the state is read only in the output pass, at its own element."""
    nodes = [helper.make_node("Softmax", ["y"], ["p"], axis=-1), helper.make_node("Add", ["state_in", "p"], ["state_out"])]
    model = make_model(nodes, {"state_in": np.zeros((3, 8), np.float32), "y": np.zeros((3, 8), np.float32)},
                       ["state_out"])
    prog = mgx_graph.compile(model, target="ref", alias={"state_out": "state_in"})
    writer = [i for i in prog.get_main_module().instructions if i.op.name == "fused_reduce"]
    assert len(writer) == 1 and writer[0].meta.get("bind_param") == "state_in"
    s, y = R.normal(size=(3, 8)).astype(np.float32), R.normal(size=(3, 8)).astype(np.float32)
    e = np.exp(y - y.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(prog.run({"state_in": s, "y": y})[0], s + e / e.sum(axis=-1, keepdims=True), rtol=1e-6)



# -- causal float16 Attention: the gpu program of the node suite's case, run on the host -------------------------
def _gpu_program(model):
    from mgx_graph.passes.compile_result import CompileResult
    from mgx_graph.onnx import parse_onnx
    from mgx_graph.passes import PipelineOptions
    from mgx_graph.targets import pipeline

    prog = parse_onnx(model)
    opts = PipelineOptions(alias={}, strict_alias=True)
    PassManager(pipeline("gpu", opts), PassContext("gpu", CompileResult(target="gpu", hip_graph=False))).run(prog)
    return prog


def _emulate_gpu(prog, feeds, workdir):
    """Evaluate the lowered gpu ``prog`` on the host: dots as cuBLAS with COMPUTE_32F (float32 products and
    sums, one rounding into the output type), fused_reduce instructions by their generated kernel built
    for the host with nvcc, views by numpy, every other instruction by its host kernel."""
    from kernel_host import run_on_host

    from mgx_graph.operators.base import HOST
    from mgx_graph.operators.fused_reduce_codegen import reduce_source

    vals = {}
    for i in prog.get_main_module().instructions:
        name, args, s = i.op.name, [vals.get(id(a)) for a in i.inputs], i.shape
        if name == "@param":
            vals[id(i)] = feeds[i.op.parameter]
        elif name == "@literal":
            vals[id(i)] = i.op.value
        elif name == "@return":
            return [vals[id(a)] for a in i.inputs]
        elif name == "dot":
            vals[id(i)] = np.matmul(args[0].astype(np.float32), args[1].astype(np.float32)).astype(s.np_dtype)
        elif name == "fused_reduce":
            ks = reduce_source(i.op.module, [a.shape for a in i.inputs], s)
            vals[id(i)] = run_on_host([(ks, [np.ascontiguousarray(a) for a in args], s)], workdir)[0]
        elif name == "reshape":
            vals[id(i)] = args[0].reshape(s.lens)
        elif name == "transpose":
            vals[id(i)] = args[0].transpose(i.op.permutation)
        else:
            out = np.empty(s.lens, s.np_dtype)
            i.op.compute(HOST, out, args, [])
            vals[id(i)] = out
    raise AssertionError("no @return")


@pytest.mark.skipif(__import__("kernel_host").NVCC is None, reason="nvcc (CUDA toolkit) not found")
def test_causal_float16_attention_gpu_program_on_the_host(tmp_path):
    """ONNX Attention with is_causal, float16, Q [2, 3, 4, 8], K / V [2, 3, 6, 8] (the node suite's
    test_attention_4d_causal_fp16): the gpu lowering gives scaled Q and
    K, a batched GEMM, one generated mask + softmax kernel (float32 inside, one rounding to float16) and a
    second GEMM, no decode_attention kernel and nothing on the host; run on the host, that program equals
    the float64 oracle within float16 rounding."""
    import attn_oracle
    from onnx import TensorProto, helper

    feeds = {k: R.uniform(-1.5, 1.5, size=s).astype(np.float16)
             for k, s in (("q", (2, 3, 4, 8)), ("k", (2, 3, 6, 8)), ("v", (2, 3, 6, 8)))}
    model = make_model([helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)], feeds, ["y"], opset=23,
                       output_types={"y": TensorProto.FLOAT16})
    prog = _gpu_program(model)
    main = prog.get_main_module().instructions
    labels = [(i.op.name, i.meta["kernel"].label.split(" (")[0]) for i in main if "kernel" in i.meta]
    assert labels == [("mul", "generic"), ("mul", "generic"), ("dot", "gemm_batched"), ("fused_reduce", "reduce"),
                      ("dot", "gemm_batched")], labels
    assert not any(i.meta.get("on_host") for i in main)
    red = next(i for i in main if i.op.name == "fused_reduce")
    assert str(red.op).endswith("kernel=add_softmax_where]"), str(red.op)
    got = _emulate_gpu(prog, feeds, tmp_path)[0]
    visible = np.tril(np.ones((4, 6), bool))
    want = attn_oracle.attention(feeds["q"], feeds["k"], feeds["v"], 1 / np.sqrt(8), visible=visible)
    assert got.dtype == np.float16 and got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3)
