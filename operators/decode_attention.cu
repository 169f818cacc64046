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

#if MGX_ATTN_BLOCK
extern "C" __global__ void __launch_bounds__(NT) mgx_attn_split(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const MT* __restrict__ mask,
    const unsigned char* __restrict__ key_mask, const long long* __restrict__ pos,
    const long long* __restrict__ kv_len, const ST* __restrict__ sink, T* __restrict__ out, float* __restrict__ part,
    long long N, long long NKV, long long S, long long P, long long TB, long long NRG, long long KPS, long long W,
    long long qsb, long long qsn, long long qss, long long qsh, long long ksb, long long ksk, long long kst,
    long long ksh, long long vsb, long long vsk, long long vst, long long vsh, long long msb, long long msn,
    long long mss, long long mst, long long kmsb, long long kmss, long long kmst, long long psb, long long pss,
    long long osb, long long osn, long long oss, long long osh, float scale, float softcap) {
    __shared__ float qs[ROWS][H];
    __shared__ float sc[ROWS][NT];
    __shared__ float red[RED];
    __shared__ float ms[ROWS], ls[ROWS], al[ROWS];
    __shared__ int bad[ROWS];
    __shared__ long long lo[ROWS], hi[ROWS], rn[ROWS], rs[ROWS];
#if HAS_MASK
    __shared__ long long moff[ROWS];
#endif
    __shared__ unsigned char seen[NT];
    __shared__ long long span[2];
    const int tid = threadIdx.x;
    const long long G = N / NKV, GS = G * S;
    long long bx = blockIdx.x;
    const long long rg = bx % NRG;
    bx /= NRG;
    const long long kvh = bx % NKV, b = bx / NKV;
    const long long nsplit = gridDim.y, sp = blockIdx.y, r0 = rg * ROWS;
    const int nrows = GS - r0 < ROWS ? (int)(GS - r0) : ROWS;

    // the block's query rows, and per row its head, position, visible key range and mask offset
    for (int i = tid; i < ROWS * H; i += NT) {
        const int r = i / H, h = i % H;
        float x = 0.f;
        if (r < nrows) {
            const long long rr = r0 + r;
            x = mgx_f(q[b * qsb + (kvh * G + rr / S) * qsn + (rr % S) * qss + h * qsh]);
        }
        qs[r][h] = x;
    }
    if (tid < ROWS) {
        const long long rr = r0 + tid, n = kvh * G + rr / S, s = rr % S;
        long long a = P, e = 0;
        if (tid < nrows) mgx_visible(b, s, P, kv_len, pos, psb, pss, W, &a, &e);
        lo[tid] = a;
        hi[tid] = e;
        rn[tid] = tid < nrows ? n : 0;
        rs[tid] = tid < nrows ? s : 0;
#if HAS_MASK
        moff[tid] = tid < nrows ? b * msb + n * msn + s * mss : 0;
#endif
        ms[tid] = -MGX_INF;
        ls[tid] = 0.f;
        bad[tid] = 0;
    }
    __syncthreads();
    if (tid == 0) {  // this split's keys, cut to the union of the rows' visible ranges
        long long a = sp * KPS, e = a + KPS, ulo = P, uhi = 0;
        if (e > P) e = P;
        for (int r = 0; r < nrows; ++r) {
            if (lo[r] < ulo) ulo = lo[r];
            if (hi[r] > uhi) uhi = hi[r];
        }
        span[0] = a > ulo ? a : ulo;
        span[1] = e < uhi ? e : uhi;
    }
    __syncthreads();
    const long long t0 = span[0], t1 = span[1];
    const int kg = tid / NHG, hg = tid % NHG;
    const int rr = tid / TPR, ri = tid % TPR;
    float acc[ROWS][VV];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int i = 0; i < VV; ++i) acc[r][i] = 0.f;

    for (long long c0 = t0; c0 < t1; c0 += NT) {
        {  // 1. scores of key t for every row
            const long long t = c0 + tid;
            float x[ROWS];
            unsigned vm = 0;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                x[r] = 0.f;
                if (t < t1 && t >= lo[r] && t < hi[r]) {
                    bool ok = true;
#if KEY_MASK
                    ok = key_mask[b * kmsb + rs[r] * kmss + t * kmst] != 0;
#endif
#if HAS_MASK
                    if (ok && t < TB) {
                        float mv = mgx_f(mask[moff[r] + t * mst]);
#if MASK_ROUND
                        mv = mgx_round_to(mv, q);
#endif
                        if (mv == -MGX_INF) ok = false;
                        else x[r] = mv;
                    }
#endif
                    if (ok) vm |= 1u << r;
                }
            }
            if (vm) {
                float d[ROWS];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) d[r] = 0.f;
                const T* kp = k + b * ksb + kvh * ksk + t * kst;
                for (int h = 0; h < H; h += VK) {
                    float kv[VK];
                    mgx_load<T, VK, KC>(kp + h * ksh, ksh, kv);
#pragma unroll
                    for (int r = 0; r < ROWS; ++r)
#pragma unroll
                        for (int i = 0; i < VK; ++i) d[r] += qs[r][h + i] * kv[i];
                }
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    float y = -MGX_INF;
                    if (vm >> r & 1u) {
                        bool nonfinite = false;
                        y = mgx_logit(d[r], x[r], scale, softcap, &nonfinite);
                        if (nonfinite) bad[r] = 1;
                    }
                    x[r] = y;
                }
            } else {
#pragma unroll
                for (int r = 0; r < ROWS; ++r) x[r] = -MGX_INF;
            }
#pragma unroll
            for (int r = 0; r < ROWS; ++r) sc[r][tid] = x[r];
            seen[tid] = vm != 0;
        }
        __syncthreads();
        {  // 2. per row: the running max, the weights p = exp(x - m) and the running sum
            float mx = -MGX_INF;
            if (rr < ROWS)
                for (int j = ri; j < NT; j += TPR) mx = fmaxf(mx, sc[rr][j]);
            red[tid] = mx;
        }
        __syncthreads();
        for (int w = TPR / 2; w > 0; w >>= 1) {
            if (rr < ROWS && ri < w) red[tid] = fmaxf(red[tid], red[tid + w]);
            __syncthreads();
        }
        if (tid < ROWS) {
            const float mo = ms[tid], mn = fmaxf(mo, red[tid * TPR]);
            al[tid] = mo == -MGX_INF ? 0.f : expf(mo - mn);
            ms[tid] = mn;
        }
        __syncthreads();
        {
            float s = 0.f;
            if (rr < ROWS) {
                const float m = ms[rr];
                for (int j = ri; j < NT; j += TPR) {
                    const float xj = sc[rr][j];
                    const float p = xj == -MGX_INF ? 0.f : expf(xj - m);
                    sc[rr][j] = p;
                    s += p;
                }
            }
            red[tid] = s;
        }
        __syncthreads();
        for (int w = TPR / 2; w > 0; w >>= 1) {
            if (rr < ROWS && ri < w) red[tid] += red[tid + w];
            __syncthreads();
        }
        if (tid < ROWS) ls[tid] = ls[tid] * al[tid] + red[tid * TPR];
        if (kg < NKG) {  // 3. values
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                const float f = al[r];
#pragma unroll
                for (int i = 0; i < VV; ++i) acc[r][i] *= f;
            }
            for (int j = kg; j < NT; j += NKG) {
                if (!seen[j]) continue;
                float vv[VV];
                mgx_load<T, VV, VC>(v + b * vsb + kvh * vsk + (c0 + j) * vst + (long long)hg * VV * vsh, vsh, vv);
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    const float wt = sc[r][j];
                    if (wt != 0.f) {
#pragma unroll
                        for (int i = 0; i < VV; ++i) acc[r][i] += wt * vv[i];
                    }
                }
            }
        }
        __syncthreads();
    }

    // the key groups' sums per row, then the output (one split) or this split's partial row
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        if (kg < NKG) {
#pragma unroll
            for (int i = 0; i < VV; ++i) red[kg * HV + hg * VV + i] = acc[r][i];
        }
        __syncthreads();
        if (r < nrows) {
            const long long n = rn[r], s = rs[r];
            for (int h = tid; h < HV; h += NT) {
                float a = 0.f;
                for (int g = 0; g < NKG; ++g) a += red[g * HV + h];
                if (nsplit > 1) {
                    float* pr = part + (((b * N + n) * S + s) * nsplit + sp) * (HV + 3);
                    if (h == 0) {
                        pr[0] = ms[r];
                        pr[1] = ls[r];
                        pr[2] = (float)bad[r];
                    }
                    pr[3 + h] = a;
                } else {
                    mgx_put(out + b * osb + n * osn + s * oss + h * osh,
                            mgx_finish(ms[r], ls[r], bad[r], a, n, sink, v + b * vsb + kvh * vsk + h * vsh, P, vst));
                }
            }
        }
        __syncthreads();
    }
}

#endif  // MGX_ATTN_BLOCK

#if MGX_ATTN_WARP || MGX_ATTN_LANES
// mgx_attn_warp: the same attention for a block that holds every query row of its KV head (ROWS = G * S,
// at most 16), with 32-lane groups ("warps"; on AMD a 64-wide wavefront is two of them: every shuffle
// has width 32) owning the keys.  Block (b, KV head, split) has NW warps; warp w takes a contiguous
// range of the split's visible keys and walks it 32 keys at a time, lane j on key c0 + j:
//   1. lane j decides per row whether its key is visible (lengths, causal, window, key mask, mask value;
//      MASK_ONE: one mask row for all rows, read once per key), reads the K row once (VK-element loads;
//      K_EARLY: in flight together with the mask values) and forms every row's logit x = softcap(scale * q.k) + mask (a NaN or +inf logit marks the row bad);
//   2. per row: the warp's max of the 32 logits by xor shuffles joins the running max m (the lane's
//      partial sum and the accumulated values are rescaled), p = exp(x - m) joins the lane's sum;
//   3. values: lane (kq, cg) owns VV value columns (LPR = HV / VV lanes per V row, 32 / LPR keys at a
//      time); key c0 + j's weights come from lane j by shuffle; a zero weight adds nothing (non-finite
//      values of hidden keys never leak).  V_EARLY: the lane's V rows of the step (keys c0 + kq +
//      u * 32 / LPR, u < VE, inside the warp's range, so inside the cache) were loaded into registers
//      (as stored: VE * VV elements of T) before step 1, so the V reads overlap the K / mask reads
//      instead of waiting for the weights; keys past VE * 32 / LPR (none under the planner's VE) are
//      loaded as without it.  Else VB V rows are loaded, once their weights are known, before they are
//      added, VB * 32 / LPR keys a round.
// The memory chain of a step is then q / pos -> barrier -> K, mask, V rows -> scores, softmax, sums
// (V_EARLY; without it the V reads follow the softmax).
// No barrier inside the key loop: the warps meet once at the end, in shared memory, where the block
// merges their (m, l, bad, acc) rows as mgx_attn_combine merges splits, then writes the output (one
// split) or this split's partial row.
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(__HIPCC_RTC__)
#define MGX_SHFL_XOR(v, o) __shfl_xor((v), (o), 32)
#define MGX_SHFL(v, l) __shfl((v), (l), 32)
#else
#define MGX_SHFL_XOR(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
#define MGX_SHFL(v, l) __shfl_sync(0xffffffffu, (v), (l))
#endif

__device__ __forceinline__ float mgx_warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, MGX_SHFL_XOR(x, o));
    return x;
}
__device__ __forceinline__ float mgx_warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += MGX_SHFL_XOR(x, o);
    return x;
}
__device__ __forceinline__ int mgx_warp_or(int x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x |= MGX_SHFL_XOR(x, o);
    return x;
}
#endif  // MGX_ATTN_WARP || MGX_ATTN_LANES

#if MGX_ATTN_WARP

// d[r] = q[r] . k over the H columns of one K row (VK-element loads)
__device__ __forceinline__ void mgx_warp_dot(const T* kp, long long ksh, const float (*qs)[H], float* d) {
#pragma unroll
    for (int h = 0; h < H; h += VK) {
        float kv[VK];
        mgx_load<T, VK, KC>(kp + h * ksh, ksh, kv);
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int i = 0; i < VK; ++i) d[r] += qs[r][h + i] * kv[i];
    }
}

// Step 1 for lane key t of a warp: the visible rows (bit r of the result) and their logits x[r]
// (-inf for the others); bad rows set in *bad.  K_EARLY: the K row of a key inside some row's range is
// loaded together with the mask values, before either is looked at (two reads in flight at once, the
// K row read even when the mask hides the key: its logit is then dropped); else only for a key the mask
// leaves visible, once the mask values are in.
__device__ __forceinline__ unsigned mgx_warp_scores(
    const T* __restrict__ k, const MT* __restrict__ mask, const unsigned char* __restrict__ key_mask,
    const float (*qs)[H], const long long* lo, const long long* hi, const long long* moff, long long t,
    bool live, long long b, long long S, long long TB, const T* kp, long long ksh, long long mst,
    long long kmsb, long long kmss, long long kmst, float scale, float softcap, float* x, int* bad) {
    unsigned in = 0;  // rows whose range (and key mask) hold key t
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        bool ok = live && t >= lo[r] && t < hi[r];
#if KEY_MASK
        if (ok) ok = key_mask[b * kmsb + (r % S) * kmss + t * kmst] != 0;
#endif
        in |= (unsigned)ok << r;
    }
    float d[ROWS], add[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) d[r] = add[r] = 0.f;
    unsigned vm = in;  // ... and the mask leaves visible
#if HAS_MASK
    const bool mt = t < TB;
    float mv[ROWS];
#if MASK_ONE  // one mask row for every row of the block: one read per key
    const float m0 = in && mt ? mgx_f(mask[moff[0] + t * mst]) : 0.f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) mv[r] = m0;
#else
#pragma unroll
    for (int r = 0; r < ROWS; ++r) mv[r] = (in >> r & 1u) && mt ? mgx_f(mask[moff[r] + t * mst]) : 0.f;
#endif
#if K_EARLY
    if (in) mgx_warp_dot(kp, ksh, qs, d);
#endif
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        if ((in >> r & 1u) && mt) {
#if MASK_ROUND
            add[r] = mgx_round_to(mv[r], k);
#else
            add[r] = mv[r];
#endif
            if (add[r] == -MGX_INF) vm &= ~(1u << r);
        }
    }
#if !K_EARLY
    if (vm) mgx_warp_dot(kp, ksh, qs, d);
#endif
#else
    if (in) mgx_warp_dot(kp, ksh, qs, d);
#endif
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        float y = -MGX_INF;
        if (vm >> r & 1u) {
            bool nonfinite = false;
            y = mgx_logit(d[r], add[r], scale, softcap, &nonfinite);
            if (nonfinite) *bad |= 1 << r;
        }
        x[r] = y;
    }
    return vm;
}

// Step 3: acc[r][i] += p_j[r] * v[c0 + j][cg * VV + i] over the keys j0 .. cnt - 1 of the step, lane kq
// taking keys j0 + kq, j0 + kq + 32 / LPR, ...; vrow = &v[b, kvh, c0, cg * VV].
__device__ __forceinline__ void mgx_warp_values(const T* vrow, long long vst, long long vsh, int j00, int cnt,
                                                int kq, const float* p, float (*acc)[VV]) {
    constexpr int KPI = 32 / LPR;  // keys per iteration of the warp
    for (int j0 = j00; j0 < cnt; j0 += VB * KPI) {
        float pj[VB][ROWS], vv[VB][VV];
#pragma unroll
        for (int u = 0; u < VB; ++u) {
            const int j = j0 + u * KPI + kq;
            bool need = false;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                const float w = MGX_SHFL(p[r], j & 31);
                pj[u][r] = j < cnt ? w : 0.f;
                need |= pj[u][r] != 0.f;
            }
            // an unneeded row reads the step's first value row again (cached, never added)
            const T* vp = vrow + (need ? j : 0) * vst;
#pragma unroll
            for (int i = 0; i < VV; i += VW) mgx_load<T, VW, VC>(vp + i * vsh, vsh, vv[u] + i);
        }
#pragma unroll
        for (int u = 0; u < VB; ++u)
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
                if (pj[u][r] != 0.f) {
#pragma unroll
                    for (int i = 0; i < VV; ++i) acc[r][i] += pj[u][r] * vv[u][i];
                }
    }
}

#if V_EARLY
typedef typename mgx_word<VW * sizeof(T)>::type mgx_vword;  // VW value elements as stored

// V_EARLY, before step 1: lane kq's V rows of the step, keys kq + u * 32 / LPR (u < VE), as stored; a
// key at or past cnt reads the step's first row again (inside the warp's range: cached, never added).
__device__ __forceinline__ void mgx_warp_v_early(const T* vrow, long long vst, long long vsh, int cnt, int kq,
                                                 mgx_vword (*vr)[VV / VW]) {
    constexpr int KPI = 32 / LPR;
#pragma unroll
    for (int u = 0; u < VE; ++u) {
        const int j = u * KPI + kq;
        const T* vp = vrow + (j < cnt ? j : 0) * vst;
#pragma unroll
        for (int c = 0; c < VV / VW; ++c) vr[u][c] = mgx_load_word<T, VW, VC>(vp + c * VW * vsh, vsh);
    }
}

// Step 3 over the held rows (V_EARLY): the sums of mgx_warp_values for the keys 0 .. min(cnt, VE * 32 / LPR) - 1
__device__ __forceinline__ void mgx_warp_values_held(const mgx_vword (*vr)[VV / VW], int cnt, int kq,
                                                     const float* p, float (*acc)[VV]) {
    constexpr int KPI = 32 / LPR;
#pragma unroll
    for (int u = 0; u < VE; ++u) {
        if (u * KPI >= cnt) break;  // uniform in the warp
        const int j = u * KPI + kq;
        float pj[ROWS];
        bool need = false;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float w = MGX_SHFL(p[r], j & 31);
            pj[r] = j < cnt ? w : 0.f;
            need |= pj[r] != 0.f;
        }
        if (!need) continue;
        const T* e = reinterpret_cast<const T*>(vr[u]);
        float vv[VV];
#pragma unroll
        for (int i = 0; i < VV; ++i) vv[i] = mgx_f(e[i]);
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
            if (pj[r] != 0.f) {
#pragma unroll
                for (int i = 0; i < VV; ++i) acc[r][i] += pj[r] * vv[i];
            }
    }
}
#endif

// V_EARLY holds a step's V rows next to its K rows: one block per SM (these grids are B * NKV * splits blocks)
// lets ptxas give them registers instead of spilling under the 128 it aims at for two blocks of 256 threads.
#if V_EARLY
#define MGX_WARP_BOUNDS __launch_bounds__(NT, 1)
#else
#define MGX_WARP_BOUNDS __launch_bounds__(NT)
#endif

extern "C" __global__ void MGX_WARP_BOUNDS mgx_attn_warp(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const MT* __restrict__ mask,
    const unsigned char* __restrict__ key_mask, const long long* __restrict__ pos,
    const long long* __restrict__ kv_len, const ST* __restrict__ sink, T* __restrict__ out, float* __restrict__ part,
    long long N, long long NKV, long long S, long long P, long long TB, long long NRG, long long KPS, long long W,
    long long qsb, long long qsn, long long qss, long long qsh, long long ksb, long long ksk, long long kst,
    long long ksh, long long vsb, long long vsk, long long vst, long long vsh, long long msb, long long msn,
    long long mss, long long mst, long long kmsb, long long kmss, long long kmst, long long psb, long long pss,
    long long osb, long long osn, long long oss, long long osh, float scale, float softcap) {
    __shared__ float qs[ROWS][H];
    __shared__ long long lo[ROWS], hi[ROWS], moff[ROWS];
    __shared__ float wm[NW][ROWS], wl[NW][ROWS];
    __shared__ int wb[NW];
    __shared__ float wa[NW][ROWS][HV];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const long long G = N / NKV, kvh = blockIdx.x % NKV, b = blockIdx.x / NKV;
    const long long nsplit = gridDim.y, sp = blockIdx.y;

    // the query rows (r = g * S + s: head kvh * G + g, position s) and per row its visible keys
    for (int i = tid; i < ROWS * H; i += NT) {
        const int r = i / H, h = i % H;
        qs[r][h] = mgx_f(q[b * qsb + (kvh * G + r / S) * qsn + (r % S) * qss + h * qsh]);
    }
    if (tid < ROWS) {
        const long long n = kvh * G + tid / S, s = tid % S;
        long long a, e;
        mgx_visible(b, s, P, kv_len, pos, psb, pss, W, &a, &e);
        lo[tid] = a;
        hi[tid] = e;
        moff[tid] = b * msb + n * msn + s * mss;
    }
    __syncthreads();

    // this split's keys cut to the rows' visible ranges, then warp w's contiguous share of them
    long long t0 = sp * KPS, t1 = t0 + KPS, ulo = P, uhi = 0;
    if (t1 > P) t1 = P;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        ulo = lo[r] < ulo ? lo[r] : ulo;
        uhi = hi[r] > uhi ? hi[r] : uhi;
    }
    t0 = t0 > ulo ? t0 : ulo;
    t1 = t1 < uhi ? t1 : uhi;
    const long long per = t1 > t0 ? (t1 - t0 + NW - 1) / NW : 0;
    const long long w0 = t0 + w * per, w1 = w0 + per < t1 ? w0 + per : t1;
    const int kq = lane / LPR, cg = lane % LPR;
    float m[ROWS], l[ROWS], acc[ROWS][VV];
    int bad = 0;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        m[r] = -MGX_INF;
        l[r] = 0.f;
#pragma unroll
        for (int i = 0; i < VV; ++i) acc[r][i] = 0.f;
    }
    for (long long c0 = w0; c0 < w1; c0 += 32) {  // trip count and branches below uniform in the warp
        const long long t = c0 + lane;
        const int cnt = w1 - c0 < 32 ? (int)(w1 - c0) : 32;
        const T* vrow = v + b * vsb + kvh * vsk + c0 * vst + (long long)cg * VV * vsh;
#if V_EARLY
        mgx_vword vr[VE][VV / VW];
        mgx_warp_v_early(vrow, vst, vsh, cnt, kq, vr);
#endif
        float x[ROWS];
        const unsigned vm = mgx_warp_scores(k, mask, key_mask, qs, lo, hi, moff, t, lane < cnt, b, S, TB,
                                            k + b * ksb + kvh * ksk + t * kst, ksh, mst, kmsb, kmss, kmst, scale,
                                            softcap, x, &bad);
        if (!mgx_warp_or((int)vm)) continue;
        float p[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float cm = mgx_warp_max(x[r]);
            p[r] = 0.f;
            if (cm == -MGX_INF) continue;
            const float mn = fmaxf(m[r], cm), al = m[r] == -MGX_INF ? 0.f : expf(m[r] - mn);
            m[r] = mn;
            l[r] *= al;
#pragma unroll
            for (int i = 0; i < VV; ++i) acc[r][i] *= al;
            p[r] = x[r] == -MGX_INF ? 0.f : expf(x[r] - mn);
            l[r] += p[r];
        }
#if V_EARLY
        mgx_warp_values_held(vr, cnt, kq, p, acc);
        if (cnt > VE * (32 / LPR)) mgx_warp_values(vrow, vst, vsh, VE * (32 / LPR), cnt, kq, p, acc);
#else
        mgx_warp_values(vrow, vst, vsh, 0, cnt, kq, p, acc);
#endif
    }

    // the warp's rows: lanes' sums and bad flags, key groups' values; then the warps' rows merged
    bad = mgx_warp_or(bad);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        l[r] = mgx_warp_sum(l[r]);
#pragma unroll
        for (int o = LPR; o < 32; o <<= 1)
#pragma unroll
            for (int i = 0; i < VV; ++i) acc[r][i] += MGX_SHFL_XOR(acc[r][i], o);
    }
    if (lane == 0) {
        wb[w] = bad;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            wm[w][r] = m[r];
            wl[w][r] = l[r];
        }
    }
    if (lane < LPR) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int i = 0; i < VV; ++i) wa[w][r][cg * VV + i] = acc[r][i];
    }
    __syncthreads();
    for (int e = tid; e < ROWS * HV; e += NT) {
        const int r = e / HV, h = e % HV;
        float M = -MGX_INF, L = 0.f, A = 0.f;
        int bd = 0;
        for (int i = 0; i < NW; ++i) {
            M = fmaxf(M, wm[i][r]);
            bd |= wb[i] >> r & 1;
        }
        for (int i = 0; i < NW; ++i) {
            const float mi = wm[i][r];
            if (mi != -MGX_INF) {
                const float f = expf(mi - M);
                L += wl[i][r] * f;
                A += wa[i][r][h] * f;
            }
        }
        const long long n = kvh * G + r / S, s = r % S;
        if (nsplit > 1) {
            float* pr = part + (((b * N + n) * S + s) * nsplit + sp) * (HV + 3);
            if (h == 0) {
                pr[0] = M;
                pr[1] = L;
                pr[2] = (float)bd;
            }
            pr[3 + h] = A;
        } else {
            mgx_put(out + b * osb + n * osn + s * oss + h * osh,
                    mgx_finish(M, L, bd, A, n, sink, v + b * vsb + kvh * vsk + h * vsh, P, vst));
        }
    }
}
#endif  // MGX_ATTN_WARP

#if MGX_ATTN_LANES
// mgx_attn_lanes: one block per query row (b, n, s) and split, NW warps, each walking a contiguous share of the
// split's visible keys.  A warp takes 32 / LC keys at a time: lane (g, c) = (lane / LC, lane % LC) holds VK of the
// row's H query columns (c * VK ..) in registers, forms the partial dot product with those columns of key
// c0 + g's K row, and the LC lanes of a key add their parts by xor shuffles; then it adds p * V for the same
// columns of that key's V row.  LU such steps make a chunk whose logits are held together: the chunk's max over the
// warp joins the running max m (warp-uniform), the lane's sum l and its VK accumulated values are rescaled once per
// chunk.  At the end the key groups' sums are added across the warp, the warps' (m, l, bad, acc) rows are merged in
// shared memory as mgx_attn_warp does, and the block writes the output row or its split's partial row.  Each
// lane's work per key is VK multiply-adds for the scores and VK for the values, instead of H and HV.
// Reads LC (lanes per key, a power of two: H = HV = LC * VK), LU, NW, NT, VK, KC (K / V rows contiguous, loads of VK
// elements), QS / QN / QG (the planned S, N and N / NKV), IDX (the offsets' type), KST / VST / KSH / VSH / QSH / MST
// (the planned row and column strides of K, V, q and the mask: the runtime ones are checked equal), BRANCHLESS (1: no
// branch skips a chunk or a warp without a visible key; exp(-inf) = 0 gives them zero weight instead, so that nothing
// keeps the compiler from issuing the V reads with the K reads), and the options of the other kernels (mask,
// lengths, causal, window, key mask, sink, softcap, empty / bad rows).
extern "C" __global__ void __launch_bounds__(NT) mgx_attn_lanes(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const MT* __restrict__ mask,
    const unsigned char* __restrict__ key_mask, const long long* __restrict__ pos,
    const long long* __restrict__ kv_len, const ST* __restrict__ sink, T* __restrict__ out, float* __restrict__ part,
    long long N, long long NKV, long long S, long long P, long long TB, long long NRG, long long KPS, long long W,
    long long qsb, long long qsn, long long qss, long long qsh, long long ksb, long long ksk, long long kst,
    long long ksh, long long vsb, long long vsk, long long vst, long long vsh, long long msb, long long msn,
    long long mss, long long mst, long long kmsb, long long kmss, long long kmst, long long psb, long long pss,
    long long osb, long long osn, long long oss, long long osh, float scale, float softcap) {
    constexpr int KPI = 32 / LC;  // keys per warp step
    __shared__ float lm[NW], ll[NW];
    __shared__ int lb[NW];
    __shared__ float la[NW][HV];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane / LC, c = lane % LC;
    // Offsets in IDX (int where the planner found every offset below 2^31) and the row's indices from the
    // planned sizes QS, QN, QG (constants: no divisions): the fewer instructions a warp issues before its loads,
    // the sooner they are in flight.
    const unsigned row = blockIdx.x, s = row % QS, n = row / QS % QN, b = row / (QS * QN), kvh = n / QG;
    const int nsplit = gridDim.y, sp = blockIdx.y;
    const IDX Kst = KST, Vst = VST, Ksh = KSH, Vsh = VSH, Qsh = QSH, Mst = MST;  // planned strides: immediates
    MGX_GRID_DEPENDENCY();
    const T* qp = q + (IDX)(b * (IDX)qsb + n * (IDX)qsn + s * (IDX)qss + c * VK * Qsh);
    float qr[VK];
#pragma unroll
    for (int i = 0; i < VK; ++i) qr[i] = mgx_f(qp[i * Qsh]);
    long long lo64, hi64;
    mgx_visible(b, s, P, kv_len, pos, psb, pss, W, &lo64, &hi64);
    // the visible range cut to [0, P] in 64 bits before it is narrowed to IDX: a position or length past 32 bits
    // then hides keys as it does in 64 bits instead of showing those its low bits name
    const IDX lo = (IDX)(lo64 < P ? lo64 : P), hi = (IDX)(hi64 > 0 ? hi64 : 0), Kps = KPS, Pn = P;
    IDX t0 = sp * Kps, t1 = t0 + Kps < Pn ? t0 + Kps : Pn;
    t0 = t0 > lo ? t0 : lo;
    t1 = t1 < hi ? t1 : hi;
    const IDX per = t1 > t0 ? (t1 - t0 + NW - 1) / NW : 0;
    const IDX w0 = t0 + w * per, w1 = w0 + per < t1 ? w0 + per : t1, Tb = TB;
    const T* kb = k + (IDX)(b * (IDX)ksb + kvh * (IDX)ksk + c * VK * Ksh);
    const T* vb = v + (IDX)(b * (IDX)vsb + kvh * (IDX)vsk + c * VK * Vsh);
    float m = -MGX_INF, l = 0.f, acc[VK];
#pragma unroll
    for (int i = 0; i < VK; ++i) acc[i] = 0.f;
    int bad = 0;
    typedef typename mgx_word<VK * sizeof(T)>::type Word;
    // the lane's K / V rows and mask value of its first key, a step (KPI keys) apart, and the share's first rows
    // (read for a key past the share, never added)
    const T *kp = kb + (w0 + g) * Kst, *vp = vb + (w0 + g) * Vst, *k_first = kb + w0 * Kst, *v_first = vb + w0 * Vst;
    const MT* mp = mask + (IDX)(b * (IDX)msb + n * (IDX)msn + s * (IDX)mss) + (w0 + g) * Mst;  // (HAS_MASK)
    for (IDX c0 = w0; c0 < w1; c0 += LU * KPI, kp += LU * KPI * Kst, vp += LU * KPI * Vst, mp += LU * KPI * Mst) {
        // trip count and branches below uniform in the warp.  The chunk's reads first, all in flight together:
        // K and V rows as stored, mask and key mask values
        Word kw[LU], vw[LU];
        float add[LU];
        bool ok[LU];
#pragma unroll
        for (int u = 0; u < LU; ++u) {
            const IDX t = c0 + u * KPI + g;
            ok[u] = t < w1;
            kw[u] = mgx_load_word<T, VK, KC>(ok[u] ? kp + u * KPI * Kst : k_first, Ksh);
            vw[u] = mgx_load_word<T, VK, KC>(ok[u] ? vp + u * KPI * Vst : v_first, Vsh);
#if KEY_MASK
            const bool shown = key_mask[(IDX)(b * (IDX)kmsb + s * (IDX)kmss) + (ok[u] ? t : w0) * (IDX)kmst] != 0;
            ok[u] = ok[u] && shown;
#endif
            add[u] = 0.f;
#if HAS_MASK
            if (ok[u] && t < Tb) add[u] = mgx_f(mp[u * KPI * Mst]);
#endif
        }
        float x[LU], cm = -MGX_INF;
#pragma unroll
        for (int u = 0; u < LU; ++u) {
            const T* ke = reinterpret_cast<const T*>(&kw[u]);
            float d = 0.f;
#pragma unroll
            for (int i = 0; i < VK; ++i) d += qr[i] * mgx_f(ke[i]);
#pragma unroll
            for (int o = 1; o < LC; o <<= 1) d += MGX_SHFL_XOR(d, o);
            float a = add[u];
#if HAS_MASK && MASK_ROUND
            a = mgx_round_to(a, k);
#endif
            float y = -MGX_INF;
            if (ok[u] && a != -MGX_INF) {
                bool nonfinite = false;
                y = mgx_logit(d, a, scale, softcap, &nonfinite);
                if (nonfinite) bad = 1;
            }
            x[u] = y;
            cm = fmaxf(cm, y);
        }
#pragma unroll
        for (int o = LC; o < 32; o <<= 1) cm = fmaxf(cm, MGX_SHFL_XOR(cm, o));
#if BRANCHLESS  // a chunk without a visible key is not skipped: m stays -inf, its weights are exp(-inf) = 0
        const float mn = fmaxf(m, cm), al = m == -MGX_INF ? 0.f : expf(m - mn), ms = mn == -MGX_INF ? 0.f : mn;
#else
        if (cm == -MGX_INF) continue;
        const float mn = fmaxf(m, cm), al = m == -MGX_INF ? 0.f : expf(m - mn);
#endif
        m = mn;
        l *= al;
#pragma unroll
        for (int i = 0; i < VK; ++i) acc[i] *= al;
#pragma unroll
        for (int u = 0; u < LU; ++u) {
#if BRANCHLESS
            const float p = expf(x[u] - ms);
#else
            const float p = x[u] == -MGX_INF ? 0.f : expf(x[u] - m);
#endif
            l += p;
            // a zero weight adds nothing: non-finite values of hidden keys never leak (a select, not a branch,
            // so that the V reads stay at the top of the chunk instead of sinking below the scores)
            const T* ve = reinterpret_cast<const T*>(&vw[u]);
#pragma unroll
            for (int i = 0; i < VK; ++i) acc[i] += p != 0.f ? p * mgx_f(ve[i]) : 0.f;
        }
    }
    // the key groups' sums (l is the same in the LC lanes of a key group: counted once per group)
    bad = mgx_warp_or(bad);
#pragma unroll
    for (int o = LC; o < 32; o <<= 1) {
        l += MGX_SHFL_XOR(l, o);
#pragma unroll
        for (int i = 0; i < VK; ++i) acc[i] += MGX_SHFL_XOR(acc[i], o);
    }
    if (lane == 0) {
        lm[w] = m;
        ll[w] = l;
        lb[w] = bad;
    }
    if (g == 0) {
#pragma unroll
        for (int i = 0; i < VK; ++i) la[w][c * VK + i] = acc[i];
    }
    __syncthreads();
    for (int h = tid; h < HV; h += NT) {
        float M = -MGX_INF, L = 0.f, A = 0.f;
        int bd = 0;
#pragma unroll
        for (int i = 0; i < NW; ++i) {
            M = fmaxf(M, lm[i]);
            bd |= lb[i];
        }
#if BRANCHLESS  // a warp that saw no key has m = -inf, l = 0 and zero values: its weight exp(-inf) = 0
        const float Ms = M == -MGX_INF ? 0.f : M;
#pragma unroll
        for (int i = 0; i < NW; ++i) {
            const float f = expf(lm[i] - Ms);
            L += ll[i] * f;
            A += la[i][h] * f;
        }
#else
#pragma unroll
        for (int i = 0; i < NW; ++i)
            if (lm[i] != -MGX_INF) {
                const float f = expf(lm[i] - M);
                L += ll[i] * f;
                A += la[i][h] * f;
            }
#endif
        if (nsplit > 1) {
            float* pr = part + (IDX)((((IDX)b * QN + n) * QS + s) * nsplit + sp) * (HV + 3);
            if (h == 0) {
                pr[0] = M;
                pr[1] = L;
                pr[2] = (float)bd;
            }
            pr[3 + h] = A;
        } else {
            mgx_put(out + (IDX)(b * (IDX)osb + n * (IDX)osn + s * (IDX)oss + h * (IDX)osh),
                    mgx_finish(M, L, bd, A, n, sink, v + (IDX)(b * (IDX)vsb + kvh * (IDX)vsk + h * Vsh), P, vst));
        }
    }
}
#endif  // MGX_ATTN_LANES

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
