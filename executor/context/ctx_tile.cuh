/*
 * executor/context/ctx_tile.cuh - the context (prefill) attention family on Hopper's
 * warpgroup tensor cores (sm_90a): one work item = a tile of up to 128 rows (query tokens x
 * the query heads of one KV head, q-major) over a KV range of a paged cache, S = Q K^T and
 * O += P V by wgmma.  The persistent loop, the split merge and the launch are the shared
 * ones (executor/cuda/).  Serves trtllm_batch_context_with_kv_cache and mixed batches
 * (decode requests are context requests of q_len 1; they share the launch).
 *
 * What it computes (fiattn_run.h): s_j = bmm1_scale * (q . k_j) over the row's keys (the
 * causal / window_left rule of plan/mask.h, the query block aligned to the end of the
 * request's KV range), out = bmm2_scale * softmax(s) . v with sinks in the denominator,
 * natural-log LSE; a row without keys: zeros and lse -inf (or the sink).
 *
 * How (one CTA = 2 consumer warpgroups + 1 producer warpgroup, one CTA per SM):
 *  - Shared memory: Q (128 rows x D) and a ring of kStages KV blocks (kBlockN tokens of K
 *    and of V), all as panels of [rows][64 elements] in the 128-byte swizzle wgmma reads
 *    (executor/cuda/common/wgmma.cuh).  D 64 / 128: blocks of 128 tokens (4 / 3 stages);
 *    D 256: 64 tokens, 2 stages (192 KB with Q).
 *  - Producer warpgroup: K then V of each block.  A 16-bit cache's whole blocks by TMA
 *    (the host's tensor maps of the k / v views: boxes of up to 128 tokens of one page x 64
 *    dims, issued by warp 0's lanes, the 128-byte swizzle done by the copy engine: the
 *    producer's issue slots no longer compete with the consumers').  The rest (an item's
 *    ragged end, pages under 8 tokens, strides TMA cannot take) as 16-byte cp.async
 *    through the page table (a token's page looked up per token: any page size, NHD / HND
 *    / pair strides, [B, 2, P] tables; each token's row address computed once a block,
 *    token_row), K then V of a block each completing on its own "full" mbarrier, so the
 *    scores start before V lands; tokens past the item's range and Q rows past the tile
 *    are zero-filled (P = 0 must not meet NaN bit patterns).  It runs ahead across items.
 *    A quantised cache is read into registers instead (16 value bytes a lane, issued
 *    before the slot's wait, each lane's token rows found once a block: quant_row), converted to T exactly and stored into the same panels
 *    with ordinary stores, a proxy fence and a plain arrival; the consumers cannot tell
 *    the paths apart.  fp8 e4m3 (KV = __nv_fp8_e4m3): every e4m3 value is a bf16 and an
 *    fp16 value.  NVFP4 (KV = fi::nvfp4): e2m1 values two a byte with an e4m3 scale per
 *    16 (the scale rows k_sf / v_sf beside the cache), every product a bf16 and an fp16
 *    value (executor/cuda/common/dtype.cuh, e2m1x8_to_f16x8).
 *  - Consumers: warpgroup w owns tile rows [64 w, 64 w + 64) with all D output columns in
 *    registers; both read every KV block, which is loaded once for the 128 rows.  In a
 *    warpgroup, block b's scores S_b = Q K_b^T (wgmma from shared memory) are issued, then
 *    the previous block's O += P_{b-1} V_{b-1} with P from registers (the S accumulator
 *    converted in place: FlashAttention-3's register-resident P), and the softmax of S_b
 *    runs while P_{b-1} V_{b-1} is on the tensor cores (FA3's intra-warpgroup overlap).
 *  - Online softmax in the exp2 domain, fp32, per-thread partial row sums reduced over the
 *    quad at the end; the mask is applied only to blocks that cross a row's key bounds
 *    (warp vote); O is rescaled only when some row's max moved (warp vote).
 *  - Skip-softmax (fi_attn_args.skip_softmax_threshold_scale_factor > 0, BLASST): after a
 *    block's scores, a warpgroup whose 64 rows all have the block's max term below
 *    factor / kv_len of their running max (bar.red.and over its 128 threads) skips the
 *    block's exponentials and its P V (an empty wgmma group keeps the waits' counts, the
 *    turns and releases stay as they are).
 *  - Releases: a block goes back to the producer after both warpgroups' P V of it (8 warp
 *    arrivals on its "empty" mbarrier); Q after the item's last scores.
 *  - Epilogue: out as T, fp8 e4m3 (o_scale) or NVFP4 (e2m1 codes + e4m3 block scales,
 *    store_acc_rows_nvfp4: a run-time branch, the 16-column blocks' maxima by shuffles over
 *    the whole warp); a split item's fp32 partials go to the workspace and the shared merge
 *    (SplitMerge<.., OutDynFp4<T>>) writes the same formats.
 * Sources: FlashAttention-3 (Shah et al. 2024: producer / consumer warpgroups, wgmma, P in
 * registers, intra-warpgroup softmax / matmul overlap); FlashAttention-2 online softmax
 * (Dao 2023); flash-decoding split-KV with an LSE merge (Dao et al. 2023); skip-softmax:
 * BLASST (arXiv 2512.12087), TensorRT-LLM's skip softmax attention.
 */
#pragma once

#include <type_traits>

#include "executor/cuda/common/dtype.cuh"
#include "executor/cuda/common/profile.cuh"
#include "executor/cuda/common/ptx.cuh"
#include "executor/cuda/common/run_ctx.cuh"
#include "executor/cuda/common/wgmma.cuh"
#include "executor/cuda/merge/split_merge.cuh"
#include "executor/context/ctx_launch.h"
#include "plan/mask.h"

namespace fictx {
using namespace fi;

constexpr int kThreads = 256;      /* two consumer warpgroups */
constexpr int kProducerWarps = 4;  /* one producer warpgroup */
constexpr int kProducerThreads = kProducerWarps * 32;
constexpr int kRows = FI_CTX_TILE_ROWS;

/* Shapes of head_dim D (QK and VO): shared-memory layout and offsets. */
template <int D> struct Geo {
    static constexpr int kBlockN = D <= 128 ? 128 : 64;  /* KV tokens a block */
    /* D 128: 3 stages fill the 227 KB (Q 32 KB + 3 x 64 KB + barriers and merge). */
    static constexpr int kStages = D == 64 ? 4 : D == 128 ? 3 : 2;
    static constexpr int kPanels = D / 64;
    static constexpr uint32_t kQPanel = (uint32_t)kRows * 128;  /* [128 rows][64] */
    static constexpr uint32_t kKPanel = (uint32_t)kBlockN * 128; /* [kBlockN tokens][64] */
    static constexpr uint32_t kKBytes = kPanels * kKPanel;       /* K (or V) of a block */
    static constexpr uint32_t kStageBytes = 2 * kKBytes;         /* K then V */
    static constexpr uint32_t kOffQ = 0;
    static constexpr uint32_t kOffRing = kPanels * kQPanel;
    static constexpr uint32_t kOffBar = kOffRing + kStages * kStageBytes; /* fullK, fullV,
                                                  emptyK, emptyV [4 each]; qfull, qempty */
    static constexpr uint32_t kOffFlag = kOffBar + 144;          /* merge flags */
    static constexpr uint32_t kOffW = kOffFlag + 16;             /* merge weights */
    static constexpr uint32_t kOffRow = kOffW + kSoloMergeRows * 4; /* merge row stats */
    static constexpr size_t kSmemBytes = kOffRow + 2 * kRows * 4;
    /* setmaxnreg (128 producer + 256 consumer threads x these <= 65536): the consumers hold
     * O (D / 2 fp32), S and P; the producer 56 (40 spills). */
    static constexpr int kProducerRegs = 56;
    static constexpr int kConsumerRegs = 224;
    /* The pool setmaxnreg redistributes is what the launch allocated: 384 threads x 168
     * registers = 64512, so 128 P + 256 C must stay within it or the consumers' increase
     * waits forever. */
    static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 64512, "register pool");
    /* A quantised cache's producer (fp8 e4m3, NVFP4) holds its loads in registers
     * (load_rows_q). */
    static constexpr int kProducerRegsQ = D == 256 ? 72 : 104;
    static constexpr int kConsumerRegsQ = D == 256 ? 216 : 200;
    static_assert(128 * kProducerRegsQ + 256 * kConsumerRegsQ <= 64512, "register pool");
    static constexpr int kTokPerWarp = kBlockN / kProducerWarps; /* a producer warp's tokens */
    static constexpr int kChunks = D / 8;                        /* 16-byte chunks a row */
    static constexpr int kTokPerPass = 32 / kChunks;             /* rows a warp copies at once */
    static_assert(D == 64 || D == 128 || D == 256, "head_dim");
    static_assert(kTokPerWarp <= 32 && kTokPerWarp % kTokPerPass == 0, "producer split");
    static_assert(kSmemBytes <= 232448 && kStages <= 4, "smem");
    static __device__ __forceinline__ uint32_t full_k(uint32_t s0, int st) { return s0 + kOffBar + 8 * st; }
    static __device__ __forceinline__ uint32_t full_v(uint32_t s0, int st) { return s0 + kOffBar + 32 + 8 * st; }
    static __device__ __forceinline__ uint32_t empty_k(uint32_t s0, int st) { return s0 + kOffBar + 64 + 8 * st; }
    static __device__ __forceinline__ uint32_t empty_v(uint32_t s0, int st) { return s0 + kOffBar + 96 + 8 * st; }
    static __device__ __forceinline__ uint32_t qfull(uint32_t s0) { return s0 + kOffBar + 128; }
    static __device__ __forceinline__ uint32_t qempty(uint32_t s0) { return s0 + kOffBar + 136; }
    static __device__ __forceinline__ uint32_t stage(uint32_t s0, int st) { return s0 + kOffRing + st * kStageBytes; }
};

/* Ring position of the next block (stage, its phase parity) and Q's phase parity; the
 * producer and every consumer thread advance their own copy in the same order. */
template <int kStages> struct Cursor {
    int st;
    uint32_t ph, qph;
    __device__ __forceinline__ void next() {
        st = st + 1 == kStages ? 0 : st + 1;
        ph ^= st == 0 ? 1u : 0u;
    }
};

template <int N> __device__ __forceinline__ int blocks_of(const fi_work_item &it) {
    return it.kv_end > it.kv_begin ? (it.kv_end - it.kv_begin + N - 1) / N : 0;
}

/* Keep packed P registers alive (unmoved) until here: a wgmma reading them from registers
 * may still be in flight before the wait this follows. */
template <int N> __device__ __forceinline__ void pin_u32(uint32_t *r) {
#pragma unroll
    for (int i = 0; i < N; ++i)
        asm volatile("" : "+r"(r[i])::"memory");
}

/* ---- producer ------------------------------------------------------------------------ */

/* Q rows of item it (row r = (q - q_begin) * nh + h - head_begin) into the Q panels; rows
 * past the tile zero-filled. */
template <typename T, int D>
__device__ __forceinline__ void produce_q(const fi_ctx_params &p, const fi_work_item &it,
                                          const fi_request_info &rq, uint32_t s0, int pt) {
    using G = Geo<D>;
    const int nh = it.head_end - it.head_begin;
    const int M = (it.q_end - it.q_begin) * nh;
    for (int idx = pt; idx < kRows * G::kChunks; idx += kProducerThreads) {
        const int r = idx / G::kChunks, c = idx - r * G::kChunks;
        const uint32_t dst = s0 + G::kOffQ + (c >> 3) * G::kQPanel + sw128(r, (c & 7) * 8);
        const T *src = static_cast<const T *>(p.g.q);
        if (r < M) {
            const int64_t tok = (int64_t)rq.q_offset + it.q_begin + r / nh;
            const int h = it.head_begin + r % nh;
            src += tok * p.g.q_stride_tok + h * p.g.q_stride_head + c * 8;
        }
        cp_async16(dst, src, r < M ? 16 : 0);
    }
}

/* Page of token kTokPerWarp pw + lane of block b (lanes < kTokPerWarp and in range; else
 * 0), from page-table row `row` (K's, or V's of a [B, 2, P] table). */
template <int D>
__device__ __forceinline__ int32_t block_page(const fi_ctx_params &p, const fi_work_item &it,
                                              int64_t row, int b, int pt) {
    using G = Geo<D>;
    const int lane = pt & 31;
    const int t = it.kv_begin + b * G::kBlockN + G::kTokPerWarp * (pt >> 5) + lane;
    return lane < G::kTokPerWarp && t < it.kv_end ? p.c.page_table[row + (t >> p.c.page_shift)] : 0;
}

/* Lane l's token of warp pw in block b (kTokPerWarp pw + l): its slot in its page, and
 * bit l of *in: the token lies inside the item (lanes past kTokPerWarp: 0).  The producer
 * finds its rows from these once a block, so a 16-byte copy costs a shuffle of the row and
 * an add, not a 64-bit page x stride product (the copies' address arithmetic took more
 * issue slots than the consumers' softmax). */
template <int D>
__device__ __forceinline__ int64_t token_slot(const fi_ctx_params &p, const fi_work_item &it, int b,
                                              int pt, uint32_t *in) {
    using G = Geo<D>;
    const int lane = pt & 31;
    const int t = it.kv_begin + b * G::kBlockN + G::kTokPerWarp * (pt >> 5) + lane;
    *in = __ballot_sync(0xffffffffu, lane < G::kTokPerWarp && t < it.kv_end);
    return t & (p.c.page_size - 1);
}

/* Lane l's token row in K or V (view kv, this KV head's base `base`; pg: its block_page)
 * and the in-item bits (token_slot). */
template <typename T, int D>
__device__ __forceinline__ const T *token_row(const fi_ctx_params &p, const fi_gqa_paged &kv,
                                              const T *base, const fi_work_item &it, int b, int pt,
                                              int32_t pg, uint32_t *in) {
    const int64_t slot = token_slot<D>(p, it, b, pt, in);
    return base + (int64_t)pg * kv.stride_page + slot * kv.stride_tok;
}

/* K or V rows of block b into the block's panels at dst0: warp pw copies its kTokPerWarp
 * tokens (rows and in-item bits from token_row), kTokPerPass tokens x kChunks 16-byte
 * chunks a pass. */
template <typename T, int D>
__device__ __forceinline__ void produce_rows(const T *row, uint32_t in, uint32_t dst0, int pt) {
    using G = Geo<D>;
    const int lane = pt & 31, pw = pt >> 5;
    const int j = lane / G::kChunks, c = lane % G::kChunks;
    const uint32_t dst = dst0 + (c >> 3) * G::kKPanel;
#pragma unroll 4
    for (int pass = 0; pass < G::kTokPerWarp / G::kTokPerPass; ++pass) {
        const int tok = pass * G::kTokPerPass + j;
        const T *src = reinterpret_cast<const T *>(
            __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(row), tok));
        cp_async16(dst + sw128(G::kTokPerWarp * pw + tok, (c & 7) * 8), src + c * 8,
                   (in >> tok) & 1u ? 16 : 0);
    }
}

/* ---- TMA: whole blocks of a 16-bit cache by tensor map ---------------------------------- */

/* Whether block b of item it comes by TMA: maps exist (p.tma_box > 0: ctx_host.c) and its
 * kBlockN tokens lie inside the item from a multiple of the box (then each box lies inside
 * one page: pages are aligned power-of-two runs of tokens, a multiple of the box).  Other
 * blocks (an item's ragged end, a split not on a box boundary) take cp.async, which
 * zero-fills the tokens past the item. */
template <int D>
__device__ __forceinline__ bool tma_block(const fi_ctx_params &p, const fi_work_item &it, int b) {
    const int t0 = it.kv_begin + b * Geo<D>::kBlockN;
    return p.tma_box > 0 && t0 % p.tma_box == 0 && t0 + Geo<D>::kBlockN <= it.kv_end;
}

/* The block's boxes, kBlockN / tma_box along the tokens x kPanels along D (<= 32: tma_box
 * >= 8 at D <= 128, >= 8 of 64 tokens x 4 panels at D 256); lane pt < boxes of warp 0
 * copies box pt.  Page of lane pt's box, from page-table row `row` (else 0). */
template <int D>
__device__ __forceinline__ int32_t tma_page(const fi_ctx_params &p, int64_t row, int t0, int pt) {
    const int per = Geo<D>::kBlockN / p.tma_box;
    const int t = t0 + p.tma_box * (pt % per);
    return pt < per * Geo<D>::kPanels ? p.c.page_table[row + (t >> p.c.page_shift)] : 0;
}

/* K or V (map) of the block at tokens t0.. of KV head kvh into the panels at dst0: each
 * copying lane adds its box's bytes to `full`'s transaction count, then issues it; every
 * producer thread arrives (the barrier counts kProducerThreads arrivals on either path,
 * and completes when the boxes have landed too). */
template <int D>
__device__ __forceinline__ void produce_tma(const fi_ctx_params &p, const CUtensorMap *map, int kvh,
                                            int t0, uint32_t dst0, uint32_t full, int pt, int32_t page) {
    using G = Geo<D>;
    const int box = p.tma_box, per = G::kBlockN / box;
    if (pt < per * G::kPanels) {
        const int grp = pt % per, panel = pt / per;
        const int t = t0 + box * grp;
        mbar_expect_tx_only(full, (uint32_t)box * 128);
        tma_load_4d(dst0 + panel * G::kKPanel + grp * box * 128, map, panel * 64,
                    t & (p.c.page_size - 1), kvh, page, full);
    }
    mbar_arrive(full);
}

/* ---- quantised KV (fp8 e4m3, NVFP4): through registers, converted to T into the panels -- */

/* Where a KV head's rows of one cache (K or V) are: the value rows (bytes) and, for NVFP4,
 * the block-scale rows; their strides (bytes) stay in the parameter views, so they are
 * read from the constant bank rather than held in the producer's registers. */
struct RowSrc {
    const uint8_t *base, *sf;
    const fi_gqa_paged *kv, *sfv;
};
__device__ __forceinline__ RowSrc row_src(const fi_gqa_paged &kv, const fi_gqa_paged &sf, int kvh) {
    const uint8_t *b = static_cast<const uint8_t *>(kv.data) + (int64_t)kvh * kv.stride_head;
    const uint8_t *s = static_cast<const uint8_t *>(sf.data) + (int64_t)kvh * sf.stride_head;
    return RowSrc{b, s, &kv, &sf};
}

/* A quantised cache's row format, as the producer reads it: a lane takes kLanesPerTok-th
 * of a token row (16 value bytes; for NVFP4 also the scale bytes of those 32 values), 32 /
 * kLanesPerTok tokens a warp pass, kChunk passes of loads in registers at a time (the
 * producer's register budget), and store<T> writes a lane's values, converted, as T into
 * row `row` of the block's panels.  fp8 e4m3: 16 values a lane; NVFP4: 32 values (two
 * scale blocks) a lane. */
template <typename KV, int D> struct RowFmt;
template <int D> struct RowFmt<__nv_fp8_e4m3, D> {
    static constexpr int kLanesPerTok = D / 16;
    static constexpr int kChunk = D == 256 ? 2 : 4;
    struct Reg {
        uint4 v;
    };
    static __device__ __forceinline__ Reg zero() { return Reg{make_uint4(0, 0, 0, 0)}; }
    /* row / sf: the token's value row and (unused) scale row; c: the lane's part */
    static __device__ __forceinline__ Reg load(const uint8_t *row, const uint8_t *, int c) {
        return Reg{__ldg(reinterpret_cast<const uint4 *>(row + 16 * c))};
    }
    /* lane c's 16 values are 16-byte chunks 2 c and 2 c + 1 of the row: one panel */
    template <typename T>
    static __device__ __forceinline__ void store(uint32_t dst0, int row, int c, const Reg &r) {
        const uint32_t dst = dst0 + (c >> 2) * Geo<D>::kKPanel;
        const int col = (2 * c & 7) * 8;
        st_shared16(dst + sw128(row, col), e4m3x8_to<T>(make_uint2(r.v.x, r.v.y)));
        st_shared16(dst + sw128(row, col + 8), e4m3x8_to<T>(make_uint2(r.v.z, r.v.w)));
    }
};
template <int D> struct RowFmt<nvfp4, D> {
    static constexpr int kLanesPerTok = D / 32;
    static constexpr int kChunk = D == 128 ? 4 : 2; /* of 2 / 4 / 4 passes */
    struct Reg {
        uint4 v;     /* 32 e2m1 values */
        uint32_t sf; /* their two e4m3 block scales (bytes 0, 1) */
    };
    static __device__ __forceinline__ Reg zero() { return Reg{make_uint4(0, 0, 0, 0), 0u}; }
    /* The scale row is D / 16 bytes, its base and strides multiples of it (gqa_host.c), so
     * the lane's two scale bytes are one aligned 16-bit load. */
    static __device__ __forceinline__ Reg load(const uint8_t *row, const uint8_t *sf, int c) {
        return Reg{__ldg(reinterpret_cast<const uint4 *>(row + 16 * c)),
                   (uint32_t)__ldg(reinterpret_cast<const unsigned short *>(sf + 2 * c))};
    }
    /* lane c's 32 values are 16-byte chunks 4 c .. 4 c + 3 of the T row: half a panel */
    template <typename T>
    static __device__ __forceinline__ void store(uint32_t dst0, int row, int c, const Reg &r) {
        const uint32_t dst = dst0 + (c >> 1) * Geo<D>::kKPanel;
        const int col = (c & 1) * 32;
        const __half2 s = sf_pair(r.sf & 0xffu, r.sf >> 8); /* (scale 0, scale 1) x 64 */
        const __half2 s0 = __low2half2(s), s1 = __high2half2(s);
        st_shared16(dst + sw128(row, col), e2m1x8_to<T>(r.v.x, s0));
        st_shared16(dst + sw128(row, col + 8), e2m1x8_to<T>(r.v.y, s0));
        st_shared16(dst + sw128(row, col + 16), e2m1x8_to<T>(r.v.z, s1));
        st_shared16(dst + sw128(row, col + 24), e2m1x8_to<T>(r.v.w, s1));
    }
};

/* The split of a warp's kTokPerWarp tokens of a block into passes (D 64 / 128 / 256: fp8
 * 4 / 8 / 8, NVFP4 2 / 4 / 4) and chunks of passes. */
template <typename KV, int D> struct RegGeo {
    using Fmt = RowFmt<KV, D>;
    static constexpr int kLanesPerTok = Fmt::kLanesPerTok;
    static constexpr int kTokPerPass = 32 / kLanesPerTok;
    static constexpr int kPasses = Geo<D>::kTokPerWarp / kTokPerPass;
    static constexpr int kChunk = Fmt::kChunk;
    static_assert(Geo<D>::kTokPerWarp % kTokPerPass == 0, "register producer split");
    static_assert(kPasses % kChunk == 0, "register producer chunks");
};

/* As token_row for a quantised cache (src; pg: this lane's block_page): lane l's value
 * row, *sf its scale row (NVFP4; unused for fp8), and the in-item bits. */
template <int D>
__device__ __forceinline__ const uint8_t *quant_row(const fi_ctx_params &p, const RowSrc &src,
                                                   const fi_work_item &it, int b, int pt, int32_t pg,
                                                   const uint8_t **sf, uint32_t *in) {
    const int64_t slot = token_slot<D>(p, it, b, pt, in);
    *sf = src.sf + (int64_t)pg * src.sfv->stride_page + slot * src.sfv->stride_tok;
    return src.base + (int64_t)pg * src.kv->stride_page + slot * src.kv->stride_tok;
}

/* Passes [pass0, pass0 + kChunk) of warp pw's kTokPerWarp tokens (rows and in-item bits
 * from quant_row) into r; tokens past the item read as zero (as produce_rows zero-fills;
 * NVFP4: values and scales 0, so no NaN scale meets them). */
template <typename KV, int D>
__device__ __forceinline__ void load_rows_q(const uint8_t *row, const uint8_t *sf, uint32_t in,
                                            int pt, int pass0, typename RowFmt<KV, D>::Reg *r) {
    using R = RegGeo<KV, D>;
    const int lane = pt & 31;
    const int j = lane / R::kLanesPerTok, c = lane % R::kLanesPerTok;
#pragma unroll
    for (int u = 0; u < R::kChunk; ++u) {
        const int tok = (pass0 + u) * R::kTokPerPass + j;
        const uint8_t *vr = reinterpret_cast<const uint8_t *>(
            __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(row), tok));
        const uint8_t *sr = reinterpret_cast<const uint8_t *>(
            __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(sf), tok));
        r[u] = (in >> tok) & 1u ? RowFmt<KV, D>::load(vr, sr, c) : RowFmt<KV, D>::zero();
    }
}

/* The rows load_rows_q read, as T, into the block's panels at dst0. */
template <typename T, typename KV, int D>
__device__ __forceinline__ void store_rows_q(uint32_t dst0, int pt, int pass0,
                                             const typename RowFmt<KV, D>::Reg *r) {
    using R = RegGeo<KV, D>;
    const int lane = pt & 31, pw = pt >> 5;
    const int j = lane / R::kLanesPerTok, c = lane % R::kLanesPerTok;
#pragma unroll
    for (int u = 0; u < R::kChunk; ++u)
        RowFmt<KV, D>::template store<T>(dst0, Geo<D>::kTokPerWarp * pw + (pass0 + u) * R::kTokPerPass + j,
                                         c, r[u]);
}

/* K or V of block b from a quantised cache into ring slot dst once `empty` is free, kChunk
 * passes at a time through registers (the first chunk's loads travel while the consumers
 * finish the slot), then a proxy fence (ordinary stores, read by wgmma) and the arrival. */
template <typename T, typename KV, int D>
__device__ __forceinline__ void produce_half_q(const fi_ctx_params &p, const RowSrc &src,
                                               const fi_work_item &it, int b, int pt, int32_t pg,
                                               uint32_t dst, uint32_t empty, uint32_t full,
                                               uint32_t parity) {
    using R = RegGeo<KV, D>;
    typename RowFmt<KV, D>::Reg r[R::kChunk];
    const uint8_t *sf;
    uint32_t in;
    const uint8_t *row = quant_row<D>(p, src, it, b, pt, pg, &sf, &in);
#pragma unroll
    for (int pass0 = 0; pass0 < R::kPasses; pass0 += R::kChunk) {
        load_rows_q<KV, D>(row, sf, in, pt, pass0, r);
        if (pass0 == 0)
            mbar_wait(empty, parity);
        store_rows_q<T, KV, D>(dst, pt, pass0, r);
    }
    fence_proxy_async();
    mbar_arrive(full);
}

/* ---- consumers ----------------------------------------------------------------------- */

/* A consumer thread's place: warpgroup w, warp wi in it, tile rows r0 = 64 w + 16 wi + g
 * and r0 + 8, score / output columns 8 j + 2 q4 (+1). */
struct Lane {
    int w, lane, g, q4, r0;
};
__device__ __forceinline__ Lane lane_of(int tid) {
    Lane l;
    l.w = warpgroup_idx();
    l.lane = tid & 31;
    l.g = l.lane >> 2;
    l.q4 = l.lane & 3;
    l.r0 = 64 * l.w + 16 * ((tid >> 5) & 3) + l.g;
    return l;
}

/* S = Q_w K^T of ring stage st (D / 16 wgmma m64 x kBlockN x k16, one commit group). */
template <typename T, int D>
__device__ __forceinline__ void issue_scores(float *S, uint32_t s0, int st, int w) {
    using G = Geo<D>;
    const WgDesc dq = wg_desc_base(s0 + G::kOffQ + w * 64 * 128, 16, 1024);
    const WgDesc dk = wg_desc_base(G::stage(s0, st), 16, 1024);
    /* Defined on a path ptxas sees as uniform, pinned before the fence (C7520 / C7515:
     * executor/mla/mla_wg_tile.cuh). */
#pragma unroll
    for (int i = 0; i < G::kBlockN / 2; ++i)
        S[i] = 0.f;
    wg_pin<G::kBlockN / 2>(S);
    wg_fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k)
        Wgmma<G::kBlockN, T>::template ss<0>(S, dq.at((k >> 2) * G::kQPanel + (k & 3) * 32),
                                             dk.at((k >> 2) * G::kKPanel + (k & 3) * 32), k > 0);
    wg_commit();
}

/* O += P V of ring stage st: P [64 rows][kBlockN] from registers (kBlockN / 16 k-steps of
 * 4 packed pairs), V MN-major from the block's V panels (64-wide D panels kKPanel apart,
 * a k16 step 16 token rows = 2048 B); one commit group. */
template <typename T, int D>
__device__ __forceinline__ void issue_pv(float *O, const uint32_t *P, uint32_t s0, int st, bool run = true) {
    using G = Geo<D>;
    if (!run) { /* a skipped block (skip-softmax): an empty group keeps the waits' counts */
        wg_commit();
        return;
    }
    const WgDesc dv = wg_desc_base(G::stage(s0, st) + G::kKBytes, G::kKPanel, 1024);
    wg_pin<D / 2>(O); /* rescaled before the fence (C7515) */
    wg_fence();
#pragma unroll
    for (int k = 0; k < G::kBlockN / 16; ++k)
        Wgmma<D, T>::template rs<1>(O, P + 4 * k, dv.at(k * 2048), 1);
    wg_commit();
}

/* Skip-softmax for one item (fi_attn_args.skip_softmax_threshold_scale_factor): on when
 * the factor is > 0; thr = log2(factor / kv_len), the bound on a block's max term under
 * the running max (log2 units); bar: the warpgroup's named barrier (4 + w) that ANDs the
 * rows' verdicts. */
struct Skip {
    bool on;
    float thr;
    int bar;
};
__device__ __forceinline__ Skip skip_of(const fi_exec_common &c, const fi_request_info &rq, const Lane &ln) {
    Skip k;
    k.on = c.skip_softmax_factor > 0.f;
    k.thr = k.on ? log2f(c.skip_softmax_factor) - log2f((float)max(rq.kv_len, 1)) : 0.f;
    k.bar = 4 + ln.w;
    return k;
}

/* Softmax of one block (tokens t0 ..) of the thread's two rows: kMask, the per-score
 * test against the rows' bounds lo / hi; the new running max m (in / out, scaled log2
 * units), S replaced by P = exp2(bmm1 log2e S - m) in fp32, rs = this thread's part of
 * rowsum(P), alpha = exp2(m_old - m_new).  kPos (bmm1_scale > 0, uniform): the max is
 * taken on raw scores and each P costs one FFMA and one exp2, as in FlashAttention-3;
 * otherwise the scores are scaled first (a negative or zero scale). */
template <int N, bool kPos, bool kMask>
__device__ __forceinline__ bool softmax_body(const RunCtx &ctx, const Lane &ln, float *S, int t0,
                                             const int *lo, const int *hi, float *m, float *alpha,
                                             float *rs, const Skip &sk) {
    const float sl = ctx.scale_log2;
    float mloc[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
    for (int j = 0; j < N / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = e >> 1;
            float v = kPos ? S[4 * j + e] : S[4 * j + e] * sl;
            if (kMask) {
                const int t = t0 + 8 * j + 2 * ln.q4 + (e & 1);
                v = t < lo[i] || t > hi[i] ? -CUDART_INF_F : v;
            }
            S[4 * j + e] = v;
            mloc[i] = fmaxf(mloc[i], v);
        }
    if (sk.on) { /* skip-softmax: every row of the warpgroup below its running max by thr */
        bool below = true;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            float bm = fmaxf(mloc[i], __shfl_xor_sync(0xffffffffu, mloc[i], 1));
            bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, 2));
            below = below && (bm == -CUDART_INF_F || (kPos ? bm * sl : bm) - m[i] < sk.thr);
        }
        if (uniform((int)nbar_and(sk.bar, 128, below))) {
            alpha[0] = alpha[1] = 1.f;
            rs[0] = rs[1] = 0.f;
            return true;
        }
    }
    float mu[2];
    row_max_step<kPos>(mloc, sl, m, alpha, mu, rs);
#pragma unroll
    for (int j = 0; j < N / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float x = S[4 * j + e];
            const float pv = ex2_ftz(kPos ? fmaf(x, sl, -mu[e >> 1]) : x - mu[e >> 1]);
            S[4 * j + e] = pv;
            rs[e >> 1] += pv;
        }
    return false;
}

/* softmax_body with the mask test only on a block that crosses a row's bounds (warp vote).
 * Two whole bodies behind a uniform branch: with the test written as a select inside one
 * body, the compiler computed it (five instructions a score) on every block.  Returns
 * whether skip-softmax skipped the block (uniform over the warpgroup; then S is not P,
 * alpha = 1, rs = 0). */
template <int N, bool kPos>
__device__ __forceinline__ bool softmax_block(const RunCtx &ctx, const Lane &ln, float *S, int t0,
                                              const int *lo, const int *hi, float *m, float *alpha,
                                              float *rs, const Skip &sk) {
    if (__any_sync(0xffffffffu, !keys_inside(lo, hi, t0, t0 + N - 1)))
        return softmax_body<N, kPos, true>(ctx, ln, S, t0, lo, hi, m, alpha, rs, sk);
    return softmax_body<N, kPos, false>(ctx, ln, S, t0, lo, hi, m, alpha, rs, sk);
}

/* P (packed 16-bit pairs, the wgmma A-fragment order) from the fp32 P in S. */
template <typename T, int N>
__device__ __forceinline__ void pack_p(uint32_t *P, const float *S) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
        P[i] = Dt<T>::pack(S[2 * i], S[2 * i + 1]);
}

/* Store the thread's two rows, all D columns (store_acc_rows): T, fp8 e4m3 x o_scale, or
 * NVFP4 (c.o_fp4: a quad of lanes a 16-column block, store_acc_rows_nvfp4). */
template <typename T, int D>
__device__ __forceinline__ void store_rows(const fi_ctx_params &p, const RunCtx &ctx,
                                           const fi_work_item &it, const fi_request_info &rq,
                                           int nh, int M, const Lane &ln, const float *O,
                                           const float *m, const float *l) {
    const fi_exec_common &c = p.c;
    if (c.o_fp4 && it.out_slot < 0) /* uniform over the item */
        store_acc_rows_nvfp4<D>(c, ctx, it, rq, nh, M, ln.r0, 2 * ln.q4, ln.q4 == 0, O, m, l);
    else
        store_acc_rows<D, D>(c, ctx, it, rq, nh, M, ln.r0, 2 * ln.q4, ln.q4 == 0, O, m, l,
                             [&](int64_t off, float x, float y) { store_out2<T>(c, off, x, y); });
}

/* The family: q / out dtype T (bf16, fp16; the matmuls' too), KV element KV (T; or fp8
 * e4m3 or NVFP4 (fi::nvfp4: e2m1 bytes + k_sf / v_sf block scales), converted to T by the
 * producer, exactly), head_dim D. */
template <typename T, int D, typename KV = T> struct CtxFamily {
    using G = Geo<D>;
    static constexpr bool kQuant = std::is_same<KV, __nv_fp8_e4m3>::value || std::is_same<KV, nvfp4>::value;
    static_assert(kQuant || std::is_same<KV, T>::value, "KV: the q dtype, fp8 e4m3 or NVFP4");
    static constexpr int N = G::kBlockN;
    using Params = fi_ctx_params;
    using Merge = SplitMerge<D, kRows, OutDynFp4<T>, kThreads, false>; /* all merges after the items */
    static constexpr int kThreads = fictx::kThreads;
    static constexpr int kProducerWarps = fictx::kProducerWarps;
    static constexpr int kConsumerRegs = kQuant ? G::kConsumerRegsQ : G::kConsumerRegs;
    static constexpr size_t kSmemBytes = G::kSmemBytes;
    using State = Cursor<G::kStages>;

    static __device__ __forceinline__ State setup(unsigned char *smem) {
        const uint32_t s0 = smem_u32(smem);
        if (threadIdx.x == 0) {
            for (int st = 0; st < G::kStages; ++st) {
                mbar_init(G::full_k(s0, st), kProducerThreads); /* every producer thread */
                mbar_init(G::full_v(s0, st), kProducerThreads);
                mbar_init(G::empty_k(s0, st), 8);               /* the consumer warps */
                mbar_init(G::empty_v(s0, st), 8);
            }
            mbar_init(G::qfull(s0), kProducerThreads);
            mbar_init(G::qempty(s0), 8);
            mbar_init_fence();
        }
        return State{0, 0u, 0u};
    }

    /* The producer warpgroup: Q, then K and V of every block, of every item of the CTA. */
    static __device__ void produce(const fi_ctx_params &p, const fi_cta_start &cs, unsigned char *smem) {
        setmaxnreg_dec<kQuant ? G::kProducerRegsQ : G::kProducerRegs>();
        const uint32_t s0 = smem_u32(smem);
        const int pt = (int)threadIdx.x - kThreads;
        const int split = p.c.header->kv_split_pages, ppr = p.c.header->pages_per_row;
        State cur{0, 0u, 0u};
        for_each_item(p.c, cs, [&](const fi_work_item &it, const fi_request_info &rq) {
            mbar_wait(G::qempty(s0), cur.qph ^ 1u);
            produce_q<T, D>(p, it, rq, s0, pt);
            cp_async_mbar_arrive(G::qfull(s0));
            cur.qph ^= 1u;
            const int kvh = it.head_begin / p.g.group;
            /* this KV head's rows: T elements, or (quantised caches) bytes and scale rows;
             * the path not taken is dead code */
            const T *kb = static_cast<const T *>(p.g.k.data) + (int64_t)kvh * p.g.k.stride_head;
            const T *vb = static_cast<const T *>(p.g.v.data) + (int64_t)kvh * p.g.v.stride_head;
            const RowSrc kq = row_src(p.g.k, p.g.k_sf, kvh), vq = row_src(p.g.v, p.g.v_sf, kvh);
            const int64_t krow = rq.page_row_offset, vrow = krow + (split ? ppr : 0);
            const int nblk = blocks_of<N>(it);
            for (int b = 0; b < nblk; ++b) {
                const uint32_t dst = G::stage(s0, cur.st);
                if (!kQuant && tma_block<D>(p, it, b)) {
                    const int t0 = it.kv_begin + b * N;
                    const int32_t pk = tma_page<D>(p, krow, t0, pt);
                    const int32_t pv = split ? tma_page<D>(p, vrow, t0, pt) : pk;
                    mbar_wait(G::empty_k(s0, cur.st), cur.ph ^ 1u);
                    produce_tma<D>(p, &p.tma_k, kvh, t0, dst, G::full_k(s0, cur.st), pt, pk);
                    mbar_wait(G::empty_v(s0, cur.st), cur.ph ^ 1u);
                    produce_tma<D>(p, &p.tma_v, kvh, t0, dst + G::kKBytes, G::full_v(s0, cur.st), pt, pv);
                    cur.next();
                    continue;
                }
                const int32_t pk = block_page<D>(p, it, krow, b, pt);
                const int32_t pv = split ? block_page<D>(p, it, vrow, b, pt) : pk;
                if constexpr (kQuant) {
                    produce_half_q<T, KV, D>(p, kq, it, b, pt, pk, dst, G::empty_k(s0, cur.st),
                                             G::full_k(s0, cur.st), cur.ph ^ 1u);
                    produce_half_q<T, KV, D>(p, vq, it, b, pt, pv, dst + G::kKBytes,
                                             G::empty_v(s0, cur.st), G::full_v(s0, cur.st),
                                             cur.ph ^ 1u);
                } else {
                    uint32_t kin, vin;
                    const T *kr = token_row<T, D>(p, p.g.k, kb, it, b, pt, pk, &kin);
                    const T *vr = token_row<T, D>(p, p.g.v, vb, it, b, pt, pv, &vin);
                    mbar_wait(G::empty_k(s0, cur.st), cur.ph ^ 1u);
                    produce_rows<T, D>(kr, kin, dst, pt);
                    cp_async_mbar_arrive(G::full_k(s0, cur.st));
                    mbar_wait(G::empty_v(s0, cur.st), cur.ph ^ 1u);
                    produce_rows<T, D>(vr, vin, dst + G::kKBytes, pt);
                    cp_async_mbar_arrive(G::full_v(s0, cur.st));
                }
                cur.next();
            }
        });
    }

    /* One item on both consumer warpgroups (schedule: the header comment). */
    static __device__ bool run_item(const fi_ctx_params &p, const RunCtx &ctx, const fi_work_item &it,
                                    const fi_request_info &rq, unsigned char *smem, bool first,
                                    State &cur) {
        const Lane ln = lane_of(threadIdx.x);
        if (first && ln.w == 1) /* warpgroup 0 takes the first turn */
            nbar_arrive(kTurnBar, 256);
        return ctx.scale_log2 > 0.f ? item<true>(p, ctx, it, rq, smem, ln, cur)
                                    : item<false>(p, ctx, it, rq, smem, ln, cur);
    }

    /* Turns (FlashAttention-3's ping-pong): the warpgroups issue their matmuls in
     * alternation, so one's softmax runs while the other's matmuls have the tensor cores.
     * Warpgroup w waits on barrier kTurnBar + w, and hands over on the other's. */
    static constexpr int kTurnBar = 2;
    static __device__ __forceinline__ void turn_begin(const Lane &ln) { nbar_sync(kTurnBar + ln.w, 256); }
    static __device__ __forceinline__ void turn_end(const Lane &ln) { nbar_arrive(kTurnBar + (ln.w ^ 1), 256); }

    template <bool kPos>
    static __device__ __forceinline__ bool item(const fi_ctx_params &p, const RunCtx &ctx,
                                                const fi_work_item &it, const fi_request_info &rq,
                                                unsigned char *smem, const Lane &ln, State &cur) {
        const uint32_t s0 = smem_u32(smem);
        const int nh = it.head_end - it.head_begin, M = (it.q_end - it.q_begin) * nh;
        const int nblk = uniform(blocks_of<N>(it));
        int lo[2], hi[2];
        row_bounds(ctx, it, rq, M, nh, ln.r0, 8, lo, hi);
        float O[D / 2], S[N / 2];
        uint32_t P[N / 4];
#pragma unroll
        for (int i = 0; i < D / 2; ++i)
            O[i] = 0.f;
        wg_pin<D / 2>(O);
        float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.f, 0.f};
        const Skip sk = skip_of(p.c, rq, ln);
        bool skipped = false; /* the previous block's: its P V is not issued */
        int n_skipped = 0;
        const State c0 = cur;
        auto stage_of = [&](int b) { return (c0.st + b) % G::kStages; };
        auto parity_of = [&](int b) { return c0.ph ^ (uint32_t)(((c0.st + b) / G::kStages) & 1); };
        mbar_wait(G::qfull(s0), cur.qph);
        if (nblk > 0) { /* block 0: scores and softmax, nothing to overlap yet */
            const int st0 = stage_of(0);
            mbar_wait(G::full_k(s0, st0), parity_of(0));
            fence_proxy_async();
            turn_begin(ln);
            issue_scores<T, D>(S, s0, st0, ln.w);
            turn_end(ln);
            wg_wait<0>();
            wg_pin<N / 2>(S);
            if (ln.lane == 0) {
                mbar_arrive(G::empty_k(s0, st0));
                if (nblk == 1)
                    mbar_arrive(G::qempty(s0));
            }
            float alpha[2];
            skipped = softmax_block<N, kPos>(ctx, ln, S, it.kv_begin, lo, hi, m, alpha, l, sk);
            n_skipped += skipped;
            pack_p<T, N>(P, S);
        } else if (ln.lane == 0) {
            mbar_arrive(G::qempty(s0));
        }
        for (int b = 1; b < nblk; ++b) {
            const int stb = stage_of(b), stp = stage_of(b - 1);
            mbar_wait(G::full_k(s0, stb), parity_of(b));
            mbar_wait(G::full_v(s0, stp), parity_of(b - 1));
            fence_proxy_async();
            turn_begin(ln);
            issue_scores<T, D>(S, s0, stb, ln.w);           /* group 1: S_b */
            issue_pv<T, D>(O, P, s0, stp, !skipped);        /* group 2: P_{b-1} V_{b-1} */
            turn_end(ln);
            wg_wait<1>();                                   /* S_b done */
            wg_pin<N / 2>(S);
            if (ln.lane == 0) {
                mbar_arrive(G::empty_k(s0, stb));
                if (b == nblk - 1) /* the item's last scores: Q is free */
                    mbar_arrive(G::qempty(s0));
            }
            float alpha[2], rs[2];
            skipped = softmax_block<N, kPos>(ctx, ln, S, it.kv_begin + b * N, lo, hi, m, alpha, rs, sk);
            n_skipped += skipped;
            wg_wait<0>();                                   /* P_{b-1} V_{b-1} done */
            wg_pin<D / 2>(O);
            pin_u32<N / 4>(P);
            if (ln.lane == 0)
                mbar_arrive(G::empty_v(s0, stp));
            if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
                for (int j = 0; j < D / 8; ++j) {
                    O[4 * j + 0] *= alpha[0];
                    O[4 * j + 1] *= alpha[0];
                    O[4 * j + 2] *= alpha[1];
                    O[4 * j + 3] *= alpha[1];
                }
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
                l[i] = l[i] * alpha[i] + rs[i];
            pack_p<T, N>(P, S);
        }
        if (nblk > 0) { /* the last block's P V */
            const int stl = stage_of(nblk - 1);
            mbar_wait(G::full_v(s0, stl), parity_of(nblk - 1));
            fence_proxy_async();
            turn_begin(ln);
            issue_pv<T, D>(O, P, s0, stl, !skipped);
            turn_end(ln);
            wg_wait<0>();
            wg_pin<D / 2>(O);
            pin_u32<N / 4>(P);
            if (ln.lane == 0)
                mbar_arrive(G::empty_v(s0, stl));
        }
        for (int b = 0; b < nblk; ++b)
            cur.next();
        cur.qph ^= 1u;
#pragma unroll
        for (int i = 0; i < 2; ++i) { /* the quad's partial sums: the row's l */
            l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
            l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        }
        store_rows<T, D>(p, ctx, it, rq, nh, M, ln, O, m, l);
        if (sk.on && p.c.skip_softmax_stats && (threadIdx.x & 127) == 0) {
            atomicAdd(p.c.skip_softmax_stats, (unsigned long long)nblk);
            atomicAdd(p.c.skip_softmax_stats + 1, (unsigned long long)n_skipped);
        }
        if (it.out_slot < 0)
            return false;
        return Merge::arrive(p.c, ctx, it, reinterpret_cast<int *>(smem + G::kOffFlag),
                             reinterpret_cast<float *>(smem + G::kOffW),
                             reinterpret_cast<float *>(smem + G::kOffRow));
    }
};

}  // namespace fictx
