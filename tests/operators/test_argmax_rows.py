"""``index_ops.argmax_rows`` and ``index_ops.ArgmaxAdvance`` (the greedy decode loop's argmax of each
logits row, and its one-kernel step tail) against numpy's argmax: the first index of the largest value,
or of the first NaN.  The gpu kernels (``line_ops.cu``'s ``mgx_argmax_rows`` and ``mgx_argmax_advance``)
also run here on the host (tests/attn_host.py: one thread per CUDA thread, ``__syncthreads()`` a
barrier, the blocks one after another), so the threads' scans, the block merges and the last block's
merge of the blocks' candidates are checked without a GPU; on the gpu target the 16-byte-load paths run
as well."""
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


def _line_ops_host(ctype, acc):
    import os

    import mgx_graph.operators as ops

    with open(os.path.join(os.path.dirname(ops.__file__), "line_ops.cu")) as f:
        return attn_host.build(f"typedef {ctype} T;\ntypedef {acc} ACC;\n" + f.read())


@pytest.mark.skipif(not attn_host.available(), reason="needs g++")
@pytest.mark.parametrize("dtype, ctype, acc", [("float32", "float", "float"), ("float64", "double", "double"),
                                               ("float16", "__half", "float")])
@pytest.mark.parametrize("n, chunk", [(1, 8), (7, 8), (1000, 64), (1000, 1000), (4099, 512), (4099, 136)])
def test_advance_kernel_on_the_host_matches_numpy(dtype, ctype, acc, n, chunk):
    """Several blocks of 32 threads, ``chunk`` values each: the id goes to ids[0] and host[0], the slot
    to pos[0] (or nowhere with a null pos), and the counter is back at 0 for the next launch."""
    lib, sigs = _line_ops_host(ctype, acc)
    rng = np.random.default_rng(n + chunk)
    blocks = -(-n // chunk)
    part_v, part_i = np.full(blocks, np.nan, acc if acc != "float" else "float32"), np.full(blocks, -9, np.int64)
    count = np.zeros(1, np.uint32)
    for launch, kind in enumerate(KINDS):
        x = _rows(kind, dtype, 1, n, rng)[0]
        ids, host, pos = np.full(1, -5, np.int64), np.full(1, -5, np.int64), np.full(1, -5, np.int64)
        with_pos = launch % 2 == 0
        attn_host.launch(lib, sigs, "mgx_argmax_advance", (blocks,), 32,
                         (x, n, chunk, 0, ids, host, pos if with_pos else None, 40 + launch, part_v, part_i, count))
        want = np.argmax(x)
        assert ids[0] == want and host[0] == want, f"{kind} n={n} chunk={chunk}"
        assert pos[0] == (40 + launch if with_pos else -5)
        assert count[0] == 0


def _aligned(x):
    """A copy of 1-D ``x`` starting on a 16-byte boundary (what the 16-byte-load paths take)."""
    buf = np.empty(x.nbytes + 16, np.uint8)
    off = (-buf.__array_interface__["data"][0]) % 16
    a = buf[off:off + x.nbytes].view(x.dtype)
    a[:] = x
    return a


def _edge_rows(dtype, n, rng):
    """The KINDS of :func:`_rows`, then a NaN first, the largest value first, two NaNs (the first wins)."""
    for kind in KINDS:
        yield kind, _rows(kind, dtype, 1, n, rng)[0]
    for kind in ("nan_first", "max_first", "two_nans"):
        x = rng.standard_normal(n).astype(dtype)
        if kind == "nan_first":
            x[0] = np.nan
        elif kind == "max_first":
            x[0] = x.max() + 1
        else:
            x[[n // 3, n - 1]] = np.nan
        yield kind, x


@pytest.mark.skipif(not attn_host.available(), reason="needs g++")
@pytest.mark.parametrize("dtype, ctype, acc", [("float32", "float", "float"), ("float64", "double", "double"),
                                               ("float16", "__half", "float")])
@pytest.mark.parametrize("n", [1, 3, 9, 17, 40, 1000, 4099])
def test_the_16_byte_load_paths_on_the_host_match_numpy(dtype, ctype, acc, n):
    """The device-only 16-byte-load branch of ``mgx_scan_first_max`` built on the host too (``__CUDACC_RTC__``
    defined): rows of lengths that are and are not whole vectors, the advance kernel over chunks of one, three
    and five vectors (rows up to 40 values: 40 is whole vectors of every dtype) and over the chunk
    ``advance_plan`` picks, so the last block's partial vector and the element-by-element tail after the last
    whole vector are scanned."""
    import os

    import mgx_graph.operators as ops
    from mgx_graph.operators.index_ops import advance_plan

    with open(os.path.join(os.path.dirname(ops.__file__), "line_ops.cu")) as f:
        lib, sigs = attn_host.build(f"#define __CUDACC_RTC__ 1\ntypedef {ctype} T;\ntypedef {acc} ACC;\n" + f.read())
    itemsize = np.dtype(dtype).itemsize
    v = 16 // itemsize
    rng = np.random.default_rng(n)
    planned = advance_plan(n, itemsize)[1]
    chunks = sorted({v, 3 * v, 5 * v, planned}) if n <= 40 else [planned]
    for kind, row in _edge_rows(dtype, n, rng):
        x, want = _aligned(row), np.argmax(row)
        got = np.full(1, -5, np.int64)
        attn_host.launch(lib, sigs, "mgx_argmax_rows", (1,), 32, (x, got, n, n, 1))
        assert got[0] == want, f"rows {kind} n={n}"
        for chunk in chunks:
            blocks = -(-n // chunk)
            part_v, part_i = np.full(blocks, np.nan, "float32" if acc == "float" else acc), np.full(blocks, -9, np.int64)
            count = np.zeros(1, np.uint32)
            ids, host, pos = (np.full(1, -5, np.int64) for _ in range(3))
            attn_host.launch(lib, sigs, "mgx_argmax_advance", (blocks,), 32,
                             (x, n, chunk, 1, ids, host, pos, 3, part_v, part_i, count))
            assert ids[0] == want and host[0] == want and pos[0] == 3 and count[0] == 0, f"{kind} n={n} chunk={chunk}"


@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_advance_plan_covers_the_row_in_whole_vectors(itemsize):
    """Every block has values (the last one fewer), each chunk is whole 16-byte vectors, and the grid stays
    within what the kernel's last block merges."""
    from mgx_graph.operators.index_ops import ADVANCE_MAX_BLOCKS, advance_plan

    v = 16 // itemsize
    for n in [1, 2, 7, 8, 9, 255, 2047, 2048, 2049, 49152, 128256 + 3, 151936, 10 ** 7 + 1]:
        blocks, chunk = advance_plan(n, itemsize)
        assert chunk % v == 0 and 1 <= blocks <= ADVANCE_MAX_BLOCKS, n
        assert (blocks - 1) * chunk < n <= blocks * chunk, n


def test_argmax_advance_rejects_a_slot_or_id_it_would_write_past():
    """``pos`` and ``ids`` get one int64 each from the kernel: another dtype or an empty array is a ShapeError
    naming them (an int32 ``cache_position`` would be written 8 bytes wide)."""
    from mgx_graph.operators.index_ops import ArgmaxAdvance

    tail = ArgmaxAdvance(make_context("ref"), 8, np.float32)
    x = np.zeros(8, np.float32)
    for ids, pos in [(np.zeros(1, np.int64), np.zeros(1, np.int32)), (np.zeros(1, np.int64), np.zeros(0, np.int64)),
                     (np.zeros(0, np.int64), None)]:
        with pytest.raises(ShapeError, match="ArgmaxAdvance.*(pos|ids)"):
            tail(x, ids, 0, pos, 1)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("n", [1, 13, 2049, 49152, 128256 + 3])
@pytest.mark.gpu
def test_argmax_advance_matches_numpy(gpu_target, dtype, n):
    """The step tail on the gpu: the id in input_ids and in the page-locked buffer (through a HostReader,
    as the greedy loop reads it), the slot in cache_position; repeated launches reuse the workspace."""
    from mgx_graph.operators.index_ops import ArgmaxAdvance

    ctx = make_context("gpu")
    xp = ctx.xp
    tail = ArgmaxAdvance(ctx, n, dtype)
    reader = ctx.host_reader((1, 1), np.int64)
    rng = np.random.default_rng(n + len(dtype))
    with ctx.on_queue(ctx.queue):  # the arrays made on the queue the kernel and the reader's event use
        ids, slot = xp.full((1, 1), -5, np.int64), xp.full((1,), -5, np.int64)
        for k, kind in enumerate(KINDS):
            host = _rows(kind, dtype, 1, n + 1, rng)
            for x in (xp.asarray(host[0, :n]), xp.asarray(host)[0, 1:]):  # aligned, then one element off
                reader.start_written(lambda ptr, x=x: tail(x, ids, ptr, slot, 7 + k), ctx.queue)
                got = int(reader.wait().reshape(-1)[0])
                want = int(np.argmax(x.get()))
                assert got == want and int(ids.get()[0, 0]) == want, f"{kind} n={n}"
                assert int(slot.get()[0]) == 7 + k
        assert int(tail.count.get()[0]) == 0
    reader.close()


def test_argmax_advance_rejects_what_it_does_not_take():
    from mgx_graph.operators.index_ops import ArgmaxAdvance

    ctx = make_context("ref")
    for n, dtype in [(0, np.float32), (4, np.int32)]:
        with pytest.raises(ShapeError, match="ArgmaxAdvance"):
            ArgmaxAdvance(ctx, n, dtype)
    tail = ArgmaxAdvance(ctx, 8, np.float32)
    for x, ids in [(np.zeros(9, np.float32), np.zeros(1, np.int64)), (np.zeros(8, np.float16), np.zeros(1, np.int64)),
                   (np.zeros(16, np.float32)[::2], np.zeros(1, np.int64)), (np.zeros(8, np.float32), np.zeros(1))]:
        with pytest.raises(ShapeError, match="ArgmaxAdvance"):
            tail(x, ids, 0)


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
