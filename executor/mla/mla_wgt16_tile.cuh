/*
 * executor/mla/mla_wgt16_tile.cuh - the MLA decode family's transposed 16-bit body (sm_90a):
 * q, KV cache and out all bf16 or all fp16, tiles of at most 16 rows (heads 16 at q_len 1:
 * DeepSeek's per-GPU heads under tensor parallelism 8).  The 16-bit twin of the transposed
 * fp8 body (mla_wgt_tile.cuh, docs/DESIGN.md 9b): the KV block on wgmma's M side ("swap
 * AB"), so a 16-row tile pays for 16 columns, not for 64 padded rows, on the tensor cores.
 *
 * Why: at 16 rows the mma.sync body (mla_tile.cuh) is bound by its consumer warps' latency
 * on short and single long requests (the trace snapshot of 128 requests ~50 us, B1 x 32k
 * ~28.5 us, H200), and the 64-row wgmma bodies pad 16 rows to 64.
 *
 * What it computes: as mla_tile.cuh (fiattn_run.h): s_j = bmm1_scale * (q_nope . ckv_j +
 * q_pe . kpe_j), out = bmm2_scale * softmax(s) . ckv, the mask rule of plan/mask.h, sinks
 * in the denominator, natural-log LSE.  P is rounded to q's 16-bit type, as in the other
 * 16-bit bodies.
 *
 * How (one CTA = two consumer warpgroups + one producer warpgroup, one CTA an SM):
 *  - Shared memory: Q [16 rows][576] as nine 128-byte-swizzled panels of 64 dims (8 ckv,
 *    1 kpe; [16][128 B] each); per consumer warpgroup P^T [16 rows][64 tokens] (one such
 *    panel); a ring of 2 blocks of 64 tokens, each K [64][576] in nine [64][128 B] panels
 *    (72 KB: two fit beside Q, three do not); the item's exchange rows (combine_halves).
 *    V = ckv is read from the K panels.
 *  - Producer warpgroup (72 registers, setmaxnreg): Q by 16-byte cp.async; a block wholly
 *    inside an item that starts on a box boundary by TMA (fi_mla_params.tma_box_rows =
 *    min(64, page_size) rows a box: 8 ckv boxes and 1 kpe box a page of the block, one lane
 *    a page), else by 16-byte cp.async (two threads a token, zeros past the item).
 *  - The consumer warpgroups (216 registers) take alternate blocks: global block g of the
 *    CTA sits in stage g % 2 and belongs to warpgroup g % 2, so each stage has one owner.
 *    A warpgroup's block: S^T = K Q^T (36 wgmma m64n16k16, A = K from the ring, B = Q;
 *    each panel's issued once it landed), free the kpe panel, the softmax over its columns
 *    (the column maxima meet in shared memory: one named barrier), P^T into its panel (one
 *    more barrier), O^T += V^T P^T (32 wgmma m64n16k16, A = V^T: the K panels read
 *    MN-major, B = P^T; a commit group an m-tile), each ckv panel freed once its m-tile is
 *    done.  The other warpgroup's block overlaps it (FlashAttention-3's ping-pong,
 *    unscheduled).  A stage is filled and freed by panels (one barrier pair a panel), so
 *    the producer refills panels of the next block while P V still reads the later ones
 *    (the split release of FlashMLA's seesaw kernel, here by panel).  Why: with the stage
 *    taken whole, the producer alone (no scores, no P V) streamed B128 x 4096 at 152 us
 *    against the whole kernel's 158; by panels the kernel takes 154 (H200, docs/perf-log.md
 *    thirty-ninth session).  An item's partial last block, by cp.async, lands on the
 *    stage's cfull instead (fill_block).
 *  - S^T / O^T accumulators: warp w holds M rows 16 w + g (+ 8) x columns 8 j + 2 q4 (+ 1)
 *    (g = lane / 4, q4 = lane % 4); for S^T the rows are tokens, for O^T of m-tile mt the
 *    dims 64 mt + 16 w + g (+ 8).  O^T [512][16] fp32 is 64 registers a thread.
 *  - At the item's end the two warpgroups' softmax states are made one (combine_halves,
 *    flash-decoding's rescale), each warpgroup then writing half of the output dims.
 *  - Splits: partial O / lse into the item's slot, merged by the shared split merge after
 *    the CTA's items (SplitMerge, cooperative only, as the other wgmma bodies).
 * Sources: FlashAttention-3 (Shah et al. 2024: producer / consumer warpgroups, ping-pong);
 * the transposed (swap-AB) decode tiling of TensorRT-LLM's XQA kernels; the online softmax
 * of FlashAttention-2 (Dao 2023); flash-decoding split-KV; the PTX ISA (wgmma descriptors,
 * the transpose bit of 16-bit operands, swizzle modes).  The layouts are this file's own.
 */
#pragma once

#include "executor/cuda/common/dtype.cuh"
#include "executor/cuda/common/profile.cuh"
#include "executor/cuda/common/ptx.cuh"
#include "executor/cuda/common/wgmma.cuh"
#include "executor/cuda/merge/split_merge.cuh"
#include "executor/mla/mla_params.h"
#include "executor/mla/mla_q.cuh"
#include "executor/mla/mla_wgt_common.cuh"
#include "plan/mask.h"

namespace fimlawgt16 {
using namespace fi;

using fimlat::kBlockN;
using fimlat::kProducerThreads;
using fimlat::kRows;
using fimlat::kThreads;
using fimlat::kWgThreads;
using fimlat::kXRows;
constexpr int kDqk = 576, kDv = 512;
constexpr int kPanels = kDqk / 64;           /* 9: 8 ckv + 1 kpe, 64 dims (128 B) each */

/* Shared memory (bytes from the dynamic base; every swizzle atom on its alignment): Q, the
 * control region (mla_wgt_common.cuh: P^T [16][64 tokens] a warpgroup, ...), the ring of
 * two 72-KB blocks (stage st is always warpgroup st's), the item's exchange. */
constexpr uint32_t kQPanel = kRows * 128;                  /* [16][128 B] */
constexpr uint32_t kOffQ = 0;
using C = fimlat::Ctl<kPanels * kQPanel, 2, kPanels>; /* a stage filled and freed by panels */
static_assert(C::kPWg == kRows * 128, "P^T [16][64 tokens] a warpgroup");
constexpr uint32_t kOffRing = 24576;
constexpr uint32_t kKPanel = kBlockN * 128;                /* [64][128 B] */
constexpr uint32_t kBlockBytes = kPanels * kKPanel;        /* 73728 */
constexpr uint32_t kOffX = kOffRing + C::kStages * kBlockBytes;
constexpr size_t kSmemBytes = kOffX + (size_t)fimlat::kConsumerWgs * kXRows * kWgThreads * 16;
static_assert(C::kEnd <= kOffRing && kOffRing % 1024 == 0 && kBlockBytes % 1024 == 0 &&
                  kSmemBytes <= 232448,
              "shared memory map");
using Lane = fimlat::Lane<C>;

__device__ __forceinline__ uint32_t stage_at(uint32_t s0, int st) { return s0 + kOffRing + st * kBlockBytes; }

/* ---- producer ------------------------------------------------------------------------ */

/* Block b into the ring block at `base` by 16-byte cp.async: thread pt copies token pt / 2,
 * its 16-byte chunks pt % 2, pt % 2 + 2, ... of 72 (64 of ckv, 8 of kpe); zeros past the
 * item.  pg: page_of. */
template <typename T>
__device__ __forceinline__ void copy_block(const fi_mla_params &p, const fi_work_item &it, uint32_t base,
                                           int b, int pt, int32_t pg, uint64_t pol) {
    const int tok = pt >> 1, t = it.kv_begin + b * kBlockN + tok;
    const bool in = t < it.kv_end;
    const int64_t slot = t & (p.c.page_size - 1);
    const uint8_t *ckv = (const uint8_t *)((const T *)p.m.ckv + (int64_t)pg * p.m.ckv_stride_page + slot * p.m.ckv_stride_tok);
    const uint8_t *kpe = (const uint8_t *)((const T *)p.m.kpe + (int64_t)pg * p.m.kpe_stride_page + slot * p.m.kpe_stride_tok);
#pragma unroll
    for (int i = 0; i < kDqk / 16; ++i) {
        const int c = (pt & 1) + 2 * i;
        const uint32_t dst = base + (c >> 3) * kKPanel + sw128_8(tok, (c & 7) * 16);
        const uint8_t *src = c < 64 ? ckv + 16 * c : kpe + 16 * (c - 64);
        cp_async16(dst, in ? src : (const uint8_t *)p.m.ckv, in ? 16 : 0, pol);
    }
}

/* The order in which a stage's owner frees its panels, and the producer refills them: kpe
 * (panel 8) once the scores are done, ckv panel i once P V's m-tile i is done. */
__device__ __forceinline__ int panel_order(int k) { return k == 0 ? kPanels - 1 : k - 1; }

/* Block b into stage st (phase ph of its barriers), panel by panel as the owner frees them
 * (C::kParts = 9: one full and one empty barrier a panel, one arrival a warp), so that a
 * refill starts while the owner's P V still reads the later panels.  maps (a block wholly
 * inside an item starting on a box boundary): the thread that copies the first token of a
 * box (R = tma_box_rows tokens, one page) issues the panel's box after raising its
 * transaction count; else every panel freed first, then 16-byte cp.async (copy_block)
 * landing on the stage's cfull, the panels' full barriers arrived without bytes (so their
 * phases still count blocks).  pg: page_of (that token's page). */
template <typename T>
__device__ __forceinline__ void fill_block(const fi_mla_params &p, const fi_work_item &it, uint32_t s0, int st,
                                           uint32_t ph, int b, bool maps, int pt, int32_t pg, uint64_t pol) {
    const uint32_t base = stage_at(s0, st);
    const bool leader = (pt & 31) == 0;
    if (maps) {
        const int tok = pt >> 1, R = p.tma_box_rows;
        const bool issuer = (pt & 1) == 0 && (tok & (R - 1)) == 0;
        const int slot = (it.kv_begin + b * kBlockN + tok) & (p.c.page_size - 1);
#pragma unroll 1
        for (int k = 0; k < kPanels; ++k) {
            const int i = panel_order(k);
            const uint32_t bar = C::full(s0, st, i), dst = base + i * kKPanel + tok * 128;
            mbar_wait(C::empty(s0, st, i), ph ^ 1u);
            if (issuer) {
                mbar_expect_tx_only(bar, (uint32_t)R * 128);
                if (i < kPanels - 1)
                    tma_load_3d(dst, &p.tma_ckv, 64 * i, slot, pg, bar, pol);
                else
                    tma_load_3d(dst, &p.tma_kpe, 0, slot, pg, bar, pol);
            }
            __syncwarp();
            if (leader)
                mbar_arrive(bar);
        }
        return;
    }
#pragma unroll 1
    for (int i = 0; i < kPanels; ++i)
        mbar_wait(C::empty(s0, st, i), ph ^ 1u);
    copy_block<T>(p, it, base, b, pt, pg, pol);
    cp_async_mbar_arrive(C::cfull(s0, st));
    __syncwarp();
    if (leader)
        for (int i = 0; i < kPanels; ++i)
            mbar_arrive(C::full(s0, st, i));
}

/* ---- consumers ----------------------------------------------------------------------- */

/* S^T = K Q^T over the 576 dims of stage st (phase ph): 36 wgmma m64n16k16 (A = K,
 * K-major, B = Q, K-major), each panel's 4 issued once it landed, in panel_order (the
 * order the producer refills them); one commit group (not waited for). */
template <typename T>
__device__ __forceinline__ void issue_scores(float *S, uint32_t s0, int st, uint32_t ph) {
    const uint32_t kb = stage_at(s0, st);
    const WgDesc dk = wg_desc_base(kb, 16, 1024);
    const WgDesc dq = wg_desc_base(s0 + kOffQ, 16, 1024);
#pragma unroll
    for (int i = 0; i < 8; ++i)
        S[i] = 0.f;
    wg_pin<8>(S); /* the zeros written before the fence (C7515) */
    wg_fence();
#pragma unroll
    for (int j = 0; j < kPanels; ++j) {
        const int i = panel_order(j);
        mbar_wait(C::full(s0, st, i), ph);
#pragma unroll
        for (int k = 0; k < 4; ++k)
            Wgmma<16, T>::template ss<0>(S, dk.at(i * kKPanel + k * 32), dq.at(i * kQPanel + k * 32),
                                         j > 0 || k > 0);
    }
    wg_commit();
}

/* O^T += V^T P^T: m-tile mt (dims 64 mt ..) takes ckv panel mt read MN-major (the transpose
 * bit: M = dims along the panel's 128-byte rows, K = tokens; a k16 step is 16 rows, 2048
 * B), B = the warpgroup's P^T panel at sp (K-major).  One commit group an m-tile (so that
 * free_pv_panels can free each panel once its m-tile is done), not waited for. */
template <typename T>
__device__ __forceinline__ void issue_pv(float (*O)[8], uint32_t kb, uint32_t sp) {
    const WgDesc dv = wg_desc_base(kb, kKPanel, 1024);
    const WgDesc dp = wg_desc_base(sp, 16, 1024);
    wg_fence();
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
#pragma unroll
        for (int ks = 0; ks < kBlockN / 16; ++ks)
            Wgmma<16, T>::template ss<0, 1>(O[mt], dv.at(mt * kKPanel + ks * 2048), dp.at(ks * 32), 1);
        wg_commit();
    }
}

/* Panel i of stage st freed by this warp (one arrival a warp: C::kParts > 1), after the
 * warp's wgmma that read it are done. */
__device__ __forceinline__ void free_panel(uint32_t s0, int st, int i, int lane) {
    __syncwarp();
    if (lane == 0)
        mbar_arrive(C::empty(s0, st, i));
}

/* P V's m-tiles N .. 7 waited for in order (issue_pv's commit groups), ckv panel mt freed
 * as soon as its m-tile is done. */
template <int N> __device__ __forceinline__ void free_pv_panels(uint32_t s0, int st, int lane) {
    if constexpr (N < 8) {
        wg_wait<7 - N>();
        free_panel(s0, st, N, lane);
        free_pv_panels<N + 1>(s0, st, lane);
    }
}

/* One block's softmax (tokens t0 ..; S the raw S^T accumulator): mask and scale, the
 * columns' new running max m over the warpgroup (red), O and l rescaled, P^T = exp2(S - m)
 * in T into the warpgroup's P panel, the weights added to l. */
template <typename T>
__device__ __forceinline__ void softmax(const RunCtx &ctx, const Lane &ln, const float *S, int t0,
                                        const int *lo, const int *hi, float *m, float *l,
                                        float (*O)[8], unsigned char *smem) {
    float v[8], mu[4];
    fimlat::column_max(ctx, ln, S, t0, lo, hi, m, l, O, smem, v, mu);
    const int tb = 16 * ln.w + ln.g; /* block token of v[4 j + e], + 8 for v[4 j + 2 + e] */
    /* P^T [column][token] (K-major B of O^T += V^T P^T): 16-bit stores, the rounded weight
     * also what l sums, so numerator and denominator see the same P. */
    const uint32_t sp = smem_u32(smem + ln.p_off());
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const int j = c >> 1, e = c & 1, r = ln.row(c);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const uint32_t h = Dt<T>::pack(ex2_ftz(v[4 * j + 2 * i + e] - mu[c]), 0.f) & 0xffffu;
            l[c] += Dt<T>::unpack(h).x;
            asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(sp + sw128(r, tb + 8 * i)), "h"((uint16_t)h)
                         : "memory");
        }
    }
}

/* The item's rows out from warpgroup wg's half of O^T (Oh: m-tiles 4 wg ..; L: the column
 * sums, mla_wgt_common.cuh item_end): unsplit, out = bmm2 O / L with the sink (out_row), T
 * scalars; split, the fp32 partial O / L and lse_keys into the item's slot.  Thread (w, g)
 * holds dims 256 wg + 64 i + 16 w + g (+ 8) of its four rows. */
template <typename T>
__device__ __forceinline__ void store_rows(const fi_mla_params &p, const RunCtx &ctx,
                                           const fi_work_item &it, const fi_request_info &rq,
                                           const Lane &ln, float (*Oh)[8], const float *m, const float *L) {
    const fi_exec_common &c = p.c;
    const int nh = it.head_end - it.head_begin, M = (it.q_end - it.q_begin) * nh;
    const bool lse_writer = ln.wg == 0 && ln.w == 0 && ln.g == 0;
    const int d0 = 256 * ln.wg + 16 * ln.w + ln.g;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int j = k >> 1, e = k & 1, r = ln.row(k);
        if (r >= M)
            continue;
        const float lse_keys = row_lse_keys(m[k], L[k]);
        if (it.out_slot >= 0) {
            const float f = L[k] == 0.f ? 0.f : 1.f / L[k];
            float *dst = c.partial_o + ((int64_t)it.out_slot * c.tile_rows + r) * kDv + d0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                __stcg(dst + 64 * i, Oh[i][4 * j + e] * f);
                __stcg(dst + 64 * i + 8, Oh[i][4 * j + 2 + e] * f);
            }
            if (lse_writer)
                __stcg(c.partial_lse + (int64_t)it.out_slot * c.tile_rows + r, lse_keys);
        } else {
            const OutRow o = out_row(c, ctx, it, rq, nh, r, lse_keys, L[k]);
            T *out = static_cast<T *>(c.out) + o.tok * c.out_stride_tok + o.h * c.out_stride_head + d0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const uint32_t v = Dt<T>::pack(Oh[i][4 * j + e] * o.f, Oh[i][4 * j + 2 + e] * o.f);
                reinterpret_cast<uint16_t *>(out + 64 * i)[0] = (uint16_t)(v & 0xffffu);
                reinterpret_cast<uint16_t *>(out + 64 * i + 8)[0] = (uint16_t)(v >> 16);
            }
            if (c.lse && lse_writer)
                c.lse[o.tok * c.lse_stride_tok + o.h * c.lse_stride_head] = o.lse;
        }
    }
}

/* The family: q, cache and out of one 16-bit type T, tiles of at most 16 rows. */
template <typename T> struct MlaWgt16Family {
    using Params = fi_mla_params;
    /* 8 splits' loads in flight in a one-unit merge slice: B1 x 32k heads 16 (16 parts of 8
     * splits) 26.1-26.3 -> 24.9-25.0 us b2b against 4 (12 and 16 spill there; H200,
     * docs/perf-log.md forty-first session) */
    using Merge = SplitMerge<kDv, kRows, T, kThreads, false, 1 << 30, 8>;
    static constexpr int kThreads = fimlat::kThreads;
    static constexpr int kProducerWarps = fimlat::kProducerWarps;
    static constexpr int kConsumerRegs = fimlat::kConsumerRegs;
    static constexpr size_t kSmemBytes = fimlawgt16::kSmemBytes;
    using State = fimlat::Consumed;

    static __device__ __forceinline__ State setup(unsigned char *smem) {
        C::init(smem_u32(smem));
        return State{0, 0u, 0u};
    }

    /* The producer warpgroup (fimlat::produce_blocks): Q by cp.async, blocks by TMA or
     * cp.async. */
    static __device__ void produce(const fi_mla_params &p, const fi_cta_start &cs, unsigned char *smem) {
        setmaxnreg_dec<fimlat::kProducerRegs>();
        const uint32_t s0 = smem_u32(smem);
        const int pt = (int)threadIdx.x - kThreads;
        fimlat::produce_blocks<C>(
            p, cs, s0, pt,
            [&](const fi_work_item &it, const fi_request_info &rq) {
                fimlaq::produce_q16<T, kRows, kProducerThreads>(p, it, rq, s0 + kOffQ, pt);
            },
            [&](const fi_work_item &it, int st, uint32_t ph, int b, bool maps, int32_t pg, uint64_t pol) {
                fill_block<T>(p, it, s0, st, ph, b, maps, pt, pg, pol);
            });
    }

    /* One item on the two consumer warpgroups: warpgroup wg takes the item's blocks of
     * global index gb + b = wg (mod 2) (header), then the item's end (item_end) and its
     * half of the rows out. */
    static __device__ bool run_item(const fi_mla_params &p, const RunCtx &ctx, const fi_work_item &it,
                                    const fi_request_info &rq, unsigned char *smem, bool first,
                                    State &cs) {
        (void)first; /* profiling stamps only (FI_STAMP2: the CTA's first item) */
        const uint32_t s0 = smem_u32(smem);
        const Lane ln = Lane::of_thread();
        const uint32_t sp = s0 + ln.p_off();
        const int nblk = uniform(fimlat::blocks_of(it));
        const int gb = uniform(cs.gb);
        const int b0 = (ln.wg ^ gb) & 1; /* this warpgroup's first block of the item */
        uint32_t cph = cs.cph;           /* its stage's cfull (stage wg: header) */
        int lo[4], hi[4];
        float O[8][8], m[4], l[4];
        fimlat::item_start(ctx, it, rq, ln, lo, hi, O, m, l);
        mbar_wait(C::qfull(s0), cs.qph);
        if (first)
            FI_STAMP2(0);
        /* Profiling builds: a round's phases (profile.cuh FI_PHASE): 0 the panels awaited and
         * S issued, 1 S awaited, 2 the softmax (its column-max barrier included), 3 the
         * barrier before P V, 4 P V issued, 5 P V awaited (panels freed) */
        FI_PHASE_START();
        float S[8];
        for (int b = b0; b < nblk; b += 2) {
            FI_PHASE_ROUND();
            const int g = gb + b, st = g & (C::kStages - 1);
            const uint32_t kb = stage_at(s0, st);
            if (!fimlat::maps_block(p, it, b)) { /* by cp.async: ordinary writes, read by wgmma */
                mbar_wait(C::cfull(s0, st), cph);
                cph ^= 1u;
                fence_proxy_async();
            }
            issue_scores<T>(S, s0, st, (uint32_t)(g / C::kStages) & 1u);
            FI_PHASE(0);
            wg_wait<0>();
            wg_pin<8>(S);
            FI_PHASE(1);
            if (first && b == b0)
                FI_STAMP2(1);
            free_panel(s0, st, kPanels - 1, ln.lane); /* kpe: the scores were its one reader */
            if (b + 2 >= nblk) /* every score of the warpgroup's blocks done: Q is free for it */
                mbar_arrive(C::qempty(s0));
            softmax<T>(ctx, ln, S, it.kv_begin + b * kBlockN, lo, hi, m, l, O, smem);
            FI_PHASE(2);
            fence_proxy_async(); /* P^T: ordinary stores, read by wgmma */
            nbar_sync(ln.bar(), kWgThreads);
            FI_PHASE(3);
            issue_pv<T>(O, kb, sp);
            FI_PHASE(4);
            /* the ckv panels' one reader is wgmma: each refilled once its m-tile is done */
            free_pv_panels<0>(s0, st, ln.lane);
            FI_PHASE(5);
#pragma unroll
            for (int mt = 0; mt < 8; ++mt)
                wg_pin<8>(O[mt]);
        }
        if (b0 >= nblk)
            mbar_arrive(C::qempty(s0));
        cs.qph ^= 1u;
        cs.gb = gb + nblk;
        cs.cph = cph;
        FI_PHASE_END();
        FI_STAMP2(2);
        float Oh[4][8], L[4];
        fimlat::item_end<C, kOffX>(ln, O, m, l, Oh, smem, L);
        store_rows<T>(p, ctx, it, rq, ln, Oh, m, L);
        FI_STAMP2(3);
        if (it.out_slot < 0)
            return false;
        return Merge::arrive(p.c, ctx, it, reinterpret_cast<int *>(smem + C::kOffFlag),
                             reinterpret_cast<float *>(smem + C::kOffW), reinterpret_cast<float *>(smem + C::kOffRow));
    }
};

}  // namespace fimlawgt16
