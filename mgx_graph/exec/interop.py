"""Parameters given as any array object: the one place a run converts what it is given.

``run`` and ``run_async`` accept, for every parameter:

* the target's own arrays: ``cupy.ndarray`` on ``gpu``, ``numpy.ndarray`` on ``ref``;
* anything with DLPack (``__dlpack__`` and ``__dlpack_device__``, the Python array API standard's
  exchange protocol): torch tensors, JAX arrays, CuPy and numpy arrays;
* anything with ``__cuda_array_interface__`` (CUDA Array Interface v3: CuPy, Numba, torch CUDA
  tensors), on ``gpu``;
* anything numpy reads without a copy (``__array_interface__``, ``__array_struct__``, ``__array__``);
  ``run`` also takes nested lists and scalars (``numpy.asarray``).

:func:`to_target` makes no copy: it returns a view of the caller's memory, either as an array of the
target (the program's device memory: device ``ctx.device_id`` on ``gpu``; host memory on ``ref``)
or as a host numpy array (host memory given to a ``gpu`` program), and the caller copies where it
must (``run`` always copies each input once into the program's parameter buffers; ``run_async``
binds target arrays as they are and copies only when asked to).  On ``gpu`` the DLPack import is
made on the run's queue, so the producer orders its pending work before the run (the DLPack
``stream`` argument).  Sources: the DLPack specification (https://dmlc.github.io/dlpack/latest/) and
the CUDA Array Interface (https://numba.readthedocs.io/en/stable/cuda/cuda_array_interface.html).
"""
from __future__ import annotations

import numpy as np

from ..errors import ParameterError

# DLPack DLDeviceType values (dlpack.h)
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_ROCM, DL_ROCM_HOST, DL_CUDA_MANAGED = 1, 2, 3, 10, 11, 13
HOST_DEVICES = {DL_CPU: "cpu", DL_CUDA_HOST: "cuda host (pinned)", DL_ROCM_HOST: "rocm host (pinned)"}
GPU_DEVICES = {DL_CUDA: "cuda", DL_ROCM: "rocm", DL_CUDA_MANAGED: "cuda managed"}
PLATFORM_DEVICES = {"cuda": (DL_CUDA, DL_CUDA_MANAGED), "hip": (DL_ROCM,)}


def type_name(a) -> str:
    t = type(a)
    return f"{t.__module__}.{t.__name__}"


def dlpack_device(a) -> tuple[int, int] | None:
    """``(DLDeviceType, device id)`` of an object with DLPack, None without it."""
    fn = getattr(a, "__dlpack_device__", None)
    if fn is None or not hasattr(a, "__dlpack__"):
        return None
    dev, idx = fn()
    return int(dev), int(idx)


def _readable_by_numpy(a) -> bool:
    return any(hasattr(a, k) for k in ("__array_interface__", "__array_struct__", "__array__"))


def _host_view(a, name: str, how: str) -> np.ndarray:
    """``a`` as a numpy array without a copy (``how``: ``dlpack`` or ``asarray``)."""
    try:
        return np.from_dlpack(a) if how == "dlpack" else np.asarray(a)
    except Exception as e:  # BufferError (requires grad), RuntimeError / TypeError (a dtype numpy lacks)
        raise ParameterError(f"parameter '{name}': cannot read the {type_name(a)} given "
                             f"({type(e).__name__}: {e})") from None


def expected(ctx) -> str:
    """What a ``run_async`` of a program on ``ctx`` takes without a copy, for error messages."""
    native = "cupy.ndarray" if ctx.name == "gpu" else "numpy.ndarray"
    return f"a {ctx.name} device array ({native}, or an object with DLPack or __cuda_array_interface__)"


def to_target(ctx, a, name: str, queue=None, loose: bool = False):
    """``(array, on_device)``: parameter ``name``'s value ``a`` as an array of the target of context
    ``ctx`` (``on_device`` True: CuPy on ``gpu``, numpy on ``ref``) or, on ``gpu``, as a host numpy
    array over memory on the host (``on_device`` False).  A view of the caller's memory, never a copy,
    except where ``numpy.asarray`` must convert (a nested list, an object whose ``__array__`` copies).
    ``loose``: take anything ``numpy.asarray`` takes (``run``), else only array objects
    (``run_async``).  ``queue``: the run's queue (a DLPack import on ``gpu`` is ordered on it).

    Shape, dtype and layout are not checked here (the executor compares them with the parameter).
    Raises ParameterError naming the parameter: memory on another device than the program's (another
    GPU; GPU memory given to a ``ref`` program), an object that is no array (``loose`` off), or an
    export that fails (a torch tensor that requires grad, a dtype numpy has no type for)."""
    if isinstance(a, np.ndarray):
        return a, ctx.name == "ref"
    if ctx.is_device_array(a):
        if ctx.name == "gpu":  # the memory pointer's plain int, not a Device object per input per call
            dev = getattr(a.data, "device_id", None)
            _check_gpu(ctx, a, name, a.device.id if dev is None else dev)
        return a, True
    dev = dlpack_device(a)
    if dev is not None and dev[0] in HOST_DEVICES:
        return _host_view(a, name, "dlpack"), ctx.name == "ref"
    if ctx.name == "gpu":
        if dev is not None or hasattr(a, "__cuda_array_interface__"):
            return _to_gpu(ctx, a, name, dev, queue), True
    elif dev is not None or hasattr(a, "__cuda_array_interface__"):
        where = f"{GPU_DEVICES.get(dev[0], f'DLPack device type {dev[0]}')} device {dev[1]}" if dev \
            else "GPU (__cuda_array_interface__)"
        raise ParameterError(f"parameter '{name}': the {type_name(a)} given is in {where} memory; the ref "
                             f"target runs on host memory (copy it to the host first)")
    if not loose and not _readable_by_numpy(a):
        raise ParameterError(f"parameter '{name}': expected {expected(ctx)}, got {type_name(a)}")
    return _host_view(a, name, "asarray"), ctx.name == "ref"


def _to_gpu(ctx, a, name: str, dev, queue):
    """A CuPy view of device memory given through DLPack (``dev``) or the CUDA Array Interface."""
    cp = ctx.cupy
    if dev is not None:
        if dev[0] not in PLATFORM_DEVICES.get(ctx.runtime.platform, ()):
            kind = GPU_DEVICES.get(dev[0], f"DLPack device type {dev[0]}")
            raise ParameterError(f"parameter '{name}': the {type_name(a)} given is in {kind} device {dev[1]} "
                                 f"memory, which the program's {ctx.runtime.platform} device cannot read")
        _check_gpu(ctx, a, name, dev[1])
        with ctx.on_queue(ctx.queue if queue is None else queue):
            return _imported(cp.from_dlpack, a, name)
    with ctx.on_queue(ctx.queue if queue is None else queue):
        arr = _imported(cp.asarray, a, name)
    _check_gpu(ctx, a, name, arr.device.id)
    return arr


def _imported(fn, a, name: str):
    try:
        return fn(a)
    except Exception as e:
        raise ParameterError(f"parameter '{name}': cannot import the {type_name(a)} given "
                             f"({type(e).__name__}: {e})") from None


def _check_gpu(ctx, a, name: str, device_id: int) -> None:
    if int(device_id) != ctx.device_id:
        raise ParameterError(f"parameter '{name}': the {type_name(a)} given is on device {device_id}; the "
                             f"program runs on device {ctx.device_id} (copy it there first)")
