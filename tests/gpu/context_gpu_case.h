/*
 * tests/gpu/context_gpu_case.h - one context (prefill) attention problem
 * (trtllm_batch_context_with_kv_cache, FI_KIND_CONTEXT) on the GPU and on the fp64
 * reference, shared by tests/gpu/test_context_gpu.c and bench/bench_context.c (header-only,
 * static inline).
 *
 * The case is a gqa_case (tests/gpu/gqa_gpu_case.h) of kind FI_KIND_CONTEXT, so the paged
 * KV cache and its four device forms (NHD / HND, one tensor / (K, V) pair, padded pages),
 * q, out (the q dtype or fp8 e4m3 with o_scale), lse, sinks, scales (values or device
 * pointers), the NaN poison and the device plan are the decode case's.  What is its own:
 *   - requests of any q_len >= 0 (thousands of rows) over kv_len >= q_len keys, the query
 *     block aligned to the end of the KV range (cached prefix kv_len - q_len), causal unless
 *     gqa_opts.non_causal; batch form CUM_SEQ_LENS (cum_seq_lens_q / cum_seq_lens_kv +
 *     block_tables [B, P], or [B, 2, P] with kv_split_pages) unless gqa_opts.form says
 *     INDPTR or BLOCK_TABLES;
 *   - which rows are checked against the fp64 truth (ctx_block): a request's whole query
 *     block when its reference is cheap (CTX_FULL_MACS multiply-adds), else blocks of
 *     CTX_SAMPLE_ROWS rows at its first, middle and last rows, at the first two and the last
 *     tile starts of the plan's items (where a tile's rows change) and at two random rows;
 *     every output element and lse is still checked for the poison (full coverage);
 *   - the truth of those blocks (ctx_case_reference): ONE fi_naive_attention call over
 *     sub-requests, block [i0, i1) of request b becoming a request of i1 - i0 rows whose rows
 *     sit where they sat (causal: kv_len - q_len + i1 keys; non-causal: kv_len keys and the
 *     window shifted by q_len - i1, one call per block when windowed), on the canonical
 *     host cache through the request's own page-table row (no copy, no dequantisation: the
 *     reference reads bf16 / fp16 / e4m3 itself; an NVFP4 cache, which it does not read, is
 *     dequantised once to fp32, e2m1 x e4m3 scale, by gqa_case_dequantised_kv);
 *   - request lengths from the bundled trace (prefill with and without a cached prefix,
 *     mixed prefill chunks + decodes) and the FLOPs of a batch.
 * Tolerances are the decode case's (gqa_case_tol): per (token, head) row ||out - ref|| /
 * ||ref|| <= 1e-2 for bf16 / fp16 out, 7e-2 for fp8 out (after x o_scale); lse within 1e-2
 * absolute, -inf exactly where the reference is -inf; no NaN / inf anywhere.
 */
#ifndef FI_TESTS_GPU_CONTEXT_GPU_CASE_H
#define FI_TESTS_GPU_CONTEXT_GPU_CASE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gqa_gpu_case.h"
#include "viz/trace.h"

#define CTX_FULL_MACS (1ll << 28) /* a request whose reference costs more is sampled */
#define CTX_SAMPLE_ROWS 4         /* rows of a sampled block */
#define CTX_MAX_STARTS 8          /* sampled blocks a request (before merging) */

/* Rows [i0, i1) of request b: checked against the fp64 truth. */
typedef struct ctx_block {
    int32_t b, i0, i1;
} ctx_block;

typedef struct ctx_case {
    gqa_case g;         /* batch, inputs, device buffers, plan, outputs, ref_out / ref_lse
                           ([tokens, H_q, D] / [tokens, H_q]: written at the checked rows) */
    ctx_block *blocks;  /* [n_blocks] in request, then row order, disjoint */
    int32_t n_blocks;
    int64_t rows_checked; /* query tokens in the blocks */
    double ref_macs;      /* multiply-adds of their reference */
} ctx_case;

/* Context options: H_q / H_kv heads, head_dim d, page_size ps; bf16, CUM_SEQ_LENS, causal,
 * NHD one tensor, lse returned, everything else off. */
static inline gqa_opts ctx_default_opts(int32_t hq, int32_t hkv, int32_t d, int32_t ps) {
    gqa_opts o;
    memset(&o, 0, sizeof o);
    o.kind = FI_KIND_CONTEXT;
    o.form = FI_FORM_CUM_SEQ_LENS;
    o.dtype = FI_DTYPE_BF16;
    o.heads_q = hq;
    o.heads_kv = hkv;
    o.head_dim = d;
    o.page_size = ps;
    o.return_lse = 1;
    return o;
}

/* Keys row i of a request (q_len rows, kv_len keys) sees under the batch's causal and
 * window_left: fiattn.h's rule (position p = kv_len - q_len + i; keys [max(0, p -
 * window_left), causal ? p + 1 : kv_len), clipped to [0, kv_len)). */
static inline int64_t ctx_row_keys(const fi_batch *bt, int32_t q_len, int32_t kv_len, int32_t i) {
    const int64_t p = (int64_t)kv_len - q_len + i;
    int64_t lo = bt->window_left >= 0 ? p - bt->window_left : 0, hi = kv_len;
    if (lo < 0) lo = 0;
    if (bt->causal && p + 1 < hi) hi = p + 1;
    return hi > lo ? hi - lo : 0;
}

/* Keys seen summed over rows [i0, i1) of request b (one head). */
static inline double ctx_keys_seen(const gqa_case *c, int32_t b, int32_t i0, int32_t i1) {
    double keys = 0;
    for (int32_t i = i0; i < i1; i++)
        keys += (double)ctx_row_keys(&c->fb.batch, c->fb.q_lens[b], c->fb.kv_lens[b], i);
    return keys;
}

/* FLOPs of the batch, causal keys counted once: 4 x D x sum over (query token, query head)
 * rows of the keys the row sees (Q K^T and P V, 2 flops a multiply-add). */
static inline double ctx_case_flops(const gqa_case *c) {
    double keys = 0;
    for (int32_t b = 0; b < c->B; b++) keys += ctx_keys_seen(c, b, 0, c->fb.q_lens[b]);
    return 4.0 * c->o.head_dim * c->o.heads_q * keys;
}

/* Request b's page ids in the host page table: its K row (half 0) or V row (half 1, a
 * [B, 2, P] table; else the K row again). */
static inline const int32_t *ctx_request_pages(const gqa_case *c, int32_t b, int half) {
    const fi_batch *bt = &c->fb.batch;
    if (bt->form == FI_FORM_INDPTR) return c->fb.page_table + bt->kv_indptr[b];
    const int64_t rows = bt->kv_split_pages ? 2 : 1;
    return c->fb.page_table + ((int64_t)b * rows + (bt->kv_split_pages ? half : 0)) * c->P;
}

/* qsort order of int32 row indices. */
static inline int ctx_cmp_int32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* Starts of the sampled blocks of request b (q_len ql) into s[CTX_MAX_STARTS]: rows 0,
 * middle, last, the first two and the last tile start > 0 of the plan's items of b, two
 * random rows.  Returns the count. */
static inline int ctx_sample_starts(const gqa_case *c, int32_t b, int32_t ql, tt_rng *rng,
                                    int32_t *s) {
    int n = 0;
    s[n++] = 0;
    s[n++] = ql / 2 - CTX_SAMPLE_ROWS / 2;
    s[n++] = ql - CTX_SAMPLE_ROWS;
    int32_t first = INT32_MAX, second = INT32_MAX, last = 0; /* tile starts > 0 */
    fi_plan_view v;
    if (c->plan && fi_plan_get_view(c->plan, &v) == FI_OK)
        for (int32_t k = 0; k < v.header->num_items; k++) {
            const int32_t q0 = v.items[k].q_begin;
            if (v.items[k].request != b || q0 <= 0) continue;
            if (q0 < first) {
                second = first;
                first = q0;
            } else if (q0 > first && q0 < second) {
                second = q0;
            }
            if (q0 > last) last = q0;
        }
    const int32_t tiles[3] = {first, second, last};
    for (int k = 0; k < 3; k++) /* the rows either side of a tile start */
        if (tiles[k] > 0 && tiles[k] < INT32_MAX) s[n++] = tiles[k] - CTX_SAMPLE_ROWS / 2;
    s[n++] = tt_rng_int(rng, 0, ql - 1);
    s[n++] = tt_rng_int(rng, 0, ql - 1);
    return n;
}

/* Append request b's blocks to x->blocks (room for CTX_MAX_STARTS more): its whole query
 * block when full or its reference costs <= CTX_FULL_MACS, else the sampled blocks (starts
 * clamped into [0, ql), overlapping ones merged). */
static inline void ctx_add_request_blocks(ctx_case *x, int32_t b, int full, tt_rng *rng) {
    const gqa_case *c = &x->g;
    const int32_t ql = c->fb.q_lens[b];
    if (ql <= 0) return;
    const double per_key = 2.0 * c->o.heads_q * c->o.head_dim;
    if (full || ctx_keys_seen(c, b, 0, ql) * per_key <= (double)CTX_FULL_MACS) {
        x->blocks[x->n_blocks++] = (ctx_block){b, 0, ql};
        return;
    }
    int32_t s[CTX_MAX_STARTS];
    const int n = ctx_sample_starts(c, b, ql, rng, s);
    for (int k = 0; k < n; k++) {
        if (s[k] > ql - CTX_SAMPLE_ROWS) s[k] = ql - CTX_SAMPLE_ROWS;
        if (s[k] < 0) s[k] = 0;
    }
    qsort(s, (size_t)n, sizeof s[0], ctx_cmp_int32);
    ctx_block *last = NULL;
    for (int k = 0; k < n; k++) {
        const int32_t i1 = s[k] + CTX_SAMPLE_ROWS < ql ? s[k] + CTX_SAMPLE_ROWS : ql;
        if (last && s[k] <= last->i1) {
            if (i1 > last->i1) last->i1 = i1;
            continue;
        }
        last = &x->blocks[x->n_blocks++];
        *last = (ctx_block){b, s[k], i1};
    }
}

/* Choose the checked rows of every request (full: all of them) and total their rows and
 * reference cost.  0, or -1 (allocation) with a message. */
static inline int ctx_pick_blocks(ctx_case *x, int full, tt_rng *rng, char *msg, size_t cap) {
    const gqa_case *c = &x->g;
    free(x->blocks);
    x->blocks = (ctx_block *)malloc(sizeof(ctx_block) * (size_t)c->B * CTX_MAX_STARTS);
    x->n_blocks = 0;
    x->rows_checked = 0;
    x->ref_macs = 0;
    if (!x->blocks) {
        gc_msg(msg, cap, "host allocation failed (blocks)");
        return -1;
    }
    for (int32_t b = 0; b < c->B; b++) ctx_add_request_blocks(x, b, full, rng);
    for (int32_t k = 0; k < x->n_blocks; k++) {
        const ctx_block *bl = &x->blocks[k];
        x->rows_checked += bl->i1 - bl->i0;
        x->ref_macs += ctx_keys_seen(c, bl->b, bl->i0, bl->i1) * 2.0 * c->o.heads_q * c->o.head_dim;
    }
    return 0;
}

/* Free the case's buffers, plan and blocks and zero it (NULL or zeroed is fine). */
static inline void ctx_case_free(ctx_case *x) {
    if (!x) return;
    gqa_case_free(&x->g);
    free(x->blocks);
    memset(x, 0, sizeof *x);
}

/* Build a context case: n requests of q_len[n] rows over kv_len[n] keys under o (kind
 * FI_KIND_CONTEXT: ctx_default_opts), random inputs, its device plan (gqa_case_init_lens),
 * and the rows to check (every row when full).  0, or -1 and a message (x freed). */
static inline int ctx_case_init(ctx_case *x, const gqa_opts *o, const int32_t *q_len,
                                const int32_t *kv_len, int32_t n, int full, tt_rng *rng,
                                char *msg, size_t cap) {
    memset(x, 0, sizeof *x);
    if (gqa_case_init_lens(&x->g, o, q_len, kv_len, n, rng, msg, cap)) return -1;
    if (ctx_pick_blocks(x, full, rng, msg, cap)) {
        ctx_case_free(x);
        return -1;
    }
    return 0;
}

/* The sub-requests of blocks bl[nb] as one CUM_SEQ_LENS batch: cq / ck [nb + 1] (rows and
 * keys), the block table tbl [nb, (2,) *P] (each row the block's request's pages) and the
 * gathered q [rows, H_q, D]; causal and window_left as given.  Returns the rows (0 on an
 * allocation failure: *bad set). */
static inline int32_t ctx_sub_batch(const gqa_case *c, const ctx_block *bl, int32_t nb,
                                    int32_t window_left, fi_batch *sub, int32_t *cq, int32_t *ck,
                                    int32_t **tbl, int32_t *P, uint16_t **q, int *bad) {
    const fi_batch *bt = &c->fb.batch;
    const int64_t HD = (int64_t)c->o.heads_q * c->o.head_dim, ps = c->o.page_size;
    const int halves = bt->form != FI_FORM_INDPTR && bt->kv_split_pages ? 2 : 1;
    cq[0] = ck[0] = 0;
    *P = 1;
    for (int32_t k = 0; k < nb; k++) {
        const int32_t b = bl[k].b, ql = c->fb.q_lens[b], kv = c->fb.kv_lens[b];
        int32_t kvk = kv;
        if (bt->causal) kvk = kv - ql + bl[k].i1 > 0 ? kv - ql + bl[k].i1 : 0;
        cq[k + 1] = cq[k] + bl[k].i1 - bl[k].i0;
        ck[k + 1] = ck[k] + kvk;
        const int32_t pages = (int32_t)((kvk + ps - 1) / ps);
        if (pages > *P) *P = pages;
    }
    *tbl = (int32_t *)calloc((size_t)nb * halves * (size_t)*P, sizeof(int32_t));
    *q = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(cq[nb] > 0 ? cq[nb] : 1) * (size_t)HD);
    if (!*tbl || !*q) {
        *bad = 1;
        return 0;
    }
    for (int32_t k = 0; k < nb; k++) {
        const int32_t b = bl[k].b, pages = (int32_t)((ck[k + 1] - ck[k] + ps - 1) / ps);
        for (int h = 0; h < halves; h++)
            memcpy(*tbl + ((int64_t)k * halves + h) * *P, ctx_request_pages(c, b, h),
                   sizeof(int32_t) * (size_t)pages);
        memcpy(*q + cq[k] * HD, c->h_q + ((int64_t)c->q_offset[b] + bl[k].i0) * HD,
               sizeof(uint16_t) * (size_t)((bl[k].i1 - bl[k].i0) * HD));
    }
    memset(sub, 0, sizeof *sub);
    sub->form = FI_FORM_CUM_SEQ_LENS;
    sub->batch_size = nb;
    sub->block_tables = *tbl;
    sub->max_pages_per_seq = *P;
    sub->kv_split_pages = halves == 2;
    sub->cum_seq_lens_q = cq;
    sub->cum_seq_lens_kv = ck;
    sub->causal = bt->causal;
    sub->window_left = window_left;
    return cq[nb];
}

/* The host cache the reference reads: the canonical K / V arrays [num_pages, page_size,
 * H_kv, w] of dtype dt (the case's own, or an NVFP4 cache dequantised to fp32). */
typedef struct ctx_ref_kv {
    const void *k, *v;
    fi_dtype dt;
    int64_t w;
} ctx_ref_kv;

/* The fp64 truth of blocks bl[nb] (one fi_naive_attention call, file comment) on cache kc
 * into c->ref_out / c->ref_lse at the blocks' token rows. */
static inline int ctx_reference_call(gqa_case *c, const ctx_ref_kv *kc, const ctx_block *bl,
                                     int32_t nb, int32_t window_left, char *msg, size_t cap) {
    const int64_t Hq = c->o.heads_q, Hkv = c->o.heads_kv, D = c->o.head_dim,
                  ps = c->o.page_size, NP = c->num_pages, W = kc->w;
    if (nb <= 0) return 0;
    int32_t *cq = (int32_t *)malloc(sizeof(int32_t) * (size_t)(nb + 1));
    int32_t *ck = (int32_t *)malloc(sizeof(int32_t) * (size_t)(nb + 1));
    int32_t *tbl = NULL, P = 1;
    uint16_t *q = NULL;
    float *out = NULL, *lse = NULL;
    int bad = !cq || !ck;
    fi_batch sub;
    const int32_t rows =
        bad ? 0 : ctx_sub_batch(c, bl, nb, window_left, &sub, cq, ck, &tbl, &P, &q, &bad);
    if (!bad) {
        out = (float *)malloc(sizeof(float) * (size_t)(rows > 0 ? rows : 1) * (size_t)(Hq * D));
        lse = (float *)malloc(sizeof(float) * (size_t)(rows > 0 ? rows : 1) * (size_t)Hq);
        bad = !out || !lse;
    }
    fi_status st = FI_ERR_OUT_OF_MEMORY;
    if (!bad && rows > 0) {
        fi_caps caps = gqa_caps(&c->o, nb, rows, c->num_pages);
        caps.max_batch = nb;
        caps.max_q_tokens = rows;
        caps.kv_dtype = kc->dt;
        caps.o_dtype = FI_DTYPE_F32;
        caps.num_ctas = 1;
        caps.variant = 0;
        fi_attn_args a;
        memset(&a, 0, sizeof a);
        const int halves = sub.kv_split_pages ? 2 : 1;
        int64_t qs[3] = {rows, Hq, D}, qst[3] = {Hq * D, D, 1};
        int64_t ks[4] = {NP, ps, Hkv, W}, kst[4] = {ps * Hkv * W, Hkv * W, W, 1};
        int64_t ts[3] = {nb, halves, P}, tst[3] = {halves * (int64_t)P, P, 1};
        int64_t t2[2] = {nb, P}, t2s[2] = {P, 1};
        int64_t ls[2] = {rows, Hq}, lst[2] = {Hq, 1};
        a.q = fi_tensor_make(q, c->o.dtype, 3, qs, qst);
        a.k = fi_tensor_make((void *)kc->k, kc->dt, 4, ks, kst);
        a.v = fi_tensor_make((void *)kc->v, kc->dt, 4, ks, kst);
        a.page_table = halves == 2 ? fi_tensor_make(tbl, FI_DTYPE_I32, 3, ts, tst)
                                   : fi_tensor_make(tbl, FI_DTYPE_I32, 2, t2, t2s);
        a.out = fi_tensor_make(out, FI_DTYPE_F32, 3, qs, qst);
        a.lse = fi_tensor_make(lse, FI_DTYPE_F32, 2, ls, lst);
        a.sinks = c->o.sinks ? c->h_sinks : NULL;
        a.bmm1_scale = c->bmm1_scale;
        a.bmm2_scale = c->bmm2_scale;
        st = fi_naive_attention(&caps, &sub, &a);
        for (int32_t k = 0; st == FI_OK && k < nb; k++) { /* scatter to the token rows */
            const int64_t t = (int64_t)c->q_offset[bl[k].b] + bl[k].i0, n = bl[k].i1 - bl[k].i0;
            memcpy(c->ref_out + t * Hq * D, out + (int64_t)cq[k] * Hq * D,
                   sizeof(float) * (size_t)(n * Hq * D));
            memcpy(c->ref_lse + t * Hq, lse + (int64_t)cq[k] * Hq,
                   sizeof(float) * (size_t)(n * Hq));
        }
    } else if (!bad) {
        st = FI_OK; /* no rows */
    }
    free(cq);
    free(ck);
    free(tbl);
    free(q);
    free(out);
    free(lse);
    if (st != FI_OK) {
        gc_msg(msg, cap, "fi_naive_attention (%d blocks from request %d): %s", nb,
               nb > 0 ? bl[0].b : -1, fi_status_name(st));
        return -1;
    }
    return 0;
}

/* The fp64 truth of every checked block: one call, or one a block for a non-causal
 * windowed batch (each block's window shifted by q_len - i1, so its rows see what they
 * saw). */
static inline int ctx_case_reference(ctx_case *x, char *msg, size_t cap) {
    gqa_case *c = &x->g;
    const fi_batch *bt = &c->fb.batch;
    ctx_ref_kv kc = {c->h_k, c->h_v, c->o.kv_dtype, c->W};
    float *dk = NULL, *dv = NULL;
    if (c->o.kv_dtype == FI_DTYPE_E2M1) {
        if (gqa_case_dequantised_kv(c, &dk, &dv, msg, cap)) return -1;
        kc = (ctx_ref_kv){dk, dv, FI_DTYPE_F32, c->o.head_dim};
    }
    int rc = 0;
    if (bt->causal || bt->window_left < 0) {
        rc = ctx_reference_call(c, &kc, x->blocks, x->n_blocks, bt->window_left, msg, cap);
    } else {
        for (int32_t k = 0; k < x->n_blocks && !rc; k++) {
            const ctx_block *bl = &x->blocks[k];
            const int32_t shift = c->fb.q_lens[bl->b] - bl->i1;
            rc = ctx_reference_call(c, &kc, bl, 1, bt->window_left + shift, msg, cap);
        }
    }
    free(dk);
    free(dv);
    return rc;
}

/* Every output element finite and every lse what its request allows (no poison left):
 * finite when the request has keys or a sink, else exactly -inf (a row with no key). */
static inline int ctx_check_coverage(const gqa_case *c, char *msg, size_t cap) {
    const int64_t Hq = c->o.heads_q, D = c->o.head_dim;
    for (int32_t b = 0; b < c->B; b++)
        for (int32_t i = 0; i < c->fb.q_lens[b]; i++) {
            const int64_t t = (int64_t)c->q_offset[b] + i;
            for (int64_t e = t * Hq * D; e < (t + 1) * Hq * D; e++)
                if (!isfinite(gqa_out_value(c, e))) {
                    gc_msg(msg, cap, "request %d q row %d head %lld dim %lld: %g (poison left "
                           "or not finite); q_len %d kv_len %d", b, i, (long long)((e / D) % Hq),
                           (long long)(e % D), gqa_out_value(c, e), c->fb.q_lens[b],
                           c->fb.kv_lens[b]);
                    return -1;
                }
            if (!c->o.return_lse) continue;
            const int finite = c->fb.kv_lens[b] > 0 || c->o.sinks;
            for (int64_t h = 0; h < Hq; h++) {
                const float l = c->h_lse[t * Hq + h];
                if (finite ? !isfinite(l) : !(isinf(l) && l < 0)) {
                    gc_msg(msg, cap, "request %d q row %d head %lld: lse %g, want %s", b, i,
                           (long long)h, l, finite ? "finite" : "-inf");
                    return -1;
                }
            }
        }
    return 0;
}

/* The downloaded outputs against the truth of the checked blocks (ctx_case_reference
 * first): coverage of every element, then each checked row within the case's tolerance,
 * lse within GQA_TOL_LSE.  *worst_out / *worst_lse (may be NULL) raised to the errors. */
static inline int ctx_case_compare(const ctx_case *x, double *worst_out, double *worst_lse,
                                   char *msg, size_t cap) {
    const gqa_case *c = &x->g;
    if (ctx_check_coverage(c, msg, cap)) return -1;
    const gc_rows r = {c->fb.q_lens, c->fb.kv_lens, c->q_offset, c->o.heads_q, c->o.head_dim,
                       c->o.heads_q / c->o.heads_kv, gqa_out_value_at, c, c->h_lse,
                       c->ref_out, c->ref_lse, c->o.return_lse, GQA_TOL_LSE};
    const double tol = gqa_case_tol(c);
    double wo = 0, wl = 0;
    for (int32_t k = 0; k < x->n_blocks; k++) {
        const ctx_block *bl = &x->blocks[k];
        for (int32_t i = bl->i0; i < bl->i1; i++)
            for (int64_t h = 0; h < c->o.heads_q; h++) {
                const int64_t t = (int64_t)c->q_offset[bl->b] + i;
                double rel = 0, e = 0;
                if (gc_compare_out_row(&r, bl->b, i, t, h, tol, &rel, msg, cap)) return -1;
                if (c->o.return_lse && gc_compare_lse(&r, bl->b, i, t, h, &e, msg, cap))
                    return -1;
                if (rel > wo) wo = rel;
                if (e > wl) wl = e;
            }
    }
    if (worst_out && wo > *worst_out) *worst_out = wo;
    if (worst_lse && wl > *worst_lse) *worst_lse = wl;
    return 0;
}

/* One line naming the case, for logs and failure messages. */
static inline void ctx_case_name(const ctx_case *x, char *buf, size_t cap) {
    const gqa_case *c = &x->g;
    static const char *forms[4] = {"?", "block_tables", "indptr", "cum_seq_lens"};
    int groups, items;
    int32_t max_kv;
    gc_plan_counts(c->plan, c->fb.kv_lens, c->B, &groups, &items, &max_kv);
    const int f = c->fb.batch.form >= 1 && c->fb.batch.form <= 3 ? (int)c->fb.batch.form : 0;
    snprintf(buf, cap, "q %s kv %s out %s H %d/%d D %d page_size %d %s %s pad %d %s%s B %d "
             "tokens %d max_q %d max_kv %d %s window_left %d pages %s ctas %d sinks %d lse %d "
             "scale_ptr %d items %d groups %d checked rows %lld (%.2g GMAC)",
             gqa_dtype_name(c->o.dtype), gqa_dtype_name(c->o.kv_dtype),
             gqa_dtype_name(c->o.o_dtype), c->o.heads_q, c->o.heads_kv, c->o.head_dim,
             c->o.page_size, c->o.layout == GQA_NHD ? "NHD" : "HND",
             c->o.kv_form == GQA_KV_SINGLE ? "single" : "pair", c->o.page_pad, forms[f],
             c->fb.batch.kv_split_pages ? " [B,2,P]" : "", c->B, c->tokens, c->fb.max_q_len,
             max_kv, c->fb.batch.causal ? "causal" : "non-causal", c->fb.batch.window_left,
             c->o.contig_pages ? "contig" : "shuffled",
             c->plan ? fi_plan_caps(c->plan)->num_ctas : -1, c->o.sinks, c->o.return_lse,
             c->o.scale_ptr, items, groups, (long long)x->rows_checked, x->ref_macs * 1e-9);
}

/* ---- lengths from the bundled trace (docs/DESIGN.md section 10) ------------------------- */

/* Lengths of n requests (q, kv [n]) from the bundled trace: prefill of rows first.. with a
 * cached prefix (prefix 0: the prompt lengths as they come; fitrace_prefill), or, with
 * num_prefill >= 0, a mixed batch of num_prefill last prompt chunks of `chunk` tokens beside
 * n - num_prefill q_len-1 decodes at decode step `step` (fitrace_mixed). */
static inline int ctx_trace_lengths(int32_t first, int32_t n, int32_t prefix, int32_t num_prefill,
                                    int32_t chunk, int32_t step, int32_t *q, int32_t *kv,
                                    char *msg, size_t cap) {
    fitrace *tr = NULL;
    if (fitrace_load_default(NULL, &tr) != FITRACE_OK) {
        gc_msg(msg, cap, "fitrace_load_default failed");
        return -1;
    }
    int32_t *src = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    fitrace_lens l = {n, q, kv, src};
    const int32_t f = first % tr->num_requests;
    fitrace_status st = !src ? FITRACE_ERR_NOMEM
                        : num_prefill < 0 ? fitrace_prefill(tr, f, prefix, &l)
                                          : fitrace_mixed(tr, f, num_prefill, chunk, step, 1, &l);
    free(src);
    fitrace_free(tr);
    if (st != FITRACE_OK) {
        gc_msg(msg, cap, "trace lengths: %s", fitrace_status_name(st));
        return -1;
    }
    return 0;
}

/* A prefill batch of the trace's prompts from row `first` on (cached prefix as in
 * ctx_trace_lengths), as many requests (<= max_n) as keep the sum of q_len <= max_tokens
 * (at least one): their count into *n, lengths into q / kv [max_n]. */
static inline int ctx_trace_prefill_tokens(int32_t first, int32_t prefix, int32_t max_tokens,
                                           int32_t max_n, int32_t *q, int32_t *kv, int32_t *n,
                                           char *msg, size_t cap) {
    if (ctx_trace_lengths(first, max_n, prefix, -1, 0, 0, q, kv, msg, cap)) return -1;
    int64_t tokens = 0;
    *n = 0;
    while (*n < max_n && (*n == 0 || tokens + q[*n] <= max_tokens)) tokens += q[(*n)++];
    return 0;
}

#endif /* FI_TESTS_GPU_CONTEXT_GPU_CASE_H */
