// ScatterND (reduction "none"): one thread per element of `updates` (standard layout).
// `out` already holds `data` (or is the data buffer itself, for an in-place cache update) and may
// be strided: d*/s* are the q <= 4 indexed dims and their strides, t*/ts* the trailing dims and
// strides (up to 5, padded with size 1), all in elements.
// Elements are moved as raw storage words, so one kernel serves every dtype of a given size.
// Portable CUDA / HIP source (compiled at run time by NVRTC or hipRTC through CuPy).

#define MGX_SCATTERND(NAME, T, I)                                                                     \
  extern "C" __global__ void NAME(T* out, const I* idx, const T* upd, long long n, long long slice,   \
                                  int q, long long d0, long long d1, long long d2, long long d3,       \
                                  long long s0, long long s1, long long s2, long long s3,              \
                                  long long t0, long long t1, long long t2, long long t3, long long t4, \
                                  long long u0, long long u1, long long u2, long long u3, long long u4) { \
    const long long dims[4] = {d0, d1, d2, d3};                                                       \
    const long long strides[4] = {s0, s1, s2, s3};                                                    \
    const long long tdims[5] = {t0, t1, t2, t3, t4};                                                  \
    const long long tstrides[5] = {u0, u1, u2, u3, u4};                                               \
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n;                        \
         e += (long long)blockDim.x * gridDim.x) {                                                    \
      const long long row = e / slice;                                                                \
      long long within = e - row * slice;                                                             \
      const I* ix = idx + row * q;                                                                    \
      long long off = 0;                                                                              \
      for (int j = 0; j < q; ++j) {                                                                   \
        long long v = (long long)ix[j];                                                               \
        if (v < 0) v += dims[j];                                                                      \
        off += v * strides[j];                                                                        \
      }                                                                                               \
      for (int j = 4; j >= 0; --j) {                                                                  \
        const long long k = within % tdims[j];                                                        \
        within /= tdims[j];                                                                           \
        off += k * tstrides[j];                                                                       \
      }                                                                                               \
      out[off] = upd[e];                                                                              \
    }                                                                                                 \
  }

MGX_SCATTERND(scatternd_w1_i32, unsigned char, int)
MGX_SCATTERND(scatternd_w1_i64, unsigned char, long long)
MGX_SCATTERND(scatternd_w2_i32, unsigned short, int)
MGX_SCATTERND(scatternd_w2_i64, unsigned short, long long)
MGX_SCATTERND(scatternd_w4_i32, unsigned int, int)
MGX_SCATTERND(scatternd_w4_i64, unsigned int, long long)
MGX_SCATTERND(scatternd_w8_i32, unsigned long long, int)
MGX_SCATTERND(scatternd_w8_i64, unsigned long long, long long)
