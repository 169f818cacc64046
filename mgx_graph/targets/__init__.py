"""Targets: ``ref`` (numpy on the CPU, host queue) and ``gpu`` (CuPy + vendor BLAS on a GPU
stream, NVIDIA through CUDA or AMD through HIP).  ``auto`` picks ``gpu`` when one is usable.
Each target declares its compile pipeline (``pipeline()`` in ``ref.py`` / ``gpu.py``)."""
from __future__ import annotations

from ..errors import CompileError


def resolve_target(name: str) -> str:
    """Map ``auto`` to ``gpu`` or ``ref``; validate other names (CompileError if unknown/unusable)."""
    from ..runtime import gpu_available

    name = (name or "auto").lower()
    if name == "auto":
        return "gpu" if gpu_available() else "ref"
    if name == "cpu":
        name = "ref"
    if name not in ("ref", "gpu"):
        raise CompileError(f"unknown target '{name}' (expected ref, gpu or auto)")
    if name == "gpu" and not gpu_available():
        raise CompileError("target 'gpu' requested but no usable GPU (CUDA via cuda-bindings + CuPy, or HIP via "
                           "hip-python + CuPy) was found")
    return name


def make_context(name: str, **options):
    if name == "ref":
        from .ref import RefContext

        return RefContext(**options)
    from .gpu import GpuContext

    return GpuContext(**options)


def pipeline(name: str, options):
    """The pass pipeline of target ``name`` (``ref`` or ``gpu``) for ``options`` (a
    :class:`mgx_graph.passes.PipelineOptions`): a list of :class:`mgx_graph.passes.PassGroup`."""
    if name == "ref":
        from .ref import pipeline as ref_pipeline

        return ref_pipeline(options)
    if name == "gpu":
        from .gpu import pipeline as gpu_pipeline

        return gpu_pipeline(options)
    raise CompileError(f"unknown target '{name}' (expected ref or gpu)")
