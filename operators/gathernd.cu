// GatherND: one thread per element of `out` (standard layout), `data` and `idx` standard too.
// out row r (one index tuple of q <= 4 values, `idx + r * q`) copies a slice of `slice` elements of
// `data`: the one of batch entry r / rows (rows: index tuples per batch entry; batch_dims flattened)
// at the indexed position.  A negative index counts from the end of its dim (d*); s* are the element
// strides of the indexed dims, bstride the one of a batch entry.  An index still outside its dim is
// clamped into it (no read outside `data`; the host target raises for it).
// Elements are moved as raw storage words, so one kernel serves every dtype of a given size.
// Portable CUDA / HIP source (compiled at run time by NVRTC or hipRTC through CuPy).

#define MGX_GATHERND(NAME, T, I)                                                                      \
  extern "C" __global__ void NAME(const T* data, const I* idx, T* out, long long n, long long slice,  \
                                  long long rows, long long bstride, int q, long long d0,              \
                                  long long d1, long long d2, long long d3, long long s0, long long s1, \
                                  long long s2, long long s3) {                                        \
    const long long dims[4] = {d0, d1, d2, d3};                                                       \
    const long long strides[4] = {s0, s1, s2, s3};                                                    \
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n;                        \
         e += (long long)blockDim.x * gridDim.x) {                                                    \
      const long long row = e / slice;                                                                \
      const I* ix = idx + row * q;                                                                    \
      long long off = (row / rows) * bstride + (e - row * slice);                                     \
      for (int j = 0; j < q; ++j) {                                                                   \
        long long v = (long long)ix[j];                                                               \
        if (v < 0) v += dims[j];                                                                      \
        v = v < 0 ? 0 : (v >= dims[j] ? dims[j] - 1 : v);                                             \
        off += v * strides[j];                                                                        \
      }                                                                                               \
      out[e] = data[off];                                                                             \
    }                                                                                                 \
  }

MGX_GATHERND(gathernd_w1_i32, unsigned char, int)
MGX_GATHERND(gathernd_w1_i64, unsigned char, long long)
MGX_GATHERND(gathernd_w2_i32, unsigned short, int)
MGX_GATHERND(gathernd_w2_i64, unsigned short, long long)
MGX_GATHERND(gathernd_w4_i32, unsigned int, int)
MGX_GATHERND(gathernd_w4_i64, unsigned int, long long)
MGX_GATHERND(gathernd_w8_i32, unsigned long long, int)
MGX_GATHERND(gathernd_w8_i64, unsigned long long, long long)
