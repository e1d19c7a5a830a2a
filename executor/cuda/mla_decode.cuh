/*
 * executor/cuda/mla_decode.cuh - persistent MLA paged-decode executor (sm_90a).
 *
 * What it computes (fiattn_run.h): for every row (query token, head) of the plan,
 *   s_j = bmm1_scale * (q_nope . ckv_j + q_pe . kpe_j),  out = bmm2_scale * softmax(s) . ckv
 * with the causal / window_left mask of the plan header, sinks in the denominator, and the
 * natural-log LSE.  CTA c walks its items work_indptr[c] .. work_indptr[c+1]-1 (plan region
 * of the workspace; the grid never changes, so a captured graph follows fi_plan_update).
 *
 * Files: mla_common.cuh (constants, dtype traits, PTX wrappers), mla_load.cuh (Q and KV
 * loading), mla_step.cuh (the math of one KV block), mla_merge.cuh (the split merges),
 * mla_ws.cuh (the warp-specialised heads-16 path), this one (the lock-step item loop, the
 * kernels and their launcher).
 *
 * How (one CTA = 8 warps = 256 threads, one CTA per SM):
 *  - Tile: up to 64 rows (q-major: r = (q - q_begin) * heads + (h - head_begin)) in shared
 *    memory, [64][576] (+8 pad elements a row so ldmatrix rows fall in distinct banks).
 *  - KV: blocks of 32 tokens, 576 elements each (ckv ++ kpe), gathered through the page table
 *    by bulk copies (one or two a token) into a 4-5 stage mbarrier ring, page indices
 *    fetched a step ahead.  Tokens outside [kv_begin, kv_end) are zero-filled so P = 0
 *    never meets garbage.  Producers: all 8 warps, except when the tile has <= 16 rows
 *    (KP = 2 below): then warps 4..7, which have no math, copy 8 tokens each and warps
 *    0..3 carry no producer work (measured on an H200: h16 B128 x 4096 239 -> 185 us).
 *  - Warp w: row group rg = w / 2 (16 rows), half wh = w % 2.  S = Q K^T for its 16 rows x
 *    the wh-th 16 tokens of the block (mma.sync m16n8k16, fp32 accumulate); the two halves
 *    swap row maxima through shared memory so both keep the same running max; each writes
 *    its half of P (input dtype) to shared memory; then O[16 x 256] += P[16 x 32] V[32 x 256]
 *    for its half of the 512 output dims (V = ckv, read with ldmatrix.trans).  Row groups
 *    with no live row skip the math (heads 16 / q_len 1: warps 0..3, see KP in run_item).
 *  - Online softmax in the log2 domain (exp2f), fp32; masked logits are -inf and a row whose
 *    keys are all masked so far keeps m = -inf, l = 0, O = 0 (never NaN).
 *  - Unsplit item: out = bmm2 * O / l * exp(lse_keys - lse), lse = logaddexp(lse_keys, sink).
 *    Split item: fp32 partial O / l and lse_keys into its slot, then a threadfence and an
 *    `atom.acq_rel.gpu.inc` (arrival) on the group's counter.  Small groups (merge_is_solo):
 *    the last arriver merges the group at once (merge_group).  Larger ones: after its
 *    LAST item a CTA merges, for each of its split items, that split's slice of the
 *    group's outputs once all n splits have arrived (merge_phase / merge_slice: n CTAs
 *    share a group's merge; deterministic, counters self-resetting, whole grid resident).
 *  - PDL: nothing global is read before griddepcontrol.wait; launch_dependents at the very
 *    end of the CTA (after its merges).
 * Sources of the method: FlashAttention-2 (Dao 2023) online softmax and warp tiling,
 * flash-decoding split-KV with LSE merge, FlashMLA's persistent decode scheduling.
 */
#pragma once

#include "executor/cuda/mla_common.cuh"
#include "executor/cuda/mla_load.cuh"
#include "executor/cuda/mla_merge.cuh"
#include "executor/cuda/mla_step.cuh"
#include "executor/cuda/mla_ws.cuh"

namespace fimla {

/* One work item: attention of the tile over KV [kv_begin, kv_end), then its output.
 * Warp pair wp = warp / 2 covers rows rg * 16 .. + 16 of the tile and, when the tile has
 * one live row group (M <= 16: heads 16, q_len 1), the pairs 0 and 1 take alternate KV
 * blocks (KP = 2 independent softmax states, combined at the end), so twice the warps
 * work on the same bytes. */
template <typename T>
__device__ bool run_item(const fi_mla_params &p, const RunCtx &ctx, const fi_work_item &it,
                         const fi_request_info &rq, unsigned char *smem, bool first) {
    (void)first; /* profiling builds only (FIMLA_STAMP2) */
    T *sP = reinterpret_cast<T *>(smem);
    float *sMax = reinterpret_cast<float *>(smem + kSmemP);
    float *sL = sMax + 2 * kRows;
    int *sFlag = reinterpret_cast<int *>(sL + 2 * kRows);
    T *sQ = reinterpret_cast<T *>(smem + kSmemFixed);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wp = warp >> 1, wh = warp & 1;
    const int g = lane >> 2, q4 = lane & 3;

    const int nh = it.head_end - it.head_begin;
    const int M = (it.q_end - it.q_begin) * nh;
    const int KP = M <= 16 ? 2 : 1;           /* KV blocks computed at once */
    const int qrows = (M + 15) & ~15;
    const size_t ring_off = kSmemFixed + (size_t)qrows * kPitch * 2;
    T *sKV = reinterpret_cast<T *>(smem + ring_off);
    const int NS = min(kMaxStages, (int)((kSmemBytes - ring_off) / kStageBytes));
    const int AHEAD = NS - KP;                 /* blocks in flight beyond the current step */
    const int rg = wp / KP, kvp = wp % KP;
    const bool live = rg * 16 < M;
    const int kv_begin = it.kv_begin, kv_end = it.kv_end;
    const int nblk = (kv_end - kv_begin + kBlockN - 1) / kBlockN;
    const int nstep = (nblk + KP - 1) / KP;

    int lo[2], hi[2]; /* key bounds of this thread's two rows */
    row_key_bounds(ctx, it, rq, nh, M, rg, g, lo, hi);

    /* Ring: stage k has mbarrier bars[k]; block b lives in stage b % NS, its (b / NS)-th
     * use, so it is complete at parity (b / NS) & 1.  The barriers are re-initialised per
     * item (no copy is pending between items).  Producers: warps pw .. 7 (bulk copies of
     * their tokens).  Page indices are fetched one step ahead of their copies. */
    FIMLA_IT_DECL
    uint64_t *bars = reinterpret_cast<uint64_t *>(sFlag + 2);
    const uint32_t bar0 = smem_u32(bars);
    const int pw = KP == 2 ? 4 : 0; /* first producer warp (prod_token) */
    const bool producer = warp >= pw;
    auto stage_of = [&](int b) -> T * {
        return reinterpret_cast<T *>(reinterpret_cast<unsigned char *>(sKV) + (b % NS) * kStageBytes);
    };
    if (tid < NS)
        mbar_init(bar0 + tid * 8, kThreads / 32 - pw);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    load_q<T>(p, sQ, it, rq, nh, M);
    cp_async_commit();
    __syncthreads(); /* barriers initialised before any copy or wait */
    int32_t pg[2] = {-1, -1}; /* page of this lane's token in the next step's blocks */
    if (producer) {
        int32_t pp[kMaxStages];
#pragma unroll
        for (int b = 0; b < kMaxStages; ++b)
            pp[b] = b < AHEAD ? fetch_page(p, rq, kv_begin, kv_end, b, nblk, pw) : -1;
#pragma unroll
        for (int b = 0; b < kMaxStages; ++b)
            if (b < AHEAD && b < nblk)
                issue_block<T>(p, stage_of(b), bar0 + (b % NS) * 8, kv_begin + b * kBlockN, kv_end,
                               pp[b], pw);
#pragma unroll
        for (int i = 0; i < 2; ++i)
            pg[i] = i < KP ? fetch_page(p, rq, kv_begin, kv_end, AHEAD + i, nblk, pw) : -1;
    }
    FIMLA_IT(0);
    cp_async_wait<0>(); /* Q */
    FIMLA_IT(1);
    if (first)
        FIMLA_STAMP2(0);

    float acc[32][4];
#pragma unroll
    for (int n = 0; n < 32; ++n)
        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    float m_run[2] = {-CUDART_INF_F, -CUDART_INF_F};
    float l_run[2] = {0.f, 0.f};

    const uint32_t sQ_a = smem_u32(sQ + (rg * 16 + (lane & 15)) * kPitch + (lane >> 4) * 8);
    const uint32_t sP_a =
        smem_u32(sP + (wp * 16 + (lane & 15)) * kPPitch + (lane >> 4) * 8);

    FIMLA_PH_DECL
    for (int j = 0; j < nstep; ++j) {
        FIMLA_PH(7);
        __syncthreads(); /* step j-1 is done everywhere: its stages may be refilled */
        FIMLA_PH(6);
        if (producer) {
            const int bn = AHEAD + j * KP;
#pragma unroll
            for (int i = 0; i < 2; ++i)
                if (i < KP && bn + i < nblk)
                    issue_block<T>(p, stage_of(bn + i), bar0 + ((bn + i) % NS) * 8,
                                   kv_begin + (bn + i) * kBlockN, kv_end, pg[i], pw);
#pragma unroll
            for (int i = 0; i < 2; ++i)
                pg[i] = i < KP ? fetch_page(p, rq, kv_begin, kv_end, bn + KP + i, nblk, pw) : -1;
        }
        const int b = j * KP + kvp;
        const bool active = live && b < nblk;
        const T *stage = stage_of(b);
        const int t0 = kv_begin + b * kBlockN;
        if (active)
            mbar_wait(bar0 + (b % NS) * 8, (uint32_t)(b / NS) & 1u);
        if (first && j == 0)
            FIMLA_STAMP2(1);
        FIMLA_PH(0);
        float s[2][2][4]; /* [k parity][n8 tile][frag]: two chains per tile for ILP */
        if (active)
            step_scores<T>(stage, sQ_a, wh, wp, lane, t0, lo, hi, ctx.scale_log2, s, sMax);
        FIMLA_PH(1);
        __syncthreads();
        FIMLA_PH(2);
        if (active)
            step_softmax<T>(sMax, sP, wh, wp, lane, s, m_run, l_run, acc);
        FIMLA_PH(3);
        __syncthreads();
        FIMLA_PH(4);
        if (active)
            step_pv<T>(stage, sP_a, wh, lane, acc);
        FIMLA_PH(5);
    }
    FIMLA_PH_STORE
    FIMLA_IT(2);
    FIMLA_STAMP2(2);

    /* Row sums: each half summed its own tokens under the pair's running max. */
    if (live && q4 == 0)
        pair_stats_store(sL, sMax, wh, wp, lane, l_run, m_run);
    __syncthreads();
    /* KP = 2: pair 1 hands its O (scaled to the common max) to pair 0 through the ring. */
    float lt[2], mt[2];
    if (KP == 1) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            mt[i] = m_run[i];
            lt[i] = sL[wp * 16 + g + 8 * i] + sL[kRows + wp * 16 + g + 8 * i];
        }
    } else {
        pair_totals(sL, sMax, lane, m_run, lt, mt, acc);
        float *sO = reinterpret_cast<float *>(sKV) + wh * 16 * 256; /* [2 halves][16][256] */
        if (wp == 1)
            pair_o_store(sO, lane, acc);
        __syncthreads();
        if (wp == 0)
            pair_o_add(sO, lane, acc);
    }
    const bool split = it.out_slot >= 0;
    bool coop = false; /* split of a group merged cooperatively (merge_phase) */
    if (live && kvp == 0)
        write_rows<T>(p, ctx, it, rq, nh, M, rg, wh, lane, lt, mt, acc);
    FIMLA_IT(3);
    FIMLA_STAMP2(3);
    if (split) {
        /* Arrival: partials written, then one increment of the group's counter by thread
         * 0.  The CTA barrier orders every thread's partial stores before thread 0's
         * atom.acq_rel.gpu, whose release is cumulative (PTX memory model; the pattern of
         * CUTLASS's split-k semaphore), so no thread fences alone; on the merging side,
         * thread 0's acquire and the next barrier order the partials' reads.
         * Small groups (merge_is_solo): bound n-1, the last arriver merges now.  Others:
         * bound 2n-1, merged by all their CTAs after their last items (merge_phase). */
        __syncthreads();
        if (tid == 0) {
            const fi_merge_group grp = p.groups[it.merge_group];
            const uint32_t n = (uint32_t)grp.num_splits;
            const bool solo = merge_is_solo(grp);
            const uint32_t old = sem_inc(p.semaphores + it.merge_group, solo ? n - 1 : 2 * n - 1);
            sFlag[0] = solo && old == n - 1; /* bound n-1 wraps to 0: no reset either */
            sFlag[1] = !solo;
        }
        __syncthreads();
        coop = sFlag[1] != 0;
        FIMLA_STAMP(2);
        FIMLA_IT(4);
        if (sFlag[0]) /* last arriver of a small group: merge it whole now */
            merge_group<T>(p, ctx, it.merge_group, reinterpret_cast<float *>(sKV), sMax);
        FIMLA_IT(5);
    }
    fence_proxy_async(); /* generic writes to the ring (sO, sW, zero rows) before the next bulk copy */
    __syncthreads();     /* smem (Q, ring, flags, barriers) is reused by the next item */
    return coop;
}

/* The lock-step item loop of a CTA (items i0 .. i1-1); true when a split of it belongs to
 * a group merged cooperatively after the CTA's last item. */
template <typename T>
__device__ __forceinline__ bool run_items(const fi_mla_params &p, const RunCtx &ctx,
                                          const fi_cta_start &cs, unsigned char *smem) {
    const int i0 = cs.item_begin, i1 = cs.item_end;
    /* The next item and its request row are loaded while this one runs (two dependent
     * global round trips off each item's critical path). */
    fi_work_item it = cs.first;
    fi_request_info rq = cs.request;
    bool any_coop = false;
    for (int i = i0; i < i1; ++i) {
        fi_work_item nit = it;
        fi_request_info nrq = rq;
        if (i + 1 < i1) {
            nit = p.items[i + 1];
            nrq = p.requests[nit.request];
        }
        any_coop |= run_item<T>(p, ctx, it, rq, smem, i == i0);
        it = nit;
        rq = nrq;
    }
    return any_coop;
}

__device__ __forceinline__ RunCtx run_ctx(const fi_mla_params &p) {
    RunCtx ctx;
    ctx.scale_log2 = (p.bmm1_scale_ptr ? *p.bmm1_scale_ptr : p.bmm1_scale) * kLog2e;
    ctx.scale2 = p.bmm2_scale_ptr ? *p.bmm2_scale_ptr : p.bmm2_scale;
    ctx.causal = p.header->causal;
    ctx.window_left = p.header->window_left;
    return ctx;
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_kernel(const __grid_constant__ fi_mla_params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    FIMLA_STAMP(0);
    /* Everything global (plan, q, KV, scales) may come from the previous kernel. */
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    const RunCtx ctx = run_ctx(p);
    const fi_cta_start cs = p.cta_starts[blockIdx.x];
    const int i0 = cs.item_begin, i1 = cs.item_end;
    FIMLA_STAMP(1);
    const bool any_coop = run_items<T>(p, ctx, cs, smem);
    if (any_coop) /* uniform over the CTA */
        merge_phase<T>(p, ctx, i0, i1, smem);
    FIMLA_STAMP(3);
    /* Last: a dependent grid started earlier could take SMs from CTAs not yet resident. */
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

/* The lock-step item loop behind a call, for the warp-specialised kernel's CTAs that have
 * wider tiles (keeps its registers out of that kernel's allocation). */
template <typename T>
__device__ __noinline__ bool run_items_call(const fi_mla_params &p, const RunCtx &ctx, int cta) {
    extern __shared__ __align__(128) unsigned char smem[];
    return run_items<T>(p, ctx, p.cta_starts[cta], smem);
}

/* Heads-16 kernel: CTAs whose items all have <= 16 rows run the warp-specialised path
 * (mla_ws.cuh); others (q_len > 1 after a plan update) the lock-step loop. */
template <typename T>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_ws_kernel(const __grid_constant__ fi_mla_params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    FIMLA_STAMP(0);
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    const RunCtx ctx = run_ctx(p);
    const int i0 = p.work_indptr[blockIdx.x], i1 = p.work_indptr[blockIdx.x + 1];
    FIMLA_STAMP(1);
    int wide = i1 - i0 > kWsMaxItems;
    for (int k = i0 + (int)threadIdx.x; k < i1; k += kThreads) {
        const fi_work_item t = p.items[k];
        wide |= (t.q_end - t.q_begin) * (t.head_end - t.head_begin) > 16;
    }
    wide = __syncthreads_or(wide);
    const bool any_coop = wide ? run_items_call<T>(p, ctx, (int)blockIdx.x) : ws_cta<T>(p, ctx, i0, i1, smem);
    if (any_coop)
        merge_phase<T>(p, ctx, i0, i1, smem);
    FIMLA_STAMP(3);
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

/* Host side: launch one instantiation (grid fixed at params.num_ctas). */
template <typename T>
cudaError_t launch(const fi_mla_params &p, int enable_pdl, cudaStream_t stream) {
    /* Heads 16: the warp-specialised kernel (FIATTN_MLA_LOCKSTEP=1 forces the other). */
    static const char *ls = getenv("FIATTN_MLA_LOCKSTEP");
    const bool ws = p.num_heads == 16 && !(ls && ls[0] == '1');
    auto kernel = ws ? mla_decode_ws_kernel<T> : mla_decode_kernel<T>;
    /* Attributes and resident-CTA bound, once per kernel (idempotent, so a race only
     * repeats it).  The merge phase waits on other CTAs: the whole grid must be resident. */
    static int max_resident[2] = {0, 0};
    if (max_resident[ws] == 0) {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)kSmemBytes);
        int dev = 0, sms = 0, per_sm = 0;
        if (e == cudaSuccess)
            e = cudaGetDevice(&dev);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e == cudaSuccess)
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, kSmemBytes);
        if (e != cudaSuccess)
            return e;
        max_resident[ws] = sms * per_sm;
    }
    if (p.num_ctas > max_resident[ws])
        return cudaErrorCooperativeLaunchTooLarge;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)p.num_ctas);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kSmemBytes;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = enable_pdl ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, p);
    if (e != cudaSuccess)
        return e;
    return cudaGetLastError();
}

}  // namespace fimla
