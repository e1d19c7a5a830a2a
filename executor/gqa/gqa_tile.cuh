/*
 * executor/gqa/gqa_tile.cuh - the GQA decode family's tile body (sm_90a): one work item of
 * up to 64 rows (query tokens x the query heads of one KV head) over a KV range, with a
 * producer warp that streams K, V and Q for every item of the CTA into shared memory and
 * 8 consumer warps that compute.  The persistent loop, the split merge and the launch are
 * the shared ones (executor/cuda/).
 *
 * What it computes (fiattn_run.h): s_j = bmm1_scale * q . k_j, out = bmm2_scale *
 * softmax(s) . v with the mask rule of plan/mask.h (causal spec-decoding rows, window_left),
 * sinks in the denominator, natural-log LSE.
 *
 * How (one CTA = 4 consumer warps + 4 producer warps, one CTA per SM):
 *  - KV in slices of 16 tokens: a ring of NS slots (K rows then V rows, D + 8 elements a
 *    row so ldmatrix rows fall on distinct banks), each with a "full" mbarrier (the
 *    producer's bytes) and an "empty" one (one arrival per consumer warp).  The ring runs
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
 *    online softmax (flash-decoding inside the CTA), every consumer thread waits for and
 *    releases every slice (so each empty barrier counts 128 arrivals whatever the tile
 *    shape).
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

namespace figqa {
using namespace fi;

/* 4 consumer + 4 producer warps: 8 warps leave each SM sub-partition 2, so a thread may
 * hold 255 registers (9 warps would cap it at 168 and spill O). */
constexpr int kWarps = 4;                  /* consumer warps */
constexpr int kThreads = kWarps * 32;
constexpr int kRows = FI_GQA_MAX_TILE_ROWS;
constexpr int kSlice = 16;                 /* KV tokens a ring slot */
constexpr int kMaxStages = 48;
constexpr size_t kSmemBytes = 232448;      /* the sm_90 opt-in maximum per block */

/* Shared memory: [barriers][sM][sL][flags][merge sW][merge sRow] | Q x 2 | combine | ring. */
template <int D> struct Geo {
    static constexpr int kPitch = D + 8;                      /* elements a row */
    static constexpr size_t kRowBytes = (size_t)kPitch * 2;
    static constexpr size_t kQBytes = (size_t)kRows * kRowBytes;
    static constexpr size_t kSlotBytes = 2 * kSlice * kRowBytes;   /* K rows, then V rows */
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
    template <typename T> static __device__ __forceinline__ T *slot(unsigned char *s, int i) {
        return reinterpret_cast<T *>(s + kOffRing + (size_t)i * kSlotBytes);
    }
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
template <typename T, int D>
__device__ __forceinline__ void produce_q(const fi_gqa_params &p, const fi_work_item &it,
                                          const fi_request_info &rq, unsigned char *smem, int pt,
                                          Cursor &cur) {
    using G = Geo<D>;
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
template <typename T, int D>
__device__ __forceinline__ void produce_kv(const fi_gqa_params &p, const fi_work_item &it,
                                           const fi_request_info &rq, int split, int ppr,
                                           unsigned char *smem, int pt, Cursor &cur) {
    using G = Geo<D>;
    constexpr int kChunks = D / 8;
    const int shift = p.c.page_shift;
    const int j = pt >> 3, q = pt & 7;        /* token of the slice, chunk phase */
    const int kvh = it.head_begin / p.g.group;
    const T *kbase = static_cast<const T *>(p.g.k) + (int64_t)kvh * p.g.k_stride_head;
    const T *vbase = static_cast<const T *>(p.g.v) + (int64_t)kvh * p.g.v_stride_head;
    const int s0 = it.kv_begin & ~(kSlice - 1);
    const int nsl = it.kv_end > it.kv_begin ? (it.kv_end - s0 + kSlice - 1) / kSlice : 0;
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
        const int t0 = s0 + sl * kSlice;
        while ((t0 >> shift) >= b.pb0 + 32) /* uniform */
            page_advance(p, b);
        const int tok = t0 + j;
        const int pi = (tok >> shift) - b.pb0; /* 0 .. 63 (a slice spans <= 16 pages) */
        const int32_t kc = __shfl_sync(0xffffffffu, b.kc, pi & 31);
        const int32_t kn = __shfl_sync(0xffffffffu, b.kn, pi & 31);
        const int32_t vc = __shfl_sync(0xffffffffu, b.vc, pi & 31);
        const int32_t vn = __shfl_sync(0xffffffffu, b.vn, pi & 31);
        const bool in = tok >= it.kv_begin && tok < it.kv_end;
        const int64_t slot_tok = tok & (p.c.page_size - 1);
        const T *ks = in ? kbase + (int64_t)(pi < 32 ? kc : kn) * p.g.k_stride_page + slot_tok * p.g.k_stride_tok : kbase;
        const T *vs = in ? vbase + (int64_t)(pi < 32 ? vc : vn) * p.g.v_stride_page + slot_tok * p.g.v_stride_tok : vbase;
        mbar_wait(G::empty(smem, cur.slot), cur.phase ^ 1u);
        T *kd = G::template slot<T>(smem, cur.slot) + j * G::kPitch;
        T *vd = kd + kSlice * G::kPitch;
#pragma unroll
        for (int c = q; c < kChunks; c += 8) {
            cp_async16(smem_u32(kd + c * 8), ks + c * 8, in ? 16 : 0);
            cp_async16(smem_u32(vd + c * 8), vs + c * 8, in ? 16 : 0);
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

/* One slice on one warp: S = Q K^T (16 x 16), masked to [lo, hi], online softmax, O += P V. */
template <typename T, int D>
__device__ __forceinline__ void compute_slice(const RunCtx &ctx, const T *sK, uint32_t sQa,
                                              const Lane &ln, int t0, const int *lo,
                                              const int *hi, Acc<D> &a) {
    using G = Geo<D>;
    const int lane = ln.lane;
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    const uint32_t sKa = smem_u32(sK + ((lane & 7) + ((lane >> 4) << 3)) * G::kPitch + ((lane >> 3) & 1) * 8);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qa[4], kb[4];
        ldsm_x4(sQa + kk * 32, qa);
        ldsm_x4(sKa + kk * 32, kb);
        Dt<T>::mma(s[0], qa, kb[0], kb[1]);
        Dt<T>::mma(s[1], qa, kb[2], kb[3]);
    }
    float mx[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = e >> 1;
            const int tok = t0 + n * 8 + ln.q4 * 2 + (e & 1);
            const float v = s[n][e] * ctx.scale_log2;
            s[n][e] = tok >= lo[i] && tok <= hi[i] ? v : -CUDART_INF_F;
            mx[i] = fmaxf(mx[i], s[n][e]);
        }
    float m_use[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        const float m_new = fmaxf(a.m[i], mx[i]);
        m_use[i] = m_new == -CUDART_INF_F ? 0.f : m_new;
        const float alpha = exp2f(a.m[i] - m_use[i]);
        a.m[i] = m_new;
        a.l[i] *= alpha;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            a.o[n][2 * i] *= alpha;
            a.o[n][2 * i + 1] *= alpha;
        }
    }
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[n][e] = exp2f(s[n][e] - m_use[e >> 1]);
            a.l[e >> 1] += s[n][e];
        }
    uint32_t pa[4];
    pa[0] = Dt<T>::pack(s[0][0], s[0][1]);
    pa[1] = Dt<T>::pack(s[0][2], s[0][3]);
    pa[2] = Dt<T>::pack(s[1][0], s[1][1]);
    pa[3] = Dt<T>::pack(s[1][2], s[1][3]);
    const T *sV = sK + kSlice * G::kPitch;
    const uint32_t sVa = smem_u32(sV + (((lane >> 3) & 1) * 8 + (lane & 7)) * G::kPitch + (lane >> 4) * 8);
#pragma unroll
    for (int nn = 0; nn < D / 16; ++nn) {
        uint32_t vb[4];
        ldsm_x4_t(sVa + nn * 32, vb);
        Dt<T>::mma(a.o[2 * nn], pa, vb[0], vb[1]);
        Dt<T>::mma(a.o[2 * nn + 1], pa, vb[2], vb[3]);
    }
}

/* Key bounds [lo, hi] (inclusive) of this lane's rows rg*16 + g and + 8, clipped to the
 * item's KV range (plan/mask.h); rows past M see nothing. */
__device__ __forceinline__ void row_bounds(const RunCtx &ctx, const fi_work_item &it,
                                           const fi_request_info &rq, int M, int nh,
                                           const Lane &ln, int *lo, int *hi) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = ln.rg * 16 + ln.g + 8 * i;
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

/* Combine the W warp states of each team in a fixed order: the row max and sum over the
 * team (sM / sL), every O rescaled to the team max, then a tree of adds through the
 * combine buffer (warps W/2.. hand to 0.., and so on).  Leaves warp tw == 0 of each team
 * with the team's O and the rows' max (mt) and sum (lt). */
template <int D>
__device__ __forceinline__ void combine_team(unsigned char *smem, const Lane &ln, Acc<D> &a,
                                             float *mt, float *lt) {
    using G = Geo<D>;
    float *sM = reinterpret_cast<float *>(smem + G::kOffM);
    float *sL = reinterpret_cast<float *>(smem + G::kOffL);
    float4 *comb = reinterpret_cast<float4 *>(smem + G::kOffComb);
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
    for (int half = ln.W >> 1; half >= 1; half >>= 1) { /* uniform: W is the item's */
        if (ln.tw >= half && ln.tw < 2 * half) {
            float4 *dst = comb + (size_t)(ln.rg * (ln.W >> 1) + ln.tw - half) * (D / 8) * 32 + ln.lane;
#pragma unroll
            for (int n = 0; n < D / 8; ++n)
                dst[n * 32] = make_float4(a.o[n][0], a.o[n][1], a.o[n][2], a.o[n][3]);
        }
        cta_sync<kThreads>();
        if (ln.tw < half) {
            const float4 *src = comb + (size_t)(ln.rg * (ln.W >> 1) + ln.tw) * (D / 8) * 32 + ln.lane;
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                const float4 v = src[n * 32];
                a.o[n][0] += v.x;
                a.o[n][1] += v.y;
                a.o[n][2] += v.z;
                a.o[n][3] += v.w;
            }
        }
        cta_sync<kThreads>();
    }
}

/* Two consecutive outputs at element offset off: T, or fp8 e4m3 (c.o_fp8, c.o_scale). */
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
 * bmm2) into the item's slot.  l == 0 (no key): zeros and -inf; NaN stays NaN. */
template <typename T, int D>
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
        if (it.out_slot >= 0) {
            const float inv = l == 0.f ? 0.f : 1.f / l;
            float *dst = c.partial_o + ((int64_t)it.out_slot * c.tile_rows + r) * D + ln.q4 * 2;
#pragma unroll
            for (int n = 0; n < D / 8; ++n)
                __stcg(reinterpret_cast<float2 *>(dst + n * 8),
                       make_float2(a.o[n][2 * i] * inv, a.o[n][2 * i + 1] * inv));
            if (ln.q4 == 0)
                __stcg(c.partial_lse + (int64_t)it.out_slot * c.tile_rows + r, lse_keys);
        } else {
            const int h = it.head_begin + r % nh;
            const int64_t tok = (int64_t)rq.q_offset + it.q_begin + r / nh;
            const float lse = c.sinks ? logaddexp(lse_keys, c.sinks[h]) : lse_keys;
            const float f = l == 0.f ? 0.f : ctx.scale2 / l * expf(lse_keys - lse);
            const int64_t off = tok * c.out_stride_tok + h * c.out_stride_head + ln.q4 * 2;
#pragma unroll
            for (int n = 0; n < D / 8; ++n)
                store_out2<T>(c, off + n * 8, a.o[n][2 * i] * f, a.o[n][2 * i + 1] * f);
            if (c.lse && ln.q4 == 0)
                c.lse[tok * c.lse_stride_tok + h * c.lse_stride_head] = lse;
        }
    }
}

template <typename T, int D> struct GqaFamily {
    using G = Geo<D>;
    using Params = fi_gqa_params;
    using Merge = SplitMerge<D, kRows, OutDyn<T>, kThreads>;
    static constexpr int kThreads = figqa::kThreads;
    static constexpr int kProducerWarps = figqa::kProducerWarps;
    static constexpr size_t kSmemBytes = figqa::kSmemBytes;
    using State = Cursor;

    static __device__ __forceinline__ State setup(unsigned char *smem) {
        if (threadIdx.x == 0) {
            for (int i = 0; i < G::kStages; ++i) {
                mbar_init(G::full(smem, i), kProducerThreads);
                mbar_init(G::empty(smem, i), kThreads);
            }
            for (int b = 0; b < 2; ++b) {
                mbar_init(G::qfull(smem, b), kProducerThreads);
                mbar_init(G::qempty(smem, b), kThreads);
            }
            mbar_init_fence();
        }
        return Cursor{0, 0u, 0, 0u};
    }

    /* The producer warps: Q and every KV slice of every item of the CTA, in item order. */
    static __device__ void produce(const fi_gqa_params &p, const fi_cta_start &cs, unsigned char *smem) {
        Cursor cur{0, 0u, 0, 0u};
        const int pt = (int)threadIdx.x - kThreads;
        const int split = p.c.header->kv_split_pages, ppr = p.c.header->pages_per_row;
        fi_work_item it = cs.first;
        fi_request_info rq = cs.request;
        for (int i = cs.item_begin; i < cs.item_end; ++i) {
            fi_work_item nit = it;
            fi_request_info nrq = rq;
            if (i + 1 < cs.item_end) {
                nit = p.c.items[i + 1];
                nrq = p.c.requests[nit.request];
            }
            produce_q<T, D>(p, it, rq, smem, pt, cur);
            produce_kv<T, D>(p, it, rq, split, ppr, smem, pt, cur);
            it = nit;
            rq = nrq;
        }
    }

    /* The consumers: the item's slices (computing their own, releasing all), then the team
     * combine, the store, and for a split its arrival.  Returns 1 for a split merged
     * cooperatively later. */
    static __device__ bool run_item(const fi_gqa_params &p, const RunCtx &ctx, const fi_work_item &it,
                                    const fi_request_info &rq, unsigned char *smem, bool first,
                                    State &cur) {
        const int nh = it.head_end - it.head_begin, M = item_rows(it);
        const Lane ln = lane_of(threadIdx.x, M);
        int lo[2], hi[2];
        row_bounds(ctx, it, rq, M, nh, ln, lo, hi);
        Acc<D> a;
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
            a.o[n][0] = a.o[n][1] = a.o[n][2] = a.o[n][3] = 0.f;
        a.m[0] = a.m[1] = -CUDART_INF_F;
        a.l[0] = a.l[1] = 0.f;
        const bool active = ln.rg < ln.nrg;
        const T *sQ = G::template q<T>(smem, cur.qb);
        const uint32_t sQa = smem_u32(sQ + (ln.rg * 16 + (ln.lane & 15)) * G::kPitch + (ln.lane >> 4) * 8);
        mbar_wait(G::qfull(smem, cur.qb), cur.qphase);
        const int s0 = it.kv_begin & ~(kSlice - 1); /* slices aligned as produce_kv's */
        const int nsl = it.kv_end > it.kv_begin ? (it.kv_end - s0 + kSlice - 1) / kSlice : 0;
        for (int sl = 0; sl < nsl; ++sl) {
            mbar_wait(G::full(smem, cur.slot), cur.phase);
#ifndef FI_GQA_EXP_NOCOMPUTE
            if (active && (sl & (ln.W - 1)) == ln.tw)
#else
            if (false)
#endif
                compute_slice<T, D>(ctx, G::template slot<T>(smem, cur.slot), sQa, ln,
                                    s0 + sl * kSlice, lo, hi, a);
            /* Every lane arrives (racecheck does not follow a __syncwarp + one lane's
             * release: docs/DESIGN.md, sanitizer caveats). */
            mbar_arrive(G::empty(smem, cur.slot));
            cur.next_slot(G::kStages);
        }
        mbar_arrive(G::qempty(smem, cur.qb));
        cur.next_q();
        float mt[2], lt[2];
        combine_team<D>(smem, ln, a, mt, lt);
        if (active && ln.tw == 0)
            store_rows<T, D>(p, ctx, it, rq, M, nh, ln, a, mt, lt);
        if (it.out_slot < 0)
            return false;
        return Merge::arrive(p.c, ctx, it, reinterpret_cast<int *>(smem + G::kOffFlag),
                             reinterpret_cast<float *>(smem + G::kOffW),
                             reinterpret_cast<float *>(smem + G::kOffRow));
    }
};

}  // namespace figqa
