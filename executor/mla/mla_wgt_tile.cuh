/*
 * executor/mla/mla_wgt_tile.cuh - the MLA decode family's transposed fp8 body (sm_90a):
 * q and the KV cache fp8 e4m3, out bf16, tiles of at most 16 rows (heads 16 at q_len 1:
 * DeepSeek's per-GPU heads under tensor parallelism 8, `xqa_mla`).  Both matmuls run on
 * the fp8 tensor cores with the KV block as wgmma's M side ("swap AB"), so a 16-row tile
 * pays for 16 columns, not for 64 padded rows, and no KV byte is converted or transposed.
 *
 * Why: at 16 rows the mma.sync body converts every fp8 byte to fp16 and runs
 * latency-bound (perf-log 2026-11-27: ~155 us for B128 x 4096, as for a bf16 cache, with
 * half the bytes); the 64-row fp8 wgmma body pads 16 rows to 64 and writes V^T in shared
 * memory, which costs as much.  Here the work a KV byte costs is small and the kernel is
 * meant to be bound by the KV stream.
 *
 * What it computes: as mla_tile.cuh (fiattn_run.h): s_j = bmm1_scale * (q_nope . ckv_j +
 * q_pe . kpe_j), out = bmm2_scale * softmax(s) . ckv, the mask rule of plan/mask.h, sinks
 * in the denominator, natural-log LSE; bmm1 / bmm2 fold the quantisation scales.  P is
 * rounded to e4m3 in two terms (P_hi = e4m3(2^8 p), P_lo = e4m3(2^8 p - P_hi)), so P V
 * carries p to ~2^-8 relative, as the 64-row fp8 body.
 *
 * How (one CTA = two consumer warpgroups + one producer warpgroup, one CTA an SM):
 *  - Shared memory: Q [16 rows][576 B] as four 128-byte-swizzled panels of ckv dims and a
 *    [16][64 B] kpe panel (64-byte swizzle); per consumer warpgroup P^T hi and lo [16 rows]
 *    [64 tokens] (64-byte swizzle); a ring of 4 blocks of 64 tokens, each K [64][576 B] in
 *    the same panels (4 x 8 KB + 4 KB); the item's exchange rows (combine_halves).  V = ckv
 *    is read from the K panels.
 *  - Producer warpgroup (72 registers, setmaxnreg): Q by 16-byte cp.async; a block wholly
 *    inside an item that starts on a box boundary by TMA (fi_mla_params.tma_box_rows =
 *    min(64, page_size) rows a box: 4 ckv boxes and 1 kpe box a page of the block, one lane
 *    a page), else by 16-byte cp.async (two threads a token, a token's page from the page
 *    table; keys past the item zero-filled, so P = 0 never meets NaN bit patterns).  full
 *    / empty mbarriers a stage.
 *  - The consumer warpgroups (216 registers) take alternate blocks: global block g of the
 *    CTA (its items' blocks in order) sits in stage g % 4 and belongs to warpgroup g % 2,
 *    so each stage has one owner, which waits each phase of its barriers in order (an odd
 *    ring would let a parity wait pass on the other warpgroup's phase: perf-log,
 *    twenty-second session).  Each keeps its own softmax state over its blocks; at the
 *    item's end combine_halves makes them one, each warpgroup then writing half of the
 *    output dims.  One warpgroup is one warp a scheduler and alternates an ALU half and a
 *    tensor-core half each block; two overlap one's softmax with the other's matmuls
 *    (FlashAttention-3's ping-pong, here without an explicit schedule).  H200: B128 x 4096
 *    85.3-86.9 -> 84.0-85.9 us, the trace snapshot 35.3-36.5 -> 29.4-31.9, B1 x 32k
 *    24.1-24.3 -> 22.5-22.8 (perf-log, thirty-sixth session).
 *  - A consumer warpgroup, per block of its own: S^T = K Q^T, 18 wgmma m64n16k32 (A = K
 *    from the ring, B = Q); warp w holds tokens 16 w + g (+ 8) x rows 8 j + 2 q4 (+ 1)
 *    (g = lane / 4, q4 = lane % 4).  The block's column maxima meet in shared memory
 *    (one named barrier); P^T's bytes go to the P panels (a shuffle between lane pairs,
 *    one more barrier);
 *    O^T += V^T P^T, 2 x 16 wgmma m64n16k32 with A = V^T from registers: ldmatrix.trans of
 *    a 16-byte chunk (16 dims) of 32 tokens gives lane (g, q4) dims (2 g, 2 g + 1) x
 *    tokens (2 q4, 2 q4 + 1) of each 8-token group, and the byte permutations 0x6420 /
 *    0x7531 of two groups' registers give the A fragments of dim 2 g (M row g) and 2 g + 1
 *    (M row g + 8) at k = tokens {2 q4, 2 q4 + 1, 8 + 2 q4, 9 + 2 q4}.  So token p of a
 *    16-token group sits at k position 4 (p % 8 / 2) + p % 2 + 2 (p / 8) of P^T, and O^T's
 *    M row 16 w + g (+ 8) of m-tile mt is dim 64 mt + 16 w + 2 g (+ 1).
 *  - A warpgroup's round of its block b: V^T fragments of b from shared memory, the
 *    softmax of S_b, then P_b V_b and its next block's S_{b+2} issued together and waited
 *    for once, so the tensor cores run the two back to back; then the ring block is freed
 *    (V's loads have returned: see run_item).  (The twenty-second session's two warpgroups
 *    shared barriers on a 5-stage ring: slower, and wrong.)
 *  - O^T [512][16] fp32 lives in 64 registers a thread; the running max is one per column
 *    and the same in every thread; row sums are summed over the warpgroup at the end.
 *  - Splits: partial O / lse into the item's slot, merged by the shared split merge after
 *    the CTA's items (SplitMerge, cooperative only, as the other wgmma bodies).
 * Sources: FlashAttention-3 (Shah et al. 2024: fp8 wgmma, P in e4m3, producer / consumer
 * warpgroups); the transposed (swap-AB) decode tiling of TensorRT-LLM's XQA kernels; the
 * online softmax of FlashAttention-2 (Dao 2023); flash-decoding split-KV; the PTX ISA
 * (wgmma register fragments, swizzle modes).  The layouts are this file's own.
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

namespace fimlawgt {
using namespace fi;

using fimlat::kBlockN;
using fimlat::kProducerThreads;
using fimlat::kRows;
using fimlat::kThreads;
using fimlat::kWgThreads;
using fimlat::kXRows;
constexpr int kDqk = 576, kDv = 512;
constexpr int kPLog2 = 8;                    /* P x 2^8: small weights above e4m3's subnormals */

/* Shared memory (bytes from the dynamic base; every swizzle atom on its alignment): Q, the
 * control region (mla_wgt_common.cuh; a warpgroup's P^T hi and lo [16][64 B]), the ring of
 * 4 blocks, the item's exchange. */
constexpr uint32_t kQPanel = kRows * 128;                  /* [16][128 B] */
constexpr uint32_t kOffQ = 0, kOffQpe = 4 * kQPanel;       /* [16][64 B] at 8192 */
constexpr uint32_t kPBytes = kRows * 64;                   /* P^T [16][64 B] */
using C = fimlat::Ctl<kOffQpe + 1024, 4>;
static_assert(C::kPWg == 2 * kPBytes, "a warpgroup's P^T hi, then lo");
constexpr uint32_t kOffRing = 16384;
constexpr uint32_t kKPanel = kBlockN * 128;                /* [64][128 B] */
constexpr uint32_t kOffKpe = 4 * kKPanel;                  /* [64][64 B] */
constexpr uint32_t kBlockBytes = kOffKpe + kBlockN * 64;   /* 36864 */
constexpr uint32_t kOffX = kOffRing + C::kStages * kBlockBytes;
constexpr size_t kSmemBytes = kOffX + (size_t)fimlat::kConsumerWgs * kXRows * kWgThreads * 16;
static_assert(C::kEnd <= kOffRing && kOffRing % 1024 == 0 && kBlockBytes % 1024 == 0 &&
                  kSmemBytes <= 232448,
              "shared memory map");
using Lane = fimlat::Lane<C>;

__device__ __forceinline__ uint32_t stage_at(uint32_t s0, int st) { return s0 + kOffRing + st * kBlockBytes; }

/* ---- producer ------------------------------------------------------------------------ */

/* Block b into the ring block at `base` by 16-byte cp.async: thread pt copies token pt / 2,
 * its 16-byte chunks pt % 2, pt % 2 + 2, ... of 36 (32 of ckv, 4 of kpe); zeros past the
 * item.  pg: page_of. */
__device__ __forceinline__ void copy_block(const fi_mla_params &p, const fi_work_item &it, uint32_t base,
                                           int b, int pt, int32_t pg, uint64_t pol) {
    const int tok = pt >> 1, t = it.kv_begin + b * kBlockN + tok;
    const bool in = t < it.kv_end;
    const int64_t slot = t & (p.c.page_size - 1);
    const uint8_t *ckv = (const uint8_t *)p.m.ckv + (int64_t)pg * p.m.ckv_stride_page + slot * p.m.ckv_stride_tok;
    const uint8_t *kpe = (const uint8_t *)p.m.kpe + (int64_t)pg * p.m.kpe_stride_page + slot * p.m.kpe_stride_tok;
#pragma unroll
    for (int i = 0; i < kDqk / 32; ++i) {
        const int c = (pt & 1) + 2 * i;
        const uint32_t dst = c < 32 ? base + (c >> 3) * kKPanel + sw128_8(tok, (c & 7) * 16)
                                    : base + kOffKpe + sw64_8(tok, (c - 32) * 16);
        const uint8_t *src = c < 32 ? ckv + 16 * c : kpe + 16 * (c - 32);
        cp_async16(dst, in ? src : (const uint8_t *)p.m.ckv, in ? 16 : 0, pol);
    }
}

/* Block b by tensor maps (the block wholly inside the item, the item starting on a box
 * boundary): the thread that copies the first token of a box (R = tma_box_rows tokens, one
 * page) issues its 4 ckv boxes and 1 kpe box on `bar`, whose transaction count it raises
 * first.  pg: page_of (that token's page). */
__device__ __forceinline__ void map_block(const fi_mla_params &p, const fi_work_item &it, uint32_t base,
                                          int b, int pt, int32_t pg, uint32_t bar, uint64_t pol) {
    const int tok = pt >> 1, R = p.tma_box_rows;
    if ((pt & 1) != 0 || (tok & (R - 1)) != 0)
        return;
    const int slot = (it.kv_begin + b * kBlockN + tok) & (p.c.page_size - 1);
    mbar_expect_tx_only(bar, (uint32_t)R * (4 * 128 + 64));
#pragma unroll
    for (int i = 0; i < 4; ++i)
        tma_load_3d(base + i * kKPanel + tok * 128, &p.tma_ckv, 128 * i, slot, pg, bar, pol);
    tma_load_3d(base + kOffKpe + tok * 64, &p.tma_kpe, 0, slot, pg, bar, pol);
}

/* ---- consumers ----------------------------------------------------------------------- */

/* S^T = K Q^T over the 576 dims of the ring block at kb: 16 wgmma m64n16k32 over the ckv
 * panels, 2 over kpe, one commit group (not waited for). */
__device__ __forceinline__ void issue_scores(float *S, uint32_t s0, uint32_t kb) {
    const WgDesc dk = wg_desc_base(kb, 16, 1024);
    const WgDesc dq = wg_desc_base(s0 + kOffQ, 16, 1024);
    const WgDesc dkp = wg_desc_base(kb + kOffKpe, 16, 512, 2);
    const WgDesc dqp = wg_desc_base(s0 + kOffQpe, 16, 512, 2);
#pragma unroll
    for (int i = 0; i < 8; ++i)
        S[i] = 0.f;
    wg_pin<8>(S); /* the zeros written before the fence (C7515) */
    wg_fence();
#pragma unroll
    for (int k = 0; k < 16; ++k)
        Wgmma8<16>::ss(S, dk.at((k >> 2) * kKPanel + (k & 3) * 32), dq.at((k >> 2) * kQPanel + (k & 3) * 32), k > 0);
#pragma unroll
    for (int k = 0; k < 2; ++k)
        Wgmma8<16>::ss(S, dkp.at(k * 32), dqp.at(k * 32), 1);
    wg_commit();
}

/* V^T A fragments of the ring block at kb for warp w: av[mt][ks] covers dims 64 mt + 16 w
 * .. (chunk 4 (mt % 2) + w of ckv panel mt / 2) x tokens 32 ks .. 32 ks + 31 (header). */
__device__ __forceinline__ void v_fragments(uint32_t kb, int w, int lane, uint32_t (*av)[2][4]) {
#pragma unroll
    for (int mt = 0; mt < 8; ++mt)
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
            const int tok = 32 * ks + 8 * (lane >> 3) + (lane & 7), c = 4 * (mt & 1) + w;
            uint32_t v[4];
            ldsm_x4_t(kb + (mt >> 1) * kKPanel + tok * 128 + ((c ^ (tok & 7)) << 4), v);
            av[mt][ks][0] = __byte_perm(v[0], v[1], 0x6420);
            av[mt][ks][1] = __byte_perm(v[0], v[1], 0x7531);
            av[mt][ks][2] = __byte_perm(v[2], v[3], 0x6420);
            av[mt][ks][3] = __byte_perm(v[2], v[3], 0x7531);
        }
}


/* O^T += V^T (P_hi^T + P_lo^T): both P panels of the warpgroup (at sp) against the same A
 * registers (one commit group, not waited for). */
__device__ __forceinline__ void issue_pv(float (*O)[8], uint32_t (*av)[2][4], uint32_t sp) {
    const WgDesc dh = wg_desc_base(sp, 16, 512, 2);
    const WgDesc dl = wg_desc_base(sp + kPBytes, 16, 512, 2);
    wg_fence();
#pragma unroll
    for (int mt = 0; mt < 8; ++mt)
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
            Wgmma8<16>::rs(O[mt], av[mt][ks], dh.at(ks * 32), 1);
            Wgmma8<16>::rs(O[mt], av[mt][ks], dl.at(ks * 32), 1);
        }
    wg_commit();
}

/* One block's softmax (tokens t0 ..; S the raw S^T accumulator): mask and scale, the
 * columns' new running max m over the warpgroup (red), O and l rescaled, P^T = 2^8 exp2(S
 * - m) in two e4m3 terms into the P panels, the weights added to l. */
__device__ __forceinline__ void softmax(const RunCtx &ctx, const Lane &ln, const float *S, int t0,
                                        const int *lo, const int *hi, float *m, float *l,
                                        float (*O)[8], unsigned char *smem) {
    float v[8], sub[4];
    fimlat::column_max(ctx, ln, S, t0, lo, hi, m, l, O, smem, v, sub);
#pragma unroll
    for (int c = 0; c < 4; ++c)
        sub[c] -= (float)kPLog2;
    /* own[c]: column c's bytes (hi tok i0, hi tok i1, lo tok i0, lo tok i1); an even-g lane
     * writes the rows of e = 0 and its odd partner (lane ^ 4, the next token of the pair)
     * those of e = 1, 4 consecutive k bytes each (header: k position of the tokens). */
    uint32_t own[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const int j = c >> 1, e = c & 1;
        const float p0 = ex2_ftz(v[4 * j + e] - sub[c]), p1 = ex2_ftz(v[4 * j + 2 + e] - sub[c]);
        l[c] += p0 + p1;
        const uint16_t h = e4m3x2(p0, p1);
        const uint32_t hf = e4m3x2_to_f16x2(h);
        const float2 q = __half22float2(*reinterpret_cast<const __half2 *>(&hf));
        own[c] = (uint32_t)h | ((uint32_t)e4m3x2(p0 - q.x, p1 - q.y) << 16);
    }
    const bool odd = ln.g & 1;
    const uint32_t ph = smem_u32(smem + ln.p_off()), pl = ph + kPBytes;
    const int kbyte = 32 * (ln.w >> 1) + 16 * (ln.w & 1) + 4 * (ln.g >> 1);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const uint32_t recv = __shfl_xor_sync(0xffffffffu, odd ? own[2 * j] : own[2 * j + 1], 4);
        const uint32_t first = odd ? recv : own[2 * j], second = odd ? own[2 * j + 1] : recv;
        const int row = 8 * j + 2 * ln.q4 + (odd ? 1 : 0);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ph + sw64_8(row, kbyte)),
                     "r"(__byte_perm(first, second, 0x5140))
                     : "memory");
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(pl + sw64_8(row, kbyte)),
                     "r"(__byte_perm(first, second, 0x7362))
                     : "memory");
    }
}

/* The item's rows out from warpgroup wg's half of O^T (Oh: m-tiles 4 wg ..; Ls: the column
 * sums, mla_wgt_common.cuh item_end), the P scale 2^8 taken out; unsplit, out = bmm2 O / l
 * with the sink (out_row), bf16 pairs of consecutive dims; split, the fp32 partial O / l
 * and lse_keys into the item's slot.  Thread (w, g) holds dims 64 mt + 16 w + 2 g + {0, 1}
 * of its four rows. */
__device__ __forceinline__ void store_rows(const fi_mla_params &p, const RunCtx &ctx,
                                           const fi_work_item &it, const fi_request_info &rq,
                                           const Lane &ln, float (*Oh)[8], const float *m, const float *Ls) {
    const fi_exec_common &c = p.c;
    const int nh = it.head_end - it.head_begin, M = (it.q_end - it.q_begin) * nh;
    constexpr float kDown = 1.f / (1 << kPLog2);
    float L[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
        L[k] = Ls[k] * kDown;
    const bool lse_writer = ln.wg == 0 && ln.w == 0 && ln.g == 0;
    const int d0 = 256 * ln.wg + 16 * ln.w + 2 * ln.g;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int j = k >> 1, e = k & 1, r = ln.row(k);
        if (r >= M)
            continue;
        const float lse_keys = row_lse_keys(m[k], L[k]);
        if (it.out_slot >= 0) {
            const float f = L[k] == 0.f ? 0.f : kDown / L[k];
            float *dst = c.partial_o + ((int64_t)it.out_slot * c.tile_rows + r) * kDv + d0;
#pragma unroll
            for (int i = 0; i < 4; ++i)
                __stcg(reinterpret_cast<float2 *>(dst + 64 * i),
                       make_float2(Oh[i][4 * j + e] * f, Oh[i][4 * j + 2 + e] * f));
            if (lse_writer)
                __stcg(c.partial_lse + (int64_t)it.out_slot * c.tile_rows + r, lse_keys);
        } else {
            const OutRow o = out_row(c, ctx, it, rq, nh, r, lse_keys, L[k]);
            const float f = o.f * kDown;
            __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(c.out) + o.tok * c.out_stride_tok + o.h * c.out_stride_head + d0;
#pragma unroll
            for (int i = 0; i < 4; ++i)
                *reinterpret_cast<uint32_t *>(out + 64 * i) =
                    Dt<__nv_bfloat16>::pack(Oh[i][4 * j + e] * f, Oh[i][4 * j + 2 + e] * f);
            if (c.lse && lse_writer)
                c.lse[o.tok * c.lse_stride_tok + o.h * c.lse_stride_head] = o.lse;
        }
    }
}

/* The family: q and cache fp8 e4m3, out bf16, tiles of at most 16 rows. */
struct MlaWgtFamily {
    using Params = fi_mla_params;
    /* 8 splits' loads in flight in a one-unit merge slice: fp8 B1 x 32k heads 16 22.6 ->
     * 21.1 us b2b against 4 (12 and 16 spill there and in the kernel; H200, docs/perf-log.md
     * forty-first session) */
    using Merge = SplitMerge<kDv, kRows, __nv_bfloat16, kThreads, false, 1 << 30, 8>;
    static constexpr int kThreads = fimlat::kThreads;
    static constexpr int kProducerWarps = fimlat::kProducerWarps;
    static constexpr int kConsumerRegs = fimlat::kConsumerRegs;
    static constexpr size_t kSmemBytes = fimlawgt::kSmemBytes;
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
                fimlaq::produce_q_e4m3<kRows, kProducerThreads>(p, it, rq, s0 + kOffQ, pt);
            },
            [&](const fi_work_item &it, int st, uint32_t ph, int b, bool maps, int32_t pg, uint64_t pol) {
                fimlat::fill_whole<C>(
                    s0, s0 + kOffRing, kBlockBytes, st, ph, maps,
                    [&](uint32_t base, uint32_t bar) { map_block(p, it, base, b, pt, pg, bar, pol); },
                    [&](uint32_t base) { copy_block(p, it, base, b, pt, pg, pol); });
            });
    }

    /* One item on the two consumer warpgroups: warpgroup wg takes the item's blocks of
     * global index gb + b = wg (mod 2), in rounds (header), then combine_halves and its
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
        int lo[4], hi[4];
        float O[8][8], m[4], l[4];
        fimlat::item_start(ctx, it, rq, ln, lo, hi, O, m, l);
        mbar_wait(C::qfull(s0), cs.qph);
        if (first)
            FI_STAMP2(0);
        float S[8];
        auto start_scores = [&](int b) { /* S of the item's block b, once its copies landed */
            const int g = gb + b, st = g & (C::kStages - 1);
            mbar_wait(C::full(s0, st), (uint32_t)(g / C::kStages) & 1u);
            fence_proxy_async(); /* cp.async rows, read by wgmma */
            issue_scores(S, s0, stage_at(s0, st));
        };
        if (b0 < nblk) {
            start_scores(b0);
            wg_wait<0>();
            wg_pin<8>(S);
            if (first)
                FI_STAMP2(1);
        }
        for (int b = b0; b < nblk; b += 2) { /* S_b done, nothing in flight */
            const int st = (gb + b) & (C::kStages - 1);
            uint32_t av[8][2][4];
            v_fragments(stage_at(s0, st), ln.w, ln.lane, av);
            softmax(ctx, ln, S, it.kv_begin + b * kBlockN, lo, hi, m, l, O, smem);
            fence_proxy_async(); /* P^T: ordinary stores, read by wgmma */
            nbar_sync(ln.bar(), kWgThreads);
            issue_pv(O, av, sp);
            if (b + 2 < nblk)
                start_scores(b + 2);
            else /* every score of the warpgroup's blocks done: Q is free for it */
                mbar_arrive(C::qempty(s0));
            wg_wait<0>();
            /* P_b V_b done, so V's ldmatrix loads have returned: the block is free.  Not
             * right after v_fragments: those loads may then still be in flight, and the
             * mbarrier's release does not order them before the next copy into the stage
             * when that is a tensor-map copy (async proxy): about one launch in a thousand
             * of the graph loop had a block's V overwritten first.  Releasing here is also
             * faster at B128 x 4096: 2-4% than the early release, 4-7% than the early
             * release behind a proxy fence (H200, docs/perf-log.md thirty-seventh
             * session). */
            mbar_arrive(C::empty(s0, st));
#pragma unroll
            for (int mt = 0; mt < 8; ++mt)
                wg_pin<8>(O[mt]);
            wg_pin<8>(S);
        }
        if (b0 >= nblk)
            mbar_arrive(C::qempty(s0));
        cs.qph ^= 1u;
        cs.gb = gb + nblk;
        FI_STAMP2(2);
        float Oh[4][8], L[4];
        fimlat::item_end<C, kOffX>(ln, O, m, l, Oh, smem, L);
        store_rows(p, ctx, it, rq, ln, Oh, m, L);
        FI_STAMP2(3);
        if (it.out_slot < 0)
            return false;
        return Merge::arrive(p.c, ctx, it, reinterpret_cast<int *>(smem + C::kOffFlag),
                             reinterpret_cast<float *>(smem + C::kOffW), reinterpret_cast<float *>(smem + C::kOffRow));
    }
};

}  // namespace fimlawgt
