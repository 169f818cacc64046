"""Build an ``operators/*.cu`` kernel file as host C++ with g++ (one thread runs each grid-stride loop) so
its arithmetic can be checked against an oracle on a machine without a GPU.  Only for kernels that use
plain C++ and math functions (no warp intrinsics, no half types); ``__shared__`` arrays (function-static)
and ``__syncthreads()`` (nothing) are emulated for the one thread, so block reductions written for any
power-of-two block size run too."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile

import numpy as np

_SHIM = r"""
#include <math.h>
#include <stdint.h>
struct mgx_dim3 { unsigned x, y, z; };
static const mgx_dim3 blockIdx = {0, 0, 0}, blockDim = {1, 1, 1}, gridDim = {1, 1, 1}, threadIdx = {0, 0, 0};
#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static
#define __syncthreads()
"""
_DIR = os.path.join(tempfile.gettempdir(), "mgx_cu_host")


def available() -> bool:
    return shutil.which("g++") is not None


def build(cu_path: str, T: str = "float", ACC: str = "float") -> ctypes.CDLL:
    """The kernels of ``cu_path`` compiled for element type ``T`` / compute type ``ACC`` (cached by content)."""
    with open(cu_path) as f:
        src = _SHIM + f"typedef {T} T;\ntypedef {ACC} ACC;\n" + f.read()
    os.makedirs(_DIR, exist_ok=True)
    base = os.path.join(_DIR, hashlib.sha1(src.encode()).hexdigest()[:16])
    if not os.path.exists(base + ".so"):  # built under names of this process, then renamed (xdist workers)
        part = f"{base}.{os.getpid()}"
        with open(part + ".cpp", "w") as f:
            f.write(src)
        subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-ffp-contract=off", "-o", part + ".so", part + ".cpp"],
                       check=True, capture_output=True)
        os.replace(part + ".so", base + ".so")
        os.unlink(part + ".cpp")
    return ctypes.CDLL(base + ".so")


def _arg(v):
    if isinstance(v, np.ndarray):
        assert v.flags.c_contiguous
        return ctypes.c_void_p(v.ctypes.data)
    return {np.int64: ctypes.c_longlong, np.int32: ctypes.c_int, np.float32: ctypes.c_float,
            np.float64: ctypes.c_double}[type(v)](v.item())


def launch(lib: ctypes.CDLL, name: str, *args) -> None:
    """Call kernel ``name`` with numpy arrays (pointers) and numpy scalars (by value), as a RawKernel gets them."""
    getattr(lib, name)(*[_arg(a) for a in args])
