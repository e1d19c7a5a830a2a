/*
 * tests/gpu/test_device_plan_gpu.c - the device planner (fi_plan_update_device and
 * fi_plan_device_error, include/fiattn.h) on the GPU machine.  Every test skips without a
 * device.
 *
 *   device_plan_bytes_match_host_1000_batches
 *       1,000 random batches (MLA heads 16 / 128, GQA 32/8 d128 at pages 16 / 64; 1 to 132
 *       CTAs; both decode forms, 3-D tables, q_len 1..4, windows, empty and full batches,
 *       requests without keys and up to 64k keys, a step's B below the arrays' B_max, B
 *       read from the device or not): the device plan's bytes equal the host plan's, region
 *       by region (gc_plan_compare), and the status word says FI_OK.
 *   device_plan_graph_loop_mla_10000_steps / device_plan_graph_loop_gqa_10000_steps
 *       ONE graph (fi_plan_update_device -> fi_run, PDL on) replayed for 10,000 steps of
 *       continuous batching over the bundled trace, the engine's arrays rewritten with
 *       cudaMemcpyAsync before each replay; every step bitwise against fi_run of the same
 *       batch planned on the host (and the plans byte for byte), every 500th step a sample
 *       of requests against the fp64 reference.
 *   device_plan_bad_length_reports_status
 *       lengths, page indices, indptr arrays and batch sizes that break a rule, written on
 *       the device: the status word names the rule, the request and the numbers that
 *       fi_batch_validate gives for the same batch on the host, out / lse keep their
 *       poison, and the next good step runs right.  Small: run it under compute-sanitizer.
 *   device_plan_host_checks_return_their_status
 *       what fi_plan_update_device refuses before launching (host-only plan, bad scalars,
 *       capacities over the caps), the previous plan kept; fi_run against the declared
 *       capacities; fi_plan_get_view refused on a device plan and back after a host update.
 *   copy_to_device_stages_pageable_bytes
 *       fi_copy_to_device (the Python layer's staging of host index arrays): random sizes
 *       and offsets land exactly, the pageable source overwritten right after the call.
 *
 * Fresh random inputs each run; the seed is printed and FI_TEST_SEED=<seed> replays it.
 * Run one test only (the filter is a cmocka glob over test names):
 *   FI_GPU_TEST_FILTER=device_plan_bad_length_reports_status \
 *       compute-sanitizer --tool memcheck build/tests/gpu/test_device_plan_gpu
 */
#include "common/batchgen.h"
#include "gpu/gqa_gpu_case.h"
#include "gpu/mla_gpu_case.h"
#include "gpu/gpu_test_common.h"
#include "gpu/mla_gt_family.h"

#define MSG 1024
#define MLA_TOL MLA_GT_TOL

/* ---- the two families as the shared harness sees them ----------------------------------- */

/* MLA: tests/gpu/mla_gt_family.h (MLA_GT_FAMILY). */

static fi_attn_args gqa_args(const void *c) { return gqa_case_args((const gqa_case *)c); }
static int gqa_upload(void *c, char *msg, size_t cap) {
    return gqa_case_upload((gqa_case *)c, msg, cap);
}
static int gqa_reference(void *c, char *msg, size_t cap) {
    return gqa_case_reference((gqa_case *)c, msg, cap);
}
static int gqa_compare(void *c, double *wo, double *wl, char *msg, size_t cap) {
    const gqa_case *g = (const gqa_case *)c;
    return gqa_case_compare(g, 0, g->B, gqa_case_tol(g), wo, wl, msg, cap);
}
static void gqa_name(const void *c, char *buf, size_t cap) {
    gqa_case_name((const gqa_case *)c, buf, cap);
}
static void gqa_free(void *c) { gqa_case_free((gqa_case *)c); }
static void gqa_new_step_inputs(void *c, tt_rng *rng) {
    gqa_case *g = (gqa_case *)c;
    gc_fill_random(g->h_q, g->n_q, g->o.dtype, rng);
    g->bmm1_scale = (0.05f + 0.1f * (tt_rng_float(rng) + 1.0f) * 0.5f) *
                    sqrtf(576.0f / (float)g->o.head_dim);
}
static const gt_family GQA_FAMILY = {gqa_args, gqa_upload, gqa_reference, gqa_compare,
                                     gqa_name, gqa_free, gqa_new_step_inputs, NULL};

/* Request b of a BLOCK_TABLES MLA case alone against the fp64 reference (a one-request
 * sub-batch whose views start at b's token rows and page row: the whole batch's reference
 * would cost a second a check), then its rows compared. */
static int mla_check_request(void *cp, int32_t b, double *wo, double *wl, char *msg,
                             size_t cap) {
    mla_case *c = (mla_case *)cp;
    if (mla_case_reference_request(c, b, msg, cap)) return -1;
    return mla_case_compare(c, b, b + 1, MLA_TOL, wo, wl, msg, cap);
}

static int gqa_check_request(void *cp, int32_t b, double *wo, double *wl, char *msg,
                             size_t cap) {
    gqa_case *c = (gqa_case *)cp;
    if (gqa_case_reference_range(c, b, b + 1, msg, cap)) return -1;
    return gqa_case_compare(c, b, b + 1, gqa_case_tol(c), wo, wl, msg, cap);
}

/* What the graph loop needs beyond the shared callbacks. */
typedef struct loop_family {
    const char *name;
    const gt_family *gt;
    int (*check_request)(void *c, int32_t b, double *wo, double *wl, char *msg, size_t cap);
} loop_family;

static const loop_family DL_MLA = {"mla h16 page 32", &MLA_GT_FAMILY, mla_check_request};
static const loop_family DL_GQA = {"gqa 8/2 d128 page 16 q_len 2", &GQA_FAMILY,
                                     gqa_check_request};

/* ==== 1. device plans byte for byte against host plans ================================== */

#define BYTES_BATCHES 1000
#define BYTES_MAX_Q 4 /* q_len of a request: 1 .. 4 */

typedef struct bytes_cfg {
    const char *name;
    fi_kind kind;
    int32_t hq, hkv, dim_qk, page_size, max_batch, num_ctas;
    int32_t variant; /* tile table row: 0 the walk, MLA 2 / GQA 1 or 4 the parallel partition */
} bytes_cfg;

/* MLA heads 16 (thin tiles: the packing partition, pairs on rows 2 and 8) and 128 (two
 * tiles a row), GQA Llama-3-8B heads at pages 16 and 64; one CTA (nothing cut), a few
 * (many pieces a tile), an odd count, and an H100 / H200's 132; context (q_len 1-4: the
 * walk or the list schedule). */
static const bytes_cfg BYTES_CFGS[] = {
    {"mla h16 page 64, 132 ctas", FI_KIND_MLA_DECODE, 16, 1, 576, 64, 256, 132, 0},
    {"mla h128 page 32, 132 ctas", FI_KIND_MLA_DECODE, 128, 1, 576, 32, 64, 132, 0},
    {"mla h16 page 16, 1 cta", FI_KIND_MLA_DECODE, 16, 1, 576, 16, 32, 1, 0},
    {"gqa 32/8 d128 page 16, 132 ctas", FI_KIND_GQA_DECODE, 32, 8, 128, 16, 1024, 132, 0},
    {"gqa 32/8 d128 page 64, 16 ctas", FI_KIND_GQA_DECODE, 32, 8, 128, 64, 128, 16, 0},
    {"gqa 32/8 d128 page 64, 77 ctas", FI_KIND_GQA_DECODE, 32, 8, 128, 64, 512, 77, 0},
    /* the data-parallel partition rows (planner/ppart.c): the whole CTA plans */
    {"mla h16 page 64, 132 ctas, parallel", FI_KIND_MLA_DECODE, 16, 1, 576, 64, 256, 132, 2},
    {"mla h128 page 32, 132 ctas, parallel", FI_KIND_MLA_DECODE, 128, 1, 576, 32, 64, 132, 2},
    {"mla h128 page 32, 132 ctas, parallel, wgmma row", FI_KIND_MLA_DECODE, 128, 1, 576, 32, 64,
     132, 5},
    {"mla h16 page 16, 1 cta, parallel", FI_KIND_MLA_DECODE, 16, 1, 576, 16, 32, 1, 2},
    /* the transposed 16-bit body's row (row 9's tiles and charges), pairs as row 2 */
    {"mla h16 page 64, 132 ctas, parallel, rows16", FI_KIND_MLA_DECODE, 16, 1, 576, 64, 256,
     132, 10},
    /* the fp8 heads-16 twin (q and cache e4m3, row 7's charges): pairs as row 2 */
    {"mla h16 fp8 page 64, 132 ctas, parallel", FI_KIND_MLA_DECODE, 16, 1, 576, 64, 256, 132,
     8},
    {"gqa 32/8 d128 page 16, 132 ctas, parallel", FI_KIND_GQA_DECODE, 32, 8, 128, 16, 1024, 132,
     1},
    {"gqa 32/8 d128 page 64, 77 ctas, parallel", FI_KIND_GQA_DECODE, 32, 8, 128, 64, 512, 77, 1},
    /* context: the walk or the list schedule (planner/listsched.c), chosen on the device
     * by the same model as on the host */
    {"context 32/8 d128 page 64, 132 ctas", FI_KIND_CONTEXT, 32, 8, 128, 64, 256, 132, 0},
};
#define BYTES_NCFG ((int)(sizeof BYTES_CFGS / sizeof BYTES_CFGS[0]))

static fi_caps bytes_caps(const bytes_cfg *k) {
    fi_caps c;
    memset(&c, 0, sizeof c);
    c.kind = k->kind;
    c.max_batch = k->max_batch;
    c.max_q_tokens = k->max_batch * BYTES_MAX_Q;
    c.num_pages = 1 << 22;
    c.page_size = k->page_size;
    c.num_qo_heads = k->hq;
    c.num_kv_heads = k->hkv;
    c.head_dim_qk = k->dim_qk;
    c.head_dim_vo = k->kind == FI_KIND_MLA_DECODE ? MLA_D_CKV : k->dim_qk;
    c.q_dtype = c.kv_dtype = c.o_dtype = FI_DTYPE_BF16;
    if (k->variant == 8) /* the fp8 rows-16 body */
        c.q_dtype = c.kv_dtype = FI_DTYPE_E4M3;
    c.num_ctas = k->num_ctas;
    c.variant = k->variant;
    return c;
}

/* One random step: the arrays of B_max requests (hb.batch.batch_size = B_max) and what the
 * device is told about them. */
typedef struct rand_step {
    batchgen_batch hb;
    int32_t B;            /* the step's batch size, 0 .. B_max */
    int use_bs;           /* 1: B from the device array; 0: NULL (B = B_max) */
    int pdl;
    int32_t max_q_tokens; /* declared: caps.max_q_tokens or the B_max requests' tokens */
} rand_step;

/* kv_len of one request: none, a few keys, page edges (ps k - 1, ps k, ps k + 1), log-
 * uniform up to 4096, or (while *longs lasts) 8k .. 64k; causal requests with keys get at
 * least q of them. */
static int32_t rand_kv(tt_rng *r, int32_t q, int32_t ps, int causal, int *longs) {
    const int32_t k = tt_rng_int(r, 0, 99);
    int32_t v;
    if (k < 5) v = 0;
    else if (k < 15) v = tt_rng_int(r, 1, q + 2);
    else if (k < 30) v = ps * tt_rng_int(r, 1, 8) + tt_rng_int(r, -1, 1);
    else if (k < 97 || *longs <= 0) v = tt_rng_int(r, 1, 1 << tt_rng_int(r, 0, 12));
    else {
        (*longs)--;
        v = tt_rng_int(r, 8192, 65536);
    }
    if (causal && v > 0 && v < q) v = q;
    return v;
}

/* B_max: 0, the caps' maximum, a few, or any; the step's B: 0, B_max or any below. */
static int rand_step_make(tt_rng *r, const fi_caps *caps, rand_step *st) {
    memset(st, 0, sizeof *st);
    const int32_t pick = tt_rng_int(r, 0, 19), few = caps->max_batch < 8 ? caps->max_batch : 8;
    const int32_t B_max = pick == 0   ? 0
                          : pick == 1 ? caps->max_batch
                          : pick <= 5 ? tt_rng_int(r, 1, few)
                                      : tt_rng_int(r, 1, caps->max_batch);
    const fi_batch_form form = tt_rng_int(r, 0, 1) ? FI_FORM_INDPTR : FI_FORM_BLOCK_TABLES;
    const int32_t causal = tt_rng_int(r, 0, 9) != 0;
    int32_t window = -1;
    if (tt_rng_int(r, 0, 3) == 0)
        window = tt_rng_int(r, 0, 1) ? tt_rng_int(r, 0, 4) : tt_rng_int(r, 5, 1024);
    const int32_t uniform_q = tt_rng_int(r, 1, BYTES_MAX_Q);
    int longs = B_max <= 64 ? 2 : 0; /* long rows make every block-table row long */
    int32_t *q = (int32_t *)malloc(sizeof(int32_t) * (size_t)(B_max + 1));
    int32_t *kv = (int32_t *)malloc(sizeof(int32_t) * (size_t)(B_max + 1));
    if (!q || !kv) {
        free(q);
        free(kv);
        return -1;
    }
    for (int32_t b = 0; b < B_max; b++) {
        q[b] = form == FI_FORM_BLOCK_TABLES ? uniform_q : tt_rng_int(r, 1, BYTES_MAX_Q);
        kv[b] = rand_kv(r, q[b], caps->page_size, causal, &longs);
    }
    const int kv_split = form == FI_FORM_BLOCK_TABLES && tt_rng_int(r, 0, 3) == 0;
    const int rc = batchgen_from_lens(r, caps, form, q, kv, B_max, kv_split, tt_rng_int(r, 0, 1),
                                      causal, window, &st->hb);
    free(q);
    free(kv);
    if (rc) return -1;
    const int32_t s = tt_rng_int(r, 0, 9);
    st->B = s == 0 ? 0 : s <= 3 ? B_max : tt_rng_int(r, 0, B_max);
    st->use_bs = tt_rng_int(r, 0, 6) != 0;
    if (!st->use_bs) st->B = B_max;
    st->pdl = tt_rng_int(r, 0, 1);
    st->max_q_tokens = tt_rng_int(r, 0, 1) ? caps->max_q_tokens : st->hb.total_q_tokens;
    return 0;
}

static void rand_step_describe(const rand_step *st, char *buf, size_t cap) {
    const fi_batch *b = &st->hb.batch;
    const int indptr = b->form == FI_FORM_INDPTR;
    snprintf(buf, cap, "%s, B %d of B_max %d, q_len %s%d, causal %d, window_left %d, "
             "kv_split_pages %d, batch_size %s, pdl %d, declared q tokens %d",
             indptr ? "indptr" : "block tables", st->B, b->batch_size, indptr ? "<= " : "",
             indptr ? BYTES_MAX_Q : b->q_len_per_request, b->causal, b->window_left,
             b->kv_split_pages, st->use_bs ? "on the device" : "NULL (B_max)", st->pdl,
             st->max_q_tokens);
}

/* Both plans of one configuration: host-only and device, same caps and num_ctas. */
typedef struct bytes_run {
    const bytes_cfg *k;
    fi_caps caps;
    fi_plan *hp, *dp;
    void *ws;
    cudaStream_t stream;
    gc_dev_batch dev;
    unsigned char *buf;
    size_t buf_bytes;
} bytes_run;

typedef struct bytes_stats {
    int batches, empty, full, indptr, split_tables, windows, no_bs, with_groups;
    int32_t max_items;
} bytes_stats;

static void bytes_run_close(bytes_run *x) {
    if (x->stream) cudaStreamSynchronize(x->stream);
    fi_plan_destroy(x->hp);
    fi_plan_destroy(x->dp);
    cudaFree(x->ws);
    gc_dev_batch_free(&x->dev);
    if (x->stream) cudaStreamDestroy(x->stream);
    free(x->buf);
    memset(x, 0, sizeof *x);
}

/* The workspace is filled with 0xa5 before fi_plan_create (which zeroes what it must), so
 * the first device plan can match only by writing every byte compared. */
static int bytes_run_open(bytes_run *x, const bytes_cfg *k, char *msg, size_t cap) {
    memset(x, 0, sizeof *x);
    x->k = k;
    x->caps = bytes_caps(k);
    gc_dev_batch_init(&x->dev, NULL);
    size_t bytes = 0;
    fi_status st = fi_workspace_size(&x->caps, &bytes);
    if (st == FI_OK) st = fi_plan_create(&x->caps, NULL, 0, NULL, &x->hp);
    if (st != FI_OK) {
        gc_msg(msg, cap, "%s: caps / host plan: %s", k->name, fi_status_name(st));
        return -1;
    }
    GC_CUDA(cudaStreamCreate(&x->stream), msg, cap);
    GC_CUDA(cudaMalloc(&x->ws, bytes), msg, cap);
    GC_CUDA(cudaMemset(x->ws, 0xa5, bytes), msg, cap);
    st = fi_plan_create(&x->caps, x->ws, bytes, NULL, &x->dp);
    if (st != FI_OK) {
        gc_msg(msg, cap, "%s: device plan: %s", k->name, fi_status_name(st));
        return -1;
    }
    return 0;
}

/* Plan st on both plans, read the device plan back and compare.  0, or -1 and why. */
static int bytes_run_step(bytes_run *x, const rand_step *st, bytes_stats *s, char *msg,
                          size_t cap) {
    fi_batch h = st->hb.batch;
    h.batch_size = st->B;
    fi_status rc = fi_plan_update(x->hp, &h, NULL);
    if (rc != FI_OK) {
        const fi_error_detail e = fi_plan_error(x->hp);
        gc_msg(msg, cap, "host fi_plan_update: %s (request %d): the generator made a bad batch",
               fi_status_name(rc), e.request);
        return -1;
    }
    if (gc_dev_batch_upload(&x->dev, &st->hb.batch, st->hb.page_table_len, st->B, x->stream,
                            msg, cap)) return -1;
    const fi_device_batch db = gc_dev_batch_describe(&x->dev, &st->hb.batch, st->use_bs,
                                                     st->max_q_tokens,
                                                     (int32_t)st->hb.page_table_len);
    rc = fi_plan_update_device(x->dp, &db, st->pdl, x->stream);
    if (rc != FI_OK) {
        gc_msg(msg, cap, "fi_plan_update_device: %s", fi_status_name(rc));
        return -1;
    }
    fi_error_detail d;
    rc = fi_plan_device_error(x->dp, &d, x->stream);
    if (rc != FI_OK || d.status != FI_OK) {
        gc_msg(msg, cap, "fi_plan_device_error %s: device planner says %s (request %d needed "
               "%lld limit %lld) of a batch the host planned", fi_status_name(rc),
               fi_status_name(d.status), d.request, (long long)d.needed, (long long)d.limit);
        return -1;
    }
    fi_plan_view v;
    rc = fi_plan_get_view(x->dp, &v);
    if (rc != FI_ERR_PLAN_ON_DEVICE) {
        gc_msg(msg, cap, "fi_plan_get_view of the device plan: %s, want FI_ERR_PLAN_ON_DEVICE",
               fi_status_name(rc));
        return -1;
    }
    if (fi_plan_get_view(x->hp, &v) != FI_OK) {
        gc_msg(msg, cap, "fi_plan_get_view of the host plan failed");
        return -1;
    }
    if (gc_plan_download(x->ws, gc_plan_used_bytes(&v), &x->buf, &x->buf_bytes, msg, cap) ||
        gc_plan_compare(&v, x->caps.max_batch, x->buf, msg, cap))
        return -1;
    s->batches++;
    s->empty += st->B == 0;
    s->full += st->B == x->caps.max_batch;
    s->indptr += h.form == FI_FORM_INDPTR;
    s->split_tables += h.form == FI_FORM_BLOCK_TABLES && h.kv_split_pages;
    s->windows += h.window_left >= 0;
    s->no_bs += !st->use_bs;
    s->with_groups += v.header->num_groups > 0;
    if (v.header->num_items > s->max_items) s->max_items = v.header->num_items;
    return 0;
}

static void device_plan_bytes_match_host_1000_batches(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(101);
    bytes_stats s;
    memset(&s, 0, sizeof s);
    char msg[MSG], what[384];
    for (int k = 0; k < BYTES_NCFG; k++) {
        bytes_run x;
        if (bytes_run_open(&x, &BYTES_CFGS[k], msg, sizeof msg)) {
            bytes_run_close(&x);
            fail_msg("%s", msg);
        }
        /* batch i of the 1,000 goes to configuration i % BYTES_NCFG */
        for (int i = k; i < BYTES_BATCHES; i += BYTES_NCFG) {
            rand_step st;
            if (rand_step_make(&rng, &x.caps, &st)) {
                bytes_run_close(&x);
                fail_msg("batch %d: out of memory", i);
            }
            const int bad = bytes_run_step(&x, &st, &s, msg, sizeof msg);
            rand_step_describe(&st, what, sizeof what);
            batchgen_free(&st.hb);
            if (bad) {
                const char *name = x.k->name;
                bytes_run_close(&x);
                fail_msg("batch %d (%s; %s): %s", i, name, what, msg);
            }
        }
        bytes_run_close(&x);
    }
    print_message("  %d batches byte-identical: %d empty, %d of max_batch requests, %d indptr, "
                  "%d 3-D tables, %d windowed, %d with B = B_max (NULL batch_size), %d with "
                  "merge groups, up to %d items\n", s.batches, s.empty, s.full, s.indptr,
                  s.split_tables, s.windows, s.no_bs, s.with_groups, s.max_items);
    /* the edges the sweep is there for must have occurred */
    assert_int_equal(s.batches, BYTES_BATCHES);
    assert_true(s.empty > 0 && s.full > 0 && s.indptr > 0 && s.split_tables > 0);
    assert_true(s.windows > 0 && s.no_bs > 0 && s.with_groups > 0);
}

/* The data-parallel rows' planner without the cluster split: caps whose scan arrays do not
 * fit three times in a CTA's shared memory (B_max >= ~9.5k) make CTA 0 scan the page table
 * and check the rules itself, and beyond ~29k requests the page verdicts live in the
 * workspace (planner/device/plan_kernel.cu, `split` and `verdict`).  Per caps:
 * BIG_BATCHES random batches byte-compared, each then with one used page id out of range
 * (the last page of a request of the step, in the host batch and on the device): the device's
 * status word must give the host's status and request. */
#define BIG_BATCHES 12

static size_t round64_bytes(size_t x) { return (x + 63) / 64 * 64; }

/* One page id of st's batch out of range (host arrays; the caller uploads): the last used
 * entry of the first request of the step with keys.  0, or -1 when no request has keys. */
static int break_one_page(rand_step *st, const fi_caps *caps, int32_t *request) {
    const batchgen_batch *hb = &st->hb;
    for (int32_t b = 0; b < st->B; b++) {
        const int32_t kv = hb->kv_len[b];
        if (kv <= 0) continue;
        const int64_t last = hb->page_row[b] + (kv - 1) / caps->page_size;
        hb->page_table[last] = (int32_t)caps->num_pages;
        *request = b;
        return 0;
    }
    return -1;
}

static void device_plan_parallel_rows_without_cluster_split(void **state) {
    (void)state;
    REQUIRE_GPU();
    int dev = 0, optin = 0;
    assert_int_equal(cudaGetDevice(&dev), cudaSuccess);
    assert_int_equal(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                     cudaSuccess);
    const size_t room = (size_t)optin - 2048; /* the launcher's kStaticSmem */
    static const bytes_cfg cfgs[] = {
        {"mla h16 page 64, 132 ctas, parallel, B_max 16384", FI_KIND_MLA_DECODE, 16, 1, 576, 64,
         16384, 132, 2},
        {"mla h16 page 64, 132 ctas, parallel, B_max 32768", FI_KIND_MLA_DECODE, 16, 1, 576, 64,
         32768, 132, 2},
    };
    /* what each configuration is there for, on this GPU */
    assert_true(3 * round64_bytes(8 * (size_t)(cfgs[0].max_batch + 1)) > room);
    assert_true(round64_bytes(8 * (size_t)cfgs[0].max_batch) <= room);
    assert_true(round64_bytes(8 * (size_t)cfgs[1].max_batch) > room);
    tt_rng rng = gt_test_rng(106);
    char msg[MSG], what[384];
    int broken = 0;
    for (int k = 0; k < 2; k++) {
        bytes_run x;
        bytes_stats s;
        memset(&s, 0, sizeof s);
        if (bytes_run_open(&x, &cfgs[k], msg, sizeof msg)) {
            bytes_run_close(&x);
            fail_msg("%s", msg);
        }
        for (int i = 0; i < BIG_BATCHES; i++) {
            rand_step st;
            if (rand_step_make(&rng, &x.caps, &st)) {
                bytes_run_close(&x);
                fail_msg("%s batch %d: out of memory", cfgs[k].name, i);
            }
            rand_step_describe(&st, what, sizeof what);
            int bad = bytes_run_step(&x, &st, &s, msg, sizeof msg);
            int32_t req = -1;
            if (!bad && break_one_page(&st, &x.caps, &req) == 0) {
                fi_batch h = st.hb.batch;
                h.batch_size = st.B;
                const fi_status hs = fi_plan_update(x.hp, &h, NULL);
                const fi_error_detail he = fi_plan_error(x.hp);
                fi_error_detail d;
                memset(&d, 0, sizeof d);
                bad = hs == FI_OK || gc_dev_batch_upload(&x.dev, &st.hb.batch,
                                                         st.hb.page_table_len, st.B, x.stream,
                                                         msg, sizeof msg);
                const fi_device_batch db = gc_dev_batch_describe(
                    &x.dev, &st.hb.batch, st.use_bs, st.max_q_tokens,
                    (int32_t)st.hb.page_table_len);
                bad = bad || fi_plan_update_device(x.dp, &db, st.pdl, x.stream) != FI_OK ||
                      fi_plan_device_error(x.dp, &d, x.stream) != FI_OK ||
                      d.status != hs || d.request != he.request;
                if (bad)
                    snprintf(msg, sizeof msg, "page id of request %d out of range: host %s "
                             "(request %d), device %s (request %d)", req, fi_status_name(hs),
                             he.request, fi_status_name(d.status), d.request);
                broken += !bad;
            }
            batchgen_free(&st.hb);
            if (bad) {
                bytes_run_close(&x);
                fail_msg("%s, batch %d (%s): %s", cfgs[k].name, i, what, msg);
            }
        }
        print_message("  %s: %d batches byte-identical, up to %d items\n", cfgs[k].name,
                      s.batches, s.max_items);
        assert_int_equal(s.batches, BIG_BATCHES);
        bytes_run_close(&x);
    }
    print_message("  %d broken page ids reported as the host reports them\n", broken);
    assert_true(broken >= BIG_BATCHES); /* about 85% of random batches have a request with keys */
}

/* ==== 2. one captured graph over 10,000 steps of continuous batching ==================== */

#define DL_STEPS 10000
#define DL_CHECK_EVERY 500  /* fp64 reference of a sample of requests */
#define DL_MAX_B 32         /* B_max: rows of the engine's arrays */
#define DL_MAX_KV 2048      /* longest request admitted (kv_len at its last step) */
#define DL_PHASE 100        /* steps between changes of the batch size aimed at */

/* The engine's batch (viz/trace.h's continuous batching, with a batch size that moves):
 * rows 0 .. n-1 hold the active requests (trace row, own decode step t, page block); each
 * step every active request decodes one token (kv_len = ContextTokens + t + q_len - 1), a
 * request leaves after its GeneratedTokens steps and the last row moves into its place;
 * every DL_PHASE steps a new batch size is aimed at (B_max, 0, 1 or any), the newest
 * requests above it are preempted (they resume first, on fresh pages) and new requests of
 * the trace, in order (wrapping; skipping those longer than DL_MAX_KV), fill the rows
 * below it.  Page block j is pages [j P, (j + 1) P); a request's table row is its block in
 * a fresh shuffled order. */
typedef struct loop_sim {
    const fitrace *tr;
    int32_t B_max, P, q_len;
    int64_t next, max_kv;
    int32_t n, target;
    int32_t src[DL_MAX_B], t[DL_MAX_B], block[DL_MAX_B];
    int32_t free_block[DL_MAX_B], n_free;
    int32_t held_src[DL_MAX_B], held_t[DL_MAX_B], n_held;
    int64_t admitted, finished, preempted, moved;
} loop_sim;

static void sim_init(loop_sim *m, const fitrace *tr, int32_t B_max, int32_t P, int32_t ps,
                     int32_t q_len, int64_t first) {
    memset(m, 0, sizeof *m);
    m->tr = tr;
    m->B_max = B_max;
    m->P = P;
    m->q_len = q_len;
    m->next = first;
    m->max_kv = (int64_t)P * ps;
    for (int32_t j = 0; j < B_max; j++) m->free_block[m->n_free++] = B_max - 1 - j;
}

/* Its longest kv_len (at its last step) fits a row, and it decodes at all. */
static int sim_fits(const loop_sim *m, int32_t row) {
    const int64_t g = m->tr->generated_tokens[row];
    return g >= 1 && m->tr->context_tokens[row] + g + m->q_len - 2 <= m->max_kv;
}

static int32_t sim_next_request(loop_sim *m) {
    for (int32_t k = 0; k < m->tr->num_requests; k++) {
        const int32_t row = (int32_t)(m->next++ % m->tr->num_requests);
        if (sim_fits(m, row)) return row;
    }
    return -1;
}

static void sim_place(loop_sim *m, int32_t src, int32_t t, int32_t *pt, tt_rng *rng) {
    const int32_t r = m->n++, blk = m->free_block[--m->n_free];
    m->src[r] = src;
    m->t[r] = t;
    m->block[r] = blk;
    gt_shuffle_row(pt + (int64_t)r * m->P, m->P, blk * m->P, rng);
}

static void sim_move(loop_sim *m, int32_t from, int32_t to, int32_t *pt) {
    m->src[to] = m->src[from];
    m->t[to] = m->t[from];
    m->block[to] = m->block[from];
    memcpy(pt + (int64_t)to * m->P, pt + (int64_t)from * m->P, sizeof(int32_t) * (size_t)m->P);
    m->moved++;
}

/* Before step s: the batch size aimed at, preemptions above it, admissions below it. */
static int sim_schedule(loop_sim *m, int32_t s, int32_t *pt, tt_rng *rng) {
    if (s % DL_PHASE == 0) {
        const int32_t phase = (s / DL_PHASE) % 8;
        m->target = phase == 0 ? m->B_max : phase == 4 ? 0 : phase == 2 ? 1
                                                                        : tt_rng_int(rng, 0, m->B_max);
    }
    while (m->n > m->target) { /* the newest leave; what they computed stays theirs */
        const int32_t r = m->n - 1;
        if (m->n_held >= DL_MAX_B) return -1;
        m->held_src[m->n_held] = m->src[r];
        m->held_t[m->n_held++] = m->t[r];
        m->free_block[m->n_free++] = m->block[r];
        m->n--;
        m->preempted++;
    }
    while (m->n < m->target) {
        if (m->n_held > 0) {
            m->n_held--;
            sim_place(m, m->held_src[m->n_held], m->held_t[m->n_held], pt, rng);
            continue;
        }
        const int32_t row = sim_next_request(m);
        if (row < 0) return -1;
        sim_place(m, row, 0, pt, rng);
        m->admitted++;
    }
    return 0;
}

/* The step's kv_len of the active rows; -1 in every row past them (lengths and page
 * indices a planner that read past B would trip on). */
static void sim_write(const loop_sim *m, int32_t *lens, int32_t *pt) {
    for (int32_t r = 0; r < m->B_max; r++) {
        if (r < m->n) {
            lens[r] = m->tr->context_tokens[m->src[r]] + m->t[r] + m->q_len - 1;
            continue;
        }
        lens[r] = -1;
        for (int32_t j = 0; j < m->P; j++) pt[(int64_t)r * m->P + j] = -1;
    }
}

/* After the step: one token more each; finished requests leave, the last row fills the
 * hole (rows walked downwards, so the row moved in has had its step already). */
static void sim_advance(loop_sim *m, int32_t *pt) {
    for (int32_t r = m->n - 1; r >= 0; r--) {
        if (++m->t[r] < m->tr->generated_tokens[m->src[r]]) continue;
        m->free_block[m->n_free++] = m->block[r];
        m->finished++;
        if (r != m->n - 1) sim_move(m, m->n - 1, r, pt);
        m->n--;
    }
}

/* The loop's case and the second plan.  The case's own plan (g.plan) is updated on the host
 * each step and runs into out2; the device plan (its own workspace, the same caps) runs in
 * the graph into the case's outputs g.io. */
typedef struct loop_ctx {
    gt_case g;
    const loop_family *lf;
    int32_t B_max, P, q_len, tokens; /* tokens: q rows of the arrays, B_max x q_len */
    fi_caps caps;
    fi_plan *dplan;
    void *d_ws;
    gc_dev_batch dev;                /* seq_lens, B; block_tables: the case's d_pt */
    gc_outputs o2;                   /* the host-planned run's outputs */
    unsigned char *plan_buf;
    size_t plan_buf_bytes;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
} loop_ctx;

typedef struct loop_stats {
    int32_t steps, empty, full, min_b, max_b, checked_requests;
    double worst_out, worst_lse;
} loop_stats;

static void loop_free(loop_ctx *L) {
    if (L->g.stream) cudaStreamSynchronize(L->g.stream);
    if (L->exec) cudaGraphExecDestroy(L->exec);
    if (L->graph) cudaGraphDestroy(L->graph);
    fi_plan_destroy(L->dplan);
    cudaFree(L->d_ws);
    gc_dev_batch_free(&L->dev);
    cudaFree(L->o2.d_out);
    cudaFree(L->o2.d_lse);
    free(L->o2.h_out);
    free(L->o2.h_lse);
    free(L->plan_buf);
    if (L->g.c) L->g.f->free(L->g.c);
    memset(L, 0, sizeof *L);
}

/* The device plan, out2, and the graph: fi_plan_update_device (B read from the device)
 * then fi_run, both with PDL, captured once. */
static int loop_open(loop_ctx *L, int32_t *d_pt, char *msg, size_t cap) {
    L->caps = *fi_plan_caps(L->g.plan);
    gc_dev_batch_init(&L->dev, d_pt);
    if (gc_dev_batch_reserve(&L->dev, L->B_max, 0, msg, cap)) return -1;
    size_t bytes = 0;
    fi_status st = fi_workspace_size(&L->caps, &bytes);
    if (st != FI_OK) {
        gc_msg(msg, cap, "fi_workspace_size: %s", fi_status_name(st));
        return -1;
    }
    GC_CUDA(cudaMalloc(&L->d_ws, bytes), msg, cap);
    st = fi_plan_create(&L->caps, L->d_ws, bytes, NULL, &L->dplan);
    if (st != FI_OK) {
        gc_msg(msg, cap, "fi_plan_create (device plan): %s", fi_status_name(st));
        return -1;
    }
    L->o2.out_bytes = L->g.io.out_bytes;
    L->o2.lse_bytes = L->g.io.lse_bytes;
    GC_CUDA(cudaMalloc(&L->o2.d_out, L->o2.out_bytes), msg, cap);
    GC_CUDA(cudaMalloc(&L->o2.d_lse, L->o2.lse_bytes), msg, cap);
    L->o2.h_out = malloc(L->o2.out_bytes);
    L->o2.h_lse = malloc(L->o2.lse_bytes);
    if (!L->o2.h_out || !L->o2.h_lse) {
        gc_msg(msg, cap, "host allocation failed");
        return -1;
    }
    const fi_device_batch db = gc_dev_batch_describe(&L->dev, &L->g.fb->batch, 1, L->tokens, 0);
    fi_attn_args a = L->g.f->args(L->g.c);
    a.enable_pdl = 1;
    GC_CUDA(cudaStreamBeginCapture(L->g.stream, cudaStreamCaptureModeGlobal), msg, cap);
    const fi_status s1 = fi_plan_update_device(L->dplan, &db, 1, L->g.stream);
    const fi_status s2 = s1 == FI_OK ? fi_run(L->dplan, &a, L->g.stream) : s1;
    const cudaError_t e = cudaStreamEndCapture(L->g.stream, &L->graph);
    if (s1 != FI_OK || s2 != FI_OK || e != cudaSuccess) {
        gc_msg(msg, cap, "capture: fi_plan_update_device %s, fi_run %s, end capture %s",
               fi_status_name(s1), fi_status_name(s2), cudaGetErrorString(e));
        return -1;
    }
    GC_CUDA(cudaGraphInstantiate(&L->exec, L->graph, 0), msg, cap);
    return 0;
}

/* Where two output buffers first differ, as token / head. */
static void loop_first_diff(const loop_ctx *L, const void *a, const void *b, size_t bytes,
                            int64_t heads, const char *what, char *msg, size_t cap) {
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    size_t i = 0;
    while (i < bytes && x[i] == y[i]) i++;
    const size_t per_token = bytes / (size_t)L->tokens, per_head = per_token / (size_t)heads;
    gc_msg(msg, cap, "%s of the graph (device plan) and of fi_run after fi_plan_update differ "
           "at byte %zu: token %zu head %zu", what, i, i / per_token, (i % per_token) / per_head);
}

/* Check requests first, last, longest and one at random of a step of B against the fp64
 * reference (the graph's outputs downloaded into the case). */
static int loop_check_sample(loop_ctx *L, int32_t B, tt_rng *rng, loop_stats *ls, char *msg,
                             size_t cap) {
    if (B == 0) return 0;
    int32_t pick[4] = {0, B - 1, 0, tt_rng_int(rng, 0, B - 1)};
    for (int32_t b = 1; b < B; b++)
        if (L->g.fb->kv_lens[b] > L->g.fb->kv_lens[pick[2]]) pick[2] = b;
    for (int k = 0; k < 4; k++) {
        int seen = 0;
        for (int j = 0; j < k; j++) seen |= pick[j] == pick[k];
        if (seen) continue;
        if (L->lf->check_request(L->g.c, pick[k], &ls->worst_out, &ls->worst_lse, msg, cap))
            return -1;
        ls->checked_requests++;
    }
    return 0;
}

/* One step: the engine's arrays written on the device, outputs poisoned, the graph
 * replayed; the same batch planned on the host and run into out2; status word, plan bytes
 * and both outputs compared; a sample against fp64 when check_ref (fresh q and bmm1 scale
 * written first, so the graph must follow those too). */
static int loop_step(loop_ctx *L, int32_t B, int check_ref, tt_rng *rng, loop_stats *ls,
                     char *msg, size_t cap) {
    const gt_case *g = &L->g;
    if (check_ref) {
        g->f->new_step_inputs(g->c, rng);
        if (g->f->upload(g->c, msg, cap)) return -1;
    }
    if (gc_dev_batch_upload(&L->dev, &g->fb->batch, g->fb->page_table_len, B, g->stream, msg,
                            cap) ||
        gc_poison(&g->io, g->stream, msg, cap) || gc_poison(&L->o2, g->stream, msg, cap))
        return -1;
    GC_CUDA(cudaGraphLaunch(L->exec, g->stream), msg, cap);
    fi_batch hb = g->fb->batch;
    hb.batch_size = B;
    fi_status st = fi_plan_update(g->plan, &hb, g->stream);
    if (st != FI_OK) {
        gc_msg(msg, cap, "host fi_plan_update: %s (request %d)", fi_status_name(st),
               fi_plan_error(g->plan).request);
        return -1;
    }
    fi_attn_args a2 = g->f->args(g->c);
    a2.out.data = L->o2.d_out;
    if (a2.lse.data) a2.lse.data = L->o2.d_lse;
    st = fi_run(g->plan, &a2, g->stream);
    if (st != FI_OK) {
        gc_msg(msg, cap, "fi_run of the host plan: %s", fi_status_name(st));
        return -1;
    }
    fi_error_detail d;
    st = fi_plan_device_error(L->dplan, &d, g->stream);
    if (st != FI_OK || d.status != FI_OK) {
        gc_msg(msg, cap, "fi_plan_device_error %s: %s (request %d needed %lld limit %lld)",
               fi_status_name(st), fi_status_name(d.status), d.request, (long long)d.needed,
               (long long)d.limit);
        return -1;
    }
    GC_CUDA(cudaGetLastError(), msg, cap);
    fi_plan_view v;
    if (fi_plan_get_view(g->plan, &v) != FI_OK) {
        gc_msg(msg, cap, "fi_plan_get_view of the host plan failed");
        return -1;
    }
    if (gc_plan_download(L->d_ws, gc_plan_used_bytes(&v), &L->plan_buf, &L->plan_buf_bytes, msg,
                         cap) ||
        gc_plan_compare(&v, L->caps.max_batch, L->plan_buf, msg, cap))
        return -1;
    if (gc_download(&g->io, msg, cap) || gc_download(&L->o2, msg, cap)) return -1;
    const int64_t H = L->caps.num_qo_heads;
    if (memcmp(g->io.h_out, L->o2.h_out, g->io.out_bytes) != 0) {
        loop_first_diff(L, g->io.h_out, L->o2.h_out, g->io.out_bytes, H, "out", msg, cap);
        return -1;
    }
    if (memcmp(g->io.h_lse, L->o2.h_lse, g->io.lse_bytes) != 0) {
        loop_first_diff(L, g->io.h_lse, L->o2.h_lse, g->io.lse_bytes, H, "lse", msg, cap);
        return -1;
    }
    return check_ref ? loop_check_sample(L, B, rng, ls, msg, cap) : 0;
}

/* 10,000 steps of one family's loop; frees L; fails with the step and the reason. */
static void loop_run(loop_ctx *L, tt_rng *rng) {
    fitrace *tr = NULL;
    assert_int_equal(fitrace_load_default(NULL, &tr), FITRACE_OK);
    loop_sim m;
    sim_init(&m, tr, L->B_max, L->P, fi_plan_caps(L->g.plan)->page_size, L->q_len,
             tt_rng_int(rng, 0, tr->num_requests - 1));
    loop_stats ls;
    memset(&ls, 0, sizeof ls);
    ls.min_b = L->B_max;
    char msg[MSG];
    int bad = 0, s = 0;
    int32_t *lens = L->g.fb->kv_lens, *pt = L->g.fb->page_table; /* host [B_max], [B_max, P] */
    for (s = 0; s < DL_STEPS && !bad; s++) {
        if (sim_schedule(&m, s, pt, rng)) {
            gc_msg(msg, sizeof msg, "the trace has no request that fits");
            bad = 1;
            break;
        }
        sim_write(&m, lens, pt);
        const int check_ref = s % DL_CHECK_EVERY == DL_CHECK_EVERY - 1 ||
                              s == DL_STEPS - 1;
        bad = loop_step(L, m.n, check_ref, rng, &ls, msg, sizeof msg);
        if (bad) break;
        ls.steps++;
        ls.empty += m.n == 0;
        ls.full += m.n == L->B_max;
        if (m.n < ls.min_b) ls.min_b = m.n;
        if (m.n > ls.max_b) ls.max_b = m.n;
        sim_advance(&m, pt);
    }
    print_message("  %s: %d steps, each bitwise against the host-planned run and byte for byte "
                  "against its plan; %d requests against fp64 (worst out %.2e lse %.2e); B %d "
                  "..%d (%d steps empty, %d full); %lld requests admitted, %lld finished, %lld "
                  "preempted, %lld rows moved\n", L->lf->name, ls.steps, ls.checked_requests,
                  ls.worst_out, ls.worst_lse, ls.min_b, ls.max_b, ls.empty, ls.full,
                  (long long)m.admitted, (long long)m.finished, (long long)m.preempted,
                  (long long)m.moved);
    const char *name = L->lf->name;
    const int32_t b_max = L->B_max;
    loop_free(L);
    fitrace_free(tr);
    if (bad) fail_msg("%s: step %d (B %d): %s", name, s, m.n, msg);
    /* the loop is there for these: a schedule that lost them would prove less */
    assert_int_equal(ls.steps, DL_STEPS);
    assert_true(ls.empty > 0 && ls.full > 0 && ls.checked_requests > 0);
    assert_true(m.finished > 0 && m.admitted > b_max && m.preempted > 0 && m.moved > 0);
}

/* MLA heads 16, concatenated cache, page 32, q_len 1, sinks, scales by pointer: B_max 32
 * rows of 64 pages (2,048 keys). */
static void graph_loop_mla(int32_t variant) {
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(102 + 10 * (uint64_t)variant);
    const int32_t ps = 32, P = DL_MAX_KV / ps;
    mla_opts o;
    memset(&o, 0, sizeof o);
    o.dtype = FI_DTYPE_BF16;
    o.heads = variant == 5 ? 64 : 16; /* row 5: the wgmma body */
    o.variant = variant;
    o.page_size = ps;
    o.form = FI_FORM_BLOCK_TABLES;
    o.sinks = 1;
    o.return_lse = 1;
    o.scale_ptr = 1; /* the graph must follow a new bmm1 scale written at the checked steps */
    o.max_batch = DL_MAX_B;
    int32_t q[DL_MAX_B], kv[DL_MAX_B];
    for (int32_t b = 0; b < DL_MAX_B; b++) {
        q[b] = 1;
        kv[b] = P * ps; /* the case's own batch: every row's full pages */
    }
    mla_case c;
    char msg[MSG];
    if (mla_case_init(&c, &o, q, kv, DL_MAX_B, &rng, msg, sizeof msg)) fail_msg("init: %s", msg);
    loop_ctx L;
    memset(&L, 0, sizeof L);
    L.g = gt_case_make(&c, &MLA_GT_FAMILY, c.plan, c.stream, &c.fb, c.B, c.P, c.num_pages,
                       mla_case_outputs(&c));
    L.lf = &DL_MLA;
    L.B_max = DL_MAX_B;
    L.P = c.P;
    L.q_len = 1;
    L.tokens = c.tokens;
    if (loop_open(&L, c.d_pt, msg, sizeof msg)) {
        loop_free(&L);
        fail_msg("setup: %s", msg);
    }
    loop_run(&L, &rng);
}

/* GQA 8/2 heads, d128, page 16, q_len 2 (causal MTP), sinks, scales by pointer: B_max 32
 * rows of 128 pages (2,048 keys). */
static void graph_loop_gqa(int32_t variant) {
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(103 + 10 * (uint64_t)variant);
    const int32_t ps = 16, P = DL_MAX_KV / ps;
    gqa_opts o;
    memset(&o, 0, sizeof o);
    o.dtype = FI_DTYPE_BF16;
    o.heads_q = 8;
    o.heads_kv = 2;
    o.head_dim = 128;
    o.variant = variant;
    o.page_size = ps;
    o.q_len = 2;
    o.sinks = 1;
    o.return_lse = 1;
    o.scale_ptr = 1;
    o.max_batch = DL_MAX_B;
    int32_t kv[DL_MAX_B];
    for (int32_t b = 0; b < DL_MAX_B; b++) kv[b] = P * ps;
    gqa_case c;
    char msg[MSG];
    if (gqa_case_init(&c, &o, kv, DL_MAX_B, &rng, msg, sizeof msg)) fail_msg("init: %s", msg);
    loop_ctx L;
    memset(&L, 0, sizeof L);
    L.g = gt_case_make(&c, &GQA_FAMILY, c.plan, c.stream, &c.fb, c.B, c.P, c.num_pages,
                       gqa_case_outputs(&c));
    L.lf = &DL_GQA;
    L.B_max = DL_MAX_B;
    L.P = c.P;
    L.q_len = 2;
    L.tokens = c.tokens;
    if (loop_open(&L, c.d_pt, msg, sizeof msg)) {
        loop_free(&L);
        fail_msg("setup: %s", msg);
    }
    loop_run(&L, &rng);
}

static void device_plan_graph_loop_mla_10000_steps(void **state) {
    (void)state;
    graph_loop_mla(0);
}
static void device_plan_graph_loop_gqa_10000_steps(void **state) {
    (void)state;
    graph_loop_gqa(0);
}
/* The same loops on the data-parallel partition rows (MLA 2, GQA 1 and 4: planner/ppart.c). */
static void device_plan_graph_loop_mla_parallel_10000_steps(void **state) {
    (void)state;
    graph_loop_mla(2);
    graph_loop_mla(5); /* the wgmma body's parallel row, heads 64 */
}
static void device_plan_graph_loop_gqa_parallel_10000_steps(void **state) {
    (void)state;
    graph_loop_gqa(1);
    graph_loop_gqa(4); /* the rows-8 kernel's parallel row (group 4 x q_len 2 = 8 rows) */
}

/* ==== 3. rules broken on the device: the status word, nothing written =================== */

/* Host copies of a case's arrays, broken one rule at a time. */
typedef struct work_batch {
    fi_batch b; /* the case's batch (batch_size B_max) over the copies below */
    int32_t *lens, *qo, *kvp, *pt;
    int64_t n, pt_len;
} work_batch;

static void work_free(work_batch *w) {
    free(w->lens);
    free(w->qo);
    free(w->kvp);
    free(w->pt);
    memset(w, 0, sizeof *w);
}

/* Back to the case's arrays. */
static void work_reset(work_batch *w, const fibatch *fb) {
    memcpy(w->lens, fb->kv_lens, sizeof(int32_t) * (size_t)w->n);
    memcpy(w->pt, fb->page_table, sizeof(int32_t) * (size_t)w->pt_len);
    if (fb->batch.form == FI_FORM_INDPTR) {
        memcpy(w->qo, fb->q_indptr, sizeof(int32_t) * (size_t)(w->n + 1));
        memcpy(w->kvp, fb->kv_indptr, sizeof(int32_t) * (size_t)(w->n + 1));
    }
}

static int work_init(work_batch *w, const fibatch *fb) {
    memset(w, 0, sizeof *w);
    w->n = fb->batch.batch_size;
    w->pt_len = fb->page_table_len;
    w->lens = (int32_t *)malloc(sizeof(int32_t) * (size_t)(w->n + 1));
    w->qo = (int32_t *)malloc(sizeof(int32_t) * (size_t)(w->n + 1));
    w->kvp = (int32_t *)malloc(sizeof(int32_t) * (size_t)(w->n + 1));
    w->pt = (int32_t *)malloc(sizeof(int32_t) * (size_t)(w->pt_len + 1));
    if (!w->lens || !w->qo || !w->kvp || !w->pt) return -1;
    w->b = fb->batch;
    if (w->b.form == FI_FORM_INDPTR) {
        w->b.qo_indptr = w->qo;
        w->b.kv_indptr = w->kvp;
        w->b.kv_indices = w->pt;
        w->b.kv_len = w->lens;
    } else {
        w->b.block_tables = w->pt;
        w->b.seq_lens = w->lens;
    }
    work_reset(w, fb);
    return 0;
}

/* An MLA case planned on the device by one captured graph (fi_plan_update_device -> fi_run,
 * PDL on) over device arrays written from w. */
typedef struct bad_ctx {
    mla_case c;
    gt_case g;
    fi_caps caps;
    work_batch w;
    gc_dev_batch dev; /* block_tables / kv_indices: the case's d_pt (fi_run's page table) */
    fi_device_batch db;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    int32_t B_max;
} bad_ctx;

static void bad_free(bad_ctx *x) {
    if (x->c.stream) cudaStreamSynchronize(x->c.stream);
    if (x->exec) cudaGraphExecDestroy(x->exec);
    if (x->graph) cudaGraphDestroy(x->graph);
    gc_dev_batch_free(&x->dev);
    work_free(&x->w);
    mla_case_free(&x->c);
}

/* Fail the test (the context freed first). */
#define BAD_FAIL(x, ...)                                                                    \
    do {                                                                                    \
        bad_free(x);                                                                        \
        fail_msg(__VA_ARGS__);                                                              \
    } while (0)

/* The case (form o, q_len / kv_len [4]; caps for 8 requests so B_max + 1 is within them),
 * its reference (the inputs never change), the graph.  The case's plan becomes the device
 * plan. */
static void bad_open(bad_ctx *x, const mla_opts *o, const int32_t *q, const int32_t *kv,
                     tt_rng *rng) {
    char msg[MSG];
    memset(x, 0, sizeof *x);
    x->B_max = 4;
    if (mla_case_init(&x->c, o, q, kv, x->B_max, rng, msg, sizeof msg)) fail_msg("init: %s", msg);
    x->g = gt_case_make(&x->c, &MLA_GT_FAMILY, x->c.plan, x->c.stream, &x->c.fb, x->c.B, x->c.P,
                        x->c.num_pages, mla_case_outputs(&x->c));
    x->caps = *fi_plan_caps(x->c.plan);
    gc_dev_batch_init(&x->dev, x->c.d_pt);
    if (work_init(&x->w, &x->c.fb)) BAD_FAIL(x, "host allocation failed");
    if (mla_case_reference(&x->c, msg, sizeof msg) ||
        gc_dev_batch_upload(&x->dev, &x->w.b, x->w.pt_len, x->B_max, x->c.stream, msg, sizeof msg))
        BAD_FAIL(x, "%s", msg);
    x->db = gc_dev_batch_describe(&x->dev, &x->w.b, 1, x->c.tokens, (int32_t)x->w.pt_len);
    fi_attn_args a = mla_case_args(&x->c, 1);
    a.enable_pdl = 1;
    assert_int_equal(cudaStreamBeginCapture(x->c.stream, cudaStreamCaptureModeGlobal),
                     cudaSuccess);
    const fi_status s1 = fi_plan_update_device(x->c.plan, &x->db, 1, x->c.stream);
    const fi_status s2 = s1 == FI_OK ? fi_run(x->c.plan, &a, x->c.stream) : s1;
    const cudaError_t e = cudaStreamEndCapture(x->c.stream, &x->graph);
    if (s1 != FI_OK || s2 != FI_OK || e != cudaSuccess ||
        cudaGraphInstantiate(&x->exec, x->graph, 0) != cudaSuccess)
        BAD_FAIL(x, "capture: fi_plan_update_device %s, fi_run %s, end capture %s",
                 fi_status_name(s1), fi_status_name(s2), cudaGetErrorString(e));
}

/* Write w's arrays and step batch size B on the device, poison, replay, read the verdict. */
static void bad_replay(bad_ctx *x, int32_t B, fi_error_detail *got) {
    char msg[MSG];
    if (gc_dev_batch_upload(&x->dev, &x->w.b, x->w.pt_len, B, x->c.stream, msg, sizeof msg) ||
        gc_poison(&x->g.io, x->c.stream, msg, sizeof msg))
        BAD_FAIL(x, "%s", msg);
    if (cudaGraphLaunch(x->exec, x->c.stream) != cudaSuccess)
        BAD_FAIL(x, "graph launch: %s", cudaGetErrorString(cudaGetLastError()));
    const fi_status st = fi_plan_device_error(x->c.plan, got, x->c.stream);
    if (st != FI_OK) BAD_FAIL(x, "fi_plan_device_error: %s", fi_status_name(st));
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) BAD_FAIL(x, "after the replay: %s", cudaGetErrorString(e));
}

/* out and lse still all poison (0xff) after the step. */
static void bad_expect_untouched(bad_ctx *x, const char *what) {
    char msg[MSG];
    if (gc_download(&x->g.io, msg, sizeof msg)) BAD_FAIL(x, "%s: %s", what, msg);
    const unsigned char *ob = (const unsigned char *)x->g.io.h_out;
    const unsigned char *lb = (const unsigned char *)x->g.io.h_lse;
    size_t touched = 0;
    for (size_t i = 0; i < x->g.io.out_bytes; i++) touched += ob[i] != 0xff;
    for (size_t i = 0; i < x->g.io.lse_bytes; i++) touched += lb[i] != 0xff;
    if (touched) BAD_FAIL(x, "%s: the step wrote %zu bytes of out / lse", what, touched);
}

static void bad_expect_detail(bad_ctx *x, const fi_error_detail *got,
                              const fi_error_detail *want, const char *what) {
    if (got->status != want->status || got->request != want->request ||
        got->needed != want->needed || got->limit != want->limit || got->cuda_error != 0)
        BAD_FAIL(x, "%s: device says %s request %d needed %lld limit %lld (cuda %d); want %s "
                 "request %d needed %lld limit %lld", what, fi_status_name(got->status),
                 got->request, (long long)got->needed, (long long)got->limit, got->cuda_error,
                 fi_status_name(want->status), want->request, (long long)want->needed,
                 (long long)want->limit);
}

/* A rule fi_batch_validate knows: w as broken, B requests of it.  The host's verdict on the
 * same batch must be `status` (the injection does break that rule), and the device's
 * status word must equal the host's detail; nothing written. */
static void bad_step_host_rule(bad_ctx *x, int32_t B, fi_status status, const char *what) {
    fi_batch h = x->w.b;
    h.batch_size = B;
    fi_request_info req[16];
    int32_t tq = 0;
    fi_error_detail want;
    fi_batch_validate(&x->caps, &h, req, &tq, &want);
    if (want.status != status)
        BAD_FAIL(x, "%s: the host says %s of the injected batch, the test meant %s", what,
                 fi_status_name(want.status), fi_status_name(status));
    fi_error_detail got;
    bad_replay(x, B, &got);
    bad_expect_detail(x, &got, &want, what);
    bad_expect_untouched(x, what);
    print_message("    %-46s %s request %d needed %lld limit %lld, nothing written\n", what,
                  fi_status_name(got.status), got.request, (long long)got.needed,
                  (long long)got.limit);
}

/* A capacity rule only the device planner has (what fi_device_batch declared). */
static void bad_step_declared(bad_ctx *x, int32_t B, int64_t needed, int64_t limit,
                              const char *what) {
    const fi_error_detail want = {FI_ERR_DEVICE_BATCH_OVER_DECLARED, needed, limit, -1, 0};
    fi_error_detail got;
    bad_replay(x, B, &got);
    bad_expect_detail(x, &got, &want, what);
    bad_expect_untouched(x, what);
    print_message("    %-46s %s needed %lld limit %lld, nothing written\n", what,
                  fi_status_name(got.status), (long long)got.needed, (long long)got.limit);
}

/* The case's own arrays again: FI_OK and every request against the fp64 reference. */
static void bad_good_step(bad_ctx *x, const char *after) {
    char msg[MSG];
    work_reset(&x->w, &x->c.fb);
    fi_error_detail got;
    bad_replay(x, x->B_max, &got);
    if (got.status != FI_OK)
        BAD_FAIL(x, "good step after %s: device says %s (request %d)", after,
                 fi_status_name(got.status), got.request);
    double wo = 0, wl = 0;
    if (gc_download(&x->g.io, msg, sizeof msg) ||
        mla_case_compare(&x->c, 0, x->B_max, MLA_TOL, &wo, &wl, msg, sizeof msg))
        BAD_FAIL(x, "good step after %s: %s", after, msg);
}

/* The bad-step cases' MLA options: heads 16, page 16, causal, lse, B_max 8. */
static mla_opts bad_opts(int32_t variant, fi_batch_form form, int32_t max_q_tokens) {
    mla_opts o;
    memset(&o, 0, sizeof o);
    o.dtype = FI_DTYPE_BF16;
    o.heads = 16;
    o.variant = variant;
    o.page_size = 16;
    o.form = form;
    o.causal = 1;
    o.return_lse = 1;
    o.max_batch = 8;
    o.max_q_tokens = max_q_tokens;
    return o;
}

/* Block tables, q_len 2 causal: rows of 16 pages (the longest request: 250 keys). */
static void bad_block_tables(tt_rng *rng, int32_t variant) {
    const mla_opts o = bad_opts(variant, FI_FORM_BLOCK_TABLES, 16);
    const int32_t q[4] = {2, 2, 2, 2}, kv[4] = {100, 37, 250, 64};
    static bad_ctx x;
    bad_open(&x, &o, q, kv, rng);
    const int32_t P = x.c.P, ps = o.page_size, B = x.B_max;
    print_message("  block tables (B_max %d, %d pages a row, caps.num_pages %d):\n", B, P,
                  x.caps.num_pages);
    bad_good_step(&x, "capture");

    x.w.lens[2] = P * ps + 1;
    bad_step_host_rule(&x, B, FI_ERR_SEQ_LEN_EXCEEDS_PAGES, "seq_len one token past its row");
    bad_good_step(&x, "seq_len past its row");
    x.w.pt[1 * P + 0] = x.caps.num_pages;
    bad_step_host_rule(&x, B, FI_ERR_PAGE_INDEX_OUT_OF_RANGE, "page index = caps.num_pages");
    bad_good_step(&x, "page index = num_pages");
    x.w.pt[3 * P + (kv[3] + ps - 1) / ps - 1] = -7;
    bad_step_host_rule(&x, B, FI_ERR_PAGE_INDEX_OUT_OF_RANGE, "last used page index -7");
    bad_good_step(&x, "page index -7");
    x.w.lens[3] = -5;
    bad_step_host_rule(&x, B, FI_ERR_NEGATIVE_LENGTH, "seq_len -5");
    bad_good_step(&x, "negative seq_len");
    x.w.lens[1] = 1;
    bad_step_host_rule(&x, B, FI_ERR_INCONSISTENT_LENGTHS, "seq_len 1 < q_len 2, causal");
    bad_good_step(&x, "seq_len below q_len");
    /* two broken rules: the first in fi_batch_validate's order names the request */
    x.w.lens[3] = -5;
    x.w.pt[1 * P + 1] = x.caps.num_pages + 100;
    bad_step_host_rule(&x, B, FI_ERR_PAGE_INDEX_OUT_OF_RANGE, "bad page of 1 and seq_len -5 of 3");
    bad_good_step(&x, "two rules");
    bad_step_host_rule(&x, -1, FI_ERR_NEGATIVE_BATCH_SIZE, "batch size -1");
    bad_good_step(&x, "negative batch size");
    bad_step_declared(&x, B + 1, B + 1, B, "batch size B_max + 1 (within the caps)");
    bad_good_step(&x, "batch size over B_max");

    /* q tokens over what a description declared: a direct call with fewer declared rows */
    fi_device_batch small = x.db;
    small.max_q_tokens = x.c.tokens - 1;
    char msg[MSG];
    if (gc_dev_batch_upload(&x.dev, &x.w.b, x.w.pt_len, B, x.c.stream, msg, sizeof msg) ||
        gc_poison(&x.g.io, x.c.stream, msg, sizeof msg))
        BAD_FAIL(&x, "%s", msg);
    fi_attn_args a = mla_case_args(&x.c, 1);
    a.enable_pdl = 1;
    fi_status st = fi_plan_update_device(x.c.plan, &small, 1, x.c.stream);
    if (st == FI_OK) st = fi_run(x.c.plan, &a, x.c.stream);
    if (st != FI_OK) BAD_FAIL(&x, "direct fi_plan_update_device / fi_run: %s", fi_status_name(st));
    fi_error_detail got;
    const fi_error_detail want = {FI_ERR_DEVICE_BATCH_OVER_DECLARED, x.c.tokens, x.c.tokens - 1,
                                  -1, 0};
    if (fi_plan_device_error(x.c.plan, &got, x.c.stream) != FI_OK) BAD_FAIL(&x, "status read");
    bad_expect_detail(&x, &got, &want, "q tokens over the declared max_q_tokens");
    bad_expect_untouched(&x, "q tokens over the declared max_q_tokens");
    print_message("    %-46s %s needed %lld limit %lld, nothing written\n",
                  "q tokens over the declared max_q_tokens", fi_status_name(got.status),
                  (long long)got.needed, (long long)got.limit);
    bad_good_step(&x, "q tokens over declared");
    bad_free(&x);
}

/* The wrapper's form: qo_indptr / kv_indptr / kv_indices / kv_len, q_len 1..3 causal. */
static void bad_indptr(tt_rng *rng, int32_t variant) {
    const mla_opts o = bad_opts(variant, FI_FORM_INDPTR, 24);
    const int32_t q[4] = {1, 2, 1, 3}, kv[4] = {90, 40, 200, 33};
    static bad_ctx x;
    bad_open(&x, &o, q, kv, rng);
    const int32_t ps = o.page_size, B = x.B_max;
    print_message("  indptr (B_max %d, %lld kv_indices):\n", B, (long long)x.w.pt_len);
    bad_good_step(&x, "capture");

    x.w.qo[0] = 1;
    bad_step_host_rule(&x, B, FI_ERR_INDPTR_NOT_MONOTONE, "qo_indptr[0] = 1");
    bad_good_step(&x, "qo_indptr[0] = 1");
    x.w.kvp[2] = x.w.kvp[1] - 1;
    bad_step_host_rule(&x, B, FI_ERR_INDPTR_NOT_MONOTONE, "kv_indptr decreasing at 2");
    bad_good_step(&x, "kv_indptr decreasing");
    x.w.lens[1] = (x.w.kvp[2] - x.w.kvp[1]) * ps + 1;
    bad_step_host_rule(&x, B, FI_ERR_SEQ_LEN_EXCEEDS_PAGES, "kv_len one token past its pages");
    bad_good_step(&x, "kv_len past its pages");
    x.w.pt[x.w.kvp[3]] = -1;
    bad_step_host_rule(&x, B, FI_ERR_PAGE_INDEX_OUT_OF_RANGE, "kv_indices entry -1");
    bad_good_step(&x, "kv_indices -1");
    /* request 1: q_len 0 (the MLA INDPTR form takes any q_len >= 1: the wrapper's prefill) */
    for (int32_t b = 2; b <= B; b++) x.w.qo[b] -= 2;
    bad_step_host_rule(&x, B, FI_ERR_Q_LEN_UNSUPPORTED, "q_len 0 (qo_indptr)");
    bad_good_step(&x, "q_len 0");
    x.w.lens[0] = -1;
    bad_step_host_rule(&x, B, FI_ERR_NEGATIVE_LENGTH, "kv_len -1");
    bad_good_step(&x, "negative kv_len");
    const int32_t declared = (int32_t)x.w.pt_len;
    x.w.kvp[B] = declared + 1; /* the last row one entry longer than kv_indices */
    bad_step_declared(&x, B, declared + 1, declared, "kv_indptr[B] past kv_indices_len");
    bad_good_step(&x, "kv_indptr[B] past kv_indices_len");
    bad_free(&x);
}

static void device_plan_bad_length_reports_status(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(104);
    /* the walk's row (one thread validates) and the parallel row (every thread does) */
    for (int32_t variant = 0; variant <= 2; variant += 2) {
        bad_block_tables(&rng, variant);
        bad_indptr(&rng, variant);
    }
}

/* ==== 4. what fi_plan_update_device refuses on the host ================================== */

/* Refusals compared with fi_batch_validate need arrays behind the host mirror even where
 * only scalars are read. */
typedef struct host_ctx {
    mla_case c;
    gt_case g;
    fi_caps caps;
    fi_plan *hp;                /* host-only, same caps */
    gc_dev_batch dev, dev_ind;  /* block tables (the case's d_pt), and an indptr twin */
    batchgen_batch ind;         /* the indptr twin's host arrays */
    fi_device_batch db, db_ind;
    unsigned char *snap, *now;
    size_t snap_bytes, now_bytes;
} host_ctx;

static void host_free(host_ctx *x) {
    if (x->c.stream) cudaStreamSynchronize(x->c.stream);
    fi_plan_destroy(x->hp);
    gc_dev_batch_free(&x->dev);
    gc_dev_batch_free(&x->dev_ind);
    batchgen_free(&x->ind);
    free(x->snap);
    free(x->now);
    mla_case_free(&x->c);
}

#define HOST_FAIL(x, ...)                                                                   \
    do {                                                                                    \
        host_free(x);                                                                       \
        fail_msg(__VA_ARGS__);                                                              \
    } while (0)

/* fi_plan_update_device(db) refuses with what fi_batch_validate says of hb (the same
 * description over host arrays, batch_size = its B_max): `status`, and fi_plan_error
 * gives fi_batch_validate's detail. */
static void host_expect_rule(host_ctx *x, const fi_device_batch *db, const fi_batch *hb,
                             fi_status status, const char *what) {
    fi_request_info req[16];
    int32_t tq = 0;
    fi_error_detail want;
    fi_batch_validate(&x->caps, hb, req, &tq, &want);
    if (want.status != status)
        HOST_FAIL(x, "%s: the host says %s, the test meant %s", what, fi_status_name(want.status),
                  fi_status_name(status));
    const fi_status got = fi_plan_update_device(x->c.plan, db, 0, x->c.stream);
    const fi_error_detail e = fi_plan_error(x->c.plan);
    if (got != status || e.status != status || e.request != want.request ||
        e.needed != want.needed || e.limit != want.limit)
        HOST_FAIL(x, "%s: fi_plan_update_device returned %s (fi_plan_error %s request %d needed "
                  "%lld limit %lld); want %s request %d needed %lld limit %lld", what,
                  fi_status_name(got), fi_status_name(e.status), e.request, (long long)e.needed,
                  (long long)e.limit, fi_status_name(status), want.request,
                  (long long)want.needed, (long long)want.limit);
}

/* A refusal fi_batch_validate has no rule for (declared capacities, the plan's kind). */
static void host_expect(host_ctx *x, fi_plan *plan, const fi_device_batch *db, fi_status want,
                        const char *what) {
    const fi_status got = fi_plan_update_device(plan, db, 0, x->c.stream);
    if (got != want)
        HOST_FAIL(x, "%s: fi_plan_update_device returned %s, want %s", what, fi_status_name(got),
                  fi_status_name(want));
}

/* The same field of the device description and of its host mirror set to one value. */
#define BREAK_BOTH(x, desc, host, field, value, status, what)                               \
    do {                                                                                    \
        fi_device_batch d_ = (desc);                                                        \
        fi_batch h_ = (host);                                                               \
        d_.batch.field = (value);                                                           \
        h_.field = (value);                                                                 \
        host_expect_rule((x), &d_, &h_, (status), (what));                                  \
    } while (0)

/* The workspace's plan region (through the used prefix of the case's batch) now. */
static void host_snapshot(host_ctx *x, unsigned char **buf, size_t *bytes) {
    char msg[MSG];
    fi_plan_view v;
    if (fi_plan_get_view(x->hp, &v) != FI_OK) HOST_FAIL(x, "host-only plan has no view");
    if (cudaStreamSynchronize(x->c.stream) != cudaSuccess ||
        gc_plan_download(x->c.d_ws, gc_plan_used_bytes(&v), buf, bytes, msg, sizeof msg))
        HOST_FAIL(x, "snapshot: %s", msg);
}

/* fi_run with a: `want`, nothing launched. */
static void host_expect_run(host_ctx *x, const fi_attn_args *a, fi_status want, const char *what) {
    const fi_status got = fi_run(x->c.plan, a, x->c.stream);
    if (got != want)
        HOST_FAIL(x, "%s: fi_run returned %s, want %s", what, fi_status_name(got),
                  fi_status_name(want));
}

static void host_open(host_ctx *x, tt_rng *rng) {
    char msg[MSG];
    memset(x, 0, sizeof *x);
    mla_opts o;
    memset(&o, 0, sizeof o);
    o.dtype = FI_DTYPE_BF16;
    o.heads = 16;
    o.page_size = 16;
    o.form = FI_FORM_BLOCK_TABLES;
    o.return_lse = 1;
    o.max_batch = 6;
    o.max_q_tokens = 8;
    const int32_t q[4] = {1, 1, 1, 1}, kv[4] = {100, 17, 300, 0};
    if (mla_case_init(&x->c, &o, q, kv, 4, rng, msg, sizeof msg)) fail_msg("init: %s", msg);
    x->g = gt_case_make(&x->c, &MLA_GT_FAMILY, x->c.plan, x->c.stream, &x->c.fb, x->c.B, x->c.P,
                        x->c.num_pages, mla_case_outputs(&x->c));
    x->caps = *fi_plan_caps(x->c.plan);
    gc_dev_batch_init(&x->dev, x->c.d_pt);
    gc_dev_batch_init(&x->dev_ind, NULL);
    if (batchgen_from_lens(rng, &x->caps, FI_FORM_INDPTR, q, kv, 4, 0, 1, 1, -1, &x->ind))
        HOST_FAIL(x, "host allocation failed");
    if (gc_dev_batch_upload(&x->dev, &x->c.fb.batch, x->c.fb.page_table_len, 4, x->c.stream, msg,
                            sizeof msg) ||
        gc_dev_batch_upload(&x->dev_ind, &x->ind.batch, x->ind.page_table_len, 4, x->c.stream, msg,
                            sizeof msg))
        HOST_FAIL(x, "%s", msg);
    x->db = gc_dev_batch_describe(&x->dev, &x->c.fb.batch, 1, x->c.tokens, 0);
    x->db_ind = gc_dev_batch_describe(&x->dev_ind, &x->ind.batch, 1, x->c.tokens,
                                      (int32_t)x->ind.page_table_len);
    if (fi_plan_create(&x->caps, NULL, 0, NULL, &x->hp) != FI_OK ||
        fi_plan_update(x->hp, &x->c.fb.batch, NULL) != FI_OK)
        HOST_FAIL(x, "host-only plan of the case's batch failed");
}

static void device_plan_host_checks_return_their_status(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(105);
    static host_ctx x;
    host_open(&x, &rng);
    fi_error_detail d;
    const fi_batch *hb = &x.c.fb.batch, *hi = &x.ind.batch;

    /* arguments, and a plan without a workspace */
    host_expect(&x, NULL, &x.db, FI_ERR_NULL_ARGUMENT, "plan NULL");
    host_expect(&x, x.c.plan, NULL, FI_ERR_NULL_ARGUMENT, "dbatch NULL");
    host_expect(&x, x.hp, &x.db, FI_ERR_HOST_PLAN, "host-only plan");
    if (fi_plan_device_error(x.hp, &d, x.c.stream) != FI_ERR_HOST_PLAN ||
        fi_plan_device_error(NULL, &d, x.c.stream) != FI_ERR_NULL_ARGUMENT ||
        fi_plan_device_error(x.c.plan, NULL, x.c.stream) != FI_ERR_NULL_ARGUMENT)
        HOST_FAIL(&x, "fi_plan_device_error: host-only plan / NULL arguments not refused");

    /* a good device update: the plan is on the device, its view refused, and it runs */
    if (fi_plan_update_device(x.c.plan, &x.db, 0, x.c.stream) != FI_OK ||
        fi_plan_device_error(x.c.plan, &d, x.c.stream) != FI_OK || d.status != FI_OK)
        HOST_FAIL(&x, "good device update: %s (request %d)", fi_status_name(d.status), d.request);
    fi_plan_view v;
    const fi_status vs = fi_plan_get_view(x.c.plan, &v);
    if (vs != FI_ERR_PLAN_ON_DEVICE)
        HOST_FAIL(&x, "fi_plan_get_view after a device update: %s, want FI_ERR_PLAN_ON_DEVICE",
                  fi_status_name(vs));
    gt_check(&x.g, 2); /* PDL off and on, bitwise identical, against fp64 */
    host_snapshot(&x, &x.snap, &x.snap_bytes);

    /* the scalars, as fi_batch_validate checks them (block tables) */
    BREAK_BOTH(&x, x.db, *hb, form, (fi_batch_form)0, FI_ERR_INVALID_FORM, "form 0");
    BREAK_BOTH(&x, x.db, *hb, form, FI_FORM_CUM_SEQ_LENS, FI_ERR_INVALID_FORM,
               "cum_seq_lens form for a decode kind");
    BREAK_BOTH(&x, x.db, *hb, batch_size, -1, FI_ERR_NEGATIVE_BATCH_SIZE, "B_max -1");
    BREAK_BOTH(&x, x.db, *hb, batch_size, x.caps.max_batch + 1, FI_ERR_BATCH_OVER_CAPS,
               "B_max over caps.max_batch");
    BREAK_BOTH(&x, x.db, *hb, window_left, -2, FI_ERR_INVALID_WINDOW, "window_left -2");
    BREAK_BOTH(&x, x.db, *hb, causal, 2, FI_ERR_INVALID_CAUSAL, "causal 2");
    BREAK_BOTH(&x, x.db, *hb, block_tables, NULL, FI_ERR_NULL_ARGUMENT, "block_tables NULL");
    BREAK_BOTH(&x, x.db, *hb, seq_lens, NULL, FI_ERR_NULL_ARGUMENT, "seq_lens NULL");
    BREAK_BOTH(&x, x.db, *hb, max_pages_per_seq, -1, FI_ERR_NEGATIVE_PAGES_PER_SEQ,
               "max_pages_per_seq -1");
    BREAK_BOTH(&x, x.db, *hb, kv_split_pages, 2, FI_ERR_INVALID_KV_SPLIT, "kv_split_pages 2");
    BREAK_BOTH(&x, x.db, *hb, max_pages_per_seq, INT32_MAX / 4 + 1, FI_ERR_PAGE_TABLE_TOO_LARGE,
               "B_max x max_pages_per_seq over INT32_MAX");
    BREAK_BOTH(&x, x.db, *hb, q_len_per_request, -1, FI_ERR_NEGATIVE_LENGTH,
               "q_len_per_request -1");
    /* (indptr) */
    BREAK_BOTH(&x, x.db_ind, *hi, qo_indptr, NULL, FI_ERR_NULL_ARGUMENT, "qo_indptr NULL");
    BREAK_BOTH(&x, x.db_ind, *hi, kv_indptr, NULL, FI_ERR_NULL_ARGUMENT, "kv_indptr NULL");
    BREAK_BOTH(&x, x.db_ind, *hi, kv_indices, NULL, FI_ERR_NULL_ARGUMENT, "kv_indices NULL");
    BREAK_BOTH(&x, x.db_ind, *hi, kv_len, NULL, FI_ERR_NULL_ARGUMENT, "kv_len NULL");
    BREAK_BOTH(&x, x.db_ind, *hi, window_left, -3, FI_ERR_INVALID_WINDOW, "indptr window_left -3");

    /* what only a device description declares */
    fi_device_batch b = x.db;
    b.max_q_tokens = x.caps.max_q_tokens + 1;
    host_expect(&x, x.c.plan, &b, FI_ERR_Q_TOKENS_OVER_CAPS, "max_q_tokens over the caps");
    b.max_q_tokens = -1;
    host_expect(&x, x.c.plan, &b, FI_ERR_Q_TOKENS_OVER_CAPS, "max_q_tokens -1");
    b = x.db_ind;
    b.kv_indices_len = -1;
    host_expect(&x, x.c.plan, &b, FI_ERR_INVALID_ARGUMENT, "kv_indices_len -1");

    /* nothing was launched: the status word, the plan bytes and the plan's state stand */
    if (fi_plan_device_error(x.c.plan, &d, x.c.stream) != FI_OK || d.status != FI_OK)
        HOST_FAIL(&x, "status word after the refusals: %s", fi_status_name(d.status));
    host_snapshot(&x, &x.now, &x.now_bytes);
    if (memcmp(x.snap, x.now, x.snap_bytes) != 0)
        HOST_FAIL(&x, "a refused fi_plan_update_device changed the workspace's plan bytes");
    if (fi_plan_get_view(x.c.plan, &v) != FI_ERR_PLAN_ON_DEVICE)
        HOST_FAIL(&x, "a refused fi_plan_update_device changed the plan's state");
    gt_check(&x.g, 1);

    /* fi_run's tensors against the declared capacities, nothing written */
    char msg[MSG];
    if (gc_poison(&x.g.io, x.c.stream, msg, sizeof msg)) HOST_FAIL(&x, "%s", msg);
    const fi_attn_args good = mla_case_args(&x.c, 1);
    fi_attn_args a = good;
    a.q.shape[0] = a.q_rope.shape[0] = x.c.tokens - 1;
    host_expect_run(&x, &a, FI_ERR_SHAPE_MISMATCH, "q one row under the declared max_q_tokens");
    a = good;
    a.page_table.shape[0] = x.c.B - 1;
    host_expect_run(&x, &a, FI_ERR_SHAPE_MISMATCH, "page table one row under B_max");
    gt_expect_untouched(&x.g);

    /* a host update makes it a host plan again */
    if (fi_plan_update(x.c.plan, hb, x.c.stream) != FI_OK)
        HOST_FAIL(&x, "fi_plan_update after the device plan failed");
    if (fi_plan_get_view(x.c.plan, &v) != FI_OK || v.header->batch_size != 4 ||
        v.header->total_q_tokens != x.c.tokens)
        HOST_FAIL(&x, "fi_plan_get_view after a host update: refused or not the batch");
    gt_check(&x.g, 1);
    host_free(&x);
}

/* fi_copy_to_device (fiattn_run.h): random sizes of random bytes from pageable memory land
 * exactly, the source overwritten right after each call (pageable sources are staged
 * before the call returns); bytes 0 and NULL pointers answer without a copy. */
static void copy_to_device_stages_pageable_bytes(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(0xc0b1);
    const size_t cap = (size_t)1 << 20;
    unsigned char *src = (unsigned char *)malloc(cap), *back = (unsigned char *)malloc(cap),
                  *want = (unsigned char *)malloc(cap);
    unsigned char *d = NULL;
    assert_non_null(src);
    assert_non_null(back);
    assert_non_null(want);
    assert_int_equal(cudaMalloc((void **)&d, cap), cudaSuccess);
    cudaStream_t s;
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    assert_int_equal(fi_copy_to_device(NULL, src, 0, s), FI_OK);
    assert_int_equal(fi_copy_to_device(d, NULL, 4, s), FI_ERR_NULL_ARGUMENT);
    assert_int_equal(fi_copy_to_device(NULL, src, 4, s), FI_ERR_NULL_ARGUMENT);
    for (int it = 0; it < 50; it++) {
        const size_t n = (size_t)tt_rng_int(&rng, 1, (int32_t)cap);
        const size_t off = (size_t)tt_rng_int(&rng, 0, (int32_t)(cap - n));
        for (size_t i = 0; i < n; i++)
            src[i] = want[i] = (unsigned char)tt_rng_next(&rng);
        assert_int_equal(cudaMemsetAsync(d, 0xa5, cap, s), cudaSuccess);
        assert_int_equal(fi_copy_to_device(d + off, src, n, s), FI_OK);
        memset(src, 0x5a, n); /* too late to reach the device */
        assert_int_equal(cudaMemcpyAsync(back, d, cap, cudaMemcpyDeviceToHost, s), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        assert_memory_equal(back + off, want, n);
        for (size_t i = 0; i < cap; i++)
            if (i < off || i >= off + n)
                assert_int_equal(back[i], 0xa5);
    }
    cudaStreamDestroy(s);
    cudaFree(d);
    free(src);
    free(back);
    free(want);
}

int main(void) {
    gt_begin("test_device_plan_gpu");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(device_plan_host_checks_return_their_status),
        cmocka_unit_test(device_plan_bad_length_reports_status),
        cmocka_unit_test(device_plan_bytes_match_host_1000_batches),
        cmocka_unit_test(device_plan_parallel_rows_without_cluster_split),
        cmocka_unit_test(device_plan_graph_loop_mla_10000_steps),
        cmocka_unit_test(device_plan_graph_loop_gqa_10000_steps),
        cmocka_unit_test(device_plan_graph_loop_mla_parallel_10000_steps),
        cmocka_unit_test(device_plan_graph_loop_gqa_parallel_10000_steps),
        cmocka_unit_test(copy_to_device_stages_pageable_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
