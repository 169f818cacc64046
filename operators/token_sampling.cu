// The next token of a decode step on the device: mgx_graph/sampling.py's rule (repetition penalty,
// temperature, top-k, top-p, min-p, a Philox4x32-10 draw) without a sort, one row of logits per
// blockIdx.y.  Compiled once per logits type by operators/token_sampling_gpu.py, which prepends
//   typedef <logits type> T;
// Four kernels, queued in this order (nothing here allocates: every buffer is the caller's, made once):
//   ts_prepare  the penalized, temperature-scaled row s (float32) and its max; greedy: the id itself;
//   ts_levels   counts and e-mass of s in 0.25-nat bins below the max: the smallest band of bins that
//               holds every token top-k / top-p / min-p can keep (the candidates); with top-k and top-p
//               both on, every token top-k keeps (top-p's total Z is their e-mass, summed in ts_select);
//   ts_compact  the candidates of each block, in vocabulary order, into the block's segment;
//   ts_select   one block per row: the exact thresholds over the candidates, the draw, the id written
//               to ids / page-locked host memory / the seen mask, and the next slot.
// The multi-block kernels merge their blocks' results in the last block of each row to finish
// (a counter per row, set back to 0 by that block).
#ifdef MGX_KERNEL_CHECK  // CMake's check_kernels compiles this file alone: the type the Python side prepends
#if defined(__HIPCC__)
#include <hip/hip_fp16.h>
#else
#include <cuda_fp16.h>
#endif
typedef float T;
#endif

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(__HIPCC_RTC__)  // groups of 32 lanes
#define TS_SHFL_DOWN(v, o) __shfl_down((v), (o), 32)
#define TS_SHFL_UP(v, o) __shfl_up((v), (o), 32)
#else
#define TS_SHFL_DOWN(v, o) __shfl_down_sync(0xffffffffu, (v), (o))
#define TS_SHFL_UP(v, o) __shfl_up_sync(0xffffffffu, (v), (o))
#endif

#define TS_INF __int_as_float(0x7f800000)  // NVRTC has no INFINITY
#define TS_BLOCK 256     // threads of the multi-block kernels
#define TS_CHUNK 2048    // values of a row per block of the multi-block kernels
#define TS_BINS 65       // 64 bins of 0.25 nat below the row max, then one for everything further down
#define TS_SELECT 1024   // threads of ts_select
#define TS_FAST 1024     // candidates ts_select keeps in shared memory (more: global memory, bisection)
#define TS_MAX_BLOCKS 512  // blocks per row at most (a vocabulary of up to 2**20)

__device__ __forceinline__ int ts_bin(float s, float m) {
    const float d = m - s;
    return d < 16.0f ? (int)(d * 4.0f) : TS_BINS - 1;  // -inf and NaN: the last bin
}

__device__ __forceinline__ unsigned int ts_key(float v) {  // order-preserving map of a float to uint32
    const unsigned int u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// ---- block-wide helpers (blockDim.x a multiple of 32, at most 1024) --------------------------------
__device__ float ts_sum(float v, float* red) {  // every thread gets the block's sum, in a fixed order
    for (int o = 16; o; o >>= 1) v += TS_SHFL_DOWN(v, o);
    const int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[w] = v;
    __syncthreads();
    if (w == 0) {
        v = threadIdx.x < nw ? red[threadIdx.x] : 0.0f;
        for (int o = 16; o; o >>= 1) v += TS_SHFL_DOWN(v, o);
        if (threadIdx.x == 0) red[32] = v;
    }
    __syncthreads();
    return red[32];
}

__device__ unsigned int ts_count(unsigned int v, unsigned int* red) {
    for (int o = 16; o; o >>= 1) v += TS_SHFL_DOWN(v, o);
    const int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[w] = v;
    __syncthreads();
    if (w == 0) {
        v = threadIdx.x < nw ? red[threadIdx.x] : 0u;
        for (int o = 16; o; o >>= 1) v += TS_SHFL_DOWN(v, o);
        if (threadIdx.x == 0) red[32] = v;
    }
    __syncthreads();
    return red[32];
}

// Inclusive scan of v over the block in thread order; *total gets the block's sum.
__device__ float ts_scan(float v, float* red, float* total) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        const float n = TS_SHFL_UP(v, o);
        if (lane >= o) v += n;
    }
    __syncthreads();
    if (lane == 31) red[w] = v;
    __syncthreads();
    if (w == 0) {
        float x = lane < nw ? red[lane] : 0.0f;
        for (int o = 1; o < 32; o <<= 1) {
            const float n = TS_SHFL_UP(x, o);
            if (lane >= o) x += n;
        }
        if (lane < nw) red[lane] = x;  // inclusive prefix of the warps' sums
    }
    __syncthreads();
    if (w) v += red[w - 1];
    *total = red[nw - 1];
    return v;
}

// The last block of a row to finish: true in every thread of that block only.
__device__ bool ts_last_block(unsigned int* count, bool* flag) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();  // this block's results are visible before the count says so (release)
        const bool mine = atomicAdd(count, 1u) == gridDim.x - 1;
        if (mine) __threadfence();  // the other blocks' results are read after their counts (acquire)
        *flag = mine;
    }
    __syncthreads();
    return *flag;
}

// Philox4x32-10 (Salmon et al., SC'11; Random123's philox4x32_R with R = 10): word 0 of the output.
__device__ unsigned int ts_philox(unsigned int c0, unsigned int c1, unsigned int c2, unsigned int c3,
                                  unsigned int k0, unsigned int k1) {
    for (int r = 0; r < 10; ++r) {
        if (r) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    return c0;
}

// The chosen id of a row: into ids, the page-locked host buffer, the seen mask; the next slot into pos.
__device__ void ts_emit(long long row, long long tok, long long v, long long* ids, long long* host,
                        unsigned char* seen, long long* pos, long long next) {
    ids[row] = tok;
    if (host) host[row] = tok;
    if (seen) seen[row * v + tok] = 1;
    if (pos && row == 0) pos[0] = next;
}

// ---- ts_prepare: grid (blocks, rows) ----------------------------------------------------------------
extern "C" __global__ void ts_prepare(const T* x, long long v, const unsigned char* seen, float penalty,
                                      float temperature, float* s, float* part_m, long long* part_i,
                                      float* rowm, unsigned int* count, int greedy, long long* ids,
                                      long long* host, unsigned char* seen_w, long long* pos, long long next) {
    __shared__ float sm[TS_BLOCK];
    __shared__ long long si[TS_BLOCK];
    __shared__ bool last;
    const long long row = blockIdx.y, lo = (long long)blockIdx.x * TS_CHUNK;
    const long long hi = lo + TS_CHUNK < v ? lo + TS_CHUNK : v;
    float best = -TS_INF;
    long long bi = -1;
    for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float a = (float)x[row * v + i];
        if (seen && seen[row * v + i]) a = a < 0.0f ? a * penalty : a / penalty;
        if (!greedy) a = a / temperature;
        s[row * v + i] = a;
        if (bi < 0 || a > best) {
            best = a;
            bi = i;
        }
    }
    sm[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int o = blockDim.x >> 1; o; o >>= 1) {  // the first index of the largest value
        if (threadIdx.x < o) {
            const float b = sm[threadIdx.x + o];
            const long long j = si[threadIdx.x + o];
            if (j >= 0 && (si[threadIdx.x] < 0 || b > sm[threadIdx.x] || (b == sm[threadIdx.x] && j < si[threadIdx.x]))) {
                sm[threadIdx.x] = b;
                si[threadIdx.x] = j;
            }
        }
        __syncthreads();
    }
    const long long slot = row * gridDim.x + blockIdx.x;
    if (threadIdx.x == 0) {
        part_m[slot] = sm[0];
        part_i[slot] = si[0];
    }
    if (!ts_last_block(count + row, &last)) return;
    if (threadIdx.x == 0) {
        float m = ((volatile float*)part_m)[row * gridDim.x];
        long long mi = ((volatile long long*)part_i)[row * gridDim.x];
        for (unsigned int b = 1; b < gridDim.x; ++b) {
            const float c = ((volatile float*)part_m)[row * gridDim.x + b];
            if (c > m) {
                m = c;
                mi = ((volatile long long*)part_i)[row * gridDim.x + b];
            }
        }
        rowm[row] = m;
        count[row] = 0u;
        if (greedy) ts_emit(row, mi, v, ids, host, seen_w, pos, next);
    }
}

// ---- ts_levels: grid (blocks, rows); hist_c / hist_m zero on entry and left zero ---------------------
extern "C" __global__ void ts_levels(const float* s, long long v, const float* rowm, unsigned int* hist_c,
                                     unsigned long long* hist_m, unsigned int* count, long long top_k,
                                     float top_p, float min_p, int* cut, float* zrow, unsigned int* ncand) {
    __shared__ unsigned int hc[TS_BINS];
    __shared__ unsigned long long hm[TS_BINS];
    __shared__ bool last;
    const long long row = blockIdx.y, lo = (long long)blockIdx.x * TS_CHUNK;
    const long long hi = lo + TS_CHUNK < v ? lo + TS_CHUNK : v;
    const float m = rowm[row];
    for (int j = threadIdx.x; j < TS_BINS; j += blockDim.x) {
        hc[j] = 0u;
        hm[j] = 0ull;
    }
    __syncthreads();
    for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float a = s[row * v + i];
        const int b = ts_bin(a, m);
        atomicAdd(&hc[b], 1u);
        const float e = expf(a - m);  // fixed point (2**40): integer sums, the same in any order
        if (e > 0.0f) atomicAdd(&hm[b], (unsigned long long)((double)e * 1099511627776.0));
    }
    __syncthreads();
    for (int j = threadIdx.x; j < TS_BINS; j += blockDim.x) {
        if (hc[j]) atomicAdd(&hist_c[row * TS_BINS + j], hc[j]);
        if (hm[j]) atomicAdd(&hist_m[row * TS_BINS + j], hm[j]);
    }
    if (!ts_last_block(count + row, &last)) return;
    if (threadIdx.x == 0) {
        volatile unsigned int* c = hist_c + row * TS_BINS;
        volatile unsigned long long* h = hist_m + row * TS_BINS;
        unsigned long long total = 0;
        for (int j = 0; j < TS_BINS; ++j) total += h[j];
        const double z = (double)total;
        int jk = TS_BINS - 1, jp = TS_BINS - 1, jc = TS_BINS - 1;
        unsigned long long cm = 0;
        unsigned int cc = 0;
        const bool use_k = top_k > 0 && top_k < v, use_p = top_p < 1.0f;
        bool found_k = !use_k, found_p = !use_p;
        for (int j = 0; j < TS_BINS; ++j) {
            cc += c[j];
            cm += h[j];
            if (!found_k && cc >= top_k) {
                found_k = true;
                jk = j;
            }  // the mass a kept token needs above it is < p * Z: with a margin for rounding
            if (!found_p && (double)cm >= (double)top_p * z * (1.0 + 1e-5) + 2.0 * v) {
                found_p = true;
                jp = j;
            }
        }
        if (use_k && use_p) {
            jc = jk;  // top-p's Z is the e-mass of every token top-k keeps: all of them are candidates
        } else {
            jc = jk < jp ? jk : jp;
            if (min_p > 0.0f) {
                const float d = -logf(min_p) + 0.01f;
                if (d < 16.0f) jc = (int)(d * 4.0f) < jc ? (int)(d * 4.0f) : jc;
            }
        }
        unsigned int n = 0;
        for (int j = 0; j <= jc; ++j) n += c[j];
        cut[row] = jc;
        zrow[row] = (float)(z * (1.0 / 1099511627776.0));
        ncand[row] = n;
        count[row] = 0u;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < TS_BINS; j += blockDim.x) {
        hist_c[row * TS_BINS + j] = 0u;
        hist_m[row * TS_BINS + j] = 0ull;
    }
}

// ---- ts_compact: grid (blocks, rows); block b's candidates go to cs / ci [row, b * TS_CHUNK ...] -------
extern "C" __global__ void ts_compact(const float* s, long long v, const float* rowm, const int* cut, float* cs,
                                      int* ci, unsigned int* cn) {
    __shared__ float red[33];
    const long long row = blockIdx.y, lo = (long long)blockIdx.x * TS_CHUNK;
    const long long hi = lo + TS_CHUNK < v ? lo + TS_CHUNK : v;
    const float m = rowm[row];
    const int jc = cut[row];
    const long long seg = row * (long long)gridDim.x * TS_CHUNK + lo;
    unsigned int at = 0;
    float n;
    for (long long base = lo; base < hi; base += blockDim.x) {  // ranks by a scan of 0 / 1 (exact in float)
        const long long i = base + threadIdx.x;
        const float a = i < hi ? s[row * v + i] : -TS_INF;
        const bool take = i < hi && ts_bin(a, m) <= jc;
        const unsigned int r = at + (unsigned int)ts_scan(take ? 1.0f : 0.0f, red, &n) - (take ? 1u : 0u);
        if (take) {
            cs[seg + r] = a;
            ci[seg + r] = (int)i;
        }
        at += (unsigned int)n;
    }
    if (threadIdx.x == 0) cn[row * gridDim.x + blockIdx.x] = at;
}

// ---- ts_select: grid (rows), TS_SELECT threads ---------------------------------------------------------
// Candidates: n values a (and their ids) in vocabulary order, every one that the rule can keep among them.
struct TsRow {
    float m, z, top_p, min_p;
    long long top_k;
};

// At most TS_FAST candidates, in shared memory: each is ranked against all of them (the count and e-mass
// strictly above it, summed in candidate order); w[t] gets e where the rule keeps it, else 0.
__device__ void ts_weigh_fast(const float* a, float* e, float* w, int n, TsRow r, float* red) {
    for (int t = threadIdx.x; t < n; t += blockDim.x) e[t] = expf(a[t] - r.m);
    __syncthreads();
    float zpart = 0.0f;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        unsigned int gt = 0;
        float above = 0.0f;
        const float mine = a[t];
        for (int j = 0; j < n; ++j) {
            if (a[j] > mine) {
                ++gt;
                above += e[j];
            }
        }
        const bool in_k = r.top_k <= 0 || gt < (unsigned long long)r.top_k;
        w[t] = in_k ? above : -1.0f;  // the mass above, or -1: dropped by top-k
        if (in_k) zpart += e[t];
    }
    const float z = r.top_k > 0 ? ts_sum(zpart, red) : r.z;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        const float above = w[t];
        w[t] = above >= 0.0f && (r.top_p >= 1.0f || above < r.top_p * z) && e[t] >= r.min_p ? e[t] : 0.0f;
    }
    __syncthreads();
}

// More candidates, in global memory: the top-k and top-p thresholds by bisection over the values' keys;
// a is overwritten with the weights w.
__device__ void ts_weigh_bisect(float* a, int n, TsRow r, float* red, unsigned int* ured) {
    unsigned long long lo = 0, hi = 0xFFFFFFFFull;
    if (r.top_k > 0) {  // the largest key with at least k values at or above it: the k-th largest value
        while (lo < hi) {
            const unsigned long long mid = lo + (hi - lo + 1) / 2;
            unsigned int c = 0;
            for (int i = threadIdx.x; i < n; i += blockDim.x) c += ts_key(a[i]) >= mid;
            if (ts_count(c, ured) >= (unsigned long long)r.top_k) lo = mid;
            else hi = mid - 1;
        }
    }
    const unsigned int tk = (unsigned int)lo;
    float z = r.z;
    if (r.top_k > 0) {
        float part = 0.0f;
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            if (ts_key(a[i]) >= tk) part += expf(a[i] - r.m);
        z = ts_sum(part, red);
    }
    hi = 0xFFFFFFFFull;
    if (r.top_p < 1.0f) {  // the smallest key whose kept mass strictly above is < p * z
        while (lo < hi) {
            const unsigned long long mid = lo + (hi - lo) / 2;
            float part = 0.0f;
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const unsigned int k = ts_key(a[i]);
                if (k > mid && k >= tk) part += expf(a[i] - r.m);
            }
            if (ts_sum(part, red) < r.top_p * z) hi = mid;
            else lo = mid + 1;
        }
    }
    const unsigned int t = (unsigned int)lo;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = expf(a[i] - r.m);
        a[i] = ts_key(a[i]) >= t && e >= r.min_p ? e : 0.0f;
    }
    __syncthreads();
}

// The first candidate whose cumulative weight exceeds target (the last weighted one when none does).
__device__ int ts_draw(const float* w, int n, float target, float* red, int* pick) {
    float run = 0.0f, tile;
    if (threadIdx.x == 0) {
        pick[0] = -1;
        pick[1] = -1;
    }
    for (int base = 0; base < n; base += blockDim.x) {
        const int i = base + threadIdx.x;
        const float wi = i < n ? w[i] : 0.0f;
        const float c = run + ts_scan(wi, red, &tile);
        if (i < n && wi > 0.0f) {
            atomicMax(&pick[1], i);
            if (c > target) atomicMin((unsigned int*)&pick[0], (unsigned int)i);  // -1: the largest uint
        }
        __syncthreads();
        if (pick[0] >= 0) break;
        run += tile;
    }
    return pick[0] >= 0 ? pick[0] : pick[1];
}

extern "C" __global__ void ts_select(const float* cs, const int* ci, const unsigned int* cn, int blocks,
                                     const float* rowm, const float* zrow, const unsigned int* ncand,
                                     long long v, long long top_k, float top_p, float min_p,
                                     long long seed, long long step, float* gs,
                                     int* gi, long long* ids, long long* host, unsigned char* seen, long long* pos,
                                     long long next) {
    __shared__ float sa[TS_FAST], se[TS_FAST], sw[TS_FAST];
    __shared__ int sidx[TS_FAST];
    __shared__ unsigned int off[TS_MAX_BLOCKS];
    __shared__ float red[33];
    __shared__ unsigned int ured[33];
    __shared__ int pick[2];
    const long long row = blockIdx.x;
    const int n = (int)ncand[row];
    const bool fast = n <= TS_FAST;
    if (threadIdx.x == 0) {
        unsigned int acc = 0;
        for (int b = 0; b < blocks; ++b) {
            off[b] = acc;
            acc += cn[row * blocks + b];
        }
    }
    __syncthreads();
    float* a = fast ? sa : gs + row * v;
    int* idx = fast ? sidx : gi + row * v;
    for (int b = 0; b < blocks; ++b) {  // gather the blocks' segments, in vocabulary order
        const unsigned int c = cn[row * blocks + b];
        const long long seg = (row * blocks + b) * (long long)TS_CHUNK;
        for (unsigned int i = threadIdx.x; i < c; i += blockDim.x) {
            a[off[b] + i] = cs[seg + i];
            idx[off[b] + i] = ci[seg + i];
        }
    }
    __syncthreads();
    TsRow r{rowm[row], zrow[row], top_p, min_p, top_k > 0 && top_k < v ? top_k : 0};
    const float* w = a;
    if (fast) {
        ts_weigh_fast(a, se, sw, n, r, red);
        w = sw;
    } else {
        ts_weigh_bisect(a, n, r, red, ured);
    }
    float part = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) part += w[i];
    const float total = ts_sum(part, red);
    const unsigned long long key = (unsigned long long)seed, ctr = (unsigned long long)step;
    const unsigned int x0 = ts_philox((unsigned int)ctr, (unsigned int)(ctr >> 32), (unsigned int)row, 0u,
                                      (unsigned int)key, (unsigned int)(key >> 32));
    const float u = (float)(x0 >> 8) * 5.9604644775390625e-8f;  // 2**-24
    const int k = ts_draw(w, n, u * total, red, pick);
    if (threadIdx.x == 0) ts_emit(row, k >= 0 ? idx[k] : 0, v, ids, host, seen, pos, next);
}
