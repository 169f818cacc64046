// One time step of the ONNX LSTM (default activations) on the gpu target, after the step's recurrent
// GEMM: operators/lstm_gpu.py runs, per direction, one GEMM of X W^T over every time step, then per
// step the GEMM h R^T and this kernel.  T is the element type (__half, float or double) and ACC the
// compute type (float for __half and float, double for double), both given by the including source;
// loads convert to ACC, stores round to T.  Compiled without FMA contraction, so for float and double
// each sum and product is rounded as the op's numpy path rounds it.  The loop is grid-stride, so the
// file also builds as host C++ for tests (tests/cu_host.py).
#if !defined(MGX_LSTM_CONFIG) && (defined(__CUDACC__) || defined(__HIPCC__))  // on its own: CMake's check_kernels
#if defined(__HIPCC__)
#include <hip/hip_fp16.h>
#else
#include <cuda_fp16.h>
#endif
typedef float T;
typedef float ACC;
#endif
#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__CUDACC_RTC__) || defined(__HIPCC_RTC__)
__device__ __forceinline__ float mgx_lstm_ld(__half v) { return __half2float(v); }
__device__ __forceinline__ void mgx_lstm_st(__half* p, float v) { *p = __float2half(v); }
#endif
__device__ __forceinline__ float mgx_lstm_ld(float v) { return v; }
__device__ __forceinline__ double mgx_lstm_ld(double v) { return v; }
__device__ __forceinline__ void mgx_lstm_st(float* p, float v) { *p = v; }
__device__ __forceinline__ void mgx_lstm_st(double* p, double v) { *p = v; }
__device__ __forceinline__ float mgx_lstm_exp(float v) { return expf(v); }
__device__ __forceinline__ double mgx_lstm_exp(double v) { return exp(v); }
__device__ __forceinline__ float mgx_lstm_tanh(float v) { return tanhf(v); }
__device__ __forceinline__ double mgx_lstm_tanh(double v) { return tanh(v); }

// 1 / (1 + e^-v), as the numpy path computes it
__device__ __forceinline__ ACC mgx_lstm_sigmoid(ACC v) { return (ACC)1 / ((ACC)1 + mgx_lstm_exp(-v)); }

// For each batch row b < B and hidden unit j < H (rows of xw, hr: [B, 4H] contiguous, gates i, o, f, c):
//   gate_k = xw[b, kH + j] + hr[b, kH + j] (+ wb[kH + j] + rb[kH + j] when has_bias; bias = [Wb | Rb], 8H)
//   c = sigmoid(f) * c_in + sigmoid(i) * tanh(g)      h = sigmoid(o) * tanh(c)
// c is written to c_out (which may be c_in) and h to y ([B, H]); when last, also to yh and yc ([B, H]).
extern "C" __global__ void mgx_lstm_step(const T* xw, const T* hr, const T* bias, int has_bias, const T* c_in,
                                         T* c_out, T* y, T* yh, T* yc, int last, long long B, long long H) {
    long long total = B * H;
    for (long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x; n < total;
         n += (long long)gridDim.x * blockDim.x) {
        long long b = n / H, j = n - b * H;
        const T* xr = xw + b * 4 * H + j;
        const T* rr = hr + b * 4 * H + j;
        ACC g[4];
        for (int k = 0; k < 4; ++k) {
            ACC v = mgx_lstm_ld(xr[k * H]) + mgx_lstm_ld(rr[k * H]);
            if (has_bias) {
                v = v + mgx_lstm_ld(bias[k * H + j]);
                v = v + mgx_lstm_ld(bias[(4 + k) * H + j]);
            }
            g[k] = v;
        }
        ACC i_g = mgx_lstm_sigmoid(g[0]), o_g = mgx_lstm_sigmoid(g[1]), f_g = mgx_lstm_sigmoid(g[2]);
        ACC fc = f_g * mgx_lstm_ld(c_in[n]);
        ACC ig = i_g * mgx_lstm_tanh(g[3]);
        ACC c = fc + ig;
        ACC h = o_g * mgx_lstm_tanh(c);
        mgx_lstm_st(c_out + n, c);
        mgx_lstm_st(y + n, h);
        if (last) {
            mgx_lstm_st(yh + n, h);
            mgx_lstm_st(yc + n, c);
        }
    }
}
