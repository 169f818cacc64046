"""Generated fused kernels on the gpu target: compile the source of :mod:`.fused_codegen` /
:mod:`.fused_reduce_codegen` / :mod:`.fused_scatter_codegen` / :mod:`.fused_horizontal_codegen` /
:mod:`.fused_gemv_codegen` at run time through CuPy (``cupy.RawModule``: NVRTC on CUDA, hipRTC on ROCm,
the path ``scatternd.cu`` takes), and launch it into the instruction's preplanned output.  The fused
ops' entries in the kernel table (:mod:`.gpu_lowering`) are here: each op name with its kind of
generated source (:data:`FUSED_KINDS`, and ``fused_gemv``).

The source is compiled when the instruction is lowered (where CuPy is importable), so a compiler
error is found at compile time and the instruction falls back to its unfused evaluation; compiled
modules are kept per source in the process, and CuPy keeps the binaries in its kernel cache on disk
(keyed by the source and the options), so a source is compiled once per machine.  A launch
passes the arrays' data pointers and the element / row count: nothing is allocated, so it can be
recorded into a graph.  The strides of the arrays are compiled into the source; each launch checks
them against the ones it was compiled for (a mismatch raises instead of reading wrong elements).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np

from .fused_module import parts_of
from .gpu_kernel import GpuKernel, check_strides, compiled_function, layout, precompile
from .gpu_lowering import gpu_kernel_for

FUSED_KINDS = {"pointwise": "pointwise", "fused_reduce": "reduce", "fused_scatternd": "scatternd",
               "fused_horizontal": "horizontal"}  # op name -> the kind of its generated source


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
    layouts = [layout(s) for s in in_shapes] + [layout(s) for s in outs]
    extent, grid, block, name, source = np.int64(ks.extent), (ks.grid,), (ks.block,), ks.name, ks.source
    copies = _data_copies(kind, sub)

    def run(ctx, out, args, ws):
        results = out if isinstance(out, tuple) else (out,)
        for k, j in copies:
            if not _same_array(results[k], args[j]):
                ctx.xp.copyto(results[k], args[j])
        if not ks.extent:
            return
        check_strides(list(args) + list(results), layouts, name)
        (ready or compiled_function(source, name, pdl))(grid, block, (*args, *results, extent))

    run.source = ks  # type: ignore[attr-defined]  # a function attribute, for inspection (tests, debugging)
    return GpuKernel(run, 1 + len(copies), [], True, f"{kind} (generated {name})",
                     bound_copies=kind in ("scatternd", "horizontal"))


def _unfused(op, e: Exception) -> None:
    warnings.warn(f"{op.name} over '{op.module.name}': no generated kernel ({e}); its instructions run unfused",
                  stacklevel=4)


@gpu_kernel_for(*FUSED_KINDS)
def _lower_fused(op, inputs, output, ins) -> GpuKernel | None:
    """The generated kernel of the op's kind; None, with a warning, when the module has no generated
    form or it does not compile (lowering then uses the generic evaluation of the submodule: correct,
    several launches, not capturable)."""
    try:
        return fused_kernel(FUSED_KINDS[op.name], op.module, inputs, output)
    except (ValueError, RecursionError) as e:
        _unfused(op, e)
        return None


@gpu_kernel_for("fused_gemv")
def _lower_fused_gemv(op, inputs, output, ins) -> GpuKernel | None:
    """The generated kernel (:func:`.fused_gemv_codegen.fused_gemv_kernel`); None, with a warning,
    when the module has no generated form or it does not compile (lowering then evaluates the
    submodule instruction by instruction: correct, several launches, not capturable)."""
    from .fused_gemv_codegen import fused_gemv_kernel

    try:
        return fused_gemv_kernel(op.module, inputs, output)
    except (ValueError, RecursionError) as e:
        _unfused(op, e)
        return None
