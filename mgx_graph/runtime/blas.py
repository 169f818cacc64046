"""Vendor BLAS behind one small interface, usable inside stream capture.

CuPy refuses cuBLAS calls while a stream captures, so GEMMs go through a maintained binding that
does not: ``nvmath.bindings.cublas`` (nvmath-python, NVIDIA) or ``hip.hipblas`` (hip-python, AMD).
Each :class:`Blas` owns one handle bound to one queue with a fixed, preallocated workspace, so no
library allocation happens during capture (the PyTorch / ROCm lesson: cuBLAS and hipBLASLt allocate
lazily per stream unless given a workspace).

Row-major GEMMs are issued as column-major ones with the operands swapped (C^T = B^T A^T).
References: cuBLAS ``cublasGemmStridedBatchedEx``; hipBLAS ``hipblasGemmStridedBatchedEx``.
"""
from __future__ import annotations

import numpy as np

from ..errors import DeviceError

WORKSPACE_BYTES = 32 << 20


class Blas:
    """A BLAS handle on ``stream`` with a ``workspace_bytes`` workspace from ``runtime.hipMalloc``."""

    def __init__(self, runtime, stream: int, workspace_bytes: int = WORKSPACE_BYTES):
        self.runtime, self.stream = runtime, stream
        self.workspace = runtime.hipMalloc(workspace_bytes)
        self.workspace_bytes = workspace_bytes
        self._impl: _CuBlas | _HipBlas | None = None
        self._one: dict[np.dtype, np.ndarray] = {np.dtype("float32"): np.ones(1, np.float32), np.dtype("float64"): np.ones(1, np.float64)}
        self._zero: dict[np.dtype, np.ndarray] = {np.dtype("float32"): np.zeros(1, np.float32), np.dtype("float64"): np.zeros(1, np.float64)}
        try:
            if runtime.platform == "cuda":
                self._impl = _CuBlas(stream, self.workspace, workspace_bytes)
            elif runtime.platform == "hip":
                self._impl = _HipBlas(stream, self.workspace, workspace_bytes)
            else:
                raise DeviceError("blas", "hipErrorNotSupported", f"no BLAS for platform {runtime.platform}")
        except BaseException:  # no handle: the workspace goes back (nothing else owns it)
            try:
                runtime.hipFree(self.workspace)
            except Exception:
                pass
            raise

    def gemm(self, a_ptr, a_trans, lda, a_stride, b_ptr, b_trans, ldb, b_stride, c_ptr, ldc, c_stride,
             m, n, k, batch, dtype) -> None:
        """Row-major ``C[i] = op(A[i]) @ op(B[i])`` for ``i < batch`` (C is M x N, ldc >= N).

        ``a_trans``: A is stored column-major (i.e. given as a transposed view), likewise ``b_trans``.
        Strides and leading dims are in elements; pointers are device addresses.
        """
        dtype = np.dtype(dtype)
        scal = np.dtype("float64") if dtype == np.float64 else np.dtype("float32")
        alpha, beta = self._one[scal], self._zero[scal]
        if self._impl is None:
            raise DeviceError("blas", "hipErrorContextIsDestroyed", "gemm on a closed BLAS handle")
        # column-major view: C^T (N x M) = op(B)^T (N x K) @ op(A)^T (K x M)
        self._impl.gemm(b_trans, a_trans, n, m, k, alpha.ctypes.data, b_ptr, ldb, b_stride, a_ptr, lda, a_stride,
                        beta.ctypes.data, c_ptr, ldc, c_stride, batch, dtype)

    def close(self) -> None:
        if self._impl is not None:
            self._impl.close()
            self._impl = None
            try:
                self.runtime.hipFree(self.workspace)
            except Exception:
                pass


class _CuBlas:
    def __init__(self, stream, workspace, nbytes):
        try:
            from nvmath.bindings import cublas
        except ImportError as e:
            raise DeviceError("blas", "hipErrorNotInitialized",
                              f"the gpu target's GEMM calls cuBLAS through nvmath-python, which cannot be imported "
                              f"({e}); install the CUDA extra: pip install 'mgx_graph[cuda]'") from None

        self.cublas = cublas
        self.handle = cublas.create()
        try:
            cublas.set_stream(self.handle, int(stream))
            cublas.set_workspace(self.handle, int(workspace), int(nbytes))
            cublas.set_math_mode(self.handle, cublas.Math.DEFAULT_MATH)  # no TF32 for float32
        except BaseException:  # a handle that cannot be set up is destroyed (the caller frees the workspace)
            self.close()
            raise
        self.types = {np.dtype("float32"): 0, np.dtype("float16"): 2, np.dtype("float64"): 1}  # CUDA_R_*
        self.compute = {np.dtype("float32"): cublas.ComputeType.COMPUTE_32F,
                        np.dtype("float16"): cublas.ComputeType.COMPUTE_32F,
                        np.dtype("float64"): cublas.ComputeType.COMPUTE_64F}
        self.op = {False: cublas.Operation.N, True: cublas.Operation.T}

    def gemm(self, ta, tb, m, n, k, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch, dtype):
        t = self.types[dtype]
        self.cublas.gemm_strided_batched_ex(self.handle, self.op[ta], self.op[tb], m, n, k, alpha, A, t, lda, sA,
                                            B, t, ldb, sB, beta, C, t, ldc, sC, batch, self.compute[dtype], -1)

    def close(self):
        try:
            self.cublas.destroy(self.handle)
        except Exception:
            pass


class _HipBlas:
    def __init__(self, stream, workspace, nbytes):
        try:
            from rocm.bindings import hip, hipblas
        except ImportError:
            try:
                from hip import hip, hipblas
            except ImportError as e:
                raise DeviceError("blas", "hipErrorNotInitialized",
                                  f"the gpu target's GEMM calls hipBLAS through hip-python, which cannot be imported "
                                  f"({e}); install the ROCm extra: pip install 'mgx_graph[rocm]'") from None
        self.hipblas = hipblas
        err, self.handle = hipblas.hipblasCreate()
        self._check("hipblasCreate", err)
        try:
            self._check("hipblasSetStream", hipblas.hipblasSetStream(self.handle, hip.hipStream_t(int(stream)))[0])
            self._check("hipblasSetWorkspace", hipblas.hipblasSetWorkspace(self.handle, int(workspace), int(nbytes))[0])
        except BaseException:  # a handle that cannot be set up is destroyed (the caller frees the workspace)
            self.close()
            raise
        dt = hip.hipDataType
        ct = hipblas.hipblasComputeType_t
        self.types = {np.dtype("float32"): dt.HIP_R_32F, np.dtype("float16"): dt.HIP_R_16F,
                      np.dtype("float64"): dt.HIP_R_64F}
        self.compute = {np.dtype("float32"): ct.HIPBLAS_COMPUTE_32F, np.dtype("float16"): ct.HIPBLAS_COMPUTE_32F,
                        np.dtype("float64"): ct.HIPBLAS_COMPUTE_64F}
        op = hipblas.hipblasOperation_t
        self.op = {False: op.HIPBLAS_OP_N, True: op.HIPBLAS_OP_T}
        self.algo = hipblas.hipblasGemmAlgo_t.HIPBLAS_GEMM_DEFAULT

    @staticmethod
    def _check(call, err):
        if int(err) != 0:
            raise DeviceError(call, getattr(err, "name", str(err)))

    def gemm(self, ta, tb, m, n, k, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch, dtype):
        t = self.types[dtype]
        r = self.hipblas.hipblasGemmStridedBatchedEx(self.handle, self.op[ta], self.op[tb], m, n, k, alpha, A, t, lda,
                                                     sA, B, t, ldb, sB, beta, C, t, ldc, sC, batch,
                                                     self.compute[dtype], self.algo)
        self._check("hipblasGemmStridedBatchedEx", r[0])

    def close(self):
        try:
            self.hipblas.hipblasDestroy(self.handle)
        except Exception:
            pass
