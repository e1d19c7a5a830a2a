/*
 * executor/gqa/gqa_ring.cuh - the GQA decode family's shared-memory ring and its producer
 * warps (sm_90a): the CTA shape, the shared-memory map (Geo), the KV element kinds (Kv),
 * the ring positions (Cursor), and the producer that streams Q and K / V (and NVFP4
 * scale rows) of every item of the CTA into the ring.  The family's design:
 * gqa_family.cuh.
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
    /* KV rows in a slot.  16-bit rows (RB = 2 D: 128, 256 or 512 bytes) lie dense in the
     * 128-byte swizzle: a region (the slot's K, then its V) is kPanels panels of
     * kSlotTokens rows x 128 bytes, and 16-byte chunk c of token j's panel row sits at chunk
     * c ^ (j % 8), so the 8 rows an ldmatrix reads fall on distinct banks.  fp8 and NVFP4
     * rows keep 16 pad bytes a row for the same reason (fp8 in this swizzle ran 23% slower:
     * perf-log 2026-11-29).  kKvPitch: bytes a token takes in a region. */
    static constexpr bool kSwz = SF == 0 && RB == 2 * D;
    static constexpr int kKvPitch = kSwz ? RB : RB + 16;
    /* KV tokens a ring slot: 64 for rows of <= 128 bytes (fp8 / NVFP4 head_dim <= 128:
     * their consumers compute a slot as 4 independent 16-token chains and hide more latency),
     * 32 for 256-byte rows, 16 for 512-byte rows (bf16 / fp16 head_dim 256, where 32-token
     * slots leave 2 stages).  Slots are aligned to their size, so one spans at most 64 pages
     * from a page batch's start (produce_kv). */
    static constexpr int kSlotTokens = RB > 256 ? kSlice : RB > 128 ? 2 * kSlice : 4 * kSlice;
    static constexpr int kSubs = kSlotTokens / kSlice;
    static constexpr int kVOff = kSlotTokens * kKvPitch; /* the V region in a slot */
    /* a slot: K rows, V rows, then (NVFP4) K scale rows and V scale rows, SF bytes each */
    static constexpr size_t kSfOff = (size_t)2 * kSlotTokens * kKvPitch;
    static constexpr size_t kSlotBytes = kSfOff + (size_t)2 * kSlotTokens * SF;
    /* Region offset of token j's row (in the swizzle: its row in the first panel). */
    static __device__ __forceinline__ constexpr int tok(int j) { return j * (kSwz ? 128 : kKvPitch); }
    /* An ldmatrix lane's address: row r (0..15) of a 16-token tile of the region at shared
     * address `region` (a 128-byte multiple, as every region and tile start is: `at` flips
     * address bits 4-6), byte b (0 or 16) of a 32-byte block. */
    static __device__ __forceinline__ uint32_t lane_addr(uint32_t region, int r, int b) {
        return kSwz ? region + r * 128 + (b ^ ((r & 7) << 4)) : region + r * kKvPitch + b;
    }
    /* From lane address la: the same lane's address in 16-token tile t at row byte `byte`
     * (a multiple of 32, a compile-time constant once unrolled: the XOR folds into one
     * operation per distinct byte % 128, the rest into the instruction's offset). */
    static __device__ __forceinline__ uint32_t at(uint32_t la, int t, int byte) {
        return kSwz ? (la ^ (uint32_t)(byte & 0x70)) + (uint32_t)(byte >> 7) * (kSlotTokens * 128) + t * 2048
                    : la + t * 16 * kKvPitch + byte;
    }
    /* Where the cp.async producer puts 16-byte chunk c of token j's row: region offset
     * tok(j) + chunk(j, c). */
    static __device__ __forceinline__ uint32_t chunk(int j, int c) {
        return kSwz ? (uint32_t)(c >> 3) * (kSlotTokens * 128) + (((c & 7) ^ (j & 7)) << 4) : (uint32_t)c * 16;
    }
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
    static_assert(kOffRing % 128 == 0 && kSlotBytes % 128 == 0, "KV regions start on 128-byte lines");
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

/* The page-table lines the next item's first page batch reads (page_fill: 64 page ids of
 * its K row, and of its V row for a [B, 2, P] table) into the L2, by lanes 0-3 of producer
 * warp 0, after the current item's third slot (or its last): the KV stream pushes
 * page-table lines out of the L2 between the items of a request's KV heads, and an item's
 * first slot waits for its page ids. */
template <class G>
__device__ __forceinline__ void prefetch_pages(const fi_gqa_params &p, const fi_work_item &nit,
                                               const fi_request_info &nrq, int split, int ppr, int pt) {
    if (pt >= 4 || nit.kv_end <= nit.kv_begin)
        return;
    const int pb0 = (nit.kv_begin & ~(G::kSlotTokens - 1)) >> p.c.page_shift;
    const int npages = (nrq.kv_len + p.c.page_size - 1) >> p.c.page_shift;
    const int first = pb0 + 32 * (pt & 1);
    if ((pt >= 2 && !split) || first >= npages)
        return;
    const int64_t row = (int64_t)nrq.page_row_offset + (pt >= 2 ? ppr : 0);
    prefetch_l2(p.c.page_table + row + first);
}

/* Fill item it's KV slices, in order, into the ring.  Slices are aligned to 16 tokens of
 * the request (a page of >= 16 tokens then holds a whole slice); tokens outside
 * [kv_begin, kv_end) are zero-filled (the consumers mask them: P = 0 must not meet NaN
 * bit patterns left in the cache).  Every producer thread arrives on the slot's full
 * barrier when its copies land. */
template <class K, class G, int D>
__device__ __forceinline__ void produce_kv(const fi_gqa_params &p, const fi_work_item &it,
                                           const fi_request_info &rq, int split, int ppr,
                                           unsigned char *smem, int pt, Cursor &cur,
                                           const fi_work_item *nit, const fi_request_info *nrq) {
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
    /* NVFP4 on pages of >= a slot's tokens (slots are aligned to their size, pages to
     * theirs): every token of a slot is on one page, found once a slot; otherwise once a
     * token.  The slot lookup took NVFP4 from 407 to 382 us (H200, B128 x 4096 p64) and
     * changed nothing for fp8, and its code cost 16-bit p16 2% through ptxas, so only the
     * NVFP4 producer (whose scale rows double its address work) takes it. */
    const bool slot_page = kSf > 0 && p.c.page_size >= G::kSlotTokens;
    const int64_t ksub = (int64_t)kSlice * p.g.k.stride_tok, vsub = (int64_t)kSlice * p.g.v.stride_tok;
    const uint64_t pol = l2_evict_first(kv_l2_fraction(p.c, it, rq));
    for (int sl = 0; sl < nsl; ++sl) {
        const int t0 = s0 + sl * G::kSlotTokens;
        while ((t0 >> shift) >= b.pb0 + 32) /* uniform */
            page_advance(p, b);
        const KV *ks[G::kSubs], *vs[G::kSubs];
        const unsigned char *kss[G::kSubs], *vss[G::kSubs]; /* NVFP4 scale rows */
        bool in[G::kSubs];
        if (slot_page) { /* the slot lies in one page: one lookup, then a token stride */
            const int pi = (t0 >> shift) - b.pb0; /* uniform, 0 .. 63 */
            const int64_t kpg = __shfl_sync(0xffffffffu, pi < 32 ? b.kc : b.kn, pi & 31);
            const int64_t vpg = __shfl_sync(0xffffffffu, pi < 32 ? b.vc : b.vn, pi & 31);
            const int64_t tk = (t0 & (p.c.page_size - 1)) + j; /* the thread's token u = 0 */
            const KV *k0 = kbase + kpg * p.g.k.stride_page + tk * p.g.k.stride_tok;
            const KV *v0 = vbase + vpg * p.g.v.stride_page + tk * p.g.v.stride_tok;
            const unsigned char *k0s = ksb + kpg * p.g.k_sf.stride_page + tk * p.g.k_sf.stride_tok;
            const unsigned char *v0s = vsb + vpg * p.g.v_sf.stride_page + tk * p.g.v_sf.stride_tok;
#pragma unroll
            for (int u = 0; u < G::kSubs; ++u) {
                const int tok = t0 + u * kSlice + j;
                in[u] = tok >= it.kv_begin && tok < it.kv_end;
                ks[u] = in[u] ? k0 + u * ksub : kbase;
                vs[u] = in[u] ? v0 + u * vsub : vbase;
                kss[u] = in[u] ? k0s + u * kSlice * p.g.k_sf.stride_tok : ksb;
                vss[u] = in[u] ? v0s + u * kSlice * p.g.v_sf.stride_tok : vsb;
            }
        } else {
#pragma unroll
            for (int u = 0; u < G::kSubs; ++u) { /* this thread's tokens j, j + 16 ... of the slot */
                const int tok = t0 + u * kSlice + j;
                /* 0 .. 63: a batch starts at an aligned slot's page and moves 32 pages at a
                 * time, so a 64-token slot on 1-token pages starts at pb0 exactly and one on
                 * larger pages ends within 64 pages of it */
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
        }
        mbar_wait(G::empty(smem, cur.slot), cur.phase ^ 1u);
#pragma unroll
        for (int u = 0; u < G::kSubs; ++u) {
            const int jt = u * kSlice + j; /* the thread's token in the slot */
            uint32_t kd, vd; /* padded rows: as before the swizzle (as in Rows16::compute) */
            if constexpr (G::kSwz) {
                kd = smem_u32(G::slot(smem, cur.slot)) + G::tok(jt);
                vd = kd + G::kVOff;
            } else {
                kd = smem_u32(G::slot(smem, cur.slot) + jt * G::kKvPitch);
                vd = kd + G::kSlotTokens * G::kKvPitch;
            }
#pragma unroll
            for (int c = q; c < kChunks; c += 8) {
                constexpr bool kLine = kChunks >= 8; /* rows of >= 128 bytes: whole L2 lines */
                cp_async16<kLine>(kd + G::chunk(jt, c), reinterpret_cast<const unsigned char *>(ks[u]) + c * 16, in[u] ? 16 : 0, pol);
                cp_async16<kLine>(vd + G::chunk(jt, c), reinterpret_cast<const unsigned char *>(vs[u]) + c * 16, in[u] ? 16 : 0, pol);
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
        if (nit && sl == (nsl > 2 ? 2 : nsl - 1)) /* the next pair has landed by then */
            prefetch_pages<G>(p, *nit, *nrq, split, ppr, pt);
    }
}

}  // namespace figqa
