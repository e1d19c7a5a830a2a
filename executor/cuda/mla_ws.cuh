/*
 * executor/cuda/mla_ws.cuh - warp-specialised MLA decode for tiles of <= 16 rows (heads 16,
 * q_len 1): warps 4..7 produce, warps 0..3 compute, and neither waits for the other except
 * on full / empty mbarriers, across item boundaries.
 *
 * Why: in the lock-step kernel (mla_decode.cuh) every item starts with an empty ring and
 * every producer action sits between CTA barriers, so a short item pays the ring's fill
 * and drain plus its epilogue with no copies in flight (BENCHMARKS.md, trace profile).
 * Here the producers walk the CTA's items on their own: while the math warps finish an
 * item (last blocks, epilogue, arrival), the next item's Q and blocks are already landing.
 *  - Producers: every block g of the CTA (all items in order) is copied by the four
 *    warps together, 8 tokens each (issue_block with pw = 4, as in the lock-step loop;
 *    every token lane arrives on full[g % NS], kBlockN arrivals a phase), after the block
 *    that last used its stage was released (empty[g % NS], 64 arrivals: every thread of
 *    the consuming warp pair); page indices are loaded a block ahead.  Warp 4 also loads
 *    each item's Q into one of two Q buffers (qfull / qempty, 128 arrivals).
 *  - Consumers: warp pairs 0 and 1 take alternate blocks (KP = 2) with the math of
 *    mla_step.cuh, synchronised among the 128 math threads by cons_sync (an mbarrier, not
 *    a named barrier: see cons_sync); the item's Q buffer is their epilogue scratch.  A
 *    small split group whose last arriver is this CTA is recorded and merged after the
 *    CTA's items by all 256 threads (merge_group), like the cooperative merges.
 *  - Chosen by the host for heads 16 (FIATTN_MLA_LOCKSTEP=1 in the environment forces the
 *    lock-step kernel, for comparisons); CTAs with a wider tile after a plan update run
 *    the lock-step loop inside this kernel (run_items_call).
 * Measured on an H200 (BENCHMARKS.md): trace snapshot -3.6% against the lock-step
 * kernel, uniform heads 16 level.
 * Sources: FlashAttention-3 / CUTLASS warp-specialised pipelines (producer / consumer on
 * mbarriers), FlashMLA's decode kernel.
 */
#pragma once

#include "executor/cuda/mla_common.cuh"
#include "executor/cuda/mla_load.cuh"
#include "executor/cuda/mla_merge.cuh"
#include "executor/cuda/mla_step.cuh"

namespace fimla {

constexpr int kWsNS = 5;          /* ring stages */
constexpr int kWsMaxItems = 128;  /* CTAs with more items take the lock-step path */
constexpr size_t kWsOffBars = kSmemP + kSmemRed + 16; /* full[5] empty[5] qfull[2] qempty[2] math */
constexpr int kWsNumBars = 15;
constexpr size_t kWsOffList = kWsOffBars + kWsNumBars * 8; /* groups to merge after the items */
constexpr size_t kWsOffQ = (kWsOffList + (size_t)kWsMaxItems * 4 + 127) / 128 * 128;
constexpr size_t kWsQBytes = (size_t)16 * kPitch * 2;
constexpr size_t kWsOffRing = kWsOffQ + 2 * kWsQBytes;
static_assert(kWsOffRing + kWsNS * kStageBytes <= kSmemBytes, "ws smem");
static_assert((size_t)16 * 256 * 4 <= kWsQBytes, "ws scratch");

__device__ __forceinline__ uint32_t ws_bar(unsigned char *smem, int i);
/* Barrier of the 128 math threads, on an mbarrier (count 128): every thread arrives, then
 * waits for the phase to complete; ph is the thread's phase bit (all math threads pass the
 * same barriers in the same order).  Not a named barrier (bar.sync 1, 128): after one of
 * those, compute-sanitizer racecheck reports hazards across later __syncthreads() that
 * cannot exist (scripts/racecheck_named_barrier.cu), so the kernel could not be checked. */
__device__ __forceinline__ void cons_sync(unsigned char *smem, uint32_t &ph) {
    const uint32_t b = ws_bar(smem, 2 * kWsNS + 4);
    mbar_arrive(b);
    mbar_wait(b, ph);
    ph ^= 1u;
}
__device__ __forceinline__ uint32_t ws_bar(unsigned char *smem, int i) {
    return smem_u32(smem + kWsOffBars) + (uint32_t)i * 8;
}
/* barrier indices */
__device__ __forceinline__ int ws_full(int s) { return s; }
__device__ __forceinline__ int ws_empty(int s) { return kWsNS + s; }
__device__ __forceinline__ int ws_qfull(int q) { return 2 * kWsNS + q; }
__device__ __forceinline__ int ws_qempty(int q) { return 2 * kWsNS + 2 + q; }

/* Producer warps 4..7. */
template <typename T>
__device__ void ws_produce(const fi_mla_params &p, unsigned char *smem, int i0, int i1) {
    const int pwarp = (int)(threadIdx.x >> 5) - 4, lane = threadIdx.x & 31;
    int gbase = 0;
    for (int k = 0; k < i1 - i0; ++k) {
        const fi_work_item it = p.items[i0 + k];
        const fi_request_info rq = p.requests[it.request];
        if (pwarp == 0) { /* Q of item k into buffer k & 1, once item k-2 released it */
            const int q = k & 1;
            if (k >= 2)
                mbar_wait(ws_bar(smem, ws_qempty(q)), (uint32_t)((k >> 1) - 1) & 1u);
            const int nh = it.head_end - it.head_begin;
            const int M = (it.q_end - it.q_begin) * nh;
            const uint32_t qb = ws_bar(smem, ws_qfull(q));
            T *sQ = reinterpret_cast<T *>(smem + kWsOffQ + q * kWsQBytes);
            if (lane == 0)
                mbar_expect_tx(qb, (uint32_t)M * (kDqk * 2));
            __syncwarp();
            if (lane < M) {
                const int64_t tok = (int64_t)rq.q_offset + it.q_begin + lane / nh;
                const int h = it.head_begin + lane % nh;
                bulk_g2s(smem_u32(sQ + lane * kPitch),
                         (const T *)p.q_nope + tok * p.q_nope_stride_tok + h * p.q_nope_stride_head,
                         kDv * 2, qb);
                bulk_g2s(smem_u32(sQ + lane * kPitch + kDv),
                         (const T *)p.q_pe + tok * p.q_pe_stride_tok + h * p.q_pe_stride_head,
                         (kDqk - kDv) * 2, qb);
            }
        }
        /* Every producer warp copies its 8 tokens of every block (issue_block, pw = 4:
         * 8 bulk-copy issues a warp, the four warps in parallel) and arrives on the
         * stage's full barrier with its bytes; the page indices of the next block are
         * loaded before the wait for this block's stage, off the copy's critical path. */
        const int nblk = (it.kv_end - it.kv_begin + kBlockN - 1) / kBlockN;
        int32_t pg = fetch_page(p, rq, it.kv_begin, it.kv_end, 0, nblk, 4);
        for (int b = 0; b < nblk; ++b) {
            const int32_t pg_next = fetch_page(p, rq, it.kv_begin, it.kv_end, b + 1, nblk, 4);
            const int g = gbase + b;
            const int s = g % kWsNS;
            if (g >= kWsNS) /* the block that last used stage s was released */
                mbar_wait(ws_bar(smem, ws_empty(s)), (uint32_t)((g / kWsNS) - 1) & 1u);
            issue_block<T, true>(p, reinterpret_cast<T *>(smem + kWsOffRing + (size_t)s * kStageBytes),
                           ws_bar(smem, ws_full(s)), it.kv_begin + b * kBlockN, it.kv_end, pg, 4);
            pg = pg_next;
        }
        gbase += nblk;
    }
}

/* Math warps 0..3: the CTA's items in order.  Returns true when a split belongs to a group
 * merged cooperatively; appends the small groups this CTA must merge to the list. */
template <typename T>
__device__ bool ws_consume(const fi_mla_params &p, const RunCtx &ctx, unsigned char *smem, int i0,
                           int i1) {
    T *sP = reinterpret_cast<T *>(smem);
    float *sMax = reinterpret_cast<float *>(smem + kSmemP);
    float *sL = sMax + 2 * kRows;
    int *sFlag = reinterpret_cast<int *>(sL + 2 * kRows);
    int *sList = reinterpret_cast<int *>(smem + kWsOffList);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wp = warp >> 1, wh = warp & 1;
    const int g = lane >> 2, q4 = lane & 3;
    const int kvp = wp; /* KP = 2: pair wp takes blocks 2j + wp; both pairs cover rows 0..15 */
    bool any_coop = false;
    uint32_t cph = 0; /* phase bit of the math-thread barrier (cons_sync) */
    int gbase = 0;
    fi_work_item it;
    fi_request_info rq;
    if (i0 < i1) {
        it = p.items[i0];
        rq = p.requests[it.request];
    }
    FIMLA_IT_DECL
    FIMLA_PH_DECL
    for (int k = 0; k < i1 - i0; ++k) {
        fi_work_item nit = it;
        fi_request_info nrq = rq;
        if (i0 + k + 1 < i1) {
            nit = p.items[i0 + k + 1];
            nrq = p.requests[nit.request];
        }
        const int qb = k & 1;
        T *sQ = reinterpret_cast<T *>(smem + kWsOffQ + qb * kWsQBytes);
        const int nh = it.head_end - it.head_begin;
        const int M = (it.q_end - it.q_begin) * nh;
        const int kv_begin = it.kv_begin, kv_end = it.kv_end;
        const int nblk = (kv_end - kv_begin + kBlockN - 1) / kBlockN;
        const int nstep = (nblk + 1) / 2;
        int lo[2], hi[2]; /* key bounds of this thread's two rows */
        row_key_bounds(ctx, it, rq, nh, M, 0, g, lo, hi);
        float acc[32][4];
#pragma unroll
        for (int n = 0; n < 32; ++n)
            acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
        float m_run[2] = {-CUDART_INF_F, -CUDART_INF_F};
        float l_run[2] = {0.f, 0.f};
        const uint32_t sQ_a = smem_u32(sQ + (lane & 15) * kPitch + (lane >> 4) * 8);
        const uint32_t sP_a = smem_u32(sP + (wp * 16 + (lane & 15)) * kPPitch + (lane >> 4) * 8);
        FIMLA_IT(0);
        mbar_wait(ws_bar(smem, ws_qfull(qb)), (uint32_t)(k >> 1) & 1u);
        FIMLA_IT(1);
        for (int j = 0; j < nstep; ++j) {
            cons_sync(smem, cph); /* step j-1 is done by all math warps: sMax / sP reusable */
            const int b = j * 2 + kvp;
            const bool active = b < nblk;
            const int gb = gbase + b;
            const T *stage = reinterpret_cast<const T *>(smem + kWsOffRing + (size_t)(gb % kWsNS) * kStageBytes);
            const int t0 = kv_begin + b * kBlockN;
            if (active)
                mbar_wait(ws_bar(smem, ws_full(gb % kWsNS)), (uint32_t)(gb / kWsNS) & 1u);
            FIMLA_PH(0);
            float s[2][2][4]; /* scores: [k parity][n8 tile][frag] (mla_step.cuh) */
            if (active)
                step_scores<T>(stage, sQ_a, wh, wp, lane, t0, lo, hi, ctx.scale_log2, s, sMax);
            cons_sync(smem, cph); /* both halves' row maxima in sMax */
            if (active)
                step_softmax<T>(sMax, sP, wh, wp, lane, s, m_run, l_run, acc);
            cons_sync(smem, cph); /* P complete */
            if (active)
                step_pv<T>(stage, sP_a, wh, lane, acc);
            if (active) /* every thread that read the stage releases it (64 arrivals a phase) */
                mbar_arrive(ws_bar(smem, ws_empty(gb % kWsNS)));
            FIMLA_PH(5);
        }
        gbase += nblk;
        FIMLA_IT(2);
        /* Epilogue: combine the two pairs (scratch: this item's Q buffer, one half of the
         * dims at a time), write out. */
        if (q4 == 0)
            pair_stats_store(sL, sMax, wh, wp, lane, l_run, m_run);
        cons_sync(smem, cph);
        float lt[2], mt[2];
        pair_totals(sL, sMax, lane, m_run, lt, mt, acc);
        float *sO = reinterpret_cast<float *>(sQ); /* [16 rows][256] fp32 */
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            if (wp == 1 && wh == half)
                pair_o_store(sO, lane, acc);
            cons_sync(smem, cph);
            if (wp == 0 && wh == half)
                pair_o_add(sO, lane, acc);
            cons_sync(smem, cph);
        }
        const bool split = it.out_slot >= 0;
        if (kvp == 0) /* pair 0 holds the combined rows */
            write_rows<T>(p, ctx, it, rq, nh, M, 0, wh, lane, lt, mt, acc);
        FIMLA_IT(3);
        if (split) {
            /* Arrival: the math threads' partial stores are ordered before thread 0's
             * release by the named barrier, and atom.acq_rel.gpu is cumulative (the same
             * pattern as CUTLASS's split-k semaphore), so no thread fences alone. */
            cons_sync(smem, cph);
            if (tid == 0) {
                const fi_merge_group grp = p.groups[it.merge_group];
                const uint32_t n = (uint32_t)grp.num_splits;
                const bool solo = merge_is_solo(grp);
                const uint32_t old = sem_inc(p.semaphores + it.merge_group, solo ? n - 1 : 2 * n - 1);
                if (solo && old == n - 1)
                    sList[sFlag[0]++] = it.merge_group; /* merged after the items, by 256 threads */
                sFlag[1] |= !solo;
            }
        }
        FIMLA_IT(4);
        fence_proxy_async(); /* scratch writes into the Q buffer before its next bulk copy */
        cons_sync(smem, cph);         /* Q buffer (scratch) no longer read: every math thread hands it back */
        mbar_arrive(ws_bar(smem, ws_qempty(qb)));
        it = nit;
        rq = nrq;
    }
    FIMLA_PH_STORE
    cons_sync(smem, cph);
    any_coop = sFlag[1] != 0;
    return any_coop;
}

/* A CTA of the warp-specialised path (all its items have <= 16 rows, at most kWsMaxItems):
 * set up, run both roles, then the deferred small-group merges with all 256 threads.
 * Returns true when the CTA has cooperative merges left (merge_phase). */
template <typename T>
__device__ __forceinline__ bool ws_cta(const fi_mla_params &p, const RunCtx &ctx, int i0, int i1,
                                       unsigned char *smem) {
    int *sFlag = reinterpret_cast<int *>(smem + kSmemP + kSmemRed);
    const int tid = threadIdx.x;
    if (tid < kWsNS) {
        mbar_init(ws_bar(smem, ws_full(tid)), kBlockN); /* one arrival a token (issue_block) */
        mbar_init(ws_bar(smem, ws_empty(tid)), 64);
    }
    if (tid < 2) {
        mbar_init(ws_bar(smem, ws_qfull(tid)), 1);
        mbar_init(ws_bar(smem, ws_qempty(tid)), 128);
    }
    if (tid == 0)
        mbar_init(ws_bar(smem, 2 * kWsNS + 4), 128); /* cons_sync */
    if (tid == 0)
        sFlag[0] = sFlag[1] = 0;
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncthreads();
    if (tid >= 128)
        ws_produce<T>(p, smem, i0, i1);
    else
        ws_consume<T>(p, ctx, smem, i0, i1);
    __syncwarp(); /* lanes of a role reconverge before the CTA barrier */
    __syncthreads(); /* every copy was consumed; the ring and barriers are idle */
    if (tid < kWsNumBars)
        mbar_inval(ws_bar(smem, tid));
    const int n_list = sFlag[0];
    const bool any_coop = sFlag[1] != 0;
    const int *sList = reinterpret_cast<const int *>(smem + kWsOffList);
    FIMLA_IT_DECL
    for (int i = 0; i < n_list; ++i) {
        const int grp = sList[i];
        __syncthreads();
        __threadfence();
        merge_group<T>(p, ctx, grp, reinterpret_cast<float *>(smem + kWsOffRing), reinterpret_cast<float *>(smem + kSmemP));
    }
    FIMLA_IT(5);
    __syncthreads();
    return any_coop;
}

}  // namespace fimla
