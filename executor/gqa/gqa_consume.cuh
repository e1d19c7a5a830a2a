/*
 * executor/gqa/gqa_consume.cuh - what both GQA consumer paths share (gqa_rows16.cuh,
 * gqa_swap.cuh): a consumer warp's place in the item, the rows' key bounds, the
 * fixed-order team sum, the output store of two elements, and the Q conversion for fp16
 * matmuls (the fp8 / NVFP4 conversions they share: executor/cuda/common/dtype.cuh).
 */
#pragma once

#include "executor/gqa/gqa_ring.cuh"

namespace figqa {
using namespace fi;

/* A consumer warp's place in the item: team rg (16 rows) of `teams`, warp tw of W. */
struct Lane {
    int warp, lane, g, q4, teams, W, rg, tw, nrg;
};
__device__ __forceinline__ Lane lane_of(int tid, int M) {
    Lane l;
    l.warp = tid >> 5;
    l.lane = tid & 31;
    l.g = l.lane >> 2;
    l.q4 = l.lane & 3;
    l.nrg = (M + 15) >> 4;
    l.teams = l.nrg == 1 ? 1 : l.nrg == 2 ? 2 : 4;
    l.W = kWarps / l.teams;
    l.rg = l.warp / l.W;
    l.tw = l.warp % l.W;
    return l;
}

/* Row r of the team's warps w0 .. w0 + W - 1 (sM / sL: a warp's 16 row maxima and sums,
 * warp-major): the team max (*mt), the sum rescaled to it (*lt), and the returned factor
 * exp2(m_own - team max) that brings this warp's O to the team max (both consumer paths'
 * combine; a row without keys keeps max -inf, sum 0). */
__device__ __forceinline__ float team_row(const float *sM, const float *sL, int w0, int W, int r,
                                          float m_own, float *mt, float *lt) {
    float m = -CUDART_INF_F;
    for (int w = 0; w < W; ++w)
        m = fmaxf(m, sM[(w0 + w) * 16 + r]);
    const float mu = m == -CUDART_INF_F ? 0.f : m;
    float l = 0.f;
    for (int w = 0; w < W; ++w)
        l += sL[(w0 + w) * 16 + r] * exp2f(sM[(w0 + w) * 16 + r] - mu);
    *mt = m;
    *lt = l;
    return exp2f(m_own - mu);
}

/* Sum the W warps' accumulators of each team in a fixed tree order through the combine
 * buffer (warps W/2.. hand to 0.., and so on): warp tw == 0 ends with the team's sum.  The
 * lanes of every warp hold the same elements, so the sum is lane-wise whatever the layout. */
template <int D, int NTILE>
__device__ __forceinline__ void tree_add(unsigned char *smem, const Lane &ln, float (&o)[NTILE][4]) {
    float4 *comb = reinterpret_cast<float4 *>(smem + Geo<D, 2 * D>::kOffComb);
    for (int half = ln.W >> 1; half >= 1; half >>= 1) { /* uniform: W is the item's */
        if (ln.tw >= half && ln.tw < 2 * half) {
            float4 *dst = comb + (size_t)(ln.rg * (ln.W >> 1) + ln.tw - half) * NTILE * 32 + ln.lane;
#pragma unroll
            for (int n = 0; n < NTILE; ++n)
                dst[n * 32] = make_float4(o[n][0], o[n][1], o[n][2], o[n][3]);
        }
        cta_sync<kThreads>();
        if (ln.tw < half) {
            const float4 *src = comb + (size_t)(ln.rg * (ln.W >> 1) + ln.tw) * NTILE * 32 + ln.lane;
#pragma unroll
            for (int n = 0; n < NTILE; ++n) {
                const float4 v = src[n * 32];
                o[n][0] += v.x;
                o[n][1] += v.y;
                o[n][2] += v.z;
                o[n][3] += v.w;
            }
        }
        cta_sync<kThreads>();
    }
}

/* Convert the item's Q rows from bf16 to fp16 in place (fp8 KV runs fp16 matmuls). */
template <typename T, int D>
__device__ __forceinline__ void q_to_f16(T *sQ, int M) {
    using G = Geo<D, D>;
    if constexpr (!std::is_same<T, __half>::value) {
        for (int idx = threadIdx.x; idx < M * (D / 2); idx += kThreads) {
            const int r = idx / (D / 2), c = idx - r * (D / 2);
            uint32_t *w = reinterpret_cast<uint32_t *>(sQ + r * G::kPitch) + c;
            const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(w));
            *w = Dt<__half>::pack(v.x, v.y);
        }
        cta_sync<kThreads>();
    }
}

}  // namespace figqa
