"""fuse_gemv: a one-row ``dot`` against a constant weight with the RMSNorm ``fused_reduce`` before it and
the ``pointwise`` epilogue after it (SiLU(gate) * up over slices of a merged gate / up projection)
becomes one ``fused_gemv``.  Hand-built decoder-layer fragments go through the real fusion passes
(fuse_reduce, fuse_pointwise, then gemv_layout on gpu) and fuse_gemv; the result is compared with a
hand-built expected program, and what is left unfused is checked case by case; then values against a
float64 numpy oracle and against the unfused program on each target."""
import re

import numpy as np
import pytest

from mgx_graph import Program
from mgx_graph.operators.gemv_gpu import PREFETCH
from mgx_graph.passes import (EliminateDeadCode, FuseGemv, FusePointwise, FuseReduce, GemvLayout, PassContext,
                              PassManager)
from mgx_graph.compiler import compile_program

import gemv_host
from irtools import S, assert_same_ir, lit, op, run_pass
from test_fuse_reduce import want_module

EPS = 1e-5


def _layer(dtype="float32", K=64, L=24, *, rows=1, weight="literal", lens=None, norm_read=False,
           early_residual=False, epilogue=True, seed=0):
    """``h = x + r; n = rms_norm(h, g); y = n @ W [K, 2L]; out = silu(y[:L]) * y[L:]`` and a later
    ``neg(h)`` (the next residual add's stand-in).  ``weight`` ``param``: W a parameter; ``lens``: the
    two slice lengths (default L, L); ``norm_read``: n returned too; ``early_residual``: ``neg(h)``
    placed between the dot and the epilogue; ``epilogue`` False: y returned as it is.  Returns
    ``(program, {name: numpy value})`` of the literals."""
    rng = np.random.default_rng(seed)
    la, lb = lens or (L, L)
    prog = Program()
    m = prog.get_main_module()
    x, r = m.add_parameter("x", S(dtype, 1, rows, K)), m.add_parameter("r", S(dtype, 1, rows, K))
    gv = (1 + 0.1 * rng.standard_normal(K)).astype(dtype)
    wv = (rng.standard_normal((K, la + lb)) / np.sqrt(K)).astype(dtype)
    g = lit(m, gv, dtype)
    w = m.add_parameter("w", S(dtype, K, la + lb)) if weight == "param" else lit(m, wv, dtype)
    h = m.add_instruction(op("add"), [x, r])
    n = m.add_instruction(op("rms_norm", axis=-1, epsilon=EPS), [h, g])
    y = m.add_instruction(op("dot"), [n, w])
    outs = [y]
    if early_residual:
        early = m.add_instruction(op("neg"), [h])
    if epilogue:
        gate = m.add_instruction(op("slice", axes=[2], starts=[0], ends=[la]), [y])
        up = m.add_instruction(op("slice", axes=[2], starts=[la], ends=[la + lb]), [y])
        if la != lb:
            up = m.add_instruction(op("slice", axes=[2], starts=[0], ends=[la]),
                                   [m.add_instruction(op("neg"), [up])])
        silu = m.add_instruction(op("mul"), [gate, m.add_instruction(op("sigmoid"), [gate])])
        outs = [m.add_instruction(op("mul"), [silu, up])]
    outs.append(early if early_residual else m.add_instruction(op("neg"), [h]))
    if norm_read:
        outs.append(n)
    m.add_return(outs)
    return prog, {"g": gv, "w": wv}


def _fuse(prog, target="ref"):
    """The passes up to fuse_gemv as the target's pipeline runs them (gemv_layout on gpu)."""
    for p in [FuseReduce(), FusePointwise(), EliminateDeadCode()] + ([GemvLayout()] if target == "gpu" else []):
        run_pass(p, prog, target=target)
    before = _summary(prog)
    run_pass(FuseGemv(), prog, target=target)
    run_pass(EliminateDeadCode(), prog)
    return before, _summary(prog)


def fused_args(f, feeds) -> list:
    """The launch arguments of ``fused_gemv`` instruction ``f``'s inputs: parameters from ``feeds`` by name,
    literals (the weight through gemv_layout's transpose) by value."""
    args = []
    for i in f.inputs:
        src = i.inputs[0] if i.op.name == "transpose" else i
        args.append(feeds[src.op.parameter] if src.op.name == "@param" else np.ascontiguousarray(src.op.value))
    return args


def _summary(prog):
    """``[(op, kernel)]`` of the main module's instructions but parameters and literals; ``kernel``: the
    op names in a fused instruction's submodule (views and builtins left out)."""
    out = []
    for ins in prog.get_main_module().instructions:
        if ins.op.name in ("@param", "@literal", "@return"):
            continue
        inner = ""
        if ins.module_inputs:
            inner = "_".join(i.op.name for i in ins.module_inputs[0].instructions
                             if not i.op.builtin and not i.op.is_view)
        out.append((ins.op.name, inner))
    return out


# -- IR in, IR out ----------------------------------------------------------------------------------------
def test_norm_dot_and_silu_mul_are_one_fused_gemv_returning_the_residual_too():
    got, vals = _layer()
    _fuse(got)

    want = Program()
    m = want.get_main_module()
    x, r = m.add_parameter("x", S("float32", 1, 1, 64)), m.add_parameter("r", S("float32", 1, 1, 64))
    g, w = lit(m, vals["g"]), lit(m, vals["w"])

    def body(s, p):
        h = s.add_instruction(op("add"), [p[0], p[1]])
        n = s.add_instruction(op("rms_norm", axis=-1, epsilon=EPS), [h, p[2]])
        y = s.add_instruction(op("dot"), [n, p[3]])
        gate = s.add_instruction(op("slice", axes=[2], starts=[0], ends=[24]), [y])
        up = s.add_instruction(op("slice", axes=[2], starts=[24], ends=[48]), [y])
        sig = s.add_instruction(op("sigmoid"), [gate])
        silu = s.add_instruction(op("mul"), [gate, sig])
        return [s.add_instruction(op("mul"), [silu, up]), h]

    sub = want_module(m, [x, r, g, w], body, "fused_gemv")
    f = m.add_instruction(op("fused_gemv", module=sub), [x, r, g, w], [sub])
    out, h = (m.add_instruction(op("get_tuple_elem", index=k), [f]) for k in (0, 1))
    m.add_return([out, m.add_instruction(op("neg"), [h])])
    assert_same_ir(got, want)


def test_on_gpu_the_dot_reads_the_weight_gemv_layout_stored():
    prog, _ = _layer("float16")
    before, after = _fuse(prog, "gpu")
    assert ("dot", "") in before and after == [("transpose", ""), ("fused_gemv", "add_rms_norm_dot_sigmoid_mul_mul"),
                                               ("get_tuple_elem", ""), ("get_tuple_elem", ""), ("neg", "")]
    f = next(i for i in prog.get_main_module().instructions if i.op.name == "fused_gemv")
    wt = f.inputs[-1]
    assert wt.op.name == "transpose" and wt.inputs[0].op.name == "@literal" and wt.shape.strides == (1, 64)


def test_dot_alone_after_the_norm_takes_the_prologue():
    prog, _ = _layer(epilogue=False)
    before, after = _fuse(prog)
    assert before == [("fused_reduce", "add_rms_norm"), ("get_tuple_elem", ""), ("get_tuple_elem", ""),
                      ("dot", ""), ("neg", "")]
    assert after == [("fused_gemv", "add_rms_norm_dot"), ("get_tuple_elem", ""), ("get_tuple_elem", ""),
                     ("neg", "")]


def test_a_second_reader_of_the_normalized_row_keeps_the_norm_apart():
    prog, _ = _layer(norm_read=True)
    _, after = _fuse(prog)
    assert [k for k in after if k[0] != "get_tuple_elem"] == [("fused_reduce", "add_rms_norm"),
                                                              ("fused_gemv", "dot_sigmoid_mul_mul"), ("neg", "")]


def test_a_dot_the_gemv_would_not_run_is_left_alone():
    """A weight that is a parameter (not constant), or two rows: nothing changes."""
    for kw in (dict(weight="param"), dict(rows=2)):
        prog, _ = _layer(**kw)
        before, after = _fuse(prog)
        assert after == before and not any(k[0] == "fused_gemv" for k in after), kw


def test_slices_of_unequal_length_leave_the_epilogue_apart():
    prog, _ = _layer(lens=(24, 32))
    _, after = _fuse(prog)
    assert ("fused_gemv", "add_rms_norm_dot") in after
    assert any(k[0] == "pointwise" for k in after)


def test_a_multi_row_norm_is_not_taken():
    prog, _ = _layer(rows=3, epilogue=False)
    before, after = _fuse(prog)
    assert after == before


def test_a_residual_read_before_the_epilogue_keeps_the_epilogue_apart():
    prog, _ = _layer(early_residual=True)
    _, after = _fuse(prog)
    assert after == [("fused_gemv", "add_rms_norm_dot"), ("get_tuple_elem", ""), ("get_tuple_elem", ""),
                     ("neg", ""), ("slice", ""), ("slice", ""), ("pointwise", "sigmoid_mul_mul")]


@pytest.mark.parametrize("env", [("MIGRAPHX_DISABLE_PASSES", "fuse_gemv"), ("MIGRAPHX_GEMV", "0")])
@pytest.mark.parametrize("tname", ["ref", "gpu"])
def test_disabled_pass_or_gemv_off_leaves_the_program(env, tname, monkeypatch):
    """Through the target's pipeline (no lowering): the pass named in MIGRAPHX_DISABLE_PASSES, or
    the gemv kernel off, keeps fused_reduce, dot and pointwise; with neither, one fused_gemv."""
    from mgx_graph import env as menv
    from mgx_graph.passes import PipelineOptions
    from mgx_graph.targets import pipeline

    def ops():
        menv._reset_for_tests()
        prog, _ = _layer("float16")
        groups = [g for g in pipeline(tname, PipelineOptions()) if g.name not in ("lower", "graph", "memory")]
        PassManager(groups, PassContext(tname)).run(prog)
        return [k[0] for k in _summary(prog)]

    assert "fused_gemv" in ops()
    monkeypatch.setenv(*env)
    left = ops()
    assert "fused_gemv" not in left and {"fused_reduce", "dot", "pointwise"} <= set(left)


# -- values ------------------------------------------------------------------------------------------------
def _oracle(xv, rv, vals, dtype, epilogue=True):
    """float64 numpy of the layer, rounding where the program stores ``dtype`` values."""
    h = xv.astype(np.float64) + rv.astype(np.float64)
    hs = h.astype(dtype).astype(np.float64)
    n = hs / np.sqrt(np.mean(hs * hs, axis=-1, keepdims=True) + EPS) * vals["g"].astype(np.float64)
    y = n.astype(dtype).astype(np.float64) @ vals["w"].astype(np.float64)
    y = y.astype(dtype).astype(np.float64)
    if not epilogue:
        return y, -hs
    L = y.shape[-1] // 2
    gate, up = y[..., :L], y[..., L:]
    return gate / (1 + np.exp(-gate)) * up, -hs


@pytest.mark.parametrize("dtype, K, L, epilogue", [("float16", 64, 24, True), ("float16", 576, 160, True),
                                                   ("float32", 96, 40, False), ("float16", 100, 7, True),
                                                   # past the weight prefetch depth on gpu: 32 16-byte
                                                   # loads per thread and row; 12 element loads
                                                   ("float16", 8192, 1056, True), ("float16", 3001, 4, True)])
def test_fused_layer_matches_numpy_and_the_unfused_program(dtype, K, L, epilogue, target, monkeypatch):
    from mgx_graph import env as menv

    prog, vals = _layer(dtype, K, L, epilogue=epilogue, seed=K)
    rng = np.random.default_rng(K + 1)
    feeds = {"x": rng.standard_normal((1, 1, K)).astype(dtype), "r": rng.standard_normal((1, 1, K)).astype(dtype)}
    fused = compile_program(prog, target=target)
    kinds = [i.op.name for i in fused.program.get_main_module().instructions]
    assert "fused_gemv" in kinds and "dot" not in kinds and "fused_reduce" not in kinds
    got = fused.run(feeds)
    monkeypatch.setenv("MIGRAPHX_DISABLE_PASSES", "fuse_gemv")
    menv._reset_for_tests()
    plain = compile_program(_layer(dtype, K, L, epilogue=epilogue, seed=K)[0], target=target)
    assert "fused_gemv" not in [i.op.name for i in plain.program.get_main_module().instructions]
    want = plain.run(feeds)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if target == "ref":
            assert np.array_equal(g, w)  # the same kernels in the same order
        else:  # one kernel in place of three: within a float16 rounding step
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=2e-3, atol=2e-3)
    tol = 4e-3 if dtype == "float16" else 1e-5
    for g, o in zip(got, _oracle(feeds["x"], feeds["r"], vals, dtype, epilogue)):
        np.testing.assert_allclose(g.astype(np.float64), o, rtol=tol, atol=tol)


# -- the generated kernel on the host ----------------------------------------------------------------------
def _gpu_fused(dtype, K, L, epilogue, seed):
    prog, vals = _layer(dtype, K, L, epilogue=epilogue, seed=seed)
    _fuse(prog, "gpu")
    f = next(i for i in prog.get_main_module().instructions if i.op.name == "fused_gemv")
    return f, vals


@pytest.mark.skipif(not gemv_host.available(), reason="needs g++")
@pytest.mark.parametrize("dtype, K, L, epilogue", [("float16", 64, 24, True), ("float16", 576, 40, True),
                                                   ("float32", 96, 20, False), ("float16", 100, 7, True),
                                                   ("float16", 1536, 9, False)])
def test_generated_kernel_on_the_host_matches_numpy(dtype, K, L, epilogue, rng):
    """Both variants of the kernel (16-byte and element loads) built for the host (one std::thread per
    CUDA thread): the result against the float64 oracle, the residual sum exactly x + r rounded."""
    from mgx_graph.operators.fused_gemv_codegen import fused_gemv_source

    f, vals = _gpu_fused(dtype, K, L, epilogue, K)
    xv, rv = (rng.standard_normal((1, 1, K)).astype(dtype) for _ in range(2))
    wt = f.inputs[3].inputs[0].op.value  # W^T [N, K] as gemv_layout stored it
    assert np.array_equal(wt.T, vals["w"])
    want, neg_h = _oracle(xv, rv, vals, dtype, epilogue)
    shapes = [i.shape for i in f.inputs]
    for vector in (True, False):
        ks, plan, parts = fused_gemv_source(f.module_inputs[0], shapes, f.shape, vector)
        first = None
        for grid in (ks.grid, 1, 3):  # fewer blocks than column groups: each block loops over several
            y = np.full(want.shape, 7, dtype)
            h = np.full((1, 1, K), 7, dtype)
            gemv_host.run_fused(ks, [xv, rv, vals["g"], wt, y, h], (grid,))
            tol = 4e-3 if dtype == "float16" else 1e-5
            np.testing.assert_allclose(y.astype(np.float64), want, rtol=tol, atol=tol)
            assert np.array_equal(h, (xv.astype(np.float32) + rv.astype(np.float32)).astype(dtype))
            first = y if first is None else first
            assert np.array_equal(y, first)  # each column's sums in the same order whatever the grid
        assert ks.grid * plan.cols >= want.shape[-1] and plan.N == vals["w"].shape[1]


# -- epilogues reading the dot's columns at other offsets ------------------------------------------------------
def _offset_layer(case, dtype, K=64, N=48):
    """``n = rms_norm(x + r, g); y = n @ W [K, N]`` and an epilogue over last-axis slices of y that the
    SiLU layer does not build: ``overlap`` (y[:24] * y[12:36]), ``reverse`` (y[24:] - y[:24], the later
    slice first), ``tail`` (y[34:41] * y[41:48]), ``extra`` ((y[:24] + z) * y[24:], z a parameter),
    ``one`` (silu(y[24:]) alone).  Returns ``(program, values, oracle)``: ``oracle(Y, z)`` the epilogue
    in float64 of the dot's result ``Y``."""
    rng = np.random.default_rng(3)
    prog = Program()
    m = prog.get_main_module()
    x, r = m.add_parameter("x", S(dtype, 1, 1, K)), m.add_parameter("r", S(dtype, 1, 1, K))
    z = m.add_parameter("z", S(dtype, 1, 1, 24))
    vals = {"g": (1 + 0.1 * rng.standard_normal(K)).astype(dtype),
            "w": (rng.standard_normal((K, N)) / np.sqrt(K)).astype(dtype)}
    h = m.add_instruction(op("add"), [x, r])
    n = m.add_instruction(op("rms_norm", axis=-1, epsilon=EPS), [h, lit(m, vals["g"], dtype)])
    y = m.add_instruction(op("dot"), [n, lit(m, vals["w"], dtype)])

    def cols(a, b):
        return m.add_instruction(op("slice", axes=[2], starts=[a], ends=[b]), [y])

    def ew(name, *args):
        return m.add_instruction(op(name), list(args))

    if case == "overlap":
        out, fn = ew("neg", ew("mul", cols(0, 24), cols(12, 36))), lambda Y, Z: -(Y[..., :24] * Y[..., 12:36])
    elif case == "reverse":
        late = cols(24, 48)
        out, fn = ew("neg", ew("sub", late, cols(0, 24))), lambda Y, Z: -(Y[..., 24:] - Y[..., :24])
    elif case == "tail":
        out, fn = ew("neg", ew("mul", cols(34, 41), cols(41, 48))), lambda Y, Z: -(Y[..., 34:41] * Y[..., 41:])
    elif case == "extra":
        out, fn = ew("mul", ew("add", cols(0, 24), z), cols(24, 48)), lambda Y, Z: (Y[..., :24] + Z) * Y[..., 24:]
    else:
        up = cols(24, 48)
        out, fn = ew("mul", up, ew("sigmoid", up)), lambda Y, Z: Y[..., 24:] / (1 + np.exp(-Y[..., 24:]))
    m.add_return([out, ew("neg", h)])
    return prog, vals, fn


def _offset_oracle(feeds, vals, dtype, fn):
    hs = (feeds["x"].astype(np.float32) + feeds["r"].astype(np.float32)).astype(dtype).astype(np.float64)
    n = hs / np.sqrt(np.mean(hs * hs, axis=-1, keepdims=True) + EPS) * vals["g"].astype(np.float64)
    y = (n.astype(dtype).astype(np.float64) @ vals["w"].astype(np.float64)).astype(dtype).astype(np.float64)
    return fn(y, feeds["z"].astype(np.float64))


def _offset_feeds(dtype, K=64):
    rng = np.random.default_rng(5)
    return {"x": rng.standard_normal((1, 1, K)).astype(dtype), "r": rng.standard_normal((1, 1, K)).astype(dtype),
            "z": rng.standard_normal((1, 1, 24)).astype(dtype)}


CASES = ["overlap", "reverse", "tail", "extra", "one"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_epilogue_at_other_column_offsets_matches_numpy(case, dtype, target):
    """Compiled for the target: one fused_gemv holding the norm, the dot and the epilogue, whose values
    equal the float64 numpy oracle."""
    prog, vals, fn = _offset_layer(case, dtype)
    fused = compile_program(prog, target=target)
    kinds = [i.op.name for i in fused.program.get_main_module().instructions]
    assert kinds.count("fused_gemv") == 1 and "dot" not in kinds and "pointwise" not in kinds, kinds
    feeds = _offset_feeds(dtype)
    got = fused.run(feeds)[0]
    tol = 4e-3 if dtype == "float16" else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), _offset_oracle(feeds, vals, dtype, fn), rtol=tol, atol=tol)


@pytest.mark.skipif(not gemv_host.available(), reason="needs g++")
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_generated_kernel_at_other_column_offsets_on_the_host(case, dtype):
    """The gpu kernel of those epilogues (both load variants) built for the host, against the oracle."""
    from mgx_graph.operators.fused_gemv_codegen import fused_gemv_source

    prog, vals, fn = _offset_layer(case, dtype)
    _fuse(prog, "gpu")
    f = next(i for i in prog.get_main_module().instructions if i.op.name == "fused_gemv")
    assert [i.op.name for i in f.module_inputs[0].instructions if not i.op.builtin][-1] != "dot"
    feeds = _offset_feeds(dtype)
    args = []
    for i in f.inputs:  # parameters by name; literals (the weight through gemv_layout's transpose) by value
        src = i.inputs[0] if i.op.name == "transpose" else i
        args.append(feeds[src.op.parameter] if src.op.name == "@param" else np.ascontiguousarray(src.op.value))
    want = _offset_oracle(feeds, vals, dtype, fn)
    tol = 4e-3 if dtype == "float16" else 1e-5
    for vector in (True, False):
        ks, _, _ = fused_gemv_source(f.module_inputs[0], [i.shape for i in f.inputs], f.shape, vector)
        outs = [np.full(s.lens, 7, s.np_dtype) for s in f.shape]
        gemv_host.run_fused(ks, args + outs, (ks.grid,))
        np.testing.assert_allclose(outs[0].astype(np.float64), want, rtol=tol, atol=tol)
        assert np.array_equal(outs[1], (feeds["x"].astype(np.float32) + feeds["r"].astype(np.float32)).astype(dtype))


# -- the weight prefetch and the grid-dependency point of the generated kernel ---------------------------------
@pytest.mark.skipif(not gemv_host.available(), reason="needs g++")
@pytest.mark.parametrize("dtype, K, L, epilogue, prefetch", [
    ("float16", 8192, 3, True, PREFETCH),   # element loads: 32 per thread and row (16-byte loads: 4)
    ("float32", 4096, 2, False, PREFETCH),  # element loads: 16 per thread (16-byte loads: 4)
    ("float16", 3001, 4, True, PREFETCH),   # K not a multiple of 8: element loads only, 12 per thread
    ("float16", 1024, 5, True, 1)])         # 16-byte loads: 2 per thread and row, one held
def test_generated_kernel_past_the_prefetch_depth_on_the_host(dtype, K, L, epilogue, prefetch, rng):
    """Rows with more weight loads per thread than the prefetch depth: the kernel (each load variant)
    against the float64 oracle, the residual sum exactly x + r rounded, and bit for bit equal to the
    same kernel holding another number of loads per row in registers (one, or ``PREFETCH``)."""
    from mgx_graph.operators.fused_gemv_codegen import fused_gemv_source, prefetch_depth

    f, vals = _gpu_fused(dtype, K, L, epilogue, K)
    xv, rv = (rng.standard_normal((1, 1, K)).astype(dtype) for _ in range(2))
    wt = f.inputs[3].inputs[0].op.value
    want, _ = _oracle(xv, rv, vals, dtype, epilogue)
    shapes = [i.shape for i in f.inputs]
    S = 2 if epilogue else 1
    tol = 4e-3 if dtype == "float16" else 1e-5
    past = []
    for vector in (True, False):
        got = []
        for depth in (prefetch, 1 if prefetch > 1 else PREFETCH):
            ks, plan, _ = fused_gemv_source(f.module_inputs[0], shapes, f.shape, vector, prefetch=depth)
            pf = prefetch_depth(plan, S, vector)
            assert f"PF = {pf};" in ks.source and 1 <= pf <= depth
            if depth == prefetch:
                past.append(plan.loads_per_thread(vector) > pf)
            y, h = np.full(want.shape, 7, dtype), np.full((1, 1, K), 7, dtype)
            gemv_host.run_fused(ks, [xv, rv, vals["g"], wt, y, h], (ks.grid,))
            np.testing.assert_allclose(y.astype(np.float64), want, rtol=tol, atol=tol)
            assert np.array_equal(h, (xv.astype(np.float32) + rv.astype(np.float32)).astype(dtype))
            got.append(y)
        assert np.array_equal(got[0], got[1])
    assert any(past)


def test_prefetch_depth_keeps_the_registers_bounded():
    """At most the plan's depth and the loads per thread, and at most 16 loads over the S rows; more
    than 16 rows: none held."""
    from mgx_graph.operators.fused_gemv_codegen import prefetch_depth
    from mgx_graph.operators.gemv_gpu import make_plan

    plan = make_plan("float16", 1, 8192, 4)  # 32 element loads per thread, 4 16-byte ones
    assert (plan.loads_per_thread(False), plan.loads_per_thread(True)) == (32, 4)
    assert [prefetch_depth(plan, s, False) for s in (1, 2, 3, 4, 5, 8, 16, 17)] == [8, 8, 5, 4, 3, 2, 1, 0]
    assert [prefetch_depth(plan, s, True) for s in (1, 4, 5, 16, 17)] == [4, 4, 3, 1, 0]


@pytest.mark.parametrize("vector", [True, False])
def test_generated_kernel_waits_after_its_weight_prefetch(vector):
    """The kernel's own ``MGX_GRID_DEPENDENCY();`` comes after the loads into registers of both weight
    rows and before the prologue; no input but the weight, and no output, is named before it; built
    for PDL it gets no second one."""
    from mgx_graph.operators.fused_gemv_codegen import fused_gemv_source
    from mgx_graph.operators.programmatic_launch import with_grid_dependency

    f, _ = _gpu_fused("float16", 576, 40, True, 1)
    ks, _, parts = fused_gemv_source(f.module_inputs[0], [i.shape for i in f.inputs], f.shape, vector)
    before = re.sub(r"//[^\n]*", "", gemv_host.body_before_point(ks.source))
    assert "wp0[i] = w0[j]; wp1[i] = w1[j];" in before and "mgx_prologue(" not in before
    others = [n for k, (_, n) in enumerate(ks.params) if k != parts.weight]
    assert len(others) == len(ks.params) - 1 and f"x{parts.weight}" not in others
    assert not any(re.search(rf"\b{n}\b", before) for n in others), before
    after = ks.source[ks.source.index("MGX_GRID_DEPENDENCY();"):]
    assert after.index("mgx_prologue(tid") < after.index("__syncthreads();")
    assert with_grid_dependency(ks.source).count("MGX_GRID_DEPENDENCY();") == 1


@pytest.mark.skipif(gemv_host.NVCC is None, reason="nvcc (CUDA toolkit) not found")
def test_generated_kernel_compiles_with_and_without_pdl(tmp_path):
    """nvcc -arch=sm_90: built for PDL, ``griddepcontrol.wait`` follows the weight's global loads and
    comes before every other memory step (the prologue's loads, shared memory, barriers, stores);
    built without, there is none and the source compiles as well."""
    from mgx_graph.operators.fused_gemv_codegen import fused_gemv_source
    from mgx_graph.operators.programmatic_launch import with_grid_dependency

    f, _ = _gpu_fused("float16", 576, 40, True, 1)
    ks, _, _ = fused_gemv_source(f.module_inputs[0], [i.shape for i in f.inputs], f.shape, True)
    steps = gemv_host.ptx_memory_steps(with_grid_dependency(ks.source), tmp_path / "pdl.cu")
    assert steps.count("griddepcontrol.wait") == 1
    k = steps.index("griddepcontrol.wait")
    assert k >= 2 and set(steps[:k]) == {"ld.global"}, steps[:k + 3]  # both rows' first chunks
    assert {"ld.global", "st.shared", "bar.sync", "st.global"} <= set(steps[k + 1:])
    assert "griddepcontrol.wait" not in gemv_host.ptx_memory_steps(ks.source, tmp_path / "plain.cu")


def _many_slices(rows, dtype="float32", K=64, W=2):
    """``y = rms_norm(x + r, g) @ W [K, rows * W]``; ``out = -(y[0:W] + y[W:2W] + ..)`` over ``rows``
    slices and ``-(x + r)``; returns ``(program, g, W)``."""
    rng = np.random.default_rng(rows)
    prog = Program()
    m = prog.get_main_module()
    x, r = m.add_parameter("x", S(dtype, 1, 1, K)), m.add_parameter("r", S(dtype, 1, 1, K))
    g = (1 + 0.1 * rng.standard_normal(K)).astype(dtype)
    w = (rng.standard_normal((K, rows * W)) / np.sqrt(K)).astype(dtype)
    h = m.add_instruction(op("add"), [x, r])
    y = m.add_instruction(op("dot"), [m.add_instruction(op("rms_norm", axis=-1, epsilon=EPS), [h, lit(m, g, dtype)]),
                                      lit(m, w, dtype)])
    total = None
    for i in range(rows):
        s = m.add_instruction(op("slice", axes=[2], starts=[i * W], ends=[i * W + W]), [y])
        total = s if total is None else m.add_instruction(op("add"), [total, s])
    m.add_return([m.add_instruction(op("neg"), [total]), m.add_instruction(op("neg"), [h])])
    return prog, g, w


@pytest.mark.skipif(not gemv_host.available(), reason="needs g++")
@pytest.mark.parametrize("rows, pf", [(5, 3), (17, 0)])
def test_generated_kernel_over_many_weight_rows_on_the_host(rows, pf):
    """An epilogue over ``rows`` slices: the prefetch is cut to 16 loads over all rows (5 rows: 3 each;
    17 rows: none held, every load in the loop); the kernel (both load variants) against numpy, and
    the residual sum exactly x + r."""
    from mgx_graph.operators.fused_gemv_codegen import fused_gemv_source

    dtype, K, W = "float32", 4096, 2  # 4 16-byte loads per thread and row, 16 element loads
    prog, g, w = _many_slices(rows, dtype, K, W)
    _fuse(prog, "gpu")
    f = next(i for i in prog.get_main_module().instructions if i.op.name == "fused_gemv")
    rng = np.random.default_rng(7)
    feeds = {"x": rng.standard_normal((1, 1, K)).astype(dtype), "r": rng.standard_normal((1, 1, K)).astype(dtype)}
    args = fused_args(f, feeds)
    hs = feeds["x"].astype(np.float64) + feeds["r"].astype(np.float64)
    n = (hs / np.sqrt(np.mean(hs * hs, axis=-1, keepdims=True) + EPS) * g).astype(dtype).astype(np.float64)
    y = (n @ w.astype(np.float64)).astype(dtype).astype(np.float64)
    want = -sum(y[..., i * W:(i + 1) * W] for i in range(rows))
    for vector in (True, False):
        ks, plan, parts = fused_gemv_source(f.module_inputs[0], [i.shape for i in f.inputs], f.shape, vector,
                                            prefetch=8)
        assert len(parts.slices) == rows and f"PF = {pf};" in ks.source and ("LT wp0[PF];" in ks.source) == bool(pf)
        outs = [np.full(s.lens, 7, s.np_dtype) for s in f.shape]
        gemv_host.run_fused(ks, args + outs, (ks.grid,))
        np.testing.assert_allclose(outs[0].astype(np.float64), want, rtol=1e-5, atol=1e-5)
        assert np.array_equal(outs[1], feeds["x"] + feeds["r"])  # the residual sum, the further output
