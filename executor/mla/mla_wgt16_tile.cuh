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
 *    A warpgroup's block: wait for it, S^T = K Q^T (36 wgmma m64n16k16, A = K from the
 *    ring, B = Q), the softmax over its columns (the column maxima meet in shared memory:
 *    one named barrier), P^T into its panel (one more barrier), O^T += V^T P^T (32 wgmma
 *    m64n16k16, A = V^T: the K panels read MN-major, B = P^T), wait, free the stage.  The
 *    other warpgroup's block overlaps it (FlashAttention-3's ping-pong, unscheduled); the
 *    producer refills a stage as soon as it is freed.
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
#include "executor/mla/mla_halves.cuh"
#include "executor/mla/mla_params.h"
#include "executor/mla/mla_q.cuh"
#include "plan/mask.h"

namespace fimlawgt16 {
using namespace fi;

constexpr int kWgThreads = 128;              /* a consumer warpgroup */
constexpr int kConsumerWgs = 2;              /* on alternate KV blocks (header) */
constexpr int kThreads = kConsumerWgs * kWgThreads;
constexpr int kProducerWarps = 4;            /* one producer warpgroup */
constexpr int kProducerThreads = kProducerWarps * 32;
constexpr int kProducerRegs = 72, kConsumerRegs = 216; /* setmaxnreg: 384 threads */
constexpr int kRows = FI_MLA_WGT_TILE_ROWS;  /* 16: wgmma's N */
constexpr int kBlockN = FI_MLA_WGT_KV_BLOCK; /* 64: wgmma's M */
constexpr int kDqk = 576, kDv = 512;
constexpr int kPanels = kDqk / 64;           /* 9: 8 ckv + 1 kpe, 64 dims (128 B) each */
constexpr int kStages = 2;                   /* stage st is always warpgroup st's */
constexpr int kBarWg = 2;                    /* warpgroup g's named barrier: kBarWg + g */
constexpr int kBarX = 4;                     /* both consumer warpgroups: the item's exchange */
static_assert(kRows == 16 && kBlockN == 64, "m64n16 tiles");
static_assert(kStages == kConsumerWgs, "a stage's every phase waited by one warpgroup");

/* Shared memory (bytes from the dynamic base; every swizzle atom on its alignment). */
constexpr uint32_t kQPanel = kRows * 128;                  /* [16][128 B] */
constexpr uint32_t kOffQ = 0;
constexpr uint32_t kPBytes = kRows * 128;                  /* P^T [16][64 tokens] */
constexpr uint32_t kOffP = kPanels * kQPanel;              /* per warpgroup */
constexpr uint32_t kOffRed = kOffP + kConsumerWgs * kPBytes; /* per warpgroup [4 warps][16] fp32 */
constexpr uint32_t kRedBytes = 4 * kRows * 4;
constexpr uint32_t kOffFlag = kOffRed + kConsumerWgs * kRedBytes; /* the merge's flags */
constexpr uint32_t kOffW = kOffFlag + 16;                  /* its weights */
constexpr uint32_t kOffRow = kOffW + kSoloMergeRows * 4;   /* its row statistics */
constexpr uint32_t kOffBar = kOffRow + 2 * kRows * 4;      /* full[2], empty[2], qfull, qempty */
constexpr uint32_t kOffRing = 24576;
constexpr uint32_t kKPanel = kBlockN * 128;                /* [64][128 B] */
constexpr uint32_t kBlockBytes = kPanels * kKPanel;        /* 73728 */
/* The item's exchange (combine_halves): per warpgroup, float4 rows [kXRows][128 threads]:
 * 8 of the other warpgroup's half of O^T, its l, its m. */
constexpr int kXRows = 10;
constexpr uint32_t kOffX = kOffRing + kStages * kBlockBytes;
constexpr size_t kSmemBytes = kOffX + (size_t)kConsumerWgs * kXRows * kWgThreads * 16;
static_assert(kOffBar + 8 * (2 * kStages + 2) <= kOffRing && kOffP % 1024 == 0 &&
                  kOffRing % 1024 == 0 && kBlockBytes % 1024 == 0 && kSmemBytes <= 232448,
              "shared memory map");

__device__ __forceinline__ uint32_t full(uint32_t s0, int st) { return s0 + kOffBar + 8 * st; }
__device__ __forceinline__ uint32_t empty(uint32_t s0, int st) { return s0 + kOffBar + 8 * (kStages + st); }
__device__ __forceinline__ uint32_t qfull(uint32_t s0) { return s0 + kOffBar + 16 * kStages; }
__device__ __forceinline__ uint32_t qempty(uint32_t s0) { return s0 + kOffBar + 16 * kStages + 8; }
__device__ __forceinline__ uint32_t stage_at(uint32_t s0, int st) { return s0 + kOffRing + st * kBlockBytes; }

/* The consumers' position: blocks of the CTA's earlier items (global block g sits in stage
 * g % 2 at phase (g / 2) & 1, and belongs to warpgroup g % 2) and Q's phase.  The producer
 * counts the same blocks (produce). */
struct Consumed {
    int gb;
    uint32_t qph;
};

__device__ __forceinline__ int blocks_of(const fi_work_item &it) {
    return it.kv_end > it.kv_begin ? (it.kv_end - it.kv_begin + kBlockN - 1) / kBlockN : 0;
}

/* ---- producer ------------------------------------------------------------------------ */

/* Page-table entry of the token producer thread pt copies in block b (token pt / 2), or 0
 * past the item. */
__device__ __forceinline__ int32_t page_of(const fi_mla_params &p, const fi_work_item &it,
                                           const fi_request_info &rq, int b, int pt) {
    const int t = it.kv_begin + b * kBlockN + (pt >> 1);
    return t < it.kv_end ? p.c.page_table[(int64_t)rq.page_row_offset + (t >> p.c.page_shift)] : 0;
}

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

/* Block b by tensor maps (the block wholly inside the item, the item starting on a box
 * boundary): the thread that copies the first token of a box (R = tma_box_rows tokens, one
 * page) issues its 8 ckv boxes and 1 kpe box on `bar`, whose transaction count it raises
 * first.  pg: page_of (that token's page). */
__device__ __forceinline__ void map_block(const fi_mla_params &p, const fi_work_item &it, uint32_t base,
                                          int b, int pt, int32_t pg, uint32_t bar, uint64_t pol) {
    const int tok = pt >> 1, R = p.tma_box_rows;
    if ((pt & 1) != 0 || (tok & (R - 1)) != 0)
        return;
    const int slot = (it.kv_begin + b * kBlockN + tok) & (p.c.page_size - 1);
    mbar_expect_tx_only(bar, (uint32_t)R * kPanels * 128);
#pragma unroll
    for (int i = 0; i < kPanels - 1; ++i)
        tma_load_3d(base + i * kKPanel + tok * 128, &p.tma_ckv, 64 * i, slot, pg, bar, pol);
    tma_load_3d(base + (kPanels - 1) * kKPanel + tok * 128, &p.tma_kpe, 0, slot, pg, bar, pol);
}

/* ---- consumers ----------------------------------------------------------------------- */

/* S^T = K Q^T over the 576 dims of the ring block at kb: 36 wgmma m64n16k16 (A = K,
 * K-major, B = Q, K-major), one commit group (not waited for). */
template <typename T>
__device__ __forceinline__ void issue_scores(float *S, uint32_t s0, uint32_t kb) {
    const WgDesc dk = wg_desc_base(kb, 16, 1024);
    const WgDesc dq = wg_desc_base(s0 + kOffQ, 16, 1024);
#pragma unroll
    for (int i = 0; i < 8; ++i)
        S[i] = 0.f;
    wg_pin<8>(S); /* the zeros written before the fence (C7515) */
    wg_fence();
#pragma unroll
    for (int i = 0; i < kPanels; ++i)
#pragma unroll
        for (int k = 0; k < 4; ++k)
            Wgmma<16, T>::template ss<0>(S, dk.at(i * kKPanel + k * 32), dq.at(i * kQPanel + k * 32),
                                         i > 0 || k > 0);
    wg_commit();
}

/* O^T += V^T P^T: m-tile mt (dims 64 mt ..) takes ckv panel mt read MN-major (the transpose
 * bit: M = dims along the panel's 128-byte rows, K = tokens; a k16 step is 16 rows, 2048
 * B), B = the warpgroup's P^T panel at sp (K-major).  One commit group, not waited for. */
template <typename T>
__device__ __forceinline__ void issue_pv(float (*O)[8], uint32_t kb, uint32_t sp) {
    const WgDesc dv = wg_desc_base(kb, kKPanel, 1024);
    const WgDesc dp = wg_desc_base(sp, 16, 1024);
    wg_fence();
#pragma unroll
    for (int mt = 0; mt < 8; ++mt)
#pragma unroll
        for (int ks = 0; ks < kBlockN / 16; ++ks)
            Wgmma<16, T>::template ss<0, 1>(O[mt], dv.at(mt * kKPanel + ks * 2048), dp.at(ks * 32), 1);
    wg_commit();
}

/* A consumer thread's place: warpgroup wg, its warp w, g = lane / 4, q4 = lane % 4; its
 * columns c = 2 j + e are the tile rows 8 j + 2 q4 + e (the S^T / O^T accumulators'
 * d[4 j + e], d[4 j + 2 + e]).  The warpgroup's P panel, reduction rows and barrier. */
struct Lane {
    int wg, w, lane, g, q4;
    __device__ __forceinline__ int row(int c) const { return 8 * (c >> 1) + 2 * q4 + (c & 1); }
    __device__ __forceinline__ uint32_t p_off() const { return kOffP + kPBytes * wg; }
    __device__ __forceinline__ float *red(unsigned char *smem) const {
        return reinterpret_cast<float *>(smem + kOffRed + kRedBytes * wg);
    }
    __device__ __forceinline__ int bar() const { return kBarWg + wg; }
};

/* One block's softmax (tokens t0 ..; S the raw S^T accumulator): mask and scale, the
 * columns' new running max m over the warpgroup (red), O and l rescaled, P^T = exp2(S - m)
 * in T into the warpgroup's P panel, the weights added to l. */
template <typename T>
__device__ __forceinline__ void softmax(const RunCtx &ctx, const Lane &ln, const float *S, int t0,
                                        const int *lo, const int *hi, float *m, float *l,
                                        float (*O)[8], unsigned char *smem) {
    const float sl = ctx.scale_log2;
    float v[8], mx[4] = {-CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F};
    const int tb = 16 * ln.w + ln.g; /* block token of S[4 j + e], + 8 for S[4 j + 2 + e] */
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
                const int c = 2 * j + e, t = t0 + tb + 8 * i;
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
    float mu[4], alpha[4];
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

/* The item's rows out from warpgroup wg's half of O^T (Oh: m-tiles 4 wg ..): l summed over
 * the warpgroup (red); unsplit, out = bmm2 O / l with the sink (out_row), T scalars; split,
 * the fp32 partial O / l and lse_keys into the item's slot.  Thread (w, g) holds dims
 * 256 wg + 64 i + 16 w + g (+ 8) of its four rows. */
template <typename T>
__device__ __forceinline__ void store_rows(const fi_mla_params &p, const RunCtx &ctx,
                                           const fi_work_item &it, const fi_request_info &rq,
                                           const Lane &ln, float (*Oh)[8], const float *m, const float *l,
                                           unsigned char *smem) {
    const fi_exec_common &c = p.c;
    const int nh = it.head_end - it.head_begin, M = (it.q_end - it.q_begin) * nh;
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
    float L[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int r = ln.row(k);
        L[k] = red[r] + red[kRows + r] + red[2 * kRows + r] + red[3 * kRows + r];
    }
    nbar_sync(ln.bar(), kWgThreads); /* red read before the next item's first block max */
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
    using Merge = SplitMerge<kDv, kRows, T, kThreads, false>;
    static constexpr int kThreads = fimlawgt16::kThreads;
    static constexpr int kProducerWarps = fimlawgt16::kProducerWarps;
    static constexpr int kConsumerRegs = fimlawgt16::kConsumerRegs;
    static constexpr size_t kSmemBytes = fimlawgt16::kSmemBytes;
    static_assert(kProducerThreads * kProducerRegs + kThreads * kConsumerRegs <= 168 * 384, "setmaxnreg");
    using State = Consumed;

    /* full: every producer thread (and TMA bytes); empty: the stage's warpgroup; qempty:
     * every consumer thread. */
    static __device__ __forceinline__ State setup(unsigned char *smem) {
        const uint32_t s0 = smem_u32(smem);
        if (threadIdx.x == 0) {
            for (int st = 0; st < kStages; ++st) {
                mbar_init(full(s0, st), kProducerThreads);
                mbar_init(empty(s0, st), kWgThreads);
            }
            mbar_init(qfull(s0), kProducerThreads);
            mbar_init(qempty(s0), kThreads);
            mbar_init_fence();
        }
        return Consumed{0, 0u};
    }

    /* The producer warpgroup: Q and every block of every item of the CTA, in item order;
     * global block g into stage g % 2 once its warpgroup freed it. */
    static __device__ void produce(const fi_mla_params &p, const fi_cta_start &cs, unsigned char *smem) {
        setmaxnreg_dec<kProducerRegs>();
        const uint32_t s0 = smem_u32(smem);
        const int pt = (int)threadIdx.x - kThreads;
        int gb = 0;
        uint32_t qph = 0u;
        for_each_item(p.c, cs, [&](const fi_work_item &it, const fi_request_info &rq) {
            mbar_wait(qempty(s0), qph ^ 1u);
            fimlaq::produce_q16<T, kRows, kProducerThreads>(p, it, rq, s0 + kOffQ, pt);
            cp_async_mbar_arrive(qfull(s0));
            qph ^= 1u;
            const int nblk = blocks_of(it);
            const uint64_t pol = l2_evict_first(kv_l2_fraction(p.c, it, rq));
            const bool maps = p.tma_on && (it.kv_begin & (p.tma_box_rows - 1)) == 0;
            const int nmap = maps ? (it.kv_end - it.kv_begin) / kBlockN : 0;
            int32_t pg = nblk > 0 ? page_of(p, it, rq, 0, pt) : 0;
            for (int b = 0; b < nblk; ++b, ++gb) {
                /* the next block's entries travel while this one waits for its slot */
                const int32_t pn = b + 1 < nblk ? page_of(p, it, rq, b + 1, pt) : 0;
                const int st = gb & (kStages - 1);
                mbar_wait(empty(s0, st), ((uint32_t)(gb / kStages) & 1u) ^ 1u);
                const uint32_t base = stage_at(s0, st), bar = full(s0, st);
                if (b < nmap) {
                    map_block(p, it, base, b, pt, pg, bar, pol);
                    mbar_arrive(bar);
                } else {
                    copy_block<T>(p, it, base, b, pt, pg, pol);
                    cp_async_mbar_arrive(bar);
                }
                pg = pn;
            }
        });
    }

    /* One item on the two consumer warpgroups: warpgroup wg takes the item's blocks of
     * global index gb + b = wg (mod 2) (header), then combine_halves and its half of the
     * rows out. */
    static __device__ bool run_item(const fi_mla_params &p, const RunCtx &ctx, const fi_work_item &it,
                                    const fi_request_info &rq, unsigned char *smem, bool first,
                                    State &cs) {
        (void)first;
        const uint32_t s0 = smem_u32(smem);
        Lane ln;
        ln.wg = uniform((int)(threadIdx.x >> 7));
        ln.w = uniform((int)((threadIdx.x >> 5) & 3));
        ln.lane = threadIdx.x & 31;
        ln.g = ln.lane >> 2;
        ln.q4 = ln.lane & 3;
        const uint32_t sp = s0 + ln.p_off();
        const int nh = it.head_end - it.head_begin, M = (it.q_end - it.q_begin) * nh;
        const int nblk = uniform(blocks_of(it));
        const int gb = uniform(cs.gb);
        const int b0 = (ln.wg ^ gb) & 1; /* this warpgroup's first block of the item */
        int lo[4], hi[4]; /* column c = 2 j + e: tile row 8 j + 2 q4 + e */
        row_bounds(ctx, it, rq, M, nh, 2 * ln.q4, 1, lo, hi);
        row_bounds(ctx, it, rq, M, nh, 8 + 2 * ln.q4, 1, lo + 2, hi + 2);
        float O[8][8];
#pragma unroll
        for (int mt = 0; mt < 8; ++mt) {
#pragma unroll
            for (int i = 0; i < 8; ++i)
                O[mt][i] = 0.f;
            wg_pin<8>(O[mt]);
        }
        float m[4], l[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            m[k] = -CUDART_INF_F;
            l[k] = 0.f;
        }
        mbar_wait(qfull(s0), cs.qph);
        float S[8];
        for (int b = b0; b < nblk; b += 2) {
            const int g = gb + b, st = g & (kStages - 1);
            const uint32_t kb = stage_at(s0, st);
            mbar_wait(full(s0, st), (uint32_t)(g / kStages) & 1u);
            fence_proxy_async(); /* cp.async rows, read by wgmma */
            issue_scores<T>(S, s0, kb);
            wg_wait<0>();
            wg_pin<8>(S);
            if (b + 2 >= nblk) /* every score of the warpgroup's blocks done: Q is free for it */
                mbar_arrive(qempty(s0));
            softmax<T>(ctx, ln, S, it.kv_begin + b * kBlockN, lo, hi, m, l, O, smem);
            fence_proxy_async(); /* P^T: ordinary stores, read by wgmma */
            nbar_sync(ln.bar(), kWgThreads);
            issue_pv<T>(O, kb, sp);
            wg_wait<0>();
            /* the stage's one reader was wgmma, now done: the producer may refill it */
            mbar_arrive(empty(s0, st));
#pragma unroll
            for (int mt = 0; mt < 8; ++mt)
                wg_pin<8>(O[mt]);
        }
        if (b0 >= nblk)
            mbar_arrive(qempty(s0));
        cs.qph ^= 1u;
        cs.gb = gb + nblk;
        float Oh[4][8];
        fimlah::combine_halves<kWgThreads, kXRows, kOffX, kBarX>(ln.wg, ln.w * 32 + ln.lane, O, m, l, Oh, smem);
        store_rows<T>(p, ctx, it, rq, ln, Oh, m, l, smem);
        if (it.out_slot < 0)
            return false;
        return Merge::arrive(p.c, ctx, it, reinterpret_cast<int *>(smem + kOffFlag),
                             reinterpret_cast<float *>(smem + kOffW), reinterpret_cast<float *>(smem + kOffRow));
    }
};

}  // namespace fimlawgt16
