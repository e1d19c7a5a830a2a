/*
 * executor/mla/mla_wg8_tile.cuh - the MLA decode family's fp8 wgmma variant (sm_90a): q and
 * the KV cache fp8 e4m3 (`xqa_mla`, and `trtllm_batch_decode_with_kv_cache_mla` with q and
 * cache fp8), out bf16.  Both matmuls run on Hopper's fp8 tensor cores (wgmma k32 e4m3,
 * twice the 16-bit rate, half the shared-memory bytes a score).
 *
 * What it computes: as mla_wg_tile.cuh, with bmm1_scale / bmm2_scale folding the
 * quantisation scales (docs/DESIGN.md 9b), P rounded to e4m3 for P V.
 *
 * How: the schedule of mla_wg_tile.cuh (two consumer warpgroups that split the 512 output
 * columns and alternate 32-token blocks as owners of the scores; one producer warpgroup;
 * a ring of 4 blocks on full / empty mbarriers), on 8-bit operands:
 *  - Q [64 rows][576 B]: four 128-byte swizzled panels of ckv dims (8 KB each) and the
 *    kpe dims as a [64][64 B] panel in the 64-byte swizzle.  A ring block: K the same way
 *    for its 32 tokens (4 x 4 KB + 2 KB), then V^T (below, 16 KB), then P (2 x 2 KB): 38 KB.
 *  - fp8 wgmma reads both operands K-major, and V = ckv is token-major, so the producer
 *    writes each block's V transposed: V^T [512 rows][32 tokens] in the 32-byte swizzle.
 *    Producer warp p transposes ckv panel p (dims 128 p ..): lane l takes dims 128 p + 4 l
 *    .. + 3 of every token (one 32-bit load a token, conflict-free), 4 x 4 byte transposes
 *    by prmt, and writes dim 128 p + 4 l + i as V^T row 128 p + 32 i + l, so a warp's
 *    16-byte stores fill consecutive rows (conflict-free).  The output columns are thereby
 *    permuted within each 128, which the epilogue (store_rows) undoes; a thread's columns
 *    give runs of 4 consecutive dims.
 *  - The producer copies K by TMA where the block allows (fi_mla_params.tma_on and
 *    map_blocks: a producer warp's 8 tokens lie in one page; 4 ckv boxes and 1 kpe box
 *    of 8 rows each from one lane), else by 16-byte cp.async (a token's page from the
 *    page table, sparse slots through kv_at); either completes on the stage's `landed`
 *    barrier.  The scores wait only for `landed`; a block is transposed once the next
 *    one's copies are issued (produce_blocks says why not later) and `full` then says
 *    V^T is there, which only P V waits for: the transpose is off the scores' path.
 *  - S_b = Q K_b^T: 18 wgmma m64n32k32 (16 over the ckv panels, 2 over kpe).  The owner
 *    writes P_b = 2^8 exp2(S_b - m_b) as two e4m3 panels, P_hi and the rounding rest P_lo
 *    (the 2^8 keeps small weights above e4m3's subnormals; an exact power of two, undone
 *    on O and l at the end); O_w += P_b V_b^T: two wgmma m64n256k32 a warpgroup.
 * Sources: FlashAttention-3 (Shah et al. 2024: fp8 wgmma, in-kernel V transpose, P in
 * e4m3); FlashMLA's 2025 decode kernel write-up (the alternating schedule); the PTX ISA
 * (wgmma .e4m3, the swizzle modes).
 */
#pragma once

#include "executor/mla/mla_q.cuh"
#include "executor/mla/mla_wg_tile.cuh"

namespace fimlawg8 {
using namespace fi;
using fimlawg::Cursor;
using fimlawg::kBlockN;
using fimlawg::kDqk;
using fimlawg::kDv;
using fimlawg::kProducerThreads;
using fimlawg::kRows;
using fimlawg::kStages;
using fimlawg::kThreads;
using fimlawg::Lane;

/* setmaxnreg: 128 P + 256 C <= 168 x 384 (the launch allocation). */
constexpr int kProducerRegs = 88, kConsumerRegs = 200;
static_assert(kProducerThreads * kProducerRegs + 256 * kConsumerRegs <= 168 * 384, "setmaxnreg");
static_assert(kBlockN == 32 && kStages == 4, "32-token blocks, 4 stages");

constexpr uint32_t kQPanel = kRows * 128;                  /* [64][128 B] */
constexpr uint32_t kOffQpe = 4 * kQPanel;                  /* [64][64 B], 64-byte swizzle */
constexpr uint32_t kQBytes = kOffQpe + kRows * 64;         /* 36864 */
constexpr uint32_t kKPanel = kBlockN * 128;                /* [32][128 B] */
constexpr uint32_t kOffKpe = 4 * kKPanel;                  /* [32][64 B] */
constexpr uint32_t kOffVt = kOffKpe + kBlockN * 64;        /* [512][32 B], 32-byte swizzle */
constexpr uint32_t kOffP = kOffVt + kDv * 32;              /* [2][64][32 B], 32-byte swizzle */
constexpr uint32_t kPBytes = kRows * 32;                   /* one P panel: its e4m3 part, then the rest */
constexpr uint32_t kBlockBytes = kOffP + 2 * kPBytes;      /* 38912 */
static_assert(kQBytes % 1024 == 0 && kBlockBytes % 1024 == 0 && kOffVt % 1024 == 0 && kOffP % 256 == 0,
              "atoms aligned");

constexpr uint32_t kOffQ = 0;
constexpr uint32_t kOffRing = kQBytes;
using Sh8 = fimlawg::WgShared<kOffRing + kStages * kBlockBytes>;
constexpr int kDepth = 2; /* a block is transposed kDepth steps after its copies */

__device__ __forceinline__ uint32_t stage_at(uint32_t s0, int st) { return s0 + kOffRing + st * kBlockBytes; }

/* ---- producer ------------------------------------------------------------------------ */

/* Block b's K rows into stage st: warp pw's 8 tokens, lanes 4 j .. 4 j + 3 token j, lane
 * q = l % 4 the 16-byte chunks q, q + 4, .. of its 512 ckv bytes and chunk q of its 64 kpe
 * bytes; keys past the item or invalid sparse slots zero-filled.  pg: block_page. */
__device__ __forceinline__ void load_block(const fi_mla_params &p, const fi_work_item &it, uint32_t s0,
                                           int st, int b, int pt, int32_t pg, uint64_t pol) {
    const int lane = pt & 31, j = lane >> 2, q = lane & 3;
    const int tok = fimlawg::kTokPerWarp * (pt >> 5) + j, t = it.kv_begin + b * kBlockN + tok;
    const fimlawg::KvAt at = fimlawg::kv_at(p, __shfl_sync(0xffffffffu, pg, j), t, it.kv_end);
    const uint8_t *ckv = (const uint8_t *)p.m.ckv + at.page * p.m.ckv_stride_page + at.slot * p.m.ckv_stride_tok + 16 * q;
    const uint8_t *kpe = (const uint8_t *)p.m.kpe + at.page * p.m.kpe_stride_page + at.slot * p.m.kpe_stride_tok + 16 * q;
    const uint32_t base = stage_at(s0, st);
    const int n = at.in ? 16 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) { /* chunk c = q + 4 i: panel c / 8, chunk c % 8 of its row */
        const int c = q + 4 * i;
        cp_async16(base + (c >> 3) * kKPanel + sw128_8(tok, (c & 7) * 16), at.in ? ckv + 64 * i : (const uint8_t *)p.m.ckv, n, pol);
    }
    cp_async16(base + kOffKpe + sw64_8(tok, 16 * q), at.in ? kpe : (const uint8_t *)p.m.kpe, n, pol);
}

/* Producer warp pw's 8 tokens of block b of item it by tensor map, issued by one lane: 4
 * ckv boxes (8 rows x 128 bytes, 128-byte swizzle) and 1 kpe box (8 rows x 64 bytes,
 * 64-byte swizzle), the layout load_block computes by hand, on `bar` (whose transaction
 * count it raises first).  page: the page of the warp's first token. */
__device__ __forceinline__ void map_block(const fi_mla_params &p, const fi_work_item &it, uint32_t s0,
                                          int st, int b, int pw, int32_t page, uint32_t bar, uint64_t pol) {
    constexpr int kTok = fimlawg::kTokPerWarp;
    const int slot = (it.kv_begin + b * kBlockN + kTok * pw) & (p.c.page_size - 1);
    const uint32_t base = stage_at(s0, st);
    mbar_expect_tx_only(bar, 4 * kTok * 128 + kTok * 64);
#pragma unroll
    for (int i = 0; i < 4; ++i)
        tma_load_3d(base + i * kKPanel + kTok * pw * 128, &p.tma_ckv, 128 * i, slot, page, bar, pol);
    tma_load_3d(base + kOffKpe + kTok * pw * 64, &p.tma_kpe, 0, slot, page, bar, pol);
}

/* V^T of stage st from its ckv panels (header comment): warp pw panel pw, lane l dims
 * 128 pw + 4 l + i -> V^T rows 128 pw + 32 i + l, 32 token bytes each. */
__device__ __forceinline__ void transpose_v(uint32_t s0, int st, int pt) {
    const int lane = pt & 31, pw = pt >> 5;
    const uint32_t base = stage_at(s0, st), kp = base + pw * kKPanel;
    uint32_t row[4][8]; /* [dim i][token quad]: 4 tokens' bytes of dim 128 pw + 4 lane + i */
#pragma unroll
    for (int tq = 0; tq < 8; ++tq) {
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
            asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(w[k]) : "r"(kp + sw128_8(4 * tq + k, 4 * lane)));
        const uint32_t x0 = __byte_perm(w[0], w[1], 0x5140), x1 = __byte_perm(w[0], w[1], 0x7362);
        const uint32_t y0 = __byte_perm(w[2], w[3], 0x5140), y1 = __byte_perm(w[2], w[3], 0x7362);
        row[0][tq] = __byte_perm(x0, y0, 0x5410);
        row[1][tq] = __byte_perm(x0, y0, 0x7632);
        row[2][tq] = __byte_perm(x1, y1, 0x5410);
        row[3][tq] = __byte_perm(x1, y1, 0x7632);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int n = 128 * pw + 32 * i + lane;
        st_shared16(base + kOffVt + sw32_8(n, 0), make_uint4(row[i][0], row[i][1], row[i][2], row[i][3]));
        st_shared16(base + kOffVt + sw32_8(n, 16), make_uint4(row[i][4], row[i][5], row[i][6], row[i][7]));
    }
}

/* Every block of item it.  Step b transposes block b - kDepth (its copies had a step to
 * land while the producer waited on the ring), hands its V^T over (full), then copies
 * block b (landed).  Block b's slot frees only after both warpgroups' P V of block b - 4,
 * so that block's V^T must come before the wait for the slot: kDepth <= 4 (the scores
 * wait for K alone, so V^T is the one thing the ring waits for from here).  Advances cur
 * by the item's blocks. */
__device__ __forceinline__ void produce_blocks(const fi_mla_params &p, const fi_work_item &it,
                                               const fi_request_info &rq, uint32_t s0, int pt,
                                               Cursor &cur, int nblk) {
    Cursor ld = cur;
    int32_t pg = nblk > 0 ? fimlawg::block_page(p, it, rq, 0, pt) : 0;
    const uint64_t pol = l2_evict_first(kv_l2_fraction(p.c, it, rq));
    const int nmap = fimlawg::map_blocks(p, it);
    for (int b = 0; b < nblk + kDepth; ++b) {
        if (b >= kDepth) {
            mbar_wait(Sh8::landed(s0, cur.st), cur.ph); /* every producer thread's copies */
            transpose_v(s0, cur.st, pt);
            fence_proxy_async(); /* V^T: ordinary stores, read by wgmma */
            mbar_arrive(Sh8::full(s0, cur.st));
            cur.next();
        }
        if (b < nblk) {
            /* the next block's pages travel while this one waits for its slot */
            const int32_t pn = b + 1 < nblk ? fimlawg::block_page(p, it, rq, b + 1, pt) : 0;
            mbar_wait(Sh8::empty(s0, ld.st), ld.ph ^ 1u);
            const uint32_t landed = Sh8::landed(s0, ld.st);
            if (b < nmap) { /* warp-uniform; every producer thread arrives either way */
                if ((pt & 31) == 0)
                    map_block(p, it, s0, ld.st, b, pt >> 5, pg, landed, pol);
                mbar_arrive(landed);
            } else {
                load_block(p, it, s0, ld.st, b, pt, pg, pol);
                cp_async_mbar_arrive(landed);
            }
            pg = pn;
            ld.next();
        }
    }
}

/* ---- consumers ----------------------------------------------------------------------- */

/* S = Q K^T over the 576 dims of stage st: 16 wgmma m64n32k32 over the ckv panels, 2 over
 * kpe (one commit group). */
__device__ __forceinline__ void issue_scores(float *S, uint32_t s0, int st) {
    const uint32_t kb = stage_at(s0, st);
    const WgDesc dq = wg_desc_base(s0 + kOffQ, 16, 1024);
    const WgDesc dk = wg_desc_base(kb, 16, 1024);
    const WgDesc dqp = wg_desc_base(s0 + kOffQpe, 16, 512, 2);
    const WgDesc dkp = wg_desc_base(kb + kOffKpe, 16, 512, 2);
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i)
        S[i] = 0.f;
    wg_pin<kBlockN / 2>(S); /* (C7515, as mla_wg_tile.cuh) */
    wg_fence();
#pragma unroll
    for (int k = 0; k < 16; ++k)
        Wgmma8<32>::ss(S, dq.at((k >> 2) * kQPanel + (k & 3) * 32), dk.at((k >> 2) * kKPanel + (k & 3) * 32), k > 0);
#pragma unroll
    for (int k = 0; k < 2; ++k)
        Wgmma8<32>::ss(S, dqp.at(k * 32), dkp.at(k * 32), 1);
    wg_commit();
}

/* O_w += P V = P_hi V + P_lo V: the two e4m3 panels of P [64][32] of stage st, V^T rows
 * 256 w .. 256 w + 255 (one k32 step each, one commit group). */
__device__ __forceinline__ void issue_pv(float *O, uint32_t s0, int st, int w) {
    const uint32_t kb = stage_at(s0, st);
    const WgDesc dp = wg_desc_base(kb + kOffP, 16, 256, 3);
    const WgDesc dv = wg_desc_base(kb + kOffVt + w * 256 * 32, 16, 256, 3);
    wg_pin<128>(O);
    wg_fence();
    Wgmma8<256>::ss(O, dp.at(0), dv.at(0), 1);
    Wgmma8<256>::ss(O, dp.at(kPBytes), dv.at(0), 1);
    wg_commit();
}

/* P for softmax_block: the thread's weights (P x 2^8) of columns c, c + 1 in rows r0 and
 * r0 + 8 as two e4m3 panels of stage st, P_hi = e4m3(P) and P_lo = e4m3(P - P_hi), so
 * P V carries P to ~2^-8 relative (P_hi alone, 2^-4, left rows of a few keys at 2e-2). */
__device__ __forceinline__ void put_p(unsigned char *smem, int st, int r0, int c, float p0, float p1,
                                      float p2, float p3) {
    unsigned char *pp = smem + kOffRing + st * kBlockBytes + kOffP;
    const uint16_t h0 = e4m3x2(p0, p1), h1 = e4m3x2(p2, p3);
    const uint32_t b0 = e4m3x2_to_f16x2(h0), b1 = e4m3x2_to_f16x2(h1);
    const float2 q0 = __half22float2(*reinterpret_cast<const __half2 *>(&b0));
    const float2 q1 = __half22float2(*reinterpret_cast<const __half2 *>(&b1));
    *reinterpret_cast<uint16_t *>(pp + sw32_8(r0, c)) = h0;
    *reinterpret_cast<uint16_t *>(pp + sw32_8(r0 + 8, c)) = h1;
    *reinterpret_cast<uint16_t *>(pp + kPBytes + sw32_8(r0, c)) = e4m3x2(p0 - q0.x, p1 - q0.y);
    *reinterpret_cast<uint16_t *>(pp + kPBytes + sw32_8(r0 + 8, c)) = e4m3x2(p2 - q1.x, p3 - q1.y);
}

/* The thread's rows of its 256 columns in natural dim order: O[4 jj + 2 i + e] is
 * accumulator column n = 256 w + 8 jj + 2 q4 + e, which holds dim 128 (n / 128) + 4 (n %
 * 32) + (n / 32) % 4 (V^T's row order, header); for jj = 16 h + 4 k + a (k = 0..3) those
 * are the consecutive dims 128 (2 w + h) + 32 a + 8 q4 + 4 e + k.  Partials (a split item)
 * as fp32 quads, outputs as bf16 pairs; the rows and the lse as store_acc_rows (run_ctx.cuh)
 * handles them, written out here: built on store_acc_rows' row loop through a callback,
 * this kernel spilled 16-20 bytes at its setmaxnreg 88 / 200. */
__device__ __forceinline__ void store_rows(const fi_mla_params &p, const RunCtx &ctx,
                                           const fi_work_item &it, const fi_request_info &rq,
                                           int nh, int M, const Lane &ln, const float *O,
                                           const float *m, const float *l) {
    const fi_exec_common &c = p.c;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = ln.r0 + 8 * i;
        if (r >= M)
            continue;
        const float lse_keys = row_lse_keys(m[i], l[i]);
        const bool split = it.out_slot >= 0;
        float f;
        int64_t off;
        if (split) {
            f = l[i] == 0.f ? 0.f : 1.f / l[i];
            off = ((int64_t)it.out_slot * c.tile_rows + r) * kDv;
            if (ln.w == 0 && ln.q4 == 0)
                __stcg(c.partial_lse + (int64_t)it.out_slot * c.tile_rows + r, lse_keys);
        } else {
            const OutRow o = out_row(c, ctx, it, rq, nh, r, lse_keys, l[i]);
            f = o.f;
            off = o.tok * c.out_stride_tok + o.h * c.out_stride_head;
            if (c.lse && ln.w == 0 && ln.q4 == 0)
                c.lse[o.tok * c.lse_stride_tok + o.h * c.lse_stride_head] = o.lse;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int d = 128 * (2 * ln.w + h) + 32 * a + 8 * ln.q4 + 4 * e;
                    float v[4];
#pragma unroll
                    for (int k = 0; k < 4; ++k)
                        v[k] = O[4 * (16 * h + 4 * k + a) + 2 * i + e] * f;
                    if (split) {
                        __stcg(reinterpret_cast<float4 *>(c.partial_o + off + d), make_float4(v[0], v[1], v[2], v[3]));
                    } else {
                        __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(c.out) + off + d;
                        *reinterpret_cast<uint32_t *>(out) = Dt<__nv_bfloat16>::pack(v[0], v[1]);
                        *reinterpret_cast<uint32_t *>(out + 2) = Dt<__nv_bfloat16>::pack(v[2], v[3]);
                    }
                }
    }
}

/* The fp8 body's pieces for fimlawg::wg_run_item. */
struct Ops8 {
    using Sh = Sh8;
    /* 8 loads in flight in a one-unit merge slice (16 spilled 96 / 192 bytes there) */
    using Merge = SplitMerge<kDv, kRows, __nv_bfloat16, kThreads, false, 1 << 30, 8>;
    static constexpr int kPLog2 = 8;          /* P x 2^8: small weights stay above e4m3's subnormals */
    static constexpr int kLazyLog2 = 0;       /* no lazy max: P x 2^8 x 2^margin would pass e4m3's 448 */
    static constexpr bool kPOverKpe = false;  /* P has panels of its own */
    /* Scores need only the block's K (landed); P V waits for the V^T the producer writes
     * after (full). */
    static __device__ __forceinline__ uint32_t k_ready(uint32_t s0, int st) { return Sh::landed(s0, st); }
    static __device__ __forceinline__ void wait_v(uint32_t s0, int st, uint32_t parity) {
        mbar_wait(Sh::full(s0, st), parity);
        fence_proxy_async();
    }
    static __device__ __forceinline__ void scores(float *S, uint32_t s0, int st) { issue_scores(S, s0, st); }
    static __device__ __forceinline__ void pv(float *O, uint32_t s0, int st, int w) { issue_pv(O, s0, st, w); }
    static __device__ __forceinline__ void put_p(unsigned char *smem, int st, int r0, int c, float p0,
                                                 float p1, float p2, float p3) {
        fimlawg8::put_p(smem, st, r0, c, p0, p1, p2, p3);
    }
    /* P carried 2^8: back to the weights' scale for the LSE, the sinks and the merge. */
    static __device__ __forceinline__ void finish(float *O, float *l) {
#pragma unroll
        for (int i = 0; i < 128; ++i)
            O[i] *= 1.f / 256.f;
        l[0] *= 1.f / 256.f;
        l[1] *= 1.f / 256.f;
    }
    static __device__ __forceinline__ void store(const fi_mla_params &p, const RunCtx &ctx, const fi_work_item &it,
                                                 const fi_request_info &rq, int nh, int M, const Lane &ln,
                                                 const float *O, const float *m, const float *l) {
        store_rows(p, ctx, it, rq, nh, M, ln, O, m, l);
    }
};

/* The family: q and cache fp8 e4m3, out bf16. */
struct MlaWg8Family {
    using Params = fi_mla_params;
    using Merge = Ops8::Merge;
    static constexpr int kThreads = fimlawg::kThreads;
    static constexpr int kProducerWarps = fimlawg::kProducerWarps;
    static constexpr int kConsumerRegs = fimlawg8::kConsumerRegs;
    static constexpr uint32_t kEmptyArrivals = kThreads; /* as mla_wg_tile.cuh */
    static constexpr size_t kSmemBytes = Sh8::kEnd;
    using State = Cursor;

    static __device__ __forceinline__ State setup(unsigned char *smem) {
        if (threadIdx.x == 0)
            Sh8::init<true>(smem_u32(smem), kEmptyArrivals);
        return Cursor{0, 0u, 0u};
    }

    static __device__ void produce(const fi_mla_params &p, const fi_cta_start &cs, unsigned char *smem) {
        setmaxnreg_dec<kProducerRegs>();
        const uint32_t s0 = smem_u32(smem);
        const int pt = (int)threadIdx.x - kThreads;
        Cursor cur{0, 0u, 0u};
        for_each_item(p.c, cs, [&](const fi_work_item &it, const fi_request_info &rq) {
            mbar_wait(Sh8::qempty(s0), cur.qph ^ 1u);
            fimlaq::produce_q_e4m3<kRows, kProducerThreads>(p, it, rq, s0 + kOffQ, pt);
            cp_async_mbar_arrive(Sh8::qfull(s0));
            cur.qph ^= 1u;
            produce_blocks(p, it, rq, s0, pt, cur, fimlawg::blocks_of(it));
        });
    }

    static __device__ bool run_item(const fi_mla_params &p, const RunCtx &ctx, const fi_work_item &it,
                                    const fi_request_info &rq, unsigned char *smem, bool first,
                                    State &cur) {
        return fimlawg::wg_run_item<Ops8>(p, ctx, it, rq, smem, first, cur);
    }
};

}  // namespace fimlawg8
