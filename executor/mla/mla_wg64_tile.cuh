/*
 * executor/mla/mla_wg64_tile.cuh - the MLA decode family's wgmma variant on 64-token KV
 * blocks (sm_90a, 16-bit caches, dense plans): what mla_wg_tile.cuh computes, for tiles of
 * 64 rows, with a ring of two 64-token blocks instead of four 32-token ones.
 *
 * Why (docs/perf-log.md, 2026-11-30 fourteenth session): the 32-token body pays a fixed
 * cost a block (barriers, softmax, issue paths, 256 mbarrier arrivals: ~2,200 cycles a
 * round with no tensor work at all) and its scores run at 2/3 of the wgmma rate (m64n32k16
 * with both operands in shared memory).  64-token blocks halve that cost per token and
 * run the scores as m64n64k16 (half the Q reads).
 *
 * How (one CTA = 2 consumer warpgroups + 1 producer warpgroup, one CTA per SM):
 *  - Shared memory: Q (64 rows x 576, 9 panels of [64][64] in the 128-byte swizzle), two
 *    ring stages of a 64-token block, 9 panels each, and one P buffer ([64][64], 8 KB):
 *    224 KB.  A stage's panels are three groups with their own full / empty mbarriers: g0
 *    = ckv columns 0-255 (V for warpgroup 0's half of O), g1 = 256-511 (warpgroup 1's), g2
 *    = kpe.
 *  - Block b belongs to warpgroup w = b % 2 (FlashMLA's 2025 kernel alternates blocks the
 *    same way): w computes S_b = Q K_b^T (36 m64n64k16), its softmax and P_b; both
 *    warpgroups add P_b V_b to their half of O (4 m64n256k16 each): the owner with P_b
 *    from registers (wgmma's A from registers, FlashAttention-3's P), the other from the P
 *    buffer, which the owner writes.  One buffer is enough: a warpgroup writes its P only
 *    after its own P V of the other's previous P is waited, and the item's end syncs both
 *    warpgroups (the last P's reader is done before the next item's first P).
 *  - Who reads what, and so when a group of block b is free again: g2 the owner's S_b
 *    only; g_w (the owner's V half) the owner's S_b and P V; g_{1-w} the owner's S_b and
 *    the other's P V.  g2's "empty" counts the owner's 128 threads; g_w and g_{1-w} count
 *    all 256 consumer threads, the thread that never reads g_w (the other) arriving when it
 *    starts the other's P V.
 *  - The producer refills a stage group by group in the order they free up (g2, g_w,
 *    g_{1-w}) and the owner's scores read them in that order, waiting on each group's
 *    "full": a score matmul starts on the first group while the others land (FlashMLA's
 *    per-tile barriers, at three groups).
 *  - A warpgroup's round for its block b: the other's P_{b-1} V_{b-1} and its own S_b
 *    issued together, both waited; the softmax of S_b; P_b V_b issued and waited.  The
 *    other warpgroup's matmuls run beside this one's softmax.
 *  - The running max is lazy (FlashAttention-4's conditional rescale, run_ctx.cuh
 *    row_max_step): a row's max moves only when a block's scores pass it by more than 2^8
 *    (so P stays <= 256), and after an item's first blocks alpha is exactly 1 on nearly
 *    every row, so rescale_o's per-warp test skips O's 128 multiplies a thread.  (The
 *    scores are still issued after the other's P V: before it, the stage of block b - 1
 *    is released later and the ring of two stalls on its refill; docs/perf-log.md.)
 *  - Copies: a block wholly inside an item that starts on a multiple of 64 tokens, with
 *    page_size >= 64 and tensor maps of 64-row boxes (fi_mla_params.tma_box_rows 64), goes
 *    by TMA (one lane, 4 + 4 + 1 boxes of 8 KB); any other by 16-byte cp.async (two threads
 *    a token, zero-fill past the item).  Q as in the 32-token body.
 * Sources: FlashAttention-3 (Shah et al. 2024) producer / consumer warpgroups and wgmma;
 * FlashAttention-4 (Dao et al., 2025) conditional rescale;
 * FlashMLA's 2025 decode kernel write-up (64-token blocks, alternating blocks between two
 * warpgroups that split the 512-wide output, per-tile barriers); FlashAttention-2 online
 * softmax; flash-decoding split-KV.
 */
#pragma once

#include "executor/mla/mla_wg_tile.cuh"

namespace fimlaw64 {
using namespace fi;
using fimlawg::Lane;
using fimlawg::lane_of;

constexpr int kThreads = 256;
constexpr int kProducerWarps = 4;
constexpr int kProducerThreads = kProducerWarps * 32;
constexpr int kProducerRegs = 56, kConsumerRegs = 224;
constexpr int kRows = 64, kBlockN = 64, kDqk = 576, kDv = 512, kPanels = 9;
constexpr uint32_t kQPanel = (uint32_t)kRows * 128;   /* 8192 */
constexpr uint32_t kQBytes = kPanels * kQPanel;       /* 73728 */
constexpr uint32_t kKPanel = (uint32_t)kBlockN * 128; /* 8192: [64 tokens][64] */
constexpr uint32_t kBlockBytes = kPanels * kKPanel;   /* 73728 */
constexpr int kStages = 2;
constexpr uint32_t kOffQ = 0, kOffRing = kQBytes;
/* P_b for the other warpgroup ([64 rows][64 tokens], 128-byte swizzle): one buffer is
 * enough, since each warpgroup writes it only after its own P V of the previous P. */
constexpr uint32_t kOffP = kOffRing + kStages * kBlockBytes;
constexpr uint32_t kBar = kOffP + kKPanel;
static_assert(fimlawg::kOffQ == kOffQ && fimlawg::kQPanel == kQPanel, "Q as the 32-token body");
/* Exchange slots, merge flags: the 32-token body's layout after the P buffer, without the
 * solo merge's weights (this family merges every group cooperatively), so that the
 * profiling build's 1 KB of static shared memory still fits beside it. */
using Sh = fimlawg::WgShared<kBar, false>;
constexpr size_t kSmemBytes = Sh::kEnd;
constexpr int kGroups = 3;
/* Panels of group g: [first, first + count). */
__device__ __forceinline__ int group_first(int g) { return g * 4; }
__device__ __forceinline__ int group_panels(int g) { return g < 2 ? 4 : 1; }

/* mbarriers at kBar: full[2][3], empty[2][3], qfull, qempty (112 bytes of Sh's 128). */
__device__ __forceinline__ uint32_t full(uint32_t s0, int st, int g) { return s0 + kBar + 8 * (3 * st + g); }
__device__ __forceinline__ uint32_t empty(uint32_t s0, int st, int g) { return s0 + kBar + 48 + 8 * (3 * st + g); }
__device__ __forceinline__ uint32_t qfull(uint32_t s0) { return s0 + kBar + 96; }
__device__ __forceinline__ uint32_t qempty(uint32_t s0) { return s0 + kBar + 104; }

struct Cursor {
    int st;
    uint32_t ph, qph;
    __device__ __forceinline__ void next() {
        st ^= 1;
        ph ^= st == 0 ? 1u : 0u;
    }
};

__device__ __forceinline__ int blocks_of(const fi_work_item &it) {
    return it.kv_end > it.kv_begin ? (it.kv_end - it.kv_begin + kBlockN - 1) / kBlockN : 0;
}

/* ---- producer ------------------------------------------------------------------------ */

/* Group g of block b by 16-byte cp.async: thread pt copies token pt / 2 (page-table entry
 * pg), the four 16-byte pieces 4 (pt % 2) .. of each of the group's 128-byte rows; past the
 * item: zeros. */
template <typename T>
__device__ __forceinline__ void copy_group(const fi_mla_params &p, const fi_work_item &it, uint32_t s0,
                                           int st, int b, int g, int pt, int32_t pg, uint64_t pol) {
    const int tok = pt >> 1, q0 = (pt & 1) * 4, t = it.kv_begin + b * kBlockN + tok;
    const fimlawg::KvAt at = fimlawg::kv_at(p, pg, t, it.kv_end);
    const T *ckv = (const T *)p.m.ckv + at.page * p.m.ckv_stride_page + at.slot * p.m.ckv_stride_tok;
    const T *kpe = (const T *)p.m.kpe + at.page * p.m.kpe_stride_page + at.slot * p.m.kpe_stride_tok;
    const uint32_t base = s0 + kOffRing + st * kBlockBytes;
    for (int i = group_first(g); i < group_first(g) + group_panels(g); ++i)
#pragma unroll
        for (int q = q0; q < q0 + 4; ++q)
            cp_async16(base + i * kKPanel + sw128(tok, q * 8),
                       at.in ? (i < 8 ? ckv + i * 64 + q * 8 : kpe + q * 8) : (const T *)p.m.ckv,
                       at.in ? 16 : 0, pol);
}

/* Group g of block b by tensor maps of 64-row boxes, from one lane: `full` expects its
 * bytes first.  page: the block's page (the block lies in one page). */
__device__ __forceinline__ void map_group(const fi_mla_params &p, const fi_work_item &it, uint32_t s0,
                                          int st, int b, int g, int32_t page, uint64_t pol) {
    const int slot = (it.kv_begin + b * kBlockN) & (p.c.page_size - 1);
    const uint32_t dst = s0 + kOffRing + st * kBlockBytes;
    mbar_expect_tx_only(full(s0, st, g), group_panels(g) * kKPanel);
    for (int i = group_first(g); i < group_first(g) + group_panels(g); ++i) {
        if (i < 8)
            tma_load_3d(dst + i * kKPanel, &p.tma_ckv, 64 * i, slot, page, full(s0, st, g), pol);
        else
            tma_load_3d(dst + i * kKPanel, &p.tma_kpe, 0, slot, page, full(s0, st, g), pol);
    }
}

/* ---- consumers ----------------------------------------------------------------------- */

/* Issue the scores of the group g of stage st into S (m64n64k16 over its panels'
 * k16 steps), after waiting for it; first: overwrite S. */
template <typename T>
__device__ __forceinline__ void scores_group(float *S, uint32_t s0, int st, int g, uint32_t parity,
                                             bool first) {
    mbar_wait(full(s0, st, g), parity);
    fence_proxy_async(); /* cp.async rows, generic writes, read by wgmma */
    FI_PHASE(2);
    const WgDesc dq = wg_desc_base(s0 + kOffQ, 16, 1024);
    const WgDesc dk = wg_desc_base(s0 + kOffRing + st * kBlockBytes, 16, 1024);
    for (int i = group_first(g); i < group_first(g) + group_panels(g); ++i)
#pragma unroll
        for (int k = 0; k < 4; ++k)
            Wgmma<64, T>::template ss<0>(S, dq.at(i * kQPanel + k * 32), dk.at(i * kKPanel + k * 32),
                                         first && i == group_first(g) && k == 0 ? 0 : 1);
    FI_PHASE(3);
}

/* O_w += P V_w, V = stage st's panels 4w .. 4w + 3 read MN-major, 4 k16 steps, not
 * committed here.  The other's block: P from the P buffer (K-major).  The own block: P
 * from registers (pr[16], the m16n8k16 A fragments of the softmax's P, wgmma.cuh rs). */
__device__ __forceinline__ WgDesc v_desc(uint32_t s0, int st, int w) {
    return wg_desc_base(s0 + kOffRing + st * kBlockBytes + 4 * w * kKPanel, kKPanel, 1024);
}
template <typename T>
__device__ __forceinline__ void issue_pv(float *O, uint32_t s0, int st, int w) {
    const WgDesc dp = wg_desc_base(s0 + kOffP, 16, 1024);
    const WgDesc dv = v_desc(s0, st, w);
#pragma unroll
    for (int k = 0; k < kBlockN / 16; ++k)
        Wgmma<256, T>::template ss<1>(O, dp.at(k * 32), dv.at(k * 2048), 1);
}
template <typename T>
__device__ __forceinline__ void issue_pv_own(float *O, const uint32_t *pr, uint32_t s0, int st, int w) {
    const WgDesc dv = v_desc(s0, st, w);
#pragma unroll
    for (int k = 0; k < kBlockN / 16; ++k)
        Wgmma<256, T>::template rs<1>(O, pr + 4 * k, dv.at(k * 2048), 1);
}

/* The owner's softmax of block b (tokens t0 ..): as fimlawg::softmax_block over 64
 * columns; P_b into pr (A fragments) and the P buffer; m_b and rowsum(P_b) into exchange
 * slot `slot`.
 * kPos: scores raw (scale_log2 > 0), the max scaled once. */
template <typename T, bool kPos>
__device__ __forceinline__ void softmax64(const RunCtx &ctx, const Lane &ln, float *S, int t0,
                                          const int *lo, const int *hi, float *m, float *alpha,
                                          float *rs, uint32_t *pr, unsigned char *smem, int slot) {
    float mloc[2] = {-CUDART_INF_F, -CUDART_INF_F};
    const bool inside = keys_inside(lo, hi, t0, t0 + kBlockN - 1);
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = e >> 1, t = t0 + 8 * j + 2 * ln.q4 + (e & 1);
            float v = kPos ? S[4 * j + e] : S[4 * j + e] * ctx.scale_log2;
            if (!inside && (t < lo[i] || t > hi[i]))
                v = -CUDART_INF_F;
            S[4 * j + e] = v;
            mloc[i] = fmaxf(mloc[i], v);
        }
    const float sl = ctx.scale_log2;
    float mu[2];
    row_max_step<kPos, fimlawg::kLazy16Log2>(mloc, sl, m, alpha, mu, rs);
    unsigned char *pp = smem + kOffP;
    fimlawg::exp_scores<kBlockN, kPos>(ln, S, sl, mu, rs, [&](int j, int c, float p0, float p1, float p2, float p3) {
        pr[2 * j] = Dt<T>::pack(p0, p1);
        pr[2 * j + 1] = Dt<T>::pack(p2, p3);
        *reinterpret_cast<uint32_t *>(pp + sw128(ln.r0, c)) = pr[2 * j];
        *reinterpret_cast<uint32_t *>(pp + sw128(ln.r0 + 8, c)) = pr[2 * j + 1];
    });
    fimlawg::publish_rows(ln, m, rs, reinterpret_cast<float *>(smem + Sh::kM) + slot * kRows,
                          reinterpret_cast<float *>(smem + Sh::kRS) + slot * kRows);
}

/* One item on both consumer warpgroups (the header comment's rounds). */
template <typename T, typename TO, class Merge>
__device__ __forceinline__ bool run_item64(const fi_mla_params &p, const RunCtx &ctx,
                                           const fi_work_item &it, const fi_request_info &rq,
                                           unsigned char *smem, bool first, Cursor &cur) {
    (void)first; /* profiling stamps only (FI_STAMP2: the CTA's first item) */
    const uint32_t s0 = smem_u32(smem);
    const Lane ln = lane_of(threadIdx.x);
    const int w = ln.w;
    const int nh = it.head_end - it.head_begin, M = (it.q_end - it.q_begin) * nh;
    const int nblk = uniform(blocks_of(it));
    int lo[2], hi[2];
    row_bounds(ctx, it, rq, M, nh, ln.r0, 8, lo, hi);
    float O[128], S[kBlockN / 2];
#pragma unroll
    for (int i = 0; i < 128; ++i)
        O[i] = 0.f;
    wg_pin<128>(O);
    float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.f, 0.f};
    const Cursor c0 = cur;
    auto stage_of = [&](int b) { return (c0.st + b) & 1; };
    auto parity_of = [&](int b) { return c0.ph ^ (uint32_t)(((c0.st + b) >> 1) & 1); };
    /* The other's block b: published P_b, m_b, rowsum; O rescaled as its owner did, P_b V_b
     * issued (not committed).  This warpgroup never reads the owner's V half: its arrival
     * on that group's "empty" goes now. */
    auto other_pv = [&](int b) {
        nbar_sync(2 + (b & 1), 256);
        FI_PHASE(0);
        mbar_arrive(empty(s0, stage_of(b), 1 - w));
        fence_proxy_async();
        float alpha[2];
        fimlawg::adopt_rows(ln, reinterpret_cast<const float *>(smem + Sh::kM) + (b & 1) * kRows,
                            reinterpret_cast<const float *>(smem + Sh::kRS) + (b & 1) * kRows, m, l, alpha);
        fimlawg::rescale_o(O, alpha);
        wg_pin<128>(O);
        wg_fence();
        issue_pv<T>(O, s0, stage_of(b), w);
    };
    /* Done with the other's block b (its P V waited): this thread's own V half. */
    auto release_other = [&](int b) { mbar_arrive(empty(s0, stage_of(b), w)); };
    /* Profiling builds: a round's phases (profile.cuh FI_PHASE): 0 the other's P awaited,
     * 1 its P V issued, 2 a group of S_b's stage awaited (`full`), 3 its scores issued, 4
     * P_{b-1} V_{b-1} awaited, 5 S_b awaited, 6 the barrier before the softmax, 7 the
     * softmax, 8 P_b published, 9 P_b V_b issued, 10 P_b V_b awaited, the stage released. */
    FI_PHASE_START();
    mbar_wait(qfull(s0), cur.qph);
    if (first) {
        FI_STAMP2(0);
    }
    bool q_held = true;
    for (int b = w; b < nblk; b += 2) {
        const int st = stage_of(b);
        const uint32_t par = parity_of(b);
        FI_PHASE_ROUND();
        if (b > 0) {
            other_pv(b - 1);
            wg_commit();
        }
        FI_PHASE(1);
#pragma unroll
        for (int i = 0; i < kBlockN / 2; ++i)
            S[i] = 0.f;
        wg_pin<kBlockN / 2>(S);
        wg_fence();
        scores_group<T>(S, s0, st, 2, par, true);
        scores_group<T>(S, s0, st, w, par, false);
        scores_group<T>(S, s0, st, 1 - w, par, false);
        wg_commit();
        if (b > 0) {
            wg_wait<1>(); /* P_{b-1} V_{b-1} */
            wg_pin<128>(O);
            release_other(b - 1);
        }
        FI_PHASE(4);
        wg_wait<0>(); /* S_b */
        wg_pin<kBlockN / 2>(S);
        wg_pin<128>(O);
        FI_PHASE(5);
        if (first && b == 0) {
            FI_STAMP2(1);
        }
        mbar_arrive(empty(s0, st, 1 - w)); /* the owner is done with the other's V half */
        mbar_arrive(empty(s0, st, 2));     /* ... and with the rope panel (its only reader) */
        if (b + 2 >= nblk && ln.lane == 0) /* no more scores: Q is free */
            mbar_arrive(qempty(s0));
        q_held = b + 2 < nblk ? q_held : false;
        nbar_sync(4 + w, 128); /* every warp's P_{b-1} V_{b-1} done: the P buffer is free */
        FI_PHASE(6);
        float alpha[2], rs[2];
        uint32_t pr[kBlockN / 4];
        if (ctx.scale_log2 > 0.f)
            softmax64<T, true>(ctx, ln, S, it.kv_begin + b * kBlockN, lo, hi, m, alpha, rs, pr, smem, b & 1);
        else
            softmax64<T, false>(ctx, ln, S, it.kv_begin + b * kBlockN, lo, hi, m, alpha, rs, pr, smem, b & 1);
        FI_PHASE(7);
        fence_proxy_async();
        nbar_sync(4 + w, 128);         /* P_b and m_b whole in this warpgroup ... */
        nbar_arrive(2 + (b & 1), 256); /* ... before the other one reads them */
        FI_PHASE(8);
#pragma unroll
        for (int i = 0; i < 2; ++i)
            l[i] = l[i] * alpha[i] + rs[i];
        fimlawg::rescale_o(O, alpha);
        wg_pin<128>(O);
        wg_fence();
        issue_pv_own<T>(O, pr, s0, st, w);
        wg_commit();
        FI_PHASE(9);
        wg_wait<0>();
        wg_pin<128>(O);
        mbar_arrive(empty(s0, st, w));
        FI_PHASE(10);
    }
    if (nblk > 0 && ((nblk - 1) & 1) != w) { /* the item's last block is the other's */
        other_pv(nblk - 1);
        wg_commit();
        wg_wait<0>();
        wg_pin<128>(O);
        release_other(nblk - 1);
        FI_PHASE(4);
    }
    FI_PHASE_END();
    FI_STAMP2(2);
    if (q_held && ln.lane == 0)
        mbar_arrive(qempty(s0));
    for (int b = 0; b < nblk; ++b)
        cur.next();
    cur.qph ^= 1u;
    fimlawg::store_rows<TO>(p, ctx, it, rq, nh, M, ln, O, m, l);
    FI_STAMP2(3);
    /* The item's last P in the P buffer is read by the warpgroup that did not write it
     * (its tail above): a consumer barrier before the next item's first P is written over
     * it (Merge::arrive opens with one). */
    if (it.out_slot < 0) {
        cta_sync<kThreads>();
        return false;
    }
    return Merge::arrive(p.c, ctx, it, reinterpret_cast<int *>(smem + Sh::kFlag),
                         reinterpret_cast<float *>(smem + Sh::kW), reinterpret_cast<float *>(smem + Sh::kRow));
}

/* The family (bf16 or fp16 q / KV / out). */
template <typename T> struct MlaWg64Family {
    using Params = fi_mla_params;
    /* 12 loads in flight in a one-unit merge slice (16 spilled 4 bytes in merge_slice) */
    using Merge = SplitMerge<kDv, kRows, T, kThreads, false, 1 << 30, 12>;
    static constexpr int kThreads = fimlaw64::kThreads;
    static constexpr int kProducerWarps = fimlaw64::kProducerWarps;
    static constexpr int kConsumerRegs = fimlaw64::kConsumerRegs;
    static constexpr size_t kSmemBytes = fimlaw64::kSmemBytes;
    static_assert(kProducerThreads * kProducerRegs + 256 * kConsumerRegs <= 168 * 384, "setmaxnreg");
    static_assert(!Merge::kMergesSolo, "Sh (WgShared<kBar, false>) has no solo-merge weights");
    using State = Cursor;

    static __device__ __forceinline__ State setup(unsigned char *smem) {
        const uint32_t s0 = smem_u32(smem);
        if (threadIdx.x == 0) {
            for (int st = 0; st < kStages; ++st)
                for (int g = 0; g < kGroups; ++g) {
                    mbar_init(full(s0, st, g), kProducerThreads);
                    mbar_init(empty(s0, st, g), g == 2 ? kThreads / 2 : kThreads);
                }
            mbar_init(qfull(s0), kProducerThreads);
            mbar_init(qempty(s0), 8);
            mbar_init_fence();
        }
        return Cursor{0, 0u, 0u};
    }

    /* Q and every KV block of every item, group by group in the order they free up. */
    static __device__ void produce(const fi_mla_params &p, const fi_cta_start &cs, unsigned char *smem) {
        setmaxnreg_dec<kProducerRegs>();
        const uint32_t s0 = smem_u32(smem);
        const int pt = (int)threadIdx.x - kThreads;
        Cursor cur{0, 0u, 0u};
        for_each_item(p.c, cs, [&](const fi_work_item &it, const fi_request_info &rq) {
            mbar_wait(qempty(s0), cur.qph ^ 1u);
            fimlaq::produce_q16<T, kRows, kProducerThreads>(p, it, rq, s0 + kOffQ, pt);
            cp_async_mbar_arrive(qfull(s0));
            cur.qph ^= 1u;
            const int nblk = blocks_of(it);
            const uint64_t pol = l2_evict_first(kv_l2_fraction(p.c, it, rq));
            const bool maps = p.tma_on && p.tma_box_rows == kBlockN && (it.kv_begin & (kBlockN - 1)) == 0;
            const int nmap = maps ? (it.kv_end - it.kv_begin) / kBlockN : 0;
            for (int b = 0; b < nblk; ++b) {
                const int t = it.kv_begin + b * kBlockN + (b < nmap ? 0 : pt >> 1);
                const int32_t pg = t < it.kv_end ? p.c.page_table[(int64_t)rq.page_row_offset + (t >> p.c.page_shift)] : 0;
                const int w = b & 1;
                const int order[3] = {2, w, 1 - w};
#pragma unroll
                for (int k = 0; k < kGroups; ++k) {
                    const int g = order[k];
                    mbar_wait(empty(s0, cur.st, g), cur.ph ^ 1u);
                    if (b < nmap) {
                        if (pt == 0)
                            map_group(p, it, s0, cur.st, b, g, pg, pol);
                        mbar_arrive(full(s0, cur.st, g));
                    } else {
                        copy_group<T>(p, it, s0, cur.st, b, g, pt, pg, pol);
                        cp_async_mbar_arrive(full(s0, cur.st, g));
                    }
                }
                cur.next();
            }
        });
    }

    static __device__ bool run_item(const fi_mla_params &p, const RunCtx &ctx, const fi_work_item &it,
                                    const fi_request_info &rq, unsigned char *smem, bool first, State &cur) {
        return run_item64<T, T, Merge>(p, ctx, it, rq, smem, first, cur);
    }
};

}  // namespace fimlaw64
