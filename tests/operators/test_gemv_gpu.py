"""gemv.cu on a GPU against a float64 numpy product, for many shapes and layouts in one run (a GPU with
CuPy only): float16 / float32, K from 1 to 4096 (whole 16-byte loads and not), N from 1 to 49152, one to
four rows, with and without a bias, W^T and x rows packed, padded (a slice of a wider buffer), with row
starts off the 16-byte grid and misaligned (one element past an aligned address): the last two run the
element-wise variant.  Then compiled one-row dots with MIGRAPHX_GEMV on and off (the gemv kernel and
cuBLAS agree), replayed from a graph.  The kernel test reports every failing case at once.  Rows past
the weight prefetch depth give the same values whatever the depth."""
import numpy as np
import pytest

from mgx_graph import Program, Shape
from mgx_graph.operators import make_op
from mgx_graph.operators.gemv_gpu import gemv_kernel, make_plan



pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gemv_on")]  # the opt-in kernel on
TOL = {"float32": (2e-5, 2e-5), "float16": (2e-3, 2e-3)}
KS = (1, 3, 8, 64, 100, 576, 1536, 4096)
NS = (1, 7, 192, 960, 3072)


class _Ctx:
    """What a kernel launch reads of the gpu context."""

    @staticmethod
    def data_ptr(a):
        return a.data.ptr


def _rows(host: np.ndarray, layout: str):
    """``host`` [R, K] on the device: ``packed``, ``padded`` (rows of K + 24 elements), ``odd_rows`` (rows
    of K + 1 elements: row starts off the 16-byte grid) or ``misaligned`` (packed, one element past an
    aligned address)."""
    import cupy

    R, K = host.shape
    if layout in ("padded", "odd_rows"):
        buf = cupy.zeros((R, K + (24 if layout == "padded" else 1)), host.dtype)
        buf[:, :K] = cupy.asarray(host)
        return buf[:, :K]
    if layout == "misaligned":
        buf = cupy.zeros(R * K + 1, host.dtype)
        view = buf[1:].reshape(R, K)
        view[...] = cupy.asarray(host)
        return view
    return cupy.asarray(host)


def _case(dtype, M, K, N, bias, layout, seed):
    """One launch; returns (max abs error, tolerance exceeded, label)."""
    import cupy

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K)).astype(dtype)
    wt = rng.standard_normal((N, K)).astype(dtype)
    b = rng.standard_normal(N).astype(dtype) if bias else None
    xd, wd = _rows(x, layout), _rows(wt, layout)
    item = np.dtype(dtype).itemsize
    plan = make_plan(dtype, M, K, N, bias)
    k = gemv_kernel(plan, xd.strides[0] // item, wd.strides[0] // item, N)
    out = cupy.full((M, N + 5), 7, dtype)
    args = [xd, wd.T] + ([cupy.asarray(b)] if bias else [])
    k.fn(_Ctx(), out[:, :N], args, [])
    cupy.cuda.Device().synchronize()
    got = out.get()
    want = x.astype(np.float64) @ wt.astype(np.float64).T + (0 if b is None else b.astype(np.float64))
    rtol, atol = TOL[dtype]
    ok = np.allclose(got[:, :N].astype(np.float64), want, rtol=rtol, atol=atol * np.sqrt(K)) and \
        bool((got[:, N:] == 7).all())
    return float(np.abs(got[:, :N].astype(np.float64) - want).max()), ok, k.label


def test_gemv_kernel_matches_numpy(gpu_target):
    failures, n = [], 0
    for dtype in ("float16", "float32"):
        for K in KS:
            for N in NS + ((49152,) if K == 576 else ()):
                for M, bias, layout in ((1, False, "packed"), (1, True, "padded"), (1, False, "misaligned"),
                                        (1, True, "odd_rows")):
                    n += 1
                    err, ok, label = _case(dtype, M, K, N, bias, layout, n)
                    if not ok:
                        failures.append(f"{dtype} M={M} K={K} N={N} bias={bias} {layout} [{label}]: "
                                        f"max error {err}")
    assert not failures, f"{len(failures)} of {n} cases differ:\n" + "\n".join(failures)


@pytest.mark.parametrize("dtype, K, N", [("float16", 4096, 3072), ("float16", 8192, 5), ("float32", 4096, 2112),
                                         ("float16", 20000, 7), ("float16", 8190, 300)])
def test_gemv_values_do_not_depend_on_the_prefetch_depth(dtype, K, N, gpu_target):
    """Rows with more weight loads per thread than registers hold (16-byte loads when packed, element
    loads when misaligned): the result against numpy, and bit for bit the same with one load, the
    default depth or all of a row's loads (at most 32) held in registers ahead of the x copy."""
    import cupy

    rng = np.random.default_rng(K + N)
    x = rng.standard_normal((1, K)).astype(dtype)
    wt = rng.standard_normal((N, K)).astype(dtype)
    b = rng.standard_normal(N).astype(dtype)
    want = x.astype(np.float64) @ wt.astype(np.float64).T + b.astype(np.float64)
    base = make_plan(dtype, 1, K, N, True)
    item = np.dtype(dtype).itemsize
    for layout, vector in (("packed", True), ("misaligned", False)):
        xd, wd = _rows(x, layout), _rows(wt, layout)
        iters = base.loads_per_thread(vector and base.vec > 1)
        got = []
        for depth in (1, base.prefetch, min(iters, 32)):
            plan = make_plan(dtype, 1, K, N, True, depth)
            out = cupy.full((1, N + 5), 7, dtype)
            gemv_kernel(plan, xd.strides[0] // item, wd.strides[0] // item, N).fn(
                _Ctx(), out[:, :N], [xd, wd.T, cupy.asarray(b)], [])
            got.append(out.get())
        rtol, atol = TOL[dtype]
        np.testing.assert_allclose(got[0][:, :N].astype(np.float64), want, rtol=rtol, atol=atol * np.sqrt(K))
        assert (got[0][:, N:] == 7).all()
        assert all(np.array_equal(g, got[0]) for g in got[1:]), (layout, iters)


def _program(dtype, K, N, w_nk: np.ndarray, row_major: bool):
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", Shape(dtype, [1, 1, K]))
    if row_major:
        w = m.add_literal(np.ascontiguousarray(w_nk.T))
    else:
        w = m.add_instruction(make_op("transpose", permutation=[1, 0]), [m.add_literal(w_nk)])
    m.add_return([m.add_instruction(make_op("dot"), [x, w])])
    return prog


def _dot_label(cp) -> str:
    """The kernel label of the program's one ``dot`` (in a graph_launch submodule when graphs are on)."""
    return next(i for m in cp.program.module_order() for i in m.instructions if i.op.name == "dot").meta["kernel"].label


@pytest.mark.parametrize("row_major", [True, False], ids=["kn", "nk"])
def test_gemv_and_cublas_agree_in_a_program(row_major, gpu_target, monkeypatch):
    from mgx_graph import env
    from mgx_graph.compiler import compile_program

    rng = np.random.default_rng(3)
    for dtype in ("float16", "float32"):
        for K, N in ((576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152)):
            w = rng.standard_normal((N, K)).astype(dtype) * 0.05
            xv = rng.standard_normal((1, 1, K)).astype(dtype)
            want = xv[0].astype(np.float64) @ w.astype(np.float64).T
            results = {}
            for flag in ("1", "0"):
                monkeypatch.setenv("MIGRAPHX_GEMV", flag)
                env._reset_for_tests()
                cp = compile_program(_program(dtype, K, N, w, row_major), target="gpu", hip_graph=True, warmup=1,
                                     min_partition_size=1)
                label = _dot_label(cp)
                assert label.startswith("gemv (gemv.cu") if flag == "1" else label == "gemm", (flag, label)
                runs = [cp.run({"x": xv})[0] for _ in range(4)]  # warmup, capture, replays
                for r in runs[1:]:
                    assert np.array_equal(r, runs[0])
                assert cp.stats()["replays"] >= 1
                results[flag] = runs[0].astype(np.float64)
                rtol, atol = TOL[dtype]
                np.testing.assert_allclose(results[flag][0], want, rtol=rtol, atol=atol * np.sqrt(K))
            np.testing.assert_allclose(results["1"], results["0"], rtol=2 * TOL[dtype][0],
                                       atol=2 * TOL[dtype][1] * np.sqrt(K))


def test_narrow_gemv_kernel_matches_numpy(gpu_target, monkeypatch):
    """``MIGRAPHX_GEMV_NARROW``: the many-column shapes it narrows (16 or 4 threads a column), every layout."""
    from mgx_graph.operators import gemv_gpu

    monkeypatch.setattr(gemv_gpu, "narrow_setting", lambda: True)
    failures, n = [], 0
    for dtype, K, N in (("float16", 576, 49152), ("float16", 64, 100000), ("float16", 100, 49152)):
        assert make_plan(dtype, 1, K, N).tpc < 32
        for bias, layout in ((False, "packed"), (True, "padded"), (False, "misaligned"), (True, "odd_rows")):
            n += 1
            err, ok, label = _case(dtype, 1, K, N, bias, layout, n)
            if not ok:
                failures.append(f"{dtype} K={K} N={N} bias={bias} {layout} [{label}]: max error {err}")
    assert not failures, f"{len(failures)} of {n} cases differ:\n" + "\n".join(failures)
