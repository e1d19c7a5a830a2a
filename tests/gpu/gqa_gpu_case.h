/*
 * tests/gpu/gqa_gpu_case.h - one GQA paged decode problem (xqa_batch_decode_with_kv_cache)
 * on the GPU and on the fp64 reference, shared by tests/gpu/test_gqa_gpu.c and
 * bench/bench_gqa.c (header-only, static inline; numeric helpers in gpu_case_common.h).
 *
 * A case owns:
 *   - the batch (viz/batch.h fibatch, FI_FORM_BLOCK_TABLES: block_tables [B, P], seq_lens,
 *     uniform q_len 1..8, causal = q_len > 1 (the reference's spec-decoding mask: row i of
 *     a request sees keys [0, kv_len - q_len + i]), window_left, page ids shuffled or in
 *     request order);
 *   - host inputs with fresh random values: q [B * q_len, H_q, D] bf16 / fp16 in [-1, 1);
 *     the KV cache kept canonical on the host, [num_pages, page_size, H_kv, W] for K and
 *     for V (W = D elements; NVFP4: D / 2 bytes, two e2m1 values each), in the KV dtype:
 *     the q dtype, fp8 e4m3 (random codes |x| < 2) or NVFP4 (random e2m1 nibbles and e4m3
 *     block scales [num_pages, page_size, H_kv, D / 16] for K and for V);
 *   - the device KV cache packed from the canonical arrays in one of the reference's four
 *     forms (gqa_kv_geom):
 *       NHD single tensor [pages, 2, page_size, H_kv, W]: k at +0, v at +page_size H_kv W;
 *       HND single tensor [pages, 2, H_kv, page_size, W]: k at +0, v at +H_kv page_size W;
 *       NHD / HND (K, V) pair: two tensors [pages, page_size, H_kv, W] / [pages, H_kv,
 *       page_size, W] (two regions of one allocation, V after K);
 *     every page optionally padded by page_pad elements (a page stride larger than dense),
 *     the padding bytes 0xff (NaN in bf16 / fp16 / e4m3), so a kernel that reads outside
 *     the rows its strides name picks up NaN.  The NVFP4 scales follow the same form;
 *   - out [B * q_len, H_q, D] in o_dtype (the q dtype, or e4m3: stored = fp8(out / o_scale))
 *     and lse [tokens, H_q] fp32 on the device, poisoned with NaN bytes (0xff) before every
 *     run;
 *   - a device plan (caller-owned cudaMalloc'd workspace) updated on the case's stream;
 *   - the fp64 truth (fi_naive_attention) in fp32 host arrays, computed request by request
 *     on a compact copy of that request's pages dequantised to fp32 (fp8 and NVFP4 exactly
 *     as the kernel must: e4m3 -> float, e2m1 x e4m3 scale; their global scale is folded
 *     into bmm1 / bmm2 by the caller, as the reference API does), so a benchmark can check
 *     a few requests of a batch whose whole reference would take minutes.
 * Checking (gqa_case_compare): no NaN / inf anywhere; per (token, head) row
 * ||out - ref|| / ||ref|| <= tol (gqa_case_tol: 1e-2 for bf16 / fp16 out, also with fp8 or
 * NVFP4 KV against the dequantised reference; 7e-2 for fp8 out, compared after out x
 * o_scale: e4m3 keeps 3 mantissa bits, so its rounding alone moves an element by up to
 * 2^-4 = 6.25% of its value (about 2-3% RMS over a row); 7e-2 covers that plus the 1e-2
 * of the fp32 path, while a wrong scale, a missed key block or a wrong row is off by far
 * more); rows whose reference is exactly zero (no key) must be exactly zero; lse
 * |gpu - ref| <= 1e-2 absolute, -inf exactly where the reference is -inf.
 *
 * The same case serves context attention (FI_KIND_CONTEXT, tests/gpu/context_gpu_case.h):
 * gqa_opts.kind, .form (CUM_SEQ_LENS / INDPTR / BLOCK_TABLES), .kv_split_pages (block_tables
 * [B, 2, P]) and .non_causal, built by gqa_case_init_lens from per-request q_len (q_offset
 * their prefix sums).  All of them zero is the decode case above, unchanged.
 */
#ifndef FI_TESTS_GPU_GQA_GPU_CASE_H
#define FI_TESTS_GPU_GQA_GPU_CASE_H

#include <math.h>
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

#define GQA_TOL 1e-2
#define GQA_TOL_FP8_OUT 7e-2
#define GQA_TOL_LSE 1e-2

typedef enum gqa_layout { GQA_NHD = 0, GQA_HND = 1 } gqa_layout;
typedef enum gqa_kv_form { GQA_KV_SINGLE = 0, GQA_KV_PAIR = 1 } gqa_kv_form;

typedef struct gqa_opts {
    fi_dtype dtype;        /* q (and out unless o_dtype): FI_DTYPE_BF16 or FI_DTYPE_F16 */
    fi_dtype kv_dtype;     /* 0: dtype; FI_DTYPE_E4M3 (fp8); FI_DTYPE_E2M1 (NVFP4) */
    fi_dtype o_dtype;      /* 0: dtype; FI_DTYPE_E4M3 with o_scale */
    float o_scale;         /* fp8 out: stored = fp8(out / o_scale); 0: the case picks one */
    int32_t heads_q, heads_kv; /* H_q, H_kv: group = H_q / H_kv in {1, 2, 4, 5, 8, 16} */
    int32_t head_dim;      /* 64, 128, 256 */
    int32_t page_size;     /* 16, 32, 64, 128 (1 planned) */
    gqa_layout layout;     /* NHD or HND */
    gqa_kv_form kv_form;   /* one [pages, 2, ...] tensor or a (K, V) pair */
    int32_t page_pad;      /* extra elements after each page (page stride > dense); must
                              keep strides multiples of 16 bytes (multiple of 16 / 8) */
    int32_t q_len;         /* 1..8 for every request; causal = q_len > 1 */
    int32_t windowed;      /* 1: window_left is used; 0: -1 (none) */
    int32_t window_left;
    int32_t sinks;         /* 1: random sinks [H_q] in [-2, 6) */
    int32_t return_lse;    /* 1: pass lse */
    int32_t scale_ptr;     /* 1: bmm1 / bmm2 scales through device pointers */
    int32_t num_ctas;      /* caps.num_ctas, 0: the device's choice */
    int32_t max_batch;     /* caps.max_batch (0: the batch size) */
    int32_t max_q_tokens;  /* caps.max_q_tokens (0: the batch's tokens) */
    int32_t extra_pages;   /* caps.num_pages = pages used + this */
    int32_t contig_pages;  /* 1: page ids in request order; 0: a seeded shuffle */
    int32_t variant;       /* caps.variant (0: the kind's default) */
    /* context attention (zero for GQA decode): */
    fi_kind kind;          /* 0: FI_KIND_GQA_DECODE; FI_KIND_CONTEXT */
    fi_batch_form form;    /* 0: FI_FORM_BLOCK_TABLES; FI_FORM_CUM_SEQ_LENS, FI_FORM_INDPTR */
    int32_t kv_split_pages; /* 1: block_tables [B, 2, P], K and V page ids differ */
    int32_t non_causal;    /* context: 1 = every row sees all kv_len keys (decode: causal =
                              q_len > 1 whatever this says) */
} gqa_opts;

/* Where K and V rows live in the device buffer, in elements of the KV tensors. */
typedef struct gqa_kv_geom {
    int64_t page_stride, tok_stride, head_stride;
    int64_t k_off, v_off;  /* first element of K's and V's page 0 */
    int64_t total;         /* elements of the buffer */
} gqa_kv_geom;

typedef struct gqa_case {
    gqa_opts o;                      /* kv_dtype / o_dtype resolved (never 0) */
    fibatch fb;
    int32_t B, tokens, num_pages, P; /* P: block_tables row length */
    int32_t *q_offset;               /* [B] first token row of request b */
    int64_t W;                       /* last dim of the K / V tensors: D, or D / 2 bytes */
    int64_t kv_es;                   /* bytes of one K / V element (2, 1, 1) */
    int64_t row_bytes;               /* W * kv_es: one (page, token, head) row */
    int64_t sf_w;                    /* NVFP4: D / 16 scale bytes a row; else 0 */
    int64_t out_es;                  /* bytes of one out element */
    uint16_t *h_q;                   /* [tokens, H_q, D] */
    int64_t n_q;
    uint8_t *h_k, *h_v;              /* canonical [num_pages, page_size, H_kv, row_bytes] */
    uint8_t *h_ksf, *h_vsf;          /* NVFP4: canonical [num_pages, page_size, H_kv, sf_w] */
    int64_t n_rows;                  /* num_pages * page_size * H_kv */
    float *h_sinks;                  /* [H_q] or NULL */
    float bmm1_scale, bmm2_scale;
    float h_scales[2];
    gqa_kv_geom kv, sf;              /* the device packing of o.layout / o.kv_form */
    /* device */
    void *d_q, *d_kv, *d_sf, *d_out, *d_lse, *d_ws;
    int32_t *d_pt;
    float *d_sinks, *d_scales;       /* d_scales[0] bmm1, [1] bmm2 */
    size_t kv_bytes, sf_bytes, ws_bytes, out_bytes, lse_bytes;
    cudaStream_t stream;
    fi_plan *plan;
    /* results */
    void *h_out;                     /* [tokens, H_q, D] out_es bytes each, copied back */
    float *h_lse;                    /* [tokens, H_q] */
    float *ref_out, *ref_lse;        /* fp64 truth rounded to fp32 ([tokens, H_q, D], [tokens, H_q]) */
} gqa_case;

static inline const char *gqa_dtype_name(fi_dtype d) { return gc_dtype_name(d); }

/* The device packing of rows of width w (elements) under (layout, form, pad). */
static inline gqa_kv_geom gqa_geom(gqa_layout layout, gqa_kv_form form, int64_t pages,
                                   int64_t ps, int64_t hkv, int64_t w, int64_t pad) {
    gqa_kv_geom g;
    const int64_t dense = ps * hkv * w; /* one page of K (or of V) */
    g.tok_stride = layout == GQA_NHD ? hkv * w : w;
    g.head_stride = layout == GQA_NHD ? w : ps * w;
    g.k_off = 0;
    if (form == GQA_KV_SINGLE) {
        g.page_stride = 2 * dense + pad;
        g.v_off = dense;
        g.total = pages * g.page_stride;
    } else {
        g.page_stride = dense + pad;
        g.v_off = pages * g.page_stride;
        g.total = 2 * pages * g.page_stride;
    }
    return g;
}

static inline fi_caps gqa_caps(const gqa_opts *o, int32_t B, int32_t tokens, int32_t pages) {
    fi_caps c;
    memset(&c, 0, sizeof c);
    c.kind = o->kind ? o->kind : FI_KIND_GQA_DECODE;
    c.max_batch = o->max_batch > 0 ? o->max_batch : B;
    c.max_q_tokens = o->max_q_tokens > 0 ? o->max_q_tokens : tokens > 0 ? tokens : 1;
    c.num_pages = pages;
    c.page_size = o->page_size;
    c.num_qo_heads = o->heads_q;
    c.num_kv_heads = o->heads_kv;
    c.head_dim_qk = c.head_dim_vo = o->head_dim;
    c.q_dtype = o->dtype;
    c.kv_dtype = o->kv_dtype ? o->kv_dtype : o->dtype;
    c.o_dtype = o->o_dtype ? o->o_dtype : o->dtype;
    c.num_ctas = o->num_ctas;
    c.variant = o->variant;
    return c;
}

/* A [pages, page_size, H_kv, w] view of a region of the device buffer under geometry g. */
static inline fi_tensor gqa_cache_view(void *base, int64_t off, fi_dtype dt, const gqa_kv_geom *g,
                                       int64_t pages, int64_t ps, int64_t hkv, int64_t w,
                                       int64_t es) {
    int64_t shape[4] = {pages, ps, hkv, w};
    int64_t stride[4] = {g->page_stride, g->tok_stride, g->head_stride, 1};
    return fi_tensor_make((uint8_t *)base + off * es, dt, 4, shape, stride);
}

/* The page table as fi_run reads it, at d_pt: block_tables [B, P], or [B, 2, P] with
 * kv_split_pages (row stride 2 P, V row at + P); kv_indices [nnz] in the INDPTR form. */
static inline fi_tensor gqa_page_table_view(const gqa_case *c, int32_t *d_pt) {
    const int64_t B = c->B, P = c->P;
    if (c->fb.batch.form == FI_FORM_INDPTR) {
        const int64_t n = c->fb.page_table_len, one = 1;
        return fi_tensor_make(d_pt, FI_DTYPE_I32, 1, &n, &one);
    }
    if (c->fb.batch.kv_split_pages) {
        int64_t ts[3] = {B, 2, P}, tst[3] = {2 * P, P, 1};
        return fi_tensor_make(d_pt, FI_DTYPE_I32, 3, ts, tst);
    }
    int64_t ts[2] = {B, P}, tst[2] = {P, 1};
    return fi_tensor_make(d_pt, FI_DTYPE_I32, 2, ts, tst);
}

/* fi_run's arguments for the case on device buffers q, kv, sf (NVFP4 scales, else unused)
 * and out laid out as the case's own (a benchmark's copies of them); page table, lse,
 * sinks and scales the case's. */
static inline fi_attn_args gqa_case_args_at(const gqa_case *c, void *q, void *kv, void *sf,
                                            void *out) {
    const int64_t Hq = c->o.heads_q, Hkv = c->o.heads_kv, D = c->o.head_dim,
                  ps = c->o.page_size, T = c->tokens, NP = c->num_pages;
    fi_attn_args a;
    memset(&a, 0, sizeof a);
    int64_t qs[3] = {T, Hq, D}, qst[3] = {Hq * D, D, 1};
    a.q = fi_tensor_make(q, c->o.dtype, 3, qs, qst);
    a.k = gqa_cache_view(kv, c->kv.k_off, c->o.kv_dtype, &c->kv, NP, ps, Hkv, c->W, c->kv_es);
    a.v = gqa_cache_view(kv, c->kv.v_off, c->o.kv_dtype, &c->kv, NP, ps, Hkv, c->W, c->kv_es);
    if (c->sf_w) {
        a.k_sf = gqa_cache_view(sf, c->sf.k_off, FI_DTYPE_E4M3, &c->sf, NP, ps, Hkv, c->sf_w, 1);
        a.v_sf = gqa_cache_view(sf, c->sf.v_off, FI_DTYPE_E4M3, &c->sf, NP, ps, Hkv, c->sf_w, 1);
    }
    a.page_table = gqa_page_table_view(c, c->d_pt);
    a.out = fi_tensor_make(out, c->o.o_dtype, 3, qs, qst);
    int64_t ls[2] = {T, Hq}, lst[2] = {Hq, 1};
    if (c->o.return_lse) a.lse = fi_tensor_make(c->d_lse, FI_DTYPE_F32, 2, ls, lst);
    a.sinks = c->o.sinks ? c->d_sinks : NULL;
    if (c->o.scale_ptr) {
        a.bmm1_scale_ptr = c->d_scales;
        a.bmm2_scale_ptr = c->d_scales + 1;
    }
    /* with pointers set the value fields must be ignored: give them values that would show */
    a.bmm1_scale = c->o.scale_ptr ? 1000.0f : c->bmm1_scale;
    a.bmm2_scale = c->o.scale_ptr ? -1000.0f : c->bmm2_scale;
    a.o_scale = c->o.o_dtype == FI_DTYPE_E4M3 ? c->o.o_scale : 0.0f;
    return a;
}

/* fi_run's arguments for the case's own device buffers. */
static inline fi_attn_args gqa_case_args(const gqa_case *c) {
    return gqa_case_args_at(c, c->d_q, c->d_kv, c->d_sf, c->d_out);
}

static inline void gqa_case_free(gqa_case *c) {
    if (!c) return;
    if (c->plan) fi_plan_destroy(c->plan);
    void *dev[] = {c->d_q, c->d_kv, c->d_sf, c->d_out, c->d_lse, c->d_ws,
                   c->d_pt, c->d_sinks, c->d_scales};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) cudaFree(dev[i]);
    if (c->stream) cudaStreamDestroy(c->stream);
    void *host[] = {c->q_offset, c->h_q, c->h_k, c->h_v, c->h_ksf, c->h_vsf, c->h_sinks,
                    c->h_out, c->h_lse, c->ref_out, c->ref_lse};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
    fibatch_free(&c->fb);
    memset(c, 0, sizeof *c);
}

/* Pack the canonical rows (n_rows of rb bytes, row r = (page, token, head)) of K and V into
 * dst (g.total * es bytes, padding 0xff) under geometry g. */
static inline void gqa_pack(uint8_t *dst, const gqa_kv_geom *g, const uint8_t *k,
                            const uint8_t *v, int64_t pages, int64_t ps, int64_t hkv,
                            int64_t rb, int64_t es) {
    memset(dst, 0xff, (size_t)(g->total * es));
    for (int64_t p = 0; p < pages; p++)
        for (int64_t t = 0; t < ps; t++)
            for (int64_t h = 0; h < hkv; h++) {
                const int64_t r = (p * ps + t) * hkv + h;
                const int64_t at = p * g->page_stride + t * g->tok_stride + h * g->head_stride;
                memcpy(dst + (g->k_off + at) * es, k + r * rb, (size_t)rb);
                memcpy(dst + (g->v_off + at) * es, v + r * rb, (size_t)rb);
            }
}

/* (Re)pack the canonical KV (and NVFP4 scales) into the device buffers under the given
 * layout and form (the buffers are sized for either: same elements, pads included). */
static inline int gqa_case_set_layout(gqa_case *c, gqa_layout layout, gqa_kv_form form,
                                      char *msg, size_t cap) {
    const int64_t NP = c->num_pages, ps = c->o.page_size, Hkv = c->o.heads_kv;
    c->o.layout = layout;
    c->o.kv_form = form;
    c->kv = gqa_geom(layout, form, NP, ps, Hkv, c->W, c->o.page_pad);
    uint8_t *stage = (uint8_t *)malloc((size_t)(c->kv.total * c->kv_es));
    if (!stage) {
        gc_msg(msg, cap, "host allocation failed (%lld bytes)", (long long)(c->kv.total * c->kv_es));
        return -1;
    }
    gqa_pack(stage, &c->kv, c->h_k, c->h_v, NP, ps, Hkv, c->row_bytes, c->kv_es);
    cudaError_t e = cudaSuccess;
    if ((size_t)(c->kv.total * c->kv_es) > c->kv_bytes) { /* a larger page pad than at init */
        cudaFree(c->d_kv);
        c->d_kv = NULL;
        c->kv_bytes = (size_t)(c->kv.total * c->kv_es);
        e = cudaMalloc(&c->d_kv, c->kv_bytes);
    }
    if (e == cudaSuccess)
        e = cudaMemcpy(c->d_kv, stage, (size_t)(c->kv.total * c->kv_es), cudaMemcpyHostToDevice);
    free(stage);
    if (e != cudaSuccess) {
        gc_msg(msg, cap, "KV upload: %s", cudaGetErrorString(e));
        return -1;
    }
    if (c->sf_w) {
        c->sf = gqa_geom(layout, form, NP, ps, Hkv, c->sf_w, 0);
        stage = (uint8_t *)malloc((size_t)c->sf.total);
        if (!stage) {
            gc_msg(msg, cap, "host allocation failed");
            return -1;
        }
        gqa_pack(stage, &c->sf, c->h_ksf, c->h_vsf, NP, ps, Hkv, c->sf_w, 1);
        e = cudaMemcpy(c->d_sf, stage, (size_t)c->sf.total, cudaMemcpyHostToDevice);
        free(stage);
        if (e != cudaSuccess) {
            gc_msg(msg, cap, "scale upload: %s", cudaGetErrorString(e));
            return -1;
        }
    }
    return 0;
}

/* Copy q, the page table, sinks and scales to the device (the KV: gqa_case_set_layout). */
static inline int gqa_case_upload(gqa_case *c, char *msg, size_t cap) {
    GC_CUDA(cudaMemcpy(c->d_q, c->h_q, (size_t)c->n_q * 2, cudaMemcpyHostToDevice), msg, cap);
    if (c->fb.page_table_len > 0)
        GC_CUDA(cudaMemcpy(c->d_pt, c->fb.page_table, (size_t)c->fb.page_table_len * 4,
                           cudaMemcpyHostToDevice), msg, cap);
    if (c->h_sinks)
        GC_CUDA(cudaMemcpy(c->d_sinks, c->h_sinks, (size_t)c->o.heads_q * 4,
                           cudaMemcpyHostToDevice), msg, cap);
    c->h_scales[0] = c->bmm1_scale;
    c->h_scales[1] = c->bmm2_scale;
    GC_CUDA(cudaMemcpy(c->d_scales, c->h_scales, 8, cudaMemcpyHostToDevice), msg, cap);
    return 0;
}

/* Fill the canonical K and V (and scales) with fresh random values of the KV dtype. */
static inline void gqa_fill_kv(gqa_case *c, tt_rng *rng) {
    const int64_t n = c->n_rows * c->row_bytes;
    if (c->o.kv_dtype == FI_DTYPE_E4M3) {
        gc_fill_random_e4m3(c->h_k, n, rng);
        gc_fill_random_e4m3(c->h_v, n, rng);
    } else if (c->o.kv_dtype == FI_DTYPE_E2M1) {
        gc_fill_random_bytes(c->h_k, n, rng);
        gc_fill_random_bytes(c->h_v, n, rng);
        gc_fill_random_e4m3_scales(c->h_ksf, c->n_rows * c->sf_w, rng);
        gc_fill_random_e4m3_scales(c->h_vsf, c->n_rows * c->sf_w, rng);
    } else {
        gc_fill_random((uint16_t *)c->h_k, n / 2, c->o.kv_dtype, rng);
        gc_fill_random((uint16_t *)c->h_v, n / 2, c->o.kv_dtype, rng);
    }
}

/* Build a case of n requests of q_len[n] rows and kv_len[n] keys (context attention: any
 * q_len >= 0; decode: one q_len 1..8 for all, see gqa_case_init): the batch in o's form
 * (q_offset[b] = the sum of q_len before b), random inputs, device buffers in o's layout, a
 * planned device plan.  0 on success, else -1 and a message naming the call that failed
 * and its status (the case is then freed). */
static inline int gqa_case_init_lens(gqa_case *c, const gqa_opts *o, const int32_t *q_len,
                                     const int32_t *kv_len, int32_t n, tt_rng *rng, char *msg,
                                     size_t cap) {
    memset(c, 0, sizeof *c);
    c->o = *o;
    if (!c->o.kv_dtype) c->o.kv_dtype = o->dtype;
    if (!c->o.o_dtype) c->o.o_dtype = o->dtype;
    int32_t max_q = 0;
    for (int32_t b = 0; b < n; b++)
        if (q_len[b] > max_q) max_q = q_len[b];
    c->o.q_len = max_q;
    fibatch_opts bo = fibatch_default_opts();
    bo.form = o->form ? o->form : FI_FORM_BLOCK_TABLES;
    bo.kv_split_pages = o->kv_split_pages;
    bo.page_size = o->page_size;
    bo.shuffle = !o->contig_pages;
    bo.seed = tt_rng_next(rng);
    bo.causal = o->kind == FI_KIND_CONTEXT ? !o->non_causal : max_q > 1;
    bo.window_left = o->windowed ? o->window_left : -1;
    fibatch_status bs = fibatch_build(&bo, q_len, kv_len, n, NULL, &c->fb);
    if (bs != FIBATCH_OK) {
        gc_msg(msg, cap, "fibatch_build: %s", fibatch_status_name(bs));
        return -1;
    }
    c->B = n;
    c->tokens = c->fb.total_q_tokens;
    c->num_pages = c->fb.num_pages + o->extra_pages;
    c->P = c->fb.batch.max_pages_per_seq;
    const int64_t Hq = o->heads_q, Hkv = o->heads_kv, D = o->head_dim, T = c->tokens;
    const int nvfp4 = c->o.kv_dtype == FI_DTYPE_E2M1;
    c->W = nvfp4 ? D / 2 : D;
    c->kv_es = c->o.kv_dtype == FI_DTYPE_F16 || c->o.kv_dtype == FI_DTYPE_BF16 ? 2 : 1;
    c->row_bytes = c->W * c->kv_es;
    c->sf_w = nvfp4 ? D / 16 : 0;
    c->out_es = c->o.o_dtype == FI_DTYPE_E4M3 ? 1 : 2;
    c->n_rows = (int64_t)c->num_pages * o->page_size * Hkv;
    c->n_q = T * Hq * D;
    c->q_offset = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    c->h_q = (uint16_t *)malloc((size_t)c->n_q * 2);
    c->h_k = (uint8_t *)malloc((size_t)(c->n_rows * c->row_bytes));
    c->h_v = (uint8_t *)malloc((size_t)(c->n_rows * c->row_bytes));
    if (!c->q_offset || !c->h_q || !c->h_k || !c->h_v) goto fail_mem;
    if (nvfp4) {
        c->h_ksf = (uint8_t *)malloc((size_t)(c->n_rows * c->sf_w));
        c->h_vsf = (uint8_t *)malloc((size_t)(c->n_rows * c->sf_w));
        if (!c->h_ksf || !c->h_vsf) goto fail_mem;
    }
    for (int32_t b = 0, t = 0; b < n; t += q_len[b], b++) c->q_offset[b] = t;
    gc_fill_random(c->h_q, c->n_q, o->dtype, rng);
    gqa_fill_kv(c, rng);
    /* scores ~ bmm1 x N(0, D / 9) for bf16 KV: std 0.4 .. 1.6 (bmm1 scaled by sqrt(576 / D),
     * as the MLA cases at D 576), neither flat nor one-hot */
    c->bmm1_scale = (0.05f + 0.15f * (tt_rng_float(rng) + 1.0f) * 0.5f) * sqrtf(576.0f / (float)D);
    c->bmm2_scale = 0.5f + 0.75f * (tt_rng_float(rng) + 1.0f);
    if (nvfp4) { /* |k| up to 6 x 0.5: keep the scores in the same range */
        c->bmm1_scale *= 0.5f;
        c->bmm2_scale *= 0.5f;
    }
    if (c->o.o_dtype == FI_DTYPE_E4M3 && !(c->o.o_scale > 0.0f)) /* |out| / o_scale ~ 10..200 */
        c->o.o_scale = 0.01f + 0.005f * (tt_rng_float(rng) + 1.0f);
    if (o->sinks) {
        c->h_sinks = (float *)malloc(sizeof(float) * (size_t)Hq);
        if (!c->h_sinks) goto fail_mem;
        /* [-2, 6): from negligible to dominant next to hundreds of keys */
        for (int64_t h = 0; h < Hq; h++) c->h_sinks[h] = 2.0f + 4.0f * tt_rng_float(rng);
    }
    c->out_bytes = (size_t)(T * Hq * D * c->out_es);
    c->lse_bytes = (size_t)(T * Hq * 4);
    c->h_out = malloc(c->out_bytes);
    c->h_lse = (float *)malloc(c->lse_bytes);
    c->ref_out = (float *)malloc(sizeof(float) * (size_t)(T * Hq * D));
    c->ref_lse = (float *)malloc(c->lse_bytes);
    if (!c->h_out || !c->h_lse || !c->ref_out || !c->ref_lse) goto fail_mem;
    /* device KV: the larger of the two forms (pair pads every page of K and of V) */
    {
        const int64_t dense = (int64_t)o->page_size * Hkv * c->W;
        c->kv_bytes = (size_t)(2 * (int64_t)c->num_pages * (dense + o->page_pad) * c->kv_es);
        c->sf_bytes = nvfp4 ? (size_t)(2 * c->n_rows * c->sf_w) : 0;
    }

    GC_CUDA_OR_GOTO(cudaStreamCreate(&c->stream), msg, cap, fail);
    GC_CUDA_OR_GOTO(cudaMalloc(&c->d_q, (size_t)c->n_q * 2), msg, cap, fail);
    GC_CUDA_OR_GOTO(cudaMalloc(&c->d_kv, c->kv_bytes), msg, cap, fail);
    if (nvfp4) GC_CUDA_OR_GOTO(cudaMalloc(&c->d_sf, c->sf_bytes), msg, cap, fail);
    if (gc_alloc_case_buffers(&c->d_pt, c->fb.page_table_len, &c->d_out, c->out_bytes, &c->d_lse,
                              c->lse_bytes, &c->d_sinks, Hq, &c->d_scales, msg, cap))
        goto fail;
    if (gqa_case_upload(c, msg, cap) || gqa_case_set_layout(c, o->layout, o->kv_form, msg, cap))
        goto fail;
    {
        const fi_caps caps = gqa_caps(&c->o, n, c->tokens, c->num_pages);
        char note[64];
        snprintf(note, sizeof note, " (caps kv %s out %s)", gqa_dtype_name(caps.kv_dtype),
                 gqa_dtype_name(caps.o_dtype));
        if (gc_plan_make(&caps, &c->fb.batch, c->stream, &c->d_ws, &c->ws_bytes, &c->plan, note,
                         msg, cap))
            goto fail;
    }
    return 0;
fail_mem:
    gc_msg(msg, cap, "host allocation failed");
fail:
    gqa_case_free(c);
    return -1;
}

/* Build a decode case: n requests of o->q_len rows each (1..8; 0 is read as 1; causal when
 * > 1) and kv_len[n] keys, as gqa_case_init_lens. */
static inline int gqa_case_init(gqa_case *c, const gqa_opts *o, const int32_t *kv_len,
                                int32_t n, tt_rng *rng, char *msg, size_t cap) {
    const int32_t ql = o->q_len > 0 ? o->q_len : 1;
    int32_t *q_len = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    if (!q_len) {
        memset(c, 0, sizeof *c);
        gc_msg(msg, cap, "host allocation failed");
        return -1;
    }
    for (int32_t b = 0; b < n; b++) q_len[b] = ql;
    const int rc = gqa_case_init_lens(c, o, q_len, kv_len, n, rng, msg, cap);
    free(q_len);
    return rc;
}

/* The case's outputs as the shared run / download helpers see them. */
static inline gc_outputs gqa_case_outputs(const gqa_case *c) {
    gc_outputs o = {c->d_out, c->d_lse, c->h_out, c->h_lse, c->out_bytes, c->lse_bytes};
    return o;
}

/* Poison out and lse (0xff bytes: NaN in every output dtype) on the case's stream. */
static inline int gqa_case_poison(gqa_case *c, char *msg, size_t cap) {
    const gc_outputs o = gqa_case_outputs(c);
    return gc_poison(&o, c->stream, msg, cap);
}

/* Poison, fi_run with the given args, synchronise.  0 on success; the message names
 * fi_run's status (FI_ERR_UNSUPPORTED_* while the GPU family does not run the case). */
static inline int gqa_case_run_args(gqa_case *c, const fi_attn_args *a, char *msg, size_t cap) {
    const gc_outputs o = gqa_case_outputs(c);
    return gc_run_args(&o, c->plan, c->stream, a, msg, cap);
}

static inline int gqa_case_run(gqa_case *c, char *msg, size_t cap) {
    fi_attn_args a = gqa_case_args(c);
    return gqa_case_run_args(c, &a, msg, cap);
}

/* Element d of canonical row r of K (which 0) or V (1), dequantised to fp32. */
static inline float gqa_kv_value(const gqa_case *c, int which, int64_t r, int64_t d) {
    const uint8_t *row = (which ? c->h_v : c->h_k) + r * c->row_bytes;
    switch (c->o.kv_dtype) {
    case FI_DTYPE_E4M3: return gc_e4m3_to_f32(row[d]);
    case FI_DTYPE_E2M1: {
        const uint8_t *sf = (which ? c->h_vsf : c->h_ksf) + r * c->sf_w;
        return gc_e2m1_at(row, d) * gc_e4m3_to_f32(sf[d / 16]);
    }
    default: {
        uint16_t h;
        memcpy(&h, row + d * 2, 2);
        return gc_to_f32(c->o.kv_dtype, h);
    }
    }
}

/* The whole canonical K and V ([n_rows, D], row r = (page, token, head)) dequantised to
 * fp32 (gqa_kv_value: NVFP4 as e2m1 x e4m3 scale) into *k / *v, malloc'd for the caller to
 * free.  0, or -1 and a message (nothing allocated then). */
static inline int gqa_case_dequantised_kv(const gqa_case *c, float **k, float **v, char *msg,
                                          size_t cap) {
    const int64_t D = c->o.head_dim, n = c->n_rows * D;
    *k = (float *)malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    *v = (float *)malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!*k || !*v) {
        free(*k);
        free(*v);
        *k = *v = NULL;
        gc_msg(msg, cap, "host allocation failed (dequantised KV, %lld values)", (long long)n);
        return -1;
    }
    for (int64_t r = 0; r < c->n_rows; r++)
        for (int64_t d = 0; d < D; d++) {
            (*k)[r * D + d] = gqa_kv_value(c, 0, r, d);
            (*v)[r * D + d] = gqa_kv_value(c, 1, r, d);
        }
    return 0;
}

/* The fp64 truth of requests [b0, b1) into ref_out / ref_lse at their token rows: each
 * request alone, its pages gathered (in page-table order) into a compact fp32 cache.
 * Decode cases (2-D block_tables); context cases: ctx_case_reference (context_gpu_case.h). */
static inline int gqa_case_reference_range(gqa_case *c, int32_t b0, int32_t b1, char *msg,
                                           size_t cap) {
    const int64_t Hq = c->o.heads_q, Hkv = c->o.heads_kv, D = c->o.head_dim,
                  ps = c->o.page_size;
    for (int32_t b = b0; b < b1; b++) {
        const int32_t kvl = c->fb.kv_lens[b], ql = c->fb.q_lens[b];
        const int32_t np_used = (int32_t)((kvl + ps - 1) / ps), np = np_used > 0 ? np_used : 1;
        const int64_t elems = (int64_t)np * ps * Hkv * D;
        float *k = (float *)calloc((size_t)elems, sizeof(float));
        float *v = (float *)calloc((size_t)elems, sizeof(float));
        int32_t *pt = (int32_t *)malloc(sizeof(int32_t) * (size_t)np);
        if (!k || !v || !pt) {
            free(k);
            free(v);
            free(pt);
            gc_msg(msg, cap, "host allocation failed (reference of request %d)", b);
            return -1;
        }
        for (int32_t j = 0; j < np; j++) {
            pt[j] = j;
            if (j >= np_used) continue;
            const int64_t page = c->fb.page_table[(int64_t)b * c->P + j];
            for (int64_t t = 0; t < ps; t++)
                for (int64_t h = 0; h < Hkv; h++) {
                    const int64_t r = (page * ps + t) * Hkv + h;
                    float *kd = k + ((j * ps + t) * Hkv + h) * D, *vd = v + ((j * ps + t) * Hkv + h) * D;
                    for (int64_t d = 0; d < D; d++) {
                        kd[d] = gqa_kv_value(c, 0, r, d);
                        vd[d] = gqa_kv_value(c, 1, r, d);
                    }
                }
        }
        fi_caps caps = gqa_caps(&c->o, 1, ql > 0 ? ql : 1, np);
        caps.kv_dtype = caps.o_dtype = FI_DTYPE_F32;
        caps.num_ctas = 1;
        fi_batch sub = c->fb.batch;
        sub.batch_size = 1;
        sub.block_tables = pt;
        sub.max_pages_per_seq = np;
        sub.seq_lens = &c->fb.kv_lens[b];
        const int64_t q0 = c->q_offset[b];
        fi_attn_args a;
        memset(&a, 0, sizeof a);
        int64_t qs[3] = {ql, Hq, D}, qst[3] = {Hq * D, D, 1};
        int64_t ks[4] = {np, ps, Hkv, D}, kst[4] = {ps * Hkv * D, Hkv * D, D, 1};
        int64_t ts[2] = {1, np}, tst[2] = {np, 1};
        int64_t ls[2] = {ql, Hq}, lst[2] = {Hq, 1};
        a.q = fi_tensor_make(c->h_q + q0 * Hq * D, c->o.dtype, 3, qs, qst);
        a.k = fi_tensor_make(k, FI_DTYPE_F32, 4, ks, kst);
        a.v = fi_tensor_make(v, FI_DTYPE_F32, 4, ks, kst);
        a.page_table = fi_tensor_make(pt, FI_DTYPE_I32, 2, ts, tst);
        a.out = fi_tensor_make(c->ref_out + q0 * Hq * D, FI_DTYPE_F32, 3, qs, qst);
        a.lse = fi_tensor_make(c->ref_lse + q0 * Hq, FI_DTYPE_F32, 2, ls, lst);
        a.sinks = c->o.sinks ? c->h_sinks : NULL;
        a.bmm1_scale = c->bmm1_scale;
        a.bmm2_scale = c->bmm2_scale;
        fi_status st = fi_naive_attention(&caps, &sub, &a);
        free(k);
        free(v);
        free(pt);
        if (st != FI_OK) {
            gc_msg(msg, cap, "fi_naive_attention (request %d): %s", b, fi_status_name(st));
            return -1;
        }
    }
    return 0;
}

static inline int gqa_case_reference(gqa_case *c, char *msg, size_t cap) {
    return gqa_case_reference_range(c, 0, c->B, msg, cap);
}

/* Copy the device outputs to h_out / h_lse. */
static inline int gqa_case_download(gqa_case *c, char *msg, size_t cap) {
    const gc_outputs o = gqa_case_outputs(c);
    return gc_download(&o, msg, cap);
}

/* Element i of the downloaded output as the attention value (fp8: times o_scale). */
static inline double gqa_out_value(const gqa_case *c, int64_t i) {
    if (c->o.o_dtype == FI_DTYPE_E4M3)
        return (double)gc_e4m3_to_f32(((const uint8_t *)c->h_out)[i]) * c->o.o_scale;
    return gc_to_f32(c->o.o_dtype, ((const uint16_t *)c->h_out)[i]);
}

/* The row tolerance of the case's output dtype (file comment). */
static inline double gqa_case_tol(const gqa_case *c) {
    return c->o.o_dtype == FI_DTYPE_E4M3 ? GQA_TOL_FP8_OUT : GQA_TOL;
}

static inline double gqa_out_value_at(const void *c, int64_t i) {
    return gqa_out_value((const gqa_case *)c, i);
}

/* Compare rows of requests [b0, b1) of the GPU output (h_out / h_lse, after download) with
 * ref_out / ref_lse.  *worst_out / *worst_lse: largest errors seen.  0 if every row is
 * within tol (lse within GQA_TOL_LSE), else -1 and the first bad row in msg. */
static inline int gqa_case_compare(const gqa_case *c, int32_t b0, int32_t b1, double tol,
                                   double *worst_out, double *worst_lse, char *msg, size_t cap) {
    const gc_rows r = {c->fb.q_lens, c->fb.kv_lens, c->q_offset, c->o.heads_q, c->o.head_dim,
                       c->o.heads_q / c->o.heads_kv, gqa_out_value_at, c, c->h_lse,
                       c->ref_out, c->ref_lse, c->o.return_lse, GQA_TOL_LSE};
    return gc_compare_rows(&r, b0, b1, tol, worst_out, worst_lse, msg, cap);
}

/* Download and compare every request (reference computed by the caller). */
static inline int gqa_case_check(gqa_case *c, double *worst_out, double *worst_lse, char *msg,
                                 size_t cap) {
    if (gqa_case_download(c, msg, cap)) return -1;
    return gqa_case_compare(c, 0, c->B, gqa_case_tol(c), worst_out, worst_lse, msg, cap);
}

/* The option rotations of the every-shape sweeps (GQA decode, context): case idx of the
 * sweep, page size ps, gets layout NHD / HND, one tensor / (K, V) pair, sinks, lse, scale
 * pointers and page padding from mixed bits of idx (so they meet in many combinations),
 * CTAs (the device's count, or 2..25: tiles split into merged pieces, CTAs run several
 * items), window_left (none, or 0, 37, a page + 1, 250) and page order (shuffled, or in
 * request order). */
static inline void gqa_sweep_opts(gqa_opts *o, int idx, int32_t ps) {
    o->layout = (idx ^ (idx >> 2)) & 1 ? GQA_HND : GQA_NHD;
    o->kv_form = ((idx >> 1) ^ (idx >> 3)) & 1 ? GQA_KV_PAIR : GQA_KV_SINGLE;
    o->sinks = ((idx >> 1) ^ (idx >> 2)) & 1;
    o->return_lse = (((idx >> 3) ^ idx) & 1) == 0;
    o->scale_ptr = ((idx >> 4) ^ (idx >> 1)) & 1;
    o->page_pad = idx % 7 == 3 ? 64 : 0;
    o->num_ctas = idx % 3 == 0 ? 0 : 2 + (idx * 7) % 24;
    if (idx % 4 == 1) {
        const int32_t wins[4] = {0, 37, ps + 1, 250};
        o->windowed = 1;
        o->window_left = wins[(idx / 4) % 4];
    }
    o->contig_pages = idx % 5 == 2;
}

/* One split-k case of the GQA / context tests' tables: H_q / H_kv, head_dim, page_size, q_len
 * rows a request, B requests of kv_len in [lo, hi], caps.num_ctas, sinks, window_left (-1:
 * none), the pieces the plan's largest merge group must have (0: need not split). */
typedef struct gqa_split_variant {
    int32_t hq, hkv, d, ps, ql, B, lo, hi, ctas, sinks, win, min;
} gqa_split_variant;

/* o (its heads, head_dim and page_size already v's) with v's options; entry i of a table
 * alternates bf16 / fp16 (i & 1) and NHD / HND (i & 2). */
static inline void gqa_split_opts(gqa_opts *o, const gqa_split_variant *v, size_t i) {
    o->q_len = v->ql;
    o->num_ctas = v->ctas;
    o->sinks = v->sinks;
    o->windowed = v->win >= 0;
    o->window_left = v->win;
    o->dtype = i & 1 ? FI_DTYPE_F16 : FI_DTYPE_BF16;
    o->layout = i & 2 ? GQA_HND : GQA_NHD;
}

/* Run the case in each KV form the executors take, repacked from the same canonical cache:
 * NHD / HND one tensor, NHD / HND (K, V) pair, HND pair with 128 padding elements a page.
 * The first form's outputs are checked against the truth by check_truth(ctx) (the case's
 * fp64 reference and comparison), every other form's must be bitwise identical to them.
 * 0, or -1 and the first failure in msg (the case is left in the last form run). */
static inline int gqa_case_forms_identical(gqa_case *c,
                                           int (*check_truth)(void *ctx, char *msg, size_t cap),
                                           void *ctx, char *msg, size_t cap) {
    static const struct { gqa_layout l; gqa_kv_form f; int32_t pad; } forms[5] = {
        {GQA_NHD, GQA_KV_SINGLE, 0}, {GQA_HND, GQA_KV_SINGLE, 0}, {GQA_NHD, GQA_KV_PAIR, 0},
        {GQA_HND, GQA_KV_PAIR, 0},   {GQA_HND, GQA_KV_PAIR, 128}};
    void *o0 = malloc(c->out_bytes);
    float *l0 = (float *)malloc(c->lse_bytes);
    int bad = !o0 || !l0;
    if (bad) gc_msg(msg, cap, "host allocation failed");
    for (int f = 0; f < 5 && !bad; f++) {
        c->o.page_pad = forms[f].pad;
        bad = gqa_case_set_layout(c, forms[f].l, forms[f].f, msg, cap) ||
              gqa_case_run(c, msg, cap) || gqa_case_download(c, msg, cap);
        if (bad) break;
        if (f == 0) {
            memcpy(o0, c->h_out, c->out_bytes);
            memcpy(l0, c->h_lse, c->lse_bytes);
            bad = check_truth(ctx, msg, cap) != 0;
        } else if (memcmp(o0, c->h_out, c->out_bytes) || memcmp(l0, c->h_lse, c->lse_bytes)) {
            gc_msg(msg, cap, "%s %s pad %d: not bitwise identical to NHD single",
                   forms[f].l == GQA_NHD ? "NHD" : "HND",
                   forms[f].f == GQA_KV_SINGLE ? "single tensor" : "(K, V) pair", forms[f].pad);
            bad = 1;
        }
    }
    free(o0);
    free(l0);
    return bad ? -1 : 0;
}

/* One line naming the case, for logs and failure messages. */
static inline void gqa_case_name(const gqa_case *c, char *buf, size_t cap) {
    int groups, items;
    int32_t maxkv;
    gc_plan_counts(c->plan, c->fb.kv_lens, c->B, &groups, &items, &maxkv);
    snprintf(buf, cap, "q %s kv %s out %s H %d/%d D %d page_size %d %s %s pad %d B %d q_len %d "
             "max_kv %d window_left %d pages %s ctas %d sinks %d lse %d scale_ptr %d items %d "
             "groups %d", gqa_dtype_name(c->o.dtype), gqa_dtype_name(c->o.kv_dtype),
             gqa_dtype_name(c->o.o_dtype), c->o.heads_q, c->o.heads_kv, c->o.head_dim,
             c->o.page_size, c->o.layout == GQA_NHD ? "NHD" : "HND",
             c->o.kv_form == GQA_KV_SINGLE ? "single" : "pair", c->o.page_pad, c->B, c->o.q_len,
             maxkv, c->o.windowed ? c->o.window_left : -1, c->o.contig_pages ? "contig" : "shuffled",
             c->plan ? fi_plan_caps(c->plan)->num_ctas : -1, c->o.sinks, c->o.return_lse,
             c->o.scale_ptr, items, groups);
}

#endif /* FI_TESTS_GPU_GQA_GPU_CASE_H */
