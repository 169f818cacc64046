"""operators/topk.cu run on the host (tests/attn_host.py: each block's threads as fibers, barriers for
__syncthreads, the dynamic shared memory one static buffer) against the oracle of tests/operators/test_native_topk.py
(numpy's lexsort for floats, Python's sort for integers): each key kind (float16 / float32 / float64 /
signed / unsigned), largest and smallest, k from 1 to the line, middle axes, lines of NaN / +-inf / ties /
-0.0, and both slot layouts (shared memory, global workspaces); and the device build of each key kind."""
import shutil
import subprocess
import types

import numpy as np
import pytest

from mgx_graph.operators import topk_gpu
from mgx_graph.ir.shape import Shape

import attn_host
from test_native_nan import _nan_rows
from test_native_topk import topk_oracle

pytestmark = pytest.mark.skipif(not attn_host.available(), reason="needs g++ (C++20)")
R = np.random.default_rng(5)


def _host_topk(x, k, axis, largest, force_global=False):
    """TopK of ``x`` by ``mgx_topk`` as the gpu target plans and launches it: [values, int64 indices]."""
    plan = topk_gpu.plan_for(Shape(x.dtype.name, x.shape), axis % x.ndim, k, largest)
    lib, sigs = attn_host.build(topk_gpu.source(plan.dtype))
    lens = list(x.shape)
    lens[axis] = k
    vals = np.full(lens, 7, x.dtype)
    inds = np.full(lens, -1, np.int64)
    slots = [np.zeros(s.lens, s.np_dtype) for s in plan.workspace()]
    if force_global:  # the global-workspace layout on a line that would fit shared memory
        slots = [np.zeros((plan.lines, plan.p), np.uint64), np.zeros((plan.lines, plan.p), np.uint32)]
        args = plan.args(np.ascontiguousarray(x), vals, inds, [], None)[:-2] + tuple(slots)
    else:
        args = plan.args(np.ascontiguousarray(x), vals, inds, slots, None)
    attn_host.launch(lib, sigs, "mgx_topk", (plan.grid,), plan.threads, args)
    return [vals, inds]


def _check(x, k, axis, largest, **kw):
    got = _host_topk(x, k, axis, largest, **kw)
    want = topk_oracle(x, k, axis, largest)
    np.testing.assert_array_equal(got[1], want[1])
    bits = np.ascontiguousarray(want[0]).view(np.uint8)
    np.testing.assert_array_equal(got[0].view(np.uint8), bits)  # bit for bit: NaN, -0.0


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("n,k", [(4, 1), (4, 4), (17, 5), (64, 64), (300, 150)])
def test_float_lines_match_oracle(dtype, largest, n, k):
    x = _nan_rows(6, n, dtype=dtype)
    x[0, : n // 2] = -0.0  # -0.0 ties with 0.0: the lower index first, the value kept bit for bit
    x[0, n // 2:] = 0.0
    _check(x, k, 1, largest)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.int8])
@pytest.mark.parametrize("largest", [1, 0])
def test_integer_lines_match_oracle(dtype, largest):
    info = np.iinfo(dtype)
    x = R.integers(info.min, info.max, size=(5, 33), endpoint=True).astype(dtype)
    x[1] = R.integers(-2 if info.min < 0 else 0, 3, size=33)  # ties
    x[2, :3] = [info.min, info.max, info.min]
    for k in (1, 8, 33):
        _check(x, k, 1, largest)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_middle_axes_and_strided_lines(axis):
    x = _nan_rows(30, 8).reshape(3, 10, 8)
    for largest in (1, 0):
        _check(x, min(3, x.shape[axis]), axis, largest)


@pytest.mark.parametrize("largest", [1, 0])
def test_global_workspace_slots(largest):
    x = _nan_rows(5, 37, dtype=np.float64)
    _check(x, 9, 1, largest, force_global=True)
    _check(x.reshape(5, 37, 1), 37, 1, largest, force_global=True)


def test_line_past_shared_memory():
    x = _nan_rows(2, 4097)
    plan = topk_gpu.plan_for(Shape("float32", x.shape), 1, 10, 1)
    assert not plan.shared and plan.p == 8192 and [tuple(s.lens) for s in plan.workspace()] == [(2, 8192)] * 2
    _check(x, 10, 1, 1)


def test_plan_layouts():
    """Slots in shared memory up to 4096 elements (12 bytes a slot within 48 KiB), a power of two >= 2."""
    p = [topk_gpu.plan_for(Shape("float16", [3, n]), 1, 1, 1) for n in (1, 2, 3, 4096, 4097)]
    assert [q.p for q in p] == [2, 2, 4, 4096, 8192]
    assert [q.shared for q in p] == [True, True, True, True, False]
    assert p[3].shared_mem == 4096 * 12 and p[4].shared_mem == 0
    assert topk_gpu.plan_for(Shape("bool", [3, 4]), 1, 1, 1) is None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64", "uint8"])
def test_device_build(dtype, tmp_path):
    """The translation unit NVRTC gets builds for the device (nvcc --cubin: no host pass, as NVRTC), each key kind."""
    src = tmp_path / f"topk_{dtype}.cu"
    src.write_text(topk_gpu.source(dtype))
    r = subprocess.run(["nvcc", "--cubin", str(src), "-o", str(src) + ".cubin"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


class _HostModule:
    """Stands in for topk_module(dtype): ``get_function`` launches the host build with a RawKernel's call."""

    def __init__(self, dtype):
        self.lib, self.sigs = attn_host.build(topk_gpu.source(dtype))

    def get_function(self, name):
        def call(grid, block, args, shared_mem=0):
            assert shared_mem <= topk_gpu.SMEM_BYTES
            args = [None if isinstance(a, np.uint64) and a == 0 else a for a in args]  # the null pointer
            attn_host.launch(self.lib, self.sigs, name, grid, block[0], args)
        return call


@pytest.mark.parametrize("shape,perm,axis,k,largest", [((5, 7, 3), (2, 0, 1), 1, 3, 1), ((6, 4100), None, 1, 6, 0),
                                                       ((4, 9), (1, 0), 0, 9, 1)])
def test_lowered_kernel_runs(monkeypatch, shape, perm, axis, k, largest):
    """The gpu kernel the lowering gets (its staging copy of a strided input, its workspaces, its launch
    arguments), run with numpy arrays and the host build in place of CuPy."""
    monkeypatch.setattr(topk_gpu, "topk_module", _HostModule)
    base = _nan_rows(int(np.prod(shape[:-1])), shape[-1]).reshape(shape)
    x = base if perm is None else np.transpose(base, perm)
    xs = Shape("float32", x.shape, tuple(s // x.itemsize for s in x.strides))
    op = types.SimpleNamespace(k=k, axis=axis, largest=largest)
    lens = list(x.shape)
    lens[axis] = k
    kern = topk_gpu.topk_gpu_kernel(op, [xs], (Shape("float32", lens), Shape("int64", lens)))
    assert kern.capturable and kern.launches == (1 if xs.standard() else 2)
    out = (np.full(lens, 7, np.float32), np.full(lens, -1, np.int64))
    kern.fn(types.SimpleNamespace(xp=np), out, [x], [np.zeros(s.lens, s.np_dtype) for s in kern.workspace])
    want = topk_oracle(x, k, axis, largest)
    np.testing.assert_array_equal(out[1], want[1])
    np.testing.assert_array_equal(out[0].view(np.uint32), np.ascontiguousarray(want[0]).view(np.uint32))
