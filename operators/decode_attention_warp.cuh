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

