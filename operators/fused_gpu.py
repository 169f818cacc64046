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
from typing import Any, Callable

import numpy as np

from .gpu import GpuKernel


@functools.lru_cache(maxsize=None)
def compiled_function(source: str, name: str, pdl: bool | None = None):
    """The ``extern "C"`` kernel ``name`` of ``source``, compiled once per process (CuPy caches the
    binary on disk).  With ``pdl`` (the ``MIGRAPHX_PDL`` setting of the compile that made the kernel;
    None: the compile in progress, :func:`.programmatic_launch.pdl_setting`) on and a device that supports
    it, the source gets the grid dependency instructions and the function launches programmatically
    inside captures (:mod:`.programmatic_launch`)."""
    import cupy

    from .programmatic_launch import ProgrammaticKernel, pdl_enabled, with_grid_dependency

    if pdl_enabled(pdl):
        from ..runtime import device_runtime

        fn = cupy.RawModule(code=with_grid_dependency(source)).get_function(name)
        return ProgrammaticKernel(fn, device_runtime())
    return cupy.RawModule(code=source).get_function(name)


def precompile(source: str, name: str, pdl: bool | None = None):
    """The compiled kernel (``pdl``: as :func:`compiled_function` takes it), or None when CuPy is not
    importable (lowering without a device: the first launch compiles).  Raises ValueError naming the
    kernel when NVRTC / hipRTC rejects it."""
    try:
        import cupy  # noqa: F401
    except ImportError:
        return None
    try:
        return compiled_function(source, name, pdl)
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
    make: Callable[..., Any]
    if kind == "pointwise":
        from .fused_codegen import pointwise_source as make
    elif kind == "scatternd":
        from .fused_scatter_codegen import scatternd_source as make
    elif kind == "horizontal":
        from .fused_horizontal_codegen import horizontal_source as make
    else:
        from .fused_reduce_codegen import reduce_source as make
    return make


def _same_array(a, b) -> bool:
    return a.data.ptr == b.data.ptr and a.strides == b.strides and a.shape == b.shape


def _data_copies(kind: str, sub) -> list:
    """``[(output position, input position)]``: the scatter data each launch copies into its output
    first (unless the output is that buffer)."""
    if kind == "scatternd":
        return [(0, 0)]
    if kind == "horizontal":
        from .fused_horizontal import parts_of

        return [(k, d) for k, (_, d) in enumerate(parts_of(sub)) if d is not None]
    return []


def fused_kernel(kind: str, sub, in_shapes, out_shape) -> GpuKernel:
    """The kernel of a ``pointwise`` / ``fused_reduce`` / ``fused_scatternd`` / ``fused_horizontal``
    instruction (``kind`` ``pointwise`` / ``reduce`` / ``scatternd`` / ``horizontal``) over submodule
    ``sub``: one launch, and for each scatter first a copy of its data into its output unless the
    output is that buffer (bound in place), one launch more planned per scatter; raises ValueError when
    the module has no generated form or its source does not compile."""
    from .programmatic_launch import pdl_setting

    ks, pdl = _source_maker(kind)(sub, in_shapes, out_shape), pdl_setting()
    ready = precompile(ks.source, ks.name, pdl)
    outs = out_shape if isinstance(out_shape, tuple) else (out_shape,)
    layouts = [_layout(s) for s in in_shapes] + [_layout(s) for s in outs]
    extent, grid, block, name, source = np.int64(ks.extent), (ks.grid,), (ks.block,), ks.name, ks.source
    copies = _data_copies(kind, sub)

    def run(ctx, out, args, ws):
        results = out if isinstance(out, tuple) else (out,)
        for k, j in copies:
            if not _same_array(results[k], args[j]):
                ctx.xp.copyto(results[k], args[j])
        if not ks.extent:
            return
        _check(list(args) + list(results), layouts, name)
        (ready or compiled_function(source, name, pdl))(grid, block, (*args, *results, extent))

    run.source = ks  # type: ignore[attr-defined]  # a function attribute, for inspection (tests, debugging)
    return GpuKernel(run, 1 + len(copies), [], True, f"{kind} (generated {name})")
