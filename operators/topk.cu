// TopK over the lines of a standard-layout tensor viewed as [outer, n, inner]: line l (of outer * inner)
// starts at (l / inner) * n * inner + l % inner and steps by inner; its k results go to the same place of
// [outer, k, inner] outputs.  Compiled once per element type by operators/topk_gpu.py, which prepends
//   typedef <element type> T;
//   #define MGX_TOPK_KIND <0 signed integer, 1 unsigned integer, 2 float / half, 3 double>
// Nothing here allocates: the kernels can be captured.
//
// Order (onnxruntime's CPU kernel from 1.32, and the ref target's topk_order): each element becomes an
// unsigned 64-bit key that orders as its value, with -0.0 equal to 0.0 and every NaN above +inf; for
// largest = 1 the key is inverted.  A line is then sorted ascending by (key, index) with a bitonic network
// over p (a power of two >= n) slots, the slots past n holding (all ones, index >= n) so they sort last.
// So ties keep the lower index first, NaNs come first for largest = 1 and last for largest = 0.
//
// One block per line (a block-stride loop over the lines).  The p keys (8 bytes) and indices (4 bytes)
// live in dynamic shared memory (keys == 0) or, for long lines, in the line's slice of global
// workspaces keys / idx of [lines, p] (the same network, each stage ending in __syncthreads()).

#ifndef MGX_TOPK_KIND  // built alone (the CMake kernel check): float32
typedef float T;
#define MGX_TOPK_KIND 2
#endif

#ifdef MGX_HOST_EMULATION
alignas(8) static unsigned char mgx_topk_smem[49152];
#else
extern __shared__ unsigned long long mgx_topk_smem[];
#endif

typedef unsigned long long mgx_u64;

__device__ __forceinline__ mgx_u64 mgx_topk_key(T v) {
#if MGX_TOPK_KIND == 0
    return (mgx_u64)(long long)v ^ 0x8000000000000000ULL;
#elif MGX_TOPK_KIND == 1
    return (mgx_u64)v;
#elif MGX_TOPK_KIND == 2
    float f = (float)v;  // float16 widens exactly, keeping the order
    if (f != f) return ~0ULL;
    unsigned int u = (f == 0.0f) ? 0u : __float_as_uint(f);  // -0.0 -> +0.0
    return (mgx_u64)((u & 0x80000000u) ? ~u : (u | 0x80000000u));
#else
    double d = (double)v;
    if (d != d) return ~0ULL;
    mgx_u64 u = (d == 0.0) ? 0ULL : (mgx_u64)__double_as_longlong(d);
    return (u & 0x8000000000000000ULL) ? ~u : (u | 0x8000000000000000ULL);
#endif
}

// (ka, ia) after (kb, ib) in ascending (key, index) order
__device__ __forceinline__ bool mgx_topk_after(mgx_u64 ka, unsigned int ia, mgx_u64 kb, unsigned int ib) {
    return ka > kb || (ka == kb && ia > ib);
}

// x: [outer, n, inner]; vals: [outer, k, inner] (T); inds: [outer, k, inner] (int64); p: a power of two >= n
// (and >= 2); keys / idx: null (shared memory of p * 12 bytes) or global workspaces of lines * p each.
extern "C" __global__ void mgx_topk(const T* x, T* vals, long long* inds, long long lines, long long n,
                                    long long inner, long long k, long long p, int largest, mgx_u64* keys,
                                    unsigned int* idx) {
    mgx_u64 flip = largest ? ~0ULL : 0ULL;
    for (long long line = blockIdx.x; line < lines; line += gridDim.x) {
        mgx_u64* sk;
        unsigned int* si;
        if (keys) {
            sk = keys + line * p;
            si = idx + line * p;
        } else {
            sk = (mgx_u64*)mgx_topk_smem;
            si = (unsigned int*)(sk + p);
        }
        long long o = line / inner, in = line % inner;
        const T* src = x + o * n * inner + in;
        for (long long i = threadIdx.x; i < p; i += blockDim.x) {
            sk[i] = i < n ? (mgx_topk_key(src[i * inner]) ^ flip) : ~0ULL;
            si[i] = (unsigned int)i;
        }
        for (long long size = 2; size <= p; size <<= 1) {
            for (long long stride = size >> 1; stride > 0; stride >>= 1) {
                __syncthreads();
                for (long long t = threadIdx.x; t < (p >> 1); t += blockDim.x) {
                    long long a = 2 * t - (t & (stride - 1)), b = a + stride;
                    bool up = (a & size) == 0;
                    mgx_u64 ka = sk[a], kb = sk[b];
                    unsigned int ia = si[a], ib = si[b];
                    if (mgx_topk_after(ka, ia, kb, ib) == up) {
                        sk[a] = kb;
                        sk[b] = ka;
                        si[a] = ib;
                        si[b] = ia;
                    }
                }
            }
        }
        __syncthreads();
        long long dst = o * k * inner + in;
        for (long long j = threadIdx.x; j < k; j += blockDim.x) {
            long long i = si[j];
            vals[dst + j * inner] = src[i * inner];
            inds[dst + j * inner] = i;
        }
        __syncthreads();  // the next line reuses the shared slots
    }
}
