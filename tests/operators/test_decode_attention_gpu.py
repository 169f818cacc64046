"""decode_attention.cu on a GPU against the float64 numpy oracle, for many shapes in two tests (a GPU with
CuPy only): the kernels the gpu kernel table gives the ops (decode_attention, grouped_attention for one
row per batch entry) launched on device arrays laid out as given, float16 / float32, GQA ratios 1 .. 8,
cache lengths 1 .. 20000 (one split, several, several chunks per split), head sizes 16 .. 256, several query
rows, masks broadcast or per head, rows that see no key, the exports' transposed cache layout and a
misaligned cache (the element-wise variant).  Each test reports every failing case at once."""
import numpy as np
import pytest

from mgx_graph import Shape
from mgx_graph.operators import make_op
from mgx_graph.operators.gpu_lowering import table_kernel

import attn_oracle

pytestmark = pytest.mark.gpu
TOL = {"float32": (2e-5, 2e-5), "float16": (3e-3, 3e-3)}


class _Ctx:
    """What a kernel launch reads of the gpu context."""

    @staticmethod
    def data_ptr(a):
        return a.data.ptr


def _shape(a) -> Shape:
    return Shape(a.dtype.name, a.shape, tuple(s // a.itemsize for s in a.strides))


def _device(host: np.ndarray, layout: str):
    """``host`` [B, X, P, D] on the device as ``layout``: standard, ``cache`` (a transpose of a [P, B, X, D]
    buffer) or ``misaligned`` (standard strides one element past an aligned address)."""
    import cupy

    if layout == "cache":
        return cupy.asarray(np.ascontiguousarray(host.transpose(2, 0, 1, 3))).transpose(1, 2, 0, 3)
    if layout == "misaligned":
        buf = cupy.zeros(host.size + 1, host.dtype)
        view = buf[1:].reshape(host.shape)
        view[...] = cupy.asarray(host)
        return view
    return cupy.asarray(host)


def _launch(op, arrays: list):
    """Run ``op``'s gpu kernel on the device ``arrays``; returns (host result, kernel label)."""
    import cupy

    shapes = [_shape(a) for a in arrays]
    out_shape = op.compute_shape(shapes)
    k = table_kernel(op, shapes, out_shape)
    assert k is not None and "decode_attention.cu" in k.label, (op, k)
    out = cupy.full(out_shape.lens, 7, out_shape.np_dtype)
    ws = [cupy.empty(s.lens, s.np_dtype) for s in k.workspace]
    k.fn(_Ctx(), out, arrays, ws)
    cupy.cuda.Device().synchronize()
    return out.get(), k.label


def _decode_case(dtype, N, Nkv, S, P, H, Hv, mask, layout, seed):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(1, N, S, H)).astype(dtype)
    k, v = rng.normal(size=(1, Nkv, P, H)).astype(dtype), rng.normal(size=(1, Nkv, P, Hv)).astype(dtype)
    m = None
    if mask:
        heads = N if mask == "per_head" else 1
        m = rng.normal(size=(1, heads, S, P))
        m[rng.random(m.shape) < 0.4] = -np.inf
        m[0, 0, 0, :] = -np.inf  # an empty row
        m = m.astype("float32" if mask == "float32" else dtype)
    op = make_op("decode_attention", scale=1.0 / np.sqrt(H), mask=int(m is not None), nan_zero=1)
    arrays = [_device(q, "standard"), _device(k, layout), _device(v, layout)]
    import cupy

    if m is not None:
        arrays.append(cupy.asarray(m))
    mr = None if m is None else m.astype(dtype)  # the op rounds the mask to q's type
    want = attn_oracle.attention(q, k, v, 1.0 / np.sqrt(H), mask=mr, nan_zero=True)
    return op, arrays, want


DECODE_SHAPES = [(4, 4, 1, 64, 64), (9, 3, 1, 64, 64), (8, 2, 3, 128, 128), (8, 1, 1, 80, 48), (16, 2, 2, 256, 256),
                 (6, 6, 1, 16, 16)]


def test_decode_attention_kernel_matches_numpy(gpu_target):
    failures, n = [], 0
    for dtype in ("float16", "float32"):
        for N, Nkv, S, H, Hv in DECODE_SHAPES:
            for P in (1, 7, 256, 257, 1000, 5000):
                for mask, layout in (("heads", "cache"), ("per_head", "standard"), (None, "misaligned"),
                                     ("float32", "cache")):
                    if mask == "float32" and dtype == "float32":
                        continue
                    n += 1
                    op, arrays, want = _decode_case(dtype, N, Nkv, S, P, H, Hv, mask, layout, n)
                    got, label = _launch(op, arrays)
                    if not np.allclose(got.astype(np.float64), want, *TOL[dtype], equal_nan=True):
                        err = np.nanmax(np.abs(got.astype(np.float64) - want))
                        failures.append(f"{dtype} N={N} Nkv={Nkv} S={S} P={P} H={H} Hv={Hv} mask={mask} "
                                        f"layout={layout} [{label}]: max error {err}")
    assert not failures, f"{len(failures)} of {n} cases differ:\n" + "\n".join(failures)


def test_decode_attention_kernel_long_cache(gpu_target):
    """20000 cache rows: 40 splits of two chunks each (the running max across chunks of one block)."""
    op, arrays, want = _decode_case("float16", 8, 2, 1, 20000, 64, 64, "heads", "cache", 7)
    got, label = _launch(op, arrays)
    assert "40 splits" in label
    np.testing.assert_allclose(got.astype(np.float64), want, *TOL["float16"])


GROUPED_OPTIONS = [dict(), dict(local_window=64), dict(softcap=30.0), dict(bias=True), dict(sink=True),
                   dict(smooth_softmax=1), dict(key_mask=True)]


def _grouped_case(dtype, B, N, Nkv, P, H, opts, seed):
    import cupy

    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, 1, N, H)).astype(dtype)
    k, v = rng.normal(size=(B, Nkv, P, H)).astype(dtype), rng.normal(size=(B, Nkv, P, H)).astype(dtype)
    lens = np.array([P, max(P // 3, 1), 0][:B], np.int64)
    pos = (lens - 1).reshape(B, 1)
    window, softcap = opts.get("local_window", -1), opts.get("softcap", 0.0)
    t = np.arange(P)
    vis = (t < lens[:, None]) & (t <= pos) & ((t > pos - window) if window > 0 else True)
    extra, mask, sink = [], None, None
    if opts.get("bias"):
        T = max(P // 2, 1)
        bias = rng.normal(size=(B, N, 1, T)).astype(dtype)
        extra.append(bias)
        mask = np.concatenate([bias.astype(np.float64), np.zeros((B, N, 1, P - T))], -1)
    if opts.get("sink"):
        sink = rng.normal(size=(N,)).astype("float32")
        extra.append(sink)
    if opts.get("key_mask"):
        km = rng.random((B, P)) < 0.7
        extra.append(km)
        vis = vis & km
    op = make_op("grouped_attention", local_window=window, softcap=softcap, smooth=opts.get("smooth_softmax", 0),
                 bias=int(bool(opts.get("bias"))), sink=int(sink is not None), key_mask=int(bool(opts.get("key_mask"))))
    host = [q, k, v, pos, lens, np.arange(P, dtype=np.int64)] + extra
    want = attn_oracle.attention(q.transpose(0, 2, 1, 3), k, v, 1.0 / np.sqrt(H), mask=mask,
                                 visible=vis[:, None, None], softcap=softcap, sink=sink,
                                 smooth=bool(opts.get("smooth_softmax")), empty="mean")
    return op, [cupy.asarray(a) for a in host], want.transpose(0, 2, 1, 3).reshape(B, 1, N * H)


def test_grouped_attention_one_row_kernel_matches_numpy(gpu_target):
    failures, n = [], 0
    for dtype in ("float16", "float32"):
        for B, N, Nkv, H in ((1, 9, 3, 64), (3, 8, 2, 128), (2, 4, 4, 32)):
            for P in (1, 100, 256, 1000, 4096):
                for opts in GROUPED_OPTIONS:
                    n += 1
                    op, arrays, want = _grouped_case(dtype, B, N, Nkv, P, H, opts, n)
                    got, label = _launch(op, arrays)
                    if not np.allclose(got.astype(np.float64), want, *TOL[dtype], equal_nan=True):
                        err = np.nanmax(np.abs(got.astype(np.float64) - want))
                        failures.append(f"{dtype} B={B} N={N} Nkv={Nkv} P={P} H={H} {opts} [{label}]: max error {err}")
    assert not failures, f"{len(failures)} of {n} cases differ:\n" + "\n".join(failures)
