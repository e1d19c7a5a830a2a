/*
 * executor/gqa/gqa_tile.cuh - the GQA decode family's tile body (sm_90a): one work item of
 * up to 64 rows (query tokens x the query heads of one KV head) over a KV range, with
 * producer warps that stream K, V and Q for every item of the CTA into shared memory and
 * consumer warps that compute.  This file: the ring, the producer, and the 16-row
 * consumers (items of more than 8 rows); gqa_swap.cuh: the transposed consumers (<= 8
 * rows); gqa_family.cuh: the family the persistent loop runs.  The persistent loop, the
 * split merge and the launch are the shared ones (executor/cuda/).
 *
 * What it computes (fiattn_run.h): s_j = bmm1_scale * q . k_j, out = bmm2_scale *
 * softmax(s) . v with the mask rule of plan/mask.h (causal spec-decoding rows, window_left),
 * sinks in the denominator, natural-log LSE.
 *
 * How (one CTA = 4 consumer warps + 4 producer warps, one CTA per SM):
 *  - KV in slots of 16, 32 or 64 tokens (Geo::kSlotTokens): a ring of NS slots (K rows
 *    then V rows, 16 pad bytes a row so ldmatrix rows fall on distinct banks), each with a
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
 *  - Online softmax in the exp2 domain, fp32; a row whose keys are all masked so far keeps
 *    m = -inf, l = 0, O = 0; NaN in q or k reaches exactly that row's output.
 * Sources: FlashAttention-2 (Dao 2023) online softmax and warp tiling; flash-decoding
 * split-KV (Dao et al. 2023); the producer / consumer mbarrier pipeline of FlashAttention-3
 * (Shah et al. 2024), here with bulk copies and mma.sync.
 */
#pragma once

#include "executor/cuda/common/dtype.cuh"
#include "executor/cuda/common/profile.cuh"
#include "executor/cuda/common/ptx.cuh"
#include "executor/cuda/merge/split_merge.cuh"
#include "executor/gqa/gqa_params.h"
#include "plan/mask.h"

#include <type_traits>

namespace figqa {
using namespace fi;

/* 4 consumer + 4 producer warps: 8 warps leave each SM sub-partition 2, so a thread may
 * hold 255 registers (9 warps would cap it at 168 and spill O). */
constexpr int kWarps = 4;                  /* consumer warps */
constexpr int kThreads = kWarps * 32;
constexpr int kRows = FI_GQA_MAX_TILE_ROWS;
constexpr int kSlice = 16;                 /* KV tokens a warp computes at once */
constexpr int kMaxStages = 48;
constexpr size_t kSmemBytes = 232448;      /* the sm_90 opt-in maximum per block */

/* Shared memory: [barriers][sM][sL][flags][merge sW][merge sRow] | Q x 2 | combine | ring.
 * RB: bytes of a K or V row (2 D: bf16 / fp16, D: fp8 e4m3, D / 2: NVFP4); SF: bytes of a
 * row's block scales (NVFP4: D / 16, else 0). */
template <int D, int RB, int SF = 0> struct Geo {
    static constexpr int kPitch = D + 8;                       /* Q: 16-bit elements a row */
    static constexpr size_t kRowBytes = (size_t)kPitch * 2;
    static constexpr size_t kQBytes = (size_t)kRows * kRowBytes;
    static constexpr int kKvPitch = RB + 16;                   /* KV: bytes a row (16 pad:
                                                                  ldmatrix rows on distinct banks) */
    /* KV tokens a ring slot: 64 for rows of <= 128 bytes (fp8 / NVFP4 head_dim <= 128:
     * their consumers compute a slot as 4 independent 16-token chains and hide more latency),
     * 32 for 256-byte rows, 16 for 512-byte rows (bf16 / fp16 head_dim 256, where 32-token
     * slots leave 2 stages).  Slots are aligned to their size, so one spans at most 64 pages
     * from a page batch's start (produce_kv). */
    static constexpr int kSlotTokens = RB > 256 ? kSlice : RB > 128 ? 2 * kSlice : 4 * kSlice;
    static constexpr int kSubs = kSlotTokens / kSlice;
    /* a slot: K rows, V rows, then (NVFP4) K scale rows and V scale rows, SF bytes each */
    static constexpr size_t kSfOff = (size_t)2 * kSlotTokens * kKvPitch;
    static constexpr size_t kSlotBytes = kSfOff + (size_t)2 * kSlotTokens * SF;
    static constexpr size_t kCombBytes = (size_t)2 * 16 * D * 4;   /* 2 warp states, fp32 */
    static constexpr size_t kOffM = (size_t)(2 * kMaxStages + 4) * 8;
    static constexpr size_t kOffL = kOffM + kWarps * 16 * 4;
    static constexpr size_t kOffFlag = kOffL + kWarps * 16 * 4;
    static constexpr size_t kOffW = kOffFlag + 16;
    static constexpr size_t kOffRow = kOffW + (size_t)kSoloMergeRows * 4;
    static constexpr size_t kFixed = (kOffRow + 2 * kRows * 4 + 127) / 128 * 128;
    static constexpr size_t kOffQ = kFixed;
    static constexpr size_t kOffComb = kOffQ + 2 * kQBytes;
    static constexpr size_t kOffRing = kOffComb + kCombBytes;
    static constexpr int kStages = (int)((kSmemBytes - kOffRing) / kSlotBytes) < kMaxStages
                                       ? (int)((kSmemBytes - kOffRing) / kSlotBytes)
                                       : kMaxStages;
    static_assert(kStages >= 4, "ring too shallow");
    /* barrier addresses */
    static __device__ __forceinline__ uint32_t full(unsigned char *s, int i) { return smem_u32(s) + i * 8; }
    static __device__ __forceinline__ uint32_t empty(unsigned char *s, int i) {
        return smem_u32(s) + (kMaxStages + i) * 8;
    }
    static __device__ __forceinline__ uint32_t qfull(unsigned char *s, int b) {
        return smem_u32(s) + (2 * kMaxStages + b) * 8;
    }
    static __device__ __forceinline__ uint32_t qempty(unsigned char *s, int b) {
        return smem_u32(s) + (2 * kMaxStages + 2 + b) * 8;
    }
    template <typename T> static __device__ __forceinline__ T *q(unsigned char *s, int b) {
        return reinterpret_cast<T *>(s + kOffQ + b * kQBytes);
    }
    static __device__ __forceinline__ unsigned char *slot(unsigned char *s, int i) {
        return s + kOffRing + (size_t)i * kSlotBytes;
    }
};

/* NVFP4 KV: e2m1 values two a byte (low nibble first) with an fp8 e4m3 scale per 16. */
struct nvfp4 {};

/* The KV element: its row and scale bytes, its kind, and the type the tensor cores take
 * it in (fp8 e4m3 and e2m1 x e4m3 convert exactly to fp16, so those caches run fp16
 * matmuls, q included). */
template <typename T, typename KV> struct Kv {
    using C = T;
    using Elem = KV; /* what the tensor's strides count */
    static constexpr int kKind = 0;
    static constexpr int row_bytes(int D) { return 2 * D; }
    static constexpr int sf_bytes(int) { return 0; }
};
template <typename T> struct Kv<T, __nv_fp8_e4m3> {
    using C = __half;
    using Elem = __nv_fp8_e4m3;
    static constexpr int kKind = 1;
    static constexpr int row_bytes(int D) { return D; }
    static constexpr int sf_bytes(int) { return 0; }
};
template <typename T> struct Kv<T, nvfp4> {
    using C = __half;
    using Elem = unsigned char; /* E2M1 tensors are described in bytes */
    static constexpr int kKind = 2;
    static constexpr int row_bytes(int D) { return D / 2; }
    static constexpr int sf_bytes(int D) { return D / 16; }
};

/* Ring and Q-buffer positions a side has reached (each side keeps its own copy). */
struct Cursor {
    int slot;
    uint32_t phase;
    int qb;
    uint32_t qphase;
    __device__ __forceinline__ void next_slot(int ns) {
        if (++slot == ns) {
            slot = 0;
            phase ^= 1u;
        }
    }
    __device__ __forceinline__ void next_q() {
        if (++qb == 2) {
            qb = 0;
            qphase ^= 1u;
        }
    }
};

/* Rows of item `it`: q-major, r = (q - q_begin) * nh + (h - head_begin). */
__device__ __forceinline__ int item_rows(const fi_work_item &it) {
    return (it.q_end - it.q_begin) * (it.head_end - it.head_begin);
}

/* ---- producer ------------------------------------------------------------------------ */

/* Producer thread pt (0 .. kProducerThreads - 1) of a slice: token pt / 8 of its 16, and
 * 16-byte chunks pt % 8, + 8, ... of that token's K row and of its V row (8 threads cover
 * 128 contiguous bytes of a row: whole cache lines a warp instruction). */
constexpr int kProducerWarps = 4;
constexpr int kProducerThreads = kProducerWarps * 32;

/* Page indices of a request, 32 at a time: lane l holds page pb0 + l of the request's K
 * row (kc / kn) and, for a [B, 2, P] table, of its V row (vc / vn; else the same as K);
 * the next batch is loaded while the current one is used, so a slice never waits on a
 * page-table read. */
struct PageBatch {
    int pb0, npages, split;
    int64_t krow, vrow;
    int32_t kc, kn, vc, vn;
};

__device__ __forceinline__ int32_t page_load(const fi_gqa_params &p, const PageBatch &b,
                                             int64_t row, int first) {
    const int idx = first + (int)(threadIdx.x & 31);
    return idx < b.npages ? p.c.page_table[row + idx] : -1;
}

__device__ __forceinline__ void page_fill(const fi_gqa_params &p, PageBatch &b) {
    b.kc = page_load(p, b, b.krow, b.pb0);
    b.kn = page_load(p, b, b.krow, b.pb0 + 32);
    b.vc = b.split ? page_load(p, b, b.vrow, b.pb0) : b.kc;
    b.vn = b.split ? page_load(p, b, b.vrow, b.pb0 + 32) : b.kn;
}

__device__ __forceinline__ void page_advance(const fi_gqa_params &p, PageBatch &b) {
    b.pb0 += 32;
    b.kc = b.kn;
    b.vc = b.vn;
    b.kn = page_load(p, b, b.krow, b.pb0 + 32);
    b.vn = b.split ? page_load(p, b, b.vrow, b.pb0 + 32) : b.kn;
}

/* Load item it's Q rows into Q buffer cur.qb: 16-byte chunks over the producer threads,
 * then each thread's arrival (on completion of its copies) on qfull. */
template <typename T, class G, int D>
__device__ __forceinline__ void produce_q(const fi_gqa_params &p, const fi_work_item &it,
                                          const fi_request_info &rq, unsigned char *smem, int pt,
                                          Cursor &cur) {
    constexpr int kChunks = D / 8;
    const int nh = it.head_end - it.head_begin, M = item_rows(it);
    mbar_wait(G::qempty(smem, cur.qb), cur.qphase ^ 1u);
    T *sq = G::template q<T>(smem, cur.qb);
    for (int idx = pt; idx < M * kChunks; idx += kProducerThreads) {
        const int r = idx / kChunks, c = idx - r * kChunks;
        const int64_t tok = (int64_t)rq.q_offset + it.q_begin + r / nh;
        const int h = it.head_begin + r % nh;
        const T *src = static_cast<const T *>(p.g.q) + tok * p.g.q_stride_tok + h * p.g.q_stride_head + c * 8;
        cp_async16(smem_u32(sq + r * G::kPitch + c * 8), src, 16);
    }
    cp_async_mbar_arrive(G::qfull(smem, cur.qb));
    cur.next_q();
}

/* Fill item it's KV slices, in order, into the ring.  Slices are aligned to 16 tokens of
 * the request (a page of >= 16 tokens then holds a whole slice); tokens outside
 * [kv_begin, kv_end) are zero-filled (the consumers mask them: P = 0 must not meet NaN
 * bit patterns left in the cache).  Every producer thread arrives on the slot's full
 * barrier when its copies land. */
template <class K, class G, int D>
__device__ __forceinline__ void produce_kv(const fi_gqa_params &p, const fi_work_item &it,
                                           const fi_request_info &rq, int split, int ppr,
                                           unsigned char *smem, int pt, Cursor &cur) {
    using KV = typename K::Elem;
    constexpr int kChunks = K::row_bytes(D) / 16; /* 16-byte chunks a row */
    constexpr int kSf = K::sf_bytes(D);           /* NVFP4 scale bytes a row: 4, 8, 16 */
    const int shift = p.c.page_shift;
    const int j = pt >> 3, q = pt & 7;        /* token of the slice, chunk phase */
    const int kvh = it.head_begin / p.g.group;
    const KV *kbase = static_cast<const KV *>(p.g.k.data) + (int64_t)kvh * p.g.k.stride_head;
    const KV *vbase = static_cast<const KV *>(p.g.v.data) + (int64_t)kvh * p.g.v.stride_head;
    /* NVFP4 scale rows of this KV head (unused otherwise) */
    const unsigned char *ksb = static_cast<const unsigned char *>(p.g.k_sf.data) + (int64_t)kvh * p.g.k_sf.stride_head;
    const unsigned char *vsb = static_cast<const unsigned char *>(p.g.v_sf.data) + (int64_t)kvh * p.g.v_sf.stride_head;
    const int s0 = it.kv_begin & ~(G::kSlotTokens - 1);
    const int nsl = it.kv_end > it.kv_begin ? (it.kv_end - s0 + G::kSlotTokens - 1) / G::kSlotTokens : 0;
    if (nsl == 0)
        return;
    PageBatch b;
    b.pb0 = s0 >> shift;
    b.npages = (rq.kv_len + p.c.page_size - 1) >> shift;
    b.split = split;
    b.krow = rq.page_row_offset;
    b.vrow = (int64_t)rq.page_row_offset + (split ? ppr : 0);
    page_fill(p, b);
    for (int sl = 0; sl < nsl; ++sl) {
        const int t0 = s0 + sl * G::kSlotTokens;
        while ((t0 >> shift) >= b.pb0 + 32) /* uniform */
            page_advance(p, b);
        const KV *ks[G::kSubs], *vs[G::kSubs];
        const unsigned char *kss[G::kSubs], *vss[G::kSubs]; /* NVFP4 scale rows */
        bool in[G::kSubs];
#pragma unroll
        for (int u = 0; u < G::kSubs; ++u) { /* this thread's tokens j and j + 16 of the slot */
            const int tok = t0 + u * kSlice + j;
            /* 0 .. 63: a batch starts at an aligned slot's page and moves 32 pages at a time,
             * so a 64-token slot on 1-token pages starts at pb0 exactly and one on larger
             * pages ends within 64 pages of it */
            const int pi = (tok >> shift) - b.pb0;
            const int32_t kc = __shfl_sync(0xffffffffu, b.kc, pi & 31);
            const int32_t kn = __shfl_sync(0xffffffffu, b.kn, pi & 31);
            const int32_t vc = __shfl_sync(0xffffffffu, b.vc, pi & 31);
            const int32_t vn = __shfl_sync(0xffffffffu, b.vn, pi & 31);
            in[u] = tok >= it.kv_begin && tok < it.kv_end;
            const int64_t slot_tok = tok & (p.c.page_size - 1);
            const int64_t kpg = pi < 32 ? kc : kn, vpg = pi < 32 ? vc : vn;
            ks[u] = in[u] ? kbase + kpg * p.g.k.stride_page + slot_tok * p.g.k.stride_tok : kbase;
            vs[u] = in[u] ? vbase + vpg * p.g.v.stride_page + slot_tok * p.g.v.stride_tok : vbase;
            if constexpr (kSf > 0) {
                kss[u] = in[u] ? ksb + kpg * p.g.k_sf.stride_page + slot_tok * p.g.k_sf.stride_tok : ksb;
                vss[u] = in[u] ? vsb + vpg * p.g.v_sf.stride_page + slot_tok * p.g.v_sf.stride_tok : vsb;
            }
        }
        mbar_wait(G::empty(smem, cur.slot), cur.phase ^ 1u);
#pragma unroll
        for (int u = 0; u < G::kSubs; ++u) {
            const uint32_t kd = smem_u32(G::slot(smem, cur.slot) + (u * kSlice + j) * G::kKvPitch);
            const uint32_t vd = kd + G::kSlotTokens * G::kKvPitch;
#pragma unroll
            for (int c = q; c < kChunks; c += 8) {
                const unsigned char *k = reinterpret_cast<const unsigned char *>(ks[u]) + c * 16;
                const unsigned char *v = reinterpret_cast<const unsigned char *>(vs[u]) + c * 16;
                if constexpr (kChunks >= 8) { /* rows of >= 128 bytes: whole L2 lines wanted */
                    cp_async16_l2line(kd + c * 16, k, in[u] ? 16 : 0);
                    cp_async16_l2line(vd + c * 16, v, in[u] ? 16 : 0);
                } else {
                    cp_async16(kd + c * 16, k, in[u] ? 16 : 0);
                    cp_async16(vd + c * 16, v, in[u] ? 16 : 0);
                }
            }
            if constexpr (kSf > 0) {
                if (q == 7) { /* the scale rows: a thread left idle by the chunks (D <= 256) */
                    const uint32_t sd = smem_u32(G::slot(smem, cur.slot) + G::kSfOff) + (u * kSlice + j) * kSf;
                    cp_async_small<kSf>(sd, kss[u], in[u]);
                    cp_async_small<kSf>(sd + G::kSlotTokens * kSf, vss[u], in[u]);
                }
            }
        }
        cp_async_mbar_arrive(G::full(smem, cur.slot));
        cur.next_slot(G::kStages);
    }
}

/* ---- consumers ----------------------------------------------------------------------- */

/* A consumer warp's place in the item: team rg (16 rows) of `teams`, warp tw of W. */
struct Lane {
    int warp, lane, g, q4, teams, W, rg, tw, nrg;
};
__device__ __forceinline__ Lane lane_of(int tid, int M) {
    Lane l;
    l.warp = tid >> 5;
    l.lane = tid & 31;
    l.g = l.lane >> 2;
    l.q4 = l.lane & 3;
    l.nrg = (M + 15) >> 4;
    l.teams = l.nrg == 1 ? 1 : l.nrg == 2 ? 2 : 4;
    l.W = kWarps / l.teams;
    l.rg = l.warp / l.W;
    l.tw = l.warp % l.W;
    return l;
}

/* A warp's softmax state for its 16 rows (rows g and g + 8 in this lane) and its O. */
template <int D> struct Acc {
    float o[D / 8][4];
    float m[2], l[2]; /* l: this lane's columns only until finish_rows */
};

/* S = Q K^T for 16 rows x 8 NT tokens (NT 2 or 4: one or two 16-token slices; s[n] is
 * tokens 8n..8n+7 in the mma accumulator layout).  16-bit KV: K fragments by ldmatrix; qa(kk, frag) gives Q's A
 * fragment of k16 step kk (registers, or ldmatrix from the Q rows: QFrags).  sK: the slot's
 * K rows (kKvPitch bytes apart). */
template <typename C, int D, int NT, typename QA>
__device__ __forceinline__ void qk_scores(const unsigned char *sK, int lane, const QA &qa,
                                          float (&s)[NT][4]) {
    using G = Geo<D, 2 * D>;
    const uint32_t sKa = smem_u32(sK + ((lane & 7) + ((lane >> 4) << 3)) * G::kKvPitch + ((lane >> 3) & 1) * 16);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t q[4];
        qa(kk, q);
#pragma unroll
        for (int t = 0; t < NT / 2; ++t) { /* 16 tokens a step: NT / 2 independent chains */
            uint32_t kb[4];
            ldsm_x4(sKa + t * 16 * G::kKvPitch + kk * 32, kb);
            Dt<C>::mma(s[2 * t], q, kb[0], kb[1]);
            Dt<C>::mma(s[2 * t + 1], q, kb[2], kb[3]);
        }
    }
}

/* Two fp8 e4m3 values (the low two bytes of x, or bytes b0 / b1) as an fp16 pair (exact). */
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t x) {
    uint32_t r;
    asm("{\n.reg .b16 lo;\nmov.b32 {lo, _}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(r) : "r"(x));
    return r;
}
__device__ __forceinline__ uint32_t e4m3x2_hi_to_f16x2(uint32_t x) { /* bytes 2, 3 */
    uint32_t r;
    asm("{\n.reg .b16 hi;\nmov.b32 {_, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(r) : "r"(x));
    return r;
}
__device__ __forceinline__ uint32_t bytes2(uint32_t x, uint32_t sel) { /* sel: prmt selector */
    uint32_t r;
    asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(r) : "r"(x), "r"(sel));
    return r;
}

/* fp8 KV: ldmatrix on the fp8 rows hands this lane 4 consecutive bytes of token g (dims
 * 4 q4 .. 4 q4 + 3 of a 16-dim group) as b0 / b1 of one k16 step; the dot product does
 * not care about the order of its terms, so Q's fragment takes the same dims (a0 / a1 =
 * dims 4 q4, +1 of rows g / g + 8, a2 / a3 = dims 4 q4 + 2, +3: QFrags).  qa as qk_scores. */
template <int D, int NT, typename QA>
__device__ __forceinline__ void qk_scores_fp8(const unsigned char *sK, int lane, const QA &qa,
                                              float (&s)[NT][4]) {
    using G = Geo<D, D>;
    /* matrices: tokens 0-7 / 8-15 (lane bit 4) x bytes +0 / +16 (lane bit 3) of 32 dims */
    const uint32_t sKa = smem_u32(sK + ((lane & 7) + ((lane >> 4) << 3)) * G::kKvPitch + ((lane >> 3) & 1) * 16);
#pragma unroll
    for (int c = 0; c < D / 32; ++c) {
        uint32_t kb[NT / 2][4];
#pragma unroll
        for (int t = 0; t < NT / 2; ++t) /* kb[t][0]: tok 0-7 dims 32c..+15, [1]: +16.., [2] / [3]: tok 8-15 */
            ldsm_x4(sKa + t * 16 * G::kKvPitch + c * 32, kb[t]);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            uint32_t q[4];
            qa(2 * c + h, q);
#pragma unroll
            for (int t = 0; t < NT / 2; ++t) {
                const uint32_t k0 = kb[t][h], k1 = kb[t][2 + h];
                Dt<__half>::mma(s[2 * t], q, e4m3x2_to_f16x2(k0), e4m3x2_hi_to_f16x2(k0));
                Dt<__half>::mma(s[2 * t + 1], q, e4m3x2_to_f16x2(k1), e4m3x2_hi_to_f16x2(k1));
            }
        }
    }
}

/* NVFP4: e2m1 nibbles as fp8 e4m3 bytes (exact: sign to bit 7, the 3 magnitude bits to
 * bits 4..2, so every value comes out x 2^-6; the block scale carries the 2^6 back).  x:
 * one nibble in the low half of each byte. */
__device__ __forceinline__ uint32_t e2m1_bytes_to_e4m3(uint32_t x) {
    return ((x & 0x08080808u) << 4) | ((x & 0x07070707u) << 2);
}
/* Block scales (e4m3 bytes a, b) as an fp16 pair x 64 (<= 448 x 64: in range). */
__device__ __forceinline__ __half2 sf_pair(uint32_t a, uint32_t b) {
    const uint32_t h = e4m3x2_to_f16x2(a | (b << 8));
    return __hmul2(*reinterpret_cast<const __half2 *>(&h), __floats2half2_rn(64.f, 64.f));
}
__device__ __forceinline__ uint32_t hmul2u(uint32_t x, __half2 s) {
    const __half2 r = __hmul2(*reinterpret_cast<const __half2 *>(&x), s);
    return *reinterpret_cast<const uint32_t *>(&r);
}

/* S = Q K^T for NVFP4 K: a lane reads 4 bytes (dims 8 q4 .. 8 q4 + 7 of a 32-dim block) of
 * token g of each 8-token tile and its block's scale; the even nibbles (dims 0, 2, 4, 6)
 * and the odd ones convert as two e4m3 words, so the two k16 steps of the block take dims
 * (0, 2 | 1, 3) and (4, 6 | 5, 7), which QFrags<2> gives Q in the same order.  sSf: the
 * slot's K scale rows (D / 16 bytes each). */
template <int D, int NT, typename QA>
__device__ __forceinline__ void qk_scores_fp4(const unsigned char *sK, const unsigned char *sSf,
                                              int lane, const QA &qa, float (&s)[NT][4]) {
    using G = Geo<D, D / 2, D / 16>;
    const int g = lane >> 2, q4 = lane & 3;
#pragma unroll
    for (int c = 0; c < D / 32; ++c) {
        uint32_t b[NT][4];
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int tok = 8 * t + g;
            const uint32_t w = *reinterpret_cast<const uint32_t *>(sK + tok * G::kKvPitch + 16 * c + 4 * q4);
            const uint32_t sc = sSf[tok * (D / 16) + 2 * c + (q4 >> 1)];
            const __half2 s2 = sf_pair(sc, sc);
            const uint32_t ev = e2m1_bytes_to_e4m3(w), od = e2m1_bytes_to_e4m3(w >> 4);
            b[t][0] = hmul2u(e4m3x2_to_f16x2(ev), s2);    /* dims 0, 2 */
            b[t][1] = hmul2u(e4m3x2_to_f16x2(od), s2);    /* dims 1, 3 */
            b[t][2] = hmul2u(e4m3x2_hi_to_f16x2(ev), s2); /* dims 4, 6 */
            b[t][3] = hmul2u(e4m3x2_hi_to_f16x2(od), s2); /* dims 5, 7 */
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            uint32_t q[4];
            qa(2 * c + h, q);
#pragma unroll
            for (int t = 0; t < NT; ++t)
                Dt<__half>::mma(s[t], q, b[t][2 * h], b[t][2 * h + 1]);
        }
    }
}

/* O += P V, NVFP4 V: ldmatrix.trans on 16-byte rows treats 4-nibble groups as 16-bit
 * elements, so a lane gets tokens 2 q4, 2 q4 + 1 x dims 4 g .. 4 g + 3 of a 32-dim block;
 * nibble j of both tokens pairs up as the B operand of tile 4 c + j (col_of).  Each token
 * has its own block scale.  sSf: the slot's V scale rows. */
template <int D, int NT>
__device__ __forceinline__ void pv_accumulate_fp4(const unsigned char *sV, const unsigned char *sSf,
                                                  int lane, const uint32_t (&pa)[NT / 2][4], Acc<D> &a) {
    using G = Geo<D, D / 2, D / 16>;
    const int g = lane >> 2, q4 = lane & 3;
    /* matrices: tokens 0-7 / 8-15 (lane bit 3) x bytes +0 / +16 (lane bit 4): 2 blocks */
    const uint32_t sVa = smem_u32(sV + (((lane >> 3) & 1) * 8 + (lane & 7)) * G::kKvPitch + (lane >> 4) * 16);
#pragma unroll
    for (int t = 0; t < NT / 2; ++t)
#pragma unroll
        for (int cc = 0; cc < D / 64; ++cc) {
            uint32_t vb[4];
            ldsm_x4_t(sVa + t * 16 * G::kKvPitch + cc * 32, vb);
#pragma unroll
            for (int hb = 0; hb < 2; ++hb) {
                const int c = 2 * cc + hb, grp = 2 * c + (g >> 2);
                uint32_t bj[2][4]; /* [token half][dim j] */
#pragma unroll
                for (int k = 0; k < 2; ++k) { /* tokens 2 q4 (+8 k), 2 q4 + 1 (+8 k) */
                    const int t0 = 16 * t + 8 * k + 2 * q4;
                    const __half2 s2 = sf_pair(sSf[t0 * (D / 16) + grp], sSf[(t0 + 1) * (D / 16) + grp]);
                    const uint32_t w = vb[2 * hb + k];
                    const uint32_t e02 = __byte_perm(e2m1_bytes_to_e4m3(w), 0, 0x3120);
                    const uint32_t e13 = __byte_perm(e2m1_bytes_to_e4m3(w >> 4), 0, 0x3120);
                    bj[k][0] = hmul2u(e4m3x2_to_f16x2(e02), s2);
                    bj[k][1] = hmul2u(e4m3x2_to_f16x2(e13), s2);
                    bj[k][2] = hmul2u(e4m3x2_hi_to_f16x2(e02), s2);
                    bj[k][3] = hmul2u(e4m3x2_hi_to_f16x2(e13), s2);
                }
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    Dt<__half>::mma(a.o[4 * c + j], pa[t], bj[0][j], bj[1][j]);
            }
        }
}

/* Q's A fragments of one warp's 16 rows, for every k16 step: held in registers for the
 * item (D <= 128: 32 registers) or read from the Q rows at each use (D 256).  16-bit KV:
 * the ldmatrix layout; fp8 KV: the dim order of qk_scores_fp8 (two 8-byte reads). */
template <int KIND, int D> struct QFrags {
    static constexpr bool kReg = D <= 128;
    uint32_t f[kReg ? D / 16 : 1][4];
    uint32_t base; /* shared address: row g (fp8, NVFP4) or the ldmatrix row of this lane */
    __device__ __forceinline__ void fetch(int kk, uint32_t *q) const {
        if (KIND == 0) {
            ldsm_x4(base + kk * 32, q);
            return;
        }
        /* fp8: dims 16 kk + 4 q4 .. +3 (base holds the 4 q4); NVFP4: dims
         * 32 (kk / 2) + 8 q4 + 4 (kk % 2) .. +3 (base holds the 8 q4), taken in the order
         * 0, 2 | 1, 3 of qk_scores_fp4 */
        const uint32_t a = base + (KIND == 1 ? 16 * kk : 32 * (kk >> 1) + 4 * (kk & 1)) * 2;
        uint32_t x0, y0, x1, y1;
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(x0), "=r"(y0) : "r"(a));
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(x1), "=r"(y1)
                     : "r"(a + 8 * Geo<D, D>::kPitch * 2));
        if (KIND == 1) {
            q[0] = x0; q[1] = x1; q[2] = y0; q[3] = y1;
        } else {
            q[0] = __byte_perm(x0, y0, 0x5410); /* dims 0, 2 */
            q[1] = __byte_perm(x1, y1, 0x5410);
            q[2] = __byte_perm(x0, y0, 0x7632); /* dims 1, 3 */
            q[3] = __byte_perm(x1, y1, 0x7632);
        }
    }
    /* sQ: the item's Q rows (fp16 for fp8 / NVFP4 KV); rg: the warp's row group. */
    __device__ __forceinline__ void load(const void *sQ, int rg, int lane) {
        const int row = rg * 16 + (KIND ? (lane >> 2) : (lane & 15));
        base = smem_u32(static_cast<const unsigned char *>(sQ) + (size_t)row * Geo<D, 2 * D>::kRowBytes) +
               (KIND == 0 ? (lane >> 4) * 16 : KIND == 1 ? (lane & 3) * 8 : (lane & 3) * 16);
        if (kReg) {
#pragma unroll
            for (int kk = 0; kk < (kReg ? D / 16 : 1); ++kk)
                fetch(kk, f[kk]);
        }
    }
    __device__ __forceinline__ void operator()(int kk, uint32_t *q) const {
        if (kReg) {
            q[0] = f[kk][0]; q[1] = f[kk][1]; q[2] = f[kk][2]; q[3] = f[kk][3];
        } else {
            fetch(kk, q);
        }
    }
};

/* Mask, online softmax update of the warp's state (rescaling O), and P as the A operand
 * of P V (the accumulator layout of S is the A layout of a k16 step). */
template <typename C, int D, int NT>
__device__ __forceinline__ void softmax_step(const RunCtx &ctx, const Lane &ln, int t0,
                                             const int *lo, const int *hi, float (&s)[NT][4],
                                             Acc<D> &a, uint32_t (&pa)[NT / 2][4]) {
    float mx[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = e >> 1;
            const int tok = t0 + n * 8 + ln.q4 * 2 + (e & 1);
            const float v = s[n][e] * ctx.scale_log2;
            s[n][e] = tok >= lo[i] && tok <= hi[i] ? v : -CUDART_INF_F;
            mx[i] = fmaxf(mx[i], s[n][e]);
        }
    float m_use[2], alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        const float m_new = fmaxf(a.m[i], mx[i]);
        m_use[i] = m_new == -CUDART_INF_F ? 0.f : m_new;
        alpha[i] = exp2f(a.m[i] - m_use[i]);
        a.m[i] = m_new;
        a.l[i] *= alpha[i];
    }
    /* O is rescaled only when a row max of the warp moved (x 1 would leave the bits as
     * they are): past the first slices of a row, most slices skip these D / 2 products. */
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            a.o[n][0] *= alpha[0];
            a.o[n][1] *= alpha[0];
            a.o[n][2] *= alpha[1];
            a.o[n][3] *= alpha[1];
        }
    }
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[n][e] = exp2f(s[n][e] - m_use[e >> 1]);
            a.l[e >> 1] += s[n][e];
        }
#pragma unroll
    for (int t = 0; t < NT / 2; ++t) { /* k16 step t of P V: tokens 16t .. 16t + 15 */
        pa[t][0] = Dt<C>::pack(s[2 * t][0], s[2 * t][1]);
        pa[t][1] = Dt<C>::pack(s[2 * t][2], s[2 * t][3]);
        pa[t][2] = Dt<C>::pack(s[2 * t + 1][0], s[2 * t + 1][1]);
        pa[t][3] = Dt<C>::pack(s[2 * t + 1][2], s[2 * t + 1][3]);
    }
}

/* O += P V, 16-bit V by ldmatrix.trans: a.o[n] holds dims 8n + 2 q4, +1 (col_of). */
template <typename C, int D, int NT>
__device__ __forceinline__ void pv_accumulate(const unsigned char *sV, int lane,
                                              const uint32_t (&pa)[NT / 2][4], Acc<D> &a) {
    using G = Geo<D, 2 * D>;
    const uint32_t sVa = smem_u32(sV + (((lane >> 3) & 1) * 8 + (lane & 7)) * G::kKvPitch + (lane >> 4) * 16);
#pragma unroll
    for (int t = 0; t < NT / 2; ++t)
#pragma unroll
        for (int nn = 0; nn < D / 16; ++nn) {
            uint32_t vb[4];
            ldsm_x4_t(sVa + t * 16 * G::kKvPitch + nn * 32, vb);
            Dt<C>::mma(a.o[2 * nn], pa[t], vb[0], vb[1]);
            Dt<C>::mma(a.o[2 * nn + 1], pa[t], vb[2], vb[3]);
        }
}

/* O += P V, fp8 V: ldmatrix.trans on 16-byte rows of fp8 treats byte pairs as 16-bit
 * elements, so a lane gets tokens 2 q4, 2 q4 + 1 x dims 2 g, 2 g + 1 of a 16-dim group;
 * the even dims (bytes 0, 2) and the odd dims (bytes 1, 3) are two n8 tiles.  So a.o[n]
 * of 32-dim block c = n / 4 holds dims 32 c + 16 ((n / 2) % 2) + 4 q4 + {0, 2} + (n % 2)
 * (col_of). */
template <int D, int NT>
__device__ __forceinline__ void pv_accumulate_fp8(const unsigned char *sV, int lane,
                                                  const uint32_t (&pa)[NT / 2][4], Acc<D> &a) {
    using G = Geo<D, D>;
    /* matrices: tokens 0-7 / 8-15 (lane bit 3) x bytes +0 / +16 (lane bit 4) */
    const uint32_t sVa = smem_u32(sV + (((lane >> 3) & 1) * 8 + (lane & 7)) * G::kKvPitch + (lane >> 4) * 16);
#pragma unroll
    for (int t = 0; t < NT / 2; ++t)
#pragma unroll
        for (int c = 0; c < D / 32; ++c) {
            uint32_t vb[4];
            ldsm_x4_t(sVa + t * 16 * G::kKvPitch + c * 32, vb); /* [0] tok 0-7 bytes 0-15, [1] tok 8-15, [2] / [3] bytes 16-31 */
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint32_t lo = bytes2(vb[2 * h], 0x3120u), hi = bytes2(vb[2 * h + 1], 0x3120u);
                Dt<__half>::mma(a.o[4 * c + 2 * h], pa[t], e4m3x2_to_f16x2(lo), e4m3x2_to_f16x2(hi));
                Dt<__half>::mma(a.o[4 * c + 2 * h + 1], pa[t], e4m3x2_hi_to_f16x2(lo),
                                e4m3x2_hi_to_f16x2(hi));
            }
        }
}

/* The output dim of a.o[n][e] (e 0 / 1; rows g and g + 8 alike) for this lane. */
template <int KIND>
__device__ __forceinline__ int col_of(int n, int e, int q4) {
    if (KIND == 1)
        return 32 * (n >> 2) + 16 * ((n >> 1) & 1) + 4 * q4 + 2 * e + (n & 1);
    if (KIND == 2) /* pv_accumulate_fp4: tile 4 c + j holds dims 32 c + 4 g + j */
        return 32 * (n >> 2) + 8 * q4 + 4 * e + (n & 3);
    return 8 * n + 2 * q4 + e;
}

/* Key bounds [lo, hi] (inclusive) of this lane's rows r0 and r0 + dr (16-row path: rg * 16
 * + g and + 8; gqa_swap.cuh: 2 q4 and + 1), clipped to the item's KV range (plan/mask.h);
 * rows past M see nothing. */
__device__ __forceinline__ void row_bounds(const RunCtx &ctx, const fi_work_item &it,
                                           const fi_request_info &rq, int M, int nh, int r0, int dr,
                                           int *lo, int *hi) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = r0 + dr * i;
        lo[i] = 0;
        hi[i] = -1;
        if (r < M) {
            int32_t l, h;
            fi_row_kv_range(ctx.causal, ctx.window_left, rq.q_len, rq.kv_len, it.q_begin + r / nh, &l, &h);
            lo[i] = max(l, it.kv_begin);
            hi[i] = min(h, it.kv_end) - 1;
        }
    }
}

/* Sum the W warps' accumulators of each team in a fixed tree order through the combine
 * buffer (warps W/2.. hand to 0.., and so on): warp tw == 0 ends with the team's sum.  The
 * lanes of every warp hold the same elements, so the sum is lane-wise whatever the layout. */
template <int D, int NTILE>
__device__ __forceinline__ void tree_add(unsigned char *smem, const Lane &ln, float (&o)[NTILE][4]) {
    float4 *comb = reinterpret_cast<float4 *>(smem + Geo<D, 2 * D>::kOffComb);
    for (int half = ln.W >> 1; half >= 1; half >>= 1) { /* uniform: W is the item's */
        if (ln.tw >= half && ln.tw < 2 * half) {
            float4 *dst = comb + (size_t)(ln.rg * (ln.W >> 1) + ln.tw - half) * NTILE * 32 + ln.lane;
#pragma unroll
            for (int n = 0; n < NTILE; ++n)
                dst[n * 32] = make_float4(o[n][0], o[n][1], o[n][2], o[n][3]);
        }
        cta_sync<kThreads>();
        if (ln.tw < half) {
            const float4 *src = comb + (size_t)(ln.rg * (ln.W >> 1) + ln.tw) * NTILE * 32 + ln.lane;
#pragma unroll
            for (int n = 0; n < NTILE; ++n) {
                const float4 v = src[n * 32];
                o[n][0] += v.x;
                o[n][1] += v.y;
                o[n][2] += v.z;
                o[n][3] += v.w;
            }
        }
        cta_sync<kThreads>();
    }
}

/* Combine the W warp states of each team in a fixed order: the row max and sum over the
 * team (sM / sL), every O rescaled to the team max, then a tree of adds through the
 * combine buffer (warps W/2.. hand to 0.., and so on).  Leaves warp tw == 0 of each team
 * with the team's O and the rows' max (mt) and sum (lt). */
template <int D>
__device__ __forceinline__ void combine_team(unsigned char *smem, const Lane &ln, Acc<D> &a,
                                             float *mt, float *lt) {
    using G = Geo<D, 2 * D>; /* the fixed region and the combine buffer do not depend on KB */
    float *sM = reinterpret_cast<float *>(smem + G::kOffM);
    float *sL = reinterpret_cast<float *>(smem + G::kOffL);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        a.l[i] += __shfl_xor_sync(0xffffffffu, a.l[i], 1);
        a.l[i] += __shfl_xor_sync(0xffffffffu, a.l[i], 2);
    }
    if (ln.q4 == 0) {
        sM[ln.warp * 16 + ln.g] = a.m[0];
        sM[ln.warp * 16 + ln.g + 8] = a.m[1];
        sL[ln.warp * 16 + ln.g] = a.l[0];
        sL[ln.warp * 16 + ln.g + 8] = a.l[1];
    }
    cta_sync<kThreads>();
    const int w0 = ln.rg * ln.W;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = ln.g + 8 * i;
        float m = -CUDART_INF_F;
        for (int w = 0; w < ln.W; ++w)
            m = fmaxf(m, sM[(w0 + w) * 16 + r]);
        const float mu = m == -CUDART_INF_F ? 0.f : m;
        float l = 0.f;
        for (int w = 0; w < ln.W; ++w)
            l += sL[(w0 + w) * 16 + r] * exp2f(sM[(w0 + w) * 16 + r] - mu);
        mt[i] = m;
        lt[i] = l;
        const float f = exp2f(a.m[i] - mu);
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            a.o[n][2 * i] *= f;
            a.o[n][2 * i + 1] *= f;
        }
    }
    cta_sync<kThreads>(); /* sM / sL read everywhere: the next item may rewrite them */
    tree_add<D, D / 8>(smem, ln, a.o);
}

/* Outputs at element offset off (T, or fp8 e4m3 when c.o_fp8, scaled by c.o_scale): two
 * consecutive, or four. */
template <typename T>
__device__ __forceinline__ void store_out2(const fi_exec_common &c, int64_t off, float x, float y) {
    if (c.o_fp8) {
        const __nv_fp8x2_e4m3 q(make_float2(x * c.o_scale, y * c.o_scale));
        *reinterpret_cast<__nv_fp8x2_e4m3 *>(static_cast<__nv_fp8_e4m3 *>(c.out) + off) = q;
    } else {
        *reinterpret_cast<uint32_t *>(static_cast<T *>(c.out) + off) = Dt<T>::pack(x, y);
    }
}

/* Store warp tw == 0's rows: unsplit, out = bmm2 * O / l * exp(lse_keys - lse) with
 * lse = logaddexp(lse_keys, sink); split, the fp32 partial O / l and lse_keys (no sink, no
 * bmm2) into the item's slot.  l == 0 (no key): zeros and -inf; NaN stays NaN.  Column
 * pairs by col_of: 16-bit KV, a.o[n][e] at 8 n + 2 q4 + e; fp8 KV, tiles n and n + 1 (n
 * even) interleave into dims base .. base + 3. */
template <typename T, int KIND, int D>
__device__ __forceinline__ void store_rows(const fi_gqa_params &p, const RunCtx &ctx,
                                           const fi_work_item &it, const fi_request_info &rq,
                                           int M, int nh, const Lane &ln, const Acc<D> &a,
                                           const float *mt, const float *lt) {
    const fi_exec_common &c = p.c;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = ln.rg * 16 + ln.g + 8 * i;
        if (r >= M)
            continue;
        const float l = lt[i];
        const float lse_keys = l == 0.f ? -CUDART_INF_F : (mt[i] + log2f(l)) * kLn2;
        const bool split = it.out_slot >= 0;
        const int h = it.head_begin + r % nh;
        const int64_t tok = (int64_t)rq.q_offset + it.q_begin + r / nh;
        const float lse = c.sinks && !split ? logaddexp(lse_keys, c.sinks[h]) : lse_keys;
        const float f = l == 0.f ? 0.f : split ? 1.f / l : ctx.scale2 / l * expf(lse_keys - lse);
        float *pdst = c.partial_o + ((int64_t)it.out_slot * c.tile_rows + r) * D;
        const int64_t off = tok * c.out_stride_tok + h * c.out_stride_head;
        if constexpr (KIND == 2) { /* tiles 4 c .. 4 c + 3: dims d0 .. d0 + 3 for each e */
#pragma unroll
            for (int n = 0; n < D / 8; n += 4)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int d0 = col_of<2>(n, e, ln.q4);
                    const float v0 = a.o[n][2 * i + e] * f, v1 = a.o[n + 1][2 * i + e] * f;
                    const float v2 = a.o[n + 2][2 * i + e] * f, v3 = a.o[n + 3][2 * i + e] * f;
                    if (split) {
                        __stcg(reinterpret_cast<float4 *>(pdst + d0), make_float4(v0, v1, v2, v3));
                    } else {
                        store_out2<T>(c, off + d0, v0, v1);
                        store_out2<T>(c, off + d0 + 2, v2, v3);
                    }
                }
        }
#pragma unroll
        for (int n = 0; n < (KIND == 2 ? 0 : D / 8); n += 2) {
            /* four outputs: dims d0, d0 + 1 of tile n (16-bit) or d0 .. d0 + 3 (fp8) */
            constexpr bool F8 = KIND == 1;
            const int d0 = col_of<KIND>(n, 0, ln.q4), d1 = col_of<KIND>(n + 1, 0, ln.q4);
            const float x0 = a.o[n][2 * i] * f, x1 = a.o[n][2 * i + 1] * f;
            const float y0 = a.o[n + 1][2 * i] * f, y1 = a.o[n + 1][2 * i + 1] * f;
            if (split) {
                if (F8) {
                    __stcg(reinterpret_cast<float4 *>(pdst + d0), make_float4(x0, y0, x1, y1));
                } else {
                    __stcg(reinterpret_cast<float2 *>(pdst + d0), make_float2(x0, x1));
                    __stcg(reinterpret_cast<float2 *>(pdst + d1), make_float2(y0, y1));
                }
            } else if (F8) {
                store_out2<T>(c, off + d0, x0, y0);
                store_out2<T>(c, off + d0 + 2, x1, y1);
            } else {
                store_out2<T>(c, off + d0, x0, x1);
                store_out2<T>(c, off + d1, y0, y1);
            }
        }
        if (ln.q4 == 0) {
            if (split)
                __stcg(c.partial_lse + (int64_t)it.out_slot * c.tile_rows + r, lse_keys);
            else if (c.lse)
                c.lse[tok * c.lse_stride_tok + h * c.lse_stride_head] = lse;
        }
    }
}

/* Convert the item's Q rows from bf16 to fp16 in place (fp8 KV runs fp16 matmuls). */
template <typename T, int D>
__device__ __forceinline__ void q_to_f16(T *sQ, int M) {
    using G = Geo<D, D>;
    if constexpr (!std::is_same<T, __half>::value) {
        for (int idx = threadIdx.x; idx < M * (D / 2); idx += kThreads) {
            const int r = idx / (D / 2), c = idx - r * (D / 2);
            uint32_t *w = reinterpret_cast<uint32_t *>(sQ + r * G::kPitch) + c;
            const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(w));
            *w = Dt<__half>::pack(v.x, v.y);
        }
        cta_sync<kThreads>();
    }
}

}  // namespace figqa
