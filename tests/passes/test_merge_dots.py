"""merge_dots: hand-built programs against hand-built expected programs (dots of one activation and
constant weights -> one dot over the concatenated weight and slices of it; what is left alone), then
small ONNX models against onnxruntime and numpy, and the random LLaMA decode step (kernels per step,
greedy tokens against transformers)."""
import os

import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph import Program
from mgx_graph.passes import EliminateDeadCode, MergeDots, PassContext, PassManager, PipelineOptions
from mgx_graph.passes.merge_dots import constant_value
from mgx_graph.compiler import compile_program
from mgx_graph.targets import pipeline

from irtools import S, assert_same_ir, lit, op, run_pass
from util import make_model, ort_run

R = np.random.default_rng(11)


def rand(*lens, dtype="float32"):
    return R.normal(size=lens).astype(dtype)


def merge(prog):
    return run_pass(MergeDots(), prog)


def _instructions(prog) -> list:
    """Every instruction of ``prog``, those of ``fused_gemv`` submodules included (a dot fused with its
    norm and epilogue is still the dot merge_dots made)."""
    out = []
    for m in prog.module_order():
        for i in m.instructions:
            out.append(i)
            if i.op.name == "fused_gemv" and not i.module_inputs:  # lowered: the op keeps the module
                out += i.op.module.instructions
    return out


def dots(prog) -> list:
    return [i for i in _instructions(prog) if i.op.name == "dot"]


def literal_values(prog) -> list:
    return [i.op.value for i in prog.get_main_module().instructions if i.op.name == "@literal"]


def slice_op(start, end, axis=1):
    return op("slice", axes=[axis], starts=[start], ends=[end])


# -- IR in, IR out --------------------------------------------------------------------------------------------
WQ, WK, WV_T = rand(8, 8), rand(8, 4), rand(4, 8)  # the V weight is stored [N, K] and read transposed


def _qkv_program():
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 1, 8))
    wq, wk, wv_t = lit(m, WQ), lit(m, WK), lit(m, WV_T)
    q = m.add_instruction(op("dot"), [x, wq])
    k = m.add_instruction(op("dot"), [x, wk])
    v = m.add_instruction(op("dot"), [x, m.add_instruction(op("transpose", permutation=[1, 0]), [wv_t])])
    m.add_return([m.add_instruction(op("relu"), [q]), m.add_instruction(op("neg"), [k]),
                  m.add_instruction(op("exp"), [v])])
    return prog


def test_three_dots_of_one_activation_become_one_dot_and_three_slices():
    prog = merge(_qkv_program())

    want = Program()
    w = want.get_main_module()
    x = w.add_parameter("x", S("float32", 1, 8))
    wqkv = lit(w, np.concatenate([WQ, WK, WV_T.T], axis=1))
    y = w.add_instruction(op("dot"), [x, wqkv])
    q, k, v = (w.add_instruction(slice_op(a, b), [y]) for a, b in ((0, 8), (8, 12), (12, 16)))
    w.add_return([w.add_instruction(op("relu"), [q]), w.add_instruction(op("neg"), [k]),
                  w.add_instruction(op("exp"), [v])])
    assert_same_ir(prog, want)
    (merged,) = literal_values(prog)  # the old weights are gone; the new one holds all three, N-major
    np.testing.assert_array_equal(merged, np.concatenate([WQ, WK, WV_T.T], axis=1))
    assert merged.flags.c_contiguous


def without_merge(monkeypatch, build):
    """``build()`` with ``MIGRAPHX_DISABLE_PASSES=merge_dots`` (read afresh for this call only)."""
    from mgx_graph import env

    monkeypatch.setenv("MIGRAPHX_DISABLE_PASSES", os.environ.get("MIGRAPHX_DISABLE_PASSES", "") + ",merge_dots")
    env._reset_for_tests()
    try:
        return build()
    finally:
        monkeypatch.delenv("MIGRAPHX_DISABLE_PASSES")
        env._reset_for_tests()


def test_merged_program_matches_numpy_and_the_unmerged_program(target, monkeypatch):
    x = rand(1, 8)
    want = [np.maximum(x @ WQ, 0), -(x @ WK), np.exp(x @ WV_T.T)]
    merged = compile_program(_qkv_program(), target=target)
    unmerged = without_merge(monkeypatch, lambda: compile_program(_qkv_program(), target=target))
    assert (len(dots(merged)), len(dots(unmerged))) == (1, 3)
    outs = merged.run({"x": x})
    for got, ref in zip(outs, want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    for got, ref in zip(outs, unmerged.run({"x": x})):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def _pair_program(second_a=None, second_b=None, b_lens=(8, 4), out_read=None):
    """dot(x, W1) and dot(a2, B2), each read by a relu; ``second_a`` / ``second_b`` pick a2 and B2
    (default: x and a literal of ``b_lens``)."""
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 1, 8))
    y = m.add_parameter("y", S("float32", 1, 8))
    p = m.add_parameter("p", S("float32", *b_lens))
    a2 = {None: x, "y": y}[second_a]
    b2 = p if second_b == "param" else lit(m, rand(*b_lens))
    d1 = m.add_instruction(op("dot"), [x, lit(m, rand(8, 4))])
    d2 = m.add_instruction(op("dot"), [a2, b2])
    m.add_return([m.add_instruction(op("relu"), [d1]), m.add_instruction(op("relu"), [d2])])
    return prog


@pytest.mark.parametrize("case", ["other_activation", "weight_not_constant", "other_batch_dims"])
def test_dots_that_cannot_share_one_gemm_are_left_alone(case):
    build = {"other_activation": lambda: _pair_program(second_a="y"),
             "weight_not_constant": lambda: _pair_program(second_b="param"),
             "other_batch_dims": lambda: _pair_program(b_lens=(2, 8, 4))}[case]
    prog = build()
    before = prog.print()
    merge(prog)
    assert prog.print() == before


def test_dtypes_are_merged_apart():
    """fp32 dots of x and fp16 dots of convert(x): two merged dots, one per type."""
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 1, 8))
    h = m.add_instruction(op("convert", target_type="float16"), [x])
    w32, w16 = [rand(8, 4), rand(8, 2)], [rand(8, 3, dtype="float16"), rand(8, 5, dtype="float16")]
    outs = [m.add_instruction(op("dot"), [a, lit(m, w, w.dtype)]) for a, w in
            ((x, w32[0]), (h, w16[0]), (x, w32[1]), (h, w16[1]))]
    m.add_return([m.add_instruction(op("neg"), [o]) for o in outs])
    merge(prog)
    merged = dots(prog)
    assert [(d.shape.dtype, d.shape.lens) for d in merged] == [("float32", (1, 6)), ("float16", (1, 8))]
    values = {v.dtype.name: v for v in literal_values(prog)}
    np.testing.assert_array_equal(values["float32"], np.concatenate(w32, axis=1))
    np.testing.assert_array_equal(values["float16"], np.concatenate(w16, axis=1))


def test_a_weight_also_read_elsewhere_stays_for_its_other_reader(target):
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 1, 8))
    z = m.add_parameter("z", S("float32", 8, 4))
    w1, w2 = rand(8, 4), rand(8, 4)
    l1 = lit(m, w1)
    d1 = m.add_instruction(op("dot"), [x, l1])
    d2 = m.add_instruction(op("dot"), [x, lit(m, w2)])
    m.add_return([m.add_instruction(op("relu"), [d1]), m.add_instruction(op("relu"), [d2]),
                  m.add_instruction(op("add"), [l1, z])])  # W1 also read by an add
    merge(prog)
    run_pass(EliminateDeadCode(), prog)
    assert len(dots(prog)) == 1
    assert any(v is w1 or np.array_equal(v, w1) for v in literal_values(prog))  # kept for the add
    xv, zv = rand(1, 8), rand(8, 4)
    got = compile_program(prog, target=target).run({"x": xv, "z": zv})
    for g, ref in zip(got, [np.maximum(xv @ w1, 0), np.maximum(xv @ w2, 0), w1 + zv]):
        np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-6)


def _rows_program(reader):
    """x [3, 8] (M = 3: the slices are strided) times three weights; the second dot is read by
    ``reader``: ``pointwise`` (tanh), ``copy_reshape`` (a reshape a strided view cannot give),
    ``output`` (returned as it is: a standard output with a buffer of its own), ``transposed_output``
    (returned through a transpose: strided before and after, so bind_outputs copies it either way)."""
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 3, 8))
    d = [m.add_instruction(op("dot"), [x, lit(m, rand(8, n))]) for n in (4, 6, 2)]
    second = {"pointwise": lambda: m.add_instruction(op("tanh"), [d[1]]),
              "copy_reshape": lambda: m.add_instruction(op("reshape", dims=[18]), [d[1]]),
              "output": lambda: d[1],
              "transposed_output": lambda: m.add_instruction(op("transpose", permutation=[1, 0]), [d[1]])}[reader]()
    m.add_return([m.add_instruction(op("relu"), [d[0]]), second, m.add_instruction(op("exp"), [d[2]])])
    return prog


@pytest.mark.parametrize("reader, widths", [("pointwise", [12]), ("copy_reshape", [6, 6]), ("output", [6, 6]),
                                            ("transposed_output", [12])])
def test_strided_slices_go_only_to_readers_that_take_them(reader, widths, target):
    """N = 4, 6, 2: all three merge (12) or the first and last (4 + 2) and the second stays (6)."""
    prog = _rows_program(reader)
    weights = [v.copy() for v in literal_values(prog)]
    merge(prog)
    assert sorted(d.shape.lens[-1] for d in dots(prog)) == widths
    s = [i for i in prog.get_main_module().instructions if i.op.name == "slice"]
    assert s and all(not i.shape.standard() for i in s)  # rows of 12 (or 6) values: strided views
    xv = rand(3, 8)
    got = compile_program(prog, target=target).run({"x": xv})
    y = [xv @ w for w in weights]
    second = {"pointwise": np.tanh(y[1]), "copy_reshape": y[1].reshape(18), "output": y[1],
              "transposed_output": y[1].T}[reader]
    for g, ref in zip(got, [np.maximum(y[0], 0), second, np.exp(y[2])]):
        np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-6)


def test_slices_of_one_row_are_standard_and_feed_any_reader():
    """M = 1: a slice is a packed row (standard layout), so a reader with no strided kernel (here a
    reshape then scatternd, as the V projection into the KV cache) still reads it without a copy."""
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 1, 8))
    cache = m.add_parameter("cache", S("float32", 4, 2, 2))
    idx = m.add_literal(np.array([[1]], np.int64))
    k = m.add_instruction(op("dot"), [x, lit(m, rand(8, 4))])
    v = m.add_instruction(op("dot"), [x, lit(m, rand(8, 4))])
    upd = m.add_instruction(op("reshape", dims=[1, 2, 2]), [v])
    m.add_return([m.add_instruction(op("neg"), [k]), m.add_instruction(op("scatternd"), [cache, idx, upd])])
    merge(prog)
    assert len(dots(prog)) == 1
    upd = next(i for i in prog.get_main_module().instructions if i.op.name == "scatternd").inputs[2]
    assert upd.op.name == "reshape" and upd.inputs[0].op.name == "slice" and upd.shape.standard()


def _biased_program(reader):
    """Three dots of x, each plus a bias [N] (as a broadcast literal, or a [1, N] literal), then a
    view into a dot (``dot``: the adds stay kernels of their own) or a tanh (fused with its add)."""
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 1, 8))
    r = m.add_parameter("r", S("float32", 2, 5))
    outs = []
    for n in (4, 6, 2):
        d = m.add_instruction(op("dot"), [x, lit(m, rand(8, n))])
        if n == 6:  # a [1, N] literal read as it is
            b = lit(m, rand(1, n))
        else:  # a [N] literal broadcast to the output
            b = m.add_instruction(op("multibroadcast", out_lens=[1, n]), [lit(m, rand(n))])
        a = m.add_instruction(op("add"), [d, b] if n != 2 else [b, d])
        if reader == "dot":
            t = m.add_instruction(op("reshape", dims=[n // 2, 2]), [a])
            outs.append(m.add_instruction(op("dot"), [t, r]))
        else:
            outs.append(m.add_instruction(op("tanh"), [a]))
    m.add_return(outs)
    return prog


def test_biases_fold_into_one_add_when_the_adds_stand_alone(target):
    prog = _biased_program("dot")
    weights = literal_values(prog)
    w, b = [weights[0], weights[2], weights[4]], [weights[1], weights[3].reshape(-1), weights[5]]
    merge(prog)
    adds = [i for i in prog.get_main_module().instructions if i.op.name == "add"]
    assert len(adds) == 1 and adds[0].shape.lens == (1, 12)
    bias = constant_value(adds[0].inputs[1])[0]
    np.testing.assert_array_equal(np.asarray(bias).reshape(-1), np.concatenate(b))
    xv, rv = rand(1, 8), rand(2, 5)
    got = compile_program(prog, target=target).run({"x": xv, "r": rv})
    for g, wi, bi in zip(got, w, b):
        np.testing.assert_allclose(g, (xv @ wi + bi).reshape(-1, 2) @ rv, rtol=1e-5, atol=1e-5)


def test_biases_fused_into_their_readers_stay_apart():
    prog = merge(_biased_program("tanh"))
    assert len(dots(prog)) == 1
    adds = [i for i in prog.get_main_module().instructions if i.op.name == "add"]
    assert len(adds) == 3 and all(a.shape.lens[-1] in (4, 6, 2) for a in adds)


# -- ONNX models against onnxruntime ----------------------------------------------------------------------------
def _attention_in_projection_model(s_len):
    """Q, K, V projections of x [1, s, 16] (V's weight a Transpose of an [N, K] initializer), heads
    split by Reshape, plus a SiLU-gated MLP on tanh(x) (gate, up: two dots of another activation)."""
    init = {"wq": rand(16, 16), "wk": rand(16, 8), "wvt": rand(8, 16), "wg": rand(16, 24), "wu": rand(16, 24),
            "hq": np.array([1, s_len, 4, 4], np.int64), "hk": np.array([1, s_len, 2, 4], np.int64)}
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("Transpose", ["wvt"], ["wv"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "wv"], ["v"]),
             helper.make_node("Reshape", ["q", "hq"], ["q4"]), helper.make_node("Reshape", ["k", "hk"], ["k4"]),
             helper.make_node("Reshape", ["v", "hk"], ["v4"]),
             helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("Neg", ["qt"], ["qn"]), helper.make_node("Mul", ["kt", "half"], ["ks"]),
             helper.make_node("Neg", ["v4"], ["vn"]),
             helper.make_node("Tanh", ["x"], ["h"]),
             helper.make_node("MatMul", ["h", "wg"], ["g"]), helper.make_node("MatMul", ["h", "wu"], ["u"]),
             helper.make_node("Sigmoid", ["g"], ["sg"]), helper.make_node("Mul", ["g", "sg"], ["silu"]),
             helper.make_node("Mul", ["silu", "u"], ["mlp"])]
    init["half"] = np.array(0.5, np.float32)
    return make_model(nodes, {"x": np.zeros((1, s_len, 16), np.float32)}, ["qn", "ks", "vn", "mlp"], init)


@pytest.mark.parametrize("s_len", [1, 3], ids=["decode", "prefill"])
def test_projections_match_onnxruntime(target, s_len, monkeypatch):
    model, x = _attention_in_projection_model(s_len), rand(1, s_len, 16)
    want = ort_run(model, {"x": x})
    prog = mgx_graph.compile(model, target=target)
    assert sorted(d.shape.lens[-1] for d in dots(prog)) == [32, 48]  # Q K V: 16 + 8 + 8, gate up: 24 + 24
    for got, ref in zip(prog.run({"x": x}), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    plain = without_merge(monkeypatch, lambda: mgx_graph.compile(model, target=target))
    assert len(dots(plain)) == 5
    for got, ref in zip(plain.run({"x": x}), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_projections_in_fp16_match_onnxruntime(target):
    model, x = _attention_in_projection_model(1), rand(1, 1, 16)
    want = ort_run(model, {"x": x})
    prog = mgx_graph.compile(model, target=target, fp16=True)
    merged = dots(prog)
    assert sorted(d.shape.lens[-1] for d in merged) == [32, 48] and {d.shape.dtype for d in merged} == {"float16"}
    for got, ref in zip(prog.run({"x": x.astype(np.float16)}), want):
        np.testing.assert_allclose(got.astype(np.float32), ref, rtol=2e-2, atol=5e-2)


def test_disabled_by_name_and_listed_in_both_pipelines():
    for tname in ("ref", "gpu"):
        groups = {g.name: [p.name for p in g.passes] for g in pipeline(tname, PipelineOptions(fp16=True))}
        assert groups["fuse_kernels"][0] == "merge_dots"
        names = [g.name for g in pipeline(tname, PipelineOptions(fp16=True))]
        assert names.index("precision") < names.index("fuse_kernels")
    pm = PassManager(pipeline("ref", PipelineOptions()), disabled={"merge_dots"})
    assert pm.find("merge_dots") is None and pm.find("fuse_pointwise") is not None


# -- the decode step of a random LLaMA --------------------------------------------------------------------------
# (the `llama` fixture: tests/conftest.py)


def _kernels(prog, op_name=None) -> int:
    """Instructions that run a kernel (no views, no builtins) in every module of ``prog``; with
    ``op_name``, the instructions of that op, inside ``fused_gemv`` submodules too."""
    if op_name is not None:
        return sum(1 for i in _instructions(prog) if i.op.name == op_name)
    return sum(1 for m in prog.module_order() for i in m.instructions if not i.op.builtin and not i.op.is_view)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_decode_step_three_dots_fewer_per_layer(llama, fp16):
    """Per layer Q, K, V become one dot and gate, up one: three kernels fewer, on both targets."""
    layers = llama.config["num_layers"]
    for tname in ("ref", "gpu"):
        counts = []
        for disabled in ({"merge_dots", "fuse_gemv"}, {"fuse_gemv"}):  # fuse_gemv would hide kernels
            prog = mgx_graph.parse_onnx(str(llama.onnx_path))
            PassManager(pipeline(tname, PipelineOptions(fp16=fp16)), PassContext(tname), disabled=disabled).run(prog)
            counts.append((_kernels(prog), _kernels(prog, "dot")))
        (k0, d0), (k1, d1) = counts
        assert d0 - d1 == 3 * layers and k0 - k1 == 3 * layers, (tname, counts)


def _greedy(prog, llama, prompt, n_new):
    from mgx_graph.llm.generation import Decoder, generate

    return generate(Decoder(prog), prompt, n_new, llama.config["eos_token_ids"]).tokens


def test_decode_step_tokens_match_transformers(llama, monkeypatch):
    """fp32 with graphs: transformers' greedy tokens; fp16: the tokens of the unmerged fp16 step."""
    from mgx_graph.models.oracle import hf_greedy_tokens

    prompt, n_new = [5, 9, 2, 77], 8
    path, layers = str(llama.onnx_path), llama.config["num_layers"]
    prog = mgx_graph.compile(path, target="ref", hip_graph=True)
    plain = without_merge(monkeypatch, lambda: mgx_graph.compile(path, target="ref", hip_graph=True))
    assert _kernels(plain, "dot") - _kernels(prog, "dot") == 3 * layers
    want = hf_greedy_tokens(llama, prompt, n_new)
    assert _greedy(prog, llama, prompt, n_new) == _greedy(plain, llama, prompt, n_new) == want
    half = mgx_graph.compile(path, target="ref", fp16=True)
    half_plain = without_merge(monkeypatch, lambda: mgx_graph.compile(path, target="ref", fp16=True))
    assert _kernels(half_plain, "dot") - _kernels(half, "dot") == 3 * layers
    assert _greedy(half, llama, prompt, n_new) == _greedy(half_plain, llama, prompt, n_new)


@pytest.mark.slow
def test_smollm2_fp16_step_on_ref_gives_transformers_tokens(model_cache, run_shared, monkeypatch):
    """The real SmolLM2-135M decode step in fp16 on ref, graphs on: 3 kernels fewer per layer (Q K V
    one GEMM, gate up one) and transformers' greedy tokens (float32) for a chat prompt."""
    from mgx_graph.llm.generation import Decoder, generate
    from mgx_graph.models import build
    from mgx_graph.models.oracle import chat_prompt_ids

    from shared_oracle import hf_greedy_tokens_once

    try:
        info = build("smollm2", cache_dir=model_cache, progress=False)
    except ImportError as e:
        pytest.skip(f"model export needs the [export] extra: {e}")
    path, layers = str(info.onnx_path), info.config["num_layers"]
    monkeypatch.setenv("MIGRAPHX_DISABLE_PASSES", "fuse_gemv")  # it would fuse 2 more kernels per layer
    prog = mgx_graph.compile(path, target="ref", fp16=True, hip_graph=True)
    plain = without_merge(monkeypatch, lambda: mgx_graph.compile(path, target="ref", fp16=True, hip_graph=True))
    assert _kernels(plain) - _kernels(prog) == 3 * layers
    ids = chat_prompt_ids(info, "What is the capital of France?")
    want = hf_greedy_tokens_once(info, ids, 16, run_shared)
    assert generate(Decoder(prog), ids, 16, info.config["eos_token_ids"]).tokens == want
