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

