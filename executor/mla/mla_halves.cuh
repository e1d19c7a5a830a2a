/*
 * executor/mla/mla_halves.cuh - what the two transposed MLA bodies share (mla_wgt_tile.cuh:
 * fp8; mla_wgt16_tile.cuh: 16-bit): the end of an item, where the two consumer warpgroups'
 * softmax states (each over alternate KV blocks) become one.  The O^T accumulator layout
 * of m64n16 wgmma: O[8][8] a thread, m-tile mt's d[k] at column 2 (k / 4) + k % 2.
 */
#pragma once

#include <stdint.h>

#include "executor/cuda/common/ptx.cuh"
#include "executor/cuda/common/wgmma.cuh"

namespace fimlah {
using namespace fi;

/* The two warpgroups' softmax states of the item made one, each warpgroup keeping half
 * of O^T: warpgroup wg the m-tiles 4 wg .. 4 wg + 3 (dims 256 wg ..), in Oh.  Thread t of
 * one warpgroup holds the same (dims, columns) as thread t of the other, so each writes
 * the other's half, its l and its m to its exchange rows (kXRows >= 10 float4 rows of
 * kWgThreads a warpgroup at kOffX, thread t's at t) and reads the other's; m and l come
 * out the same bits in both (the flash-decoding rescale, Dao et al. 2023: m = max, x =
 * e^(m_a - m) x_a + e^(m_b - m) x_b).  Two barriers kBarX over both warpgroups: the rows
 * written, then read (the next item's exchange writes them again). */
template <int kWgThreads, int kXRows, uint32_t kOffX, int kBarX>
__device__ __forceinline__ void combine_halves(int wg, int t, float (*O)[8], float *m, float *l,
                                               float (*Oh)[8], unsigned char *smem) {
    constexpr int kThreads = 2 * kWgThreads;
    float4 *mine = reinterpret_cast<float4 *>(smem + kOffX) + (size_t)wg * kXRows * kWgThreads + t;
    const float4 *theirs = reinterpret_cast<const float4 *>(smem + kOffX) +
                           (size_t)(1 - wg) * kXRows * kWgThreads + t;
    const bool up = wg != 0; /* selects, not a pointer: O stays in registers */
#pragma unroll
    for (int i = 0; i < 4; ++i) { /* the other's half: m-tiles 4 (1 - wg) + i */
        float o[8];
#pragma unroll
        for (int k = 0; k < 8; ++k)
            o[k] = up ? O[i][k] : O[4 + i][k];
        mine[(2 * i) * kWgThreads] = make_float4(o[0], o[1], o[2], o[3]);
        mine[(2 * i + 1) * kWgThreads] = make_float4(o[4], o[5], o[6], o[7]);
    }
    mine[8 * kWgThreads] = make_float4(l[0], l[1], l[2], l[3]);
    mine[9 * kWgThreads] = make_float4(m[0], m[1], m[2], m[3]);
    nbar_sync(kBarX, kThreads);
    const float4 lo4 = theirs[8 * kWgThreads], mo4 = theirs[9 * kWgThreads];
    const float lo[4] = {lo4.x, lo4.y, lo4.z, lo4.w}, mo[4] = {mo4.x, mo4.y, mo4.z, mo4.w};
    float a[4], ao[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const float mn = fmaxf(m[c], mo[c]), mu = mn == -CUDART_INF_F ? 0.f : mn;
        a[c] = ex2_ftz(m[c] - mu);
        ao[c] = ex2_ftz(mo[c] - mu);
        m[c] = mn;
        l[c] = a[c] * l[c] + ao[c] * lo[c];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float4 x0 = theirs[(2 * i) * kWgThreads], x1 = theirs[(2 * i + 1) * kWgThreads];
        const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int k = 0; k < 8; ++k) { /* accumulator d[k]: column 2 (k / 4) + k % 2 */
            const int c = 2 * (k >> 2) + (k & 1);
            Oh[i][k] = a[c] * (up ? O[4 + i][k] : O[i][k]) + ao[c] * x[k];
        }
    }
    nbar_sync(kBarX, kThreads);
}

}  // namespace fimlah
