"""The generated ``fused_gemv`` kernel (operators/fused_gemv_codegen.py) on the host (tests/gemv_host.py)
for the thread splits and epilogue widths the SiLU layer of test_fuse_gemv.py does not reach: ``tpc`` 64,
128 and 256 threads per column (the cross-group reduction through ``red`` and its two barriers), an
epilogue over S = 3, 5 and 17 slices of the dot (17: no weight chunk held in registers, PF = 0), and
grids of one and two blocks besides one block per column group (each block then loops over several
groups, reusing ``red`` and recomputing nothing of the prologue).  Values against a float64 numpy
oracle; every grid gives the same values bit for bit."""
import numpy as np
import pytest

from mgx_graph import Program

import gemv_host
from irtools import S as Sh
from irtools import lit, op
from test_fuse_gemv import EPS, _fuse, fused_args


def _sliced_layer(dtype, K, L, S, seed=0):
    """``h = x + r; n = rms_norm(h, g); y = n @ W [K, S*L]`` and the epilogue
    ``e = y_0; e = e * y_s (s odd) or e + y_s (s even)`` over the S slices ``y_s = y[s*L:(s+1)*L]`` (S = 1:
    ``e = y``, no epilogue), and ``neg(h)``.  Returns ``(program, values, oracle)``; ``oracle(Y)`` the epilogue in float64 of the
    dot's result ``Y``."""
    rng = np.random.default_rng(seed)
    prog = Program()
    m = prog.get_main_module()
    x, r = m.add_parameter("x", Sh(dtype, 1, 1, K)), m.add_parameter("r", Sh(dtype, 1, 1, K))
    vals = {"g": (1 + 0.1 * rng.standard_normal(K)).astype(dtype),
            "w": (rng.standard_normal((K, S * L)) / np.sqrt(K)).astype(dtype)}
    h = m.add_instruction(op("add"), [x, r])
    n = m.add_instruction(op("rms_norm", axis=-1, epsilon=EPS), [h, lit(m, vals["g"], dtype)])
    y = m.add_instruction(op("dot"), [n, lit(m, vals["w"], dtype)])
    e = m.add_instruction(op("slice", axes=[2], starts=[0], ends=[L]), [y]) if S > 1 else y
    for s in range(1, S):
        ys = m.add_instruction(op("slice", axes=[2], starts=[s * L], ends=[(s + 1) * L]), [y])
        e = m.add_instruction(op("mul" if s % 2 else "add"), [e, ys])
    m.add_return([e, m.add_instruction(op("neg"), [h])])

    def oracle(Y):
        v = Y[..., :L]
        for s in range(1, S):
            v = v * Y[..., s * L:(s + 1) * L] if s % 2 else v + Y[..., s * L:(s + 1) * L]
        return v

    return prog, vals, oracle


def _want(xv, rv, vals, dtype, oracle):
    hs = (xv.astype(np.float32) + rv.astype(np.float32)).astype(dtype).astype(np.float64)
    n = hs / np.sqrt(np.mean(hs * hs, axis=-1, keepdims=True) + EPS) * vals["g"].astype(np.float64)
    Y = (n.astype(dtype).astype(np.float64) @ vals["w"].astype(np.float64)).astype(dtype).astype(np.float64)
    return oracle(Y), hs


@pytest.mark.skipif(not gemv_host.available(), reason="needs g++")
@pytest.mark.parametrize("dtype, K, L, S, tpc", [
    ("float16", 512, 5, 3, 64), ("float32", 256, 9, 1, 64),     # 64 threads a column: 2 groups of 32
    ("float16", 1024, 7, 5, 128), ("float32", 512, 3, 3, 128),  # 128: 4 groups
    ("float16", 2048, 3, 5, 256), ("float16", 2048, 2, 17, 256),  # 256: one column a block; 17 rows: PF 0
    ("float16", 64, 20, 3, 32)])                                # 32: no cross-group step, 8 columns a block
def test_generated_kernel_any_split_and_grid_on_the_host(dtype, K, L, S, tpc):
    from mgx_graph.operators.fused_gemv_codegen import fused_gemv_source, prefetch_depth

    prog, vals, oracle = _sliced_layer(dtype, K, L, S, seed=K + S)
    _fuse(prog, "gpu")
    f = next(i for i in prog.get_main_module().instructions if i.op.name == "fused_gemv")
    rng = np.random.default_rng(K)
    feeds = {"x": rng.standard_normal((1, 1, K)).astype(dtype), "r": rng.standard_normal((1, 1, K)).astype(dtype)}
    args = fused_args(f, feeds)
    want, hs = _want(feeds["x"], feeds["r"], vals, dtype, oracle)
    tol = 1e-2 if dtype == "float16" else 1e-5
    for vector in (True, False):
        ks, plan, parts = fused_gemv_source(f.module_inputs[0], [i.shape for i in f.inputs], f.shape, vector)
        assert plan.tpc == tpc and max(1, len(parts.slices)) == S
        assert (prefetch_depth(plan, S, vector) == 0) == (S > 16)
        groups = -(-L // plan.cols)
        assert ks.grid == groups
        first = None
        for grid in sorted({groups, 1, 2}):
            outs = [np.full(s.lens, 7, s.np_dtype) for s in f.shape]
            gemv_host.run_fused(ks, args + outs, (grid,))
            np.testing.assert_allclose(outs[0].astype(np.float64), want, rtol=tol, atol=tol,
                                       err_msg=f"vector={vector} grid={grid}")
            assert np.array_equal(outs[1], hs.astype(dtype))  # the residual sum x + r, rounded
            first = outs[0] if first is None else first
            assert np.array_equal(outs[0], first), f"grid {grid} differs from grid {groups}"


@pytest.mark.skipif(not gemv_host.available(), reason="needs g++")
def test_generated_kernel_with_a_narrow_plan_on_the_host(monkeypatch):
    """``MIGRAPHX_GEMV_NARROW``: 16 threads a column (two columns a 32-thread group) for 4224 columns of a
    128-element row: the generated kernel's shuffles stay within a column's lanes; values against numpy,
    the same on a grid of two blocks."""
    from mgx_graph.operators import gemv_gpu
    from mgx_graph.operators.fused_gemv_codegen import fused_gemv_source

    monkeypatch.setattr(gemv_gpu, "narrow_setting", lambda: True)
    dtype, K, L = "float16", 128, 4224
    prog, vals, oracle = _sliced_layer(dtype, K, L, 1, seed=3)
    _fuse(prog, "gpu")
    f = next(i for i in prog.get_main_module().instructions if i.op.name == "fused_gemv")
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((1, 1, K)).astype(dtype), "r": rng.standard_normal((1, 1, K)).astype(dtype)}
    args = fused_args(f, feeds)
    want, hs = _want(feeds["x"], feeds["r"], vals, dtype, oracle)
    ks, plan, parts = fused_gemv_source(f.module_inputs[0], [i.shape for i in f.inputs], f.shape, True)
    assert plan.tpc == 16 and ks.grid == L // 16
    first = None
    for grid in (ks.grid, 2):
        outs = [np.full(s.lens, 7, s.np_dtype) for s in f.shape]
        gemv_host.run_fused(ks, args + outs, (grid,))
        np.testing.assert_allclose(outs[0].astype(np.float64), want, rtol=1e-2, atol=1e-2, err_msg=f"grid={grid}")
        first = outs[0] if first is None else first
        assert np.array_equal(outs[0], first)
