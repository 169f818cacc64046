// Kernels over the lines of a standard-layout tensor viewed as [outer, n, inner]: line l (of
// outer * inner) starts at (l / inner) * n * inner + l % inner and steps by inner.
// Compiled once per element type by operators/index_ops.py, which prepends
//   typedef <element type> T; typedef <accumulation type> ACC;
// (ACC is float for __half, T otherwise).  Nothing here allocates: the kernels can be captured.
#ifdef MGX_KERNEL_CHECK  // CMake's check_kernels compiles this file alone: the types the Python side prepends
#if defined(__HIPCC__)
#include <hip/hip_fp16.h>
#else
#include <cuda_fp16.h>
#endif
typedef __half T;
typedef float ACC;
#endif

#define MGX_BLOCK 256

__device__ __forceinline__ long long mgx_line_base(long long line, long long n, long long inner) {
    return (line / inner) * n * inner + line % inner;
}

// CumSum: one thread per line, sequential in the line's order (as onnxruntime's CPU kernel).
extern "C" __global__ void mgx_cumsum(const T* x, T* y, long long lines, long long n, long long inner,
                                      int exclusive, int reverse) {
    long long line = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (line >= lines) return;
    long long off = mgx_line_base(line, n, inner);
    ACC acc = (ACC)0;
    for (long long k = 0; k < n; ++k) {
        long long i = off + (reverse ? n - 1 - k : k) * inner;
        ACC v = (ACC)x[i];
        if (exclusive) {
            y[i] = (T)acc;
            acc += v;
        } else {
            acc += v;
            y[i] = (T)acc;
        }
    }
}

// CumProd: as CumSum with a product (an exclusive scan starts from 1).
extern "C" __global__ void mgx_cumprod(const T* x, T* y, long long lines, long long n, long long inner,
                                       int exclusive, int reverse) {
    long long line = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (line >= lines) return;
    long long off = mgx_line_base(line, n, inner);
    ACC acc = (ACC)1;
    for (long long k = 0; k < n; ++k) {
        long long i = off + (reverse ? n - 1 - k : k) * inner;
        ACC v = (ACC)x[i];
        if (exclusive) {
            y[i] = (T)acc;
            acc *= v;
        } else {
            acc *= v;
            y[i] = (T)acc;
        }
    }
}

// (value, index) b beats a: larger (or smaller for is_min) value, ties to the lower index (the
// higher one when last).  An index < 0 marks "no value yet".
__device__ __forceinline__ bool mgx_beats(ACC bv, long long bi, ACC av, long long ai, int is_min, int last) {
    if (bi < 0) return false;
    if (ai < 0) return true;
    if (is_min ? (bv < av) : (bv > av)) return true;
    if (bv == av) return last ? (bi > ai) : (bi < ai);
    return false;
}

// Block-wide: the best non-NaN (value, index) of one line, in shared memory slot 0.
__device__ long long mgx_line_best(const T* base, long long n, long long inner, int is_min, int last) {
    __shared__ ACC sv[MGX_BLOCK];
    __shared__ long long si[MGX_BLOCK];
    int t = threadIdx.x;
    ACC best = (ACC)0;
    long long bi = -1;
    for (long long i = t; i < n; i += blockDim.x) {
        ACC v = (ACC)base[i * inner];
        if (v != v) continue;  // NaN never wins
        if (mgx_beats(v, i, best, bi, is_min, last)) {
            best = v;
            bi = i;
        }
    }
    sv[t] = best;
    si[t] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s && mgx_beats(sv[t + s], si[t + s], sv[t], si[t], is_min, last)) {
            sv[t] = sv[t + s];
            si[t] = si[t + s];
        }
        __syncthreads();
    }
    long long r = si[0];
    __syncthreads();
    return r;
}

// ArgMax / ArgMin with onnxruntime's NaN rule: the scan starts from the first element and a NaN
// never compares, so a line starting with NaN gives 0 and NaNs elsewhere are skipped.
// blockDim.x == MGX_BLOCK, one block per line; y is [outer, inner] int64.
extern "C" __global__ void mgx_argext(const T* x, long long* y, long long n, long long inner, int is_min,
                                      int last) {
    long long line = blockIdx.x;
    const T* base = x + mgx_line_base(line, n, inner);
    long long r = mgx_line_best(base, n, inner, is_min, last);
    if (threadIdx.x == 0) {
        ACC first = (ACC)base[0];
        y[line] = (first != first || r < 0) ? 0 : r;
    }
}

// Hardmax: 1 at the first maximum of the line's non-NaN values, 0 elsewhere; all 0 for a line starting
// with NaN (onnxruntime: its maximum starts from the first element, and no element equals a NaN maximum).
extern "C" __global__ void mgx_hardmax(const T* x, T* y, long long n, long long inner) {
    long long line = blockIdx.x;
    long long off = mgx_line_base(line, n, inner);
    long long r = mgx_line_best(x + off, n, inner, 0, 0);
    const ACC lead = (ACC)x[off];
    if (lead != lead) r = -1;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        y[off + i * inner] = (i == r) ? (T)1.0f : (T)0.0f;
    }
}

// Compress: the positions of the true entries of cond[0:n] (one thread: cond is a short vector).
extern "C" __global__ void mgx_compress_index(const bool* cond, long long n, long long* idx) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    long long k = 0;
    for (long long i = 0; i < n; ++i) {
        if (cond[i]) idx[k++] = i;
    }
}

#define MGX_NO_INDEX 0x7fffffffffffffffLL  // no candidate yet

// numpy's argmax of a line: the first index of the largest value, or of the first NaN when there is one
// (NaN beats every number; between two candidates the lower index wins; index MGX_NO_INDEX is no candidate).
__device__ __forceinline__ bool mgx_first_max_beats(ACC v, long long i, ACC b, long long bi) {
    if (i == MGX_NO_INDEX) return false;
    if (bi == MGX_NO_INDEX) return true;
    const bool vn = v != v, bn = b != b;
    if (vn != bn) return vn;
    if (!vn && v != b) return v > b;
    return i < bi;
}

#define MGX_ROW_BLOCK 1024  // most threads per block of mgx_argmax_rows

// The first-max candidate (mgx_first_max_beats) of this thread over x[lo:hi]: 16-byte loads from x when
// `vec` (x 16-byte aligned, lo a multiple of the vector width), the elements after the last whole vector
// one by one; threads t, t + nt, ... take the vectors (or elements) in turn.
__device__ __forceinline__ void mgx_scan_first_max(const T* x, long long lo, long long hi, int vec, int t, int nt,
                                                   ACC& best, long long& bi) {
    long long done = lo;
#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__CUDACC_RTC__) || defined(__HIPCC_RTC__)
    constexpr int V = 16 / sizeof(T);
    if (vec && V > 1) {
        const long long c1 = hi / V;
#pragma unroll 4
        for (long long c = lo / V + t; c < c1; c += nt) {  // unrolled: several 16-byte loads in flight per thread
            const uint4 w = reinterpret_cast<const uint4*>(x)[c];
            const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
            for (int k = 0; k < V; ++k) {
                const ACC v = (ACC)e[k];
                if (mgx_first_max_beats(v, c * V + k, best, bi)) {
                    best = v;
                    bi = c * V + k;
                }
            }
        }
        done = c1 * V > lo ? c1 * V : lo;
    }
#endif
    for (long long i = done + t; i < hi; i += nt) {
        const ACC v = (ACC)x[i];
        if (mgx_first_max_beats(v, i, best, bi)) {
            best = v;
            bi = i;
        }
    }
}

// The block's first-max candidate from each thread's (best, bi), in sv[0] / si[0] (blockDim.x a power of two
// of at most the arrays' length); every thread returns after the merge.
__device__ __forceinline__ void mgx_block_first_max(ACC* sv, long long* si, int t, int nt, ACC best, long long bi) {
    sv[t] = best;
    si[t] = bi;
    __syncthreads();
    for (int s = nt / 2; s > 0; s >>= 1) {
        if (t < s && mgx_first_max_beats(sv[t + s], si[t + s], sv[t], si[t])) {
            sv[t] = sv[t + s];
            si[t] = si[t + s];
        }
        __syncthreads();
    }
}

// One block per row of a [rows, n] array with rows `stride` elements apart: y[row] = numpy.argmax(row).
// Each thread scans its elements (16-byte loads when `vec` and the row start is 16-byte aligned, on the
// device), then the block merges the threads' candidates in shared memory.  blockDim.x is a power of two
// of at most MGX_ROW_BLOCK threads.
extern "C" __global__ void mgx_argmax_rows(const T* x, long long* y, long long n, long long stride, int vec) {
    __shared__ ACC sv[MGX_ROW_BLOCK];
    __shared__ long long si[MGX_ROW_BLOCK];
    const int t = threadIdx.x, nt = blockDim.x;
    ACC best = (ACC)0;
    long long bi = MGX_NO_INDEX;
    mgx_scan_first_max(x + (long long)blockIdx.x * stride, 0, n, vec, t, nt, best, bi);
    mgx_block_first_max(sv, si, t, nt, best, bi);
    if (t == 0) y[blockIdx.x] = si[0];
}

// The greedy decode loop's step tail over one row x[0:n] of logits, in one launch of several blocks of
// MGX_BLOCK threads: block b scans x[b * chunk : (b + 1) * chunk] (16-byte loads when `vec`; chunk is then a
// multiple of the vector width) and writes its candidate to part_v[b] / part_i[b]; the block that finishes
// last (counted in *count, which it sets back to 0 for the next launch) merges the gridDim.x candidates and
// writes numpy.argmax(x) (the first largest value, or the first NaN) to ids[0] (the next step's input), to
// host[0] (page-locked host memory written through its device address: no copy follows) and, when pos is not
// null, next to pos[0] (the next step's slot).  The partial-result pattern is the CUDA samples'
// threadFenceReduction; gridDim.x <= 4 * MGX_BLOCK.
extern "C" __global__ void mgx_argmax_advance(const T* x, long long n, long long chunk, int vec, long long* ids,
                                              long long* host, long long* pos, long long next, ACC* part_v,
                                              long long* part_i, unsigned int* count) {
    __shared__ ACC sv[MGX_BLOCK];
    __shared__ long long si[MGX_BLOCK];
    __shared__ bool last;
    const int t = threadIdx.x, nt = blockDim.x;
    const long long lo = (long long)blockIdx.x * chunk;
    ACC best = (ACC)0;
    long long bi = MGX_NO_INDEX;
    mgx_scan_first_max(x, lo, lo + chunk < n ? lo + chunk : n, vec, t, nt, best, bi);
    mgx_block_first_max(sv, si, t, nt, best, bi);
    if (t == 0) {
        part_v[blockIdx.x] = sv[0];
        part_i[blockIdx.x] = si[0];
        __threadfence();  // the candidate is visible before the count says so (release)
        const bool mine = atomicAdd(count, 1u) == gridDim.x - 1;
        if (mine) __threadfence();  // the other blocks' candidates are read after their counts (acquire)
        last = mine;
    }
    __syncthreads();
    if (!last) return;
    best = (ACC)0;
    bi = MGX_NO_INDEX;
    for (unsigned int b = t; b < gridDim.x; b += nt) {
        const ACC v = ((volatile ACC*)part_v)[b];
        const long long i = ((volatile long long*)part_i)[b];
        if (mgx_first_max_beats(v, i, best, bi)) {
            best = v;
            bi = i;
        }
    }
    mgx_block_first_max(sv, si, t, nt, best, bi);
    if (t == 0) {
        ids[0] = si[0];
        host[0] = si[0];
        if (pos) pos[0] = next;
        *count = 0u;
    }
}
