/*
 * tests/test_plan_validation.c - every bad input gets its own fi_status, the error detail
 * names the request and numbers, and the previous plan's view stays byte-identical.
 * Also: caps / workspace errors at create, NULL arguments, host plans never touch CUDA.
 * Random lengths each run (seed printed; FI_TEST_SEED replays).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/batchgen.h"
#include "common/plan_check.h"
#include "fiattn.h"

static uint64_t g_seed;

/* Every region the view exposes (tests/common/plan_check.h), to prove an error changed
 * nothing. */
static tt_plan_snapshot take(const fi_plan *p) {
    tt_plan_snapshot s;
    assert_int_equal(tt_plan_snapshot_take(p, &s), 0);
    return s;
}

/* A plan over fixed caps planned with a random valid batch of `form`. */
typedef struct fixture {
    fi_caps caps;
    batchgen_batch good;
    fi_plan *plan;
    const fi_batch *recover; /* a batch the plan accepts (NULL: good.batch) */
} fixture;

static void setup(fixture *f, tt_rng *rng, fi_kind kind, fi_batch_form form, int kv_split) {
    memset(f, 0, sizeof *f);
    fi_caps c = {0};
    c.kind = kind;
    c.max_batch = 8;
    c.max_q_tokens = kind == FI_KIND_CONTEXT ? 512 : 64;
    c.page_size = 16;
    if (kind == FI_KIND_MLA_DECODE) {
        c.num_qo_heads = 64;
        c.num_kv_heads = 1;
        c.head_dim_qk = 576;
        c.head_dim_vo = 512;
    } else {
        c.num_qo_heads = 8;
        c.num_kv_heads = 2;
        c.head_dim_qk = c.head_dim_vo = 128;
    }
    c.q_dtype = c.kv_dtype = c.o_dtype = FI_DTYPE_BF16;
    c.num_ctas = tt_rng_int(rng, 1, 16);
    int32_t q[8], kv[8];
    const int32_t n = tt_rng_int(rng, 3, 8);
    const int32_t uq = tt_rng_int(rng, 1, 4);
    for (int32_t b = 0; b < n; b++) {
        kv[b] = tt_rng_int(rng, 20, 700);
        q[b] = kind == FI_KIND_CONTEXT ? tt_rng_int(rng, 1, 20)
               : form == FI_FORM_BLOCK_TABLES ? uq : tt_rng_int(rng, 1, 8);
    }
    assert_int_equal(batchgen_from_lens(rng, &c, form, q, kv, n, kv_split, 1, 1, -1, &f->good), 0);
    f->caps = f->good.caps;
    f->caps.max_batch = 8;
    f->caps.max_q_tokens = c.max_q_tokens;
    f->caps.num_pages = f->good.caps.num_pages;
    assert_int_equal(fi_plan_create(&f->caps, NULL, 0, NULL, &f->plan), FI_OK);
    assert_int_equal(fi_plan_update(f->plan, &f->good.batch, NULL), FI_OK);
}

static void teardown(fixture *f) {
    fi_plan_destroy(f->plan);
    batchgen_free(&f->good);
}

/* Update with `bad` must return `want` (request `req`, or any if -2) and change nothing. */
static void expect_rejected(fixture *f, const fi_batch *bad, fi_status want, int32_t req,
                            const char *what) {
    tt_plan_snapshot before = take(f->plan);
    fi_status st = fi_plan_update(f->plan, bad, NULL);
    if (st != want)
        fail_msg("seed %llu: %s: got %s, want %s", (unsigned long long)g_seed, what,
                 fi_status_name(st), fi_status_name(want));
    fi_error_detail d = fi_plan_error(f->plan);
    assert_int_equal(d.status, want);
    if (req != -2 && d.request != req)
        fail_msg("seed %llu: %s: detail.request %d, want %d", (unsigned long long)g_seed, what,
                 d.request, req);
    tt_plan_snapshot after = take(f->plan);
    const long at = tt_plan_snapshot_diff(&before, &after);
    if (at >= 0)
        fail_msg("seed %llu: %s changed the previous plan (first differing byte %ld of %zu)",
                 (unsigned long long)g_seed, what, at, before.len);
    tt_plan_snapshot_free(&before);
    tt_plan_snapshot_free(&after);
    /* and the plan still accepts a good batch afterwards, with a clean detail */
    assert_int_equal(fi_plan_update(f->plan, f->recover ? f->recover : &f->good.batch, NULL),
                     FI_OK);
    assert_int_equal(fi_plan_error(f->plan).status, FI_OK);
    assert_int_equal(fi_plan_error(f->plan).request, -1);
}

/* A writable copy of the good batch's arrays. */
typedef struct copy {
    fi_batch b;
    int32_t *table, *seq, *qi, *ki, *kvl;
} copy;

static int32_t *dup32(const int32_t *p, int64_t n) {
    if (!p)
        return NULL;
    int32_t *d = malloc(sizeof(int32_t) * (size_t)(n + 1));
    assert_non_null(d);
    memcpy(d, p, sizeof(int32_t) * (size_t)n);
    return d;
}

static copy make_copy(const batchgen_batch *g) {
    copy c = {0};
    const int32_t n = g->batch.batch_size;
    c.b = g->batch;
    c.table = dup32(g->page_table, g->page_table_len);
    c.seq = dup32(g->seq_lens, n);
    c.qi = dup32(g->q_indptr, n + 1);
    c.ki = dup32(g->kv_indptr, n + 1);
    c.kvl = dup32(g->kv_len, n);
    if (c.b.block_tables) c.b.block_tables = c.table;
    if (c.b.kv_indices) c.b.kv_indices = c.table;
    if (c.b.seq_lens) c.b.seq_lens = c.seq;
    if (c.b.qo_indptr) c.b.qo_indptr = c.qi;
    if (c.b.cum_seq_lens_q) c.b.cum_seq_lens_q = c.qi;
    if (c.b.kv_indptr) c.b.kv_indptr = c.ki;
    if (c.b.cum_seq_lens_kv) c.b.cum_seq_lens_kv = c.ki;
    if (c.b.kv_len) c.b.kv_len = c.kvl;
    return c;
}

static void free_copy(copy *c) {
    free(c->table);
    free(c->seq);
    free(c->qi);
    free(c->ki);
    free(c->kvl);
}

static const fi_batch_form k_forms[] = {FI_FORM_BLOCK_TABLES, FI_FORM_INDPTR,
                                        FI_FORM_CUM_SEQ_LENS};

static fi_kind kind_for(fi_batch_form form, int i) {
    if (form == FI_FORM_CUM_SEQ_LENS) return FI_KIND_CONTEXT;
    return i % 2 ? FI_KIND_MLA_DECODE : FI_KIND_GQA_DECODE;
}

static void plan_rejects_page_index_out_of_range(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 1};
    for (int i = 0; i < 60; i++) {
        const fi_batch_form form = k_forms[i % 3];
        const int split = form != FI_FORM_INDPTR && (i / 3) % 2;
        fixture f;
        setup(&f, &rng, kind_for(form, i), form, split);
        const batchgen_batch *g = &f.good;
        const int32_t b = tt_rng_int(&rng, 0, g->batch.batch_size - 1);
        const int32_t used = (g->kv_len[b] + f.caps.page_size - 1) / f.caps.page_size;
        const int32_t page = tt_rng_int(&rng, 0, used - 1);
        const int v_row = split && tt_rng_int(&rng, 0, 1);
        copy c = make_copy(g);
        int32_t *slot = &c.table[g->page_row[b] + (v_row ? g->batch.max_pages_per_seq : 0) + page];
        *slot = tt_rng_int(&rng, 0, 1) ? f.caps.num_pages : -1 - tt_rng_int(&rng, 0, 5);
        expect_rejected(&f, &c.b, FI_ERR_PAGE_INDEX_OUT_OF_RANGE, b, "page index out of range");
        free_copy(&c);
        /* an unused entry past the used pages is never read */
        c = make_copy(g);
        if (form != FI_FORM_INDPTR && used < g->batch.max_pages_per_seq) {
            c.table[g->page_row[b] + used] = -77;
            assert_int_equal(fi_plan_update(f.plan, &c.b, NULL), FI_OK);
        }
        free_copy(&c);
        teardown(&f);
    }
}

static void plan_rejects_seq_len_beyond_pages(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 2};
    for (int i = 0; i < 30; i++) {
        const fi_batch_form form = k_forms[i % 3];
        fixture f;
        setup(&f, &rng, kind_for(form, i), form, 0);
        const batchgen_batch *g = &f.good;
        const int32_t b = tt_rng_int(&rng, 0, g->batch.batch_size - 1);
        copy c = make_copy(g);
        int32_t pages = form == FI_FORM_INDPTR ? g->kv_indptr[b + 1] - g->kv_indptr[b]
                                               : g->batch.max_pages_per_seq;
        const int32_t too_long = pages * f.caps.page_size + 1;
        if (form == FI_FORM_BLOCK_TABLES) {
            c.seq[b] = too_long;
        } else if (form == FI_FORM_INDPTR) {
            c.kvl[b] = too_long;
        } else {
            for (int32_t k = b + 1; k <= g->batch.batch_size; k++)
                c.ki[k] += too_long - g->kv_len[b];
            c.b.seq_lens = NULL;
        }
        expect_rejected(&f, &c.b, FI_ERR_SEQ_LEN_EXCEEDS_PAGES, b, "seq_len beyond pages");
        free_copy(&c);
        teardown(&f);
    }
}

static void plan_rejects_negative_lengths(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 3};
    for (int i = 0; i < 30; i++) {
        const fi_batch_form form = k_forms[i % 3];
        fixture f;
        setup(&f, &rng, kind_for(form, i), form, 0);
        const batchgen_batch *g = &f.good;
        const int32_t b = tt_rng_int(&rng, 0, g->batch.batch_size - 1);
        copy c = make_copy(g);
        if (form == FI_FORM_BLOCK_TABLES) {
            c.seq[b] = -tt_rng_int(&rng, 1, 100);
            expect_rejected(&f, &c.b, FI_ERR_NEGATIVE_LENGTH, b, "negative seq_len");
            c.seq[b] = g->seq_lens[b];
            c.b.q_len_per_request = -1;
            expect_rejected(&f, &c.b, FI_ERR_NEGATIVE_LENGTH, -1, "negative q_len_per_request");
        } else if (form == FI_FORM_INDPTR) {
            c.kvl[b] = -tt_rng_int(&rng, 1, 100);
            expect_rejected(&f, &c.b, FI_ERR_NEGATIVE_LENGTH, b, "negative kv_len");
        } else {
            c.b.seq_lens = c.seq;
            c.seq[b] = -1;
            expect_rejected(&f, &c.b, FI_ERR_NEGATIVE_LENGTH, b, "negative seq_lens");
        }
        free_copy(&c);
        teardown(&f);
    }
}

static void plan_rejects_non_monotone_indptr(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 4};
    for (int i = 0; i < 30; i++) {
        const fi_batch_form form = i % 2 ? FI_FORM_INDPTR : FI_FORM_CUM_SEQ_LENS;
        fixture f;
        setup(&f, &rng, kind_for(form, i), form, 0);
        const batchgen_batch *g = &f.good;
        const int32_t n = g->batch.batch_size;
        const int32_t b = tt_rng_int(&rng, 0, n - 1);
        copy c = make_copy(g);
        int32_t *arr = tt_rng_int(&rng, 0, 1) ? c.qi : c.ki;
        /* make entry b+1 smaller than entry b: request b gets a negative length */
        arr[b + 1] = arr[b] - tt_rng_int(&rng, 1, 5);
        expect_rejected(&f, &c.b, FI_ERR_INDPTR_NOT_MONOTONE, b, "decreasing indptr");
        free_copy(&c);
        c = make_copy(g);
        int32_t *first = tt_rng_int(&rng, 0, 1) ? c.qi : c.ki;
        first[0] = tt_rng_int(&rng, 0, 1) ? tt_rng_int(&rng, 1, 5) : -tt_rng_int(&rng, 1, 5);
        expect_rejected(&f, &c.b, FI_ERR_INDPTR_NOT_MONOTONE, 0, "indptr not starting at 0");
        assert_int_equal(fi_plan_update(f.plan, &c.b, NULL), FI_ERR_INDPTR_NOT_MONOTONE);
        assert_int_equal(fi_plan_error(f.plan).needed, first[0]);
        assert_int_equal(fi_plan_error(f.plan).limit, 0);
        /* an empty batch has no request to blame: -1 */
        c.b.batch_size = 0;
        expect_rejected(&f, &c.b, FI_ERR_INDPTR_NOT_MONOTONE, -1, "empty batch, indptr[0] != 0");
        free_copy(&c);
        teardown(&f);
    }
}

/* kv_indices holds exactly kv_indptr[B] entries.  An indptr that rises past its last entry
 * and then falls ({0, 56, 43}) must be refused (at request 1, where it decreases) before
 * request 0's pages are read: they would lie past the caller's array (found by the fuzzer,
 * tests/fuzz/crashes/crash-kv-indptr-decreases; `make asan` sees the overflow). */
static void plan_rejects_indptr_past_its_end_before_reading_pages(void **state) {
    (void)state;
    fi_caps caps = {.kind = FI_KIND_MLA_DECODE, .max_batch = 4, .max_q_tokens = 4,
                    .num_pages = 64, .page_size = 1, .num_qo_heads = 16, .num_kv_heads = 1,
                    .head_dim_qk = 576, .head_dim_vo = 512, .q_dtype = FI_DTYPE_BF16,
                    .kv_dtype = FI_DTYPE_BF16, .o_dtype = FI_DTYPE_BF16, .num_ctas = 8};
    fi_plan *plan = NULL;
    assert_int_equal(fi_plan_create(&caps, NULL, 0, NULL, &plan), FI_OK);
    const int32_t qo_indptr[3] = {0, 1, 2}, kv_indptr[3] = {0, 56, 43}, kv_len[2] = {56, 1};
    int32_t *kv_indices = malloc(sizeof(int32_t) * 43); /* exactly kv_indptr[B] */
    assert_non_null(kv_indices);
    for (int32_t i = 0; i < 43; i++) kv_indices[i] = i;
    fi_batch b = {.form = FI_FORM_INDPTR, .batch_size = 2, .qo_indptr = qo_indptr,
                  .kv_indptr = kv_indptr, .kv_indices = kv_indices, .kv_len = kv_len,
                  .causal = 1, .window_left = -1};
    assert_int_equal(fi_plan_update(plan, &b, NULL), FI_ERR_INDPTR_NOT_MONOTONE);
    assert_int_equal(fi_plan_error(plan).request, 1);
    fi_request_info req[2];
    int32_t q_tokens = -1;
    assert_int_equal(fi_batch_validate(&caps, &b, req, &q_tokens, NULL), FI_ERR_INDPTR_NOT_MONOTONE);
    free(kv_indices);
    fi_plan_destroy(plan);
}

static void plan_rejects_inconsistent_lengths(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 5};
    for (int i = 0; i < 20; i++) {
        fixture f;
        setup(&f, &rng, FI_KIND_CONTEXT, FI_FORM_CUM_SEQ_LENS, 0);
        const batchgen_batch *g = &f.good;
        const int32_t b = tt_rng_int(&rng, 0, g->batch.batch_size - 1);
        copy c = make_copy(g);
        c.b.seq_lens = c.seq;
        c.seq[b] += tt_rng_int(&rng, 1, 3);
        expect_rejected(&f, &c.b, FI_ERR_INCONSISTENT_LENGTHS, b, "seq_lens != cum diff");
        free_copy(&c);
        teardown(&f);
        /* causal query block longer than its (non-empty) KV */
        setup(&f, &rng, FI_KIND_GQA_DECODE, FI_FORM_INDPTR, 0);
        c = make_copy(&f.good);
        const int32_t b2 = tt_rng_int(&rng, 0, f.good.batch.batch_size - 1);
        const int32_t q = f.good.q_len[b2];
        if (q >= 2) {
            c.kvl[b2] = q - 1;
            expect_rejected(&f, &c.b, FI_ERR_INCONSISTENT_LENGTHS, b2, "q_len > kv_len");
        }
        c.kvl[b2] = 0; /* an empty request is valid */
        assert_int_equal(fi_plan_update(f.plan, &c.b, NULL), FI_OK);
        free_copy(&c);
        teardown(&f);
    }
}

static void plan_rejects_batch_and_q_tokens_over_caps(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 6};
    for (int i = 0; i < 15; i++) {
        fixture f;
        setup(&f, &rng, FI_KIND_GQA_DECODE, FI_FORM_INDPTR, 0);
        const batchgen_batch *g = &f.good;
        fi_batch bad = g->batch;
        bad.batch_size = f.caps.max_batch + tt_rng_int(&rng, 1, 10);
        expect_rejected(&f, &bad, FI_ERR_BATCH_OVER_CAPS, -1, "batch over caps");
        assert_int_equal(fi_plan_update(f.plan, &bad, NULL), FI_ERR_BATCH_OVER_CAPS);
        assert_int_equal(fi_plan_error(f.plan).needed, bad.batch_size);
        assert_int_equal(fi_plan_error(f.plan).limit, f.caps.max_batch);
        teardown(&f);
        /* q tokens: a plan whose max_q_tokens is one below the batch's */
        setup(&f, &rng, FI_KIND_GQA_DECODE, FI_FORM_INDPTR, 0);
        fi_caps small = f.caps;
        small.max_q_tokens = f.good.total_q_tokens - 1;
        fi_plan *p2 = NULL;
        assert_int_equal(fi_plan_create(&small, NULL, 0, NULL, &p2), FI_OK);
        fi_plan *keep = f.plan;
        f.plan = p2;
        fi_batch fewer = f.good.batch;
        fewer.batch_size -= 1; /* fits (every request has q_len >= 1) */
        if (f.good.total_q_tokens - f.good.q_len[fewer.batch_size] <= small.max_q_tokens) {
            assert_int_equal(fi_plan_update(p2, &fewer, NULL), FI_OK);
            f.recover = &fewer;
            expect_rejected(&f, &f.good.batch, FI_ERR_Q_TOKENS_OVER_CAPS,
                            f.good.batch.batch_size - 1, "q tokens over caps");
        }
        fi_plan_destroy(p2);
        f.plan = keep;
        f.recover = NULL;
        teardown(&f);
    }
}

static void plan_rejects_bad_scalars(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 7};
    for (int i = 0; i < 15; i++) {
        const fi_batch_form form = k_forms[i % 3];
        fixture f;
        setup(&f, &rng, kind_for(form, i), form, 0);
        fi_batch bad = f.good.batch;
        bad.window_left = -2 - tt_rng_int(&rng, 0, 100);
        expect_rejected(&f, &bad, FI_ERR_INVALID_WINDOW, -1, "window_left < -1");
        bad = f.good.batch;
        bad.form = (fi_batch_form)(4 + tt_rng_int(&rng, 0, 5));
        expect_rejected(&f, &bad, FI_ERR_INVALID_FORM, -1, "unknown form");
        bad = f.good.batch;
        bad.causal = tt_rng_int(&rng, 0, 1) ? 2 + tt_rng_int(&rng, 0, 100) : -1;
        expect_rejected(&f, &bad, FI_ERR_INVALID_CAUSAL, -1, "causal not 0 / 1");
        bad = f.good.batch;
        bad.batch_size = -1 - tt_rng_int(&rng, 0, 1000);
        expect_rejected(&f, &bad, FI_ERR_NEGATIVE_BATCH_SIZE, -1, "negative batch_size");
        if (form != FI_FORM_INDPTR) {
            bad = f.good.batch;
            bad.max_pages_per_seq = -1 - tt_rng_int(&rng, 0, 1000);
            expect_rejected(&f, &bad, FI_ERR_NEGATIVE_PAGES_PER_SEQ, -1,
                            "negative max_pages_per_seq");
            bad = f.good.batch;
            bad.kv_split_pages = tt_rng_int(&rng, 0, 1) ? 2 + tt_rng_int(&rng, 0, 100) : -1;
            expect_rejected(&f, &bad, FI_ERR_INVALID_KV_SPLIT, -1, "kv_split_pages not 0 / 1");
            /* B x P over int32 (the arrays are never read that far: refused first) */
            bad = f.good.batch;
            bad.max_pages_per_seq = INT32_MAX / bad.batch_size + 1;
            expect_rejected(&f, &bad, FI_ERR_PAGE_TABLE_TOO_LARGE, -1, "B x P over int32");
            bad.max_pages_per_seq = INT32_MAX / (2 * bad.batch_size) + 1;
            bad.kv_split_pages = 1;
            expect_rejected(&f, &bad, FI_ERR_PAGE_TABLE_TOO_LARGE, -1, "B x 2 x P over int32");
            assert_int_equal(fi_plan_error(f.plan).status, FI_OK);
        }
        if (form == FI_FORM_BLOCK_TABLES && f.caps.kind != FI_KIND_CONTEXT) {
            bad = f.good.batch;
            bad.q_len_per_request = 9;
            expect_rejected(&f, &bad, FI_ERR_Q_LEN_UNSUPPORTED, 0, "MTP depth 9");
        }
        /* NULL arrays of the form */
        bad = f.good.batch;
        if (form == FI_FORM_INDPTR)
            bad.kv_indices = NULL;
        else
            bad.block_tables = NULL;
        expect_rejected(&f, &bad, FI_ERR_NULL_ARGUMENT, -1, "NULL page table");
        expect_rejected(&f, NULL, FI_ERR_NULL_ARGUMENT, -1, "NULL batch");
        teardown(&f);
    }
}

/* Small random caps of any kind that every function accepts. */
static fi_caps small_caps(tt_rng *rng) {
    fi_caps c;
    batchgen_caps(rng, (fi_kind)0, &c);
    c.max_batch = 4;
    c.max_q_tokens = 32;
    c.num_pages = 64;
    c.num_ctas = tt_rng_int(rng, 1, 200);
    return c;
}

typedef struct caps_case { fi_caps c; fi_status want; } caps_case;

/* fi_caps_validate, fi_workspace_size and fi_plan_create all return cases[k].want and
 * write nothing. */
static void expect_caps_refused(const caps_case *cases, int n) {
    for (int k = 0; k < n; k++) {
        fi_plan *sentinel = (fi_plan *)(uintptr_t)0x1234;
        fi_plan *p = sentinel;
        size_t bytes = 77;
        const fi_status s0 = fi_caps_validate(&cases[k].c);
        const fi_status s1 = fi_workspace_size(&cases[k].c, &bytes);
        const fi_status s2 = fi_plan_create(&cases[k].c, NULL, 0, NULL, &p);
        /* fi_caps_validate knows no device: num_ctas 0 is not a case here */
        if (s0 != cases[k].want || s1 != cases[k].want || s2 != cases[k].want)
            fail_msg("seed %llu case %d: got %s / %s / %s want %s", (unsigned long long)g_seed,
                     k, fi_status_name(s0), fi_status_name(s1), fi_status_name(s2),
                     fi_status_name(cases[k].want));
        assert_true(p == sentinel);
        assert_int_equal(bytes, 77);
    }
}

/* FI_FORM_CUM_SEQ_LENS is the context kind's form: the decode kinds refuse it with
 * FI_ERR_INVALID_FORM (before reading any array), while a context plan over the same heads
 * accepts the very same batch. */
static void decode_kinds_refuse_cum_seq_lens(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 13};
    for (int i = 0; i < 20; i++) {
        const fi_kind kind = i % 2 ? FI_KIND_MLA_DECODE : FI_KIND_GQA_DECODE;
        fixture f;
        setup(&f, &rng, kind, FI_FORM_INDPTR, 0);
        batchgen_batch cum;
        int32_t q[8], kv[8];
        const int32_t n = f.good.batch.batch_size;
        for (int32_t b = 0; b < n; b++) {
            q[b] = f.good.q_len[b];
            kv[b] = f.good.kv_len[b];
        }
        assert_int_equal(batchgen_from_lens(&rng, &f.caps, FI_FORM_CUM_SEQ_LENS, q, kv, n,
                                            tt_rng_int(&rng, 0, 1), 1, 1, -1, &cum), 0);
        fi_caps big = f.caps;
        big.num_pages = cum.caps.num_pages > big.num_pages ? cum.caps.num_pages : big.num_pages;
        fi_plan *keep = f.plan;
        assert_int_equal(fi_plan_create(&big, NULL, 0, NULL, &f.plan), FI_OK);
        assert_int_equal(fi_plan_update(f.plan, &f.good.batch, NULL), FI_OK);
        expect_rejected(&f, &cum.batch, FI_ERR_INVALID_FORM, -1, "cum_seq_lens for a decode kind");
        fi_request_info req[8];
        int32_t tokens = -7;
        fi_error_detail d;
        assert_int_equal(fi_batch_validate(&big, &cum.batch, req, &tokens, &d),
                         FI_ERR_INVALID_FORM);
        assert_int_equal(tokens, -7);
        assert_int_equal(d.needed, FI_FORM_CUM_SEQ_LENS);
        if (kind == FI_KIND_GQA_DECODE) { /* context takes it (GQA heads are context heads) */
            fi_caps ctx = big;
            ctx.kind = FI_KIND_CONTEXT;
            assert_int_equal(fi_batch_validate(&ctx, &cum.batch, req, &tokens, &d), FI_OK);
            assert_int_equal(tokens, cum.total_q_tokens);
        }
        fi_plan_destroy(f.plan);
        f.plan = keep;
        batchgen_free(&cum);
        teardown(&f);
    }
}

/* Caps over each documented limit get their own status from fi_caps_validate,
 * fi_workspace_size and fi_plan_create alike, before any allocation: nothing written, and
 * fi_workspace_size never reports a wrapped size.  At the limits the caps pass. */
static void caps_over_limits_are_refused(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 14};
    for (int i = 0; i < 30; i++) {
        const fi_caps good = small_caps(&rng);
        caps_case cases[12];
        int n = 0;
        cases[n].c = good; cases[n].c.max_batch = FI_LIMIT_MAX_BATCH + 1 + tt_rng_int(&rng, 0, 1000);
        cases[n++].want = FI_ERR_MAX_BATCH_OVER_LIMIT;
        cases[n].c = good; cases[n].c.max_batch = INT32_MAX; cases[n++].want = FI_ERR_MAX_BATCH_OVER_LIMIT;
        cases[n].c = good; cases[n].c.max_q_tokens = FI_LIMIT_MAX_Q_TOKENS + 1 + tt_rng_int(&rng, 0, 1000);
        cases[n++].want = FI_ERR_MAX_Q_TOKENS_OVER_LIMIT;
        cases[n].c = good; cases[n].c.max_q_tokens = INT32_MAX; cases[n++].want = FI_ERR_MAX_Q_TOKENS_OVER_LIMIT;
        cases[n].c = good; cases[n].c.num_pages = FI_LIMIT_NUM_PAGES + 1 + tt_rng_int(&rng, 0, 1000);
        cases[n++].want = FI_ERR_NUM_PAGES_OVER_LIMIT;
        cases[n].c = good; cases[n].c.num_ctas = FI_LIMIT_NUM_CTAS + 1 + tt_rng_int(&rng, 0, 1000);
        cases[n++].want = FI_ERR_NUM_CTAS_OVER_LIMIT;
        cases[n].c = good; cases[n].c.num_ctas = 1 << 28; cases[n++].want = FI_ERR_NUM_CTAS_OVER_LIMIT;
        /* each count within its limit, the plan they imply beyond FI_LIMIT_PLAN_ITEMS */
        cases[n].c = good; cases[n].c.max_q_tokens = FI_LIMIT_MAX_Q_TOKENS;
        cases[n].c.max_batch = FI_LIMIT_MAX_BATCH; cases[n].c.num_ctas = FI_LIMIT_NUM_CTAS;
        if (good.kind != FI_KIND_MLA_DECODE) { /* many KV heads of group 1: one tile a row */
            cases[n].c.num_kv_heads = 64;
            cases[n].c.num_qo_heads = 64;
        } else {   /* 128 heads: two tiles a query token */
            cases[n].c.num_qo_heads = 128;
        }
        cases[n++].want = FI_ERR_PLAN_OVER_LIMIT;
        if (good.kind != FI_KIND_MLA_DECODE) {
            cases[n].c = good; cases[n].c.num_qo_heads = cases[n].c.num_kv_heads = FI_LIMIT_QO_HEADS + 1;
            cases[n++].want = FI_ERR_UNSUPPORTED_HEADS;
        }
        expect_caps_refused(cases, n);
    }
    /* at the limits: accepted, and a size that covers every region (no wrap) */
    fi_caps c = {.kind = FI_KIND_MLA_DECODE, .max_batch = FI_LIMIT_MAX_BATCH,
                 .max_q_tokens = FI_LIMIT_MAX_BATCH, .num_pages = FI_LIMIT_NUM_PAGES,
                 .page_size = 64, .num_qo_heads = 64, .num_kv_heads = 1, .head_dim_qk = 576,
                 .head_dim_vo = 512, .q_dtype = FI_DTYPE_BF16, .kv_dtype = FI_DTYPE_BF16,
                 .o_dtype = FI_DTYPE_BF16, .num_ctas = FI_LIMIT_NUM_CTAS};
    size_t bytes = 0;
    assert_int_equal(fi_workspace_size(&c, &bytes), FI_OK);
    /* partial O alone: 2 (num_ctas - 1) slots of 64 rows x 512 fp32 */
    assert_true(bytes > (size_t)2 * (FI_LIMIT_NUM_CTAS - 1) * 64 * 512 * 4);
    fi_plan *p = NULL;
    assert_int_equal(fi_plan_create(&c, NULL, 0, NULL, &p), FI_OK);
    fi_plan_destroy(p);
}

/* Input dtypes: E5M2 is accepted like E4M3 (the CPU references read both); E2M1 (NVFP4)
 * only as the KV dtype of GQA decode and context attention, and as the output of context
 * attention; nothing else. */
static void caps_dtypes_follow_the_documented_sets(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 15};
    for (int i = 0; i < 30; i++) {
        const fi_caps c = small_caps(&rng);
        fi_caps t = c;
        t.q_dtype = FI_DTYPE_E5M2;
        t.kv_dtype = FI_DTYPE_E5M2;
        assert_int_equal(fi_caps_validate(&t), FI_OK);
        t = c;
        t.kv_dtype = FI_DTYPE_E2M1;
        assert_int_equal(fi_caps_validate(&t),
                         c.kind != FI_KIND_MLA_DECODE ? FI_OK : FI_ERR_UNSUPPORTED_DTYPE);
        t = c;
        t.q_dtype = FI_DTYPE_E2M1;
        assert_int_equal(fi_caps_validate(&t), FI_ERR_UNSUPPORTED_DTYPE);
        t = c;
        t.o_dtype = FI_DTYPE_E5M2;
        assert_int_equal(fi_caps_validate(&t), FI_ERR_UNSUPPORTED_DTYPE);
        t = c;
        t.o_dtype = FI_DTYPE_E2M1; /* NVFP4 out: context attention only */
        assert_int_equal(fi_caps_validate(&t),
                         c.kind == FI_KIND_CONTEXT ? FI_OK : FI_ERR_UNSUPPORTED_DTYPE);
        t = c;
        t.kv_dtype = (fi_dtype)(8 + tt_rng_int(&rng, 0, 100));
        assert_int_equal(fi_caps_validate(&t), FI_ERR_UNSUPPORTED_DTYPE);
    }
}

static void create_rejects_unsupported_caps(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 8};
    for (int i = 0; i < 50; i++) {
        const fi_caps good = small_caps(&rng);
        size_t bytes = 0;
        assert_int_equal(fi_workspace_size(&good, &bytes), FI_OK);
        assert_true(bytes > 0 && bytes % 256 == 0);
        caps_case cases[12];
        int n = 0;
        cases[n].c = good; cases[n].c.head_dim_qk = good.kind == FI_KIND_MLA_DECODE ? 512 : 96;
        cases[n++].want = FI_ERR_UNSUPPORTED_HEAD_DIM;
        cases[n].c = good; cases[n].c.head_dim_vo = 32; cases[n++].want = FI_ERR_UNSUPPORTED_HEAD_DIM;
        cases[n].c = good; cases[n].c.page_size = (int32_t[]){2, 8, 48, 256}[tt_rng_int(&rng, 0, 3)];
        cases[n++].want = FI_ERR_UNSUPPORTED_PAGE_SIZE;
        cases[n].c = good; cases[n].c.kv_dtype = FI_DTYPE_I32; cases[n++].want = FI_ERR_UNSUPPORTED_DTYPE;
        cases[n].c = good; cases[n].c.o_dtype = FI_DTYPE_I32; cases[n++].want = FI_ERR_UNSUPPORTED_DTYPE;
        cases[n].c = good; cases[n].c.q_dtype = (fi_dtype)0; cases[n++].want = FI_ERR_UNSUPPORTED_DTYPE;
        cases[n].c = good; cases[n].c.kind = (fi_kind)9; cases[n++].want = FI_ERR_UNSUPPORTED_KIND;
        cases[n].c = good; cases[n].c.max_batch = 0; cases[n++].want = FI_ERR_INVALID_CAPS;
        cases[n].c = good; cases[n].c.num_ctas = -1; cases[n++].want = FI_ERR_INVALID_CAPS;
        cases[n].c = good;
        if (good.kind == FI_KIND_MLA_DECODE) cases[n].c.num_qo_heads = 48;
        else { cases[n].c.num_kv_heads = 1; cases[n].c.num_qo_heads = 17; }
        cases[n++].want = FI_ERR_UNSUPPORTED_HEADS;
        cases[n].c = good; cases[n].c.num_qo_heads = good.num_kv_heads * 3 + 1;
        cases[n].c.num_kv_heads = good.kind == FI_KIND_MLA_DECODE ? 1 : 3;
        cases[n++].want = good.kind == FI_KIND_MLA_DECODE ? FI_ERR_UNSUPPORTED_HEADS
                                                           : FI_ERR_INVALID_CAPS;
        expect_caps_refused(cases, n);
        /* workspace too small / misaligned: checked before any CUDA call */
        fi_plan *p = NULL;
        void *fake = (void *)(uintptr_t)0x100000;
        assert_int_equal(fi_plan_create(&good, fake, bytes - 1, NULL, &p), FI_ERR_WORKSPACE_TOO_SMALL);
        assert_int_equal(fi_plan_create(&good, (char *)fake + 16, bytes, NULL, &p),
                         FI_ERR_WORKSPACE_MISALIGNED);
        assert_null(p);
    }
    size_t bytes;
    assert_int_equal(fi_workspace_size(NULL, &bytes), FI_ERR_NULL_ARGUMENT);
    fi_plan *p = NULL;
    assert_int_equal(fi_plan_create(NULL, NULL, 0, NULL, &p), FI_ERR_NULL_ARGUMENT);
}

static void plan_view_needs_a_successful_update(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 9};
    fixture f;
    setup(&f, &rng, FI_KIND_MLA_DECODE, FI_FORM_BLOCK_TABLES, 0);
    fi_plan *p = NULL;
    assert_int_equal(fi_plan_create(&f.caps, NULL, 0, NULL, &p), FI_OK);
    fi_plan_view v;
    assert_int_equal(fi_plan_get_view(p, &v), FI_ERR_NOT_PLANNED);
    assert_true(fi_plan_balance(p) == 0.0);
    fi_batch bad = f.good.batch;
    bad.window_left = -3;
    assert_int_equal(fi_plan_update(p, &bad, NULL), FI_ERR_INVALID_WINDOW);
    assert_int_equal(fi_plan_get_view(p, &v), FI_ERR_NOT_PLANNED);
    assert_int_equal(fi_plan_get_view(NULL, &v), FI_ERR_NULL_ARGUMENT);
    assert_int_equal(fi_plan_update(NULL, &bad, NULL), FI_ERR_NULL_ARGUMENT);
    assert_null(fi_plan_caps(NULL));
    assert_int_equal(fi_plan_caps(p)->num_ctas, f.caps.num_ctas);
    fi_plan_destroy(p);
    fi_plan_destroy(NULL);
    teardown(&f);
}

/* A host plan makes no CUDA call: a garbage stream handle is never looked at. */
static void host_plan_update_never_needs_a_gpu(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 10};
    for (int i = 0; i < 20; i++) {
        fixture f;
        setup(&f, &rng, kind_for(k_forms[i % 3], i), k_forms[i % 3], 0);
        void *garbage_stream = (void *)(uintptr_t)(0xdead0000u + (unsigned)i);
        assert_int_equal(fi_plan_update(f.plan, &f.good.batch, garbage_stream), FI_OK);
        teardown(&f);
    }
}

/* batch_size 0 is a valid, empty plan: no items, every CTA range empty. */
static void empty_batch_plans_nothing(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 12};
    for (int i = 0; i < 3; i++) {
        fixture f;
        setup(&f, &rng, kind_for(k_forms[i], i), k_forms[i], 0);
        fi_batch empty = f.good.batch;
        empty.batch_size = 0;
        assert_int_equal(fi_plan_update(f.plan, &empty, NULL), FI_OK);
        fi_plan_view v;
        assert_int_equal(fi_plan_get_view(f.plan, &v), FI_OK);
        assert_int_equal(v.header->num_items, 0);
        assert_int_equal(v.header->batch_size, 0);
        assert_int_equal(v.header->total_q_tokens, 0);
        for (int32_t c = 0; c <= v.num_ctas; c++)
            assert_int_equal(v.work_indptr[c], 0);
        teardown(&f);
    }
}

/* num_ctas 0 asks the current CUDA device: its SM count, or FI_ERR_NO_DEVICE without one
 * (this CI machine); never another status, and *bytes untouched on error. */
static void num_ctas_zero_resolves_or_reports_no_device(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 11};
    fi_caps c;
    batchgen_caps(&rng, (fi_kind)0, &c);
    c.max_batch = 4;
    c.max_q_tokens = 32;
    c.num_pages = 64;
    c.num_ctas = 0;
    size_t bytes = 12345;
    const fi_status st = fi_workspace_size(&c, &bytes);
    assert_true(st == FI_OK || st == FI_ERR_NO_DEVICE);
    if (st == FI_OK) {
        assert_true(bytes > 0 && bytes % 256 == 0);
        fi_plan *p = NULL;
        assert_int_equal(fi_plan_create(&c, NULL, 0, NULL, &p), FI_OK);
        assert_true(fi_plan_caps(p)->num_ctas > 0);
        fi_plan_destroy(p);
    } else {
        assert_int_equal(bytes, 12345);
        fi_plan *p = (fi_plan *)(uintptr_t)0x42;
        assert_int_equal(fi_plan_create(&c, NULL, 0, NULL, &p), FI_ERR_NO_DEVICE);
        assert_true(p == (fi_plan *)(uintptr_t)0x42);
    }
}

/* The snapshot that proves "a rejected batch changed nothing" sees every region of the
 * view: one corrupted byte of the header, work_indptr, cta_starts, items, groups or
 * requests (the plan's own staging, written through the view) is a difference; a corrupted
 * CTA start record is also refused by the plan checker. */
static void snapshot_sees_every_view_region(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 16};
    int groups_seen = 0;
    for (int i = 0; i < 30; i++) {
        fixture f;
        setup(&f, &rng, kind_for(k_forms[i % 3], i), k_forms[i % 3], 0);
        fi_plan_view v;
        assert_int_equal(fi_plan_get_view(f.plan, &v), FI_OK);
        const fi_plan_header *h = v.header;
        struct { unsigned char *p; size_t n; const char *name; } reg[6] = {
            /* header past num_items .. batch_size (the snapshot sizes its copy by them) */
            {(unsigned char *)(uintptr_t)h + 16, sizeof *h - 16, "header"},
            {(unsigned char *)(uintptr_t)v.work_indptr, sizeof(int32_t) * (size_t)(v.num_ctas + 1),
             "work_indptr"},
            {(unsigned char *)(uintptr_t)v.cta_starts, sizeof(fi_cta_start) * (size_t)v.num_ctas,
             "cta_starts"},
            {(unsigned char *)(uintptr_t)v.items, sizeof(fi_work_item) * (size_t)h->num_items, "items"},
            {(unsigned char *)(uintptr_t)v.groups, sizeof(fi_merge_group) * (size_t)h->num_groups,
             "groups"},
            {(unsigned char *)(uintptr_t)v.requests,
             sizeof(fi_request_info) * (size_t)h->batch_size, "requests"},
        };
        groups_seen += h->num_groups > 0;
        for (int r = 0; r < 6; r++) {
            if (reg[r].n == 0)
                continue;
            tt_plan_snapshot before = take(f.plan);
            unsigned char *at = reg[r].p + tt_rng_int(&rng, 0, (int32_t)reg[r].n - 1);
            const unsigned char keep = *at;
            *at ^= (unsigned char)(1u << tt_rng_int(&rng, 0, 7));
            tt_plan_snapshot after = take(f.plan);
            if (tt_plan_snapshot_diff(&before, &after) < 0)
                fail_msg("seed %llu: a corrupted byte of %s is not in the snapshot",
                         (unsigned long long)g_seed, reg[r].name);
            if (r == 2) { /* cta_starts: the checker refuses the plan */
                tt_plan_expect e = batchgen_expect(&f.good);
                char msg[256];
                if (tt_plan_check(f.plan, &f.good.batch, &e, msg, sizeof msg) == 0)
                    fail_msg("seed %llu: a corrupted cta_starts byte passed tt_plan_check",
                             (unsigned long long)g_seed);
            }
            *at = keep;
            tt_plan_snapshot_free(&before);
            tt_plan_snapshot_free(&after);
        }
        tt_plan_expect e = batchgen_expect(&f.good);
        char msg[256];
        if (tt_plan_check(f.plan, &f.good.batch, &e, msg, sizeof msg) != 0)
            fail_msg("seed %llu: restored plan: %s", (unsigned long long)g_seed, msg);
        teardown(&f);
    }
    assert_true(groups_seen > 0);
}

static void status_names_are_unique_and_total(void **state) {
    (void)state;
    for (int s = 0; s <= FI_ERR_UNSUPPORTED_SF_VEC_SIZE; s++) {
        const char *n = fi_status_name((fi_status)s);
        assert_non_null(n);
        assert_string_not_equal(n, "FI_STATUS_UNKNOWN");
        for (int t = 0; t < s; t++)
            assert_string_not_equal(n, fi_status_name((fi_status)t));
    }
    assert_string_equal(fi_status_name(FI_ERR_BATCH_OVER_CAPS), "FI_ERR_BATCH_OVER_CAPS");
    assert_string_equal(fi_status_name((fi_status)999), "FI_STATUS_UNKNOWN");
    /* the appended codes keep their values forever */
    assert_int_equal(FI_ERR_UNSUPPORTED_VARIANT, 31);
    assert_int_equal(FI_ERR_MAX_BATCH_OVER_LIMIT, 32);
    assert_int_equal(FI_ERR_PLAN_OVER_LIMIT, 36);
    assert_int_equal(FI_ERR_NEGATIVE_BATCH_SIZE, 37);
    assert_int_equal(FI_ERR_PAGE_TABLE_TOO_LARGE, 41);
    assert_string_equal(fi_status_name(FI_ERR_PAGE_TABLE_TOO_LARGE), "FI_ERR_PAGE_TABLE_TOO_LARGE");
    assert_int_equal(FI_ERR_GRID_NOT_RESIDENT, 42);
    assert_string_equal(fi_status_name(FI_ERR_GRID_NOT_RESIDENT), "FI_ERR_GRID_NOT_RESIDENT");
    assert_int_equal(FI_ERR_DEVICE_BATCH_OVER_DECLARED, 43);
    assert_int_equal(FI_ERR_PLAN_ON_DEVICE, 44);
    assert_string_equal(fi_status_name(FI_ERR_PLAN_ON_DEVICE), "FI_ERR_PLAN_ON_DEVICE");
    assert_int_equal(FI_ERR_SPARSE_UNSUPPORTED, 45);
    assert_int_equal(FI_ERR_SPARSE_TOP_K_MISMATCH, 46);
    assert_string_equal(fi_status_name(FI_ERR_SPARSE_TOP_K_MISMATCH), "FI_ERR_SPARSE_TOP_K_MISMATCH");
    assert_int_equal(FI_ERR_SKIP_SOFTMAX_UNSUPPORTED, 47);
    assert_string_equal(fi_status_name(FI_ERR_SKIP_SOFTMAX_UNSUPPORTED), "FI_ERR_SKIP_SOFTMAX_UNSUPPORTED");
    assert_int_equal(FI_ERR_UNSUPPORTED_SF_VEC_SIZE, 48);
    assert_string_equal(fi_status_name(FI_ERR_UNSUPPORTED_SF_VEC_SIZE), "FI_ERR_UNSUPPORTED_SF_VEC_SIZE");
    assert_string_equal(fi_status_name((fi_status)49), "FI_STATUS_UNKNOWN");
}

int main(void) {
    g_seed = tt_test_seed();
    printf("FI_TEST_SEED=%llu\n", (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plan_rejects_page_index_out_of_range),
        cmocka_unit_test(plan_rejects_seq_len_beyond_pages),
        cmocka_unit_test(plan_rejects_negative_lengths),
        cmocka_unit_test(plan_rejects_non_monotone_indptr),
        cmocka_unit_test(plan_rejects_indptr_past_its_end_before_reading_pages),
        cmocka_unit_test(plan_rejects_inconsistent_lengths),
        cmocka_unit_test(plan_rejects_batch_and_q_tokens_over_caps),
        cmocka_unit_test(plan_rejects_bad_scalars),
        cmocka_unit_test(decode_kinds_refuse_cum_seq_lens),
        cmocka_unit_test(caps_over_limits_are_refused),
        cmocka_unit_test(caps_dtypes_follow_the_documented_sets),
        cmocka_unit_test(create_rejects_unsupported_caps),
        cmocka_unit_test(plan_view_needs_a_successful_update),
        cmocka_unit_test(host_plan_update_never_needs_a_gpu),
        cmocka_unit_test(empty_batch_plans_nothing),
        cmocka_unit_test(num_ctas_zero_resolves_or_reports_no_device),
        cmocka_unit_test(snapshot_sees_every_view_region),
        cmocka_unit_test(status_names_are_unique_and_total),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
