/*
 * executor/cuda/mla_decode.cuh - persistent MLA paged-decode executor (sm_90a).
 *
 * What it computes (fiattn_run.h): for every row (query token, head) of the plan,
 *   s_j = bmm1_scale * (q_nope . ckv_j + q_pe . kpe_j),  out = bmm2_scale * softmax(s) . ckv
 * with the causal / window_left mask of the plan header, sinks in the denominator, and the
 * natural-log LSE.  CTA c walks its items work_indptr[c] .. work_indptr[c+1]-1 (plan region
 * of the workspace; the grid never changes, so a captured graph follows fi_plan_update).
 *
 * How (one CTA = 8 warps = 256 threads, one CTA per SM):
 *  - Tile: up to 64 rows (q-major: r = (q - q_begin) * heads + (h - head_begin)) in shared
 *    memory, [qrows][576] (+8 pad elements a row so ldmatrix rows fall in distinct banks);
 *    qrows = the CTA's widest item rounded up to 16 (its items share the layout).
 *  - KV: blocks of 32 tokens x 576 elements through the page table, by bulk copies into a
 *    4-5 stage mbarrier ring fed as ONE stream across the CTA's items (mla_stream.cuh):
 *    the next item's first blocks are in flight during this item's tail and epilogue, and
 *    its Q is loaded right after this item's last S = Q K^T.
 *  - Warp w: pair wp = w / 2 (16 rows, or a KV phase, below), half wh = w % 2.  S = Q K^T for
 *    its 16 rows x the wh-th 16 tokens of the block (mma.sync m16n8k16, fp32 accumulate);
 *    the halves swap row maxima through shared memory; each writes its half of P (input
 *    dtype); then O[16 x 256] += P[16 x 32] V[32 x 256] for its half of the 512 output dims
 *    (V = ckv, ldmatrix.trans).  When no item of the CTA has more than 16 rows (heads 16,
 *    q_len 1), pairs 0 and 1 take alternate blocks (KP = 2 softmax states, combined at the
 *    end), so twice the warps work on the same bytes.
 *  - Online softmax in the log2 domain (exp2f), fp32; masked logits are -inf and a row whose
 *    keys are all masked so far keeps m = -inf, l = 0, O = 0 (never NaN).
 *  - Unsplit item: out = bmm2 * O / l * exp(lse_keys - lse), lse = logaddexp(lse_keys, sink).
 *    Split item: fp32 partial O / l and lse_keys into its slot, a threadfence, then one
 *    `atom.acq_rel.gpu.inc` on the group's counter; merges in mla_merge.cuh.
 *  - PDL: nothing global is read before griddepcontrol.wait; launch_dependents at the very
 *    end of the CTA (after its merges).
 * Sources of the method: FlashAttention-2 (Dao 2023) online softmax and warp tiling,
 * flash-decoding split-KV with LSE merge, FlashMLA's persistent decode scheduling.
 */
#pragma once

#include "executor/cuda/mla_common.cuh"
#include "executor/cuda/mla_merge.cuh"
#include "executor/cuda/mla_stream.cuh"

namespace fimla {

/* Start loading the tile's Q rows into sQ (cp.async, one commit group for the caller to
 * commit); rows M .. next multiple of 16 are zeroed (their row group is live). */
template <typename T>
__device__ __forceinline__ void load_q(const fi_mla_params &p, T *sQ, const fi_work_item &it,
                                       const fi_request_info &rq) {
    const int nh = it.head_end - it.head_begin;
    const int M = (it.q_end - it.q_begin) * nh;
    const int rows_live = (M + 15) & ~15;
    for (int idx = threadIdx.x; idx < rows_live * kChunks; idx += kThreads) {
        const int r = idx / kChunks, c = idx - r * kChunks;
        T *dst = sQ + r * kPitch + c * 8;
        if (r < M) {
            const int qi = it.q_begin + r / nh;
            const int h = it.head_begin + r % nh;
            const int64_t tok = (int64_t)rq.q_offset + qi;
            const T *src = c < kChunksNope
                               ? (const T *)p.q_nope + tok * p.q_nope_stride_tok +
                                     h * p.q_nope_stride_head + c * 8
                               : (const T *)p.q_pe + tok * p.q_pe_stride_tok +
                                     h * p.q_pe_stride_head + (c - kChunksNope) * 8;
            cp_async16(smem_u32(dst), src, 16);
        } else {
            *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
        }
    }
}

/* Item k of the CTA (plan index i0 + k, of n_items): attention of the tile over KV
 * [kv_begin, kv_end) from the stream (its blocks are gcons .. gcons + nblk - 1), then its
 * output, its arrival and (last arriver of a small group) the merge.  Q is in sQ (cp.async
 * groups committed; waited here).  Sets *q_next when it started loading item k+1's Q.
 * The item is read from the item table twice (loop, epilogue) rather than kept in
 * registers across the loop.  Returns kItemCoop when the item is a split of a group merged
 * cooperatively after the CTA's last item, kItemMergeNow when this CTA arrived last in a
 * small group (merge_now follows). */
constexpr int kItemCoop = 1, kItemMergeNow = 2;
template <typename T>
__device__ int run_item(const fi_mla_params &p, const RunCtx &ctx, int i0, int k, int n_items,
                         unsigned char *smem, Ring<T> &ring, int &gcons, const int KP,
                         bool *q_next) {
    T *sP = reinterpret_cast<T *>(smem);
    float *sMax = reinterpret_cast<float *>(smem + kOffRed);
    float *sL = sMax + 2 * kRows;
    int *sFlag = reinterpret_cast<int *>(smem + kOffFlag);
    T *sQ = reinterpret_cast<T *>(smem + kSmemFixed);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wp = warp >> 1, wh = warp & 1;
    const int g = lane >> 2, q4 = lane & 3;

    fi_work_item it;
    fi_request_info rq;
    item_at(p, i0, k, it, rq);
    const int nh = it.head_end - it.head_begin;
    const int M = (it.q_end - it.q_begin) * nh;
    const int rg = wp / KP, kvp = wp % KP;
    const bool live = rg * 16 < M;
    const int kv_begin = it.kv_begin, kv_end = it.kv_end;
    const int nblk = item_blocks(kv_begin, kv_end);
    const int nstep = (nblk + KP - 1) / KP;
    const int g0 = gcons; /* global index of this item's first block */

    /* Key bounds [lo, hi] of this thread's two rows (rg*16 + g and + 8). */
    int lo[2], hi[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = rg * 16 + g + 8 * i;
        if (r < M) {
            const int pos = rq.kv_len - rq.q_len + it.q_begin + r / nh;
            const int h_ = ctx.causal ? pos : rq.kv_len - 1;
            const int l_ = ctx.window_left >= 0 ? max(0, pos - ctx.window_left) : 0;
            lo[i] = max(l_, kv_begin);
            hi[i] = min(h_, kv_end - 1);
        } else {
            lo[i] = 0;
            hi[i] = -1;
        }
    }
    FIMLA_IT_DECL
    cp_async_wait<0>(); /* this item's Q (visible to all after the first step's barrier) */
    FIMLA_IT(1);

    float acc[32][4];
#pragma unroll
    for (int n = 0; n < 32; ++n)
        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    float m_run[2] = {-CUDART_INF_F, -CUDART_INF_F};
    float l_run[2] = {0.f, 0.f};

    const uint32_t sQ_a = smem_u32(sQ + (rg * 16 + (lane & 15)) * kPitch + (lane >> 4) * 8);
    const uint32_t sP_a = smem_u32(sP + (wp * 16 + (lane & 15)) * kPPitch + (lane >> 4) * 8);

    FIMLA_PH_DECL
    for (int j = 0; j < nstep; ++j) {
        FIMLA_PH(7);
        __syncthreads(); /* step j-1 is done everywhere: its stages may be refilled */
        FIMLA_PH(6);
        ring.produce(p, g0 + j * KP);
        const int b = j * KP + kvp;
        const bool active = live && b < nblk;
        const T *stage = ring.stage(g0 + b);
        const int t0 = kv_begin + b * kBlockN;
        if (active)
            ring.wait(g0 + b);
        FIMLA_PH(0);
        float s[2][2][4]; /* [k parity][n8 tile][frag]: two chains per tile for ILP */
        if (active) {
#pragma unroll
            for (int a = 0; a < 2; ++a)
#pragma unroll
                for (int n = 0; n < 2; ++n)
                    s[a][n][0] = s[a][n][1] = s[a][n][2] = s[a][n][3] = 0.f;
            /* B rows: tokens wh*16 + (lane>>4)*8 + (lane&7), k offset ((lane>>3)&1)*8. */
            const int kr = wh * 16 + (lane >> 4) * 8 + (lane & 7);
            const uint32_t sK_a = smem_u32(stage + kr * kPitch + ((lane >> 3) & 1) * 8);
            /* Fragments double-buffered one k-step ahead: the ldmatrix latency hides
             * behind the previous step's mma (asm volatile keeps program order). */
            uint32_t af[2][4], bf[2][4];
            ldsm_x4(sQ_a, af[0]);
            ldsm_x4(sK_a, bf[0]);
#pragma unroll
            for (int k = 0; k < kDqk / 16; ++k) {
                const int c = k & 1;
                if (k + 1 < kDqk / 16) {
                    ldsm_x4(sQ_a + (k + 1) * 32, af[c ^ 1]);
                    ldsm_x4(sK_a + (k + 1) * 32, bf[c ^ 1]);
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
                    float v = (s[0][n][e] + s[1][n][e]) * ctx.scale_log2;
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
        FIMLA_PH(1);
        __syncthreads(); /* row maxima exchanged; nobody reads sQ for this item any more */
        FIMLA_PH(2);
        if (active) {
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
        FIMLA_PH(3);
        __syncthreads();
        FIMLA_PH(4);
        if (active) {
            /* V = ckv: tokens are k, dims are n; ldmatrix.trans gives the col-major B frag. */
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
        FIMLA_PH(5);
    }
    FIMLA_PH_STORE
    if (k + 1 < n_items) { /* next item's Q, behind this PV and epilogue */
        fi_work_item nit;
        fi_request_info nrq;
        item_at(p, i0, k + 1, nit, nrq);
        load_q<T>(p, sQ, nit, nrq);
        cp_async_commit();
        *q_next = true;
    }
    FIMLA_IT(2);
    gcons = g0 + nblk;
    /* Scratch for the epilogue: the stage of the block the last step's pair 0 consumed is
     * free until the next item's first step (the producer refills it only after the next
     * top-of-step barrier); an item without blocks has only the P tiles (5 KB). */
    float *sScratch = nstep > 0 ? reinterpret_cast<float *>(ring.stage(g0 + (nstep - 1) * KP))
                                : reinterpret_cast<float *>(smem);

    /* Row sums: each half summed its own tokens under the pair's running max. */
    if (live && q4 == 0) {
        sL[wh * kRows + wp * 16 + g] = l_run[0];
        sL[wh * kRows + wp * 16 + g + 8] = l_run[1];
        if (wh == 0) {
            sMax[wp * 16 + g] = m_run[0];
            sMax[wp * 16 + g + 8] = m_run[1];
        }
    }
    __syncthreads();
    /* KP = 2: pair 1 hands its O (scaled to the common max) to pair 0 through the scratch. */
    float lt[2], mt[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = g + 8 * i;
        if (KP == 1) {
            mt[i] = m_run[i];
            lt[i] = sL[wp * 16 + r] + sL[kRows + wp * 16 + r];
        } else {
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
    if (KP == 2 && nstep > 0) { /* no blocks: both pairs hold zeros */
        float *sO = sScratch; /* [2 halves][16 rows][256] fp32 = 32 KB */
        if (wp == 1) {
#pragma unroll
            for (int n = 0; n < 32; ++n) {
                float *o = sO + (wh * 16 + g) * 256 + n * 8 + q4 * 2;
                *reinterpret_cast<float2 *>(o) = make_float2(acc[n][0], acc[n][1]);
                *reinterpret_cast<float2 *>(o + 8 * 256) = make_float2(acc[n][2], acc[n][3]);
            }
        }
        __syncthreads();
        if (wp == 0) {
#pragma unroll
            for (int n = 0; n < 32; ++n) {
                const float *o = sO + (wh * 16 + g) * 256 + n * 8 + q4 * 2;
                const float2 a = *reinterpret_cast<const float2 *>(o);
                const float2 c = *reinterpret_cast<const float2 *>(o + 8 * 256);
                acc[n][0] += a.x;
                acc[n][1] += a.y;
                acc[n][2] += c.x;
                acc[n][3] += c.y;
            }
        }
    }
    item_at(p, i0, k, it, rq); /* again: not kept in registers across the loop */
    const bool split = it.out_slot >= 0;
    int result = 0; /* kItemCoop | kItemMergeNow */
    if (live && kvp == 0) {
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
    FIMLA_IT(3);
    if (split) {
        /* Arrival: partials written and fenced, then one increment of the group's counter.
         * Small groups (merge_is_solo): bound n-1, the last arriver merges now.  Others:
         * bound 2n-1, merged by all their CTAs after their last items (merge_phase). */
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            const fi_merge_group grp = p.groups[it.merge_group];
            const uint32_t n = (uint32_t)grp.num_splits;
            const bool solo = merge_is_solo(grp);
            const uint32_t old = sem_inc(p.semaphores + it.merge_group, solo ? n - 1 : 2 * n - 1);
            sFlag[0] = solo && old == n - 1; /* bound n-1 wraps to 0: no reset either */
            sFlag[1] = !solo;
            sFlag[2] = it.merge_group;
            sFlag[3] = (int)(reinterpret_cast<unsigned char *>(sScratch) - smem);
        }
        __syncthreads();
        result = (sFlag[1] ? kItemCoop : 0) | (sFlag[0] ? kItemMergeNow : 0);
        FIMLA_STAMP(2);
        FIMLA_IT(4);
    }
    fence_proxy_async(); /* generic writes to the ring (hand-over) before bulk copies */
    __syncthreads();     /* P, row stats and the scratch stage are reused next */
    return result;
}

/* The last arriver of a small split group merges it right after run_item (not inside it:
 * a call made there keeps the whole loop state live across it, and ptxas spilled it into
 * the KV loop).  Group and scratch offset come from the flags run_item left. */
template <typename T>
__device__ __forceinline__ void merge_now(const fi_mla_params &p, const RunCtx &ctx,
                                          unsigned char *smem) {
    const int *sFlag = reinterpret_cast<const int *>(smem + kOffFlag);
    const int off = sFlag[3];
    const int chunk = off == 0 ? (int)(kSmemP / (kRows * sizeof(float))) : 128;
    __threadfence();
    merge_group<T>(p, ctx, sFlag[2], reinterpret_cast<float *>(smem + off), chunk,
                   reinterpret_cast<float *>(smem + kOffRed));
    fence_proxy_async(); /* weights written into a ring stage before its next bulk copy */
    __syncthreads();
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_kernel(const __grid_constant__ fi_mla_params p) {
    unsigned char *smem = dyn_smem<unsigned char>(0);
    FIMLA_STAMP(0);
    /* Everything global (plan, q, KV, scales) may come from the previous kernel. */
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    RunCtx ctx;
    ctx.scale_log2 = (p.bmm1_scale_ptr ? *p.bmm1_scale_ptr : p.bmm1_scale) * kLog2e;
    ctx.scale2 = p.bmm2_scale_ptr ? *p.bmm2_scale_ptr : p.bmm2_scale;
    ctx.causal = p.header->causal;
    ctx.window_left = p.header->window_left;
    const int i0 = p.work_indptr[blockIdx.x], i1 = p.work_indptr[blockIdx.x + 1];
    const int n_items = i1 - i0;
    FIMLA_STAMP(1);
    /* The item table (first kTab items and their requests) and the CTA's widest tile, in
     * one parallel pass over its items. */
    TabEntry *tab = reinterpret_cast<TabEntry *>(smem + kOffTab);
    int w16 = 0, w32 = 0, w48 = 0;
    for (int k = threadIdx.x; k < n_items; k += kThreads) {
        const fi_work_item t = p.items[i0 + k];
        const int M = (t.q_end - t.q_begin) * (t.head_end - t.head_begin);
        w16 |= M > 16;
        w32 |= M > 32;
        w48 |= M > 48;
        if (k < kTab) {
            tab[k].it = t;
            tab[k].rq = p.requests[t.request];
        }
    }
    /* CTA shape (uniform): KP = 2 when every tile has <= 16 rows; Q rows; ring stages. */
    w16 = __syncthreads_or(w16);
    w32 = __syncthreads_or(w32);
    w48 = __syncthreads_or(w48); /* also publishes the table */
    const int KP = w16 ? 1 : 2;
    const int qrows = 16 * (1 + w16 + w32 + w48);
    Ring<T> ring;
    ring.base = (uint32_t)(kSmemFixed + (size_t)qrows * kPitch * 2);
    ring.NS = min(kMaxStages, (int)((kSmemBytes - kSmemFixed - (size_t)qrows * kPitch * 2) / kStageBytes));
    const uint32_t bar0 = smem_u32(smem + kOffBars);
    ring.gprod = 0;
    if ((int)threadIdx.x < ring.NS)
        mbar_init(bar0 + threadIdx.x * 8, kThreads / 32);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    T *sQ = reinterpret_cast<T *>(smem + kSmemFixed);
    if (n_items > 0) {
        fi_work_item it;
        fi_request_info rq;
        item_at(p, i0, 0, it, rq);
        load_q<T>(p, sQ, it, rq);
        cp_async_commit();
    }
    __syncthreads(); /* barriers initialised before any copy or wait */
    ring.st.start(p, i0, n_items);
    ring.fill(p);

    bool any_coop = false;
    int gcons = 0;
    bool q_ready = true; /* Q of item k is loaded (or in flight) */
    for (int k = 0; k < n_items; ++k) {
        if (!q_ready) {
            fi_work_item it;
            fi_request_info rq;
            item_at(p, i0, k, it, rq);
            load_q<T>(p, sQ, it, rq);
            cp_async_commit();
        }
        q_ready = false;
        const int r = run_item<T>(p, ctx, i0, k, n_items, smem, ring, gcons, KP, &q_ready);
        any_coop |= (r & kItemCoop) != 0;
        if (r & kItemMergeNow)
            merge_now<T>(p, ctx, smem);
    }
    if (any_coop) { /* uniform over the CTA; the ring is idle, merge_slice reuses all smem */
        if ((int)threadIdx.x < ring.NS)
            mbar_inval(bar0 + threadIdx.x * 8);
        __syncthreads();
        merge_phase<T>(p, ctx, i0, i1, smem);
    }
    FIMLA_STAMP(3);
    /* Last: a dependent grid started earlier could take SMs from CTAs not yet resident. */
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

/* Host side: launch one instantiation (grid fixed at params.num_ctas). */
template <typename T>
cudaError_t launch(const fi_mla_params &p, int enable_pdl, cudaStream_t stream) {
    /* Attribute and resident-CTA bound, once (idempotent, so a race only repeats it).
     * The merge phase waits on other CTAs, so the whole grid must be resident at once. */
    static int max_resident = 0;
    if (max_resident == 0) {
        cudaError_t e = cudaFuncSetAttribute(mla_decode_kernel<T>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)kSmemBytes);
        int dev = 0, sms = 0, per_sm = 0;
        if (e == cudaSuccess)
            e = cudaGetDevice(&dev);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e == cudaSuccess)
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mla_decode_kernel<T>,
                                                              kThreads, kSmemBytes);
        if (e != cudaSuccess)
            return e;
        max_resident = sms * per_sm;
    }
    if (p.num_ctas > max_resident)
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
    cudaError_t e = cudaLaunchKernelEx(&cfg, mla_decode_kernel<T>, p);
    if (e != cudaSuccess)
        return e;
    return cudaGetLastError();
}

}  // namespace fimla
