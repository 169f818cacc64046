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

