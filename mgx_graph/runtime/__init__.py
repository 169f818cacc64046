"""The runtime layer: the only place that talks to a vendor API.

One small interface with HIP names (``hipStreamBeginCapture``, ``hipGraphInstantiate``,
``hipGraphLaunch``, ``hipGraphExecUpdate``, ...) and three backends:

* ``cuda``: NVIDIA, through ``cuda.bindings.runtime`` (cuda-bindings / cuda-python);
* ``hip``:  AMD, through hip-python (``hip.hip`` or ``rocm.bindings.hip``);
* ``host``: the CPU, for the ``ref`` target: a queue whose "kernels" are host functions
  (``hipLaunchHostFunc``), with stream capture, graphs and graph execs that follow the CUDA/HIP
  rules (a sync or an allocation during a thread-local capture invalidates it, the capture must end
  on the thread that began it, a failed capture yields no graph, ...).  The ``graph_launch`` state
  machine therefore runs unchanged on every target.

Every call returns its result directly and raises :class:`mgx_graph.errors.DeviceError` (with the
HIP error name) on failure.  Handles (streams, graphs, execs, events) are opaque; streams are ints.
"""
from __future__ import annotations

import functools
import threading

from ..errors import DeviceError
from .base import (CAPTURE_MODES, DEAD_KEPT, Runtime, check, cupy_call, hipStreamCaptureModeGlobal,  # noqa: F401
                   hipStreamCaptureModeRelaxed, hipStreamCaptureModeThreadLocal, hipStreamCaptureStatusActive,
                   hipStreamCaptureStatusInvalidated, hipStreamCaptureStatusNone, hipStreamDefault,
                   hipStreamNonBlocking, library_calls)


_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def host_runtime():
    """The process-wide host runtime (ref target)."""
    from ._host import HostRuntime

    return HostRuntime()


@functools.lru_cache(maxsize=None)
def _probe(platform: str):
    if platform == "cuda":
        try:
            from ._cuda import CudaRuntime

            rt = CudaRuntime()
            return rt if rt.hipGetDeviceCount() > 0 else None
        except Exception:
            return None
    if platform == "hip":
        try:
            from ._hip import HipRuntime

            hip_rt = HipRuntime()
            return hip_rt if hip_rt.hipGetDeviceCount() > 0 else None
        except Exception:
            return None
    raise ValueError(f"unknown platform '{platform}' (expected cuda or hip)")


def device_runtime(platform: str | None = None):
    """The runtime of the first usable GPU platform (``cuda`` then ``hip``), or None.

    ``platform`` forces one; ``MGX_GRAPH_PLATFORM`` (cuda|hip) does the same from the environment.
    """
    import os

    platform = platform or os.environ.get("MGX_GRAPH_PLATFORM") or None
    for p in ([platform] if platform else ["cuda", "hip"]):
        rt = _probe(p)
        if rt is not None:
            return rt
    return None


def gpu_available() -> bool:
    """True when a GPU runtime and CuPy are both usable."""
    if device_runtime() is None:
        return False
    try:
        import cupy  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


__all__ = ["Runtime", "host_runtime", "device_runtime", "gpu_available", "DeviceError", "check", "cupy_call",
           "hipStreamCaptureModeGlobal", "hipStreamCaptureModeThreadLocal", "hipStreamCaptureModeRelaxed",
           "hipStreamCaptureStatusNone", "hipStreamCaptureStatusActive", "hipStreamCaptureStatusInvalidated",
           "hipStreamDefault", "hipStreamNonBlocking"]
