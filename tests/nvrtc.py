"""NVRTC through ctypes, on a machine without a GPU: compiles a kernel source as CuPy's ``RawModule`` does
on the device (NVRTC needs no driver), so a source that would not build is found before a GPU run.

The library and the CUDA headers (``cuda_fp16.h``) come from NVIDIA's wheels (``cuda-toolkit[nvrtc,cudart]``,
in the ``test`` extra on Linux x86_64): ``nvidia/cu13/{lib,include}``, or the CUDA 12 layout
``nvidia/cuda_nvrtc/lib`` + ``nvidia/cuda_runtime/include``.  :func:`nvrtc` is None where they are missing.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import os

ARCH = "sm_90"  # Hopper, the GPU the device tests run on: machine code (ptxas runs, so shared-memory and register limits are checked)


class Nvrtc:
    def __init__(self, lib: ctypes.CDLL, include: str):
        self.lib, self.include = lib, include
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def compile(self, source: str, name: str = "kernel.cu", options=()) -> tuple[bool, str]:
        """(compiled, NVRTC's log) for ``source`` with CuPy's architecture option, the headers' folder and
        ``options`` (the module's own, such as ``--fmad=false``)."""
        lib, prog = self.lib, ctypes.c_void_p()
        rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None)
        if rc:
            return False, f"nvrtcCreateProgram: {lib.nvrtcGetErrorString(rc).decode()}"
        try:
            opts = [f"--gpu-architecture={ARCH}", f"-I{self.include}", *options]
            arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
            rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            return rc == 0, log.value.decode(errors="replace").strip()
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _nvidia_roots() -> list[str]:
    spec = importlib.util.find_spec("nvidia")
    return list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []


@functools.lru_cache(maxsize=None)
def nvrtc() -> Nvrtc | None:
    """The NVRTC of NVIDIA's wheels, or None when they are not installed (or do not load here)."""
    for root in _nvidia_roots():
        for lib_glob, include in (("cu13/lib/libnvrtc.so.13", "cu13/include"),
                                  ("cuda_nvrtc/lib/libnvrtc.so.12", "cuda_runtime/include")):
            libs = glob.glob(os.path.join(root, lib_glob))
            inc = os.path.join(root, include)
            if libs and os.path.isfile(os.path.join(inc, "cuda_fp16.h")):
                try:
                    return Nvrtc(ctypes.CDLL(libs[0]), inc)
                except OSError:
                    continue
    return None
