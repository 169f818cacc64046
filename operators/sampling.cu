// GridSample and RoiAlign on the gpu target, as onnxruntime's CPU kernels compute them.
// Compiled once per element type by operators/sampling.py, which prepends
//   typedef <element type> T; typedef <compute type> ACC;
// (ACC is float for __half and float, double for double).  Inputs are standard layout.  Nothing here
// allocates: the kernels can be captured.
#ifdef MGX_KERNEL_CHECK  // CMake's check_kernels compiles this file alone: the types the Python side prepends
#if defined(__HIPCC__)
#include <hip/hip_fp16.h>
#else
#include <cuda_fp16.h>
#endif
typedef float T;
typedef float ACC;
#endif

// ---------------------------------------------------------------------------------------------------
// GridSample: one thread per (n, output position), looping over the channels.  2-D inputs run as 3-D
// with D = Do = 1 (one z tap of weight 1).  mode 0 nearest, 1 linear, 2 cubic; pad 0 zeros, 1 border,
// 2 reflection.
// ---------------------------------------------------------------------------------------------------
__device__ __forceinline__ ACC gs_denormalize(ACC v, long long len, int align) {
    return align ? (v + (ACC)1) / (ACC)2 * (ACC)(len - 1) : ((v + (ACC)1) * (ACC)len - (ACC)1) / (ACC)2;
}

// Reflect x into [lo, hi] by the near border until inside (onnxruntime's GsReflect).
__device__ ACC gs_reflect(ACC x, ACC lo, ACC hi) {
    ACC range = hi - lo;
    if (range <= (ACC)0) return lo;
    if (x < lo) {
        ACC dx = lo - x;
        long long n = (long long)(dx / range);
        ACC r = dx - (ACC)n * range;
        return (n % 2 == 0) ? lo + r : hi - r;
    }
    if (x > hi) {
        ACC dx = x - hi;
        long long n = (long long)(dx / range);
        ACC r = dx - (ACC)n * range;
        return (n % 2 == 0) ? hi - r : lo + r;
    }
    return x;
}

// The input index a tap at integer position i reads, or -1 (zeros padding outside the input).
__device__ long long gs_index(long long i, long long len, int pad, int align) {
    if (pad == 0) return (i >= 0 && i < len) ? i : -1;
    if (pad == 1) return i < 0 ? 0 : (i >= len ? len - 1 : i);
    ACC lo = align ? (ACC)0 : (ACC)-0.5, hi = align ? (ACC)(len - 1) : (ACC)len - (ACC)0.5;
    long long r = (long long)gs_reflect((ACC)i, lo, hi);
    return r < 0 ? 0 : (r >= len ? len - 1 : r);
}

__device__ void gs_cubic(ACC t, ACC* c) {
    const ACC a = (ACC)-0.75;
    ACC x = t < (ACC)0 ? -t : t;
    c[0] = ((a * (x + 1) - 5 * a) * (x + 1) + 8 * a) * (x + 1) - 4 * a;
    c[1] = ((a + 2) * x - (a + 3)) * x * x + 1;
    c[2] = ((a + 2) * (1 - x) - (a + 3)) * (1 - x) * (1 - x) + 1;
    c[3] = ((a * (2 - x) - 5 * a) * (2 - x) + 8 * a) * (2 - x) - 4 * a;
}

// Taps of one axis: input indices (-1: reads 0) and weights; returns how many.
__device__ int gs_taps(ACC g, long long len, int mode, int pad, int align, long long* idx, ACC* w) {
    ACC x = gs_denormalize(g, len, align);
    if (mode == 0) {
        idx[0] = gs_index((long long)rint(x), len, pad, align);
        w[0] = (ACC)1;
        return 1;
    }
    long long x0 = (long long)floor(x);
    if (mode == 1) {
        idx[0] = gs_index(x0, len, pad, align);
        idx[1] = gs_index(x0 + 1, len, pad, align);
        w[0] = (ACC)(x0 + 1) - x;
        w[1] = x - (ACC)x0;
        return 2;
    }
    gs_cubic(x - (ACC)x0, w);
    for (int k = 0; k < 4; ++k) idx[k] = gs_index(x0 - 1 + k, len, pad, align);
    return 4;
}

extern "C" __global__ void mgx_grid_sample(const T* x, const T* grid, T* y, long long N, long long C,
                                           long long D, long long H, long long W, long long Do, long long Ho,
                                           long long Wo, int nd, int mode, int pad, int align) {
    long long points = Do * Ho * Wo;
    long long total = N * points;
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        long long n = p / points, q = p % points;
        const T* g = grid + p * nd;
        long long ix[4], iy[4], iz[4];
        ACC wx[4], wy[4], wz[4];
        int tx = gs_taps((ACC)g[0], W, mode, pad, align, ix, wx);
        int ty = gs_taps((ACC)g[1], H, mode, pad, align, iy, wy);
        int tz = 1;
        iz[0] = 0;
        wz[0] = (ACC)1;
        if (nd == 3) tz = gs_taps((ACC)g[2], D, mode, pad, align, iz, wz);
        for (long long c = 0; c < C; ++c) {
            const T* img = x + (n * C + c) * D * H * W;
            ACC acc = (ACC)0;
            for (int a = 0; a < tz; ++a) {
                if (iz[a] < 0) continue;
                ACC plane = (ACC)0;
                for (int b = 0; b < ty; ++b) {
                    if (iy[b] < 0) continue;
                    ACC row = (ACC)0;
                    for (int k = 0; k < tx; ++k) {
                        if (ix[k] < 0) continue;
                        row += wx[k] * (ACC)img[(iz[a] * H + iy[b]) * W + ix[k]];
                    }
                    plane += wy[b] * row;
                }
                acc += wz[a] * plane;
            }
            y[(n * C + c) * points + q] = (T)acc;
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// RoiAlign: one thread per output element (roi, c, ph, pw); the sampling grid of each bin is
// sampling_ratio (or ceil(roi size / bins)) per axis.  mode 0 avg, 1 max (the largest weighted corner
// of each sample, as onnxruntime and the ONNX reference compute it).
// ---------------------------------------------------------------------------------------------------
__device__ void ra_axis(ACC v, long long len, long long* lo, long long* hi, ACC* l) {
    if (v <= (ACC)0) v = (ACC)0;
    long long a = (long long)v;
    if (a >= len - 1) {
        *lo = *hi = len - 1;
        v = (ACC)(len - 1);
    } else {
        *lo = a;
        *hi = a + 1;
    }
    *l = v - (ACC)*lo;
}

extern "C" __global__ void mgx_roi_align(const T* x, const T* rois, const long long* batch, T* y, long long R,
                                         long long N, long long C, long long H, long long W, long long PH,
                                         long long PW, ACC scale, long long sampling, int half_pixel, int is_max) {
    long long total = R * C * PH * PW;
    for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < total;
         o += (long long)gridDim.x * blockDim.x) {
        long long pw = o % PW, ph = (o / PW) % PH, c = (o / (PW * PH)) % C, r = o / (PW * PH * C);
        long long b = batch[r];
        b = b < 0 ? 0 : (b >= N ? N - 1 : b);
        const T* img = x + (b * C + c) * H * W;
        ACC off = half_pixel ? (ACC)0.5 : (ACC)0;
        ACC sw = (ACC)rois[r * 4 + 0] * scale - off, sh = (ACC)rois[r * 4 + 1] * scale - off;
        ACC ew = (ACC)rois[r * 4 + 2] * scale - off, eh = (ACC)rois[r * 4 + 3] * scale - off;
        ACC rw = ew - sw, rh = eh - sh;
        if (!half_pixel) {
            rw = rw > (ACC)1 ? rw : (ACC)1;
            rh = rh > (ACC)1 ? rh : (ACC)1;
        }
        ACC bh = rh / (ACC)PH, bw = rw / (ACC)PW;
        long long gh = sampling > 0 ? sampling : (long long)ceil(rh / (ACC)PH);
        long long gw = sampling > 0 ? sampling : (long long)ceil(rw / (ACC)PW);
        long long count = gh * gw > 1 ? gh * gw : 1;
        ACC acc = (ACC)0;
        bool first = true;
        for (long long iy = 0; iy < gh; ++iy) {
            ACC yy = sh + (ACC)ph * bh + ((ACC)iy + (ACC)0.5) * bh / (ACC)gh;
            for (long long ix = 0; ix < gw; ++ix) {
                ACC xx = sw + (ACC)pw * bw + ((ACC)ix + (ACC)0.5) * bw / (ACC)gw;
                ACC val = (ACC)0;
                if (!(yy < (ACC)-1 || yy > (ACC)H || xx < (ACC)-1 || xx > (ACC)W)) {
                    long long y0, y1, x0, x1;
                    ACC ly, lx;
                    ra_axis(yy, H, &y0, &y1, &ly);
                    ra_axis(xx, W, &x0, &x1, &lx);
                    ACC hy = (ACC)1 - ly, hx = (ACC)1 - lx;
                    ACC v1 = hy * hx * (ACC)img[y0 * W + x0], v2 = hy * lx * (ACC)img[y0 * W + x1];
                    ACC v3 = ly * hx * (ACC)img[y1 * W + x0], v4 = ly * lx * (ACC)img[y1 * W + x1];
                    if (is_max) {
                        val = v1 > v2 ? v1 : v2;
                        val = val > v3 ? val : v3;
                        val = val > v4 ? val : v4;
                    } else {
                        val = v1 + v2 + v3 + v4;
                    }
                }
                if (is_max) {
                    acc = (first || val > acc) ? val : acc;
                    first = false;
                } else {
                    acc += val;
                }
            }
        }
        y[o] = (T)(is_max ? acc : acc / (ACC)count);
    }
}
