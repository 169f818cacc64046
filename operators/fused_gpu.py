"""Generated fused kernels on the gpu target: compile the source of :mod:`.fused_codegen` /
:mod:`.fused_reduce_codegen` at run time through CuPy (``cupy.RawModule``: NVRTC on CUDA, hipRTC on
ROCm, the path ``scatternd.cu`` takes), and launch it into the instruction's preplanned output.

Compiled modules are kept per source in the process, and CuPy keeps the binaries in its kernel cache
on disk (keyed by the source and the options), so a source is compiled once per machine.  A launch
passes the arrays' data pointers and the element / row count: nothing is allocated, so it can be
recorded into a graph.  The strides of the arrays are compiled into the source; each launch checks
them against the ones it was compiled for (a mismatch raises instead of reading wrong elements).
"""
from __future__ import annotations

import functools

import numpy as np

from .gpu import GpuKernel


@functools.lru_cache(maxsize=None)
def compiled_function(source: str, name: str):
    """The ``extern "C"`` kernel ``name`` of ``source``, compiled once per process (CuPy caches the
    binary on disk)."""
    import cupy

    return cupy.RawModule(code=source).get_function(name)


def _layout(shape) -> tuple:
    """(dim, byte stride) of the dims that address memory (size > 1)."""
    return tuple((d, s) for d, (n, s) in enumerate(zip(shape.lens, shape.byte_strides())) if n > 1)


def _check(arrays, layouts, name: str) -> None:
    for k, (a, want) in enumerate(zip(arrays, layouts)):
        st = a.strides
        if any(st[d] != s for d, s in want):
            raise ValueError(f"{name}: argument {k} has strides {st}, the kernel was generated for "
                             f"{dict(want)} (bytes, by dim)")


def fused_kernel(kind: str, sub, in_shapes, out_shape) -> GpuKernel:
    """The one-launch kernel of a ``pointwise`` (``kind``) or ``fused_reduce`` instruction over
    submodule ``sub``; raises ValueError when the module has no generated form."""
    if kind == "pointwise":
        from .fused_codegen import pointwise_source as make
    else:
        from .fused_reduce_codegen import reduce_source as make
    ks = make(sub, in_shapes, out_shape)
    layouts = [_layout(s) for s in in_shapes] + [_layout(out_shape)]
    extent, grid, block, name, source = np.int64(ks.extent), (ks.grid,), (ks.block,), ks.name, ks.source

    def run(ctx, out, args, ws):
        if not ks.extent:
            return
        _check(list(args) + [out], layouts, name)
        compiled_function(source, name)(grid, block, (*args, out, extent))

    run.source = ks  # for inspection (tests, debugging)
    return GpuKernel(run, 1, [], True, f"{kind} (generated {name})")
