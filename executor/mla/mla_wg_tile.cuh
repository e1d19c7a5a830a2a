/*
 * executor/mla/mla_wg_tile.cuh - the MLA decode family's wgmma variant (sm_90a), for tiles
 * of 64 rows (heads x q_len >= 64: heads 64 and 128, heads 32 with MTP): one work item of
 * up to 64 rows over a KV range, S = Q K^T and O += P V on the warpgroup tensor-core path.
 * The persistent loop, the split merge and the launch are the shared ones (executor/cuda/).
 * The consumers' item loop (wg_run_item) is shared with the fp8 body (mla_wg8_tile.cuh)
 * through an Ops policy: shared layout, matmuls, where P goes, epilogue (Ops16 here).
 *
 * What it computes: as mla_tile.cuh (fiattn_run.h): s_j = bmm1_scale * (q_nope . ckv_j +
 * q_pe . kpe_j), out = bmm2_scale * softmax(s) . ckv, mask rule of plan/mask.h, sinks in
 * the denominator, natural-log LSE; a row without keys: zeros and lse -inf (or the sink).
 *
 * How (one CTA = 2 consumer warpgroups + 1 producer warpgroup, one CTA per SM):
 *  - Shared memory holds Q (64 rows x 576) and a ring of 4 KV blocks of 32 tokens x 576,
 *    as panels of 64 elements a row in the 128-byte swizzle wgmma reads
 *    (executor/cuda/common/wgmma.cuh): 9 panels each, 8 of ckv (K and V) and 1 of kpe.
 *    Ring and Q run across items: the producer loads the next item while the consumers
 *    finish this one.  (Blocks of 64 tokens leave room for 2 only: H200, heads 128 B128 x
 *    4096, 622 us, with the tensor pipe 26% busy waiting on refills.)
 *  - Producer warpgroup: a warp a block's 8 tokens.  A 16-bit cache with tensor maps
 *    (page_size >= 8, fi_mla_params.tma_on) goes by TMA on the blocks wholly inside an
 *    item that starts on a multiple of 8 tokens (map_blocks): 9 boxes (8 rows x one
 *    128-byte panel each) from one lane a warp, their bytes on the block's "full" mbarrier.
 *    Other blocks (an item's ragged end, page size 1, no maps) and Q go by 16-byte cp.async (8 lanes a 128-byte row piece; a token's
 *    page from the page table), each thread's completion arriving on "full"; tokens
 *    outside [kv_begin, kv_end) and Q rows past the tile are zero-filled (P = 0 must not
 *    meet NaN bit patterns).  An fp8 e4m3 cache (KV =
 *    __nv_fp8_e4m3, T = fp16) is loaded into registers instead and converted to fp16 into
 *    the same panels (produce_blocks_e4m3; q too, produce_q_f16), with ordinary stores, a
 *    proxy fence and one arrival a thread.  A sparse plan's page-table entries are flat KV
 *    slots (kv_at); invalid ones are zero-filled and masked (sparse_keys).
 *  - Consumers: warpgroup w owns the output columns [256 w, 256 w + 256) (64 x 256 fp32 in
 *    registers) and the scores of blocks b with b % 2 == w (the schedule of FlashMLA's
 *    2025 kernel: the two warpgroups alternate blocks, so one's softmax runs beside the
 *    other's matmuls).  The owner of block b computes S_b = Q K_b^T (36 wgmma m64n32k16),
 *    the running max m_b = max(m_{b-1}, rowmax S_b) (16-bit: lazy, moved only past a 2^8
 *    margin, run_ctx.cuh row_max_step), P_b = exp2(S_b - m_b) into the block's
 *    kpe panel (dead once S_b is done; 64 x 32 in the 64-byte swizzle), and publishes m_b
 *    and rowsum(P_b); both warpgroups then rescale their O half by exp2(m_{b-1} - m_b) and
 *    add P_b V_b (2 wgmma m64n256k16, V read transposed from the ckv panels).  Both keep
 *    the same m and l, so the epilogue needs no exchange.  A warpgroup works in rounds,
 *    one for each own block b: it issues the other's P_{b-1} V_{b-1}, runs the softmax
 *    of S_b while that runs, then issues P_b V_b and the next own scores S_{b+2}, and
 *    waits for all (wg_run_item).  A block is released to the producer when both
 *    warpgroups' P_b V_b are done (256 thread arrivals on its "empty" mbarrier).
 *  - Synchronisation: mbarriers between producer and consumers (full / empty per block,
 *    qfull / qempty for Q); named barriers 2 + (b % 2) from block b's owner to the other
 *    warpgroup (bar.arrive / bar.sync, 256 threads); 4 + w inside warpgroup w (all its S_b
 *    done before P_b overwrites kpe; all of P_b written before P_b V_b reads it).
 *    Generic writes (cp.async, P) are fenced to the async proxy before wgmma reads them.
 *  - Online softmax in the exp2 domain, fp32; a row whose keys are all masked so far keeps
 *    m = -inf, l = 0, O = 0; NaN in q or a seen key makes the row's l, O and lse NaN.
 * Sources: FlashAttention-3 (Shah et al. 2024) producer / consumer warpgroups and wgmma;
 * FlashMLA's 2025 decode kernel write-up (alternating blocks between two warpgroups that
 * split the 512-wide output); FlashAttention-2 online softmax; flash-decoding split-KV.
 */
#pragma once

#include "executor/cuda/common/dtype.cuh"
#include "executor/cuda/common/profile.cuh"
#include "executor/cuda/common/ptx.cuh"
#include "executor/cuda/common/wgmma.cuh"
#include "executor/cuda/merge/split_merge.cuh"
#include "executor/mla/mla_params.h"
#include "executor/mla/mla_q.cuh"
#include "plan/mask.h"

#include <type_traits>

namespace fimlawg {
using namespace fi;

constexpr int kThreads = 256;       /* two consumer warpgroups */
constexpr int kProducerWarps = 4;   /* one producer warpgroup (registers are granted per
                                       warpgroup: a lone producer warp costs as much) */
constexpr int kProducerThreads = kProducerWarps * 32;
/* setmaxnreg: the consumers' increase draws on what the producer released of the CTA's
 * launch allocation (168 registers x 384 threads: __launch_bounds__(384, 1)), so 128 P +
 * 256 C <= 64512, or the consumers wait forever.  56 / 224: both spill-free (at 40 the
 * producer's two copy paths, tensor map and cp.async, spilled 28 bytes); an fp8 cache's
 * producer holds two blocks' loads in registers while it converts them:
 * 104 / 200 (18 bytes spilled, scripts/accepted-spills.txt; one block at 72 / 208 was
 * spill-free and 2-3% slower). */
template <bool kFp8> constexpr int kProducerRegs = kFp8 ? 104 : 56;
template <bool kFp8> constexpr int kConsumerRegs = kFp8 ? 200 : 224;
static_assert(kProducerThreads * kProducerRegs<false> + 256 * kConsumerRegs<false> <= 168 * 384 &&
                  kProducerThreads * kProducerRegs<true> + 256 * kConsumerRegs<true> <= 168 * 384,
              "setmaxnreg within the launch allocation");
constexpr int kRows = FI_MLA_WG_TILE_ROWS;
constexpr int kBlockN = FI_MLA_WG_KV_BLOCK;
constexpr int kDqk = 576, kDv = 512;
/* The lazy running max's margin of both 16-bit wgmma bodies (this one's Ops16 and the
 * 64-token body; log2 units, run_ctx.cuh row_max_step): P = exp2(S - m) <= 2^8, exact in
 * bf16 / fp16 range.  The fp8 body keeps none (Ops8). */
constexpr int kLazy16Log2 = 8;
constexpr int kPanels = kDqk / 64;  /* 9: 8 ckv + 1 kpe */
constexpr uint32_t kQPanel = (uint32_t)kRows * 128;     /* 8192: [64 rows][64] */
constexpr uint32_t kQBytes = kPanels * kQPanel;         /* 73728 */
constexpr uint32_t kKPanel = (uint32_t)kBlockN * 128;   /* [kBlockN tokens][64] */
constexpr uint32_t kBlockBytes = kPanels * kKPanel;     /* a ring block */
/* 4 stages beside Q; wg_run_item's rounds rely on it (block b + 2's stage is b - 2's). */
constexpr int kStages = 4;
static_assert(kRows == 64 && kBlockN == 32, "Q panels 64 x 64, KV blocks of 32 rows");
static_assert((uint32_t)kRows * kBlockN * 2 == kKPanel, "P_b fits the block's kpe panel");
/* P_b [64 rows][32] in the kpe panel: rows of 64 B in the 64-byte swizzle. */
constexpr uint32_t kPSwz = 2, kPSbo = 512;
__device__ __forceinline__ uint32_t p_off(int r, int c) { return sw64(r, c); }
constexpr int kTokPerWarp = kBlockN / 4; /* producer warp pw copies tokens pw * this .. */

/* Shared memory: Q | ring blocks 0-3 | WgShared (barriers, m / rowsum exchange, merge). */
constexpr uint32_t kOffQ = 0;
constexpr uint32_t kOffRing = kQBytes;

/* What follows the ring in shared memory at byte kBar, in both wgmma bodies: mbarriers
 * full[4], empty[4], qfull, qempty, landed[4] (the fp8 body's); the owner's block maxima
 * and row sums [2][64] fp32 each (exchange slot b % 2); the merge's flags, weights and row
 * stats. */
template <uint32_t kBar, bool kSoloScratch = true> struct WgShared {
    static constexpr uint32_t kM = kBar + 128, kRS = kM + 2 * kRows * 4;
    /* kW: the solo merge's weights (merge_group), none for a family whose SplitMerge has
     * kSolo false */
    static constexpr uint32_t kFlag = kRS + 2 * kRows * 4, kW = kFlag + 16;
    static constexpr uint32_t kRow = kW + (kSoloScratch ? kSoloMergeRows * 4 : 0);
    static constexpr size_t kEnd = kRow + 2 * kRows * 4;
    static_assert(kEnd <= 232448, "smem");
    static __device__ __forceinline__ uint32_t full(uint32_t s0, int st) { return s0 + kBar + 8 * st; }
    static __device__ __forceinline__ uint32_t empty(uint32_t s0, int st) { return s0 + kBar + 32 + 8 * st; }
    static __device__ __forceinline__ uint32_t qfull(uint32_t s0) { return s0 + kBar + 64; }
    static __device__ __forceinline__ uint32_t qempty(uint32_t s0) { return s0 + kBar + 72; }
    /* The fp8 body only: stage st's K rows landed (its producer then writes V^T, and
     * `full` says V^T is there); kProducerThreads arrivals, as full. */
    static __device__ __forceinline__ uint32_t landed(uint32_t s0, int st) { return s0 + kBar + 80 + 8 * st; }
    /* One thread: full and landed (kLanded: the fp8 body) count every producer thread,
     * empty empty_arrivals, qempty one lane of each consumer warp. */
    template <bool kLanded = false>
    static __device__ __forceinline__ void init(uint32_t s0, uint32_t empty_arrivals) {
        for (int st = 0; st < kStages; ++st) {
            mbar_init(full(s0, st), kProducerThreads);
            mbar_init(empty(s0, st), empty_arrivals);
            if (kLanded)
                mbar_init(landed(s0, st), kProducerThreads);
        }
        mbar_init(qfull(s0), kProducerThreads);
        mbar_init(qempty(s0), 8);
        mbar_init_fence();
    }
};
using Sh16 = WgShared<kOffRing + kStages * kBlockBytes>;
constexpr size_t kSmemBytes = Sh16::kEnd;

/* Ring position of the next block (stage, its phase parity) and Q's phase parity; the
 * producer and every consumer thread advance their own copy in the same order. */
struct Cursor {
    int st;
    uint32_t ph, qph;
    __device__ __forceinline__ void next() {
        st = (st + 1) & (kStages - 1);
        ph ^= st == 0 ? 1u : 0u;
    }
};

__device__ __forceinline__ int blocks_of(const fi_work_item &it) {
    return it.kv_end > it.kv_begin ? (it.kv_end - it.kv_begin + kBlockN - 1) / kBlockN : 0;
}

/* ---- producer ------------------------------------------------------------------------ */

/* Page-table entry of token kTokPerWarp pw + lane of block b for lanes < kTokPerWarp
 * (else, or past the range, 0): its page, or for a sparse plan its flat KV slot. */
__device__ __forceinline__ int32_t block_page(const fi_mla_params &p, const fi_work_item &it,
                                              const fi_request_info &rq, int b, int pt) {
    const int lane = pt & 31, t = it.kv_begin + b * kBlockN + kTokPerWarp * (pt >> 5) + lane;
    return lane < kTokPerWarp && t < it.kv_end
               ? p.c.page_table[(int64_t)rq.page_row_offset + (p.m.sparse ? t : t >> p.c.page_shift)]
               : 0;
}

/* Where key t (page-table entry e) lives: its page and offset, and whether it is a key at
 * all (inside the item's range; for a sparse plan also a slot in [0, kv_slots)). */
struct KvAt {
    int64_t page, slot;
    bool in;
};
__device__ __forceinline__ KvAt kv_at(const fi_mla_params &p, int32_t e, int t, int kv_end) {
    if (p.m.sparse) {
        const bool in = t < kv_end && e >= 0 && (int64_t)e < p.m.kv_slots;
        return KvAt{in ? (int64_t)(e >> p.c.page_shift) : 0, (int64_t)(e & (p.c.page_size - 1)), in};
    }
    return KvAt{(int64_t)e, (int64_t)(t & (p.c.page_size - 1)), t < kv_end};
}

/* Sparse plans: bit j set when key kv0 + j of the item (j < 32 = kBlockN) is a key; the
 * calling warp's lanes read one entry each (the producer read them just before: L1 / L2). */
__device__ __forceinline__ uint32_t sparse_keys(const fi_mla_params &p, const fi_work_item &it,
                                                const fi_request_info &rq, int kv0, int lane) {
    const int t = kv0 + lane;
    const int32_t e = t < it.kv_end ? p.c.page_table[(int64_t)rq.page_row_offset + t] : -1;
    return __ballot_sync(0xffffffffu, e >= 0 && (int64_t)e < p.m.kv_slots);
}

/* Block b of item it into ring stage st by 16-byte cp.async: producer warp pw copies its
 * kTokPerWarp tokens, lane 8 j + q piece q of every 128-byte row piece (panel) of tokens
 * j, j + 4, ... of them; tokens past the item are zero-filled.  pg: block_page of this
 * thread. */
template <typename T>
__device__ __forceinline__ void produce_block(const fi_mla_params &p, const fi_work_item &it,
                                              const fi_request_info &rq, uint32_t s0, int st,
                                              int b, int pt, int32_t pg, uint64_t pol) {
    const int lane = pt & 31, pw = pt >> 5;
    const int t0 = it.kv_begin + b * kBlockN + kTokPerWarp * pw; /* this warp's first token */
    const int j = lane >> 3, q = lane & 7;
    const uint32_t base = s0 + kOffRing + st * kBlockBytes;
#pragma unroll
    for (int pass = 0; pass < kTokPerWarp / 4; ++pass) {
        const int tok = pass * 4 + j, t = t0 + tok; /* tok: of this warp's */
        const KvAt at = kv_at(p, __shfl_sync(0xffffffffu, pg, tok), t, it.kv_end);
        const T *ckv = (const T *)p.m.ckv + at.page * p.m.ckv_stride_page + at.slot * p.m.ckv_stride_tok + q * 8;
        const T *kpe = (const T *)p.m.kpe + at.page * p.m.kpe_stride_page + at.slot * p.m.kpe_stride_tok + q * 8;
        const uint32_t dst = base + sw128(kTokPerWarp * pw + tok, q * 8);
#pragma unroll
        for (int i = 0; i < kPanels; ++i)
            cp_async16(dst + i * kKPanel, at.in ? (i < 8 ? ckv + i * 64 : kpe) : (const T *)p.m.ckv,
                       at.in ? 16 : 0, pol);
    }
}

/* Blocks of item it that go by tensor map: with maps (p.tma_on: a dense 16-bit cache, or
 * an fp8 one on the fp8 body; page_size >= 8) and the item starting on a multiple of 8
 * tokens, those wholly inside it (each producer warp's 8 tokens then start on a multiple
 * of 8 and lie in one page). */
__device__ __forceinline__ int map_blocks(const fi_mla_params &p, const fi_work_item &it) {
    return p.tma_on && (it.kv_begin & 7) == 0 ? (it.kv_end - it.kv_begin) / kBlockN : 0;
}

/* Producer warp pw's 8 tokens of block b of item it by tensor map, issued by one lane:
 * the 9 boxes (8 rows of one 128-byte panel each: 8 of ckv, 1 of kpe) on `full`, whose
 * transaction count it raises first; TMA writes the 128-byte swizzle produce_block
 * computes by hand.  page: the page of the warp's first token. */
__device__ __forceinline__ void map_block(const fi_mla_params &p, const fi_work_item &it, uint32_t s0,
                                       int st, int b, int pw, int32_t page, uint32_t full, uint64_t pol) {
    static_assert(kTokPerWarp == 8, "a warp's tokens: one 8-row swizzle atom a panel");
    const int slot = (it.kv_begin + b * kBlockN + kTokPerWarp * pw) & (p.c.page_size - 1);
    const uint32_t dst = s0 + kOffRing + st * kBlockBytes + kTokPerWarp * pw * 128;
    mbar_expect_tx_only(full, kPanels * kTokPerWarp * 128);
#pragma unroll
    for (int i = 0; i < kPanels - 1; ++i)
        tma_load_3d(dst + i * kKPanel, &p.tma_ckv, 64 * i, slot, page, full, pol);
    tma_load_3d(dst + (kPanels - 1) * kKPanel, &p.tma_kpe, 0, slot, page, full, pol);
}

/* The same block from an fp8 e4m3 cache, converted to fp16 on the way (exact), in two
 * steps so the loads travel while the producer waits for the ring slot.  Warp pw's
 * kTokPerWarp (8) tokens: lanes 4 j .. 4 j + 3 take token j, lane q = l % 4 its 16-value
 * chunks q, q + 4, ..., q + 32 (fp8 values 16 q + 64 i: ckv for i < 8, kpe for i = 8), so
 * a lane needs one row address.  load_block_e4m3 reads them (ld.global.nc) into v;
 * store_block_e4m3 converts each into two 8-value fp16 pieces of panel i (columns 16 q
 * ..).  The caller fences and arrives (ordinary stores, not cp.async). */
constexpr int kE4m3PerLane = kDqk / 64; /* 9 */
static_assert(kTokPerWarp * 4 == 32, "4 lanes a token");
__device__ __forceinline__ void load_block_e4m3(const fi_mla_params &p, const fi_work_item &it,
                                                int b, int pt, int32_t pg, uint4 *v) {
    const int lane = pt & 31, tok = lane >> 2, q = lane & 3;
    const int t = it.kv_begin + b * kBlockN + kTokPerWarp * (pt >> 5) + tok;
    const KvAt at = kv_at(p, __shfl_sync(0xffffffffu, pg, tok), t, it.kv_end);
    const uint8_t *ckv = (const uint8_t *)p.m.ckv + at.page * p.m.ckv_stride_page + at.slot * p.m.ckv_stride_tok + 16 * q;
    const uint8_t *kpe = (const uint8_t *)p.m.kpe + at.page * p.m.kpe_stride_page + at.slot * p.m.kpe_stride_tok + 16 * q;
#pragma unroll
    for (int i = 0; i < kE4m3PerLane; ++i)
        v[i] = at.in ? __ldg(reinterpret_cast<const uint4 *>(i < 8 ? ckv + 64 * i : kpe))
                     : make_uint4(0, 0, 0, 0);
}
__device__ __forceinline__ void store_block_e4m3(uint32_t s0, int st, int pt, const uint4 *v) {
    const int lane = pt & 31, row = kTokPerWarp * (pt >> 5) + (lane >> 2), col = (lane & 3) * 16;
    const uint32_t base = s0 + kOffRing + st * kBlockBytes;
#pragma unroll
    for (int i = 0; i < kE4m3PerLane; ++i) {
        st_shared16(base + i * kKPanel + sw128(row, col), e4m3x8_to_f16x8(make_uint2(v[i].x, v[i].y)));
        st_shared16(base + i * kKPanel + sw128(row, col + 8), e4m3x8_to_f16x8(make_uint2(v[i].z, v[i].w)));
    }
}

/* Every block of item it from an fp8 cache: two blocks in registers, so one block's loads
 * travel while the other waits for its ring slot and is converted and stored (one
 * block in flight left the producer latency-bound: H200, heads 16 B128 x 4096, 1.57
 * TB/s).  Page entries are read two blocks ahead.  Advances cur by the item's blocks. */
__device__ __forceinline__ void produce_blocks_e4m3(const fi_mla_params &p, const fi_work_item &it,
                                                    const fi_request_info &rq, uint32_t s0, int pt,
                                                    Cursor &cur, int nblk) {
    if (nblk == 0)
        return;
    auto put = [&](const uint4 *v) {
        mbar_wait(Sh16::empty(s0, cur.st), cur.ph ^ 1u);
        store_block_e4m3(s0, cur.st, pt, v);
        fence_proxy_async(); /* ordinary stores, read by wgmma */
        mbar_arrive(Sh16::full(s0, cur.st));
        cur.next();
    };
    uint4 va[kE4m3PerLane], vb[kE4m3PerLane];
    int32_t e1 = nblk > 1 ? block_page(p, it, rq, 1, pt) : 0;
    load_block_e4m3(p, it, 0, pt, block_page(p, it, rq, 0, pt), va);
    for (int b = 0; b < nblk; b += 2) { /* va: block b; e1: block b + 1's entries */
        const int32_t e2 = b + 2 < nblk ? block_page(p, it, rq, b + 2, pt) : 0;
        if (b + 1 < nblk)
            load_block_e4m3(p, it, b + 1, pt, e1, vb);
        put(va);
        if (b + 1 >= nblk)
            break;
        e1 = b + 3 < nblk ? block_page(p, it, rq, b + 3, pt) : 0;
        if (b + 2 < nblk)
            load_block_e4m3(p, it, b + 2, pt, e2, va);
        put(vb);
    }
}

/* Q rows of item it as fp16 from q of kind p.m.q_kind (fp16, e4m3 or bf16), through
 * registers (the fp8 family; rows as produce_q).  Loads go kU chunks at a time so their
 * latencies overlap. */
__device__ __forceinline__ void produce_q_f16(const fi_mla_params &p, const fi_work_item &it,
                                              const fi_request_info &rq, uint32_t s0, int pt) {
    constexpr int kU = 4, kN = kRows * (kDqk / 8);
    static_assert(kN % (kProducerThreads * kU) == 0, "Q chunks per round");
    const int nh = it.head_end - it.head_begin;
    const int M = (it.q_end - it.q_begin) * nh;
    const int qk = p.m.q_kind, esz = qk == FI_MLA_Q_E4M3 ? 1 : 2;
#pragma unroll 1
    for (int i0 = pt; i0 < kN; i0 += kProducerThreads * kU) {
        uint4 v[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int idx = i0 + u * kProducerThreads, r = idx / (kDqk / 8), c = idx - r * (kDqk / 8);
            v[u] = make_uint4(0, 0, 0, 0);
            if (r < M) {
                const int64_t tok = (int64_t)rq.q_offset + it.q_begin + r / nh;
                const int h = it.head_begin + r % nh;
                const uint8_t *src = c < kDv / 8
                    ? (const uint8_t *)p.m.q_nope + (tok * p.m.q_nope_stride_tok + h * p.m.q_nope_stride_head + c * 8) * esz
                    : (const uint8_t *)p.m.q_pe + (tok * p.m.q_pe_stride_tok + h * p.m.q_pe_stride_head + (c - kDv / 8) * 8) * esz;
                if (qk == FI_MLA_Q_E4M3) {
                    const uint2 x = __ldg(reinterpret_cast<const uint2 *>(src));
                    v[u] = make_uint4(x.x, x.y, 0, 0);
                } else {
                    v[u] = __ldg(reinterpret_cast<const uint4 *>(src));
                }
            }
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int idx = i0 + u * kProducerThreads, r = idx / (kDqk / 8), c = idx - r * (kDqk / 8);
            uint4 h = v[u];
            if (r < M)
                h = qk == FI_MLA_Q_E4M3 ? e4m3x8_to_f16x8(make_uint2(v[u].x, v[u].y))
                    : qk == FI_MLA_Q_BF16 ? bf16x8_to_f16x8(v[u]) : v[u];
            st_shared16(s0 + kOffQ + (c >> 3) * kQPanel + sw128(r, (c & 7) * 8), h);
        }
    }
}

/* ---- consumers ----------------------------------------------------------------------- */

/* A consumer thread's place: warpgroup w, warp wi in it, rows r0 = 16 wi + g and r0 + 8,
 * score / output columns 8 j + 2 q4 (+1). */
struct Lane {
    int w, wi, lane, g, q4, r0;
};
__device__ __forceinline__ Lane lane_of(int tid) {
    Lane l;
    l.w = warpgroup_idx();
    l.wi = (tid >> 5) & 3;
    l.lane = tid & 31;
    l.g = l.lane >> 2;
    l.q4 = l.lane & 3;
    l.r0 = l.wi * 16 + l.g;
    return l;
}

/* S = Q K^T over the 576 dims of ring stage st (36 wgmma m64n32k16, one commit group). */
template <typename T>
__device__ __forceinline__ void issue_scores(float *S, uint32_t s0, int st) {
    const WgDesc dq = wg_desc_base(s0 + kOffQ, 16, 1024);
    const WgDesc dk = wg_desc_base(s0 + kOffRing + st * kBlockBytes, 16, 1024);
    /* Defined here, on a path ptxas sees as uniform: registers last written in divergent
     * code (the epilogue, the merge) would make it serialise every wgmma (C7520). */
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i)
        S[i] = 0.f;
    wg_pin<kBlockN / 2>(S); /* the zeros written before the fence, not sunk past it (C7515) */
    wg_fence();
#pragma unroll
    for (int k = 0; k < kDqk / 16; ++k)
        Wgmma<kBlockN, T>::template ss<0>(S, dq.at((k >> 2) * kQPanel + (k & 3) * 32),
                                          dk.at((k >> 2) * kKPanel + (k & 3) * 32), k > 0);
    wg_commit();
}

/* O_w += P V_w: P in stage st's kpe panel (K-major, 64-byte swizzle), V = its ckv panels
 * 4w .. 4w + 3 (MN-major, panels 4 KB apart); 2 k16 steps, one commit group. */
template <typename T>
__device__ __forceinline__ void issue_pv(float *O, uint32_t s0, int st, int w) {
    const uint32_t kb = s0 + kOffRing + st * kBlockBytes;
    const WgDesc dp = wg_desc_base(kb + 8 * kKPanel, 16, kPSbo, kPSwz);
    const WgDesc dv = wg_desc_base(kb + 4 * w * kKPanel, kKPanel, 1024);
    wg_pin<128>(O); /* the rescale written before the fence (C7515) */
    wg_fence();
#pragma unroll
    for (int k = 0; k < kBlockN / 16; ++k)
        Wgmma<256, T>::template ss<1>(O, dp.at(k * 32), dv.at(k * 2048), 1);
    wg_commit();
}

/* The thread's row maxima of S, scaled (S *= scale_log2, the exp2 domain) unless kPos
 * (scale_log2 > 0: the maxima of the raw scores, scaled once later); kMask: scores outside
 * [lo, hi] of their row or at a slot not in keys (a sparse plan's invalid slots) become
 * -inf. */
template <bool kMask, bool kPos>
__device__ __forceinline__ void scale_scores(const RunCtx &ctx, const Lane &ln, float *S, int t0,
                                             uint32_t keys, const int *lo, const int *hi,
                                             float *mloc) {
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = e >> 1, c = 8 * j + 2 * ln.q4 + (e & 1), t = t0 + c;
            float v = kPos ? S[4 * j + e] : S[4 * j + e] * ctx.scale_log2;
            if (kMask && (t < lo[i] || t > hi[i] || !((keys >> c) & 1u)))
                v = -CUDART_INF_F;
            S[4 * j + e] = v;
            mloc[i] = fmaxf(mloc[i], v);
        }
}

/* P = exp2(S - sub) (kPos: exp2(S sl - sub), one FFMA and one exp2 a score) over the
 * thread's N / 8 column pairs of its two rows (S the m64nN accumulator), added to the row
 * sums rs [2]; each pair j's weights (row r0: p0, p1; row r0 + 8: p2, p3, at columns c,
 * c + 1) handed to put(j, c, p0, p1, p2, p3).  Both wgmma bodies' softmax. */
template <int N, bool kPos, class Put>
__device__ __forceinline__ void exp_scores(const Lane &ln, const float *S, float sl, const float *sub,
                                           float *rs, Put &&put) {
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
        auto pe = [&](int e) {
            const float x = S[4 * j + e], mi = sub[e >> 1];
            return ex2_ftz(kPos ? fmaf(x, sl, -mi) : x - mi);
        };
        const float p0 = pe(0), p1 = pe(1), p2 = pe(2), p3 = pe(3);
        rs[0] += p0 + p1;
        rs[1] += p2 + p3;
        put(j, 8 * j + 2 * ln.q4, p0, p1, p2, p3);
    }
}

/* The thread's two row sums reduced over its quad, then m and rs of rows r0, r0 + 8 into
 * the exchange slot (sM, sRS: [kRows] each) by one lane a quad. */
__device__ __forceinline__ void publish_rows(const Lane &ln, const float *m, float *rs, float *sM,
                                             float *sRS) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        rs[i] += __shfl_xor_sync(0xffffffffu, rs[i], 1);
        rs[i] += __shfl_xor_sync(0xffffffffu, rs[i], 2);
        if (ln.q4 == 0) {
            sM[ln.r0 + 8 * i] = m[i];
            sRS[ln.r0 + 8 * i] = rs[i];
        }
    }
}

/* The other warpgroup's block, from its exchange slot (sM, sRS): the thread's rows take
 * the owner's running max m and add its row sums to l, rescaled by alpha = exp2(m_old -
 * m_new) as the owner computed it (O must be rescaled by alpha too). */
__device__ __forceinline__ void adopt_rows(const Lane &ln, const float *sM, const float *sRS, float *m,
                                           float *l, float *alpha) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float mn = sM[ln.r0 + 8 * i];
        const float mu = mn == -CUDART_INF_F ? 0.f : mn;
        alpha[i] = ex2_ftz(m[i] - mu);
        m[i] = mn;
        l[i] = l[i] * alpha[i] + sRS[ln.r0 + 8 * i];
    }
}

/* The owner's softmax of block b (tokens t0 ..): mask and scale S, the new running max m
 * (in / out), P = 2^Ops::kPLog2 exp2(S - m) written by Ops::put_p into stage st, and m,
 * rowsum(P) into the exchange slot b % 2 for the other warpgroup.  Returns alpha =
 * exp2(m_old - m_new).  kPos (scale_log2 > 0, the usual case): the max is taken on raw
 * scores and each P costs one FFMA and one exp2 (FlashAttention-3's form); otherwise S is
 * scaled first. */
template <class Ops, bool kPos>
__device__ __forceinline__ void softmax_block(const RunCtx &ctx, const Lane &ln, float *S, int t0,
                                              uint32_t keys, const int *lo, const int *hi, float *m,
                                              float *alpha, float *rs, unsigned char *smem, int st,
                                              int slot) {
    float mloc[2] = {-CUDART_INF_F, -CUDART_INF_F};
    /* Most blocks lie inside both rows' key ranges with every slot valid: they skip the
     * per-score mask test (1-3% of the dense heads-128 time when every block paid it). */
    if (keys == ~0u && keys_inside(lo, hi, t0, t0 + kBlockN - 1))
        scale_scores<false, kPos>(ctx, ln, S, t0, keys, lo, hi, mloc);
    else
        scale_scores<true, kPos>(ctx, ln, S, t0, keys, lo, hi, mloc);
    const float sl = ctx.scale_log2;
    float mu[2];
    row_max_step<kPos, Ops::kLazyLog2>(mloc, sl, m, alpha, mu, rs);
    const float sub[2] = {mu[0] - (float)Ops::kPLog2, mu[1] - (float)Ops::kPLog2};
    exp_scores<kBlockN, kPos>(ln, S, sl, sub, rs, [&](int, int c, float p0, float p1, float p2, float p3) {
        Ops::put_p(smem, st, ln.r0, c, p0, p1, p2, p3);
    });
    publish_rows(ln, m, rs, reinterpret_cast<float *>(smem + Ops::Sh::kM) + slot * kRows,
                 reinterpret_cast<float *>(smem + Ops::Sh::kRS) + slot * kRows);
}

/* Store the thread's rows of its 256 columns (store_acc_rows; warpgroup 0 writes the lse);
 * T: the output element. */
template <typename T>
__device__ __forceinline__ void store_rows(const fi_mla_params &p, const RunCtx &ctx,
                                           const fi_work_item &it, const fi_request_info &rq,
                                           int nh, int M, const Lane &ln, const float *O,
                                           const float *m, const float *l) {
    T *out = static_cast<T *>(p.c.out);
    store_acc_rows<256, kDv>(p.c, ctx, it, rq, nh, M, ln.r0, ln.w * 256 + 2 * ln.q4,
                             ln.w == 0 && ln.q4 == 0, O, m, l, [&](int64_t off, float x, float y) {
                                 *reinterpret_cast<uint32_t *>(out + off) = Dt<T>::pack(x, y);
                             });
}

/* Rescale O by alpha, only when some row's max moved (warp vote): once a row's max
 * settles, the 128 multiplies a thread a block are skipped. */
__device__ __forceinline__ void rescale_o(float *O, const float *alpha) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            O[4 * j + 0] *= alpha[0];
            O[4 * j + 1] *= alpha[0];
            O[4 * j + 2] *= alpha[1];
            O[4 * j + 3] *= alpha[1];
        }
    }
}

/* One item on both consumer warpgroups (schedule: the header comment), for either wgmma
 * body: Ops names its shared layout (Sh), when a block's operands are there (k_ready: the
 * barrier before its scores; wait_v: before a P V reads its V, when V comes later), its
 * matmuls (scores, pv), where P goes (put_p, kPLog2; kPOverKpe: P overwrites the block's
 * kpe panel, so every warp's S_b must be done first), what O and l need before the store
 * (finish) and the store itself.
 *
 * Warpgroup w takes its own blocks b = w, w + 2, ... in rounds; a round: the other's
 * block b - 1 (its m, row sums, O rescaled, P_{b-1} V_{b-1} issued), the softmax of S_b
 * while that P V runs, then P_b V_b and the next own scores S_{b+2}, and a full wait.  No
 * wgmma is in flight across a round's end or a branch, so ptxas tracks every accumulator
 * (a partial wait across the loop serialised every wgmma: C7514 / C7515); the softmax
 * still runs beside a P V (FlashAttention-3's intra-warpgroup overlap), and the other
 * warpgroup's scores and P V run beside it. */
template <class Ops>
__device__ __forceinline__ bool wg_run_item(const fi_mla_params &p, const RunCtx &ctx,
                                            const fi_work_item &it, const fi_request_info &rq,
                                            unsigned char *smem, bool first, Cursor &cur) {
    (void)first; /* profiling stamps only (FI_STAMP2: the CTA's first item) */
    using Sh = typename Ops::Sh;
    const uint32_t s0 = smem_u32(smem);
    const Lane ln = lane_of(threadIdx.x);
    const int nh = it.head_end - it.head_begin, M = (it.q_end - it.q_begin) * nh;
    const int nblk = uniform(blocks_of(it));
    int lo[2], hi[2];
    row_bounds(ctx, it, rq, M, nh, ln.r0, 8, lo, hi);
    float O[128], S[kBlockN / 2];
#pragma unroll
    for (int i = 0; i < 128; ++i)
        O[i] = 0.f;
    wg_pin<128>(O); /* zeroed here, not sunk into the first scores' wgmma stage (C7515) */
    float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.f, 0.f};
    const Cursor c0 = cur; /* block b: stage (c0.st + b) % 4, parity flipped per lap */
    auto stage_of = [&](int b) { return (c0.st + b) & (kStages - 1); };
    auto parity_of = [&](int b) { return c0.ph ^ (uint32_t)(((c0.st + b) / kStages) & 1); };
    /* Profiling builds: a round's phases (profile.cuh FI_PHASE): 0 the block's key ballot
     * (sparse plans), 1 the other's P awaited, 2 its P V issued, 3 the barrier before the
     * softmax, 4 the softmax, 5 P_b published, 6 P_{b-1} V_{b-1} awaited, 7 P_b V_b issued,
     * 8 block b + 2's K awaited, 9 S_{b+2} issued, 10 both awaited, the stage released. */
    FI_PHASE_START();
    auto own_scores = [&](int b) {
        mbar_wait(Ops::k_ready(s0, stage_of(b)), parity_of(b));
        fence_proxy_async();
        FI_PHASE(8);
        Ops::scores(S, s0, stage_of(b));
        FI_PHASE(9);
    };
    /* The other warpgroup's block b: its owner published P_b, m_b and rowsum(P_b); O is
     * rescaled as the owner rescaled its half and P_b V_b issued (not waited for). */
    auto other_pv = [&](int b) {
        nbar_sync(2 + (b & 1), 256);
        FI_PHASE(1);
        fence_proxy_async();
        float alpha[2];
        adopt_rows(ln, reinterpret_cast<const float *>(smem + Sh::kM) + (b & 1) * kRows,
                   reinterpret_cast<const float *>(smem + Sh::kRS) + (b & 1) * kRows, m, l, alpha);
        rescale_o(O, alpha);
        Ops::wait_v(s0, stage_of(b), parity_of(b));
        Ops::pv(O, s0, stage_of(b), ln.w);
        FI_PHASE(2);
    };
    mbar_wait(Sh::qfull(s0), cur.qph);
    if (first) {
        FI_STAMP2(0);
    }
    bool q_held = true;
    if (ln.w < nblk)
        own_scores(ln.w);
    wg_wait<0>();
    wg_pin<kBlockN / 2>(S);
    if (first) {
        FI_STAMP2(1);
    }
    for (int b = ln.w; b < nblk; b += 2) { /* S_b done; nothing in flight */
        FI_PHASE_ROUND();
        const uint32_t keys = p.m.sparse ? sparse_keys(p, it, rq, it.kv_begin + b * kBlockN, ln.lane) : ~0u;
        FI_PHASE(0);
        if (b > 0)
            other_pv(b - 1);
        if (b + 2 >= nblk && ln.lane == 0) /* no more scores: Q is free */
            mbar_arrive(Sh::qempty(s0));
        q_held = b + 2 < nblk ? q_held : false;
        if constexpr (Ops::kPOverKpe)
            nbar_sync(4 + ln.w, 128); /* every warp's S_b done: kpe may become P_b */
        FI_PHASE(3);
        /* The softmax works on a copy: written in place while P_{b-1} V_{b-1} is in
         * flight, S (a wgmma accumulator) made ptxas serialise every wgmma (C7515). */
        float alpha[2], rs[2], Sx[kBlockN / 2];
#pragma unroll
        for (int i = 0; i < kBlockN / 2; ++i)
            Sx[i] = S[i];
        if (ctx.scale_log2 > 0.f)
            softmax_block<Ops, true>(ctx, ln, Sx, it.kv_begin + b * kBlockN, keys, lo, hi, m, alpha, rs, smem, stage_of(b), b & 1);
        else
            softmax_block<Ops, false>(ctx, ln, Sx, it.kv_begin + b * kBlockN, keys, lo, hi, m, alpha, rs, smem, stage_of(b), b & 1);
        FI_PHASE(4);
        fence_proxy_async();
        nbar_sync(4 + ln.w, 128);      /* P_b whole before this warpgroup reads it */
        nbar_arrive(2 + (b & 1), 256); /* ... and before the other one does */
#pragma unroll
        for (int i = 0; i < 2; ++i)
            l[i] = l[i] * alpha[i] + rs[i];
        FI_PHASE(5);
        wg_wait<0>(); /* P_{b-1} V_{b-1} */
        wg_pin<128>(O);
        if (b > 0) /* this thread is done with block b - 1 */
            mbar_arrive(Sh::empty(s0, stage_of(b - 1)));
        FI_PHASE(6);
        rescale_o(O, alpha);
        Ops::wait_v(s0, stage_of(b), parity_of(b));
        Ops::pv(O, s0, stage_of(b), ln.w);
        FI_PHASE(7);
        if (b + 2 < nblk) /* block b + 2's stage is b - 2's, released last round */
            own_scores(b + 2);
        wg_wait<0>();
        wg_pin<128>(O);
        wg_pin<kBlockN / 2>(S);
        mbar_arrive(Sh::empty(s0, stage_of(b)));
        FI_PHASE(10);
    }
    if (nblk > 0 && ((nblk - 1) & 1) != ln.w) { /* the item's last block is the other's */
        other_pv(nblk - 1);
        wg_wait<0>();
        wg_pin<128>(O);
        mbar_arrive(Sh::empty(s0, stage_of(nblk - 1)));
        FI_PHASE(6);
    }
    FI_PHASE_END();
    FI_STAMP2(2);
    if (q_held && ln.lane == 0)
        mbar_arrive(Sh::qempty(s0));
    for (int b = 0; b < nblk; ++b)
        cur.next();
    cur.qph ^= 1u;
    Ops::finish(O, l);
    Ops::store(p, ctx, it, rq, nh, M, ln, O, m, l);
    FI_STAMP2(3);
    if (it.out_slot < 0)
        return false;
    return Ops::Merge::arrive(p.c, ctx, it, reinterpret_cast<int *>(smem + Sh::kFlag),
                              reinterpret_cast<float *>(smem + Sh::kW), reinterpret_cast<float *>(smem + Sh::kRow));
}

/* The 16-bit body's pieces for wg_run_item: T the matmul element, TO the output's. */
template <typename T, typename TO> struct Ops16 {
    using Sh = Sh16;
    /* all merges after the items; 12 loads in flight in a one-unit slice on a 16-bit cache
     * (16 spilled 4 bytes in merge_slice; the fp8 cache's family, whose kernel spills, 4) */
    using Merge = SplitMerge<kDv, kRows, TO, kThreads, false, 1 << 30, std::is_same<T, TO>::value ? 12 : 4>;
    static constexpr int kPLog2 = 0;
    static constexpr int kLazyLog2 = kLazy16Log2;
    static constexpr bool kPOverKpe = true;
    /* Block st's K and V arrive together: one barrier for both matmuls. */
    static __device__ __forceinline__ uint32_t k_ready(uint32_t s0, int st) { return Sh::full(s0, st); }
    static __device__ __forceinline__ void wait_v(uint32_t, int, uint32_t) {}
    static __device__ __forceinline__ void scores(float *S, uint32_t s0, int st) { issue_scores<T>(S, s0, st); }
    static __device__ __forceinline__ void pv(float *O, uint32_t s0, int st, int w) { issue_pv<T>(O, s0, st, w); }
    /* P_b [64][kBlockN] into the block's kpe panel: (r0, c .. c + 1) and (r0 + 8, ..). */
    static __device__ __forceinline__ void put_p(unsigned char *smem, int st, int r0, int c, float p0,
                                                 float p1, float p2, float p3) {
        unsigned char *pp = smem + kOffRing + st * kBlockBytes + 8 * kKPanel;
        *reinterpret_cast<uint32_t *>(pp + p_off(r0, c)) = Dt<T>::pack(p0, p1);
        *reinterpret_cast<uint32_t *>(pp + p_off(r0 + 8, c)) = Dt<T>::pack(p2, p3);
    }
    static __device__ __forceinline__ void finish(float *, float *) {}
    static __device__ __forceinline__ void store(const fi_mla_params &p, const RunCtx &ctx, const fi_work_item &it,
                                                 const fi_request_info &rq, int nh, int M, const Lane &ln,
                                                 const float *O, const float *m, const float *l) {
        store_rows<TO>(p, ctx, it, rq, nh, M, ln, O, m, l);
    }
};

/* The family: T the matmul element (bf16 / fp16), KV the cache's (T, or fp8 e4m3 with
 * T = fp16: converted by the producer; q then any of fp16 / e4m3 / bf16, out bf16). */
template <typename T, typename KV = T> struct MlaWgFamily {
    static constexpr bool kFp8 = std::is_same<KV, __nv_fp8_e4m3>::value;
    static_assert(!kFp8 || std::is_same<T, __half>::value, "an fp8 cache runs fp16 matmuls");
    using TO = typename std::conditional<kFp8, __nv_bfloat16, T>::type; /* output element */
    using Params = fi_mla_params;
    using Merge = typename Ops16<T, TO>::Merge;
    static constexpr int kThreads = fimlawg::kThreads;
    static constexpr int kProducerWarps = fimlawg::kProducerWarps;
    static constexpr int kConsumerRegs = fimlawg::kConsumerRegs<kFp8>;
    /* Arrivals that release a ring block: every consumer thread.  The producer refills the
     * block where the consumers wrote P; the named barrier after P orders every writer
     * before the one lane a warp that would suffice, but compute-sanitizer's racecheck
     * follows a release only from the threads that wrote (16 hazards on the split case
     * with one arrival a warp; H200: no change in time). */
    static constexpr uint32_t kEmptyArrivals = kThreads;
    static constexpr size_t kSmemBytes = fimlawg::kSmemBytes;
    using State = Cursor;

    static __device__ __forceinline__ State setup(unsigned char *smem) {
        const uint32_t s0 = smem_u32(smem);
        if (threadIdx.x == 0)
            Sh16::init(s0, kEmptyArrivals);
        return Cursor{0, 0u, 0u};
    }

    /* The producer warpgroup: Q and every KV block of every item of the CTA, in item order. */
    static __device__ void produce(const fi_mla_params &p, const fi_cta_start &cs, unsigned char *smem) {
        setmaxnreg_dec<kProducerRegs<kFp8>>();
        const uint32_t s0 = smem_u32(smem);
        const int pt = (int)threadIdx.x - kThreads;
        Cursor cur{0, 0u, 0u};
        for_each_item(p.c, cs, [&](const fi_work_item &it, const fi_request_info &rq) {
            mbar_wait(Sh16::qempty(s0), cur.qph ^ 1u);
            if constexpr (kFp8) {
                produce_q_f16(p, it, rq, s0, pt);
                fence_proxy_async(); /* ordinary stores, read by wgmma */
                mbar_arrive(Sh16::qfull(s0));
            } else {
                fimlaq::produce_q16<T, kRows, kProducerThreads>(p, it, rq, s0 + kOffQ, pt);
                cp_async_mbar_arrive(Sh16::qfull(s0));
            }
            cur.qph ^= 1u;
            const int nblk = blocks_of(it);
            if constexpr (kFp8) {
                produce_blocks_e4m3(p, it, rq, s0, pt, cur, nblk);
            } else {
                int32_t pg = nblk > 0 ? block_page(p, it, rq, 0, pt) : 0;
                const uint64_t pol = l2_evict_first(kv_l2_fraction(p.c, it, rq));
                for (int b = 0; b < nblk; ++b) {
                    /* the next block's pages travel while this one waits for its slot */
                    const int32_t pn = b + 1 < nblk ? block_page(p, it, rq, b + 1, pt) : 0;
                    mbar_wait(Sh16::empty(s0, cur.st), cur.ph ^ 1u);
                    const uint32_t full = Sh16::full(s0, cur.st);
                    if (b < map_blocks(p, it)) { /* warp-uniform; every producer thread arrives either way */
                        if ((pt & 31) == 0)
                            map_block(p, it, s0, cur.st, b, pt >> 5, pg, full, pol);
                        mbar_arrive(full);
                    } else {
                        produce_block<T>(p, it, rq, s0, cur.st, b, pt, pg, pol);
                        cp_async_mbar_arrive(full);
                    }
                    pg = pn;
                    cur.next();
                }
            }
        });
    }

    /* One item on both consumer warpgroups (schedule: the header comment). */
    static __device__ bool run_item(const fi_mla_params &p, const RunCtx &ctx, const fi_work_item &it,
                                    const fi_request_info &rq, unsigned char *smem, bool first,
                                    State &cur) {
        return wg_run_item<Ops16<T, TO>>(p, ctx, it, rq, smem, first, cur);
    }
};

}  // namespace fimlawg
