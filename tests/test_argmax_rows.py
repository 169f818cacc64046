"""``index_ops.argmax_rows`` (the greedy decode loop's argmax of each logits row) against numpy's
argmax: the first index of the largest value, or of the first NaN.  The gpu kernel
(``line_ops.cu``'s ``mgx_argmax_rows``) also runs here on the host (tests/attn_host.py: one thread per
CUDA thread, ``__syncthreads()`` a barrier), so the threads' scans and the block merge are checked
without a GPU; on the gpu target its 16-byte-load path runs as well."""
import numpy as np
import pytest

import attn_host
from mgx_graph.errors import ShapeError
from mgx_graph.operators.index_ops import argmax_rows
from mgx_graph.targets import make_context


def _rows(kind, dtype, rows, n, rng):
    """``rows`` x ``n`` values of one kind of case: random, ties of the maximum, NaNs, only -inf,
    +inf next to NaN, one maximum in the last column."""
    x = rng.standard_normal((rows, n)).astype(dtype)
    if kind == "ties":
        x[:, rng.integers(0, n, size=3)] = x.max() + 1
    elif kind == "nan":
        for r in range(rows):
            x[r, rng.integers(0, n, size=2)] = np.nan
    elif kind == "neg_inf":
        x[:] = -np.inf
    elif kind == "inf_nan":
        x[:, n // 2] = np.inf
        x[:, -1] = np.nan
    elif kind == "last":
        x[:, -1] = x.max() + 1
    return x


KINDS = ["random", "ties", "nan", "neg_inf", "inf_nan", "last"]


@pytest.mark.skipif(not attn_host.available(), reason="needs g++")
@pytest.mark.parametrize("dtype, ctype, acc", [("float32", "float", "float"), ("float64", "double", "double"),
                                               ("float16", "__half", "float")])
@pytest.mark.parametrize("n, block", [(1, 32), (7, 32), (1000, 64), (4099, 128)])
def test_kernel_on_the_host_matches_numpy(dtype, ctype, acc, n, block):
    import os

    import mgx_graph.operators as ops

    with open(os.path.join(os.path.dirname(ops.__file__), "line_ops.cu")) as f:
        lib, sigs = attn_host.build(f"typedef {ctype} T;\ntypedef {acc} ACC;\n" + f.read())
    rng = np.random.default_rng(n)
    for kind in KINDS:
        x = _rows(kind, dtype, 3, n, rng)
        got = np.full(3, -5, np.int64)
        attn_host.launch(lib, sigs, "mgx_argmax_rows", (3,), block, (x, got, n, n, 0))
        np.testing.assert_array_equal(got, np.argmax(x, axis=1), err_msg=f"{kind} n={n}")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("n", [1, 13, 49152, 128256 + 3])
def test_argmax_rows_matches_numpy(target, dtype, n):
    """Contiguous rows (16-byte loads on gpu where the length allows), and rows of a wider array."""
    ctx = make_context(target)
    rng = np.random.default_rng(n + len(dtype))
    for kind in KINDS:
        host = _rows(kind, dtype, 2, n + 5, rng)
        for x in (host[:, :n].copy(), host[:, :n]):  # standard layout, then rows n + 5 apart
            dev = ctx.xp.asarray(x)
            out = ctx.xp.full((2,), -5, np.int64)
            argmax_rows(ctx, dev, out)
            got = out if isinstance(out, np.ndarray) else out.get()
            np.testing.assert_array_equal(got, np.argmax(x, axis=1), err_msg=f"{kind} n={n}")


def test_argmax_rows_rejects_what_it_does_not_take():
    ctx = make_context("ref")
    x = np.zeros((2, 8), np.float32)
    for bad_x, bad_out in [(x, np.zeros(3, np.int64)), (x, np.zeros(2, np.int32)), (x[None], np.zeros(2, np.int64)),
                           (x.astype(np.int32), np.zeros(2, np.int64)), (x[:, ::2], np.zeros(2, np.int64)),
                           (np.zeros((2, 0), np.float32), np.zeros(2, np.int64))]:
        with pytest.raises(ShapeError, match="argmax_rows"):
            argmax_rows(ctx, bad_x, bad_out)


def test_line_kernels_are_looked_up_once_per_dtype_and_name(monkeypatch):
    """``line_function`` asks the compiled module for a kernel once; later launches reuse it."""
    from mgx_graph.operators import index_ops

    calls = []

    class Module:
        def get_function(self, name):
            calls.append(name)
            return object()

    monkeypatch.setattr(index_ops, "line_module", lambda dtype: Module())
    index_ops.line_function.cache_clear()
    try:
        a = index_ops.line_function("float32", "mgx_argmax_rows")
        assert index_ops.line_function("float32", "mgx_argmax_rows") is a
        assert index_ops.line_function("float16", "mgx_argmax_rows") is not a
        assert calls == ["mgx_argmax_rows", "mgx_argmax_rows"]
    finally:
        index_ops.line_function.cache_clear()
