"""The gpu target's kernels of the vision ops: GridSample and RoiAlign (``sampling.cu``, one thread per
output position) and NonMaxSuppression (``nms.cu``: one block per batch entry and class selects, then
one compacts the selected rows), each over declared workspaces only (captured), each the op's entry in
the kernel table (:mod:`.gpu_lowering`).
"""
from __future__ import annotations

import functools
import os

import numpy as np

from ..ir.shape import Shape
from .gpu_kernel import GpuKernel
from .gpu_lowering import gpu_kernel_for
from .sampling import GS_MODES, GS_PADDING

_HERE = os.path.dirname(os.path.abspath(__file__))
_CTYPES = {"float16": "__half", "float32": "float", "float64": "double"}
_HALF = ("#if defined(__HIPCC_RTC__) || defined(__HIPCC__)\n#include <hip/hip_fp16.h>\n#else\n"
         "#include <cuda_fp16.h>\n#endif\n")
BLOCK = 256


# ---------------------------------------------------------------------------------------------------
# GridSample, RoiAlign: sampling.cu
# ---------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def sampling_module(dtype: str):
    """``sampling.cu`` compiled for element type ``dtype`` (CuPy RawModule)."""
    import cupy

    with open(os.path.join(_HERE, "sampling.cu")) as f:
        src = f.read()
    acc = "double" if dtype == "float64" else "float"
    head = _HALF if dtype == "float16" else ""
    return cupy.RawModule(code=head + f"typedef {_CTYPES[dtype]} T;\ntypedef {acc} ACC;\n" + src)


def _grid(total: int) -> int:
    return max(1, min((total + BLOCK - 1) // BLOCK, 65535))


@gpu_kernel_for("grid_sample")
def _lower_grid_sample(op, inputs, output, ins) -> GpuKernel | None:
    x, g = inputs
    nd = x.ndim - 2
    dims = [1] * (3 - nd) + list(x.lens[2:])
    odims = [1] * (3 - nd) + list(g.lens[1:-1])
    total = x.lens[0] * int(np.prod(odims))
    scal = [np.int64(v) for v in [x.lens[0], x.lens[1]] + dims + odims] + \
        [np.int32(nd), np.int32(GS_MODES.index(op.mode)), np.int32(GS_PADDING.index(op.padding_mode)),
         np.int32(op.align_corners)]

    def run(ctx, out, args, ws):
        if total:
            sampling_module(x.dtype).get_function("mgx_grid_sample")((_grid(total),), (BLOCK,),
                                                                     (args[0], args[1], out, *scal))

    return GpuKernel(run, 1, [], True, "sampling.cu grid_sample")


@gpu_kernel_for("roi_align")
def _lower_roi_align(op, inputs, output, ins) -> GpuKernel | None:
    x, rois, _ = inputs
    R = rois.lens[0]
    total = output.elements()
    acc = np.float64 if x.dtype == "float64" else np.float32
    scal = [np.int64(v) for v in (R, *x.lens, op.output_height, op.output_width)]
    tail = [acc(op.spatial_scale), np.int64(op.sampling_ratio), np.int32(op.half_pixel),
            np.int32(op.mode == "max")]

    def run(ctx, out, args, ws):
        if total:
            sampling_module(x.dtype).get_function("mgx_roi_align")((_grid(total),), (BLOCK,),
                                                                   (args[0], args[1], args[2], out, *scal, *tail))

    return GpuKernel(run, 1, [], True, "sampling.cu roi_align")


# ---------------------------------------------------------------------------------------------------
# NonMaxSuppression: nms.cu
# ---------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _nms_module():
    import cupy

    with open(os.path.join(_HERE, "nms.cu")) as f:
        src = f.read()
    no_fma = "-ffp-contract=off" if cupy.cuda.runtime.is_hip else "--fmad=false"  # IoU rounded as on the CPU
    return cupy.RawModule(code=src, options=(no_fma,))


@gpu_kernel_for("nms")
def _lower_nms(op, inputs, output, ins) -> GpuKernel | None:
    if not all(s.standard() for s in inputs):
        return None
    B, C, N = inputs[1].lens
    M = min(op.max_out, N)
    cap = B * C * M
    ws = [Shape("int64", [B * C, max(N, 1)]), Shape("int64", [B * C, M]), Shape("int64", [B * C])]
    scal = (np.int64(C), np.int64(N), np.int64(M), np.int32(op.center_point_box), np.int32(op.has_score))

    def run(ctx, out, args, wsa):
        sel, count = out
        if B * C == 0:
            count.fill(0)
            return
        order, kept, counts = wsa
        sthr = args[3] if op.has_score else args[2]
        mod = _nms_module()
        mod.get_function("mgx_nms_select")((B * C,), (BLOCK,), (args[0], args[1], args[2], sthr, *scal[:3],
                                                                 *scal[3:], order, kept, counts))
        mod.get_function("mgx_nms_compact")((B * C,), (BLOCK,), (kept, counts, np.int64(C), np.int64(B * C),
                                                                  np.int64(M), np.int64(cap), sel, count))

    return GpuKernel(run, 2, ws, True, "nms.cu")
