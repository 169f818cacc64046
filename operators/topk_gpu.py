"""TopK on the gpu target: ``topk.cu``, one block per line, a bitonic sort of the line's (key, index)
pairs, where the key orders as the value with -0.0 equal to 0.0 and NaN above +inf (onnxruntime's CPU
kernel from 1.32 on, and the ref target's :func:`~mgx_graph.operators.index_ops.topk_order`): ties keep
the lower index first; NaNs come first for ``largest=1`` and last for ``largest=0``.

A line of ``n`` elements takes ``p`` slots (the power of two >= n) of 12 bytes each: in dynamic shared
memory when ``12 * p`` fits the 48 KiB a block may take without opting in (lines of up to 4096
elements), otherwise in the line's slice of two planned workspaces, uint64 and uint32 ``[lines, p]``
(the same network through global memory: slower, still one launch, still captured).  A strided input is
first copied into a standard workspace.  The output is always sorted, which ONNX allows for
``sorted=0`` (the order is then unspecified), as the ref target does.

Element types: float16 / float32 / float64 and the signed and unsigned integers; anything else (bool)
keeps the generic kernel.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np

from ..ir.shape import Shape
from .gpu_kernel import GpuKernel
from .gpu_lowering import gpu_kernel_for

_HERE = os.path.dirname(os.path.abspath(__file__))
SMEM_BYTES = 48 * 1024  # dynamic shared memory a block may take without an opt-in (CUDA and HIP)
SLOT_BYTES = 12  # one uint64 key and one uint32 index per slot
MAX_THREADS = 1024
MAX_GRID = 1 << 20  # blocks launched at most; the kernel loops over the remaining lines

# element type -> (C type, key kind of topk.cu: 0 signed, 1 unsigned, 2 float / half, 3 double)
TYPES = {"float16": ("__half", 2), "float32": ("float", 2), "float64": ("double", 3), "int8": ("signed char", 0),
         "int16": ("short", 0), "int32": ("int", 0), "int64": ("long long", 0), "uint8": ("unsigned char", 1),
         "uint16": ("unsigned short", 1), "uint32": ("unsigned int", 1), "uint64": ("unsigned long long", 1)}

_HEADER = """#if defined(__HIPCC_RTC__) || defined(__HIPCC__)
#include <hip/hip_fp16.h>
#elif !defined(MGX_HOST_EMULATION)
#include <cuda_fp16.h>
#endif
"""


def source(dtype: str) -> str:
    """The ``topk.cu`` translation unit for element type ``dtype`` (a key of :data:`TYPES`)."""
    ctype, kind = TYPES[dtype]
    with open(os.path.join(_HERE, "topk.cu")) as f:
        body = f.read()
    head = _HEADER if dtype == "float16" else ""
    return head + f"typedef {ctype} T;\n#define MGX_TOPK_KIND {kind}\n" + body


@functools.lru_cache(maxsize=None)
def topk_module(dtype: str):
    """``topk.cu`` compiled for ``dtype`` (CuPy RawModule)."""
    import cupy

    return cupy.RawModule(code=source(dtype))


@dataclass(frozen=True)
class Plan:
    """One TopK instruction in the kernel's terms: the input viewed as ``[outer, n, inner]`` around the
    axis, ``k`` results per line, ``p`` slots per line (a power of two >= max(n, 2))."""

    outer: int
    n: int
    inner: int
    k: int
    largest: int
    dtype: str

    @property
    def lines(self) -> int:
        return self.outer * self.inner

    @property
    def p(self) -> int:
        return 1 << max(int(self.n - 1).bit_length(), 1)

    @property
    def shared(self) -> bool:
        """Whether the slots fit in shared memory (else they are workspaces)."""
        return self.p * SLOT_BYTES <= SMEM_BYTES

    @property
    def threads(self) -> int:
        return min(MAX_THREADS, max(32, self.p // 2))

    @property
    def grid(self) -> int:
        return min(self.lines, MAX_GRID)

    @property
    def shared_mem(self) -> int:
        return self.p * SLOT_BYTES if self.shared else 0

    def workspace(self) -> list[Shape]:
        """The slot workspaces (none when the slots are in shared memory)."""
        return [] if self.shared else [Shape("uint64", [self.lines, self.p]), Shape("uint32", [self.lines, self.p])]

    def args(self, x, vals, inds, slots, null):
        """``mgx_topk``'s arguments: standard ``x``, the outputs, the slot workspaces (``slots``, used when
        not :attr:`shared`) and ``null``, the null pointer of the caller's launcher."""
        keys, idx = slots if not self.shared else (null, null)
        return (x, vals, inds, np.int64(self.lines), np.int64(self.n), np.int64(self.inner), np.int64(self.k),
                np.int64(self.p), np.int32(self.largest), keys, idx)


def plan_for(x: Shape, axis: int, k: int, largest: int) -> Plan | None:
    """The plan of TopK over ``x`` along ``axis`` (normalized), or None when the kernel does not apply
    (an element type outside :data:`TYPES`, a line of 2**31 elements or more)."""
    if x.dtype not in TYPES or x.lens[axis] >= 2 ** 31:
        return None
    outer = int(np.prod(x.lens[:axis])) if axis else 1
    inner = int(np.prod(x.lens[axis + 1:])) if axis + 1 < len(x.lens) else 1
    return Plan(outer, int(x.lens[axis]), inner, int(k), int(largest), x.dtype)


@gpu_kernel_for("topk")
def _lower_topk(op, inputs: list[Shape], output, ins) -> GpuKernel | None:
    return topk_gpu_kernel(op, inputs, output)


def topk_gpu_kernel(op, inputs: list[Shape], output) -> GpuKernel | None:
    """The gpu kernel of TopK instruction ``op`` (attributes k, axis, largest) over ``inputs[0]``; None
    keeps the generic kernel (see :func:`plan_for`)."""
    x = inputs[0]
    axis = op.axis % len(x.lens)
    if output[0].elements() == 0:  # k = 0 or an empty dimension: nothing to write
        return GpuKernel(lambda ctx, out, args, ws: None, 0, [], True, "topk.cu (empty output)")
    plan = plan_for(x, axis, op.k, op.largest)
    if plan is None:
        return None
    stage = [] if x.standard() else [Shape(x.dtype, x.lens)]
    ws = stage + plan.workspace()

    def run(ctx, out, args, wsa):
        src = args[0]
        if stage:
            ctx.xp.copyto(wsa[0], src)
            src = wsa[0]
        kern = topk_module(plan.dtype).get_function("mgx_topk")
        kern((plan.grid,), (plan.threads,), plan.args(src, out[0], out[1], wsa[len(stage):], np.uint64(0)),
             shared_mem=plan.shared_mem)

    where = "shared memory" if plan.shared else "global workspace"
    return GpuKernel(run, 1 + len(stage), ws, True, f"topk.cu bitonic ({where})")
