// One-kernel forms of the LLM contrib ops on the gpu target: rotary_embedding, kv_cache_update and
// skip_layer_norm (operators/llm_gpu.py builds and launches them).  T is the element type (float or
// __half), given by the including source; arithmetic runs in float.  Every loop is grid-stride (blocks
// over rows for the normalization), so the file also builds as host C++ for tests.
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
extern "C" __global__ void mgx_rotary(const T* x, const T* cosv, const T* sinv, const long long* pos, T* y,
                                      long long B, long long S, long long N, long long H, long long R,
                                      long long xb, long long xs, long long xn, long long xh,
                                      long long yb, long long ys, long long yn, long long yh,
                                      long long pb, long long ps, long long c_row, long long c_b, long long c_s,
                                      long long c_r, int has_pos, int interleaved) {
    long long total = B * S * N * H;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        long long h = i % H, n = (i / H) % N, s = (i / (H * N)) % S, b = i / (H * N * S);
        const T* xr = x + b * xb + s * xs + n * xn;
        T* yp = y + b * yb + s * ys + n * yn + h * yh;
        if (h >= R) {
            *yp = xr[h * xh];
            continue;
        }
        long long row = has_pos ? pos[b * pb + s * ps] * c_row : b * c_b + s * c_s;
        mgx_st(yp, mgx_rotate(xr, xh, h, R, cosv, sinv, row, c_r, interleaved));
    }
}

// present[b, n, t, h] of a KV cache: new[b, t - start[b], n, h] for start[b] <= t < start[b] + S, its
// first R channels rotated (has_rot; angles as mgx_rotary's).  full == 0 (present is the past
// buffer): only those rows are written (the grid covers B * S * Nkv * H); full == 1: every row,
// past[b, n, t, h] for t < min(start[b], L), 0 for the others.
extern "C" __global__ void mgx_kv_write(const T* past, const T* nw, const long long* start, T* out,
                                        long long B, long long S, long long NKV, long long H, long long P,
                                        long long L, long long nb, long long ns, long long nn, long long nh,
                                        long long pb, long long pn, long long pt, long long ph,
                                        long long ob, long long on, long long ot, long long oh, int full,
                                        const T* cosv, const T* sinv, const long long* pos, long long R,
                                        long long qb, long long qs, long long c_row, long long c_b,
                                        long long c_s, long long c_r, int has_rot, int has_pos,
                                        int interleaved) {
    long long rows = full ? P : S;
    long long total = B * NKV * rows * H;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        long long h = i % H, j = (i / H) % rows, n = (i / (H * rows)) % NKV, b = i / (H * rows * NKV);
        long long st = start[b];
        long long t = full ? j : st + j;
        long long rel = t - st;
        if (t < 0 || t >= P) continue;
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
