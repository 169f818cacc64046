"""Generated fused kernels on the gpu target: compile the source of :mod:`.fused_codegen` /
:mod:`.fused_reduce_codegen` / :mod:`.fused_scatter_codegen` at run time through CuPy
(``cupy.RawModule``: NVRTC on CUDA, hipRTC on ROCm, the path ``scatternd.cu`` takes), and launch it
into the instruction's preplanned output.

The source is compiled when the instruction is lowered (where CuPy is importable), so a compiler
error is found at compile time and the instruction falls back to its unfused evaluation; compiled
modules are kept per source in the process, and CuPy keeps the binaries in its kernel cache on disk
(keyed by the source and the options), so a source is compiled once per machine.  A launch
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
    binary on disk).  With ``MIGRAPHX_PDL=1`` on a device that supports it, the source gets the grid
    dependency instructions and the function launches programmatically inside captures
    (:mod:`.programmatic_launch`)."""
    import cupy

    from .programmatic_launch import ProgrammaticKernel, pdl_enabled, with_grid_dependency

    if pdl_enabled():
        from ..runtime import device_runtime

        fn = cupy.RawModule(code=with_grid_dependency(source)).get_function(name)
        return ProgrammaticKernel(fn, device_runtime())
    return cupy.RawModule(code=source).get_function(name)


def precompile(source: str, name: str):
    """The compiled kernel, or None when CuPy is not importable (lowering without a device: the
    first launch compiles).  Raises ValueError naming the kernel when NVRTC / hipRTC rejects it."""
    try:
        import cupy  # noqa: F401
    except ImportError:
        return None
    try:
        return compiled_function(source, name)
    except Exception as e:  # CompileException, a missing header, no device
        raise ValueError(f"kernel {name} does not compile: {type(e).__name__}: {e}") from e


def _layout(shape) -> tuple:
    """(dim, byte stride) of the dims that address memory (size > 1)."""
    return tuple((d, s) for d, (n, s) in enumerate(zip(shape.lens, shape.byte_strides())) if n > 1)


def _check(arrays, layouts, name: str) -> None:
    for k, (a, want) in enumerate(zip(arrays, layouts)):
        st = a.strides
        if any(st[d] != s for d, s in want):
            raise ValueError(f"{name}: argument {k} has strides {st}, the kernel was generated for "
                             f"{dict(want)} (bytes, by dim)")


def _source_maker(kind: str):
    if kind == "pointwise":
        from .fused_codegen import pointwise_source as make
    elif kind == "scatternd":
        from .fused_scatter_codegen import scatternd_source as make
    else:
        from .fused_reduce_codegen import reduce_source as make
    return make


def _same_array(a, b) -> bool:
    return a.data.ptr == b.data.ptr and a.strides == b.strides and a.shape == b.shape


def fused_kernel(kind: str, sub, in_shapes, out_shape) -> GpuKernel:
    """The kernel of a ``pointwise`` / ``fused_reduce`` / ``fused_scatternd`` instruction (``kind``
    ``pointwise`` / ``reduce`` / ``scatternd``) over submodule ``sub``: one launch, and for a scatter
    first a copy of its data (input 0) into the output unless the output is that buffer (bound in
    place), so two launches planned; raises ValueError when the module has no generated form or its
    source does not compile."""
    ks = _source_maker(kind)(sub, in_shapes, out_shape)
    ready = precompile(ks.source, ks.name)
    outs = out_shape if isinstance(out_shape, tuple) else (out_shape,)
    layouts = [_layout(s) for s in in_shapes] + [_layout(s) for s in outs]
    extent, grid, block, name, source = np.int64(ks.extent), (ks.grid,), (ks.block,), ks.name, ks.source
    copy_data = kind == "scatternd"

    def run(ctx, out, args, ws):
        if copy_data and not _same_array(out, args[0]):
            ctx.xp.copyto(out, args[0])
        if not ks.extent:
            return
        results = out if isinstance(out, tuple) else (out,)
        _check(list(args) + list(results), layouts, name)
        (ready or compiled_function(source, name))(grid, block, (*args, *results, extent))

    run.source = ks  # for inspection (tests, debugging)
    return GpuKernel(run, 1 + copy_data, [], True, f"{kind} (generated {name})")
