"""``gemv_nbits.cu`` without a GPU: both kernels built for the host (``attn_host``: g++, one std::thread per
CUDA thread, ``__syncthreads()`` a barrier, xor shuffles through a buffer of the 32-thread group) against
the spec in float64 numpy, so the packing and index arithmetic run as on the device: the value planes and
byte permutes of 2 / 4 / 8 bits, scale blocks within and across loads, packed and float zero points, the
staged x tile and its padding past K, tiles, threads per group from 1 to 64 (shuffles within a group,
then the cross-group sum), one or two columns per group, columns past N; and the dequantization, equal to
the spec computed in float32 for every element (with clamped g_idx).  Then the sources through nvcc for
sm_90 where nvcc is present: each compiles, and built for programmatic dependent launch the GEMV reads
its first weights before the grid dependency wait only when B is a constant."""
import dataclasses
import shutil

import numpy as np
import pytest

from mgx_graph.operators.programmatic_launch import with_grid_dependency
from mgx_graph.operators.quantized_gpu import DequantPlan, Weights, make_gemv_plan

import attn_host
import gemv_host
from nbits_util import host_function, quantized

pytestmark = pytest.mark.skipif(not attn_host.available(), reason="needs g++")

# (bits, block, K, N, zero points, M, bias, dtype, plan fields replacing the heuristic's)
GEMV = [(4, 32, 256, 40, "packed", 1, False, "float32", None),
        (4, 16, 200, 24, "float", 3, True, "float32", None),        # 8-byte loads, a partial last block
        (8, 64, 300, 9, "none", 8, True, "float16", None),
        (2, 16, 512, 30, "packed", 2, False, "float32", None),       # 4 scale blocks per 16-byte load
        (4, 128, 1000, 33, "packed", 1, False, "float16", dict(tpc=4, nc=2, it=1)),  # 8 tiles, 2 columns
        (4, 32, 2048, 20, "none", 2, True, "float32", dict(tpc=64, nc=1, it=2)),    # cross-group sum
        (8, 16, 48, 5, "float", 4, False, "float16", dict(tpc=1, nc=2, it=3))]      # 4-byte words, no shuffle


def _spec(w, a, bias):
    y = a.astype(np.float64) @ w.dequantized().T
    return y if bias is None else y + bias.astype(np.float64)


@pytest.mark.parametrize("bits,block,K,N,zp,M,bias,dtype,plan", GEMV,
                         ids=[f"int{c[0]}_b{c[1]}_K{c[2]}_{c[4]}_M{c[5]}{'_plan' if c[8] else ''}" for c in GEMV])
def test_gemv_on_the_host_matches_the_spec(bits, block, K, N, zp, M, bias, dtype, plan):
    rng = np.random.default_rng(K * N + M)
    w = quantized(rng, K, N, bits, block, zp, dtype)
    a = rng.normal(size=(M, K)).astype(dtype)
    b = rng.normal(size=N).astype(dtype) if bias else None
    p = make_gemv_plan(Weights(dtype, dtype, bits, block, K, N, zp, dtype if zp == "float" else None,
                               dtype if bias else None), M)
    if plan:
        p = dataclasses.replace(p, **plan)
    y = np.full((M, N), 7, dtype)
    arrs = w.arrays()
    host_function(p.source(), "mgx_gemv_nbits")(p.grid, p.block, p.args(a, arrs["B"], arrs["scales"],
                                                                         arrs.get("zero_points"), b, y))
    want = _spec(w, a, b)
    top = max(1.0, float(np.abs(want).max()))
    tol = 2e-3 * top if dtype == "float16" else 2e-6 * top  # float16: the output's rounding; float32: the sums
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=0, atol=tol, err_msg=p.label)


DEQUANT = [(4, 32, "packed", "float16", 200, 5, False), (8, 16, "float", "float32", 64, 3, True),
           (2, 128, "none", "float16", 300, 2, True), (4, 16, "float", "float16", 40, 3, False)]


@pytest.mark.parametrize("bits,block,zp,dtype,K,N,g_idx", DEQUANT,
                         ids=[f"int{c[0]}_b{c[1]}_{c[2]}_{c[3]}{'_gidx' if c[6] else ''}" for c in DEQUANT])
def test_dequantization_on_the_host_equals_the_spec_in_float32(bits, block, zp, dtype, K, N, g_idx):
    """Every element ``(q - z) * s`` in float32, rounded once to the type; g_idx values outside [0, kb)
    clamped (onnxruntime's CPU kernel would read out of bounds; ref raises)."""
    rng = np.random.default_rng(K + N)
    w = quantized(rng, K, N, bits, block, zp, dtype)
    g = rng.integers(-2, w.kb + 2, K).astype(np.int32) if g_idx else None
    gk = np.clip(g, 0, w.kb - 1) if g_idx else np.arange(K) // block
    want = ((w.q[:, :K].astype(np.float32) - w.zf[:, gk].astype(np.float32)) *
            w.sf[:, gk].astype(np.float32)).astype(dtype)
    p = DequantPlan(Weights(dtype, dtype, bits, block, K, N, zp, dtype if zp == "float" else None), g_idx)
    out = np.zeros((N, K), dtype)
    arrs = w.arrays()
    host_function(p.source(), "mgx_dequant_nbits")(p.grid, p.block, p.args(arrs["B"], arrs["scales"],
                                                                           arrs.get("zero_points"), g, out))
    np.testing.assert_array_equal(out, want, err_msg=p.label)


# -- nvcc (sm_90) ---------------------------------------------------------------------------------------
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


@needs_nvcc
@pytest.mark.parametrize("b_const", [True, False])
def test_the_gemv_reads_a_constant_weight_before_the_grid_dependency_wait(b_const, tmp_path):
    """Built for PDL (the source keeps its one own point): with a constant B its first global loads come
    before ``griddepcontrol.wait``; otherwise the wait is the first memory step."""
    p = make_gemv_plan(Weights("float16", "float16", 4, 32, 4096, 4096, "packed"), 1, b_const)
    src = with_grid_dependency(p.source())
    gemv = src[src.index("void __launch_bounds__(NB_NT) mgx_gemv_nbits("):src.index("#endif  // NB_KERNEL & 1")]
    assert gemv.count("MGX_GRID_DEPENDENCY();") == 1
    steps = gemv_host.ptx_memory_steps(src, tmp_path / "gemv_nbits.cu")
    wait = steps.index("griddepcontrol.wait")
    assert (wait > 0 and set(steps[:wait]) == {"ld.global"}) if b_const else wait == 0, steps[:12]


@needs_nvcc
def test_the_sources_compile_for_sm_90(tmp_path):
    """Each variant (bits, zero point kind, types, load width, rows, a group wider than 32 threads, the
    dequantization with g_idx) compiles with nvcc, with the PDL prelude."""
    plans = [make_gemv_plan(Weights("float16", "float16", 4, 128, 14336, 4096, "none", None, "float16"), 1, True),
             make_gemv_plan(Weights("float32", "float16", 8, 16, 100, 24, "float", "float32"), 8),
             make_gemv_plan(Weights("float16", "float32", 2, 16, 48, 2048, "packed"), 4),
             make_gemv_plan(Weights("float16", "float16", 4, 32, 8192, 64, "packed"), 1),
             DequantPlan(Weights("float16", "float16", 4, 32, 4096, 64, "packed"), True),
             DequantPlan(Weights("float32", "float32", 8, 64, 100, 64, "float", "float32"))]
    for k, p in enumerate(plans):
        gemv_host.ptx_memory_steps(with_grid_dependency(p.source()), tmp_path / f"nbits{k}.cu")
