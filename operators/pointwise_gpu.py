"""The gpu target's kernels of the pointwise ops (:mod:`.pointwise`, :mod:`.activation`): the CUDA / HIP
statements of the ops that would need several array-library calls, each the op's entry in the kernel
table (:mod:`.gpu_lowering`): one elementwise kernel on its own, the same statement inside the generated
fused kernels (:mod:`.fused_exprs`); and Clip's elementwise kernel.

A statement computes ``y`` from ``x`` (one input), ``a`` / ``b`` (two inputs) or ``c`` / ``a`` / ``b``
(``where``); ``T`` is the element type and ``C`` the compute type (``float`` for half and float,
``double`` for double); an upper-case attribute name (``ALPHA``) stands for that float attribute.
"""
from __future__ import annotations

import functools

from .gpu_kernel import GpuKernel
from .gpu_lowering import gpu_body_for, gpu_kernel_for

BODIES = {
    "sigmoid": "y = (T)(C(1) / (C(1) + exp(-(C)x)))",
    "leaky_relu": "y = x >= T(0) ? x : (T)((C)x * C(ALPHA))",
    "elu": "y = x > T(0) ? x : (T)(C(ALPHA) * (exp((C)x) - C(1)))",
    "selu": "y = (T)(C(GAMMA) * ((C)x > C(0) ? (C)x : C(ALPHA) * (exp((C)x) - C(1))))",
    "celu": "y = (T)(max(C(0), (C)x) + min(C(0), C(ALPHA) * (exp((C)x / C(ALPHA)) - C(1))))",
    "hard_sigmoid": "y = (T)min(C(1), max(C(0), C(ALPHA) * (C)x + C(BETA)))",
    "hard_swish": "y = (T)((C)x * min(C(1), max(C(0), (C)x / C(6) + C(0.5))))",
    "softplus": "y = (T)((C)x > C(20) ? (C)x : log1p(exp((C)x)))",
    "softsign": "y = (T)((C)x / (C(1) + fabs((C)x)))",
    "thresholded_relu": "y = (C)x > C(ALPHA) ? x : T(0)",
    "quick_gelu": "y = (T)((C)x / (C(1) + exp(-(C(ALPHA) * (C)x))))",
    "prelu": "y = a >= T(0) ? a : (T)((C)a * (C)b)",
    "where": "y = c ? a : b",
    "mish": "y = (T)((C)x * tanh((C)x > C(20) ? (C)x : log1p(exp((C)x))))",
    "swish": "y = (T)((C)x / (C(1) + exp(-C(ALPHA) * (C)x)))",
}


def _gelu(op) -> str:
    if op.approximate == "tanh":
        return ("y = (T)(C(0.5) * (C)x * (C(1) + tanh(C(0.7978845608028654) * ((C)x + C(0.044715) * (C)x * (C)x "
                "* (C)x))))")
    return "y = (T)(C(0.5) * (C)x * (C(1) + erf((C)x * C(0.7071067811865476))))"


for _name, _body in BODIES.items():
    gpu_body_for(_name, _body)
gpu_body_for("gelu", _gelu)


@functools.lru_cache(maxsize=None)
def _clip_kernel():
    import cupy

    return cupy.ElementwiseKernel("T x, T lo, T hi", "T y", "T v = x < lo ? lo : x; y = hi < v ? hi : v;", "mgx_clip")


@gpu_kernel_for("clip")
def _lower_clip(op, inputs, output, ins) -> GpuKernel | None:
    """Clip with both bounds: one elementwise kernel (None with a bound missing: the generic kernel)."""
    if len(inputs) != 3:
        return None

    def run(ctx, out, args, ws):
        _clip_kernel()(args[0], args[1], args[2], out)

    return GpuKernel(run, 1, [], True, "elementwise clip")
