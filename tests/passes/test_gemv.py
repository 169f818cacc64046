"""The gemv kernel of one-row ``dot`` instructions against constant weights (gpu), the ``gemv_layout``
pass that stores such weights transposed, and the lowering's choice between the kernel and BLAS.

The kernel's arithmetic is checked on the host (``gemv_host``: g++, one std::thread per CUDA thread)
against a float64 numpy product; programs run through the ``target`` fixture against numpy (on a GPU
the gpu variant runs the kernel itself); the lowering and the pass need no GPU."""
import dataclasses
import re

import numpy as np
import pytest

from mgx_graph import Program
from mgx_graph.operators.gemv_gpu import MAX_ROWS, NT, PREFETCH, TARGET_BLOCKS, gemv_plan_for, make_plan
from mgx_graph.passes import EliminateDeadCode, GemvLayout, Lowering, PassContext, PassManager
from mgx_graph.compiler import compile_program

import gemv_host
from irtools import S, assert_same_ir, lit, op, run_pass

pytestmark = pytest.mark.usefixtures("gemv_on")  # the opt-in kernel on



TOL = {"float16": (2e-3, 2e-3), "float32": (2e-5, 2e-5)}


def _oracle(x, w_nk, bias):
    ref = x.astype(np.float64) @ w_nk.astype(np.float64).T
    return ref if bias is None else ref + bias.astype(np.float64)


def _close(got, want, dtype, scale=1.0):
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol * scale)


# -- launch plans ------------------------------------------------------------------------------------
def test_plan_fills_the_grid_and_caps_threads_per_column_by_the_loads(monkeypatch):
    from mgx_graph.operators import gemv_gpu

    monkeypatch.setattr(gemv_gpu, "narrow_setting", lambda: False)  # the wide plan (narrow: below)
    small = make_plan("float16", 1, 576, 576)  # 72 loads per row
    assert small.vec == 8 and small.tpc == 128 and small.grid == (288,)  # 64 would give 144 blocks
    wide = make_plan("float16", 1, 576, 49152)
    assert wide.tpc == 32 and wide.grid[0] == 49152 // 8 >= TARGET_BLOCKS
    one = make_plan("float32", 1, 64, 1)  # 16 loads: never more than one group of 32 threads
    assert one.tpc == 32 and one.vec == 4 and one.grid == (1,)
    odd = make_plan("float16", 1, 100, 7)  # 100 halves are not whole 16-byte loads
    assert odd.vec == 1 and odd.tpc == 128
    for p in (small, wide, one, odd):
        assert 32 <= p.tpc <= NT and NT % p.tpc == 0 and p.grid[0] * p.cols >= p.N


@pytest.mark.parametrize("args, match", [(("int32", 1, 8, 8), "float16 and float32"),
                                         (("float16", MAX_ROWS + 1, 8, 8), f"sizes M={MAX_ROWS + 1}"),
                                         (("float32", 1, 0, 8), "K=0"),
                                         (("float16", 1, 8, 8, False, 0), "prefetch depth 0")])
def test_plan_refuses_what_the_kernel_does_not_take(args, match):
    with pytest.raises(ValueError, match=match):
        make_plan(*args)


def test_plan_for_dot_takes_one_row_and_a_k_contiguous_weight():
    x = S("float16", 1, 1, 64)
    out = S("float16", 1, 1, 32)
    wt = S("float16", 64, 32, strides=[1, 64])  # W^T [32, 64] viewed as [64, 32]
    plan, sx, sw = gemv_plan_for([x, wt], out)
    assert (plan.K, plan.N, plan.M, sx, sw) == (64, 32, 1, 64, 64)
    padded = S("float16", 64, 32, strides=[1, 80])  # a slice of W^T [32, 80]
    assert gemv_plan_for([x, padded], out)[2] == 80
    assert gemv_plan_for([x, S("float16", 64, 32)], out) is None  # N contiguous
    assert gemv_plan_for([S("float16", 1, 2, 64), wt], S("float16", 1, 2, 32)) is None  # M = 2
    assert gemv_plan_for([S("float16", 2, 1, 64), wt], S("float16", 2, 1, 32)) is None  # batch of 2
    assert gemv_plan_for([S("float64", 1, 64), S("float64", 64, 32, strides=[1, 64])], S("float64", 1, 32)) is None


class _Recorder:
    """Stands in for the compiled kernels (no GPU here): records which variant each launch takes."""

    def __init__(self):
        self.launches = []

    def __call__(self, source, name, pdl=None):
        return lambda grid, block, args: self.launches.append(int(source.split("#define VEC ")[1].split()[0]))


class _HostCtx:
    @staticmethod
    def data_ptr(a):
        return a.__array_interface__["data"][0]


@pytest.mark.parametrize("pad, offset, vec", [(0, 0, 8), (8, 0, 8), (1, 0, 1), (0, 1, 1)])
def test_launch_takes_the_vector_variant_only_for_aligned_rows(pad, offset, vec, monkeypatch):
    """Rows of whole 16-byte loads at aligned addresses: 16-byte loads; a row stride off the grid
    (``pad`` 1) or a data pointer one element off: the element-wise variant."""
    from mgx_graph.operators import gpu_kernel
    from mgx_graph.operators.gemv_gpu import gemv_kernel

    rec = _Recorder()
    monkeypatch.setattr(gpu_kernel, "compiled_function", rec)
    K, N = 64, 4
    plan = make_plan("float16", 1, K, N)
    k = gemv_kernel(plan, K, K + pad, N)
    w = _aligned(N * (K + pad), offset).reshape(N, K + pad)[:, :K].T
    x = _aligned(K, 0).reshape(1, 1, K)
    k.fn(_HostCtx(), np.zeros((1, 1, N), np.float16), [x, w], [])
    assert rec.launches == [vec]
    planned = K + (16 if pad == 8 else 8)
    with pytest.raises(ValueError, match=f"planned rows of 64 / {planned} elements"):
        gemv_kernel(plan, K, planned, N).fn(_HostCtx(), None, [x, w], [])
    assert rec.launches == [vec]  # nothing launched


def _aligned(n, offset):
    """``n`` float16 zeros starting ``offset`` elements past a 16-byte boundary."""
    raw = np.zeros(n + 16, np.float16)
    base = (-raw.ctypes.data % 16) // 2 + offset
    return raw[base:base + n]


# -- the kernel on the host ----------------------------------------------------------------------------
needs_gxx = pytest.mark.skipif(not gemv_host.available(), reason="needs g++")


@needs_gxx
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("K", [64, 576, 1536, 100])
@pytest.mark.parametrize("N, M, bias, pad", [(1, 1, False, 0), (7, 1, True, 0), (48, 1, False, 8),
                                             (5, 1, True, 16)])
def test_kernel_on_the_host_matches_numpy(dtype, K, N, M, bias, pad, rng):
    """Both variants (16-byte loads, element loads) over W^T rows padded by ``pad`` elements and x rows
    padded as well; the buffers around the results stay untouched."""
    plan = make_plan(dtype, M, K, N, bias)
    sx, sw, sy = K + pad, K + pad, N + 3
    xb = rng.standard_normal((M, sx)).astype(dtype)
    wb = rng.standard_normal((N, sw)).astype(dtype)
    bv = rng.standard_normal(N).astype(dtype) if bias else None
    want = _oracle(xb[:, :K], wb[:, :K], bv)
    for vector in ((True, False) if plan.vec > 1 else (False,)):
        y = np.full((M, sy), 7.0, dtype)
        gemv_host.run(plan, xb, wb, bv, y, sx, sw, sy, vector=vector)
        _close(y[:, :N], want, dtype, np.sqrt(K))
        assert (y[:, N:] == 7.0).all()


def test_narrow_plans_only_for_many_columns_of_short_rows(monkeypatch):
    """``MIGRAPHX_GEMV_NARROW`` (on by default): fewer than 32 threads a column (down to MIN_TPC) only while
    each thread's loads of a row fit the prefetch depth and the grid keeps TARGET_BLOCKS blocks; off
    (``0``), every such plan has 32."""
    from mgx_graph.operators import gemv_gpu

    shapes = [("float16", 576, 49152), ("float32", 576, 49152), ("float16", 64, 100000), ("float16", 576, 3072),
              ("float16", 2048, 128256), ("float16", 100, 49152)]
    from mgx_graph import env

    monkeypatch.setenv("MIGRAPHX_GEMV_NARROW", "0")
    assert gemv_gpu.narrow_setting() is False
    before = [make_plan(d, 1, K, N) for d, K, N in shapes]
    monkeypatch.delenv("MIGRAPHX_GEMV_NARROW")
    env._reset_for_tests()
    assert gemv_gpu.narrow_setting() is True
    after = [make_plan(d, 1, K, N) for d, K, N in shapes]  # the default
    assert [p.tpc for p in before] == [32] * 6
    assert [p.tpc for p in after] == [16, 32, gemv_gpu.MIN_TPC, 32, 32, 16]  # 100 halves: element loads, 7 each
    lm = after[0]  # SmolLM2's lm_head: 5 loads a thread (all prefetched), 3072 blocks instead of 6144
    assert lm.loads_per_thread() == 5 <= lm.prefetch and lm.grid == (3072,) and before[0].grid == (6144,)
    assert all(p.grid[0] >= TARGET_BLOCKS and p.loads_per_thread() <= p.prefetch for p in after if p.tpc < 32)


@needs_gxx
@pytest.mark.parametrize("dtype, K, N, tpc", [("float16", 64, 70, 16), ("float16", 576, 40, 16),
                                              ("float32", 100, 33, 8), ("float16", 128, 130, 4),
                                              ("float32", 64, 5, 4)])
def test_narrow_kernel_on_the_host_matches_numpy(dtype, K, N, tpc, rng):
    """``tpc`` < 32 (several columns in a 32-thread group, the shuffles within the column's lanes): both
    variants against numpy, with a bias, over a last block with columns past N; the buffer after the
    results stays untouched."""
    plan = dataclasses.replace(make_plan(dtype, 1, K, N, True), tpc=tpc)
    xb = rng.standard_normal((1, K)).astype(dtype)
    wb = rng.standard_normal((N, K)).astype(dtype)
    bv = rng.standard_normal(N).astype(dtype)
    want = _oracle(xb, wb, bv)
    for vector in ((True, False) if plan.vec > 1 else (False,)):
        y = np.full((1, N + 3), 7.0, dtype)
        gemv_host.run(plan, xb, wb, bv, y, K, K, N + 3, vector=vector)
        _close(y[:, :N], want, dtype, np.sqrt(K))
        assert (y[:, N:] == 7.0).all()


@needs_gxx
@pytest.mark.parametrize("dtype, K, N, prefetch", [
    ("float16", 8192, 3, PREFETCH),   # element loads: 32 per thread (16-byte loads: 4)
    ("float32", 4096, 2, PREFETCH),   # element loads: 16 per thread (16-byte loads: 4)
    ("float16", 8190, 4, PREFETCH),   # K not a multiple of 8: element loads only, 32 per thread
    ("float16", 20000, 2, PREFETCH),  # x (40000 bytes) read from global memory; 16-byte loads: 10 per thread
    ("float16", 4096, 5, 1),          # 16-byte loads: 2 per thread, one held in registers
    ("float32", 3000, 6, 2)])         # 16-byte loads: 3 per thread, two held
def test_kernel_on_the_host_past_the_prefetch_depth(dtype, K, N, prefetch, rng):
    """Rows with more weight loads per thread than the prefetch depth (registers, then the loop over
    the rest), with a bias: each variant against numpy, and bit for bit equal to the same plan
    holding one load or every load in registers (the depth leaves the order of the additions as it
    is); the columns past N stay untouched."""
    plan = make_plan(dtype, 1, K, N, True, prefetch)
    variants = (True, False) if plan.vec > 1 else (False,)
    assert any(plan.loads_per_thread(v) > prefetch for v in variants)
    assert plan.defines()["XS"] == int(K * np.dtype(dtype).itemsize <= 32 * 1024)
    xb = rng.standard_normal((1, K)).astype(dtype)
    wb = rng.standard_normal((N, K)).astype(dtype)
    bv = rng.standard_normal(N).astype(dtype)
    want = _oracle(xb, wb, bv)
    for vector in variants:
        iters = plan.loads_per_thread(vector)
        got = {}
        for depth in sorted({min(d, iters) for d in (prefetch, 1, iters)}):
            y = np.full((1, N + 3), 7.0, dtype)
            gemv_host.run(dataclasses.replace(plan, prefetch=depth), xb, wb, bv, y, K, K, N + 3, vector=vector)
            assert (y[:, N:] == 7.0).all()
            got[depth] = y[:, :N]
        _close(got[min(prefetch, iters)], want, dtype, np.sqrt(K))
        first = next(iter(got.values()))
        assert all(np.array_equal(v, first) for v in got.values()), (vector, list(got))


def test_the_kernel_prefetches_its_weight_before_the_grid_dependency_point():
    """gemv.cu's body up to its own ``MGX_GRID_DEPENDENCY();``: the weight chunks are loaded into
    registers there, and nothing else the kernel is given (x, bias, y) is named before it."""
    plan = make_plan("float16", 1, 1536, 576, True)
    for vector in (True, False):
        before = re.sub(r"//[^\n]*", "", gemv_host.body_before_point(plan.source(vector)))  # code only
        assert "wp[i] = wr[j];" in before
        assert not re.search(r"(?<![.\w])(x|bias|y|xs|sx|sy)\b", before), before  # threadIdx.x is no x


# -- gemv_layout --------------------------------------------------------------------------------------
def _dot_program(dtype, K, N, *, rows=1, weight="kn", bias=False, shared=False, rng=None):
    """``y = x [1, rows, K] @ W (+ b)`` with W a literal stored as ``kn`` ([K, N] row-major), ``nk`` (a
    transpose of [N, K]), ``slice`` (columns of a [K, N + 5] literal), ``nk_slice`` (a slice along K of a
    transposed [N, K + 8]), ``batch`` ([1, K, N]) or ``param`` (a parameter); returns (program, W as
    numpy [..., K, N] or None, b as numpy or None)."""
    rng = rng or np.random.default_rng(1)
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S(dtype, 1, rows, K))
    wv = rng.standard_normal((K, N)).astype(dtype)
    if weight == "kn":
        w = lit(m, wv, dtype)
    elif weight == "nk":
        w = m.add_instruction(op("transpose", permutation=[1, 0]), [lit(m, wv.T.copy(), dtype)])
    elif weight == "slice":
        full = np.concatenate([wv, rng.standard_normal((K, 5)).astype(dtype)], axis=1)
        w = m.add_instruction(op("slice", axes=[1], starts=[0], ends=[N]), [lit(m, full, dtype)])
    elif weight == "nk_slice":
        full = np.concatenate([wv.T, rng.standard_normal((N, 8)).astype(dtype)], axis=1)
        t = m.add_instruction(op("transpose", permutation=[1, 0]), [lit(m, full, dtype)])
        w = m.add_instruction(op("slice", axes=[0], starts=[0], ends=[K]), [t])
    elif weight == "batch":
        wv = wv[None]
        w = lit(m, wv, dtype)
    else:
        w = m.add_parameter("w", S(dtype, K, N))
    y = m.add_instruction(op("dot"), [x, w])
    outs, bv = [y], None
    if bias:
        bv = rng.standard_normal(N).astype(dtype)
        b = m.add_instruction(op("multibroadcast", out_lens=[1, rows, N]), [lit(m, bv, dtype)])
        outs = [m.add_instruction(op("add"), [y, b])]
    if shared:
        outs.append(m.add_instruction(op("neg"), [w]))
    m.add_return(outs)
    return prog, (None if weight == "param" else wv), bv


def _literal_of_dot(prog):
    d = next(i for i in prog.get_main_module().instructions if i.op.name == "dot")
    return d, d.inputs[1]


def test_layout_stores_a_row_major_weight_transposed():
    prog, wv, _ = _dot_program("float16", 8, 4)
    run_pass(GemvLayout(), prog, target="gpu")

    want = Program()
    m = want.get_main_module()
    x = m.add_parameter("x", S("float16", 1, 1, 8))
    t = m.add_instruction(op("transpose", permutation=[1, 0]), [lit(m, wv.T.copy(), "float16")])
    m.add_return([m.add_instruction(op("dot"), [x, t])])
    assert_same_ir(prog, want)
    d, w = _literal_of_dot(prog)
    assert w.shape.strides == (1, 8) and np.array_equal(w.inputs[0].op.value, wv.T)
    assert w.inputs[0].op.value.flags.c_contiguous


@pytest.mark.parametrize("weight, rows, shared, env", [("nk", 1, False, None), ("kn", 2, False, None),
                                                       ("kn", 1, True, None), ("param", 1, False, None),
                                                       ("kn", 1, False, "0")])
def test_layout_leaves_what_the_kernel_would_not_read_better(weight, rows, shared, env, monkeypatch):
    """Already K-contiguous, two rows, a literal read by another instruction too, a parameter, or
    MIGRAPHX_GEMV=0: the program is unchanged."""
    if env is not None:
        monkeypatch.setenv("MIGRAPHX_GEMV", env)
    prog, _, _ = _dot_program("float32", 8, 4, weight=weight, rows=rows, shared=shared)
    before = prog.print()
    run_pass(GemvLayout(), prog, target="gpu")
    assert prog.print() == before


@pytest.mark.parametrize("weight", ["slice", "batch"])
def test_layout_through_views_and_batch_dims(weight, target):
    """A slice of a wider literal and a [1, K, N] weight are stored transposed too; the rewritten
    program still computes x @ W (numpy oracle)."""
    prog, wv, bias = _dot_program("float32", 16, 6, weight=weight, bias=True)
    run_pass(GemvLayout(), prog, target="gpu")
    run_pass(EliminateDeadCode(), prog)
    d, w = _literal_of_dot(prog)
    assert w.op.name == "transpose" and w.inputs[0].op.name == "@literal" and w.shape.strides[-2] == 1
    assert len([i for i in prog.get_main_module().instructions if i.op.name == "@literal"]) == 2
    xv = np.random.default_rng(2).standard_normal((1, 1, 16)).astype(np.float32)
    got = compile_program(prog, target=target).run({"x": xv})[0]
    np.testing.assert_allclose(got, xv @ wv.reshape(16, 6) + bias, rtol=1e-5, atol=1e-5)


# -- lowering -----------------------------------------------------------------------------------------
def _lowered_dot(prog):
    PassManager([GemvLayout(), EliminateDeadCode(), Lowering("gpu")], PassContext("gpu")).run(prog)
    return _literal_of_dot(prog)[0].meta["kernel"]


@pytest.mark.parametrize("weight", ["kn", "nk", "slice", "nk_slice", "batch"])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_one_row_against_a_literal_lowers_to_the_gemv(weight, dtype):
    k = _lowered_dot(_dot_program(dtype, 64, 24, weight=weight)[0])
    assert k.label == "gemv (gemv.cu, 8 columns per block)" and k.launches == 1 and k.capturable
    assert not k.workspace and k.fn.plan.K == 64 and k.fn.plan.N == 24 and k.fn.plan.dtype == dtype


@pytest.mark.parametrize("kw", [dict(rows=2), dict(weight="param"), dict(dtype="float64")])
def test_more_rows_or_a_parameter_weight_stay_blas(kw):
    kw = {"dtype": "float32", **kw}
    k = _lowered_dot(_dot_program(kw.pop("dtype"), 64, 24, **kw)[0])
    assert k.label == "gemm"


def test_migraphx_gemv_0_keeps_blas_and_the_stored_layout(monkeypatch):
    monkeypatch.setenv("MIGRAPHX_GEMV", "0")
    prog = _dot_program("float16", 64, 24)[0]
    k = _lowered_dot(prog)
    assert k.label == "gemm"
    assert _literal_of_dot(prog)[0].inputs[1].op.name == "@literal"  # not stored transposed


def test_ref_lowering_ignores_the_gemv():
    prog = _dot_program("float16", 64, 24)[0]
    run_pass(Lowering("ref"), prog)
    assert _literal_of_dot(prog)[0].meta["kernel"].label == "host"


# -- programs against numpy, per target -----------------------------------------------------------------
@pytest.mark.parametrize("K", [64, 576, 1536])
@pytest.mark.parametrize("N", [1, 7, 192, 960, 3072])
@pytest.mark.parametrize("dtype, weight, bias", [("float16", "kn", False), ("float16", "nk", True),
                                                 ("float32", "slice", True), ("float16", "nk_slice", False)])
def test_one_row_dot_matches_numpy(K, N, dtype, weight, bias, target):
    """x [1, 1, K] @ W (+ b) compiled for ``target`` (gpu: the gemv kernel) against numpy in float64."""
    rng = np.random.default_rng(K * 7 + N)
    prog, wv, bv = _dot_program(dtype, K, N, weight=weight, bias=bias, rng=rng)
    xv = rng.standard_normal((1, 1, K)).astype(dtype)
    cp = compile_program(prog, target=target)
    if target == "gpu":
        d = next(i for i in cp.program.get_main_module().instructions if i.op.name == "dot")
        assert d.meta["kernel"].label.startswith("gemv (gemv.cu")
    got = cp.run({"x": xv})[0]
    want = _oracle(xv[0], wv.T, bv)[None]
    assert got.shape == want.shape and got.dtype == np.dtype(dtype)
    _close(got, want, dtype, np.sqrt(K))


def test_perf_names_the_gemv_instructions():
    """``mgx-graph perf`` sums a dot lowered to the gemv kernel as ``dot (gemv)``, apart from BLAS dots
    (the kernel label is what the gpu lowering sets; here given to a ref program's dot)."""
    from mgx_graph.cli.perf import named_row
    from mgx_graph.passes.lowering import Kernel

    prog = _dot_program("float32", 16, 6)[0]
    m = prog.get_main_module()
    m.add_return([m.get_return().inputs[0], m.add_instruction(op("dot"), [m.instructions[0], m.instructions[1]])])
    cp = compile_program(prog, target="ref")
    cp.run({"x": np.zeros((1, 1, 16), np.float32)})
    ex = cp.active_executor()
    dots = [(n, i) for n, i in enumerate(cp.program.get_main_module().instructions) if i.op.name == "dot"]
    assert len(dots) == 2
    first = dots[0][1]
    first.meta["kernel"] = Kernel(first.meta["kernel"].fn, 1, [], True, "gemv (gemv.cu, 8 columns per block)")
    labels = [lab for lab in ex.step_labels() if lab.endswith(" dot")]
    assert [named_row(ex, lab) for lab in labels] == [(labels[0] + " (gemv)", "dot (gemv)"), (labels[1], "dot")]


def test_a_marked_dot_keeps_the_gemv_when_its_weight_is_a_parameter():
    """As on load of a saved program, where the dot reads the weight as a graph_launch parameter:
    ``meta["gemv"]`` (set by the first lowering) selects the kernel again; an unmarked one is BLAS."""
    def build(mark):
        prog = Program()
        m = prog.get_main_module()
        x = m.add_parameter("x", S("float16", 1, 1, 64))
        w = m.add_parameter("w", S("float16", 64, 24, strides=[1, 64]))
        d = m.add_instruction(op("dot"), [x, w])
        if mark:
            d.meta["gemv"] = True
        m.add_return([d])
        Lowering("gpu").select_kernels(prog)
        return d.meta["kernel"].label

    assert build(True).startswith("gemv (gemv.cu") and build(False) == "gemm"


def test_lowering_marks_the_dots_it_gives_the_gemv():
    prog = _dot_program("float16", 64, 24)[0]
    _lowered_dot(prog)
    assert _literal_of_dot(prog)[0].meta["gemv"] is True
    prog = _dot_program("float16", 64, 24, rows=2)[0]
    _lowered_dot(prog)
    assert "gemv" not in _literal_of_dot(prog)[0].meta


@needs_gxx
@pytest.mark.parametrize("dtype, M, K", [("float32", 1, 9000), ("float16", 1, 17000)])
def test_kernel_on_the_host_reads_a_long_x_from_global_memory(dtype, M, K, rng):
    """x over 32 KiB is not copied to shared memory: the loads read it in place (row stride padded)."""
    N, sx = 5, K + 8
    plan = make_plan(dtype, M, K, N, True)
    assert plan.defines()["XS"] == 0
    xb = rng.standard_normal((M, sx)).astype(dtype)
    wb = rng.standard_normal((N, K)).astype(dtype)
    bv = rng.standard_normal(N).astype(dtype)
    y = np.zeros((M, N), dtype)
    gemv_host.run(plan, xb, wb, bv, y, sx, K, N)
    _close(y, _oracle(xb[:, :K], wb, bv), dtype, np.sqrt(K))


def test_the_gemv_is_on_by_default(monkeypatch):
    """Unset MIGRAPHX_GEMV: the one-row dot lowers to the gemv kernel (it beat cuBLAS on the H200)."""
    from mgx_graph import env

    monkeypatch.delenv("MIGRAPHX_GEMV", raising=False)
    env._reset_for_tests()
    try:
        assert _lowered_dot(_dot_program("float16", 64, 24)[0]).label.startswith("gemv (gemv.cu")
    finally:
        env._reset_for_tests()
