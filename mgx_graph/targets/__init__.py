"""Targets: ``ref`` (numpy on the CPU, host queue) and ``gpu`` (CuPy + vendor BLAS on a GPU
stream, NVIDIA through CUDA or AMD through HIP).  ``auto`` picks ``gpu`` when one is usable.
The compile pipeline is defined once (``pipeline.py``); ``ref.py`` / ``gpu.py`` specialize it."""
from __future__ import annotations

from ..errors import CompileError
# loaded before ``def pipeline`` below, so that the function, not the submodule, is ``targets.pipeline``
from . import pipeline as _shared  # noqa: F401


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


def resolve_device(name: str, device_id) -> int | None:
    """Check ``device_id`` for target ``name`` (``ref`` or ``gpu``); None stays None (the current device).

    Raises CompileError for an id that is not an int, or other than 0 on ``ref`` (the host is its one
    device); DeviceError (``hipErrorInvalidDevice``) naming the id and the device count for an id
    out of range on ``gpu``."""
    import numbers

    from ..errors import DeviceError

    if device_id is None:
        return None
    if isinstance(device_id, bool) or not isinstance(device_id, numbers.Integral):
        raise CompileError(f"device_id must be an int, got {type(device_id).__name__} {device_id!r}")
    device_id = int(device_id)
    if name == "ref":
        if device_id != 0:
            raise CompileError(f"device_id {device_id}: the ref target runs on the host, its only device is 0")
        return 0
    from ..runtime import device_runtime

    count = device_runtime().hipGetDeviceCount()
    if not 0 <= device_id < count:
        raise DeviceError("hipSetDevice", "hipErrorInvalidDevice",
                          f"device_id {device_id} is out of range: the machine has {count} GPU device(s)"
                          + (f", ids 0..{count - 1}" if count else ""))
    return device_id


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
