// MatMulNBits (com.microsoft) on the gpu target: mgx_gemv_nbits, y [M, N] = x [M, K] @ dequantize(B)^T
// (+ bias) for a few rows M, the packed weight read once and dequantized in registers; and
// mgx_dequant_nbits, W [N, K] = dequantize(B) into a workspace, for the GEMM of many rows.
//
// B uint8 [N, KB, NB_BS * NB_BITS / 8]: row n is RB = KB * NB_BS * NB_BITS / 8 contiguous bytes holding
// the row's K values (padded to KB * NB_BS), 8 / NB_BITS values per byte, the first in the low bits;
// scales ST [N, KB]; zero points (NB_ZK): 0 none (2^(NB_BITS-1)), 1 packed uint8 [N, ceil(KB * NB_BITS /
// 8)] (packed like B), 2 float ZT [N, KB].  W[n, k] = (q[n, k] - z[n, g(k)]) * s[n, g(k)], g(k) = k / NB_BS
// (mgx_dequant_nbits with NB_GIDX: g_idx[k], clamped to [0, KB)).
//
// Configured by the defines that quantized_gpu.py puts before this file:
//   T, TO_T   activation / output type, float -> T      ST, ZT, BT  scale, float zero point, bias types
//   NB_BITS 2 / 4 / 8; NB_BS block size; NB_K; NB_KB blocks per row; NB_ZK zero point kind (above)
//   NB_KERNEL 1: mgx_gemv_nbits, 2: mgx_dequant_nbits (3: both, the standalone check)
//   mgx_gemv_nbits: NB_M rows (1 .. 8); NB_NT threads per block; NB_TPC threads per column group (a power
//     of two, 1 .. NB_NT); NB_NC columns per group; NB_LB bytes per weight load (16, 8 or 4: LT uint4,
//     uint2 or unsigned); NB_IT weight loads per thread and column per tile; NB_BIAS; NB_BCONST 1: B is a
//     constant, so the first tile of weights is loaded before the grid dependency wait.
//   mgx_dequant_nbits: NB_GIDX (g_idx int32 [K]).
//
// mgx_gemv_nbits: a group of NB_TPC threads owns NB_NC consecutive columns; thread t reads loads
// j = t, t + NB_TPC, ... of each column's row (NB_LB bytes each: a group of 32 threads reads 32 * NB_LB
// contiguous bytes), in tiles of NB_IT loads per thread.  Per tile the weights (and the tile's scales and
// zero points) go to registers first, then the tile's x values are staged in shared memory as float,
// laid out so that thread t reads the 16-byte pieces of its own load, piece after piece, without bank
// conflicts (a line per (row, piece) of TL + 1 pieces: the padding spreads the staging stores too).
// A value q becomes the float 2^23 + q with one byte permute (its byte below an exponent byte of 0x4B:
// no int-to-float conversion), and (q - z) = that - (2^23 + z) exactly for an integer z; the products
// with x are summed in float per scale block, and each block sum times its scale is added to the
// float accumulator of the row and column.  Groups reduce by xor shuffles (NB_TPC <= 32) and then
// through shared memory (NB_TPC > 32).  Values past K are staged as x = 0 and loads past the row are
// zeros, so they add nothing; every thread reaches every barrier and shuffle.

#ifndef MGX_NBITS_CONFIG  // compiled on its own (CMake's check_kernels): an int4 Llama-8B projection
#if defined(__HIPCC__)
#include <hip/hip_fp16.h>
#else
#include <cuda_fp16.h>
#endif
#define T __half
#define TO_T __float2half
#define ST __half
#define ZT __half
#define BT __half
#define LT uint4
#define NB_KERNEL 3
#define NB_BITS 4
#define NB_BS 32
#define NB_K 4096
#define NB_KB 128
#define NB_ZK 1
#define NB_M 1
#define NB_NT 256
#define NB_TPC 32
#define NB_NC 2
#define NB_LB 16
#define NB_IT 2
#define NB_BIAS 0
#define NB_BCONST 1
#define NB_GIDX 0
#endif

#ifndef MGX_GRID_DEPENDENCY  // defined by programmatic_launch.PRELUDE when the source is built for PDL
#define MGX_GRID_DEPENDENCY()
#endif

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(__HIPCC_RTC__)
#define MGX_NB_SHFL_XOR(v, o) __shfl_xor((v), (o), 32)
#else
#define MGX_NB_SHFL_XOR(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
#endif

#define MGX_NB_PER (8 / NB_BITS)                     // values per byte
#define MGX_NB_MASK ((1u << NB_BITS) - 1u)
#define MGX_NB_RB (NB_KB * NB_BS * NB_BITS / 8)       // bytes per row of B
#define MGX_NB_ZB ((NB_KB * NB_BITS + 7) / 8)         // bytes per row of packed zero points

static __device__ __forceinline__ float mgx_nb_f(float v) { return v; }
static __device__ __forceinline__ float mgx_nb_f(__half v) { return __half2float(v); }

// the zero point of block g of row n, as a float (a whole number unless NB_ZK is 2)
static __device__ __forceinline__ float mgx_nb_zero(const void* zp, long long n, int g)
{
#if NB_ZK == 1
    const unsigned zb = static_cast<const unsigned char*>(zp)[n * MGX_NB_ZB + g / MGX_NB_PER];
    return (float)((zb >> ((g % MGX_NB_PER) * NB_BITS)) & MGX_NB_MASK);
#elif NB_ZK == 2
    return mgx_nb_f(static_cast<const ZT*>(zp)[n * NB_KB + g]);
#else
    return (float)(1 << (NB_BITS - 1));
#endif
}

#if NB_KERNEL & 1
// the NB_PER planes of the 32-bit word w: plane s holds value s of each byte in the low bits of the byte
static __device__ __forceinline__ void mgx_nb_planes(unsigned w, unsigned (&pl)[MGX_NB_PER])
{
#pragma unroll
    for (int s = 0; s < MGX_NB_PER; ++s) pl[s] = (w >> (NB_BITS * s)) & (MGX_NB_MASK * 0x01010101u);
}

// value e (0 .. 32 / NB_BITS - 1) of a word split into planes, as the float 2^23 + q: its byte of plane
// e % NB_PER below the bytes 0x4B, 0x00, 0x00 (one byte permute, no int-to-float conversion)
static __device__ __forceinline__ float mgx_nb_biased(const unsigned (&pl)[MGX_NB_PER], int e)
{
    return __int_as_float((int)__byte_perm(pl[e % MGX_NB_PER], 0x4B000000u, 0x7440u | (unsigned)(e / MGX_NB_PER)));
}

static __device__ __forceinline__ float mgx_nb_lane(const float4& v, int e)
{
    return e == 0 ? v.x : (e == 1 ? v.y : (e == 2 ? v.z : v.w));
}

static __device__ __forceinline__ unsigned mgx_nb_word(const LT& v, int u)
{
    return reinterpret_cast<const unsigned*>(&v)[u];
}

// the weight loads of tile `tile` (zeros for columns past N and loads past the row)
static __device__ __forceinline__ void mgx_nb_load(LT (&wv)[NB_IT][NB_NC], const unsigned char* b, long long n0,
                                                   long long N, int tile, int t)
{
    constexpr int CH = MGX_NB_RB / NB_LB;
#pragma unroll
    for (int i = 0; i < NB_IT; ++i) {
        const int j = (tile * NB_IT + i) * NB_TPC + t;
#pragma unroll
        for (int c = 0; c < NB_NC; ++c) {
            const long long n = n0 + c;
            LT v = {};
            if (n < N && j < CH) v = reinterpret_cast<const LT*>(b + n * MGX_NB_RB)[j];
            wv[i][c] = v;
        }
    }
}

// the scales and zero points of the loads of tile `tile`: SPL blocks per load
template <int SPL>
static __device__ __forceinline__ void mgx_nb_scales(float (&sv)[NB_IT][NB_NC][SPL], float (&zv)[NB_IT][NB_NC][SPL],
                                                     const ST* scales, const void* zp, long long n0, long long N,
                                                     int tile, int t)
{
    constexpr int CH = MGX_NB_RB / NB_LB;
    constexpr int VPL = NB_LB * 8 / NB_BITS;
    constexpr int SUB = VPL / SPL;
#pragma unroll
    for (int i = 0; i < NB_IT; ++i) {
        const int j = (tile * NB_IT + i) * NB_TPC + t;
#pragma unroll
        for (int c = 0; c < NB_NC; ++c) {
            const long long n = n0 + c;
#pragma unroll
            for (int u = 0; u < SPL; ++u) {
                const int g = (j * VPL + u * SUB) / NB_BS;
                const bool ok = n < N && j < CH;
                sv[i][c][u] = ok ? mgx_nb_f(scales[n * NB_KB + g]) : 0.0f;
                zv[i][c][u] = ok ? mgx_nb_zero(zp, n, g) : 0.0f;
            }
        }
    }
}

// x rows [tile * KT, (tile + 1) * KT) into xs as float (0 past K): value kk of row m, of load jl = kk / VPL,
// goes to piece (kk % VPL) / 4 of that load, in line (m, piece) of XR float4s
template <int KT, int VPL, int XR>
static __device__ __forceinline__ void mgx_nb_stage(float4* xs, const T* x, int tile)
{
    constexpr int P = VPL / 4;
    float* xf = reinterpret_cast<float*>(xs);
    for (int idx = threadIdx.x; idx < NB_M * KT; idx += NB_NT) {
        const int m = idx / KT;
        const int kk = idx - m * KT;
        const long long k = (long long)tile * KT + kk;
        const int jl = kk / VPL;
        const int w = kk - jl * VPL;
        xf[((m * P + w / 4) * XR + jl) * 4 + (w & 3)] = k < NB_K ? mgx_nb_f(x[m * (long long)NB_K + k]) : 0.0f;
    }
}

// acc[m][c] += the tile's contribution of load i of this thread (jl: the load's index within the tile),
// word by word (each split into its planes once), x piece by piece, one sum per scale block
template <int SPL, int XR>
static __device__ __forceinline__ void mgx_nb_dot(float (&acc)[NB_M][NB_NC], const LT (&wv)[NB_IT][NB_NC],
                                                  const float (&sv)[NB_IT][NB_NC][SPL],
                                                  const float (&zv)[NB_IT][NB_NC][SPL], const float4* xs, int i, int jl)
{
    constexpr int VPL = NB_LB * 8 / NB_BITS;
    constexpr int VPW = 32 / NB_BITS;  // values per word (4 .. 16)
    constexpr int SUB = VPL / SPL;     // values per scale block within the load (a multiple of VPW)
    constexpr int P = VPL / 4;
#pragma unroll
    for (int u = 0; u < SPL; ++u) {
        float part[NB_M][NB_NC];
#pragma unroll
        for (int m = 0; m < NB_M; ++m)
#pragma unroll
            for (int c = 0; c < NB_NC; ++c) part[m][c] = 0.0f;
#pragma unroll
        for (int wq = 0; wq < SUB / VPW; ++wq) {
            const int v0 = u * SUB + wq * VPW;  // the word's first value within the load
            unsigned pl[NB_NC][MGX_NB_PER];
#pragma unroll
            for (int c = 0; c < NB_NC; ++c) mgx_nb_planes(mgx_nb_word(wv[i][c], v0 / VPW), pl[c]);
#pragma unroll
            for (int pc = 0; pc < VPW / 4; ++pc) {
                const int p = v0 / 4 + pc;
                float4 xv[NB_M];
#pragma unroll
                for (int m = 0; m < NB_M; ++m) xv[m] = xs[(m * P + p) * XR + jl];
#pragma unroll
                for (int c = 0; c < NB_NC; ++c) {
                    const float cz = NB_ZK == 2 ? 8388608.0f : 8388608.0f + zv[i][c][u];
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        float q = mgx_nb_biased(pl[c], pc * 4 + e) - cz;  // q - z, exact for a whole z
                        if (NB_ZK == 2) q -= zv[i][c][u];
#pragma unroll
                        for (int m = 0; m < NB_M; ++m) part[m][c] = fmaf(q, mgx_nb_lane(xv[m], e), part[m][c]);
                    }
                }
            }
        }
#pragma unroll
        for (int m = 0; m < NB_M; ++m)
#pragma unroll
            for (int c = 0; c < NB_NC; ++c) acc[m][c] = fmaf(part[m][c], sv[i][c][u], acc[m][c]);
    }
}

extern "C" __global__ void __launch_bounds__(NB_NT) mgx_gemv_nbits(const T* x, const unsigned char* b, const ST* scales,
                                                                   const void* zp, const BT* bias, T* y, long long N)
{
    constexpr int VPL = NB_LB * 8 / NB_BITS;           // values per load
    constexpr int CH = MGX_NB_RB / NB_LB;              // loads per row
    constexpr int TL = NB_IT * NB_TPC;                 // loads per tile and column
    constexpr int TILES = (CH + TL - 1) / TL;
    constexpr int KT = TL * VPL;                       // values per tile
    constexpr int P = VPL / 4;                         // 16-byte pieces of x per load
    constexpr int XR = TL + 1;                         // float4s per (row, piece) line of the staged tile
    constexpr int SPL = VPL > NB_BS ? VPL / NB_BS : 1; // scale blocks per load
    constexpr int GROUPS = NB_NT / NB_TPC;
    const int tid = threadIdx.x;
    const int grp = tid / NB_TPC;
    const int t = tid - grp * NB_TPC;
    const long long n0 = ((long long)blockIdx.x * GROUPS + grp) * NB_NC;
    __shared__ float4 xs[NB_M * P * XR];
    LT wv[NB_IT][NB_NC];
    float sv[NB_IT][NB_NC][SPL];
    float zv[NB_IT][NB_NC][SPL];
    float acc[NB_M][NB_NC];
#pragma unroll
    for (int m = 0; m < NB_M; ++m)
#pragma unroll
        for (int c = 0; c < NB_NC; ++c) acc[m][c] = 0.0f;
    if (NB_BCONST) mgx_nb_load(wv, b, n0, N, 0, t);  // a constant: read before the kernel ahead finishes
    MGX_GRID_DEPENDENCY(); // x, scales, zero points, bias and y only after this point
    for (int tile = 0; tile < TILES; ++tile) {
        if (tile > 0 || !NB_BCONST) mgx_nb_load(wv, b, n0, N, tile, t);
        mgx_nb_scales<SPL>(sv, zv, scales, zp, n0, N, tile, t);
        if (tile > 0) __syncthreads();  // every thread is done with the previous tile's x
        mgx_nb_stage<KT, VPL, XR>(xs, x, tile);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < NB_IT; ++i) mgx_nb_dot<SPL, XR>(acc, wv, sv, zv, xs, i, i * NB_TPC + t);
    }
    constexpr int LANES = NB_TPC < 32 ? NB_TPC : 32;  // a group's lanes in one 32-thread group
#pragma unroll
    for (int m = 0; m < NB_M; ++m)
#pragma unroll
        for (int c = 0; c < NB_NC; ++c)
            for (int o = LANES / 2; o > 0; o >>= 1) acc[m][c] += MGX_NB_SHFL_XOR(acc[m][c], o);
#if NB_TPC > 32
    constexpr int GPC = NB_TPC / 32;  // 32-thread groups per column group
    __shared__ float red[NB_NT / 32][NB_M * NB_NC];
    if ((tid & 31) == 0)
        for (int m = 0; m < NB_M; ++m)
            for (int c = 0; c < NB_NC; ++c) red[tid >> 5][m * NB_NC + c] = acc[m][c];
    __syncthreads();
    if (t == 0)
        for (int m = 0; m < NB_M; ++m)
            for (int c = 0; c < NB_NC; ++c) {
                float s = 0.0f;
                for (int g = 0; g < GPC; ++g) s += red[grp * GPC + g][m * NB_NC + c];
                acc[m][c] = s;
            }
#endif
    if (t == 0)
        for (int c = 0; c < NB_NC; ++c) {
            const long long n = n0 + c;
            if (n < N) {
#if NB_BIAS
                const float bv = mgx_nb_f(bias[n]);
#else
                const float bv = 0.0f;
#endif
                for (int m = 0; m < NB_M; ++m) y[m * N + n] = TO_T(acc[m][c] + bv);
            }
        }
}
#endif  // NB_KERNEL & 1

#if NB_KERNEL & 2
// W [N, K] (row stride K) = (q - z) * s, each thread a 32-bit word of B (32 / NB_BITS values), grid-stride
extern "C" __global__ void __launch_bounds__(256) mgx_dequant_nbits(const unsigned char* b, const ST* scales,
                                                                    const void* zp, const int* gidx, T* w, long long N)
{
    constexpr int VPW = 32 / NB_BITS;
    constexpr long long WPR = MGX_NB_RB / 4;  // 32-bit words per row of B
    const long long total = N * WPR;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long n = i / WPR;
        const int wj = (int)(i - n * WPR);
        const unsigned wd = reinterpret_cast<const unsigned*>(b + n * MGX_NB_RB)[wj];
#pragma unroll
        for (int e = 0; e < VPW; ++e) {
            const int k = wj * VPW + e;
            if (k < NB_K) {
#if NB_GIDX
                const int gk = gidx[k];
                const int g = gk < 0 ? 0 : (gk >= NB_KB ? NB_KB - 1 : gk);
#else
                const int g = k / NB_BS;
#endif
                const float q = (float)((wd >> (NB_BITS * e)) & MGX_NB_MASK);
                w[n * NB_K + k] = TO_T((q - mgx_nb_zero(zp, n, g)) * mgx_nb_f(scales[n * NB_KB + g]));
            }
        }
    }
}
#endif  // NB_KERNEL & 2
