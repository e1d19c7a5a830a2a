/*
 * executor/gqa/gqa_family.cuh - the GQA decode family (sm_90a) as the persistent runtime
 * sees it (executor/cuda/persistent/kernel.cuh): setup, the producer warps' life, and
 * run_item, which runs an item on the transposed consumers (gqa_swap.cuh) when it has at
 * most 8 rows and on the 16-row consumers (gqa_rows16.cuh) otherwise; both consume the
 * same ring (gqa_ring.cuh) in the same order.  One work item: up to 64 rows (query tokens
 * x the query heads of one KV head) over a KV range.  The persistent loop, the split merge
 * and the launch are the shared ones (executor/cuda/).
 *
 * What it computes (fiattn_run.h): s_j = bmm1_scale * q . k_j, out = bmm2_scale *
 * softmax(s) . v with the mask rule of plan/mask.h (causal spec-decoding rows, window_left),
 * sinks in the denominator, natural-log LSE.
 *
 * How (one CTA = 4 consumer warps + 4 producer warps, one CTA per SM):
 *  - KV in slots of 16, 32 or 64 tokens (Geo::kSlotTokens): a ring of NS slots (K rows
 *    then V rows; 16-bit rows dense in the 128-byte swizzle, fp8 / NVFP4 rows with 16 pad
 *    bytes, either way so ldmatrix rows fall on distinct banks: Geo), each with a
 *    "full" mbarrier (the producer's bytes) and an "empty" one (the owners' release).  The ring runs
 *    across item boundaries: the producer fills the next item's slices while the consumers
 *    finish the current one, so an item pays no pipeline fill (the MLA body drains its ring
 *    per item).  Q is double-buffered the same way (qfull / qempty).
 *  - Producers: 16-byte cp.async copies (8 threads a token, its K and its V row), each
 *    thread's completion arriving on the slot's full barrier (cp.async.mbarrier.arrive).
 *    Not bulk copies: a bulk copy per 256-byte token row ran at ~26 M copies/s per SM
 *    (H200: B128 x 4096 at 0.9 TB/s), the same copy rate the MLA body sees with 1152-byte
 *    rows.  Page indices 32 at a time per warp, the next batch in flight while the current
 *    one is used, so a slice never waits on a page-table read; tokens outside the item's
 *    range are zero-filled (P = 0 must not meet NaN bit patterns).
 *  - Consumers: the tile's 16-row groups are spread over teams of W = 4 / teams warps
 *    (1, 2 or 4 teams); warp tw of a team computes slices tw, tw + W, ... with its own
 *    online softmax (flash-decoding inside the CTA).  Only a slot's owners (one warp a
 *    team) wait for and release it, each lane's arrival counting for its team's W warps
 *    (so each empty barrier counts 128 arrivals whatever the tile shape).
 *    S = Q K^T and O += P V with mma.sync m16n8k16 (fp32 accumulate), Q and K through
 *    ldmatrix, V through ldmatrix.trans, P kept in registers (the S accumulator layout is
 *    the A operand's).  At the item's end the team's W states are combined in a fixed
 *    tree order through shared memory (bitwise deterministic), and warp 0 of the team
 *    stores the rows (final output, or the fp32 partial of a split + its arrival).
 *    Items of at most 8 rows run transposed instead (gqa_swap.cuh: tokens on the m16
 *    side, rows on n8; one team of 4 warps), with the same ring protocol and combine.
 *  - Online softmax in the exp2 domain, fp32; a row whose keys are all masked so far keeps
 *    m = -inf, l = 0, O = 0; NaN in q or k reaches exactly that row's output.
 * Sources: FlashAttention-2 (Dao 2023) online softmax and warp tiling; flash-decoding
 * split-KV (Dao et al. 2023); the producer / consumer mbarrier pipeline of FlashAttention-3
 * (Shah et al. 2024), here with cp.async producers and mma.sync.
 */
#pragma once

#include "executor/gqa/gqa_rows16.cuh"
#include "executor/gqa/gqa_swap.cuh"

namespace figqa {
using namespace fi;

/* Zeroed O, m = -inf, l = 0 (either accumulator). */
template <class A> __device__ __forceinline__ void acc_init(A &a) {
    constexpr int kTiles = sizeof(a.o) / sizeof(a.o[0]);
#pragma unroll
    for (int n = 0; n < kTiles; ++n)
        a.o[n][0] = a.o[n][1] = a.o[n][2] = a.o[n][3] = 0.f;
    a.m[0] = a.m[1] = -CUDART_INF_F;
    a.l[0] = a.l[1] = 0.f;
}

/* The family: q / out dtype T (bf16, fp16), KV element KV (T, or fp8 e4m3), head_dim D. */
template <typename T, typename KV, int D> struct GqaFamily {
    using K = Kv<T, KV>;
    static constexpr int kKind = K::kKind;   /* 0: 16-bit KV, 1: fp8, 2: NVFP4 */
    static constexpr bool kF8 = kKind != 0; /* fp16 matmuls, Q converted to fp16 */
    using C = typename K::C;                /* the matmul input type */
    using G = Geo<D, K::row_bytes(D), K::sf_bytes(D)>;
    using Params = fi_gqa_params;
    using Merge = SplitMerge<D, kRows, OutDyn<T>, kThreads>;
    static constexpr int kThreads = figqa::kThreads;
    static constexpr int kProducerWarps = figqa::kProducerWarps;
    static constexpr int kConsumerRegs = 0;
    static constexpr size_t kSmemBytes = figqa::kSmemBytes;
    using State = Cursor;

    static __device__ __forceinline__ State setup(unsigned char *smem) {
        if (threadIdx.x == 0) {
            for (int i = 0; i < G::kStages; ++i) {
                mbar_init(G::full(smem, i), kProducerThreads);
                mbar_init(G::empty(smem, i), kThreads);
            }
            for (int b = 0; b < 2; ++b) {
                mbar_init(G::qfull(smem, b), kProducerThreads);
                mbar_init(G::qempty(smem, b), kThreads);
            }
            mbar_init_fence();
        }
        return Cursor{0, 0u, 0, 0u};
    }

    /* The producer warps: Q and every KV slice of every item of the CTA, in item order. */
    static __device__ void produce(const fi_gqa_params &p, const fi_cta_start &cs, unsigned char *smem) {
        Cursor cur{0, 0u, 0, 0u};
        const int pt = (int)threadIdx.x - kThreads;
        const int split = p.c.header->kv_split_pages, ppr = p.c.header->pages_per_row;
        /* 16-bit caches prefetch the next item's page-table lines (prefetch_pages: H200
         * -0.5 to -1.4% on B128 x 4096 and trace128); fp8 lost 1.5% with it (ptxas), so the
         * quantised caches keep the plain walk (perf-log 2026-11-29 eighth session). */
        if constexpr (kKind == 0)
            for_each_item_ahead(p.c, cs, [&](const fi_work_item &it, const fi_request_info &rq,
                                             const fi_work_item &nit, const fi_request_info &nrq, bool more) {
                produce_q<T, G, D>(p, it, rq, smem, pt, cur);
                produce_kv<K, G, D>(p, it, rq, split, ppr, smem, pt, cur, more ? &nit : nullptr, &nrq);
            });
        else
            for_each_item(p.c, cs, [&](const fi_work_item &it, const fi_request_info &rq) {
                produce_q<T, G, D>(p, it, rq, smem, pt, cur);
                produce_kv<K, G, D>(p, it, rq, split, ppr, smem, pt, cur, nullptr, nullptr);
            });
    }

    /* The 16-row consumers (gqa_rows16.cuh): a slot on one warp in steps of up to 32 tokens
     * (NT / 2 independent 16-token chains, one softmax update a step; 64-token steps would
     * hold 32 more score registers and spill O). */
    struct Rows16 {
        static constexpr int kStep = G::kSlotTokens < 32 ? G::kSlotTokens : 32;
        static constexpr int kNT = kStep / 8; /* n8 token tiles a step */
        using A = Acc<D>;
        using QF = QFrags<kKind, D>;
        static __device__ __forceinline__ void rows(const Lane &ln, int &r0, int &dr) {
            r0 = ln.rg * 16 + ln.g;
            dr = 8;
        }
        static __device__ __forceinline__ void load_q(QF &qf, const T *sQ, const Lane &ln) {
            qf.load(sQ, ln.rg, ln.lane);
        }
        static __device__ __forceinline__ void compute(const RunCtx &ctx, const unsigned char *slot, const QF &qf,
                                                       const Lane &ln, int t0, const int *lo, const int *hi,
                                                       A &a) {
#pragma unroll 1
            for (int j = 0; j < G::kSlotTokens; j += kStep) {
                float s[kNT][4];
#pragma unroll
                for (int n = 0; n < kNT; ++n)
                    s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
                /* K and V of tokens j.. in Geo's layout.  The padded case is spelled out as
                 * before the swizzle: G::tok there changes the fp8 / NVFP4 code nvcc emits
                 * (their PTX is kept as measured, perf-log 2026-11-29). */
                const unsigned char *sK = G::kSwz ? slot + G::tok(j) : slot + j * G::kKvPitch;
                const unsigned char *sV = G::kSwz ? slot + G::kVOff + G::tok(j) : slot + (G::kSlotTokens + j) * G::kKvPitch;
                const unsigned char *sSfK = slot + G::kSfOff + j * (D / 16); /* NVFP4 scale rows */
                const unsigned char *sSfV = sSfK + G::kSlotTokens * (D / 16);
                if constexpr (kKind == 2)
                    qk_scores_fp4<D, kNT>(sK, sSfK, ln.lane, qf, s);
                else if constexpr (kKind == 1)
                    qk_scores_fp8<D, kNT>(sK, ln.lane, qf, s);
                else
                    qk_scores<C, D, kNT>(sK, ln.lane, qf, s);
                uint32_t pa[kNT / 2][4];
                softmax_step<C, D, kNT>(ctx, ln, t0 + j, lo, hi, s, a, pa);
                if constexpr (kKind == 2)
                    pv_accumulate_fp4<D, kNT>(sV, sSfV, ln.lane, pa, a);
                else if constexpr (kKind == 1)
                    pv_accumulate_fp8<D, kNT>(sV, ln.lane, pa, a);
                else
                    pv_accumulate<C, D, kNT>(sV, ln.lane, pa, a);
            }
        }
        static __device__ __forceinline__ void finish(const fi_gqa_params &p, const RunCtx &ctx,
                                                      const fi_work_item &it, const fi_request_info &rq,
                                                      unsigned char *smem, int M, int nh, const Lane &ln,
                                                      A &a) {
            float mt[2], lt[2];
            combine_team<D>(smem, ln, a, mt, lt);
            if (ln.rg < ln.nrg && ln.tw == 0)
                store_rows<T, kKind, D>(p, ctx, it, rq, M, nh, ln, a, mt, lt);
        }
    };

    /* The transposed consumers (gqa_swap.cuh), items of at most 8 rows. */
    struct Swap {
        static constexpr int kNT = G::kSubs; /* 16-token tiles a slot */
        using A = AccT<D>;
        using QF = QFragsT<kKind, D>;
        static __device__ __forceinline__ void rows(const Lane &ln, int &r0, int &dr) {
            r0 = 2 * ln.q4;
            dr = 1;
        }
        static __device__ __forceinline__ void load_q(QF &qf, const T *sQ, const Lane &ln) {
            qf.load(sQ, ln.lane);
        }
        static __device__ __forceinline__ void compute(const RunCtx &ctx, const unsigned char *sK, const QF &qf,
                                                       const Lane &ln, int t0, const int *lo, const int *hi,
                                                       A &a) {
            float s[kNT][4];
            const unsigned char *sSf = sK + G::kSfOff;
            qk_t<C, kKind, G, D, kNT>(sK, sSf, ln.lane, qf, s);
            uint32_t pb[kNT][2];
            softmax_t<C, D, kNT>(kKind == 2 ? ctx.scale_log2 * kFp4Up : ctx.scale_log2, ln.g, t0, lo, hi, s, a,
                                 pb);
            pv_t<C, kKind, G, D, kNT>(sK + G::kVOff, sSf + G::kSlotTokens * (D / 16), ln.lane,
                                      pb, a);
        }
        static __device__ __forceinline__ void finish(const fi_gqa_params &p, const RunCtx &ctx,
                                                      const fi_work_item &it, const fi_request_info &rq,
                                                      unsigned char *smem, int M, int nh, const Lane &ln,
                                                      A &a) {
            float mt[2], lt[2];
            combine_t<D>(smem, ln, a, mt, lt);
            if (ln.tw == 0)
                store_t<T, kKind, D>(smem, p, ctx, it, rq, M, nh, ln, a, mt, lt);
        }
    };

    /* The consumers on path P: the item's slots (computing their own, releasing all), then
     * the team combine, the store, and for a split its arrival. */
    template <class P>
    static __device__ __forceinline__ void consume(const fi_gqa_params &p, const RunCtx &ctx,
                                                   const fi_work_item &it, const fi_request_info &rq,
                                                   unsigned char *smem, bool first, State &cur) {
        (void)first; /* profiling stamps only (FI_STAMP2: the CTA's first item) */
        const int nh = it.head_end - it.head_begin, M = item_rows(it);
        const Lane ln = lane_of(threadIdx.x, M);
        int lo[2], hi[2], r0, dr;
        P::rows(ln, r0, dr);
        row_bounds(ctx, it, rq, M, nh, r0, dr, lo, hi);
        typename P::A a;
        acc_init(a);
        const bool active = ln.rg < ln.nrg;
        T *sQ = G::template q<T>(smem, cur.qb);
        mbar_wait(G::qfull(smem, cur.qb), cur.qphase);
        if (first)
            FI_STAMP2(0);
        if constexpr (kF8)
            q_to_f16<T, D>(sQ, M);
        typename P::QF qf;
        P::load_q(qf, sQ, ln);
        const int s0 = it.kv_begin & ~(G::kSlotTokens - 1); /* slots aligned as produce_kv's */
        const int nsl = it.kv_end > it.kv_begin ? (it.kv_end - s0 + G::kSlotTokens - 1) / G::kSlotTokens : 0;
        for (int sl = 0; sl < nsl; ++sl) {
            /* Only the slot's owners (one warp a team) wait for it and release it, each lane
             * counting for the W warps of its team: the slot is free as soon as they are
             * done, not when the slowest warp of the CTA passes it (which held up to W
             * slots a warp computing, and so shortened the ring). */
            if (((sl - ln.tw) & (ln.W - 1)) == 0) {
                mbar_wait(G::full(smem, cur.slot), cur.phase);
                if (first && sl == 0)
                    FI_STAMP2(1);
                if (active)
                    P::compute(ctx, G::slot(smem, cur.slot), qf, ln, s0 + sl * G::kSlotTokens, lo, hi, a);
                mbar_arrive_n(G::empty(smem, cur.slot), (uint32_t)ln.W);
            }
            cur.next_slot(G::kStages);
        }
        FI_STAMP2(2);
        mbar_arrive(G::qempty(smem, cur.qb));
        cur.next_q();
        P::finish(p, ctx, it, rq, smem, M, nh, ln, a);
        FI_STAMP2(3);
    }

    /* After an item: a split's arrival on its group through merge Mg (the family's), whose
     * last piece merges solo or defers to the cooperative phase (returns 1 then). */
    template <class Mg>
    static __device__ __forceinline__ bool arrive(const fi_gqa_params &p, const RunCtx &ctx,
                                                  const fi_work_item &it, unsigned char *smem) {
        if (it.out_slot < 0)
            return false;
        return Mg::arrive(p.c, ctx, it, reinterpret_cast<int *>(smem + G::kOffFlag),
                          reinterpret_cast<float *>(smem + G::kOffW),
                          reinterpret_cast<float *>(smem + G::kOffRow));
    }

    /* An item on the path its row count picks.  Returns 1 for a split merged cooperatively
     * later. */
    static __device__ bool run_item(const fi_gqa_params &p, const RunCtx &ctx, const fi_work_item &it,
                                    const fi_request_info &rq, unsigned char *smem, bool first,
                                    State &cur) {
        if (item_rows(it) <= kSwapRows)
            consume<Swap>(p, ctx, it, rq, smem, first, cur);
        else
            consume<Rows16>(p, ctx, it, rq, smem, first, cur);
        return arrive<Merge>(p, ctx, it, smem);
    }
};

/* The family for plans of a registry row of tile_rows <= kSwapRows (gqa_decode_rows8):
 * every item has at most 8 rows, so the kernel holds the transposed consumers alone.
 * Without the 16-row path it needs fewer registers than the shared kernel's cap of 255
 * (head_dim 128: 226-242, no spills, against 8-48 spilled bytes there), and its solo
 * merger reads 16 splits a round when a thread holds one row (SplitMerge kOneRow).  Probe
 * builds of this split on an H200 (docs/perf-log.md, 2026-11-30 nineteenth session), b2b
 * against the shared kernel: B128 x 4096 fp8 -3.5%, bf16 -0.9%, B1 x 32k -4.3%. */
template <typename T, typename KV, int D> struct GqaRows8Family : GqaFamily<T, KV, D> {
    using Base = GqaFamily<T, KV, D>;
    using Merge = SplitMerge<D, kRows, OutDyn<T>, kThreads, true, 1 << 30, 4, true>;

    static __device__ bool run_item(const fi_gqa_params &p, const RunCtx &ctx, const fi_work_item &it,
                                    const fi_request_info &rq, unsigned char *smem, bool first,
                                    typename Base::State &cur) {
        Base::template consume<typename Base::Swap>(p, ctx, it, rq, smem, first, cur);
        return Base::template arrive<Merge>(p, ctx, it, smem);
    }
};

}  // namespace figqa
