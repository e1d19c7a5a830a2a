/*
 * executor/cuda/mla_decode.cuh - persistent MLA paged-decode executor (sm_90a).
 *
 * What it computes (fiattn_run.h): for every row (query token, head) of the plan,
 *   s_j = bmm1_scale * (q_nope . ckv_j + q_pe . kpe_j),  out = bmm2_scale * softmax(s) . ckv
 * with the causal / window_left mask of the plan header, sinks in the denominator, and the
 * natural-log LSE.  CTA c walks its items cta_starts[c].item_begin .. item_end - 1 (plan region
 * of the workspace; the grid never changes, so a captured graph follows fi_plan_update).
 *
 * Files: mla_common.cuh (constants, dtype traits, PTX wrappers), mla_merge.cuh (the split
 * merges), this one (Q and KV loading, the item loop, the kernel and its launcher).
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
#include "executor/cuda/mla_merge.cuh"

namespace fimla {

/* Load the tile's Q rows into sQ (rows >= M inside a live row group are zeroed). */
template <typename T>
__device__ __forceinline__ void load_q(const fi_mla_params &p, T *sQ, const fi_work_item &it,
                                       const fi_request_info &rq, int nh, int M) {
    const int tid = threadIdx.x;
    const int rows_live = (M + 15) & ~15;
    for (int idx = tid; idx < rows_live * kChunks; idx += kThreads) {
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

/* Producer warps pw .. 7 share the tokens of a block: pw = 0, every warp copies 4 tokens
 * (lanes 0..3); pw = 4 (tiles of <= 16 rows, KP = 2, where warps 4..7 do no math), warps
 * 4..7 copy 8 tokens each, so the math warps 0..3 carry no producer work.  The bulk copies
 * have uniform operands (the compiler loops over the lanes). */
__device__ __forceinline__ int prod_tokens(int pw) { return pw ? 8 : 4; } /* pw: 0 or 4 */
__device__ __forceinline__ int prod_token(int pw) { /* this lane's token in a block */
    return ((int)(threadIdx.x >> 5) - pw) * prod_tokens(pw) + (int)(threadIdx.x & 31);
}

/* Page index of this lane's token of block b, -1 past the range or for lanes without one. */
__device__ __forceinline__ int32_t fetch_page(const fi_mla_params &p, const fi_request_info &rq,
                                              int kv_begin, int kv_end, int b, int nblk, int pw) {
    const int lane = threadIdx.x & 31;
    const int t = kv_begin + b * kBlockN + prod_token(pw);
    if (lane >= prod_tokens(pw) || b >= nblk || t >= kv_end)
        return -1;
    return p.page_table[rq.page_row_offset + (t >> p.page_shift)];
}

/* Every producer warp: copy its tokens of block b into the ring stage with two bulk copies
 * a token (ckv 1024 B, kpe 128 B) and arrive on the stage's mbarrier (one arrival a
 * producer warp a phase) with the bytes it expects.  Rows past kv_end are zeroed with ordinary stores, ordered before
 * the arrival by __syncwarp (P = 0 must not meet NaN bit patterns). */
template <typename T>
__device__ __forceinline__ void issue_block(const fi_mla_params &p, T *stage, uint32_t bar,
                                            int t0, int kv_end, int32_t page, int pw) {
    const int lane = threadIdx.x & 31;
    const int tpw = prod_tokens(pw);
    const int j = prod_token(pw) & (kBlockN - 1);
    const int t = t0 + j;
    T *row = stage + j * kPitch;
    if (lane < tpw && page < 0) {
#pragma unroll 8
        for (int c = 0; c < kChunks; ++c)
            reinterpret_cast<uint4 *>(row)[c] = make_uint4(0, 0, 0, 0);
        fence_proxy_async();
    }
    __syncwarp();
    if (lane == 0) {
        const int w0 = t0 + ((int)(threadIdx.x >> 5) - pw) * tpw;
        const int nv = max(0, min(tpw, kv_end - w0));
        mbar_expect_tx(bar, (uint32_t)nv * (kDqk * 2));
    }
    if (lane < tpw && page >= 0) {
        const int slot = t & (p.page_size - 1);
        const T *ckv = (const T *)p.ckv + (int64_t)page * p.ckv_stride_page + (int64_t)slot * p.ckv_stride_tok;
        const T *kpe = (const T *)p.kpe + (int64_t)page * p.kpe_stride_page + (int64_t)slot * p.kpe_stride_tok;
        if (kpe == ckv + kDv) {
            /* Concatenated cache ([.., 576]): one copy a token. */
            bulk_g2s(smem_u32(row), ckv, kDqk * 2, bar);
        } else {
            bulk_g2s(smem_u32(row), ckv, kDv * 2, bar);
            bulk_g2s(smem_u32(row + kDv), kpe, (kDqk - kDv) * 2, bar);
        }
    }
}

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
    /* Thread coordinates, re-read after the KV loop (fresh_tid): the epilogue's uses then
     * do not stretch these values' live ranges over the loop, where at 255 registers the
     * allocator rematerialises them instead (an epilogue experiment this way put 6 S2R a
     * step into the loop; with fresh_tid it kept the loop's code).  Here: spills 20 -> 8
     * bytes, the loop 989 -> 983 SASS instructions, same 136 HMMA; speed within the noise
     * of three same-call A/Bs (BENCHMARKS.md).  Keep epilogue changes behind it. */
    int tid, warp, lane, wp, wh, g, q4, rg, kvp;
    bool live;

    const int nh = it.head_end - it.head_begin;
    const int M = (it.q_end - it.q_begin) * nh;
    const int KP = M <= 16 ? 2 : 1;           /* KV blocks computed at once */
    const int qrows = (M + 15) & ~15;
    const size_t ring_off = kSmemFixed + (size_t)qrows * kPitch * 2;
    T *sKV = reinterpret_cast<T *>(smem + ring_off);
    const int NS = min(kMaxStages, (int)((kSmemBytes - ring_off) / kStageBytes));
    const int AHEAD = NS - KP;                 /* blocks in flight beyond the current step */
    auto coords = [&](int t) {
        tid = t;
        warp = tid >> 5;
        lane = tid & 31;
        wp = warp >> 1;
        wh = warp & 1;
        g = lane >> 2;
        q4 = lane & 3;
        rg = wp / KP;
        kvp = wp % KP;
        live = rg * 16 < M;
    };
    coords(threadIdx.x);
    const int kv_begin = it.kv_begin, kv_end = it.kv_end;
    const int nblk = (kv_end - kv_begin + kBlockN - 1) / kBlockN;
    const int nstep = (nblk + KP - 1) / KP;

    /* Key bounds [lo, hi] of this thread's two rows (rg*16 + g and + 8). */
    int lo[2], hi[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = rg * 16 + g + 8 * i;
        if (r < M) {
            const int pos = rq.kv_len - rq.q_len + it.q_begin + r / nh;
            int h_ = ctx.causal ? pos : rq.kv_len - 1;
            int l_ = ctx.window_left >= 0 ? max(0, pos - ctx.window_left) : 0;
            lo[i] = max(l_, kv_begin);
            hi[i] = min(h_, kv_end - 1);
        } else {
            lo[i] = 0;
            hi[i] = -1;
        }
    }

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
    /* The first blocks' page indices are requested first: page -> KV is the item's
     * critical chain; Q's copies are issued while they travel. */
    int32_t pp[kMaxStages];
#pragma unroll
    for (int b = 0; b < kMaxStages; ++b)
        pp[b] = producer && b < AHEAD ? fetch_page(p, rq, kv_begin, kv_end, b, nblk, pw) : -1;
    if (tid < NS)
        mbar_init(bar0 + tid * 8, kThreads / 32 - pw);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    load_q<T>(p, sQ, it, rq, nh, M);
    cp_async_commit();
    __syncthreads(); /* barriers initialised before any copy or wait */
    int32_t pg[2] = {-1, -1}; /* page of this lane's token in the next step's blocks */
    if (producer) {
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
        if (active) {
#pragma unroll
            for (int a = 0; a < 2; ++a)
#pragma unroll
                for (int n = 0; n < 2; ++n)
                    s[a][n][0] = s[a][n][1] = s[a][n][2] = s[a][n][3] = 0.f;
            /* B rows: tokens wh*16 + (lane>>4)*8 + (lane&7), k offset ((lane>>3)&1)*8. */
            const int kr = wh * 16 + (lane >> 4) * 8 + (lane & 7);
            const uint32_t sK_a = smem_u32(stage + kr * kPitch + ((lane >> 3) & 1) * 8);
            auto k_addr = [&](int k) -> uint32_t { return sK_a + k * 32; };
            /* Fragments double-buffered one k-step ahead: the ldmatrix latency hides
             * behind the previous step's mma (asm volatile keeps program order). */
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
        __syncthreads();
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
    FIMLA_IT(2);
    FIMLA_STAMP2(2);
    coords(fresh_tid()); /* see above */

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
    /* KP = 2: pair 1 hands its O (scaled to the common max) to pair 0 through the ring. */
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
    if (KP == 2) {
        /* sO: [2 halves][16 rows][kOPitch] fp32.  The 8 padding floats a row put the 8
         * rows g of a float2 access 8 banks apart: conflict-free per half-warp, where an
         * unpadded 256-float row put all 8 on the same banks (4-way conflicts). */
        constexpr int kOPitch = 256 + 8;
        static_assert((size_t)32 * kOPitch * 4 <= 2 * kStageBytes, "sO fits the ring");
        float *sO = reinterpret_cast<float *>(sKV);
        if (wp == 1) {
#pragma unroll
            for (int n = 0; n < 32; ++n) {
                float *o = sO + (wh * 16 + g) * kOPitch + n * 8 + q4 * 2;
                *reinterpret_cast<float2 *>(o) = make_float2(acc[n][0], acc[n][1]);
                *reinterpret_cast<float2 *>(o + 8 * kOPitch) = make_float2(acc[n][2], acc[n][3]);
            }
        }
        __syncthreads();
        if (wp == 0) {
#pragma unroll
            for (int n = 0; n < 32; ++n) {
                const float *o = sO + (wh * 16 + g) * kOPitch + n * 8 + q4 * 2;
                const float2 a = *reinterpret_cast<const float2 *>(o);
                const float2 c = *reinterpret_cast<const float2 *>(o + 8 * kOPitch);
                acc[n][0] += a.x;
                acc[n][1] += a.y;
                acc[n][2] += c.x;
                acc[n][3] += c.y;
            }
        }
    }
    const bool split = it.out_slot >= 0;
    bool coop = false; /* split of a group merged cooperatively (merge_phase) */
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

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_kernel(const __grid_constant__ fi_mla_params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    FIMLA_STAMP(0);
    /* Everything global (plan, q, KV, scales) may come from the previous kernel. */
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    RunCtx ctx;
    ctx.scale_log2 = (p.bmm1_scale_ptr ? *p.bmm1_scale_ptr : p.bmm1_scale) * kLog2e;
    ctx.scale2 = p.bmm2_scale_ptr ? *p.bmm2_scale_ptr : p.bmm2_scale;
    ctx.causal = p.header->causal;
    ctx.window_left = p.header->window_left;
    /* One 64-byte record gives the range, the first item and its request row. */
    const fi_cta_start cs = p.cta_starts[blockIdx.x];
    const int i0 = cs.item_begin, i1 = cs.item_end;
    FIMLA_STAMP(1);
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
        any_coop |= run_item<T>(p, ctx, it, rq, smem, i == i0 + FIMLA_STAMP_ITEM);
        it = nit;
        rq = nrq;
    }
    if (any_coop) /* uniform over the CTA */
        merge_phase<T>(p, ctx, i0, i1, smem);
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
