/*
 * executor/cuda/mla_step.cuh - the math of one KV block for one warp of the MLA decode
 * executor, shared by the lock-step item loop (mla_decode.cuh) and the warp-specialised
 * math warps (mla_ws.cuh): scores, online softmax, P.V, and the item's row write.  The caller owns the barriers between the three (the two halves of a warp pair
 * swap row maxima through shared memory between scores and softmax, and P goes through
 * shared memory between softmax and P.V).
 *
 * Warp w of a pair (wh = w % 2) covers 16 rows (the pair's row group, shared-memory rows
 * wp * 16 ..) x the wh-th 16 tokens of a 32-token block for the scores, and the wh-th 256
 * of the 512 output dims for P.V.  Thread fragments: lane = 4 g + q4 holds rows g and
 * g + 8.  Online softmax in the log2 domain (FlashAttention-2, Dao 2023): masked logits
 * are -inf; a row with all keys masked so far keeps m = -inf, l = 0, O = 0.
 * mma.sync m16n8k16 with fp32 accumulation; ldmatrix fragments double-buffered a step
 * ahead so their latency hides behind the previous mma (asm volatile keeps the order).
 */
#pragma once

#include "executor/cuda/mla_common.cuh"

namespace fimla {

/* Key bounds [lo, hi] (request-local tokens, inclusive) of this thread's rows rg * 16 + g
 * and + 8 of item `it`: the item's KV range cut by the causal diagonal (a query row at
 * position kv_len - q_len + q sees keys <= its position) and by window_left; a row past
 * M gets the empty range [0, -1]. */
__device__ __forceinline__ void row_key_bounds(const RunCtx &ctx, const fi_work_item &it,
                                               const fi_request_info &rq, int nh, int M, int rg,
                                               int g, int lo[2], int hi[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = rg * 16 + g + 8 * i;
        if (r < M) {
            const int pos = rq.kv_len - rq.q_len + it.q_begin + r / nh;
            const int h_ = ctx.causal ? pos : rq.kv_len - 1;
            const int l_ = ctx.window_left >= 0 ? max(0, pos - ctx.window_left) : 0;
            lo[i] = max(l_, it.kv_begin);
            hi[i] = min(h_, it.kv_end - 1);
        } else {
            lo[i] = 0;
            hi[i] = -1;
        }
    }
}

/* Scores of this warp's 16 rows x 16 tokens of the block in `stage` ([32][kPitch]):
 * s[0][n][e] = bmm1 * log2(e) * q.k, -inf outside the rows' key bounds [lo, hi]; the
 * rows' maxima go to sMax[wh * kRows + wp * 16 + row] (lanes with q4 == 0).
 * sQ_a: this lane's ldmatrix address in the tile's Q rows; t0: the block's first token. */
template <typename T>
__device__ __forceinline__ void step_scores(const T *stage, uint32_t sQ_a, int wh, int wp, int lane,
                                            int t0, const int lo[2], const int hi[2],
                                            float scale_log2, float s[2][2][4], float *sMax) {
    const int g = lane >> 2, q4 = lane & 3;
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int n = 0; n < 2; ++n)
            s[a][n][0] = s[a][n][1] = s[a][n][2] = s[a][n][3] = 0.f;
    /* B rows: tokens wh*16 + (lane>>4)*8 + (lane&7), k offset ((lane>>3)&1)*8. */
    const int kr = wh * 16 + (lane >> 4) * 8 + (lane & 7);
    const uint32_t sK_a = smem_u32(stage + kr * kPitch + ((lane >> 3) & 1) * 8);
    auto k_addr = [&](int k) -> uint32_t { return sK_a + k * 32; };
    uint32_t af[2][4], bf[2][4];
    ldsm_x4(sQ_a, af[0]);
    ldsm_x4(k_addr(0), bf[0]);
#pragma unroll
    for (int k = 0; k < kDqk / 16; ++k) {
        const int c = k & 1;
        if (k + 1 < kDqk / 16) {
            ldsm_x4(sQ_a + (k + 1) * 32, af[c ^ 1]);
            ldsm_x4(k_addr(k + 1), bf[c ^ 1]);
        }
        Dt<T>::mma(s[c][0], af[c], bf[c][0], bf[c][1]);
        Dt<T>::mma(s[c][1], af[c], bf[c][2], bf[c][3]);
    }
    float mloc[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = e >> 1;
            const int t = t0 + wh * 16 + n * 8 + q4 * 2 + (e & 1);
            float v = (s[0][n][e] + s[1][n][e]) * scale_log2;
            if (t < lo[i] || t > hi[i])
                v = -CUDART_INF_F;
            s[0][n][e] = v;
            mloc[i] = fmaxf(mloc[i], v);
        }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        mloc[i] = fmaxf(mloc[i], __shfl_xor_sync(0xffffffffu, mloc[i], 1));
        mloc[i] = fmaxf(mloc[i], __shfl_xor_sync(0xffffffffu, mloc[i], 2));
    }
    if (q4 == 0) {
        sMax[wh * kRows + wp * 16 + g] = mloc[0];
        sMax[wh * kRows + wp * 16 + g + 8] = mloc[1];
    }
}

/* Online softmax after both halves' maxima are in sMax: new running max over the pair,
 * P = exp2(s - m) into sP rows wp * 16 .. (input dtype, [64][kPPitch]), running sums
 * l_run, and acc rescaled by exp2(m_old - m_new). */
template <typename T>
__device__ __forceinline__ void step_softmax(const float *sMax, T *sP, int wh, int wp, int lane,
                                             float s[2][2][4], float m_run[2], float l_run[2],
                                             float acc[32][4]) {
    const int g = lane >> 2, q4 = lane & 3;
    float alpha[2], m_use[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float mo = sMax[(wh ^ 1) * kRows + wp * 16 + g + 8 * i];
        const float m_new = fmaxf(m_run[i], fmaxf(sMax[wh * kRows + wp * 16 + g + 8 * i], mo));
        m_use[i] = m_new == -CUDART_INF_F ? 0.f : m_new;
        alpha[i] = exp2f(m_run[i] - m_use[i]);
        m_run[i] = m_new;
    }
    float rs[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < 2; ++n) {
        const float p0 = exp2f(s[0][n][0] - m_use[0]);
        const float p1 = exp2f(s[0][n][1] - m_use[0]);
        const float p2 = exp2f(s[0][n][2] - m_use[1]);
        const float p3 = exp2f(s[0][n][3] - m_use[1]);
        rs[0] += p0 + p1;
        rs[1] += p2 + p3;
        T *row0 = sP + (wp * 16 + g) * kPPitch + wh * 16 + n * 8 + q4 * 2;
        *reinterpret_cast<uint32_t *>(row0) = Dt<T>::pack(p0, p1);
        *reinterpret_cast<uint32_t *>(row0 + 8 * kPPitch) = Dt<T>::pack(p2, p3);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        rs[i] += __shfl_xor_sync(0xffffffffu, rs[i], 1);
        rs[i] += __shfl_xor_sync(0xffffffffu, rs[i], 2);
        l_run[i] = l_run[i] * alpha[i] + rs[i];
    }
#pragma unroll
    for (int n = 0; n < 32; ++n) {
        acc[n][0] *= alpha[0];
        acc[n][1] *= alpha[0];
        acc[n][2] *= alpha[1];
        acc[n][3] *= alpha[1];
    }
}

/* acc[16 rows x this warp's 256 dims] += P[16 x 32] V[32 x 256], V = the block's ckv
 * (tokens are k, dims n; ldmatrix.trans gives the column-major B fragment).  sP_a: this
 * lane's ldmatrix address in the pair's P rows. */
template <typename T>
__device__ __forceinline__ void step_pv(const T *stage, uint32_t sP_a, int wh, int lane,
                                        float acc[32][4]) {
    const int vr = ((lane >> 3) & 1) * 8 + (lane & 7);
    const uint32_t sV_a = smem_u32(stage + vr * kPitch + wh * 256 + (lane >> 4) * 8);
    auto v_addr = [&](int x) -> uint32_t { /* x = kk * 16 + nn */
        return sV_a + ((x >> 4) * 16 * kPitch + (x & 15) * 16) * 2;
    };
    uint32_t pf[2][4], vf[2][4];
    ldsm_x4(sP_a, pf[0]);
    ldsm_x4(sP_a + 32, pf[1]);
    ldsm_x4_t(v_addr(0), vf[0]);
#pragma unroll
    for (int x = 0; x < 32; ++x) {
        const int kk = x >> 4, nn = x & 15, c = x & 1;
        if (x + 1 < 32)
            ldsm_x4_t(v_addr(x + 1), vf[c ^ 1]);
        Dt<T>::mma(acc[2 * nn], pf[kk], vf[c][0], vf[c][1]);
        Dt<T>::mma(acc[2 * nn + 1], pf[kk], vf[c][2], vf[c][3]);
    }
}

/* End of an item, step 1 (lanes with q4 == 0 of live warps): each half's running sum and
 * the pair's running max of rows wp * 16 + g, + 8 into shared memory (sL [2][kRows],
 * sMax [kRows] here: the scores' per-half maxima are no longer needed). */
__device__ __forceinline__ void pair_stats_store(float *sL, float *sMax, int wh, int wp, int lane,
                                                 const float l_run[2], const float m_run[2]) {
    const int g = lane >> 2;
    sL[wh * kRows + wp * 16 + g] = l_run[0];
    sL[wh * kRows + wp * 16 + g + 8] = l_run[1];
    if (wh == 0) {
        sMax[wp * 16 + g] = m_run[0];
        sMax[wp * 16 + g + 8] = m_run[1];
    }
}

/* Step 2, after a barrier, when two warp pairs took alternate blocks of the same 16 rows
 * (KP = 2): the rows' total max mt and sum lt over both pairs, and this pair's acc
 * rescaled to mt, so that the pairs' O can be added. */
__device__ __forceinline__ void pair_totals(const float *sL, const float *sMax, int lane,
                                            const float m_run[2], float lt[2], float mt[2],
                                            float acc[32][4]) {
    const int g = lane >> 2;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = g + 8 * i;
        const float ma = sMax[r], mb = sMax[16 + r];
        mt[i] = fmaxf(ma, mb);
        const float mu = mt[i] == -CUDART_INF_F ? 0.f : mt[i];
        const float fa = exp2f(ma - mu), fb = exp2f(mb - mu);
        lt[i] = (sL[r] + sL[kRows + r]) * fa + (sL[16 + r] + sL[kRows + 16 + r]) * fb;
        const float f = exp2f(m_run[i] - mu); /* this pair's own factor */
#pragma unroll
        for (int n = 0; n < 32; ++n) {
            acc[n][2 * i] *= f;
            acc[n][2 * i + 1] *= f;
        }
    }
}

/* Step 3, pair 1: its rescaled O (this warp's 256 dims of 16 rows) into sO [16][256] fp32;
 * then, after a barrier, pair 0 adds it (pair_o_add). */
__device__ __forceinline__ void pair_o_store(float *sO, int lane, const float acc[32][4]) {
    const int g = lane >> 2, q4 = lane & 3;
#pragma unroll
    for (int n = 0; n < 32; ++n) {
        float *o = sO + g * 256 + n * 8 + q4 * 2;
        *reinterpret_cast<float2 *>(o) = make_float2(acc[n][0], acc[n][1]);
        *reinterpret_cast<float2 *>(o + 8 * 256) = make_float2(acc[n][2], acc[n][3]);
    }
}
__device__ __forceinline__ void pair_o_add(const float *sO, int lane, float acc[32][4]) {
    const int g = lane >> 2, q4 = lane & 3;
#pragma unroll
    for (int n = 0; n < 32; ++n) {
        const float *o = sO + g * 256 + n * 8 + q4 * 2;
        const float2 a = *reinterpret_cast<const float2 *>(o);
        const float2 c = *reinterpret_cast<const float2 *>(o + 8 * 256);
        acc[n][0] += a.x;
        acc[n][1] += a.y;
        acc[n][2] += c.x;
        acc[n][3] += c.y;
    }
}

/* The end of an item for a thread of the warp pair that holds the tile's rows rg * 16 + g
 * and + 8 (< M) after the pair combine: l = lt, max = mt (log2 domain), O = acc over this
 * warp's 256 dims.  A split item writes its fp32 partial O / l and its keys-only LSE
 * (natural log) to slot it.out_slot; an unsplit one writes out = bmm2 * O / l (with the
 * sink in the denominator) and, when asked, the LSE. */
template <typename T>
__device__ __forceinline__ void write_rows(const fi_mla_params &p, const RunCtx &ctx,
                                          const fi_work_item &it, const fi_request_info &rq,
                                          int nh, int M, int rg, int wh, int lane,
                                          const float lt[2], const float mt[2],
                                          float acc[32][4]) {
    const int g = lane >> 2, q4 = lane & 3;
    const bool split = it.out_slot >= 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = rg * 16 + g + 8 * i;
        if (r >= M)
            continue;
        const float l = lt[i];
        const float lse_keys = l > 0.f ? (mt[i] + log2f(l)) * kLn2 : -CUDART_INF_F;
        if (split) {
            const float inv = l > 0.f ? 1.f / l : 0.f;
            float *dst = p.partial_o + ((int64_t)it.out_slot * p.tile_rows + r) * kDv +
                         wh * 256 + q4 * 2;
#pragma unroll
            for (int n = 0; n < 32; ++n)
                __stcg(reinterpret_cast<float2 *>(dst + n * 8),
                       make_float2(acc[n][2 * i] * inv, acc[n][2 * i + 1] * inv));
            if (wh == 0 && q4 == 0)
                __stcg(p.partial_lse + (int64_t)it.out_slot * p.tile_rows + r, lse_keys);
        } else {
            const int h = it.head_begin + r % nh;
            const int64_t tok = (int64_t)rq.q_offset + it.q_begin + r / nh;
            const float lse = p.sinks ? logaddexp(lse_keys, p.sinks[h]) : lse_keys;
            const float f = l > 0.f ? ctx.scale2 / l * expf(lse_keys - lse) : 0.f;
            T *dst = (T *)p.out + tok * p.out_stride_tok + h * p.out_stride_head + wh * 256 +
                     q4 * 2;
#pragma unroll
            for (int n = 0; n < 32; ++n)
                *reinterpret_cast<uint32_t *>(dst + n * 8) =
                    Dt<T>::pack(acc[n][2 * i] * f, acc[n][2 * i + 1] * f);
            if (p.lse && wh == 0 && q4 == 0)
                p.lse[tok * p.lse_stride_tok + h * p.lse_stride_head] = lse;
        }
    }
}

}  // namespace fimla
