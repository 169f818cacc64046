// One-kernel forms of the LLM contrib ops on the gpu target: rotary_embedding, kv_cache_update and
// skip_layer_norm (operators/llm_gpu.py builds and launches them).  T is the element type (float or
// __half), given by the including source; arithmetic runs in float.  Every loop is grid-stride (blocks
// over rows for the normalization), so the file also builds as host C++ for tests.

#ifdef MGX_KERNEL_CHECK  // CMake's check_kernels compiles this file alone: the types the Python side prepends
#if defined(__HIPCC__)
#include <hip/hip_fp16.h>
#else
#include <cuda_fp16.h>
#endif
typedef __half T;
#endif

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__CUDACC_RTC__) || defined(__HIPCC_RTC__)
#define MGX_SHARED __shared__
#define MGX_SYNC() __syncthreads()
__device__ __forceinline__ float mgx_ld(__half v) { return __half2float(v); }
__device__ __forceinline__ void mgx_st(__half* p, float v) { *p = __float2half(v); }
#else
#define MGX_SHARED static
#define MGX_SYNC()
#endif
__device__ __forceinline__ float mgx_ld(float v) { return v; }
__device__ __forceinline__ void mgx_st(float* p, float v) { *p = v; }

#define MGX_NT 256

// Channel h < R of one head's row xr (channel stride xh) rotated by the angle of table row `row`
// (column r at r * c_r): non-interleaved pairs (i, i + R/2), interleaved (2i, 2i + 1).
__device__ __forceinline__ float mgx_rotate(const T* xr, long long xh, long long h, long long R, const T* cosv,
                                            const T* sinv, long long row, long long c_r, int interleaved) {
    long long half = R / 2, r, lo, hi;
    if (interleaved) {
        r = h / 2; lo = 2 * r; hi = lo + 1;
    } else {
        r = h < half ? h : h - half; lo = r; hi = r + half;
    }
    float c = mgx_ld(cosv[row + r * c_r]), sn = mgx_ld(sinv[row + r * c_r]);
    float x1 = mgx_ld(xr[lo * xh]), x2 = mgx_ld(xr[hi * xh]);
    float a, bb;
    if (h == lo) {
        a = x1 * c; bb = x2 * sn; return a - bb;
    }
    a = x1 * sn; bb = x2 * c;
    return a + bb;
}

// y[b, s, n, h] = x rotated by the angles of position pos[b, s] (has_pos) or of token (b, s):
// cos / sin row  = pos * c_row (has_pos) or b * c_b + s * c_s; channels h >= R are copied.
#define MGX_ROTARY_PARAMS const T* x, const T* cosv, const T* sinv, const long long* pos, T* y, \
    long long B, long long S, long long N, long long H, long long R, long long xb, long long xs, long long xn, \
    long long xh, long long yb, long long ys, long long yn, long long yh, long long pb, long long ps, \
    long long c_row, long long c_b, long long c_s, long long c_r, int has_pos, int interleaved
#define MGX_ROTARY_ARGS x, cosv, sinv, pos, y, B, S, N, H, R, xb, xs, xn, xh, yb, ys, yn, yh, pb, ps, c_row, c_b, \
    c_s, c_r, has_pos, interleaved
__device__ __forceinline__ void mgx_rotary_at(long long i, MGX_ROTARY_PARAMS) {
    long long h = i % H, n = (i / H) % N, s = (i / (H * N)) % S, b = i / (H * N * S);
    const T* xr = x + b * xb + s * xs + n * xn;
    T* yp = y + b * yb + s * ys + n * yn + h * yh;
    if (h >= R) {
        *yp = xr[h * xh];
        return;
    }
    long long row = has_pos ? pos[b * pb + s * ps] * c_row : b * c_b + s * c_s;
    mgx_st(yp, mgx_rotate(xr, xh, h, R, cosv, sinv, row, c_r, interleaved));
}

extern "C" __global__ void mgx_rotary(MGX_ROTARY_PARAMS) {
    long long total = B * S * N * H;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x)
        mgx_rotary_at(i, MGX_ROTARY_ARGS);
}

// present[b, n, t, h] of a KV cache: new[b, t - start[b], n, h] for start[b] <= t < start[b] + S, its
// first R channels rotated (has_rot; angles as mgx_rotary's).  full == 0 (present is the past
// buffer): only those rows are written (the grid covers B * S * Nkv * H); full == 1: every row,
// past[b, n, t, h] for t < min(start[b], L), 0 for the others.
#define MGX_KV_PARAMS(p) const T* p##past, const T* p##nw, const long long* p##start, T* p##out, \
    long long p##B, long long p##S, long long p##NKV, long long p##H, long long p##P, long long p##L, \
    long long p##nb, long long p##ns, long long p##nn, long long p##nh, long long p##pb, long long p##pn, \
    long long p##pt, long long p##ph, long long p##ob, long long p##on, long long p##ot, long long p##oh, \
    int p##full, const T* p##cosv, const T* p##sinv, const long long* p##pos, long long p##R, long long p##qb, \
    long long p##qs, long long p##c_row, long long p##c_b, long long p##c_s, long long p##c_r, int p##has_rot, \
    int p##has_pos, int p##interleaved
#define MGX_KV_ARGS(p) p##past, p##nw, p##start, p##out, p##B, p##S, p##NKV, p##H, p##P, p##L, p##nb, p##ns, \
    p##nn, p##nh, p##pb, p##pn, p##pt, p##ph, p##ob, p##on, p##ot, p##oh, p##full, p##cosv, p##sinv, p##pos, \
    p##R, p##qb, p##qs, p##c_row, p##c_b, p##c_s, p##c_r, p##has_rot, p##has_pos, p##interleaved
#define MGX_KV_TOTAL(p) (p##B * p##NKV * (p##full ? p##P : p##S) * p##H)
__device__ __forceinline__ void mgx_kv_at(long long i, MGX_KV_PARAMS()) {
    long long rows = full ? P : S;
    long long h = i % H, j = (i / H) % rows, n = (i / (H * rows)) % NKV, b = i / (H * rows * NKV);
    long long st = start[b];
    long long t = full ? j : st + j;
    long long rel = t - st;
    if (t < 0 || t >= P) return;
    T* op = out + b * ob + n * on + t * ot + h * oh;
    if (rel >= 0 && rel < S) {
        const T* nr = nw + b * nb + rel * ns + n * nn;
        if (has_rot && h < R) {
            long long row = has_pos ? pos[b * qb + rel * qs] * c_row : b * c_b + rel * c_s;
            mgx_st(op, mgx_rotate(nr, nh, h, R, cosv, sinv, row, c_r, interleaved));
        } else {
            *op = nr[h * nh];
        }
    } else if (t < L && rel < 0) {
        *op = past[b * pb + n * pn + t * pt + h * ph];
    } else {
        mgx_st(op, 0.0f);
    }
}

extern "C" __global__ void mgx_kv_write(MGX_KV_PARAMS()) {
    long long total = MGX_KV_TOTAL();
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x)
        mgx_kv_at(i, MGX_KV_ARGS());
}

// GroupQueryAttention's decode writes in one launch: the query rotated (as mgx_rotary), then the key
// rows (as mgx_kv_write, rotated) and the value rows; thread i works on the part its index falls in.
extern "C" __global__ void mgx_rotary_kv_write(MGX_ROTARY_PARAMS, MGX_KV_PARAMS(k_), MGX_KV_PARAMS(v_)) {
    long long nq = B * S * N * H, nk = MGX_KV_TOTAL(k_), total = nq + nk + MGX_KV_TOTAL(v_);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        if (i < nq)
            mgx_rotary_at(i, MGX_ROTARY_ARGS);
        else if (i < nq + nk)
            mgx_kv_at(i - nq, MGX_KV_ARGS(k_));
        else
            mgx_kv_at(i - nq - nk, MGX_KV_ARGS(v_));
    }
}

__device__ __forceinline__ float mgx_block_sum(float v, float* red) {
    unsigned tid = threadIdx.x;
    red[tid] = v;
    MGX_SYNC();
    for (unsigned k = blockDim.x / 2; k > 0; k /= 2) {
        if (tid < k) red[tid] += red[tid + k];
        MGX_SYNC();
    }
    float r = red[0];
    MGX_SYNC();
    return r;
}

// Row r of D columns: s = x (+ skip) (+ bias) in float, y = (s - mean) * inv * gamma (+ beta) with
// inv = 1 / sqrt(mean((s - mean)^2) + eps) (mean 0 when simplified).  skip row = r % skip_rows;
// the flags say which inputs / outputs exist (an absent one is passed as x or y, never touched).
// sum: s rounded to T; mean / inv: float per row.  Launched with MGX_NT threads per block.
extern "C" __global__ void mgx_skip_norm(const T* x, const T* skip, const T* gamma, const T* beta, const T* bias,
                                         T* y, float* mean_out, float* inv_out, T* sum_out, long long rows,
                                         long long D, long long skip_rows, float eps, int simplified,
                                         int has_skip, int has_beta, int has_bias, int want_sum, int want_stats) {
    MGX_SHARED float red[MGX_NT];
    if (!has_bias) bias = 0;
    if (!has_beta) beta = 0;
    if (!want_sum) sum_out = 0;
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * D;
        const T* kr = has_skip ? skip + (r % skip_rows) * D : 0;
        float acc = 0.0f;
        for (long long c = threadIdx.x; c < D; c += blockDim.x) {
            float s = mgx_ld(xr[c]);
            if (kr) s += mgx_ld(kr[c]);
            if (bias) s += mgx_ld(bias[c]);
            if (sum_out) mgx_st(sum_out + r * D + c, s);
            acc += s;
        }
        float mean = simplified ? 0.0f : mgx_block_sum(acc, red) / (float)D;
        float sq = 0.0f;
        for (long long c = threadIdx.x; c < D; c += blockDim.x) {
            float s = mgx_ld(xr[c]);
            if (kr) s += mgx_ld(kr[c]);
            if (bias) s += mgx_ld(bias[c]);
            s -= mean;
            sq += s * s;
        }
        float inv = 1.0f / sqrtf(mgx_block_sum(sq, red) / (float)D + eps);
        for (long long c = threadIdx.x; c < D; c += blockDim.x) {
            float s = mgx_ld(xr[c]);
            if (kr) s += mgx_ld(kr[c]);
            if (bias) s += mgx_ld(bias[c]);
            float v = (s - mean) * inv * mgx_ld(gamma[c]);
            if (beta) v += mgx_ld(beta[c]);
            mgx_st(y + r * D + c, v);
        }
        if (threadIdx.x == 0 && want_stats) {
            if (mean_out) mean_out[r] = mean;
            if (inv_out) inv_out[r] = inv;
        }
    }
}
