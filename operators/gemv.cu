// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) for m < M (1 .. 4), n < N: a GEMV over a weight
// stored as W^T [N, K] with K contiguous (row stride sw elements), float accumulation.
//
// Configured by the defines that gemv_gpu.py puts before this file:
//   T        element type (__half or float)          TO_T  float -> T conversion (empty for float)
//   LT       load type: uint4 (16 bytes) or T        VEC   elements per load (16 / sizeof(T), or 1)
//   K        reduction length (a multiple of VEC)    M     rows of x and y
//   NT       threads per block                       TPC   threads per output column (a power of two,
//                                                          4 .. NT; under 32 a group holds several columns)
//   XS       1: x is first copied to shared memory (M * K elements)
//   HAS_BIAS 1: bias [N] (contiguous) is added before the conversion to T
//   PFMAX    most weight loads per thread held in registers ahead of the x copy (8 unless defined)
// The weight is a constant (no kernel writes it), so each thread first issues its first
// PF = min(ITERS, PFMAX) loads of its W^T row into registers (wp), then waits on the grids it depends
// on (MGX_GRID_DEPENDENCY: griddepcontrol unless MIGRAPHX_PDL=0, else nothing), then copies x; so the
// weight's DRAM round trip overlaps the x copy, its barrier and the kernel before this one.  The
// accumulation takes wp[i] for i < PF and loads the rest; the float additions are in the same order
// (i ascending, then e) either way.
// Each block computes NT / TPC consecutive columns; the TPC threads of a column read its row of W^T
// in VEC-element loads (a 32-thread group reads 32 * 16 contiguous bytes at a time), accumulate in
// float, reduce by xor shuffles within 32-thread groups (within TPC lanes when TPC < 32), then (TPC > 32)
// through shared memory.
// Every thread reaches every shuffle and barrier: columns past N only skip their loads and stores.

#ifndef MGX_GEMV_CONFIG  // compiled on its own (CMake's check_kernels): SmolLM2's down projection
#if defined(__HIPCC__)
#include <hip/hip_fp16.h>
#else
#include <cuda_fp16.h>
#endif
#define T __half
#define TO_T __float2half
#define LT uint4
#define VEC 8
#define K 1536
#define M 1
#define NT 256
#define TPC 128
#define XS 1
#define HAS_BIAS 0
#endif

#ifndef PFMAX
#define PFMAX 8
#endif
#ifndef MGX_GRID_DEPENDENCY  // defined by programmatic_launch.PRELUDE when the source is built for PDL
#define MGX_GRID_DEPENDENCY()
#endif

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(__HIPCC_RTC__)
#define MGX_SHFL_XOR(v, o) __shfl_xor((v), (o), 32)
#else
#define MGX_SHFL_XOR(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
#endif

static __device__ __forceinline__ float mgx_gemv_f(float v) { return v; }
static __device__ __forceinline__ float mgx_gemv_f(__half v) { return __half2float(v); }

// acc[m] += the VEC products of weight chunk wv with chunk j of x row m (e ascending)
static __device__ __forceinline__ void mgx_gemv_chunk(float* acc, const LT wv, const T* xr, long long xstride, int j)
{
    const T* we = reinterpret_cast<const T*>(&wv);
#pragma unroll
    for (int m = 0; m < M; ++m) {
        const LT xv = reinterpret_cast<const LT*>(xr + m * xstride)[j];
        const T* xe = reinterpret_cast<const T*>(&xv);
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[m] += mgx_gemv_f(we[e]) * mgx_gemv_f(xe[e]);
    }
}

extern "C" __global__ void __launch_bounds__(NT) mgx_gemv(const T* x, const T* w, const T* bias, T* y,
                                                          long long N, long long sx, long long sw, long long sy)
{
    constexpr int CH = K / VEC;                 // loads per row
    constexpr int COLS = NT / TPC;              // columns per block
    constexpr int ITERS = (CH + TPC - 1) / TPC; // loads per thread and row
    constexpr int PF = ITERS < PFMAX ? ITERS : PFMAX; // of them loaded before the x copy
    const int tid = threadIdx.x;
    const int c = tid / TPC;
    const int t = tid - c * TPC;
    const long long n = (long long)blockIdx.x * COLS + c;
    const LT* wr = reinterpret_cast<const LT*>(w + (n < N ? n : 0) * sw);
    LT wp[PF];
    if (n < N) {
#pragma unroll
        for (int i = 0; i < PF; ++i) {
            const int j = t + i * TPC;
            if (j < CH) wp[i] = wr[j];
        }
    }
    MGX_GRID_DEPENDENCY(); // x, bias and y are read / written only after this point
#if XS
    __shared__ __align__(16) T xs[M * K];
    for (int i = tid; i < M * CH; i += NT) {
        const int m = i / CH;
        const int j = i - m * CH;
        reinterpret_cast<LT*>(xs)[i] = reinterpret_cast<const LT*>(x + m * sx)[j];
    }
    __syncthreads();
    const T* xr = xs;
    const long long xstride = K;
#else
    const T* xr = x;
    const long long xstride = sx;
#endif
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.0f;
    if (n < N) {
#pragma unroll
        for (int i = 0; i < PF; ++i) {
            const int j = t + i * TPC;
            if (j < CH) mgx_gemv_chunk(acc, wp[i], xr, xstride, j);
        }
#pragma unroll 8
        for (int i = PF; i < ITERS; ++i) {
            const int j = t + i * TPC;
            if (j < CH) mgx_gemv_chunk(acc, wr[j], xr, xstride, j);
        }
    }
    constexpr int LANES = TPC < 32 ? TPC : 32; // a column's lanes in one 32-thread group
#pragma unroll
    for (int m = 0; m < M; ++m)
        for (int o = LANES / 2; o > 0; o >>= 1) acc[m] += MGX_SHFL_XOR(acc[m], o);
#if TPC > 32
    constexpr int GPC = TPC / 32; // 32-thread groups per column
    __shared__ float red[NT / 32][M];
    if ((tid & 31) == 0)
        for (int m = 0; m < M; ++m) red[tid >> 5][m] = acc[m];
    __syncthreads();
    if (t == 0)
        for (int m = 0; m < M; ++m) {
            float s = 0.0f;
            for (int g = 0; g < GPC; ++g) s += red[c * GPC + g][m];
            acc[m] = s;
        }
#endif
    if (t == 0 && n < N) {
#if HAS_BIAS
        const float b = mgx_gemv_f(bias[n]);
#else
        const float b = 0.0f;
#endif
        for (int m = 0; m < M; ++m) y[m * sy + n] = TO_T(acc[m] + b);
    }
}
