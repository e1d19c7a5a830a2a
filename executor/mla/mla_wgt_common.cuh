/*
 * executor/mla/mla_wgt_common.cuh - what the two transposed MLA bodies share
 * (mla_wgt_tile.cuh: q and cache fp8; mla_wgt16_tile.cuh: 16-bit): the tiling (16-row tiles
 * as wgmma's N, 64-token KV blocks as its M, two consumer warpgroups on alternate blocks,
 * one producer warpgroup), the control region of shared memory, the producer's walk over
 * the CTA's blocks, and the parts of a warpgroup's softmax and of an item's end that do not
 * depend on the operand type.
 *
 * The S^T / O^T accumulators of m64n16 wgmma: warp w of a warpgroup holds M rows 16 w + g
 * (+ 8) x columns 8 j + 2 q4 (+ 1) in d[4 j + 2 i + e] (g = lane / 4, q4 = lane % 4, i the
 * row half, e the column parity); the columns are the tile's rows (query row x head), the
 * M rows tokens for S^T and dims for O^T.  O^T [512][16] is O[8][8] a thread.
 * Sources: FlashAttention-3 (Shah et al. 2024: producer / consumer warpgroups); the online
 * softmax of FlashAttention-2 (Dao 2023); flash-decoding (Dao et al. 2023) for the merge
 * of the two warpgroups' states.
 */
#pragma once

#include <stdint.h>

#include "executor/cuda/common/ptx.cuh"
#include "executor/cuda/common/run_ctx.cuh"
#include "executor/cuda/common/wgmma.cuh"
#include "executor/cuda/merge/split_merge.cuh"
#include "executor/mla/mla_params.h"

namespace fimlat {
using namespace fi;

constexpr int kWgThreads = 128;              /* a consumer warpgroup */
constexpr int kConsumerWgs = 2;              /* on alternate KV blocks */
constexpr int kThreads = kConsumerWgs * kWgThreads;
constexpr int kProducerWarps = 4;            /* one producer warpgroup */
constexpr int kProducerThreads = kProducerWarps * 32;
constexpr int kProducerRegs = 72, kConsumerRegs = 216; /* setmaxnreg: 384 threads */
constexpr int kRows = FI_MLA_WGT_TILE_ROWS;  /* 16: wgmma's N */
constexpr int kBlockN = FI_MLA_WGT_KV_BLOCK; /* 64: wgmma's M */
constexpr int kDv = 512;
constexpr int kBarWg = 2;                    /* warpgroup g's named barrier: kBarWg + g */
constexpr int kBarX = 4;                     /* both consumer warpgroups: the item's exchange */
constexpr int kXRows = 10;                   /* exchange rows a warpgroup (combine_halves) */
static_assert(kRows == 16 && kBlockN == 64, "m64n16 tiles");
static_assert(kProducerThreads * kProducerRegs + kThreads * kConsumerRegs <= 168 * 384, "setmaxnreg");

/* The control region at kOffP (a multiple of 1024): per warpgroup 2 KB of P^T panels, its
 * [4 warps][16] fp32 reduction rows, the merge's flags, weights and row statistics, then
 * the mbarriers full[kStages][kParts], empty[kStages][kParts], qfull, qempty (and, when
 * kParts > 1, cfull[kStages]).  kStages even: global block g sits in stage g % kStages and
 * belongs to warpgroup g % 2, so each stage keeps one owner, which waits each phase of its
 * barriers in order (an odd ring lets a parity wait pass on the other warpgroup's phase:
 * perf-log, twenty-second session).
 * kParts > 1: a stage is filled and freed in parts (its 64-dim panels), each on its own
 * barriers, whose arrivals are one a warp (a part's 4 producer warps, its owner's 4 warps);
 * a block copied by cp.async instead lands on cfull (one .noinc arrival a producer thread),
 * its parts' full barriers arrived without bytes.  kParts == 1: one arrival a thread. */
template <uint32_t kOffP_, int kStages_, int kParts_ = 1> struct Ctl {
    static constexpr uint32_t kOffP = kOffP_;
    static constexpr int kStages = kStages_;
    static constexpr int kParts = kParts_;
    static constexpr uint32_t kPWg = 2048;
    static constexpr uint32_t kOffRed = kOffP + kConsumerWgs * kPWg;
    static constexpr uint32_t kRedBytes = 4 * kRows * 4;
    static constexpr uint32_t kOffFlag = kOffRed + kConsumerWgs * kRedBytes;
    static constexpr uint32_t kOffW = kOffFlag + 16;
    static constexpr uint32_t kOffRow = kOffW + kSoloMergeRows * 4;
    static constexpr uint32_t kOffBar = kOffRow + 2 * kRows * 4;
    static constexpr uint32_t kEnd = kOffBar + 8 * (2 * kStages * kParts + 2 + (kParts > 1 ? kStages : 0));
    static_assert(kOffP % 1024 == 0 && kStages % kConsumerWgs == 0 && (kStages & (kStages - 1)) == 0,
                  "P panels on swizzle atoms; an even ring of a power of two");
    static __device__ __forceinline__ uint32_t full(uint32_t s0, int st, int part = 0) {
        return s0 + kOffBar + 8 * (st * kParts + part);
    }
    static __device__ __forceinline__ uint32_t empty(uint32_t s0, int st, int part = 0) {
        return s0 + kOffBar + 8 * ((kStages + st) * kParts + part);
    }
    static __device__ __forceinline__ uint32_t qfull(uint32_t s0) { return s0 + kOffBar + 16 * kStages * kParts; }
    static __device__ __forceinline__ uint32_t qempty(uint32_t s0) { return qfull(s0) + 8; }
    static __device__ __forceinline__ uint32_t cfull(uint32_t s0, int st) {
        static_assert(kParts > 1, "cfull: stages filled in parts only");
        return qfull(s0) + 16 + 8 * st;
    }
    /* One thread: full counts the producer's threads or warps (and TMA bytes), empty the
     * stage owner's threads or warps, qempty every consumer thread. */
    static __device__ __forceinline__ void init(uint32_t s0) {
        constexpr uint32_t kPer = kParts == 1 ? 1u : 32u;
        if (threadIdx.x == 0) {
            for (int st = 0; st < kStages; ++st)
                for (int k = 0; k < kParts; ++k) {
                    mbar_init(full(s0, st, k), kProducerThreads / kPer);
                    mbar_init(empty(s0, st, k), kWgThreads / kPer);
                }
            mbar_init(qfull(s0), kProducerThreads);
            mbar_init(qempty(s0), kThreads);
            if constexpr (kParts > 1)
                for (int st = 0; st < kStages; ++st)
                    mbar_init(cfull(s0, st), kProducerThreads);
            mbar_init_fence();
        }
    }
};

/* The consumers' position: blocks of the CTA's earlier items (global block g sits in stage
 * g % kStages at phase (g / kStages) & 1), Q's phase and (Ctl kParts > 1) the phase of the
 * thread's warpgroup's cfull (its stage's blocks copied by cp.async).  The producer counts
 * the same blocks (produce). */
struct Consumed {
    int gb;
    uint32_t qph;
    uint32_t cph;
};

__device__ __forceinline__ int blocks_of(const fi_work_item &it) {
    return it.kv_end > it.kv_begin ? (it.kv_end - it.kv_begin + kBlockN - 1) / kBlockN : 0;
}

/* Page-table entry of the token producer thread pt copies in block b (token pt / 2), or 0
 * past the item. */
__device__ __forceinline__ int32_t page_of(const fi_mla_params &p, const fi_work_item &it,
                                           const fi_request_info &rq, int b, int pt) {
    const int t = it.kv_begin + b * kBlockN + (pt >> 1);
    return t < it.kv_end ? p.c.page_table[(int64_t)rq.page_row_offset + (t >> p.c.page_shift)] : 0;
}

/* Whether block b of item it goes by tensor maps: wholly inside the item (b below the
 * item's whole blocks), the item starting on a box boundary. */
__device__ __forceinline__ bool maps_block(const fi_mla_params &p, const fi_work_item &it, int b) {
    return p.tma_on && (it.kv_begin & (p.tma_box_rows - 1)) == 0 && b < (it.kv_end - it.kv_begin) / kBlockN;
}

/* The producer warpgroup (thread pt): Q and every block of every item of the CTA, in item
 * order, global block g into stage g % kStages (phase (g / kStages) & 1 of its barriers).
 * load_q(it, rq) issues the item's Q by cp.async; fill(it, st, ph, b, maps, pg, pol) waits
 * for the stage (or its parts) to be free and copies block b into it, by TMA where maps
 * (maps_block), else by cp.async; pg: the page of the thread's token (page_of). */
template <class C, class LoadQ, class Fill>
__device__ __forceinline__ void produce_blocks(const fi_mla_params &p, const fi_cta_start &cs, uint32_t s0,
                                               int pt, LoadQ load_q, Fill fill) {
    int gb = 0;
    uint32_t qph = 0u;
    for_each_item(p.c, cs, [&](const fi_work_item &it, const fi_request_info &rq) {
        mbar_wait(C::qempty(s0), qph ^ 1u);
        load_q(it, rq);
        cp_async_mbar_arrive(C::qfull(s0));
        qph ^= 1u;
        const int nblk = blocks_of(it);
        const uint64_t pol = l2_evict_first(kv_l2_fraction(p.c, it, rq));
        int32_t pg = nblk > 0 ? page_of(p, it, rq, 0, pt) : 0;
        for (int b = 0; b < nblk; ++b, ++gb) {
            /* the next block's entries travel while this one waits for its slot */
            const int32_t pn = b + 1 < nblk ? page_of(p, it, rq, b + 1, pt) : 0;
            fill(it, gb & (C::kStages - 1), ((uint32_t)gb / C::kStages) & 1u, b, maps_block(p, it, b), pg, pol);
            pg = pn;
        }
    });
}

/* fill for a stage taken whole (kParts == 1): wait for it, then map(base, bar) or
 * copy(base) into it at `base` (ring + st x block_bytes), each producer thread arriving on
 * its full barrier (after its cp.async copies land). */
template <class C, class Map, class Copy>
__device__ __forceinline__ void fill_whole(uint32_t s0, uint32_t ring, uint32_t block_bytes, int st, uint32_t ph,
                                           bool maps, Map map, Copy copy) {
    static_assert(C::kParts == 1, "one barrier a stage");
    mbar_wait(C::empty(s0, st), ph ^ 1u);
    const uint32_t base = ring + st * block_bytes, bar = C::full(s0, st);
    if (maps) {
        map(base, bar);
        mbar_arrive(bar);
    } else {
        copy(base);
        cp_async_mbar_arrive(bar);
    }
}

/* A consumer thread's place: warpgroup wg, its warp w, g = lane / 4, q4 = lane % 4; its
 * columns c = 2 j + e are the tile rows 8 j + 2 q4 + e (the accumulators' d[4 j + e],
 * d[4 j + 2 + e]).  The warpgroup's P panels, reduction rows and barrier. */
template <class C> struct Lane {
    int wg, w, lane, g, q4;
    static __device__ __forceinline__ Lane of_thread() {
        Lane ln;
        ln.wg = uniform((int)(threadIdx.x >> 7));
        ln.w = uniform((int)((threadIdx.x >> 5) & 3));
        ln.lane = threadIdx.x & 31;
        ln.g = ln.lane >> 2;
        ln.q4 = ln.lane & 3;
        return ln;
    }
    __device__ __forceinline__ int row(int c) const { return 8 * (c >> 1) + 2 * q4 + (c & 1); }
    __device__ __forceinline__ uint32_t p_off() const { return C::kOffP + C::kPWg * wg; }
    __device__ __forceinline__ float *red(unsigned char *smem) const {
        return reinterpret_cast<float *>(smem + C::kOffRed + C::kRedBytes * wg);
    }
    __device__ __forceinline__ int bar() const { return kBarWg + wg; }
};

/* An item's start for a consumer thread: its columns' key bounds (lo, hi: row_bounds), O
 * zero, m -inf, l 0. */
template <class C>
__device__ __forceinline__ void item_start(const RunCtx &ctx, const fi_work_item &it, const fi_request_info &rq,
                                           const Lane<C> &ln, int *lo, int *hi, float (*O)[8], float *m,
                                           float *l) {
    const int nh = it.head_end - it.head_begin, M = (it.q_end - it.q_begin) * nh;
    row_bounds(ctx, it, rq, M, nh, 2 * ln.q4, 1, lo, hi);
    row_bounds(ctx, it, rq, M, nh, 8 + 2 * ln.q4, 1, lo + 2, hi + 2);
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
#pragma unroll
        for (int i = 0; i < 8; ++i)
            O[mt][i] = 0.f;
        wg_pin<8>(O[mt]);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        m[k] = -CUDART_INF_F;
        l[k] = 0.f;
    }
}

/* The first half of a block's softmax (tokens t0 ..; S the raw S^T accumulator): scaled
 * and masked scores into v, the columns' new running max m over the warpgroup (red, one
 * named barrier), O and l rescaled by exp2(m_old - m_new); mu: the max the weights subtract
 * (0 for a column still without keys). */
template <class C>
__device__ __forceinline__ void column_max(const RunCtx &ctx, const Lane<C> &ln, const float *S, int t0,
                                           const int *lo, const int *hi, float *m, float *l,
                                           float (*O)[8], unsigned char *smem, float *v, float *mu) {
    const float sl = ctx.scale_log2;
    float mx[4] = {-CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F};
    const int tk = t0 + 16 * ln.w + ln.g; /* token of S[4 j + e], + 8 for S[4 j + 2 + e] */
    bool whole = true;
#pragma unroll
    for (int c = 0; c < 4; ++c)
        whole = whole && lo[c] <= t0 && hi[c] >= t0 + kBlockN - 1;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = 2 * j + e, t = tk + 8 * i;
                float x = S[4 * j + 2 * i + e] * sl;
                if (!whole && (t < lo[c] || t > hi[c]))
                    x = -CUDART_INF_F;
                v[4 * j + 2 * i + e] = x;
                mx[c] = fmaxf(mx[c], x);
            }
    float *red = ln.red(smem);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
        for (int o = 4; o <= 16; o <<= 1)
            mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], o));
        if (ln.g == 0)
            red[ln.w * kRows + ln.row(c)] = mx[c];
    }
    nbar_sync(ln.bar(), kWgThreads);
    float alpha[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const int r = ln.row(c);
        const float bm = fmaxf(fmaxf(red[r], red[kRows + r]), fmaxf(red[2 * kRows + r], red[3 * kRows + r]));
        const float mn = fmaxf(m[c], bm);
        mu[c] = mn == -CUDART_INF_F ? 0.f : mn;
        alpha[c] = ex2_ftz(m[c] - mu[c]);
        m[c] = mn;
        l[c] *= alpha[c];
    }
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f || alpha[2] != 1.f || alpha[3] != 1.f)) {
#pragma unroll
        for (int mt = 0; mt < 8; ++mt)
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    O[mt][4 * j + e] *= alpha[2 * j + e];
                    O[mt][4 * j + 2 + e] *= alpha[2 * j + e];
                }
    }
}

/* The item's column sums: l summed over the warpgroup (red) into L; two barriers of the
 * warpgroup (written, then read before the next item's first block max writes red). */
template <class C>
__device__ __forceinline__ void column_sums(const Lane<C> &ln, const float *l, unsigned char *smem, float *L) {
    float *red = ln.red(smem);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        float x = l[k];
#pragma unroll
        for (int o = 4; o <= 16; o <<= 1)
            x += __shfl_xor_sync(0xffffffffu, x, o);
        if (ln.g == 0) /* every warp read red last before the last block's P barrier */
            red[ln.w * kRows + ln.row(k)] = x;
    }
    nbar_sync(ln.bar(), kWgThreads);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int r = ln.row(k);
        L[k] = red[r] + red[kRows + r] + red[2 * kRows + r] + red[3 * kRows + r];
    }
    nbar_sync(ln.bar(), kWgThreads);
}

/* The two warpgroups' softmax states of the item made one, each warpgroup keeping half
 * of O^T: warpgroup wg the m-tiles 4 wg .. 4 wg + 3 (dims 256 wg ..), in Oh.  Thread t of
 * one warpgroup holds the same (dims, columns) as thread t of the other, so each writes
 * the other's half, its l and its m to its exchange rows (kXRows float4 rows of
 * kWgThreads a warpgroup at kOffX, thread t's at t) and reads the other's; m and l come
 * out the same bits in both (the flash-decoding rescale, Dao et al. 2023: m = max, x =
 * e^(m_a - m) x_a + e^(m_b - m) x_b).  Two barriers kBarX over both warpgroups: the rows
 * written, then read (the next item's exchange writes them again). */
template <uint32_t kOffX>
__device__ __forceinline__ void combine_halves(int wg, int t, float (*O)[8], float *m, float *l,
                                               float (*Oh)[8], unsigned char *smem) {
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

/* An item's end after its last block: the two warpgroups' states made one (combine_halves),
 * each warpgroup's column sums (column_sums, raw); the body then stores its half of the
 * rows from Oh. */
template <class C, uint32_t kOffX>
__device__ __forceinline__ void item_end(const Lane<C> &ln, float (*O)[8], float *m, float *l, float (*Oh)[8],
                                         unsigned char *smem, float *L) {
    combine_halves<kOffX>(ln.wg, ln.w * 32 + ln.lane, O, m, l, Oh, smem);
    column_sums(ln, l, smem, L);
}

}  // namespace fimlat
