"""The gpu target's kernels of the spectral ops (:mod:`.spectral`): DFT and STFT through cuFFT (hipFFT on
ROCm) with CuPy's ``cupy.cuda.cufft.Plan1d``, as that module's docstring describes: the signal copied
into a complex workspace with the transformed axis last, one batched C2C plan into a second workspace,
the bins copied (scaled by 1/n for an inverse) into ``out``.  A plan is made on an instruction's first
eager run, never inside a capture.  Each is the op's entry in the kernel table (:mod:`.gpu_lowering`).
"""
from __future__ import annotations

import numpy as np

from ..errors import CaptureError
from ..ir.shape import Shape
from .gpu_kernel import GpuKernel
from .gpu_lowering import gpu_kernel_for


def _work(dtype: str) -> str:
    return "float64" if dtype == "float64" else "float32"


class _Plans:
    """The cuFFT plans of one instruction, keyed by (length, batch, dtype); made on an eager run only."""

    def __init__(self):
        self.plans = {}

    def fft(self, ctx, src, dst, n: int, batch: int, inverse: bool) -> None:
        """dst = FFT of src (complex-viewed workspaces [batch, n, 2] of float32 / float64) along n."""
        from cupy.cuda import cufft

        key = (n, batch, src.dtype.name)
        plan = self.plans.get(key)
        if plan is None:
            queue = getattr(ctx, "current_queue", ctx.queue)
            if ctx.runtime.capturing([queue]):
                raise CaptureError("cuFFT plan", "not made yet", f"a plan for length {n} x {batch} is made on an "
                                                                 f"eager run, never inside a capture")
            kind = cufft.CUFFT_Z2Z if src.dtype == np.float64 else cufft.CUFFT_C2C
            plan = self.plans[key] = cufft.Plan1d(n, kind, batch)
        cdt = np.complex128 if src.dtype == np.float64 else np.complex64
        a = src.reshape(batch, n * 2).view(cdt)
        b = dst.reshape(batch, n * 2).view(cdt)
        plan.fft(a, b, cufft.CUFFT_INVERSE if inverse else cufft.CUFFT_FORWARD)


def _mirror_into(xp, ws, src, n):
    """The conjugate-symmetric upper half of a one-sided spectrum: ws[..., n - k, :] = conj(src[..., k, :])
    for k = 1 .. min((n - 1) // 2, len - 1) (ws ``[..., n, 2]``, src ``[..., len, 2]``)."""
    q = min((n - 1) // 2, src.shape[-2] - 1)
    if q <= 0:
        return
    dst = ws[..., n - 1:n - 1 - q:-1, :]
    xp.copyto(dst[..., 0], src[..., 1:1 + q, 0], casting="same_kind")
    xp.negative(src[..., 1:1 + q, 1], out=dst[..., 1], casting="same_kind")


@gpu_kernel_for("dft")
def _lower_dft(op, inputs, output, ins) -> GpuKernel | None:
    x = inputs[0]
    a, n = op.axis, op.length
    others = [d for i, d in enumerate(x.lens[:-1]) if i != a]
    batch = int(np.prod(others)) if others else 1
    work = Shape(_work(x.dtype), others + [n, 2])
    plans = _Plans()
    irfft = bool(op.inverse and op.onesided)
    used = min(x.lens[a], n // 2 + 1 if irfft else n)
    K = output.lens[a]

    def run(ctx, out, args, ws):
        xp = ctx.xp
        src = xp.moveaxis(args[0], a, -2)
        wi, wo = ws
        wi.fill(0)
        xp.copyto(wi[..., :used, :src.shape[-1]], src[..., :used, :], casting="same_kind")
        if irfft:
            _mirror_into(xp, wi, src[..., :used, :], n)
        if batch:
            plans.fft(ctx, wi, wo, n, batch, bool(op.inverse))
        res = xp.moveaxis(wo, -2, a)[(slice(None),) * a + (slice(0, K),)][..., :out.shape[-1]]
        if op.inverse:
            xp.multiply(res, 1.0 / n, out=out, casting="same_kind")
        else:
            xp.copyto(out, res, casting="same_kind")

    return GpuKernel(run, 4 + irfft * 2, [work, work], True, "cuFFT dft")


@gpu_kernel_for("stft")
def _lower_stft(op, inputs, output, ins) -> GpuKernel | None:
    s = inputs[0]
    B, F, K, _ = output.lens
    n = op.frame_length
    work = Shape(_work(s.dtype), [B, F, n, 2])
    plans = _Plans()

    def run(ctx, out, args, ws):
        xp = ctx.xp
        wi, wo = ws
        fr = op.frames(xp, args[0])
        wi.fill(0)
        xp.multiply(fr, args[1].reshape(n, 1), out=wi[..., :fr.shape[-1]], casting="same_kind")
        if B * F:
            plans.fft(ctx, wi, wo, n, B * F, False)
        xp.copyto(out, wo[:, :, :K, :], casting="same_kind")

    return GpuKernel(run, 4, [work, work], True, "cuFFT stft")
