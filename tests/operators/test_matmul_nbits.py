"""MatMulNBits (com.microsoft) against onnxruntime CPU on every target, for every block size (16, 32, 64,
128), zero point kind (none, packed uint8, float), bits 4 and 8, M = 1, 4 and 33 rows, float32 and float16
activations, in a graph (captured on gpu).  On gpu M <= 8 runs the fused GEMV of ``gemv_nbits.cu`` and
M = 33 its dequantization and a GEMM (both capturable, their labels checked); 8-bit weights with float
zero points, which onnxruntime's CPU kernel refuses, are checked against the spec in float64 numpy.
Tolerances: :func:`nbits_util.tolerance` (float32 1e-4, float16 4e-3, relative to the output's largest
magnitude).

Then the gpu kernel choice of the op's hook and the GEMV's launch plans (no GPU needed: without CuPy the
kernels are compiled at their first launch), the glue of both kernels run end to end on the host
(``attn_host``) against onnxruntime, and, on a GPU, plans the heuristic does not pick and the decode
shapes of Llama-3.2-1B / Llama-3-8B against onnxruntime."""
import dataclasses

import numpy as np
import pytest

import mgx_graph
from mgx_graph.ir.operation import make_op
from mgx_graph.ir.shape import Shape
from mgx_graph.operators.gpu_lowering import table_kernel
from mgx_graph.operators import quantized_gpu
from mgx_graph.operators.quantized_gpu import (MAX_ROWS, NT, SMEM_X, TARGET_BLOCKS, DequantPlan, Weights,
                                               make_gemv_plan, matmul_nbits_kernel)
from native_util import kernels, run_native
from nbits_util import HostCtx, expected, host_function, nbits_model, quantized, spec_output, tolerance

KS = {16: 56, 32: 80, 64: 192, 128: 448}  # K per block size: partial last blocks for 16, 32 and 128
CASES = [(bits, block, zp) for bits in (4, 8) for block in (16, 32, 64, 128) for zp in ("none", "packed", "float")]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("M", [1, 4, 33])
@pytest.mark.parametrize("bits,block,zp", CASES, ids=[f"int{b}_b{s}_{z}" for b, s, z in CASES])
def test_matmul_nbits_matches_onnxruntime(bits, block, zp, M, dtype, target):
    rng = np.random.default_rng(bits * 1000 + block * 10 + M)
    w = quantized(rng, KS[block], 40, bits, block, zp, dtype)
    a = rng.normal(size=(M, w.K)).astype(dtype)
    model, feeds = nbits_model(w, a)
    want = expected(model, feeds, w)
    prog = run_native(model, feeds, target, True, ["matmul_nbits"], tolerance(want[0]), want)
    if target == "gpu":
        labels = [k.label for name, k in kernels(prog) if name == "matmul_nbits"]
        kind = "gemv_nbits.cu" if M <= MAX_ROWS else "dequant_nbits.cu"
        assert len(labels) == 1 and labels[0].startswith(f"{kind} int{bits} b{block}"), labels
        assert f"kernel={labels[0].split(' (')[0]}]" in str(prog)


@pytest.mark.parametrize("M", [1, 33])
def test_matmul_nbits_with_bias_and_a_batch(M, target):
    """A [2, M, K] with a bias: the rows of both batches, the bias added in the GEMV's epilogue / after
    the GEMM."""
    rng = np.random.default_rng(11)
    w = quantized(rng, 96, 24, 4, 32, "packed", np.float16)
    a = rng.normal(size=(2, M, w.K)).astype(np.float16)
    bias = rng.normal(size=w.N).astype(np.float16)
    model, feeds = nbits_model(w, a, bias=bias)
    want = expected(model, feeds, w, bias)
    prog = run_native(model, feeds, target, True, ["matmul_nbits"], tolerance(want[0]), want)
    if target == "gpu":
        label = [k.label for name, k in kernels(prog) if name == "matmul_nbits"][0]
        assert label.startswith("gemv_nbits.cu" if M == 1 else "dequant_nbits.cu"), label


def test_matmul_nbits_g_idx_runs_the_dequantization(target):
    """g_idx (act-order) on gpu: the fused GEMV does not take it, the dequantization kernel does (clamped
    indices), also for one row; against the spec (onnxruntime CPU ignores packed zero points with g_idx)."""
    rng = np.random.default_rng(12)
    w = quantized(rng, 64, 12, 4, 16, "packed", np.float32)
    g = rng.integers(0, w.kb, w.K).astype(np.int32)
    a = rng.normal(size=(1, w.K)).astype(np.float32)
    model, feeds = nbits_model(w, a, g_idx=g)
    want = [spec_output(w, a, g_idx=g)]
    prog = run_native(model, feeds, target, True, ["matmul_nbits"], (1e-4, 1e-4), want)
    if target == "gpu":
        assert [k.label for name, k in kernels(prog) if name == "matmul_nbits"] == \
            ["dequant_nbits.cu int4 b16 zp g_idx + gemm"]


# -- the kernel choice and the launch plans (no GPU) ---------------------------------------------------
def _op_shapes(w, M, dtype="float16", g_idx=False, bias=False, **attrs):
    op = make_op("matmul_nbits", K=w.K, N=w.N, bits=w.bits, block_size=w.block, zero_points=w.zp,
                 g_idx=int(g_idx), bias=int(bias), **attrs)
    ins = [Shape(dtype, [M, w.K])] + [Shape(v.dtype.name, v.shape) for v in w.arrays().values()]
    ins += [Shape("int32", [w.K])] * g_idx + [Shape(dtype, [w.N])] * bias
    return op, ins, Shape(dtype, [M, w.N])


@pytest.mark.parametrize("M, g_idx, setting, kind", [(1, False, "1", "gemv_nbits.cu int4 b32 zp (fused GEMV, M=1"),
                                                      (8, False, "1", "gemv_nbits.cu int4 b32 zp (fused GEMV, M=8"),
                                                      (9, False, "1", "dequant_nbits.cu int4 b32 zp + gemm"),
                                                      (1, True, "1", "dequant_nbits.cu int4 b32 zp g_idx + gemm"),
                                                      (1, False, "0", "dequant_nbits.cu int4 b32 zp + gemm")])
def test_the_table_picks_the_gemv_for_a_few_rows(M, g_idx, setting, kind, monkeypatch):
    from mgx_graph import env

    monkeypatch.setenv("MIGRAPHX_GEMV_NBITS", setting)
    env._reset_for_tests()
    w = quantized(np.random.default_rng(0), 64, 16, 4, 32, "packed", np.float16)
    op, ins, out = _op_shapes(w, M, g_idx=g_idx)
    k = table_kernel(op, ins, out)
    assert k.label.startswith(kind) and k.capturable and op.kernel == k.label.split(" (")[0]
    assert (k.launches, k.workspace) == ((1, []) if kind.startswith("gemv") else (2, [Shape("float16", [16, 64])]))
    assert str(op).endswith(f",kernel={op.kernel}]")


def test_the_table_leaves_float64_to_the_array_evaluation():
    w = quantized(np.random.default_rng(0), 64, 16, 4, 32, "float", np.float64)
    op, ins, out = _op_shapes(w, 1, dtype="float64")
    assert table_kernel(op, ins, out) is None and op.kernel is None


def test_saved_attributes_rebuild_the_op():
    from mgx_graph.ir.codec import rebuild_op

    op = make_op("matmul_nbits", K=64, N=16, bits=4, block_size=32, kernel="gemv_nbits.cu int4 b32", _const_b=1)
    assert "kernel=gemv_nbits.cu int4 b32" in str(op) and "_const_b" not in str(op)
    again = rebuild_op("matmul_nbits", dict(op.attrs))
    assert again.attrs == op.attrs


@pytest.mark.parametrize("b_input", [False, True])
def test_the_parser_marks_an_initializer_weight_constant(b_input):
    w = quantized(np.random.default_rng(1), 64, 8, 4, 32, "none", np.float32)
    model, _ = nbits_model(w, np.zeros((1, 64), np.float32), b_input=b_input)
    prog = mgx_graph.parse_onnx(model)
    ops = [i.op for m in prog.module_order() for i in m.instructions if i.op.name == "matmul_nbits"]
    assert [o.attrs["_const_b"] for o in ops] == [int(not b_input)]


LLAMA = [(2048, 2048), (2048, 8192), (8192, 2048), (4096, 4096), (4096, 14336), (14336, 4096), (4096, 128256)]


@pytest.mark.parametrize("K,N", LLAMA)
@pytest.mark.parametrize("block", [32, 128])
def test_gemv_plans_of_the_llama_decode_shapes(K, N, block):
    """16-byte loads, at least TARGET_BLOCKS blocks (or every column in a block of NT-thread groups),
    the staged x within SMEM_X, whole tiles over the row."""
    p = make_gemv_plan(Weights("float16", "float16", 4, block, K, N, "packed"), 1, True)
    assert p.lb == 16 and p.values_per_load == 32 and p.smem_bytes <= SMEM_X
    assert p.grid[0] >= TARGET_BLOCKS or p.tpc == NT or p.tpc * 2 > p.loads_per_row
    assert p.grid[0] * p.groups * p.nc >= N and p.tiles * p.it * p.tpc >= p.loads_per_row
    assert p.label.startswith(f"gemv_nbits.cu int4 b{block} zp (fused GEMV, M=1")


def test_gemv_plans_fit_eight_rows_and_odd_rows():
    eight = make_gemv_plan(Weights("float32", "float32", 2, 16, 14336, 4096), 8)
    assert eight.smem_bytes <= SMEM_X and eight.nc == 1 and eight.it == 1
    odd = make_gemv_plan(Weights("float16", "float16", 4, 16, 40, 7), 1)  # 3 blocks of 8 bytes a row
    assert (odd.lb, odd.loads_per_row) == (8, 3)
    word = make_gemv_plan(Weights("float16", "float16", 8, 16, 20, 7), 1)  # 2 blocks of 16 bytes: whole loads
    assert word.lb == 16
    assert make_gemv_plan(Weights("float16", "float16", 2, 16, 48, 7), 1).lb == 4  # 3 blocks of 4 bytes


@pytest.mark.parametrize("w, M, match", [(Weights("float64", "float64", 4, 32, 64, 8), 1, "float16 and float32"),
                                         (Weights("float16", "float16", 3, 32, 64, 8), 1, "bits 3"),
                                         (Weights("float16", "float16", 4, 24, 64, 8), 1, "block size 24"),
                                         (Weights("float16", "float16", 4, 32, 64, 8), MAX_ROWS + 1, "M=9")])
def test_gemv_plan_refuses_what_the_kernel_does_not_take(w, M, match):
    with pytest.raises(ValueError, match=match):
        make_gemv_plan(w, M)


# -- both kernels end to end on the host ----------------------------------------------------------------
@pytest.fixture
def host_kernels(monkeypatch):
    """Kernels of gemv_nbits.cu built for the host in place of NVRTC (the launch path is the gpu one)."""
    from mgx_graph.operators import gpu_kernel

    monkeypatch.setattr(gpu_kernel, "precompile", lambda src, name, pdl=None: host_function(src, name))


@pytest.mark.parametrize("M, bias, zp, dtype", [(1, True, "float", np.float32), (4, False, "packed", np.float16),
                                                (33, True, "none", np.float32)])
def test_the_launch_path_on_the_host_matches_onnxruntime(M, bias, zp, dtype, host_kernels):
    rng = np.random.default_rng(M)
    w = quantized(rng, 200, 24, 4, 32, zp, dtype)
    a = rng.normal(size=(M, w.K)).astype(dtype)
    b = rng.normal(size=w.N).astype(dtype) if bias else None
    model, feeds = nbits_model(w, a, bias=b)
    want = expected(model, feeds, w, b)[0]
    op, ins, out_shape = _op_shapes(w, M, np.dtype(dtype).name, bias=bias)
    k = matmul_nbits_kernel(op, ins, out_shape)
    out = np.full((M, w.N), 7, dtype)
    ws = [np.empty(s.lens, s.np_dtype) for s in k.workspace]
    k.fn(HostCtx(), out, [a, *w.arrays().values(), *([b] if bias else [])], ws)
    rtol, atol = tolerance(want)
    np.testing.assert_allclose(out.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)


def test_the_launch_refuses_a_misaligned_weight(host_kernels):
    w = quantized(np.random.default_rng(2), 64, 8, 4, 32, "none", np.float16)
    op, ins, out_shape = _op_shapes(w, 1)
    k = matmul_nbits_kernel(op, ins, out_shape)
    raw = np.zeros(w.inputs["B"].size + 1, np.uint8)
    off = raw[1:] if raw.ctypes.data % 16 == 0 else raw[:-1]
    off[...] = w.inputs["B"].reshape(-1)
    args = [np.zeros((1, 64), np.float16), off.reshape(w.inputs["B"].shape), w.arrays()["scales"]]
    with pytest.raises(ValueError, match="B at an address off the 16-byte grid"):
        k.fn(HostCtx(), np.zeros((1, 8), np.float16), args, [])


# -- on a GPU: plans the heuristic does not pick, and the Llama decode shapes ------------------------------
class _Ctx:
    @staticmethod
    def data_ptr(a):
        return a.data.ptr


#: (bits, block, K, N, zero points, M, plan fields replacing the heuristic's): threads per group 1 .. NT, one
#: or two columns per thread group, 1 .. 4 loads per tile (many tiles), 8- and 4-byte loads, 2 / 4 / 8 bits.
PLAN_CASES = [
    (4, 32, 4096, 300, "packed", 2, dict(tpc=4, nc=2, it=1)), (4, 32, 4096, 300, "none", 1, dict(tpc=256)),
    (4, 128, 14336, 64, "float", 1, dict(tpc=64, nc=1, it=4)), (4, 16, 40, 77, "packed", 3, dict(tpc=1)),
    (8, 64, 1000, 129, "float", 8, None), (8, 16, 2048, 512, "none", 5, dict(tpc=32, nc=2, it=2)),
    (2, 16, 48, 33, "packed", 4, None), (2, 64, 3072, 96, "none", 7, dict(tpc=16, nc=1, it=1))]


def _plan(w, M, dtype, plan=None, bias=False):
    """The op, its input shapes and the GEMV plan of ``w`` at ``M`` rows (``plan``: replaces the heuristic's
    tpc / nc / it)."""
    op, ins, _ = _op_shapes(w, M, np.dtype(dtype).name, bias=bias)
    p = make_gemv_plan(quantized_gpu.weights_of(op, ins, Shape(np.dtype(dtype).name, [M, w.N])), M)
    return op, (dataclasses.replace(p, **plan) if plan else p)


def test_plan_cases_build_for_hopper():
    """Every plan of the gpu sweep below builds to Hopper machine code (NVRTC and its ptxas, no GPU needed):
    a plan whose staged tile passes the shared-memory limit is found here, not on the device."""
    from nvrtc import nvrtc

    compiler = nvrtc()
    if compiler is None:
        pytest.skip("NVIDIA's NVRTC wheel (cuda-toolkit[nvrtc]) is not installed")
    failures = []
    for bits, block, K, N, zp, M, plan in PLAN_CASES:
        for dtype in (np.float16, np.float32):
            w = quantized(np.random.default_rng(K + N), K, N, bits, block, zp, dtype)
            _, p = _plan(w, M, dtype, plan, bias=bits == 8)
            ok, log = compiler.compile(p.source(), "gemv_nbits.cu")
            if not ok:
                failures.append((p, log[-300:]))
    assert not failures, failures


def test_a_plan_over_the_shared_memory_limit_is_refused():
    w = quantized(np.random.default_rng(0), 4096, 300, 4, 32, "none", np.float16)
    with pytest.raises(ValueError, match=f"over the {SMEM_X}-byte limit"):
        _plan(w, 2, np.float16, dict(tpc=64, nc=1, it=4))


def _gpu_case(w, M, dtype, plan=None, bias=False, seed=0):
    """(max error / largest output, tolerance) of one launch of the GEMV of ``w`` (``plan``: replaces the
    heuristic's tpc / nc / it) against onnxruntime; the guard values after the output must stay untouched."""
    import cupy

    rng = np.random.default_rng(seed)
    a = rng.normal(size=(M, w.K)).astype(dtype)
    b = rng.normal(size=w.N).astype(dtype) if bias else None
    model, feeds = nbits_model(w, a, bias=b)
    want = expected(model, feeds, w, b)[0].astype(np.float64)
    op, p = _plan(w, M, dtype, plan, bias)
    k = quantized_gpu.gemv_kernel(op, p)
    out = cupy.full(M * w.N + 3, 7, dtype)  # y in standard layout, then 3 guard values
    args = [cupy.asarray(v) for v in (a, *w.arrays().values(), *([b] if bias else []))]
    k.fn(_Ctx(), out[:M * w.N].reshape(M, w.N), args, [])
    got = out.get()
    assert (got[M * w.N:] == 7).all(), p
    rtol, atol = tolerance(want.astype(dtype))
    return float(np.abs(got[:M * w.N].reshape(M, w.N) - want).max()), atol, p


@pytest.mark.gpu
def test_gemv_plans_on_the_gpu_match_onnxruntime(gpu_target):
    """Every failing case of :data:`PLAN_CASES` reported at once, 1 .. 8 rows."""
    failures = []
    for bits, block, K, N, zp, M, plan in PLAN_CASES:
        for dtype in (np.float16, np.float32):
            w = quantized(np.random.default_rng(K + N), K, N, bits, block, zp, dtype)
            err, tol, p = _gpu_case(w, M, dtype, plan, bias=bits == 8)
            if not err <= tol:
                failures.append((p.label, p.tpc, p.nc, p.it, p.lb, err, tol))
    assert not failures, failures


@pytest.mark.gpu
@pytest.mark.parametrize("block", [32, 128])
def test_llama_decode_shapes_on_the_gpu_match_onnxruntime(block, gpu_target):
    failures = []
    for K, N in LLAMA[:-1]:
        w = quantized(np.random.default_rng(K ^ N), K, N, 4, block, "packed", np.float16)
        err, tol, p = _gpu_case(w, 1, np.float16)
        if not err <= tol:
            failures.append((K, N, p.label, err, tol))
    assert not failures, failures


@pytest.mark.gpu
def test_dequantization_on_the_gpu_equals_the_spec_in_float32(gpu_target):
    """mgx_dequant_nbits: (q - z) * s in float32, rounded once to the activation type, for every element."""
    import cupy

    for bits, block, zp, dtype in [(4, 32, "packed", np.float16), (8, 128, "float", np.float32),
                                   (2, 16, "none", np.float16)]:
        w = quantized(np.random.default_rng(bits), 1000, 70, bits, block, zp, dtype)
        plan = DequantPlan(Weights(np.dtype(dtype).name, np.dtype(dtype).name, bits, block, w.K, w.N, zp,
                                   np.dtype(dtype).name if zp == "float" else None))
        fn = quantized_gpu._function(plan.source(), "mgx_dequant_nbits")
        arrs = {k: cupy.asarray(v) for k, v in w.arrays().items()}
        out = cupy.zeros((w.N, w.K), dtype)
        fn(plan.grid, plan.block, plan.args(arrs["B"], arrs["scales"], arrs.get("zero_points"), None, out))
        g = np.arange(w.K) // block
        want = ((w.q[:, :w.K].astype(np.float32) - w.zf[:, g].astype(np.float32)) *
                w.sf[:, g].astype(dtype).astype(np.float32)).astype(dtype)
        np.testing.assert_array_equal(out.get(), want, err_msg=plan.label)
