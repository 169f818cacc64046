"""fuse_attention: the decomposed attention of the decode exports becomes one ``decode_attention``.  Hand-built
programs against hand-built expected programs (the pattern fused; near misses left alone), then ONNX models of
the decomposed attention against onnxruntime and the tiny llama / gpt2 exports against their unfused program."""
import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph import Program
from mgx_graph.passes import FuseAttention

from irtools import S, assert_same_ir, lit, op, run_pass
from util import make_model, ort_run


def _repeat(m, x, G):
    """transformers' repeat_kv as the exporter writes it: [B, Nkv, P, D] -> [B, Nkv * G, P, D]."""
    B, Nkv, P, D = x.shape.lens
    u = m.add_instruction(op("unsqueeze", axes=[2]), [x])
    b = m.add_instruction(op("multibroadcast", out_lens=[B, Nkv, G, P, D]), [u])
    c = m.add_instruction(op("contiguous"), [b])
    return m.add_instruction(op("reshape", dims=[B, Nkv * G, P, D]), [c])


def _k_transposed(m, kr):
    """K^T [B, N, H, P] of the repeated keys, as the export: reshape, transpose, reshape."""
    B, N, P, H = kr.shape.lens
    r = m.add_instruction(op("reshape", dims=[B * N, P, H]), [kr])
    t = m.add_instruction(op("transpose", permutation=[0, 2, 1]), [r])
    return m.add_instruction(op("reshape", dims=[B, N, H, P]), [t])


def attention(m, q, k, v, mask, *, G, s=0.5, guard=True, axis=-1, repeat=None, kt=None, mask_op="add"):
    """The decomposed attention of the decode step (``models/smollm2.py`` after quantize_fp16)."""
    dt = q.shape.dtype
    sl = lit(m, s, dt)
    kr = (repeat or _repeat)(m, k, G)
    kts = m.add_instruction(op("mul"), [(kt or _k_transposed)(m, kr), sl])
    sc = m.add_instruction(op("dot"), [m.add_instruction(op("mul"), [q, sl]), kts])
    if mask_op == "add":
        x = m.add_instruction(op("add"), [sc, m.add_instruction(op("convert", target_type=dt), [mask])])
    else:
        x = m.add_instruction(op("where"), [mask, sc, lit(m, mask_op, dt)])
    p = m.add_instruction(op("softmax", axis=axis), [x])
    if guard:
        p = m.add_instruction(op("where"), [m.add_instruction(op("isnan"), [p]), lit(m, 0.0, dt), p])
    return m.add_instruction(op("dot"), [p, (repeat or _repeat)(m, v, G)])


def program(dt="float16", B=1, N=6, Nkv=2, S_=1, P=16, H=8, mask_dt="float32", expected=None, **kw):
    prog = Program()
    m = prog.get_main_module()
    q, k = m.add_parameter("q", S(dt, B, N, S_, H)), m.add_parameter("k", S(dt, B, Nkv, P, H))
    v = m.add_parameter("v", S(dt, B, Nkv, P, H))
    mask = m.add_parameter("mask", S(mask_dt, B, 1, S_, P)) if kw.get("mask_op", "add") == "add" else \
        m.add_parameter("mask", S("bool", B, 1, S_, P))
    m.add_return([expected(m, q, k, v, mask) if expected else attention(m, q, k, v, mask, G=N // Nkv, **kw)])
    return prog


def fused_one(scale, nan_zero=1, with_mask=True):
    def build(m, q, k, v, mask):
        op_ = op("decode_attention", scale=scale, mask=int(with_mask), nan_zero=nan_zero)
        return m.add_instruction(op_, [q, k, v] + ([mask] if with_mask else []))
    return build


def fuse(prog, **kw):
    return run_pass(FuseAttention(**kw), prog)


# -- IR in, IR out: the pattern -------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", ["float16", "float32"])
def test_gqa_decode_attention_is_one_instruction(dt):
    s = float(np.asarray(0.3535, dt))
    assert_same_ir(fuse(program(dt, s=s)), program(dt, expected=fused_one(s * s)))


def test_without_the_nan_guard_a_masked_row_stays_nan():
    assert_same_ir(fuse(program(guard=False)), program(expected=fused_one(0.25, nan_zero=0)))


def test_heads_one_to_one_and_a_mask_of_the_scores_type():
    """GPT-2: no repetition (G = 1); the mask already float16 stays as it is."""
    want = program(N=4, Nkv=4, mask_dt="float16", expected=fused_one(0.25))
    got = fuse(program(N=4, Nkv=4, mask_dt="float16"))
    text = got.print()
    assert "convert" not in text and text.count("decode_attention") == 1
    assert_same_ir(got, want)


def test_where_mask_with_minus_infinity_becomes_an_additive_mask():
    def want(m, q, k, v, c):
        dt = q.shape.dtype
        zero, ninf = lit(m, 0.0, dt), lit(m, -np.inf, dt)
        mk = m.add_instruction(op("where"), [c, zero, ninf])
        return m.add_instruction(op("decode_attention", scale=0.25, mask=1, nan_zero=1), [q, k, v, mk])

    got = fuse(program(mask_op=-np.inf))
    assert "decode_attention" in got.print() and "softmax" not in got.print()
    assert_same_ir(got, program(mask_op=-np.inf, expected=want))


def test_several_query_rows_and_a_batch():
    assert_same_ir(fuse(program(B=2, S_=3)), program(B=2, S_=3, expected=fused_one(0.25)))


# -- near misses: left alone ----------------------------------------------------------------------------------
def _unchanged(**kw):
    prog, same = program(**kw), program(**kw)
    fuse(prog)
    assert "decode_attention" not in prog.print()
    assert_same_ir(prog, same)


def _tile(m, x, G):
    """Heads repeated as a tile (head n reads KV head n % Nkv): not the GQA grouping."""
    B, Nkv, P, D = x.shape.lens
    u = m.add_instruction(op("unsqueeze", axes=[1]), [x])
    b = m.add_instruction(op("multibroadcast", out_lens=[B, G, Nkv, P, D]), [u])
    return m.add_instruction(op("reshape", dims=[B, G * Nkv, P, D]), [m.add_instruction(op("contiguous"), [b])])


def _not_transposed(m, kr):
    return kr  # [B, N, P, H] read as [B, N, H, P]: only shape-compatible when P == H


def test_heads_tiled_instead_of_grouped_read_the_copy():
    """Head n of a tile reads KV head n % Nkv: not GQA's grouping of the parameters, so the fused attention
    reads the materialized copy (N heads, G = 1) rather than the cache."""
    prog = fuse(program(repeat=_tile))
    att = next(i for i in prog.get_main_module().instructions if i.op.name == "decode_attention")
    assert [i.op.name for i in att.inputs[1:3]] == ["reshape", "reshape"]
    assert [i.inputs[0].op.name for i in att.inputs[1:3]] == ["contiguous", "contiguous"]
    assert att.inputs[1].shape.lens == (1, 6, 16, 8)


def test_keys_not_transposed():
    _unchanged(P=8, H=8, kt=_not_transposed)


def test_softmax_over_another_axis():
    _unchanged(N=4, Nkv=4, S_=1, P=4, H=4, axis=1)


def test_a_finite_where_fill_is_not_an_additive_mask():
    _unchanged(mask_op=-1e4)


def test_a_guard_that_fills_another_value():
    prog = Program()
    m = prog.get_main_module()
    dt = "float32"
    q, k = m.add_parameter("q", S(dt, 1, 2, 1, 4)), m.add_parameter("k", S(dt, 1, 2, 4, 4))
    v = m.add_parameter("v", S(dt, 1, 2, 4, 4))
    sc = m.add_instruction(op("dot"), [q, _k_transposed(m, k)])
    p = m.add_instruction(op("softmax", axis=-1), [sc])
    g = m.add_instruction(op("where"), [m.add_instruction(op("isnan"), [p]), lit(m, 1.0, dt), p])
    m.add_return([m.add_instruction(op("dot"), [g, v])])
    fuse(prog)
    assert "decode_attention" not in prog.print() and "softmax" in prog.print()


def test_probabilities_read_elsewhere():
    prog = Program()
    m = prog.get_main_module()
    dt = "float32"
    q, k = m.add_parameter("q", S(dt, 1, 2, 1, 4)), m.add_parameter("k", S(dt, 1, 2, 4, 4))
    v = m.add_parameter("v", S(dt, 1, 2, 4, 4))
    p = m.add_instruction(op("softmax", axis=-1), [m.add_instruction(op("dot"), [q, _k_transposed(m, k)])])
    m.add_return([m.add_instruction(op("dot"), [p, v]), p])
    fuse(prog)
    assert "decode_attention" not in prog.print()


def test_a_mask_that_broadcasts_the_scores():
    prog = Program()
    m = prog.get_main_module()
    dt = "float32"
    q, k = m.add_parameter("q", S(dt, 1, 2, 1, 4)), m.add_parameter("k", S(dt, 1, 2, 4, 4))
    v, mask = m.add_parameter("v", S(dt, 1, 2, 4, 4)), m.add_parameter("mask", S(dt, 1, 2, 3, 4))
    sc = m.add_instruction(op("dot"), [q, _k_transposed(m, k)])
    p = m.add_instruction(op("softmax", axis=-1), [m.add_instruction(op("add"), [sc, mask])])
    m.add_return([m.add_instruction(op("dot"), [p, v])])
    fuse(prog)
    assert "decode_attention" not in prog.print()


def test_a_vector_scale_is_not_a_scale():
    prog = Program()
    m = prog.get_main_module()
    dt = "float32"
    q, k = m.add_parameter("q", S(dt, 1, 2, 1, 4)), m.add_parameter("k", S(dt, 1, 2, 4, 4))
    v = m.add_parameter("v", S(dt, 1, 2, 4, 4))
    sc = m.add_instruction(op("dot"), [q, _k_transposed(m, k)])
    scaled = m.add_instruction(op("mul"), [sc, lit(m, [0.5, 1.0, 2.0, 0.5], dt)])
    p = m.add_instruction(op("softmax", axis=-1), [scaled])
    m.add_return([m.add_instruction(op("dot"), [p, v])])
    fuse(prog)
    assert "decode_attention" not in prog.print()


def test_a_long_prompt_keeps_its_gemms():
    prog, same = program(S_=3), program(S_=3)
    fuse(prog, max_query_rows=2)
    assert_same_ir(prog, same)


def test_excluded_ops_are_not_fused():
    prog, same = program(), program()
    fuse(prog, exclude=("softmax",))
    assert_same_ir(prog, same)


# -- numbers: ONNX models of the decomposed attention, the tiny exports ----------------------------------------
LOWEST = np.float32(np.finfo(np.float32).min)


def _decomposed(N, Nkv, S_, P, H):
    """The decode step's attention as torch exports it: repeat_kv (Unsqueeze, Expand, Reshape), sqrt-scaled q
    and K^T, the causal mask where(t <= pos, 0, lowest), Softmax, the NaN guard, the value MatMul."""
    G, s = N // Nkv, np.float32(H ** -0.25)
    nodes = []
    for name in ("k", "v"):
        nodes += [helper.make_node("Unsqueeze", [name, "ax2"], [f"{name}u"]),
                  helper.make_node("Expand", [f"{name}u", "rep"], [f"{name}e"]),
                  helper.make_node("Reshape", [f"{name}e", "heads"], [f"{name}r"])]
    nodes += [helper.make_node("Transpose", ["kr"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("Mul", ["kt", "s"], ["ks"]), helper.make_node("Mul", ["q", "s"], ["qs"]),
              helper.make_node("MatMul", ["qs", "ks"], ["sc"]),
              helper.make_node("LessOrEqual", ["rows", "pos"], ["see"]),
              helper.make_node("Where", ["see", "zero", "lowest"], ["mask"]),
              helper.make_node("Add", ["sc", "mask"], ["x"]), helper.make_node("Softmax", ["x"], ["p"], axis=-1),
              helper.make_node("IsNaN", ["p"], ["bad"]), helper.make_node("Where", ["bad", "zero", "p"], ["g"]),
              helper.make_node("MatMul", ["g", "vr"], ["out"])]
    init = {"ax2": np.array([2], np.int64), "rep": np.array([1, Nkv, G, P, H], np.int64),
            "heads": np.array([1, N, P, H], np.int64), "s": s, "zero": np.float32(0), "lowest": LOWEST,
            "rows": np.arange(P, dtype=np.int64).reshape(1, 1, 1, P)}
    rng = np.random.default_rng(P)
    feeds = {"q": rng.normal(size=(1, N, S_, H)).astype(np.float32),
             "k": rng.normal(size=(1, Nkv, P, H)).astype(np.float32),
             "v": rng.normal(size=(1, Nkv, P, H)).astype(np.float32), "pos": np.array([P // 2], np.int64)}
    return make_model(nodes, feeds, ["out"], init), feeds


SHAPES = [(6, 2, 1, 16, 8), (4, 4, 2, 7, 16), (8, 2, 1, 300, 32)]


@pytest.mark.parametrize("N,Nkv,S_,P,H", SHAPES)
def test_decomposed_attention_matches_onnxruntime(target, N, Nkv, S_, P, H):
    model, feeds = _decomposed(N, Nkv, S_, P, H)
    prog = mgx_graph.compile(model, target=target)
    assert prog.print().count("decode_attention") == 1 and "softmax" not in prog.print()
    for pos in (P // 2, P - 1, -1):  # -1: every key masked (a finite mask in float32: the mean of the values)
        feeds["pos"] = np.array([pos], np.int64)
        np.testing.assert_allclose(prog.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5,
                                   err_msg=f"pos {pos}")
    prog.release()


@pytest.mark.parametrize("N,Nkv,S_,P,H", SHAPES)
def test_decomposed_attention_in_half_matches_onnxruntime_and_the_unfused_program(target, monkeypatch,
                                                                                  N, Nkv, S_, P, H):
    model, feeds = _decomposed(N, Nkv, S_, P, H)
    half = {n: a.astype(np.float16) if a.dtype == np.float32 else a for n, a in feeds.items()}
    prog = mgx_graph.compile(model, target=target, fp16=True)
    assert "decode_attention" in prog.print()
    monkeypatch.setenv("MIGRAPHX_DISABLE_PASSES", "fuse_attention")
    from mgx_graph import env

    env._reset_for_tests()
    plain = mgx_graph.compile(model, target=target, fp16=True)
    assert "decode_attention" not in plain.print() and "softmax" in plain.print()
    exact = {n: a.astype(np.float32) if a.dtype == np.float16 else a for n, a in half.items()}
    for pos in (P // 2, P - 1, -1):
        half["pos"] = exact["pos"] = np.array([pos], np.int64)
        got, unfused = prog.run(half)[0], plain.run(half)[0]
        np.testing.assert_allclose(got, unfused, rtol=1e-2, atol=2e-3, err_msg=f"pos {pos}")
        if pos >= 0:
            np.testing.assert_allclose(got, ort_run(model, exact)[0], rtol=1e-2, atol=2e-3, err_msg=f"pos {pos}")
        else:  # the float32 lowest is -inf in half: every key hidden, the NaN guard gives 0
            assert np.all(got == 0) and np.all(unfused == 0)
    prog.release()
    plain.release()


# (the `tiny` fixture, a small gpt2 and llama decode step: tests/conftest.py)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_tiny_exports_fuse_every_layer(tiny, target, fp16, monkeypatch):
    from mgx_graph import env
    from mgx_graph.llm.generation import Decoder

    progs = []
    for disabled in ("", "fuse_attention"):
        monkeypatch.setenv("MIGRAPHX_DISABLE_PASSES", disabled)
        env._reset_for_tests()
        progs.append(mgx_graph.compile(str(tiny.onnx_path), target=target, fp16=fp16))
    fused, plain = progs
    layers = sum(1 for n in tiny.alias if n.endswith(".key"))
    assert fused.print().count("decode_attention[") == layers and "softmax" not in fused.print()
    assert "decode_attention" not in plain.print()
    decs = [Decoder(p) for p in progs]
    tol = (2e-2, 2e-2) if fp16 else (1e-5, 1e-5)
    for t in [3, 17, 42, 5, 99, 8]:
        logits = []
        for p, d in zip(progs, decs):
            d.step(t)
            logits.append(np.asarray(p.context.to_host(d.last_logits, p.queue), np.float32))
        np.testing.assert_allclose(logits[0], logits[1], *tol)
    for p in progs:
        p.release()
