/*
 * tests/gpu/mla_gpu_case.h - one MLA decode problem on the GPU and on the fp64 reference,
 * shared by tests/gpu/test_mla_gpu.c and bench/bench_mla.c (header-only, static inline).
 *
 * A case owns:
 *   - the batch (viz/batch.h fibatch: lengths, shuffled or request-ordered page ids,
 *     causal, window_left, block_tables or qo_indptr/kv_indptr/kv_indices);
 *   - host inputs with fresh random values and their device copies: bf16 / fp16 in
 *     [-1, 1), or fp8 e4m3 (q and / or the cache: opts.q_dtype / kv_dtype; random codes
 *     |x| < 2, gc_fill_random_e4m3; 1-byte elements, strides in elements = bytes), in the
 *     layout of the reference API the form belongs to:
 *       FI_FORM_BLOCK_TABLES (trtllm_batch_decode_with_kv_cache_mla, concatenated):
 *         query [B, q_len, H, 576] = q_nope 512 ++ q_rope 64, kv_cache [pages, page_size, 576]
 *         = ckv 512 ++ kpe 64; passed as a 512-wide and a 64-wide strided view (+512 elems);
 *       FI_FORM_INDPTR (BatchMLAPagedAttentionWrapper, split):
 *         q_nope [tokens, H, 512], q_pe [tokens, H, 64], ckv [pages, page_size, 512],
 *         kpe [pages, page_size, 64], each contiguous;
 *   - out [tokens, H, 512] (the q dtype; bf16 with an fp8 cache) and lse [tokens, H] fp32
 *     on the device, poisoned with NaN (all bytes 0xFF) before every run;
 *   - sparse top-k plans (opts.sparse_top_k = K > 0, BLOCK_TABLES form only; fiattn.h
 *     fi_caps.sparse_top_k): the top-k table [B * q_len, K] int32 of flat KV slots
 *     page * page_size + offset, drawn per query token from its request's own KV positions
 *     (< kv_len, through the request's dense page row of the fibatch), distinct within a
 *     row, in random order, with -1 padding (opts.sparse_pad percent), rows all -1
 *     (opts.sparse_empty_every) and rows repeating the request's first row
 *     (opts.sparse_dup); the plan's batch takes it as block_tables with
 *     max_pages_per_seq = K, the device page table is it;
 *   - a device plan (caller-owned cudaMalloc'd workspace) updated on the case's stream;
 *   - the fp64 truth (fi_naive_attention on the host inputs; fp8 values are widened
 *     exactly by it) in fp32 host arrays.  Sparse plans: built independently of the
 *     library's sparse path: each query token's valid listed slots are gathered into a
 *     dense contiguous cache and fi_naive_attention runs that batch of B * q_len one-row
 *     requests (INDPTR form, page size 1, non-causal).
 * Checking (mla_case_check): no NaN anywhere; per (token, head) row
 * ||out - ref|| / ||ref|| <= tol (mla_case_tol: 1e-2 for 16-bit inputs, 2e-2 with fp8:
 * the kernel's fp16 matmuls round a bf16 q and P), rows whose reference is exactly zero (no key) must be
 * exactly zero; lse |gpu - ref| <= tol (absolute: natural log, so a relative error of
 * the denominator), -inf exactly where the reference is -inf.  Functions return 0 / a message, never abort, so a bench can use them too.
 */
#ifndef FI_TESTS_GPU_MLA_GPU_CASE_H
#define FI_TESTS_GPU_MLA_GPU_CASE_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "fiattn.h"
#include "fiattn_ref.h"
#include "fiattn_run.h"
#include "common/rng.h"
#include "gpu/gpu_case_common.h"
#include "viz/batch.h"

#define MLA_D_CKV 512
#define MLA_D_KPE 64
#define MLA_D_QK 576
#define MLA_TOL_16BIT 1e-2
#define MLA_TOL_FP8 2e-2

/* ---- small numeric helpers: shared with the other families (gpu_case_common.h) ------- */

#define mla_f32_to_bf16 gc_f32_to_bf16
#define mla_bf16_to_f32 gc_bf16_to_f32
#define mla_f32_to_f16 gc_f32_to_f16
#define mla_f16_to_f32 gc_f16_to_f32
#define mla_from_f32 gc_from_f32
#define mla_to_f32 gc_to_f32
#define mla_fill_random gc_fill_random_as
#define mla_gpu_available gc_gpu_available
#define mla_msg gc_msg
#define MLA_CUDA GC_CUDA

/* ---- the case ------------------------------------------------------------------------ */

typedef struct mla_opts {
    fi_dtype dtype;          /* FI_DTYPE_BF16 or FI_DTYPE_F16: q, kv and out */
    int32_t heads;           /* H_q: 16, 32, 64, 128 */
    int32_t page_size;       /* 1, 16, 32, 64 */
    fi_batch_form form;      /* BLOCK_TABLES (concatenated tensors) or INDPTR (split) */
    int32_t causal;
    int32_t num_ctas;        /* 0: the device's choice */
    int32_t sinks;           /* 1: random sinks [H] in [-2, 6) */
    int32_t return_lse;      /* 1: pass lse */
    int32_t scale_ptr;       /* 1: bmm1/bmm2 scales through device pointers */
    int32_t max_batch;       /* caps.max_batch (0: the batch size) */
    int32_t max_q_tokens;    /* caps.max_q_tokens (0: the batch's tokens) */
    int32_t extra_pages;     /* caps.num_pages = pages used + this */
    int32_t windowed;        /* 1: the batch's window_left is window_left; 0: -1 (none) */
    int32_t window_left;     /* >= 0, read only when windowed */
    int32_t contig_pages;    /* 1: page ids in request order; 0: a seeded shuffle */
    int32_t variant;         /* caps.variant: the executor row (0: default 64-row tiles) */
    /* fp8 and sparse (all zero: the 16-bit dense case above, unchanged): */
    fi_dtype q_dtype;        /* 0: dtype; with an fp8 cache FI_DTYPE_E4M3, BF16 or F16 */
    fi_dtype kv_dtype;       /* 0: dtype; FI_DTYPE_E4M3: fp8 e4m3 ckv / kpe cache */
    fi_dtype o_dtype;        /* 0: dtype, or BF16 with an fp8 cache (others: refusal tests) */
    int32_t sparse_top_k;    /* K > 0: sparse top-k plan (BLOCK_TABLES form only) */
    int32_t sparse_pad;      /* sparse: percent (0..100) of a row's valid entries left -1 */
    int32_t sparse_empty_every; /* sparse: every n-th query token's row all -1 (0: none) */
    int32_t sparse_dup;      /* sparse: rows i > 0 of a request list row 0's slots (shuffled),
                                so query tokens share keys */
} mla_opts;

/* The dtypes a case runs with (0 in the options: dtype; out bf16 under an fp8 cache). */
static inline fi_dtype mla_q_dtype(const mla_opts *o) { return o->q_dtype ? o->q_dtype : o->dtype; }
static inline fi_dtype mla_kv_dtype(const mla_opts *o) {
    return o->kv_dtype ? o->kv_dtype : o->dtype;
}
static inline fi_dtype mla_o_dtype(const mla_opts *o) {
    if (o->o_dtype) return o->o_dtype;
    return mla_kv_dtype(o) == FI_DTYPE_E4M3 ? FI_DTYPE_BF16 : o->dtype;
}

typedef struct mla_case {
    mla_opts o;
    fibatch fb;
    int32_t B, tokens, num_pages, P; /* P: block_tables row length (BLOCK_TABLES) */
    int32_t *q_offset;               /* [B] first token of request b */
    /* host inputs (q_es / kv_es bytes an element: 2, or 1 for fp8); in the concatenated
     * form h_qr / h_kr are NULL */
    void *h_q, *h_qr, *h_kv, *h_kr;
    int64_t n_q, n_qr, n_kv, n_kr;   /* element counts of the four buffers */
    int64_t q_es, kv_es;
    /* the page table fi_run reads: fb.page_table, or the sparse top-k table h_sparse
     * [B * q_len, K] (owned) */
    int32_t *h_pt, *h_sparse;
    int64_t pt_len;
    float *h_sinks;                  /* [H] or NULL */
    float bmm1_scale, bmm2_scale;
    float h_scales[2];               /* host copies for the reference's pointer path */
    /* device */
    void *d_q, *d_qr, *d_kv, *d_kr, *d_out, *d_lse, *d_ws;
    int32_t *d_pt;
    float *d_sinks, *d_scales;       /* d_scales[0] bmm1, [1] bmm2 */
    size_t ws_bytes, out_bytes, lse_bytes;
    cudaStream_t stream;
    fi_plan *plan;
    /* results */
    uint16_t *h_out;                 /* [tokens, H, 512] GPU output copied back */
    float *h_lse;                    /* [tokens, H] */
    float *ref_out, *ref_lse;        /* fp64 truth rounded to fp32 */
} mla_case;

/* The registry row a case without its own (o->variant 0) runs: FI_MLA_TEST_VARIANT, so the
 * whole suite runs once per MLA tile body (make gpu-test: 0, then 3, the wgmma body). */
static inline int32_t mla_test_variant(void) {
    const char *v = getenv("FI_MLA_TEST_VARIANT");
    return v ? (int32_t)atoi(v) : 0;
}

static inline fi_caps mla_caps(const mla_opts *o, int32_t B, int32_t tokens, int32_t pages) {
    fi_caps c;
    memset(&c, 0, sizeof c);
    c.kind = FI_KIND_MLA_DECODE;
    c.max_batch = o->max_batch > 0 ? o->max_batch : B;
    c.max_q_tokens = o->max_q_tokens > 0 ? o->max_q_tokens : tokens;
    c.num_pages = pages + o->extra_pages;
    c.page_size = o->page_size;
    c.num_qo_heads = o->heads;
    c.num_kv_heads = 1;
    c.head_dim_qk = MLA_D_QK;
    c.head_dim_vo = MLA_D_CKV;
    c.q_dtype = mla_q_dtype(o);
    c.kv_dtype = mla_kv_dtype(o);
    c.o_dtype = mla_o_dtype(o);
    c.num_ctas = o->num_ctas;
    c.variant = o->variant ? o->variant : mla_test_variant();
    c.sparse_top_k = o->sparse_top_k;
    return c;
}

/* Element i of a host or device buffer of es-byte elements. */
static inline void *mla_at(void *base, int64_t i, int64_t es) {
    return (uint8_t *)base + i * es;
}

/* The row tolerance of a case (file comment). */
static inline double mla_case_tol(const mla_opts *o) {
    return mla_kv_dtype(o) == FI_DTYPE_E4M3 || mla_q_dtype(o) == FI_DTYPE_E4M3 ? MLA_TOL_FP8
                                                                              : MLA_TOL_16BIT;
}

/* Tensor views of the case; device = 1: device pointers (fi_run), 0: host (reference). */
static inline fi_attn_args mla_case_args(const mla_case *c, int device) {
    const int64_t H = c->o.heads, ps = c->o.page_size, T = c->tokens, NP = c->num_pages;
    const fi_dtype qdt = mla_q_dtype(&c->o), kdt = mla_kv_dtype(&c->o);
    void *q = device ? c->d_q : c->h_q;
    void *kv = device ? c->d_kv : c->h_kv;
    void *pt = device ? (void *)c->d_pt : (void *)c->h_pt;
    fi_attn_args a;
    memset(&a, 0, sizeof a);
    if (c->o.form == FI_FORM_BLOCK_TABLES) { /* concatenated 576-wide rows, two views */
        int64_t qs[3] = {T, H, MLA_D_CKV}, qst[3] = {H * MLA_D_QK, MLA_D_QK, 1};
        int64_t rs[3] = {T, H, MLA_D_KPE};
        int64_t ks[4] = {NP, ps, 1, MLA_D_CKV}, kst[4] = {ps * MLA_D_QK, MLA_D_QK, MLA_D_QK, 1};
        int64_t kr[4] = {NP, ps, 1, MLA_D_KPE};
        a.q = fi_tensor_make(q, qdt, 3, qs, qst);
        a.q_rope = fi_tensor_make(mla_at(q, MLA_D_CKV, c->q_es), qdt, 3, rs, qst);
        a.k = fi_tensor_make(kv, kdt, 4, ks, kst);
        a.k_rope = fi_tensor_make(mla_at(kv, MLA_D_CKV, c->kv_es), kdt, 4, kr, kst);
        /* block_tables [B, P]; sparse: the top-k table as [B * q_len, K] (the plan's rows:
         * one a query token) */
        const int64_t rows = c->o.sparse_top_k > 0 ? c->tokens : c->B;
        int64_t ts[2] = {rows, c->P}, tst[2] = {c->P, 1};
        a.page_table = fi_tensor_make(pt, FI_DTYPE_I32, 2, ts, tst);
    } else { /* split, each contiguous */
        void *qr = device ? c->d_qr : c->h_qr;
        void *kr = device ? c->d_kr : c->h_kr;
        int64_t qs[3] = {T, H, MLA_D_CKV}, qst[3] = {H * MLA_D_CKV, MLA_D_CKV, 1};
        int64_t rs[3] = {T, H, MLA_D_KPE}, rst[3] = {H * MLA_D_KPE, MLA_D_KPE, 1};
        int64_t ks[4] = {NP, ps, 1, MLA_D_CKV}, kst[4] = {ps * MLA_D_CKV, MLA_D_CKV, MLA_D_CKV, 1};
        int64_t krs[4] = {NP, ps, 1, MLA_D_KPE}, krt[4] = {ps * MLA_D_KPE, MLA_D_KPE, MLA_D_KPE, 1};
        a.q = fi_tensor_make(q, qdt, 3, qs, qst);
        a.q_rope = fi_tensor_make(qr, qdt, 3, rs, rst);
        a.k = fi_tensor_make(kv, kdt, 4, ks, kst);
        a.k_rope = fi_tensor_make(kr, kdt, 4, krs, krt);
        int64_t n = c->pt_len > 0 ? c->pt_len : 1, one = 1;
        a.page_table = fi_tensor_make(pt, FI_DTYPE_I32, 1, &n, &one);
    }
    int64_t os[3] = {T, H, MLA_D_CKV}, ost[3] = {H * MLA_D_CKV, MLA_D_CKV, 1};
    int64_t ls[2] = {T, H}, lst[2] = {H, 1};
    if (device) {
        a.out = fi_tensor_make(c->d_out, mla_o_dtype(&c->o), 3, os, ost);
        if (c->o.return_lse) a.lse = fi_tensor_make(c->d_lse, FI_DTYPE_F32, 2, ls, lst);
        a.sinks = c->o.sinks ? c->d_sinks : NULL;
        if (c->o.scale_ptr) {
            a.bmm1_scale_ptr = c->d_scales;
            a.bmm2_scale_ptr = c->d_scales + 1;
        }
    } else {
        a.out = fi_tensor_make(c->ref_out, FI_DTYPE_F32, 3, os, ost);
        a.lse = fi_tensor_make(c->ref_lse, FI_DTYPE_F32, 2, ls, lst);
        a.sinks = c->o.sinks ? c->h_sinks : NULL;
        if (c->o.scale_ptr) {
            a.bmm1_scale_ptr = &c->h_scales[0];
            a.bmm2_scale_ptr = &c->h_scales[1];
        }
    }
    /* the value fields hold garbage-free copies too; with pointers set they must be ignored */
    a.bmm1_scale = c->o.scale_ptr ? 1000.0f : c->bmm1_scale;
    a.bmm2_scale = c->o.scale_ptr ? -1000.0f : c->bmm2_scale;
    return a;
}

static inline void mla_case_free(mla_case *c) {
    if (!c) return;
    if (c->plan) fi_plan_destroy(c->plan);
    void *dev[] = {c->d_q, c->d_qr, c->d_kv, c->d_kr, c->d_out, c->d_lse, c->d_ws,
                   c->d_pt, c->d_sinks, c->d_scales};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) cudaFree(dev[i]);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c->q_offset);
    free(c->h_q);
    free(c->h_qr);
    free(c->h_kv);
    free(c->h_kr);
    free(c->h_sinks);
    free(c->h_out);
    free(c->h_lse);
    free(c->ref_out);
    free(c->ref_lse);
    free(c->h_sparse);
    fibatch_free(&c->fb);
    memset(c, 0, sizeof *c);
}

/* Copy the host inputs (q, kv, page table, sinks, scales) to the device buffers. */
static inline int mla_case_upload(mla_case *c, char *msg, size_t cap) {
    const enum cudaMemcpyKind h2d = cudaMemcpyHostToDevice;
    MLA_CUDA(cudaMemcpy(c->d_q, c->h_q, (size_t)(c->n_q * c->q_es), h2d), msg, cap);
    MLA_CUDA(cudaMemcpy(c->d_kv, c->h_kv, (size_t)(c->n_kv * c->kv_es), h2d), msg, cap);
    if (c->h_qr)
        MLA_CUDA(cudaMemcpy(c->d_qr, c->h_qr, (size_t)(c->n_qr * c->q_es), h2d), msg, cap);
    if (c->h_kr)
        MLA_CUDA(cudaMemcpy(c->d_kr, c->h_kr, (size_t)(c->n_kr * c->kv_es), h2d), msg, cap);
    if (c->pt_len > 0)
        MLA_CUDA(cudaMemcpy(c->d_pt, c->h_pt, (size_t)c->pt_len * 4, h2d), msg, cap);
    if (c->h_sinks)
        MLA_CUDA(cudaMemcpy(c->d_sinks, c->h_sinks, (size_t)c->o.heads * 4,
                            cudaMemcpyHostToDevice), msg, cap);
    c->h_scales[0] = c->bmm1_scale;
    c->h_scales[1] = c->bmm2_scale;
    MLA_CUDA(cudaMemcpy(c->d_scales, c->h_scales, 8, cudaMemcpyHostToDevice), msg, cap);
    return 0;
}

/* Fisher-Yates shuffle of n ints. */
static inline void mla_shuffle(int32_t *v, int32_t n, tt_rng *rng) {
    for (int32_t j = n - 1; j > 0; j--) {
        const int32_t k = tt_rng_int(rng, 0, j), t = v[j];
        v[j] = v[k];
        v[k] = t;
    }
}

/* The sparse top-k table of a case (file comment) into c->h_sparse [tokens, K]: row
 * r = q_offset[b] + i lists distinct flat slots of request b's own KV positions
 * (< kv_len[b], through its page row of the fibatch), -1 elsewhere, in random order.
 * 0, or -1 (allocation). */
static inline int mla_sparse_table(mla_case *c, tt_rng *rng) {
    const mla_opts *o = &c->o;
    const int32_t K = o->sparse_top_k, ps = o->page_size;
    const int32_t maxkv = c->fb.max_kv_len > 0 ? c->fb.max_kv_len : 1;
    c->h_sparse = (int32_t *)malloc(sizeof(int32_t) * (size_t)c->tokens * (size_t)K);
    int32_t *perm = (int32_t *)malloc(sizeof(int32_t) * (size_t)maxkv);
    if (!c->h_sparse || !perm) {
        free(perm);
        return -1;
    }
    const int32_t P = c->fb.batch.max_pages_per_seq; /* the dense page rows */
    for (int32_t b = 0; b < c->B; b++) {
        const int32_t L = c->fb.kv_lens[b], *pages = c->fb.page_table + (int64_t)b * P;
        for (int32_t i = 0; i < c->fb.q_lens[b]; i++) {
            const int64_t r = c->q_offset[b] + i;
            int32_t *row = c->h_sparse + r * K;
            for (int32_t j = 0; j < K; j++) row[j] = -1;
            if (o->sparse_empty_every > 0 && r % o->sparse_empty_every == o->sparse_empty_every - 1)
                continue; /* a row without keys: zeros, lse -inf (or the sink) */
            if (o->sparse_dup && i > 0) { /* row 0's keys again, in another order */
                memcpy(row, c->h_sparse + (int64_t)c->q_offset[b] * K, sizeof(int32_t) * (size_t)K);
                mla_shuffle(row, K, rng);
                continue;
            }
            int32_t n = K < L ? K : L;
            n -= (int32_t)((int64_t)n * o->sparse_pad / 100);
            for (int32_t j = 0; j < L; j++) perm[j] = j;
            for (int32_t j = 0; j < n; j++) { /* partial Fisher-Yates: n distinct positions */
                const int32_t k = tt_rng_int(rng, j, L - 1), t = perm[j];
                perm[j] = perm[k];
                perm[k] = t;
                row[j] = pages[perm[j] / ps] * ps + perm[j] % ps;
            }
            mla_shuffle(row, K, rng); /* -1 entries anywhere in the row */
        }
    }
    free(perm);
    return 0;
}

/* Build a case: batch of n requests with q_len[n], kv_len[n] (BLOCK_TABLES needs a uniform
 * q_len), random inputs, device buffers, a planned device plan.  0 on success, else -1 and
 * a message (the case is then freed). */
static inline int mla_case_init(mla_case *c, const mla_opts *o, const int32_t *q_len,
                                const int32_t *kv_len, int32_t n, tt_rng *rng, char *msg,
                                size_t cap) {
    memset(c, 0, sizeof *c);
    c->o = *o;
    if (o->sparse_top_k > 0 && o->form != FI_FORM_BLOCK_TABLES) {
        mla_msg(msg, cap, "sparse top-k cases take the BLOCK_TABLES form");
        return -1;
    }
    fibatch_opts bo = fibatch_default_opts();
    bo.form = o->form;
    bo.page_size = o->page_size;
    bo.shuffle = !o->contig_pages;
    bo.seed = tt_rng_next(rng);
    bo.causal = o->causal;
    bo.window_left = o->windowed ? o->window_left : -1;
    fibatch_status bs = fibatch_build(&bo, q_len, kv_len, n, NULL, &c->fb);
    if (bs != FIBATCH_OK) {
        mla_msg(msg, cap, "fibatch_build: %s", fibatch_status_name(bs));
        return -1;
    }
    c->B = n;
    c->tokens = c->fb.total_q_tokens;
    c->num_pages = c->fb.num_pages + o->extra_pages;
    c->P = o->form == FI_FORM_BLOCK_TABLES ? c->fb.batch.max_pages_per_seq : 0;
    c->q_es = gc_elem_bytes(mla_q_dtype(o));
    c->kv_es = gc_elem_bytes(mla_kv_dtype(o));
    c->h_pt = c->fb.page_table;
    c->pt_len = c->fb.page_table_len;
    const int64_t H = o->heads, T = c->tokens, ps = o->page_size, NP = c->num_pages;
    const fi_dtype qdt = mla_q_dtype(o), kdt = mla_kv_dtype(o);
    int rc = -1;
    c->q_offset = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    if (!c->q_offset) goto fail_mem;
    for (int32_t b = 0, t = 0; b < n; t += q_len[b], b++) c->q_offset[b] = t;
    if (o->form == FI_FORM_BLOCK_TABLES) {
        c->n_q = T * H * MLA_D_QK;
        c->n_kv = NP * ps * MLA_D_QK;
    } else {
        c->n_q = T * H * MLA_D_CKV;
        c->n_qr = T * H * MLA_D_KPE;
        c->n_kv = NP * ps * MLA_D_CKV;
        c->n_kr = NP * ps * MLA_D_KPE;
    }
    c->h_q = malloc((size_t)(c->n_q * c->q_es));
    c->h_kv = malloc((size_t)(c->n_kv * c->kv_es));
    if (!c->h_q || !c->h_kv) goto fail_mem;
    if (c->n_qr) {
        c->h_qr = malloc((size_t)(c->n_qr * c->q_es));
        c->h_kr = malloc((size_t)(c->n_kr * c->kv_es));
        if (!c->h_qr || !c->h_kr) goto fail_mem;
        mla_fill_random(c->h_qr, c->n_qr, qdt, rng);
        mla_fill_random(c->h_kr, c->n_kr, kdt, rng);
    }
    mla_fill_random(c->h_q, c->n_q, qdt, rng);
    mla_fill_random(c->h_kv, c->n_kv, kdt, rng);
    /* scores ~ bmm1 * N(0, 576/9): std 0.4 .. 1.6, so the softmax is neither flat nor one-hot
     * (fp8 codes |x| < 2 have about the same mean square, 1/3, as uniform [-1, 1)) */
    c->bmm1_scale = 0.05f + 0.15f * (tt_rng_float(rng) + 1.0f) * 0.5f;
    c->bmm2_scale = 0.5f + 0.75f * (tt_rng_float(rng) + 1.0f);
    if (o->sinks) {
        c->h_sinks = (float *)malloc(sizeof(float) * (size_t)H);
        if (!c->h_sinks) goto fail_mem;
        /* [-2, 6): from negligible to dominant next to hundreds of keys */
        for (int64_t h = 0; h < H; h++) c->h_sinks[h] = 2.0f + 4.0f * tt_rng_float(rng);
    }
    if (o->sparse_top_k > 0) { /* the plan reads the top-k table instead of the page rows */
        if (mla_sparse_table(c, rng)) goto fail_mem;
        c->h_pt = c->h_sparse;
        c->pt_len = (int64_t)c->tokens * o->sparse_top_k;
        c->P = o->sparse_top_k;
        /* the batch the plan (and any re-plan) reads: fb.page_table keeps the dense rows */
        c->fb.batch.block_tables = c->h_sparse;
        c->fb.batch.max_pages_per_seq = o->sparse_top_k;
    }
    c->out_bytes = (size_t)(T * H * MLA_D_CKV * 2);
    c->lse_bytes = (size_t)(T * H * 4);
    c->h_out = (uint16_t *)malloc(c->out_bytes);
    c->h_lse = (float *)malloc(c->lse_bytes);
    c->ref_out = (float *)malloc(sizeof(float) * (size_t)(T * H * MLA_D_CKV));
    c->ref_lse = (float *)malloc(c->lse_bytes);
    if (!c->h_out || !c->h_lse || !c->ref_out || !c->ref_lse) goto fail_mem;

    GC_CUDA_OR_GOTO(cudaStreamCreate(&c->stream), msg, cap, fail);
    GC_CUDA_OR_GOTO(cudaMalloc(&c->d_q, (size_t)(c->n_q * c->q_es)), msg, cap, fail);
    GC_CUDA_OR_GOTO(cudaMalloc(&c->d_kv, (size_t)(c->n_kv * c->kv_es)), msg, cap, fail);
    if (c->n_qr) {
        GC_CUDA_OR_GOTO(cudaMalloc(&c->d_qr, (size_t)(c->n_qr * c->q_es)), msg, cap, fail);
        GC_CUDA_OR_GOTO(cudaMalloc(&c->d_kr, (size_t)(c->n_kr * c->kv_es)), msg, cap, fail);
    }
    if (gc_alloc_case_buffers(&c->d_pt, c->pt_len, &c->d_out, c->out_bytes, &c->d_lse,
                              c->lse_bytes, &c->d_sinks, H, &c->d_scales, msg, cap))
        goto fail;
    if (mla_case_upload(c, msg, cap)) goto fail;

    fi_caps caps = mla_caps(o, n, c->tokens, c->num_pages);
    if (gc_plan_make(&caps, &c->fb.batch, c->stream, &c->d_ws, &c->ws_bytes, &c->plan, "", msg,
                     cap))
        goto fail;
    return 0;
fail_mem:
    mla_msg(msg, cap, "host allocation failed");
fail:
    mla_case_free(c);
    return rc;
}

/* The case's outputs as the shared run / download helpers see them. */
static inline gc_outputs mla_case_outputs(const mla_case *c) {
    gc_outputs o = {c->d_out, c->d_lse, c->h_out, c->h_lse, c->out_bytes, c->lse_bytes};
    return o;
}

/* Poison out and lse (NaN bytes) on the case's stream. */
static inline int mla_case_poison(mla_case *c, char *msg, size_t cap) {
    const gc_outputs o = mla_case_outputs(c);
    return gc_poison(&o, c->stream, msg, cap);
}

/* Poison, fi_run with the given args, synchronise.  0 on success. */
static inline int mla_case_run_args(mla_case *c, const fi_attn_args *a, char *msg, size_t cap) {
    const gc_outputs o = mla_case_outputs(c);
    return gc_run_args(&o, c->plan, c->stream, a, msg, cap);
}

static inline int mla_case_run(mla_case *c, char *msg, size_t cap) {
    fi_attn_args a = mla_case_args(c, 1);
    return mla_case_run_args(c, &a, msg, cap);
}

/* The sparse truth of the query tokens of requests [b0, b1) into ref_out / ref_lse (file
 * comment): each token's valid listed slots (0 <= slot < num_pages * page_size) gathered,
 * in list order, into a dense concatenated cache [N, 576] of the case's KV dtype, then
 * fi_naive_attention over those tokens as one-row requests (INDPTR form, page size 1,
 * non-causal: a row sees exactly its gathered keys). */
static inline int mla_case_reference_sparse(mla_case *c, int32_t b0, int32_t b1, char *msg,
                                            size_t cap) {
    const int64_t H = c->o.heads, K = c->o.sparse_top_k, es = c->kv_es;
    const int64_t slots = (int64_t)c->num_pages * c->o.page_size;
    const int32_t t0 = c->q_offset[b0], t1 = b1 < c->B ? c->q_offset[b1] : c->tokens;
    const int32_t R = t1 - t0;
    if (R <= 0) return 0;
    int64_t N = 0;
    for (int64_t j = (int64_t)t0 * K; j < (int64_t)t1 * K; j++)
        N += c->h_sparse[j] >= 0 && c->h_sparse[j] < slots;
    int32_t *qo = (int32_t *)malloc(sizeof(int32_t) * (size_t)(R + 1));
    int32_t *kp = (int32_t *)malloc(sizeof(int32_t) * (size_t)(R + 1));
    int32_t *kl = (int32_t *)malloc(sizeof(int32_t) * (size_t)R);
    int32_t *idx = (int32_t *)malloc(sizeof(int32_t) * (size_t)(N > 0 ? N : 1));
    uint8_t *dense = (uint8_t *)malloc((size_t)((N > 0 ? N : 1) * MLA_D_QK * es));
    int rc = -1;
    if (!qo || !kp || !kl || !idx || !dense) {
        mla_msg(msg, cap, "host allocation failed (sparse reference, %lld keys)", (long long)N);
        goto done;
    }
    qo[0] = kp[0] = 0;
    idx[0] = 0;
    for (int32_t r = 0, n = 0; r < R; r++) {
        const int32_t *row = c->h_sparse + (int64_t)(t0 + r) * K;
        for (int64_t j = 0; j < K; j++) {
            if (row[j] < 0 || row[j] >= slots) continue; /* no key */
            memcpy(dense + (int64_t)n * MLA_D_QK * es,
                   mla_at(c->h_kv, (int64_t)row[j] * MLA_D_QK, es), (size_t)(MLA_D_QK * es));
            idx[n] = n;
            n++;
        }
        qo[r + 1] = r + 1;
        kp[r + 1] = n;
        kl[r] = n - kp[r];
    }
    {
        fi_caps caps = mla_caps(&c->o, R, R, N > 0 ? (int32_t)N : 1);
        caps.page_size = 1;
        caps.sparse_top_k = 0;
        caps.variant = 0;
        fi_batch bt;
        memset(&bt, 0, sizeof bt);
        bt.form = FI_FORM_INDPTR;
        bt.batch_size = R;
        bt.qo_indptr = qo;
        bt.kv_indptr = kp;
        bt.kv_indices = idx;
        bt.kv_len = kl;
        bt.causal = 0;
        bt.window_left = -1;
        fi_attn_args a = mla_case_args(c, 0); /* q rows, sinks, scales: the case's */
        const int64_t q0 = (int64_t)t0 * H * MLA_D_QK, np = N > 0 ? N : 1, one = 1;
        int64_t ks[4] = {np, 1, 1, MLA_D_CKV}, kst[4] = {MLA_D_QK, MLA_D_QK, MLA_D_QK, 1};
        int64_t kr[4] = {np, 1, 1, MLA_D_KPE};
        a.q.data = mla_at(c->h_q, q0, c->q_es);
        a.q_rope.data = mla_at(c->h_q, q0 + MLA_D_CKV, c->q_es);
        a.q.shape[0] = a.q_rope.shape[0] = R;
        a.k = fi_tensor_make(dense, a.k.dtype, 4, ks, kst);
        a.k_rope = fi_tensor_make(dense + MLA_D_CKV * es, a.k.dtype, 4, kr, kst);
        a.page_table = fi_tensor_make(idx, FI_DTYPE_I32, 1, &np, &one);
        a.out.data = c->ref_out + (int64_t)t0 * H * MLA_D_CKV;
        a.out.shape[0] = R;
        a.lse.data = c->ref_lse + (int64_t)t0 * H;
        a.lse.shape[0] = R;
        const fi_status st = fi_naive_attention(&caps, &bt, &a);
        if (st != FI_OK) {
            mla_msg(msg, cap, "fi_naive_attention (sparse, gathered): %s", fi_status_name(st));
            goto done;
        }
    }
    rc = 0;
done:
    free(qo);
    free(kp);
    free(kl);
    free(idx);
    free(dense);
    return rc;
}

/* The fp64 truth into ref_out / ref_lse (always with lse). */
static inline int mla_case_reference(mla_case *c, char *msg, size_t cap) {
    if (c->o.sparse_top_k > 0) return mla_case_reference_sparse(c, 0, c->B, msg, cap);
    fi_caps caps = mla_caps(&c->o, c->B, c->tokens, c->num_pages);
    fi_attn_args a = mla_case_args(c, 0);
    fi_status st = fi_naive_attention(&caps, &c->fb.batch, &a);
    if (st != FI_OK) {
        mla_msg(msg, cap, "fi_naive_attention: %s", fi_status_name(st));
        return -1;
    }
    return 0;
}

/* The fp64 truth of request b alone (BLOCK_TABLES form): a one-request sub-batch whose
 * views start at b's token rows and page row (the whole batch's reference would take
 * minutes at bench sizes); sparse cases: b's gathered rows. */
static inline int mla_case_reference_request(mla_case *c, int32_t b, char *msg, size_t cap) {
    if (c->o.sparse_top_k > 0) return mla_case_reference_sparse(c, b, b + 1, msg, cap);
    if (c->o.form != FI_FORM_BLOCK_TABLES) {
        mla_msg(msg, cap, "mla_case_reference_request: BLOCK_TABLES cases only");
        return -1;
    }
    const int64_t H = c->o.heads, q0 = c->q_offset[b], ql = c->fb.q_lens[b];
    fi_batch sub = c->fb.batch;
    sub.batch_size = 1;
    sub.block_tables = c->fb.page_table + (int64_t)b * c->P;
    sub.seq_lens = c->fb.kv_lens + b;
    const fi_caps caps = mla_caps(&c->o, 1, (int32_t)ql, c->num_pages);
    fi_attn_args a = mla_case_args(c, 0);
    a.q.data = mla_at(c->h_q, q0 * H * MLA_D_QK, c->q_es);
    a.q_rope.data = mla_at(c->h_q, q0 * H * MLA_D_QK + MLA_D_CKV, c->q_es);
    a.q.shape[0] = a.q_rope.shape[0] = ql;
    a.page_table.data = (void *)sub.block_tables;
    a.page_table.shape[0] = 1;
    a.out.data = c->ref_out + q0 * H * MLA_D_CKV;
    a.out.shape[0] = ql;
    a.lse.data = c->ref_lse + q0 * H;
    a.lse.shape[0] = ql;
    const fi_status st = fi_naive_attention(&caps, &sub, &a);
    if (st != FI_OK) {
        mla_msg(msg, cap, "fi_naive_attention (request %d): %s", b, fi_status_name(st));
        return -1;
    }
    return 0;
}

/* Copy the device outputs to h_out / h_lse. */
static inline int mla_case_download(mla_case *c, char *msg, size_t cap) {
    const gc_outputs o = mla_case_outputs(c);
    return gc_download(&o, msg, cap);
}

/* Element i of the downloaded output (the out dtype: 16-bit). */
static inline double mla_out_value(const void *c, int64_t i) {
    const mla_case *m = (const mla_case *)c;
    return mla_to_f32(mla_o_dtype(&m->o), m->h_out[i]);
}

/* Compare rows of requests [b0, b1) of the GPU output (h_out/h_lse, after download) with
 * ref_out / ref_lse at the same token rows (lse within tol too).  *worst_out / *worst_lse:
 * largest errors seen.  0 if every row is within tol, else -1 and the first bad row in msg. */
static inline int mla_case_compare(const mla_case *c, int32_t b0, int32_t b1, double tol,
                                   double *worst_out, double *worst_lse, char *msg, size_t cap) {
    const gc_rows r = {c->fb.q_lens, c->fb.kv_lens, c->q_offset, c->o.heads, MLA_D_CKV, 0,
                       mla_out_value, c, c->h_lse, c->ref_out, c->ref_lse, c->o.return_lse,
                       tol};
    return gc_compare_rows(&r, b0, b1, tol, worst_out, worst_lse, msg, cap);
}

/* Download and compare every request. */
static inline int mla_case_check(mla_case *c, double tol, double *worst_out, double *worst_lse,
                                 char *msg, size_t cap) {
    if (mla_case_download(c, msg, cap)) return -1;
    return mla_case_compare(c, 0, c->B, tol, worst_out, worst_lse, msg, cap);
}

/* One line naming the case, for logs and failure messages. */
static inline void mla_case_name(const mla_case *c, char *buf, size_t cap) {
    int groups, items;
    int32_t maxkv;
    gc_plan_counts(c->plan, c->fb.kv_lens, c->B, &groups, &items, &maxkv);
    int n = snprintf(buf, cap, "%s %s H=%d page_size=%d B=%d tokens=%d max_kv=%d causal=%d "
             "window_left=%d pages=%s ctas=%d sinks=%d lse=%d scale_ptr=%d items=%d groups=%d",
             c->o.dtype == FI_DTYPE_F16 ? "f16" : "bf16",
             c->o.form == FI_FORM_BLOCK_TABLES ? "concat/block_tables" : "split/indptr",
             c->o.heads, c->o.page_size, c->B, c->tokens, maxkv, c->o.causal,
             c->o.windowed ? c->o.window_left : -1, c->o.contig_pages ? "contig" : "shuffled",
             c->plan ? fi_plan_caps(c->plan)->num_ctas : -1, c->o.sinks, c->o.return_lse,
             c->o.scale_ptr, items, groups);
    /* the fp8 / sparse options, only where set (16-bit dense names as before) */
    if (n > 0 && (size_t)n < cap && (c->o.q_dtype || c->o.kv_dtype || c->o.o_dtype))
        n += snprintf(buf + n, cap - (size_t)n, " q=%s kv=%s out=%s",
                      gc_dtype_name(mla_q_dtype(&c->o)), gc_dtype_name(mla_kv_dtype(&c->o)),
                      gc_dtype_name(mla_o_dtype(&c->o)));
    if (n > 0 && (size_t)n < cap && c->o.sparse_top_k > 0)
        snprintf(buf + n, cap - (size_t)n, " sparse_top_k=%d pad=%d%% empty_every=%d dup=%d",
                 c->o.sparse_top_k, c->o.sparse_pad, c->o.sparse_empty_every, c->o.sparse_dup);
}

#endif /* FI_TESTS_GPU_MLA_GPU_CASE_H */
