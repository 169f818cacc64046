// ONNX NonMaxSuppression (float32 boxes [B, N, 4] and scores [B, C, N], standard layout), following
// onnxruntime's CPU kernel: candidates are the boxes with score > score_threshold (when given), taken
// by descending score (ties: lower box index first); a candidate is kept unless its IoU with a box
// already kept for that class is > iou_threshold; at most max_out boxes per (batch, class).
// NaN scores are never candidates.  Compiled with --fmad=false so the IoU rounds as the CPU's does.

#define MGX_BLOCK 256

__device__ __forceinline__ void mgx_minmax(float a, float b, float& lo, float& hi) {
    if (a >= b) { lo = b; hi = a; } else { lo = a; hi = b; }
}

// true when box j suppresses box i (or i suppresses j: the test is symmetric)
__device__ bool mgx_suppress(const float* bi, const float* bj, int center, float iou_threshold) {
    float x1lo, x1hi, y1lo, y1hi, x2lo, x2hi, y2lo, y2hi;
    if (center == 0) {  // [y1, x1, y2, x2], any two opposite corners
        mgx_minmax(bi[1], bi[3], x1lo, x1hi);
        mgx_minmax(bj[1], bj[3], x2lo, x2hi);
        mgx_minmax(bi[0], bi[2], y1lo, y1hi);
        mgx_minmax(bj[0], bj[2], y2lo, y2hi);
    } else {  // [x_center, y_center, width, height]
        float w1 = bi[2] / 2, h1 = bi[3] / 2, w2 = bj[2] / 2, h2 = bj[3] / 2;
        x1lo = bi[0] - w1; x1hi = bi[0] + w1; y1lo = bi[1] - h1; y1hi = bi[1] + h1;
        x2lo = bj[0] - w2; x2hi = bj[0] + w2; y2lo = bj[1] - h2; y2hi = bj[1] + h2;
    }
    float ixlo = x1lo > x2lo ? x1lo : x2lo, ixhi = x1hi < x2hi ? x1hi : x2hi;
    if (ixhi <= ixlo) return false;
    float iylo = y1lo > y2lo ? y1lo : y2lo, iyhi = y1hi < y2hi ? y1hi : y2hi;
    if (iyhi <= iylo) return false;
    float inter = (ixhi - ixlo) * (iyhi - iylo);
    if (inter <= 0.0f) return false;
    float area1 = (x1hi - x1lo) * (y1hi - y1lo);
    float area2 = (x2hi - x2lo) * (y2hi - y2lo);
    float uni = area1 + area2 - inter;
    if (area1 <= 0.0f || area2 <= 0.0f || uni <= 0.0f) return false;
    return inter / uni > iou_threshold;
}

__device__ __forceinline__ bool mgx_candidate(float s, int has_score, float score_threshold) {
    return s == s && (!has_score || s > score_threshold);
}

// One block per (batch, class).  order: [B*C, N] scratch; kept: [B*C, max_out]; counts: [B*C].
extern "C" __global__ void mgx_nms_select(const float* boxes, const float* scores, const float* iou_thr,
                                          const float* score_thr, long long C, long long N, long long max_out,
                                          int center, int has_score, long long* order, long long* kept,
                                          long long* counts) {
    long long bc = blockIdx.x, b = bc / C;
    const float* sc = scores + bc * N;
    const float* bx = boxes + b * N * 4;
    long long* ord = order + bc * N;
    long long* sel = kept + bc * max_out;
    float iou = iou_thr[0];
    float sthr = has_score ? score_thr[0] : 0.0f;
    __shared__ long long ncand, nsel;
    __shared__ int suppressed;
    if (threadIdx.x == 0) { ncand = 0; nsel = 0; }
    __syncthreads();
    // rank sort of the candidates: descending score, ties by lower index (a total order: no collisions)
    for (long long i = threadIdx.x; i < N; i += blockDim.x) {
        float si = sc[i];
        if (!mgx_candidate(si, has_score, sthr)) continue;
        long long rank = 0;
        for (long long j = 0; j < N; ++j) {
            float sj = sc[j];
            if (mgx_candidate(sj, has_score, sthr) && (sj > si || (sj == si && j < i))) ++rank;
        }
        ord[rank] = i;
        atomicAdd((unsigned long long*)&ncand, 1ULL);
    }
    __syncthreads();
    for (long long k = 0; k < ncand && nsel < max_out; ++k) {
        long long cand = ord[k];
        if (threadIdx.x == 0) suppressed = 0;
        __syncthreads();
        for (long long q = threadIdx.x; q < nsel; q += blockDim.x) {
            if (mgx_suppress(bx + sel[q] * 4, bx + cand * 4, center, iou)) suppressed = 1;
        }
        __syncthreads();
        if (threadIdx.x == 0 && !suppressed) { sel[nsel] = cand; nsel = nsel + 1; }
        __syncthreads();
    }
    if (threadIdx.x == 0) counts[bc] = nsel;
}

// One block per (batch, class): its kept boxes become rows [b, c, index] of out [cap, 3] after the
// rows of the earlier (batch, class) pairs; block 0 writes the total into *total and zeroes the tail.
extern "C" __global__ void mgx_nms_compact(const long long* kept, const long long* counts, long long C,
                                           long long BC, long long max_out, long long cap, long long* out,
                                           long long* total) {
    long long bc = blockIdx.x;
    __shared__ long long start, all;
    if (threadIdx.x == 0) {
        long long s = 0, t = 0;
        for (long long q = 0; q < BC; ++q) {
            if (q < bc) s += counts[q];
            t += counts[q];
        }
        start = s;
        all = t;
    }
    __syncthreads();
    long long n = counts[bc];
    for (long long k = threadIdx.x; k < n; k += blockDim.x) {
        long long* row = out + (start + k) * 3;
        row[0] = bc / C;
        row[1] = bc % C;
        row[2] = kept[bc * max_out + k];
    }
    if (bc == 0) {
        for (long long r = all * 3 + threadIdx.x; r < cap * 3; r += blockDim.x) out[r] = 0;
        if (threadIdx.x == 0) *total = all;
    }
}
