// Attention of a few query rows over a KV cache (the decode step), flash-decoding style: one block per
// (batch entry, KV head, group of query rows, split of the cache rows), then, with several splits, a
// small kernel that merges the splits; mgx_attn_warp, for few query rows per KV head, walks the keys
// with 32-lane groups instead of the whole block (see below).  operators/attention_gpu.py prepends the
// configuration and launches them; the semantics are those of operators/decode_attention.py (decode_attention) and
// operators/attention.py (grouped_attention).
//
// Configuration (#defines): T (q / k / v / out element type: __half or float), MT (mask / bias type),
// ST (sink type), H / HV (key / value head size), ROWS (query rows per block), NT (threads per block =
// keys per chunk), TPR (threads per row in the row reductions: a power of two, TPR * ROWS <= NT),
// VK / VV (elements per K / V load), KC / VC (1: K / V rows are contiguous and aligned for VK / VV wide
// loads), NHG = HV / VV and NKG = NT / NHG (value column groups, key groups), RED (floats of the
// reduction buffer), CT (threads of the merge kernel), HAS_MASK (an additive mask or bias over the
// first TB keys; MASK_ROUND: its values rounded to T first), HAS_LEN (kv_len per batch entry), CAUSAL, WINDOW (local window W), KEY_MASK (bool,
// 0 hides the key), SINK (0: none, 1: a logit per query head, 2: a zero logit), SOFTCAP, EMPTY (a row
// that sees no key: 0 NaN, 1 zero, 2 the mean of all P values), NAN_ZERO (a row with a NaN or +inf
// logit gives 0 instead of NaN).
// MGX_ATTN_BLOCK / MGX_ATTN_WARP (1: compile mgx_attn_split / mgx_attn_warp; mgx_attn_combine always).
// mgx_attn_warp reads NT (= NW * 32 threads), NW (warps per block), ROWS (= G * S), VK / KC as above,
// VV (value columns per lane, loaded VW at a time; VC: contiguous loads), LPR = HV / VV (lanes per V
// row, a power of two <= 32), VB (V rows a lane loads before it adds them), MASK_ONE (1: every row of
// the block reads the same mask row), K_EARLY (1: K rows are loaded before the mask values are known),
// V_EARLY (1: a lane's V rows of a 32-key step are loaded together with the K rows, before the scores)
// and VE (V_EARLY: V rows a lane holds per step, VE * VV elements in registers).
//
// A block loads its query rows (the G = N / NKV query heads of its KV head times the S positions; rows
// r0 .. r0 + ROWS) into shared memory as float and walks its cache rows in chunks of NT keys:
//   1. scores: thread j takes key t = c0 + j and decides for each row whether the key is visible (lengths,
//      causal, window, key mask; a mask / bias value of -inf hides it).  For a key some row sees it reads
//      the K row once and forms x = softcap(scale * q.k) + mask per row in float32; a NaN or +inf logit
//      marks the row bad.  Hidden keys get x = -inf;
//   2. per row: the chunk's max joins the running max m (the accumulated values and the sum are rescaled
//      by exp(m_old - m_new)), then p = exp(x - m) and the running sum l (online softmax, float32);
//   3. values: thread (kg, hg) adds p * V over keys kg, kg + NKG, ... for VV value columns (a key no row
//      sees is not read; a zero weight adds nothing, so non-finite values of hidden rows never leak).
// At the end the key groups' sums are added in shared memory; with one split the block writes the
// normalized output, with several it writes (m, l, bad, acc[HV]) per row and split to `part`, which
// mgx_attn_combine merges.

#ifndef MGX_ATTN_CONFIG  // compiled on its own (CMake's check_kernels): one configuration, SmolLM2's decode step
#if defined(__HIPCC__)
#include <hip/hip_fp16.h>
#else
#include <cuda_fp16.h>
#endif
#define T __half
#define MT float
#define ST __half
#define H 64
#define HV 64
#define ROWS 3
#define NT 256
#define TPR 64
#define VK 8
#define VV 8
#define KC 1
#define VC 1
#define NHG 8
#define NKG 32
#define RED 2048
#define CT 64
#define HAS_MASK 1
#define MASK_ROUND 1
#define HAS_LEN 0
#define CAUSAL 0
#define WINDOW 0
#define KEY_MASK 0
#define SINK 0
#define SOFTCAP 0
#define EMPTY 1
#define NAN_ZERO 1
#define MGX_ATTN_BLOCK 1
#define MGX_ATTN_WARP 1
#define NW 8
#define VW 8
#define LPR 8
#define VB 4
#define MASK_ONE 1
#define K_EARLY 1
#define V_EARLY 1
#define VE 8
#define MGX_ATTN_LANES 1
#define LC 8
#define LU 8
#define QS 1
#define QN 9
#define QG 3
#define IDX int
#define KST 64
#define VST 64
#define KSH 1
#define VSH 1
#define QSH 1
#define MST 1
#define BRANCHLESS 0
#endif

#ifndef MGX_ATTN_LANES
#define MGX_ATTN_LANES 0
#endif
#ifndef BRANCHLESS
#define BRANCHLESS 0
#endif
#ifndef MGX_GRID_DEPENDENCY  // defined by programmatic_launch.PRELUDE when the source is built for PDL
#define MGX_GRID_DEPENDENCY()
#endif
#define MGX_INF __int_as_float(0x7f800000)
#define MGX_NAN __int_as_float(0x7fc00000)

__device__ __forceinline__ float mgx_f(float x) { return x; }
__device__ __forceinline__ float mgx_f(__half x) { return __half2float(x); }
__device__ __forceinline__ void mgx_put(float* p, float x) { *p = x; }
__device__ __forceinline__ void mgx_put(__half* p, float x) { *p = __float2half(x); }
// x rounded to the element type of the pointer's target (the mask rounded to q's type: MASK_ROUND)
__device__ __forceinline__ float mgx_round_to(float x, const float*) { return x; }
__device__ __forceinline__ float mgx_round_to(float x, const __half*) { return __half2float(__float2half(x)); }

template <int BYTES> struct mgx_word;
template <> struct mgx_word<16> { typedef uint4 type; };
template <> struct mgx_word<8> { typedef uint2 type; };
template <> struct mgx_word<4> { typedef unsigned int type; };
template <> struct mgx_word<2> { typedef unsigned short type; };

// V elements p[0], p[stride], ... as float; CONTIG: one aligned V * sizeof(E) byte load (stride 1)
template <typename E, int V, int CONTIG>
__device__ __forceinline__ void mgx_load(const E* p, long long stride, float* out) {
    if (CONTIG) {
        typedef typename mgx_word<V * sizeof(E)>::type W;
        const W w = *reinterpret_cast<const W*>(p);
        const E* e = reinterpret_cast<const E*>(&w);
#pragma unroll
        for (int i = 0; i < V; ++i) out[i] = mgx_f(e[i]);
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) out[i] = mgx_f(p[i * stride]);
    }
}

// V elements p[0], p[stride], ... as they are in memory, in one word (CONTIG: one aligned load)
template <typename E, int V, int CONTIG>
__device__ __forceinline__ typename mgx_word<V * sizeof(E)>::type mgx_load_word(const E* p, long long stride) {
    typedef typename mgx_word<V * sizeof(E)>::type W;
    if (CONTIG) return *reinterpret_cast<const W*>(p);
    W w;
    E* e = reinterpret_cast<E*>(&w);
#pragma unroll
    for (int i = 0; i < V; ++i) e[i] = p[i * stride];
    return w;
}

// The value of one output element from its row's statistics: running max m, sum l, bad flag and the
// accumulated a = sum_t exp(x_t - m) v_t; vrow = &v[b, kvh, 0, h] (read for EMPTY == 2 only).
__device__ __forceinline__ float mgx_finish(float m, float l, int bad, float a, long long n, const ST* sink,
                                            const T* vrow, long long P, long long vst) {
    if (bad) return NAN_ZERO ? 0.f : MGX_NAN;
#if SINK
    const float sv = SINK == 1 ? mgx_f(sink[n]) : 0.f;
    const float M = fmaxf(m, sv);
    const float e = m == -MGX_INF ? 0.f : expf(m - M);
    return a * e / (l * e + expf(sv - M));
#else
    if (m == -MGX_INF) {
#if EMPTY == 2
        float s = 0.f;
        for (long long t = 0; t < P; ++t) s += mgx_f(vrow[t * vst]);
        return s / (float)P;
#elif EMPTY == 1
        return 0.f;
#else
        return MGX_NAN;
#endif
    }
    return a / l;
#endif
}

// One logit: softcap(scale * q.k) plus the mask / bias value, in float32; a NaN or +inf result sets
// *nonfinite and gives -inf (the row is then bad: NAN_ZERO).
__device__ __forceinline__ float mgx_logit(float d, float add, float scale, float softcap, bool* nonfinite) {
    float y = d * scale;
#if SOFTCAP
    y = softcap * tanhf(y / softcap);
#endif
    y += add;
    if (y != y || y == MGX_INF) {
        *nonfinite = true;
        return -MGX_INF;
    }
    return y;
}

// The cache rows [a, e) that query position s of batch entry b sees: at most kv_len[b] (HAS_LEN), up to
// its position pos[b, s] (CAUSAL), the last W of those (WINDOW).
__device__ __forceinline__ void mgx_visible(long long b, long long s, long long P, const long long* kv_len,
                                            const long long* pos, long long psb, long long pss, long long W,
                                            long long* a, long long* e) {
    long long lo = 0, hi = P;
#if HAS_LEN
    if (kv_len[b] < hi) hi = kv_len[b];
#endif
#if CAUSAL || WINDOW
    const long long p = pos[b * psb + s * pss];
#endif
#if CAUSAL
    if (p + 1 < hi) hi = p + 1;
#endif
#if WINDOW
    if (p - W + 1 > lo) lo = p - W + 1;
#endif
    *a = lo;
    *e = hi;
}

// the kernels: mgx_attn_split, mgx_attn_warp and mgx_attn_lanes (operators/attention_gpu.py inlines these parts
// for NVRTC / hipRTC; nvcc / hipcc read them here), then mgx_attn_combine below
#include "decode_attention_block.cuh"
#include "decode_attention_warp.cuh"
#include "decode_attention_lanes.cuh"
// Merge the splits of one output row (blockIdx.x = (b * N + n) * S + s): m = max m_i, the sums and
// the accumulated values rescaled by exp(m_i - m); a row is bad when any split saw a bad logit.
extern "C" __global__ void __launch_bounds__(CT) mgx_attn_combine(
    const float* __restrict__ part, const T* __restrict__ v, const ST* __restrict__ sink, T* __restrict__ out,
    long long N, long long NKV, long long S, long long P, long long nsplit, long long vsb, long long vsk,
    long long vst, long long vsh, long long osb, long long osn, long long oss, long long osh) {
    const long long row = blockIdx.x;
    const long long s = row % S, n = (row / S) % N, b = row / (S * N), kvh = n / (N / NKV);
    const float* pr = part + row * nsplit * (HV + 3);
    float m = -MGX_INF, l = 0.f;
    int bd = 0;
    for (long long i = 0; i < nsplit; ++i) {
        m = fmaxf(m, pr[i * (HV + 3)]);
        bd |= pr[i * (HV + 3) + 2] != 0.f;
    }
    for (long long i = 0; i < nsplit; ++i) {
        const float mi = pr[i * (HV + 3)];
        if (mi != -MGX_INF) l += pr[i * (HV + 3) + 1] * expf(mi - m);
    }
    for (int h = threadIdx.x; h < HV; h += CT) {
        float a = 0.f;
        for (long long i = 0; i < nsplit; ++i) {
            const float mi = pr[i * (HV + 3)];
            if (mi != -MGX_INF) a += pr[i * (HV + 3) + 3 + h] * expf(mi - m);
        }
        mgx_put(out + b * osb + n * osn + s * oss + h * osh,
                mgx_finish(m, l, bd, a, n, sink, v + b * vsb + kvh * vsk + h * vsh, P, vst));
    }
}
