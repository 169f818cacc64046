// com.microsoft::DynamicQuantizeLSTM on the gpu target, with the arithmetic of the op's host kernel
// (operators/dq_lstm.py): uint8 dynamic quantization with one scale per GEMM input (X over the whole
// sequence; h per step and per batch row), exact int accumulation, then the float32 gate math.
// Compiled once by operators/dq_lstm.py without FMA contraction (every product and sum rounded as
// numpy rounds it).  Inputs are standard layout; nothing here allocates, so every kernel is captured.
// Every loop is grid- and block-stride and reductions go through shared memory, so the kernels are
// correct for any launch shape (a power-of-two block of at most MAX_THREADS threads), one thread included.
//
// Kernel names end in _i8 (int8 W, R and zero points) or _u8 (uint8).

#define DQ_MAX_THREADS 512
#define DQ_JB 32  // hidden units per block of the step kernel (blockDim.x <= DQ_JB)
#define DQ_KS 16  // k slices of the step kernel (blockDim.y <= DQ_KS)

// min and max of v[0..n) over the block, widened to include 0 (ONNX DynamicQuantizeLinear), then the
// uint8 scale and zero point as numpy computes them in float32.
__device__ void dq_block_params(const float* v, long long n, float* smn, float* smx, float* scale, float* zp) {
    int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
    float lo = 0.0f, hi = 0.0f;
    for (long long k = tid; k < n; k += nt) {
        lo = fminf(lo, v[k]);
        hi = fmaxf(hi, v[k]);
    }
    smn[tid] = lo;
    smx[tid] = hi;
    __syncthreads();
    for (int s = nt / 2; s > 0; s >>= 1) {
        if (tid < s) {
            smn[tid] = fminf(smn[tid], smn[tid + s]);
            smx[tid] = fmaxf(smx[tid], smx[tid + s]);
        }
        __syncthreads();
    }
    lo = smn[0];
    hi = smx[0];
    __syncthreads();  // smn / smx may be reused by the caller
    float sc = (hi == lo) ? 1.0f : (hi - lo) / 255.0f;
    *scale = sc;
    *zp = rintf(fminf(fmaxf(0.0f - lo / sc, 0.0f), 255.0f));
}

// q(v) - zero point, with q = clip(rint(v / scale) + zp, 0, 255).
__device__ __forceinline__ int dq_centered(float v, float scale, float zp) {
    return (int)fminf(fmaxf(rintf(v / scale) + zp, 0.0f), 255.0f) - (int)zp;
}

// One block: X [n] -> qx [n] (int, zero point subtracted) and params = {scale, zero point}.
extern "C" __global__ void dq_quantize_input(const float* x, long long n, int* qx, float* params) {
    __shared__ float smn[DQ_MAX_THREADS], smx[DQ_MAX_THREADS];
    float scale, zp;
    dq_block_params(x, n, smn, smx, &scale, &zp);
    int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
    for (long long k = tid; k < n; k += nt) qx[k] = dq_centered(x[k], scale, zp);
    if (tid == 0) {
        params[0] = scale;
        params[1] = zp;
    }
}

// xw[d, r, col] = float(sum_k qx[r, k] * (W[d, k, col] - wz)) * (x scale * W scale), for rows r < rows,
// k < K, col < N; wz / ws indexed by column when wz_col / ws_col (else one per direction).
// One thread per column and DQ_RT rows (blockIdx.y), direction blockIdx.z.
#define DQ_RT 8
template <typename WT>
__device__ void dq_input_gemm(const int* qx, const float* params, const WT* W, const WT* wz, const float* ws,
                              int wz_col, int ws_col, long long rows, long long K, long long N, int D, float* xw) {
    float sx = params[0];
    for (int d = blockIdx.z; d < D; d += gridDim.z) {
        for (long long r0 = (long long)blockIdx.y * DQ_RT; r0 < rows; r0 += (long long)gridDim.y * DQ_RT) {
            for (long long col = (long long)blockIdx.x * blockDim.x + threadIdx.x; col < N;
                 col += (long long)gridDim.x * blockDim.x) {
                int acc[DQ_RT];
                for (int i = 0; i < DQ_RT; ++i) acc[i] = 0;
                int zw = (int)wz[wz_col ? d * N + col : d];
                const WT* wcol = W + (long long)d * K * N + col;
                for (long long k = 0; k < K; ++k) {
                    int w = (int)wcol[k * N] - zw;
                    for (int i = 0; i < DQ_RT; ++i)
                        if (r0 + i < rows) acc[i] += qx[(r0 + i) * K + k] * w;
                }
                float s = sx * ws[ws_col ? d * N + col : d];
                for (int i = 0; i < DQ_RT; ++i)
                    if (r0 + i < rows) xw[((long long)d * rows + r0 + i) * N + col] = (float)acc[i] * s;
            }
        }
    }
}

__device__ __forceinline__ float dq_sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// Step ``step`` of every direction (blockIdx.y) and batch row (blockIdx.z): quantize h_prev (h0 at step
// 0, else Y at the previous time of this direction) with its own scale, gates = (xw[t] + h_prev R) +
// (Wb + Rb), c = f * c + i * tanh(g), h = o * tanh(c); writes Y[t, d, b], c into Yc (read from c0 at
// step 0) and, at the last step, Yh.  Gate order i, o, f, c.  Block: DQ_JB hidden units (threadIdx.x)
// times DQ_KS slices of the reduction (threadIdx.y), summed exactly in shared memory.
template <typename WT>
__device__ void dq_lstm_step(const float* xw, const WT* R, const WT* rz, const float* rs, int rz_col, int rs_col,
                             const float* bias, const float* h0, const float* c0, float* Y, float* Yh, float* Yc,
                             long long T, long long B, long long H, int D, int reverse, long long step) {
    __shared__ float smn[DQ_MAX_THREADS], smx[DQ_MAX_THREADS];
    __shared__ int part[DQ_KS][4][DQ_JB];
    long long G = 4 * H;
    for (int d = blockIdx.y; d < D; d += gridDim.y) {
        bool rev = reverse || d == 1;
        long long t = rev ? T - 1 - step : step, tp = rev ? t + 1 : t - 1;
        for (long long b = blockIdx.z; b < B; b += gridDim.z) {
            long long row = (long long)d * B + b;
            const float* hp = step == 0 ? h0 + row * H : Y + ((tp * D + d) * B + b) * H;
            const float* cp = step == 0 ? c0 + row * H : Yc + row * H;
            float sh, zh;
            dq_block_params(hp, H, smn, smx, &sh, &zh);
            for (long long j0 = (long long)blockIdx.x * blockDim.x; j0 < H; j0 += (long long)gridDim.x * blockDim.x) {
                long long j = j0 + threadIdx.x;
                int acc[4] = {0, 0, 0, 0};
                if (j < H) {
                    int zr[4];
                    for (int g = 0; g < 4; ++g) zr[g] = (int)rz[rz_col ? d * G + g * H + j : d];
                    const WT* rcol = R + (long long)d * H * G + j;
                    for (long long k = threadIdx.y; k < H; k += blockDim.y) {
                        int q = dq_centered(hp[k], sh, zh);
                        for (int g = 0; g < 4; ++g) acc[g] += q * ((int)rcol[k * G + g * H] - zr[g]);
                    }
                }
                for (int g = 0; g < 4; ++g) part[threadIdx.y][g][threadIdx.x] = acc[g];
                __syncthreads();
                if (threadIdx.y == 0 && j < H) {
                    float gate[4];
                    for (int g = 0; g < 4; ++g) {
                        int s = 0;
                        for (unsigned y = 0; y < blockDim.y; ++y) s += part[y][g][threadIdx.x];
                        long long col = g * H + j;
                        float hr = (float)s * (sh * rs[rs_col ? d * G + col : d]);
                        float bb = bias[(long long)d * 2 * G + col] + bias[(long long)d * 2 * G + G + col];
                        gate[g] = (xw[((long long)d * T * B + t * B + b) * G + col] + hr) + bb;
                    }
                    float i_g = dq_sigmoid(gate[0]), o_g = dq_sigmoid(gate[1]), f_g = dq_sigmoid(gate[2]);
                    float c = f_g * cp[j] + i_g * tanhf(gate[3]);
                    float h = o_g * tanhf(c);
                    Yc[row * H + j] = c;
                    Y[((t * D + d) * B + b) * H + j] = h;
                    if (step == T - 1) Yh[row * H + j] = h;
                }
                __syncthreads();  // part is rewritten by the next j0
            }
        }
    }
}

#define DQ_INSTANTIATE(SUFFIX, WT)                                                                              \
    extern "C" __global__ void dq_input_gemm_##SUFFIX(const int* qx, const float* params, const WT* W,            \
                                                      const WT* wz, const float* ws, int wz_col, int ws_col,      \
                                                      long long rows, long long K, long long N, int D,            \
                                                      float* xw) {                                                \
        dq_input_gemm<WT>(qx, params, W, wz, ws, wz_col, ws_col, rows, K, N, D, xw);                              \
    }                                                                                                             \
    extern "C" __global__ void dq_lstm_step_##SUFFIX(const float* xw, const WT* R, const WT* rz, const float* rs,  \
                                                     int rz_col, int rs_col, const float* bias, const float* h0,  \
                                                     const float* c0, float* Y, float* Yh, float* Yc,             \
                                                     long long T, long long B, long long H, int D, int reverse,   \
                                                     long long step) {                                            \
        dq_lstm_step<WT>(xw, R, rz, rs, rz_col, rs_col, bias, h0, c0, Y, Yh, Yc, T, B, H, D, reverse, step);     \
    }

DQ_INSTANTIATE(i8, signed char)
DQ_INSTANTIATE(u8, unsigned char)
