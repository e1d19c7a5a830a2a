/*
 * executor/mla/mla_tile.cuh - the MLA decode family's tile body (sm_90a): one work item
 * of up to 64 rows (query token x head) over a KV range, in three parts - prologue (page
 * indices, Q, the first KV blocks), KV loop (S = QK^T, online softmax, O += PV) and
 * epilogue (pair combine, output or partial, arrival / merge).  The persistent loop, the
 * split merge and the launch are the shared ones (executor/cuda/).
 *
 * What it computes (fiattn_run.h): s_j = bmm1_scale * (q_nope . ckv_j + q_pe . kpe_j),
 * out = bmm2_scale * softmax(s) . ckv with the mask rule of plan/mask.h, sinks in the
 * denominator, natural-log LSE.
 *
 * How (one CTA = 8 warps = 256 threads, one CTA per SM):
 *  - Tile rows are q-major (r = (q - q_begin) * heads + (h - head_begin)); Q sits in shared
 *    memory as [rows][576] with 8 pad elements a row so ldmatrix rows hit distinct banks.
 *  - KV: blocks of 32 tokens x 576 (ckv ++ kpe) gathered through the page table by bulk
 *    copies (one per token for a concatenated cache, else two) into a 4-5 stage mbarrier
 *    ring, page indices fetched a step ahead; tokens outside [kv_begin, kv_end) are
 *    zero-filled so P = 0 never meets garbage.  Producers: all 8 warps, except for tiles of
 *    <= 16 rows (KP = 2): then warps 4..7, which have no math, copy 8 tokens each (H200:
 *    h16 B128 x 4096 239 -> 185 us).
 *  - Warp w: row group rg = (w / 2) / KP (16 rows), half wh = w % 2 (16 tokens of a block
 *    for S, 256 dims of the output for PV).  mma.sync m16n8k16, fp32 accumulate; the two
 *    halves swap row maxima through shared memory; P is written to shared memory in the
 *    input dtype; V = ckv is read with ldmatrix.trans.  KP = 2: pairs 0 and 1 take
 *    alternate blocks (two softmax states, combined in the epilogue).
 *  - An fp8 e4m3 cache (MlaFamily<__half, __nv_fp8_e4m3>, out bf16): the same bulk copies
 *    of 576-byte rows (592-byte pitch), ldmatrix on the fp8 bytes and an exact conversion
 *    to fp16 in registers; Q is converted to fp16 with its 16-dim groups permuted to the
 *    dims a lane's K word holds (load_q_f16_perm), and P V leaves the output columns
 *    permuted (out_pair).  docs/DESIGN.md section 9b.
 *  - Online softmax in the exp2 domain, fp32; a row whose keys are all masked so far keeps
 *    m = -inf, l = 0, O = 0; NaN in q or a seen key makes the row's l, O and lse NaN.
 *  - The kernel sits at 255 registers: anything live across the KV loop changes its
 *    schedule (the same instruction count ran 15% slower once), so epilogue work re-reads
 *    thread coordinates (fresh_tid) and every change is A/B'd against the previous build.
 * Sources: FlashAttention-2 (Dao 2023) online softmax and warp tiling; flash-decoding
 * split-KV; FlashMLA's persistent decode scheduling.
 */
#pragma once

#include "executor/cuda/common/dtype.cuh"
#include "executor/cuda/common/profile.cuh"
#include "executor/cuda/common/ptx.cuh"
#include "executor/cuda/merge/split_merge.cuh"
#include "executor/mla/mla_params.h"
#include "plan/mask.h"

#include <type_traits>

namespace fimla {
using namespace fi;

constexpr int kThreads = 256;
constexpr int kRows = FI_MLA_MAX_TILE_ROWS; /* the largest tile this body runs */
constexpr int kDqk = 576;                 /* 512 ckv + 64 kpe */
constexpr int kDv = 512;
constexpr int kChunksNope = kDv / 8;      /* 16-byte chunks of a 512-element row: 64 */
constexpr int kChunks = kDqk / 8;         /* 72 */
constexpr int kBlockN = FI_MLA_KV_BLOCK;  /* KV tokens per block */
constexpr int kMaxStages = 5;             /* ring depth when Q needs <= 32 rows */
constexpr int kPitch = kDqk + 8;          /* elements per smem row: 1168 B, 292 words */
constexpr int kPPitch = kBlockN + 8;      /* P row: 80 B */

/* Shared memory: [P 4x16 rows][row max / sums][flags][ring mbarriers] then Q (16 rows per
 * live row group) then the KV ring, as many 32-token stages as fit (4 with 64 Q rows, 5
 * with <= 32). */
constexpr size_t kSmemP = (size_t)4 * 16 * kPPitch * 2;
constexpr size_t kSmemRed = (size_t)2 * 2 * kRows * sizeof(float); /* max and l, per half */
constexpr size_t kSmemFixed = (kSmemP + kSmemRed + 16 + 8 * kMaxStages + 127) / 128 * 128;

/* A cache element's rows in the ring: bf16 / fp16 rows of kPitch elements (1168 B); fp8
 * e4m3 rows of 576 + 16 bytes (592 B = 148 words: the 8 rows of an ldmatrix fall on
 * distinct banks), which the matmuls read as fp16 (kv_loop). */
template <typename KV> struct KvRows {
    static constexpr bool kF8 = std::is_same<KV, __nv_fp8_e4m3>::value;
    static constexpr int kElem = kF8 ? 1 : 2;                 /* bytes an element */
    static constexpr int kPitchB = kF8 ? kDqk + 16 : kPitch * 2; /* bytes a row */
    static constexpr size_t kStage = (size_t)kBlockN * kPitchB;
};
constexpr size_t kSmemBytes = 232448; /* the sm_90 opt-in maximum per block */
/* 64 Q rows and 4 stages of the larger (16-bit) rows fit */
static_assert(kSmemFixed + (size_t)kRows * kPitch * 2 + 4 * KvRows<__nv_bfloat16>::kStage <= kSmemBytes, "smem");

/* One item's geometry and shared-memory map (T: the matmul type, KV: the cache element). */
template <typename T, typename KV = T> struct Item {
    T *sP;        /* [4 x 16][kPPitch] P of each warp pair */
    float *sMax;  /* [2][kRows] row maxima per half (epilogue: pair maxima) */
    float *sL;    /* [2][kRows] row sums per half */
    int *sFlag;   /* [2] arrival flags (merge) */
    T *sQ;        /* [live rows][kPitch] */
    T *sKV;       /* the ring: NS stages of KvRows<KV>::kStage bytes (>= 2) */
    uint32_t bar0;                /* shared address of the ring's mbarriers (8 B each) */
    int nh, M;                    /* heads of the tile, rows */
    int KP;                       /* KV blocks computed at once: 2 when M <= 16 */
    int NS, AHEAD;                /* ring stages; blocks in flight beyond the current step */
    int pw;                       /* first producer warp (0, or 4 when KP = 2) */
    int kv_begin, kv_end, nblk, nstep;
    float l2f;                    /* kv_l2_fraction_short, read once an item (a load a block cost 5%) */
    __device__ __forceinline__ unsigned char *stage_of(int b) const {
        return reinterpret_cast<unsigned char *>(sKV) + (b % NS) * KvRows<KV>::kStage;
    }
};

template <typename T, typename KV>
__device__ __forceinline__ Item<T, KV> item_map(const fi_exec_common &c, const fi_work_item &it,
                                                unsigned char *smem) {
    Item<T, KV> x;
    x.sP = reinterpret_cast<T *>(smem);
    x.sMax = reinterpret_cast<float *>(smem + kSmemP);
    x.sL = x.sMax + 2 * kRows;
    x.sFlag = reinterpret_cast<int *>(x.sL + 2 * kRows);
    x.bar0 = smem_u32(x.sFlag + 2);
    x.sQ = reinterpret_cast<T *>(smem + kSmemFixed);
    x.nh = it.head_end - it.head_begin;
    x.M = (it.q_end - it.q_begin) * x.nh;
    x.KP = x.M <= 16 ? 2 : 1;
    const size_t ring_off = kSmemFixed + (size_t)((x.M + 15) & ~15) * kPitch * 2;
    x.sKV = reinterpret_cast<T *>(smem + ring_off);
    x.NS = min(kMaxStages, (int)((kSmemBytes - ring_off) / KvRows<KV>::kStage));
    x.AHEAD = x.NS - x.KP;
    x.pw = x.KP == 2 ? 4 : 0;
    x.kv_begin = it.kv_begin;
    x.kv_end = it.kv_end;
    x.nblk = (x.kv_end - x.kv_begin + kBlockN - 1) / kBlockN;
    x.nstep = (x.nblk + x.KP - 1) / x.KP;
    /* The short-stream rule only: the per-item one of the other bodies (kv_l2_fraction)
     * took this 255-register body's spills from 16 / 8 to 24 / 12 bytes, which cost it ~1%
     * (docs/perf-log.md, thirty-fourth session). */
    x.l2f = kv_l2_fraction_short(c);
    return x;
}

/* A thread's coordinates in the tile (see the header comment). */
struct Lane {
    int tid, warp, lane, wp, wh, g, q4, rg, kvp;
    bool live;
};
__device__ __forceinline__ Lane lane_of(int tid, int KP, int M) {
    Lane l;
    l.tid = tid;
    l.warp = tid >> 5;
    l.lane = tid & 31;
    l.wp = l.warp >> 1;
    l.wh = l.warp & 1;
    l.g = l.lane >> 2;
    l.q4 = l.lane & 3;
    l.rg = l.wp / KP;
    l.kvp = l.wp % KP;
    l.live = l.rg * 16 < M;
    return l;
}

/* The softmax state of a thread's two rows and its share of O ([32 n8 tiles][4]). */
struct Acc {
    float o[32][4];
    float m[2], l[2];
};

/* Producer warps pw .. 7 share the tokens of a block: pw = 0, every warp copies 4 tokens
 * (lanes 0..3); pw = 4, warps 4..7 copy 8 each.  The bulk copies have uniform operands
 * (the compiler loops over the lanes). */
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
    return p.c.page_table[rq.page_row_offset + (t >> p.c.page_shift)];
}

/* Every producer warp: copy its tokens of block b into the ring stage (one or two bulk
 * copies a token, 16-bit or fp8 rows alike) and arrive on the stage's mbarrier (one
 * arrival a producer warp a phase) with the bytes it expects.  Rows past kv_end are
 * zeroed with ordinary stores, ordered before the arrival by __syncwarp (P = 0 must not
 * meet NaN bit patterns).  Not the bound at heads 16: one copy per 4 tokens ran no faster
 * (docs/perf-log.md, 2026-11-27 evening). */
template <typename KV>
__device__ __forceinline__ void issue_block(const fi_mla_params &p, unsigned char *stage, uint32_t bar,
                                            int t0, int kv_end, int32_t page, int pw, float l2f) {
    using R = KvRows<KV>;
    const int lane = threadIdx.x & 31;
    const int tpw = prod_tokens(pw);
    const int j = prod_token(pw) & (kBlockN - 1);
    const int t = t0 + j;
    unsigned char *row = stage + j * R::kPitchB;
    if (lane < tpw && page < 0) {
#pragma unroll 8
        for (int c = 0; c < kDqk * R::kElem / 16; ++c)
            reinterpret_cast<uint4 *>(row)[c] = make_uint4(0, 0, 0, 0);
        fence_proxy_async();
    }
    __syncwarp();
    if (lane == 0) {
        const int w0 = t0 + ((int)(threadIdx.x >> 5) - pw) * tpw;
        const int nv = max(0, min(tpw, kv_end - w0));
        mbar_expect_tx(bar, (uint32_t)nv * (kDqk * R::kElem));
    }
    if (lane < tpw && page >= 0) {
        const uint64_t pol = l2_evict_first(l2f);
        const int slot = t & (p.c.page_size - 1);
        const KV *ckv = (const KV *)p.m.ckv + (int64_t)page * p.m.ckv_stride_page + (int64_t)slot * p.m.ckv_stride_tok;
        const KV *kpe = (const KV *)p.m.kpe + (int64_t)page * p.m.kpe_stride_page + (int64_t)slot * p.m.kpe_stride_tok;
        if (kpe == ckv + kDv) {
            /* Concatenated cache ([.., 576]): one copy a token. */
            bulk_g2s(smem_u32(row), ckv, kDqk * R::kElem, bar, pol);
        } else {
            bulk_g2s(smem_u32(row), ckv, kDv * R::kElem, bar, pol);
            bulk_g2s(smem_u32(row + kDv * R::kElem), kpe, (kDqk - kDv) * R::kElem, bar, pol);
        }
    }
}

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
                               ? (const T *)p.m.q_nope + tok * p.m.q_nope_stride_tok +
                                     h * p.m.q_nope_stride_head + c * 8
                               : (const T *)p.m.q_pe + tok * p.m.q_pe_stride_tok +
                                     h * p.m.q_pe_stride_head + (c - kChunksNope) * 8;
            cp_async16(smem_u32(dst), src, 16);
        } else {
            *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
        }
    }
}

/* An fp8 cache: the tile's Q rows converted to fp16 (from fp8 e4m3, bf16 or fp16:
 * p.m.q_kind) into sQ with each 16-dim group stored permuted - positions 0-7 hold dims 0, 1,
 * 4, 5, 8, 9, 12, 13 and positions 8-15 dims 2, 3, 6, 7, 10, 11, 14, 15 - so that ldmatrix
 * hands lane q4 of a k16 step dims 4 q4 .. 4 q4 + 3, the dims its fp8 K word holds
 * (kv_loop).  Rows >= M inside a live row group are zeroed.  Synchronous loads (Q is 1 KB
 * a row, once an item). */
__device__ __forceinline__ void load_q_f16_perm(const fi_mla_params &p, __half *sQ, const fi_work_item &it,
                                                const fi_request_info &rq, int nh, int M) {
    constexpr int kGroups = kDqk / 16; /* 36 a row: 32 of q_nope, 4 of q_pe */
    const int qk = p.m.q_kind, esz = qk == FI_MLA_Q_E4M3 ? 1 : 2;
    const int rows_live = (M + 15) & ~15;
    for (int idx = threadIdx.x; idx < rows_live * kGroups; idx += kThreads) {
        const int r = idx / kGroups, gi = idx - r * kGroups;
        uint4 a = make_uint4(0, 0, 0, 0), b = a; /* fp16 dims 16 gi .. + 7, + 8 .. + 15 */
        if (r < M) {
            const int64_t tok = (int64_t)rq.q_offset + it.q_begin + r / nh;
            const int h = it.head_begin + r % nh;
            const uint8_t *src = gi < kDv / 16
                ? (const uint8_t *)p.m.q_nope + (tok * p.m.q_nope_stride_tok + h * p.m.q_nope_stride_head + gi * 16) * esz
                : (const uint8_t *)p.m.q_pe + (tok * p.m.q_pe_stride_tok + h * p.m.q_pe_stride_head + (gi - kDv / 16) * 16) * esz;
            if (qk == FI_MLA_Q_E4M3) {
                a = e4m3x8_to_f16x8(__ldg(reinterpret_cast<const uint2 *>(src)));
                b = e4m3x8_to_f16x8(__ldg(reinterpret_cast<const uint2 *>(src + 8)));
            } else {
                a = __ldg(reinterpret_cast<const uint4 *>(src));
                b = __ldg(reinterpret_cast<const uint4 *>(src + 16));
                if (qk == FI_MLA_Q_BF16) {
                    a = bf16x8_to_f16x8(a);
                    b = bf16x8_to_f16x8(b);
                }
            }
        }
        uint4 *dst = reinterpret_cast<uint4 *>(sQ + r * kPitch + gi * 16);
        dst[0] = make_uint4(a.x, a.z, b.x, b.z); /* dims (0,1) (4,5) (8,9) (12,13) */
        dst[1] = make_uint4(a.y, a.w, b.y, b.w); /* dims (2,3) (6,7) (10,11) (14,15) */
    }
}

/* Prologue: the first blocks' page indices first (page -> KV is the item's critical
 * chain; Q's copies are issued while they travel), the ring's barriers (re-initialised per
 * item: no copy is pending between items), Q, the first AHEAD blocks, and the page indices
 * of the first step's refill (pg).  Ends with Q in shared memory. */
template <typename T, typename KV>
__device__ __forceinline__ void prologue(const fi_mla_params &p, const fi_work_item &it,
                                         const fi_request_info &rq, const Item<T, KV> &x,
                                         const Lane &ln, int32_t *pg, bool first) {
    const bool producer = ln.warp >= x.pw;
    int32_t pp[kMaxStages];
#pragma unroll
    for (int b = 0; b < kMaxStages; ++b)
        pp[b] = producer && b < x.AHEAD ? fetch_page(p, rq, x.kv_begin, x.kv_end, b, x.nblk, x.pw) : -1;
    if (ln.tid < x.NS)
        mbar_init(x.bar0 + ln.tid * 8, kThreads / 32 - x.pw);
    mbar_init_fence();
    if constexpr (KvRows<KV>::kF8)
        load_q_f16_perm(p, x.sQ, it, rq, x.nh, x.M);
    else
        load_q<T>(p, x.sQ, it, rq, x.nh, x.M);
    cp_async_commit();
    __syncthreads(); /* barriers initialised before any copy or wait */
    pg[0] = pg[1] = -1;
    if (producer) {
#pragma unroll
        for (int b = 0; b < kMaxStages; ++b)
            if (b < x.AHEAD && b < x.nblk)
                issue_block<KV>(p, x.stage_of(b), x.bar0 + (b % x.NS) * 8, x.kv_begin + b * kBlockN,
                               x.kv_end, pp[b], x.pw, x.l2f);
#pragma unroll
        for (int i = 0; i < 2; ++i)
            pg[i] = i < x.KP ? fetch_page(p, rq, x.kv_begin, x.kv_end, x.AHEAD + i, x.nblk, x.pw) : -1;
    }
    cp_async_wait<0>(); /* Q */
    if (first)
        FI_STAMP2(0);
}

/* KV loop: step j computes block j * KP + kvp on each warp pair, after refilling the
 * stages step j-1 released (blocks AHEAD + j * KP ..) and fetching the next refill's
 * page indices. */
template <typename T, typename KV>
__device__ __forceinline__ void kv_loop(const fi_mla_params &p, const RunCtx &ctx,
                                        const fi_request_info &rq, const Item<T, KV> &x,
                                        const Lane &ln, const int *lo, const int *hi, int32_t *pg,
                                        Acc &a, bool first) {
    const bool producer = ln.warp >= x.pw;
    const int lane = ln.lane, wh = ln.wh, g = ln.g, q4 = ln.q4, wp = ln.wp;
#pragma unroll
    for (int n = 0; n < 32; ++n)
        a.o[n][0] = a.o[n][1] = a.o[n][2] = a.o[n][3] = 0.f;
    a.m[0] = a.m[1] = -CUDART_INF_F;
    a.l[0] = a.l[1] = 0.f;
    const uint32_t sQ_a = smem_u32(x.sQ + (ln.rg * 16 + (lane & 15)) * kPitch + (lane >> 4) * 8);
    const uint32_t sP_a = smem_u32(x.sP + (wp * 16 + (lane & 15)) * kPPitch + (lane >> 4) * 8);

    for (int j = 0; j < x.nstep; ++j) {
        __syncthreads(); /* step j-1 is done everywhere: its stages may be refilled */
        if (producer) {
            const int bn = x.AHEAD + j * x.KP;
#pragma unroll
            for (int i = 0; i < 2; ++i)
                if (i < x.KP && bn + i < x.nblk)
                    issue_block<KV>(p, x.stage_of(bn + i), x.bar0 + ((bn + i) % x.NS) * 8,
                                   x.kv_begin + (bn + i) * kBlockN, x.kv_end, pg[i], x.pw, x.l2f);
#pragma unroll
            for (int i = 0; i < 2; ++i)
                pg[i] = i < x.KP ? fetch_page(p, rq, x.kv_begin, x.kv_end, bn + x.KP + i, x.nblk, x.pw) : -1;
        }
        const int b = j * x.KP + ln.kvp;
        const bool active = ln.live && b < x.nblk;
        const unsigned char *stage = x.stage_of(b);
        const int t0 = x.kv_begin + b * kBlockN;
        if (active)
            mbar_wait(x.bar0 + (b % x.NS) * 8, (uint32_t)(b / x.NS) & 1u);
#ifdef FI_PROFILE
        if (first && j == 0)
            FI_STAMP2(1);
#endif
        float s[2][2][4]; /* [k parity][n8 tile][frag]: two chains per tile for ILP */
        if (active) {
#pragma unroll
            for (int c = 0; c < 2; ++c)
#pragma unroll
                for (int n = 0; n < 2; ++n)
                    s[c][n][0] = s[c][n][1] = s[c][n][2] = s[c][n][3] = 0.f;
            if constexpr (!KvRows<KV>::kF8) {
                /* B rows: tokens wh*16 + (lane>>4)*8 + (lane&7), k offset ((lane>>3)&1)*8. */
                const int kr = wh * 16 + (lane >> 4) * 8 + (lane & 7);
                const uint32_t sK_a = smem_u32(reinterpret_cast<const T *>(stage) + kr * kPitch + ((lane >> 3) & 1) * 8);
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
            } else {
                /* fp8 K: an ldmatrix x4 on the fp8 rows covers 32 dims (two k16 steps) of the
                 * half's 16 tokens: [0] tokens 0-7 dims 0-15, [1] tokens 0-7 dims 16-31, [2] /
                 * [3] tokens 8-15 (lane bit 3: +16 bytes, bit 4: +8 tokens).  A lane's word is
                 * dims 4 q4 .. 4 q4 + 3 of token g: b0 its low pair, b1 its high pair, the
                 * order load_q_f16_perm stored Q in (source: the GQA family's fp8 path). */
                const int kr = wh * 16 + (lane >> 4) * 8 + (lane & 7);
                const uint32_t sK_a = smem_u32(stage + kr * KvRows<KV>::kPitchB + ((lane >> 3) & 1) * 16);
                uint32_t kb[2][4], qa[2][2][4];
                ldsm_x4(sK_a, kb[0]);
                ldsm_x4(sQ_a, qa[0][0]);
                ldsm_x4(sQ_a + 32, qa[0][1]);
#pragma unroll
                for (int c = 0; c < kDqk / 32; ++c) {
                    const int u = c & 1;
                    if (c + 1 < kDqk / 32) {
                        ldsm_x4(sK_a + (c + 1) * 32, kb[u ^ 1]);
                        ldsm_x4(sQ_a + (2 * c + 2) * 32, qa[u ^ 1][0]);
                        ldsm_x4(sQ_a + (2 * c + 3) * 32, qa[u ^ 1][1]);
                    }
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        Dt<T>::mma(s[h][0], qa[u][h], e4m3x2_to_f16x2(kb[u][h]), e4m3x2_hi_to_f16x2(kb[u][h]));
                        Dt<T>::mma(s[h][1], qa[u][h], e4m3x2_to_f16x2(kb[u][2 + h]),
                                   e4m3x2_hi_to_f16x2(kb[u][2 + h]));
                    }
                }
            }
            float mloc[2] = {-CUDART_INF_F, -CUDART_INF_F};
            /* a block inside both rows' key ranges skips the per-score mask test */
            const int tb = t0 + wh * 16;
            const bool whole = keys_inside(lo, hi, tb, tb + 15);
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = e >> 1;
                    const int t = tb + n * 8 + q4 * 2 + (e & 1);
                    float v = (s[0][n][e] + s[1][n][e]) * ctx.scale_log2;
                    if (!whole && (t < lo[i] || t > hi[i]))
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
                x.sMax[wh * kRows + wp * 16 + g] = mloc[0];
                x.sMax[wh * kRows + wp * 16 + g + 8] = mloc[1];
            }
        }
        __syncthreads();
        if (active) {
            float alpha[2], m_use[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const float mo = x.sMax[(wh ^ 1) * kRows + wp * 16 + g + 8 * i];
                const float m_new = fmaxf(a.m[i], fmaxf(x.sMax[wh * kRows + wp * 16 + g + 8 * i], mo));
                m_use[i] = m_new == -CUDART_INF_F ? 0.f : m_new;
                alpha[i] = ex2_ftz(a.m[i] - m_use[i]);
                a.m[i] = m_new;
            }
            float rs[2] = {0.f, 0.f};
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                const float p0 = ex2_ftz(s[0][n][0] - m_use[0]);
                const float p1 = ex2_ftz(s[0][n][1] - m_use[0]);
                const float p2 = ex2_ftz(s[0][n][2] - m_use[1]);
                const float p3 = ex2_ftz(s[0][n][3] - m_use[1]);
                rs[0] += p0 + p1;
                rs[1] += p2 + p3;
                T *row0 = x.sP + (wp * 16 + g) * kPPitch + wh * 16 + n * 8 + q4 * 2;
                *reinterpret_cast<uint32_t *>(row0) = Dt<T>::pack(p0, p1);
                *reinterpret_cast<uint32_t *>(row0 + 8 * kPPitch) = Dt<T>::pack(p2, p3);
            }
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                rs[i] += __shfl_xor_sync(0xffffffffu, rs[i], 1);
                rs[i] += __shfl_xor_sync(0xffffffffu, rs[i], 2);
                a.l[i] = a.l[i] * alpha[i] + rs[i];
            }
#pragma unroll
            for (int n = 0; n < 32; ++n) {
                a.o[n][0] *= alpha[0];
                a.o[n][1] *= alpha[0];
                a.o[n][2] *= alpha[1];
                a.o[n][3] *= alpha[1];
            }
        }
        __syncthreads();
        if (active) {
            const int vr = ((lane >> 3) & 1) * 8 + (lane & 7);
            if constexpr (!KvRows<KV>::kF8) {
                /* V = ckv: tokens are k, dims are n; ldmatrix.trans gives the col-major B frag. */
                const uint32_t sV_a = smem_u32(reinterpret_cast<const T *>(stage) + vr * kPitch + wh * 256 + (lane >> 4) * 8);
                auto v_addr = [&](int v) -> uint32_t { /* v = kk * 16 + nn */
                    return sV_a + ((v >> 4) * 16 * kPitch + (v & 15) * 16) * 2;
                };
                uint32_t pf[2][4], vf[2][4];
                ldsm_x4(sP_a, pf[0]);
                ldsm_x4(sP_a + 32, pf[1]);
                ldsm_x4_t(v_addr(0), vf[0]);
#pragma unroll
                for (int v = 0; v < 32; ++v) {
                    const int kk = v >> 4, nn = v & 15, c = v & 1;
                    if (v + 1 < 32)
                        ldsm_x4_t(v_addr(v + 1), vf[c ^ 1]);
                    Dt<T>::mma(a.o[2 * nn], pf[kk], vf[c][0], vf[c][1]);
                    Dt<T>::mma(a.o[2 * nn + 1], pf[kk], vf[c][2], vf[c][3]);
                }
            } else {
                /* fp8 V: ldmatrix.trans on the fp8 rows treats byte pairs as 16-bit
                 * elements: a lane gets tokens 2 q4, 2 q4 + 1 x bytes 2 g, 2 g + 1 of a
                 * 16-byte piece ([0] tokens 0-7 bytes 0-15, [1] tokens 8-15, [2] / [3] bytes
                 * 16-31); bytes2 regroups them (dim 2 g: both tokens | dim 2 g + 1: both
                 * tokens), and the even and odd dims are two n8 tiles: a.o[4 c + 2 h + j]
                 * holds dims 32 c + 16 h + 4 q4 + {0, 2} + j of the warp's 256 (out_pair). */
                const uint32_t sV_a = smem_u32(stage + vr * KvRows<KV>::kPitchB + wh * 256 + (lane >> 4) * 16);
                auto v_addr = [&](int v) -> uint32_t { /* v = kk * 8 + c */
                    return sV_a + (v >> 3) * 16 * KvRows<KV>::kPitchB + (v & 7) * 32;
                };
                uint32_t pf[2][4], vf[2][4];
                ldsm_x4(sP_a, pf[0]);
                ldsm_x4(sP_a + 32, pf[1]);
                ldsm_x4_t(v_addr(0), vf[0]);
#pragma unroll
                for (int v = 0; v < 16; ++v) {
                    const int kk = v >> 3, c = v & 7, u = v & 1;
                    if (v + 1 < 16)
                        ldsm_x4_t(v_addr(v + 1), vf[u ^ 1]);
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const uint32_t lo = bytes2(vf[u][2 * h], 0x3120u), hi = bytes2(vf[u][2 * h + 1], 0x3120u);
                        Dt<T>::mma(a.o[4 * c + 2 * h], pf[kk], e4m3x2_to_f16x2(lo), e4m3x2_to_f16x2(hi));
                        Dt<T>::mma(a.o[4 * c + 2 * h + 1], pf[kk], e4m3x2_hi_to_f16x2(lo), e4m3x2_hi_to_f16x2(hi));
                    }
                }
            }
        }
    }
    FI_STAMP2(2);
}

/* KP = 2: combine the two pairs' softmax states (each summed its own blocks); pair 1
 * hands its O, scaled to the common max, to pair 0 through the ring.  KP = 1: the two
 * halves of a row pair summed their own tokens under the same running max.  Leaves each
 * live thread's rows' total max in mt and sum in lt. */
template <typename T, typename KV>
__device__ __forceinline__ void combine_pairs(const Item<T, KV> &x, const Lane &ln, Acc &a,
                                              float *mt, float *lt) {
    const int wp = ln.wp, wh = ln.wh, g = ln.g, q4 = ln.q4;
    if (ln.live && q4 == 0) {
        x.sL[wh * kRows + wp * 16 + g] = a.l[0];
        x.sL[wh * kRows + wp * 16 + g + 8] = a.l[1];
        if (wh == 0) {
            x.sMax[wp * 16 + g] = a.m[0];
            x.sMax[wp * 16 + g + 8] = a.m[1];
        }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = g + 8 * i;
        if (x.KP == 1) {
            mt[i] = a.m[i];
            lt[i] = x.sL[wp * 16 + r] + x.sL[kRows + wp * 16 + r];
        } else {
            const float ma = x.sMax[r], mb = x.sMax[16 + r];
            mt[i] = fmaxf(ma, mb);
            const float mu = mt[i] == -CUDART_INF_F ? 0.f : mt[i];
            const float fa = exp2f(ma - mu), fb = exp2f(mb - mu);
            lt[i] = (x.sL[r] + x.sL[kRows + r]) * fa + (x.sL[16 + r] + x.sL[kRows + 16 + r]) * fb;
            const float f = exp2f(a.m[i] - mu); /* this pair's own factor */
#pragma unroll
            for (int n = 0; n < 32; ++n) {
                a.o[n][2 * i] *= f;
                a.o[n][2 * i + 1] *= f;
            }
        }
    }
    if (x.KP == 2) {
        /* sO: [2 halves][16 rows][kOPitch] fp32.  The 8 padding floats a row put the 8
         * rows g of a float2 access 8 banks apart (an unpadded 256-float row put them on
         * the same banks: 4-way conflicts). */
        constexpr int kOPitch = 256 + 8;
        static_assert((size_t)32 * kOPitch * 4 <= 2 * KvRows<KV>::kStage, "sO fits 2 stages of the ring");
        float *sO = reinterpret_cast<float *>(x.sKV);
        if (wp == 1) {
#pragma unroll
            for (int n = 0; n < 32; ++n) {
                float *o = sO + (wh * 16 + g) * kOPitch + n * 8 + q4 * 2;
                *reinterpret_cast<float2 *>(o) = make_float2(a.o[n][0], a.o[n][1]);
                *reinterpret_cast<float2 *>(o + 8 * kOPitch) = make_float2(a.o[n][2], a.o[n][3]);
            }
        }
        __syncthreads();
        if (wp == 0) {
#pragma unroll
            for (int n = 0; n < 32; ++n) {
                const float *o = sO + (wh * 16 + g) * kOPitch + n * 8 + q4 * 2;
                const float2 u = *reinterpret_cast<const float2 *>(o);
                const float2 v = *reinterpret_cast<const float2 *>(o + 8 * kOPitch);
                a.o[n][0] += u.x;
                a.o[n][1] += u.y;
                a.o[n][2] += v.x;
                a.o[n][3] += v.y;
            }
        }
    }
}

/* Pair k (0 .. 31) of a thread's values of row half i: two adjacent output dims at
 * out_lane(q4) + out_pair(k) of the warp's 256 (a constant once unrolled), and their
 * values.  A 16-bit cache: tile k, dims 2 q4 + 8 k (+1).  An fp8 cache (kv_loop's fp8
 * V): tiles 4 c + 2 h and + 1 at fragment column e (k = 4 c + 2 h + e), dims 4 q4 + 32 c
 * + 16 h + 2 e (+1). */
template <bool kF8> __device__ __forceinline__ int out_lane(int q4) { return (kF8 ? 4 : 2) * q4; }
template <bool kF8>
__device__ __forceinline__ int out_pair(const Acc &a, int k, int i, float &v0, float &v1) {
    if constexpr (!kF8) {
        v0 = a.o[k][2 * i];
        v1 = a.o[k][2 * i + 1];
        return 8 * k;
    } else {
        const int n = k & ~1, e = k & 1;
        v0 = a.o[n][2 * i + e];
        v1 = a.o[n + 1][2 * i + e];
        return 16 * (k >> 1) + 2 * e;
    }
}

/* Store a live thread's two rows: unsplit, out (TO) = bmm2 * O / l * exp(lse_keys - lse)
 * with lse = logaddexp(lse_keys, sink); split, the fp32 partial O / l and lse_keys (no
 * sink, no bmm2) into the item's slot; an fp8 cache's output dims: out_pair. */
template <typename T, typename KV, typename TO>
__device__ __forceinline__ void store_rows(const fi_mla_params &p, const RunCtx &ctx,
                                           const fi_work_item &it, const fi_request_info &rq,
                                           const Item<T, KV> &x, const Lane &ln, const Acc &a,
                                           const float *mt, const float *lt) {
    const fi_exec_common &c = p.c;
    const int wh = ln.wh, q4 = ln.q4;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = ln.rg * 16 + ln.g + 8 * i;
        if (r >= x.M)
            continue;
        const float l = lt[i];
        /* l == 0 (not l > 0): a NaN sum (NaN in q or a seen key) keeps the row's lse NaN */
        const float lse_keys = l == 0.f ? -CUDART_INF_F : (mt[i] + log2f(l)) * kLn2;
        if (it.out_slot >= 0) {
            const float inv = l == 0.f ? 0.f : 1.f / l;
            float *dst = c.partial_o + ((int64_t)it.out_slot * c.tile_rows + r) * kDv + wh * 256 + out_lane<KvRows<KV>::kF8>(q4);
#pragma unroll
            for (int k = 0; k < 32; ++k) {
                float v0, v1;
                const int d = out_pair<KvRows<KV>::kF8>(a, k, i, v0, v1);
                __stcg(reinterpret_cast<float2 *>(dst + d), make_float2(v0 * inv, v1 * inv));
            }
            if (wh == 0 && q4 == 0)
                __stcg(c.partial_lse + (int64_t)it.out_slot * c.tile_rows + r, lse_keys);
        } else {
            const int h = it.head_begin + r % x.nh;
            const int64_t tok = (int64_t)rq.q_offset + it.q_begin + r / x.nh;
            const float lse = c.sinks ? logaddexp(lse_keys, c.sinks[h]) : lse_keys;
            const float f = l == 0.f ? 0.f : ctx.scale2 / l * expf(lse_keys - lse);
            TO *dst = (TO *)c.out + tok * c.out_stride_tok + h * c.out_stride_head + wh * 256 + out_lane<KvRows<KV>::kF8>(q4);
#pragma unroll
            for (int k = 0; k < 32; ++k) {
                float v0, v1;
                const int d = out_pair<KvRows<KV>::kF8>(a, k, i, v0, v1);
                *reinterpret_cast<uint32_t *>(dst + d) = Dt<TO>::pack(v0 * f, v1 * f);
            }
            if (c.lse && wh == 0 && q4 == 0)
                c.lse[tok * c.lse_stride_tok + h * c.lse_stride_head] = lse;
        }
    }
}

/* The family: matmul / P type T (bf16, fp16; fp16 for an fp8 e4m3 cache), cache element
 * KV (T, or fp8 e4m3 with out bf16: q of any kind p.m.q_kind names, converted to fp16).
 * Sources as the header's; the fp8 fragment maps are the GQA family's (gqa_rows16.cuh). */
template <typename T, typename KV = T> struct MlaFamily {
    static constexpr bool kF8 = KvRows<KV>::kF8;
    static_assert(!kF8 || std::is_same<T, __half>::value, "an fp8 cache runs fp16 matmuls");
    using TO = typename std::conditional<kF8, __nv_bfloat16, T>::type; /* output element */
    using Params = fi_mla_params;
    /* long pieces merge together; 16 loads in flight in a one-unit slice (B1 x 32k) */
    using Merge = SplitMerge<kDv, kRows, TO, kThreads, true, 8, 16>;
    static constexpr int kThreads = fimla::kThreads;
    static constexpr int kProducerWarps = 0; /* every warp loads and computes */
    static constexpr int kConsumerRegs = 0;
    static constexpr size_t kSmemBytes = fimla::kSmemBytes;
    struct State {}; /* items share nothing: each re-initialises its ring */
    static __device__ __forceinline__ State setup(unsigned char *) { return State{}; }

    /* Epilogue: thread coordinates re-read (fresh_tid: their uses here do not stretch
     * live ranges over the loop, where at 255 registers the allocator rematerialises them
     * instead), pair combine, store, and for a split its arrival (and a small group's
     * merge by the last arriver).  Returns 1 for a split merged cooperatively later. */
    static __device__ __forceinline__ bool epilogue(const fi_mla_params &p, const RunCtx &ctx,
                                                    const fi_work_item &it,
                                                    const fi_request_info &rq,
                                                    const Item<T, KV> &x, Acc &a) {
        const Lane ln = lane_of(fresh_tid(), x.KP, x.M);
        float mt[2], lt[2];
        combine_pairs<T, KV>(x, ln, a, mt, lt);
        if (ln.live && ln.kvp == 0)
            store_rows<T, KV, TO>(p, ctx, it, rq, x, ln, a, mt, lt);
        FI_STAMP2(3);
        bool coop = false;
        if (it.out_slot >= 0)
            coop = Merge::arrive(p.c, ctx, it, x.sFlag, reinterpret_cast<float *>(x.sKV), x.sMax);
        fence_proxy_async(); /* generic writes to the ring (sO, sW, zero rows) before the next bulk copy */
        __syncthreads();     /* smem (Q, ring, flags, barriers) is reused by the next item */
        return coop;
    }

    static __device__ bool run_item(const fi_mla_params &p, const RunCtx &ctx,
                                    const fi_work_item &it, const fi_request_info &rq,
                                    unsigned char *smem, bool first, State &) {
        const Item<T, KV> x = item_map<T, KV>(p.c, it, smem);
        const Lane ln = lane_of(threadIdx.x, x.KP, x.M);
        int lo[2], hi[2];
        row_bounds(ctx, it, rq, x.M, x.nh, ln.rg * 16 + ln.g, 8, lo, hi);
        int32_t pg[2];
        prologue<T, KV>(p, it, rq, x, ln, pg, first);
        Acc a;
        kv_loop<T, KV>(p, ctx, rq, x, ln, lo, hi, pg, a, first);
        return epilogue(p, ctx, it, rq, x, a);
    }
};

}  // namespace fimla
