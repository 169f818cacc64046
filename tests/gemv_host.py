"""Run ``operators/gemv.cu`` on the host (the shim of :mod:`attn_host`: one fiber per CUDA thread,
``__syncthreads()`` a barrier of the block), so its index arithmetic, the shared-memory copy of x, the
xor-shuffle reduction (emulated through a block-wide buffer between two barriers: every thread of the
kernel reaches every shuffle) and the cross-group reduction are checked on a machine without a GPU;
and the order of a kernel's memory steps around its grid-dependency point in nvcc's PTX (no GPU needed)."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np

import attn_host

SHUFFLE = r"""
#define __align__(n) __attribute__((aligned(n)))
static float mgx_shfl_buf[1024];
static inline float __shfl_xor_sync(unsigned, float v, int o) {
    mgx_shfl_buf[threadIdx.x] = v;
    __syncthreads();
    float r = mgx_shfl_buf[threadIdx.x ^ o];
    __syncthreads();
    return r;
}
"""

available = attn_host.available


def run(plan, x: np.ndarray, w: np.ndarray, bias, y: np.ndarray, sx: int, sw: int, sy: int,
        vector: bool = True) -> None:
    """Launch ``plan`` over numpy buffers as the gpu launch passes them: ``x`` / ``w`` / ``y`` flat
    (views with the given row strides, elements), ``bias`` [N] or None."""
    lib, sigs = attn_host.build(SHUFFLE + plan.source(vector))
    attn_host.launch(lib, sigs, "mgx_gemv", plan.grid, plan.block[0], plan.args(x, w, bias, y, sx, sw, sy))


FUSED = r"""
static inline __half __float2half_rn(float f) { return __float2half(f); }
"""


def run_fused(ks, args, grid) -> None:
    """Launch a generated ``fused_gemv`` kernel (:func:`mgx_graph.operators.fused_gemv_codegen.fused_gemv_source`)
    over numpy buffers: ``args`` the inputs then the outputs, as the gpu launch passes them."""
    lib, sigs = attn_host.build(SHUFFLE + FUSED + ks.source)
    attn_host.launch(lib, sigs, ks.name, grid, ks.block, list(args))


NVCC = shutil.which("nvcc")
_PTX_STEP = re.compile(r"^\s*(griddepcontrol\.wait|ld\.global|ld\.shared|st\.shared|st\.global|bar\.sync)\b", re.M)


def ptx_memory_steps(source: str, path) -> list:
    """The memory steps of ``source`` compiled by ``nvcc -arch=sm_90 --std=c++17 -ptx`` (written to
    ``path``), in program order: ``griddepcontrol.wait``, ``ld.global``, ``ld.shared``, ``st.shared``,
    ``st.global`` and ``bar.sync``, one entry per instruction.  AssertionError with nvcc's message when
    the source does not compile."""
    with open(path, "w") as f:
        f.write(source)
    r = subprocess.run([NVCC, "-arch=sm_90", "--std=c++17", "-ptx", str(path), "-o", str(path) + ".ptx"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    with open(str(path) + ".ptx") as f:
        return _PTX_STEP.findall(f.read())


def body_before_point(source: str) -> str:
    """The text of the one ``extern "C" __global__`` body of ``source`` up to its
    ``MGX_GRID_DEPENDENCY();`` statement (AssertionError when there is not exactly one of each)."""
    assert source.count('extern "C" __global__') == 1 and source.count("MGX_GRID_DEPENDENCY();") == 1
    k = source.index('extern "C" __global__')
    return source[source.index("{", k):source.index("MGX_GRID_DEPENDENCY();")]
