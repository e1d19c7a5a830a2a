/*
 * executor/cuda/common/run_ctx.cuh - per-launch constants every item of a CTA uses,
 * read once after griddepcontrol.wait from the common block and the plan header, and the
 * softmax helpers shared by tile bodies and the split merge.
 */
#pragma once

#include <math_constants.h>

#include "executor/core/exec_params.h"
#include "executor/cuda/common/dtype.cuh"
#include "executor/cuda/common/ptx.cuh"
#include "plan/mask.h"

namespace fi {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct RunCtx {
    float scale_log2;  /* bmm1_scale * log2(e): logits in the exp2 domain */
    float scale2;      /* bmm2_scale */
    int causal;        /* plan header: the mask rule's inputs (plan/mask.h) */
    int window_left;
};

/* Global reads: call after griddepcontrol.wait (scales and header may come from the
 * previous kernel). */
__device__ __forceinline__ RunCtx run_ctx(const fi_exec_common &c) {
    RunCtx ctx;
    ctx.scale_log2 = (c.bmm1_scale_ptr ? *c.bmm1_scale_ptr : c.bmm1_scale) * kLog2e;
    ctx.scale2 = c.bmm2_scale_ptr ? *c.bmm2_scale_ptr : c.bmm2_scale;
    ctx.causal = c.header->causal;
    ctx.window_left = c.header->window_left;
    return ctx;
}

/* The fraction of item it's KV lines to bring into the L2 evict-first (l2_evict_first): 1
 * when the item is the only tile that reads its keys (it holds every query head of its KV
 * head and every query row of request rq; the other pieces of a split tile read other
 * keys), or when the plan's longest CTA stream is short (header->max_cta_cost <=
 * c.kv_evict_first_cost, about 2 MB of KV); else 0; never when c.kv_evict_first_cost < 0.
 * Evict-first keeps what the L2 holds for others (code, the work list, partials, the
 * kernels around this one) against a stream no one reads again.  Sole readers gained
 * 0.3-3% whatever their length, after a read flush and back to back (H200: GQA B128 x 4096
 * bf16 -1%, fp8 -1.5%, the trace snapshot -2 to -3%, NVFP4 -0.8%); where two tiles read
 * the same keys (MLA heads 128: two 64-row tiles a request) the second read then missed
 * the L2 (+2-4%), so those keep the short-stream rule (docs/perf-log.md, seventh, eighth
 * and thirty-fourth sessions).  kv_l2_fraction_short is that rule alone (the MLA
 * mma.sync body's, mla_tile.cuh).  Read from the plan region and the item, so a captured
 * graph follows the plan of each replay. */
__device__ __forceinline__ float kv_l2_fraction_short(const fi_exec_common &c) {
    return c.header->max_cta_cost <= (int64_t)c.kv_evict_first_cost ? 1.0f : 0.0f; /* -1: never */
}
__device__ __forceinline__ float kv_l2_fraction(const fi_exec_common &c, const fi_work_item &it,
                                                const fi_request_info &rq) {
    if (c.kv_evict_first_cost < 0)
        return 0.0f;
    const bool sole = it.head_end - it.head_begin == c.kv_group && it.q_begin == 0 && it.q_end == rq.q_len;
    return sole ? 1.0f : kv_l2_fraction_short(c);
}

/* Visit a CTA's items in order: fn(item, its request row, the next item, its request row,
 * whether there is a next), the next pair loaded while the current one is visited (a
 * producer's walk; the persistent loop does the same).  The next pair is in flight when fn
 * starts: read it late in fn (a prefetch of the next item's page-table lines). */
template <class Fn>
__device__ __forceinline__ void for_each_item_ahead(const fi_exec_common &c, const fi_cta_start &cs, Fn &&fn) {
    fi_work_item it = cs.first;
    fi_request_info rq = cs.request;
    for (int i = cs.item_begin; i < cs.item_end; ++i) {
        fi_work_item nit = it;
        fi_request_info nrq = rq;
        const bool more = i + 1 < cs.item_end;
        if (more) {
            nit = c.items[i + 1];
            nrq = c.requests[nit.request];
        }
        fn(it, rq, nit, nrq, more);
        it = nit;
        rq = nrq;
    }
}

/* The same walk, fn(item, its request row).  Kept apart from for_each_item_ahead (not a
 * wrapper of it): the MLA and context producers then compile to the PTX they were measured
 * with. */
template <class Fn>
__device__ __forceinline__ void for_each_item(const fi_exec_common &c, const fi_cta_start &cs, Fn &&fn) {
    fi_work_item it = cs.first;
    fi_request_info rq = cs.request;
    for (int i = cs.item_begin; i < cs.item_end; ++i) {
        fi_work_item nit = it;
        fi_request_info nrq = rq;
        if (i + 1 < cs.item_end) {
            nit = c.items[i + 1];
            nrq = c.requests[nit.request];
        }
        fn(it, rq);
        it = nit;
        rq = nrq;
    }
}

/* Key bounds [lo, hi] (inclusive) of a thread's two rows r0 and r0 + dr of item it (M
 * rows, nh heads a query row, q-major), clipped to the item's KV range: the mask rule of
 * plan/mask.h; rows past M see nothing. */
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

/* Whether keys t0 .. t1 all lie inside both rows' bounds [lo[i], hi[i]] (row_bounds): a
 * block of keys that does skips the per-score mask test. */
__device__ __forceinline__ bool keys_inside(const int *lo, const int *hi, int t0, int t1) {
    return t0 >= lo[0] && t0 >= lo[1] && t1 <= hi[0] && t1 <= hi[1];
}

/* The running-max step of online softmax (FlashAttention-2, Dao 2023; log2 units) for a
 * thread's two accumulator rows and one KV block.  kLazyLog2 > 0: the lazy max of
 * FlashAttention-4 (Dao et al., 2025), whose rescale is conditional: a row's max moves
 * only when the block's max passes it by more than kLazyLog2, so exp2(S - m) <=
 * 2^kLazyLog2 and alpha is exactly 1 on most blocks (the caller then skips O's rescale).
 * mloc [2]: the thread's row maxima of the block's scores, reduced here over the quad
 * (the four lanes holding a row).  kPos: the scores are raw (bmm1_scale > 0) and their
 * max is scaled here by sl = log2(e) x bmm1_scale; otherwise they are scaled already.
 * m [2] (in / out): the running max; alpha [2]: exp2(m_old - m_new), the rescale of O
 * and of the row sums; mu [2]: the max the block's exponents subtract (0 while a row has
 * no key: never -inf - -inf = NaN); rs [2]: cleared (the block's row sums). */
template <bool kPos, int kLazyLog2 = 0>
__device__ __forceinline__ void row_max_step(float *mloc, float sl, float *m, float *alpha,
                                             float *mu, float *rs) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        mloc[i] = fmaxf(mloc[i], __shfl_xor_sync(0xffffffffu, mloc[i], 1));
        mloc[i] = fmaxf(mloc[i], __shfl_xor_sync(0xffffffffu, mloc[i], 2));
        const float cand = kPos ? mloc[i] * sl : mloc[i];
        /* (-inf + margin = -inf: a row's first keys always set its max; NaN never does) */
        const float mn = kLazyLog2 == 0 ? fmaxf(m[i], cand)
                                        : (cand > m[i] + (float)kLazyLog2 ? cand : m[i]);
        mu[i] = mn == -CUDART_INF_F ? 0.f : mn;
        alpha[i] = ex2_ftz(m[i] - mu[i]);
        m[i] = mn;
        rs[i] = 0.f;
    }
}

/* log(exp(a) + exp(b)) without overflow; -inf + -inf = -inf (never NaN). */
__device__ __forceinline__ float logaddexp(float a, float b) {
    const float m = fmaxf(a, b);
    if (m == -CUDART_INF_F)
        return -CUDART_INF_F;
    return m + logf(expf(a - m) + expf(b - m));
}

/* A row's LSE over its keys (natural log) from its running max m_i (log2 units) and full
 * sum l_i; l_i == 0 (not l_i > 0): a NaN sum keeps the row's lse NaN. */
__device__ __forceinline__ float row_lse_keys(float m_i, float l_i) {
    return l_i == 0.f ? -CUDART_INF_F : (m_i + log2f(l_i)) * kLn2;
}

/* Where and how an unsplit item's row r goes out: its token and head, its LSE with the
 * sink (lse = logaddexp(lse_keys, sink)) and the factor f = bmm2 / l x exp(lse_keys - lse)
 * that turns the row's accumulator into out (row_lse_keys, the row's full sum l_i). */
struct OutRow {
    int64_t tok;
    int h;
    float lse, f;
};
__device__ __forceinline__ OutRow out_row(const fi_exec_common &c, const RunCtx &ctx,
                                          const fi_work_item &it, const fi_request_info &rq,
                                          int nh, int r, float lse_keys, float l_i) {
    OutRow o;
    o.h = it.head_begin + r % nh;
    o.tok = (int64_t)rq.q_offset + it.q_begin + r / nh;
    o.lse = c.sinks ? logaddexp(lse_keys, c.sinks[o.h]) : lse_keys;
    o.f = l_i == 0.f ? 0.f : ctx.scale2 / l_i * expf(lse_keys - o.lse);
    return o;
}

/* Store a thread's two rows r0 and r0 + 8 of a wgmma accumulator O (columns 8 j + 2 q4
 * + {0, 1} in O[4 j + 2 i ..], j < kCols / 8) at output column col of item it (M rows, nh
 * heads a query row, q-major): unsplit, out = bmm2 * O / l * exp(lse_keys - lse) with lse
 * = logaddexp(lse_keys, sink) through store(element offset, x, y); split, the fp32 partial
 * O / l and lse_keys (no sink, no bmm2) into the item's slot, rows of kWidth floats.
 * lse_writer: the one thread of a row that writes its LSE.  m, l: the rows' running max
 * (log2 units) and full sums.  Shared by the wgmma tile bodies (MLA, context); NVFP4 out of
 * an unsplit item: store_acc_rows_nvfp4. */
template <int kCols, int kWidth, class Store>
__device__ __forceinline__ void store_acc_rows(const fi_exec_common &c, const RunCtx &ctx,
                                               const fi_work_item &it, const fi_request_info &rq,
                                               int nh, int M, int r0, int col, bool lse_writer,
                                               const float *O, const float *m, const float *l,
                                               Store store) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = r0 + 8 * i;
        if (r >= M)
            continue;
        const float lse_keys = row_lse_keys(m[i], l[i]);
        if (it.out_slot >= 0) {
            const float inv = l[i] == 0.f ? 0.f : 1.f / l[i];
            float *dst = c.partial_o + ((int64_t)it.out_slot * c.tile_rows + r) * kWidth + col;
#pragma unroll
            for (int j = 0; j < kCols / 8; ++j)
                __stcg(reinterpret_cast<float2 *>(dst + 8 * j),
                       make_float2(O[4 * j + 2 * i] * inv, O[4 * j + 2 * i + 1] * inv));
            if (lse_writer)
                __stcg(c.partial_lse + (int64_t)it.out_slot * c.tile_rows + r, lse_keys);
        } else {
            const OutRow o = out_row(c, ctx, it, rq, nh, r, lse_keys, l[i]);
            const int64_t off = o.tok * c.out_stride_tok + o.h * c.out_stride_head + col;
#pragma unroll
            for (int j = 0; j < kCols / 8; ++j)
                store(off + 8 * j, O[4 * j + 2 * i] * o.f, O[4 * j + 2 * i + 1] * o.f);
            if (c.lse && lse_writer)
                c.lse[o.tok * c.lse_stride_tok + o.h * c.lse_stride_head] = o.lse;
        }
    }
}

/* store_acc_rows for an unsplit item (it.out_slot < 0) whose out is NVFP4 (c.o_fp4): the
 * same rows and scaling (bmm2, sink); block b of a row (columns 16 b .. 16 b + 15 past
 * col & ~7) is O[4 j + 2 i + {0, 1}] of j = 2 b and 2 b + 1 over the quad's lanes (lane q4
 * holds columns 8 j + 2 q4 + {0, 1}: nvfp4_quad_block), so its codes land in bytes 8 b +
 * q4 (j = 2 b) and 8 b + 4 + q4 (j = 2 b + 1) of the row; lane q4 = 0 writes the scale.
 * Unrolled with constant indices into O: nothing goes through local memory. */
template <int kCols>
__device__ __forceinline__ void store_acc_rows_nvfp4(const fi_exec_common &c, const RunCtx &ctx,
                                                     const fi_work_item &it, const fi_request_info &rq,
                                                     int nh, int M, int r0, int col, bool lse_writer,
                                                     const float *O, const float *m, const float *l) {
    static_assert(kCols % 16 == 0, "NVFP4 blocks of 16 columns");
    const int base = col & ~7, q4 = (col & 7) >> 1;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const bool store = r0 + 8 * i < M; /* a row past M: computed, not stored */
        const OutRow o = out_row(c, ctx, it, rq, nh, min(r0 + 8 * i, M - 1),
                                 row_lse_keys(m[i], l[i]), l[i]);
        const float f = o.f;
        uint8_t *ob = static_cast<uint8_t *>(c.out) +
                      ((o.tok * c.out_stride_tok + o.h * c.out_stride_head + base) >> 1) + q4;
        uint8_t *sb = c.o_sf + o.tok * c.o_sf_stride_tok + o.h * c.o_sf_stride_head + (base >> 4);
#pragma unroll
        for (int b = 0; b < kCols / 16; ++b) {
            const float x[4] = {O[8 * b + 2 * i] * f, O[8 * b + 2 * i + 1] * f,
                                O[8 * b + 4 + 2 * i] * f, O[8 * b + 4 + 2 * i + 1] * f};
            uint32_t sf;
            const uint32_t codes = nvfp4_quad_block<true>(x, c.o_sf_scale, &sf);
            if (store) {
                ob[8 * b] = (uint8_t)codes;
                ob[8 * b + 4] = (uint8_t)(codes >> 8);
                if (q4 == 0)
                    sb[b] = (uint8_t)sf;
            }
        }
        if (store && c.lse && lse_writer)
            c.lse[o.tok * c.lse_stride_tok + o.h * c.lse_stride_head] = o.lse;
    }
}

}  // namespace fi
