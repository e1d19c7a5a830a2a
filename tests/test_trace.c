/*
 * tests/test_trace.c - the trace CSV parser, the decode / prefill / mixed length builders
 * (viz/trace.h) and the fi_batch builders (viz/batch.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/rng.h"
#include "viz/batch.h"
#include "viz/trace.h"

static uint64_t g_seed;

/* Random trace text of n rows; returns malloc'ed text, values in ctx[] / gen[]. */
static char *random_csv(tt_rng *r, int n, int header, int crlf, int32_t *ctx, int32_t *gen,
                        size_t *len) {
    size_t cap = (size_t)n * 64 + 64, pos = 0;
    char *s = malloc(cap);
    assert_non_null(s);
    const char *eol = crlf ? "\r\n" : "\n";
    if (header) pos += (size_t)snprintf(s + pos, cap - pos, "TIMESTAMP,ContextTokens,GeneratedTokens%s", eol);
    for (int i = 0; i < n; i++) {
        ctx[i] = tt_rng_int(r, 1, 20000);
        gen[i] = tt_rng_int(r, 0, 2000);
        pos += (size_t)snprintf(s + pos, cap - pos, "2023-11-16 18:%02d:%02d.%07d,%d,%d%s",
                                i / 60 % 60, i % 60, tt_rng_int(r, 0, 9999999), ctx[i],
                                gen[i], eol);
    }
    *len = pos;
    return s;
}

static void trace_parse_reads_every_row_with_or_without_header(void **state) {
    (void)state;
    tt_rng r = {g_seed};
    for (int iter = 0; iter < 8; iter++) {
        int n = tt_rng_int(&r, 1, 300), header = iter & 1, crlf = (iter >> 1) & 1;
        int32_t *ctx = malloc((size_t)n * 4), *gen = malloc((size_t)n * 4);
        size_t len;
        char *csv = random_csv(&r, n, header, crlf, ctx, gen, &len);
        /* iter & 4: drop the final line end. */
        if (iter & 4) len -= crlf ? 2 : 1;
        fitrace *t = NULL;
        fitrace_error err;
        assert_int_equal(fitrace_parse(csv, len, NULL, &t, &err), FITRACE_OK);
        assert_int_equal(t->num_requests, n);
        for (int i = 0; i < n; i++) {
            assert_int_equal(t->context_tokens[i], ctx[i]);
            assert_int_equal(t->generated_tokens[i], gen[i]);
        }
        assert_true(t->arrival_s[0] == 0.0);
        if (n > 1) assert_true(t->arrival_s[1] > 0.0 && t->arrival_s[1] < 2.0);
        fitrace_free(t);
        free(csv);
        free(ctx);
        free(gen);
    }
}

static void trace_parse_rejects_malformed_rows_with_their_line(void **state) {
    (void)state;
    static const char *bad[] = {
        "2023-11-16 18:15:46.68,374",             /* 2 fields */
        "2023-11-16 18:15:46.68,374,44,1",        /* 4 fields */
        "2023-11-16 18:15:46.68,-374,44",         /* negative */
        "2023-11-16 18:15:46.68,0,44",            /* context 0 */
        "2023-11-16 18:15:46.68,374,-1",          /* negative generated */
        "2023-11-16 18:15:46.68,37x4,44",         /* not a number */
        "2023-11-16 18:15:46.68,,44",             /* empty */
        "2023-11-16 18:15:46.68,374, 44",         /* space */
        "2023-11-16 18:15:46.68,99999999999,44",  /* too large */
        "2023-11-16T18:15:46.68,374,44",          /* wrong separator */
        "2023-13-16 18:15:46.68,374,44",          /* month 13 */
        "2023-11-16 18:15:46.,374,44",            /* empty fraction */
        "18:15:46,374,44",                        /* no date */
        "TIMESTAMP,ContextTokens,GeneratedTokens", /* header not first */
    };
    tt_rng r = {g_seed ^ 1};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int good_before = tt_rng_int(&r, 1, 5);
        char text[1024];
        size_t pos = (size_t)snprintf(text, sizeof text, "TIMESTAMP,ContextTokens,GeneratedTokens\n");
        for (int i = 0; i < good_before; i++)
            pos += (size_t)snprintf(text + pos, sizeof text - pos, "2023-11-16 18:15:4%d.5,%d,%d\n",
                                    i, 100 + i, 7);
        pos += (size_t)snprintf(text + pos, sizeof text - pos, "%s\n2023-11-16 18:15:59,1,1\n", bad[k]);
        fitrace *t = (fitrace *)0x1;
        fitrace_error err;
        fitrace_status st = fitrace_parse(text, pos, NULL, &t, &err);
        if (st != FITRACE_ERR_PARSE || err.line != good_before + 2)
            fail_msg("row '%s' gave %s at line %d, want FITRACE_ERR_PARSE at %d", bad[k],
                     fitrace_status_name(st), err.line, good_before + 2);
        assert_non_null(err.reason);
        assert_ptr_equal(t, (fitrace *)0x1); /* untouched */
    }
}

static void trace_parse_of_header_only_is_empty(void **state) {
    (void)state;
    const char *text = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n\r\n";
    fitrace *t = NULL;
    assert_int_equal(fitrace_parse(text, strlen(text), NULL, &t, NULL), FITRACE_ERR_EMPTY);
    assert_null(t);
    assert_int_equal(fitrace_load("/nonexistent/trace.csv", NULL, &t, NULL), FITRACE_ERR_IO);
}

static void trace_embedded_excerpt_equals_data_csv(void **state) {
    (void)state;
    FILE *f = fopen("data/azure_conv_2048.csv", "rb");
    if (!f) fail_msg("run from the repository root: data/azure_conv_2048.csv not found");
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t len = 0;
    const char *emb = fitrace_default_csv(&len);
    assert_int_equal(len, n);
    assert_memory_equal(emb, buf, n);
    fitrace *a = NULL, *b = NULL;
    assert_int_equal(fitrace_load_default(NULL, &a), FITRACE_OK);
    assert_int_equal(fitrace_load("data/azure_conv_2048.csv", NULL, &b, NULL), FITRACE_OK);
    assert_int_equal(a->num_requests, 2048);
    assert_int_equal(b->num_requests, 2048);
    assert_memory_equal(a->context_tokens, b->context_tokens, 2048 * sizeof(int32_t));
    assert_memory_equal(a->generated_tokens, b->generated_tokens, 2048 * sizeof(int32_t));
    /* First row of the Azure conversation trace. */
    assert_int_equal(a->context_tokens[0], 374);
    assert_int_equal(a->generated_tokens[0], 44);
    fitrace_free(a);
    fitrace_free(b);
}

/* A trace from explicit columns (timestamps all equal). */
static fitrace *make_trace(const int32_t *ctx, const int32_t *gen, int n) {
    char *text = malloc((size_t)n * 48 + 1);
    size_t pos = 0;
    for (int i = 0; i < n; i++)
        pos += (size_t)sprintf(text + pos, "2023-11-16 18:15:46,%d,%d\n", ctx[i], gen[i]);
    fitrace *t = NULL;
    assert_int_equal(fitrace_parse(text, pos, NULL, &t, NULL), FITRACE_OK);
    free(text);
    return t;
}

typedef struct lens_buf {
    int32_t q[4096], kv[4096], src[4096];
    fitrace_lens l;
} lens_buf;

static fitrace_lens *lens_of(lens_buf *b, int n) {
    b->l = (fitrace_lens){n, b->q, b->kv, b->src};
    for (int i = 0; i < n; i++) b->q[i] = b->kv[i] = b->src[i] = -7;
    return &b->l;
}

static void decode_snapshot_replaces_finished_requests_in_slot_order(void **state) {
    (void)state;
    /* gen: row0 1, row1 3, row2 2 (0 is skipped), row4 4, row5 9 ... */
    int32_t ctx[] = {100, 200, 300, 400, 500, 600, 700};
    int32_t gen[] = {1, 3, 0, 2, 4, 9, 9};
    fitrace *t = make_trace(ctx, gen, 7);
    lens_buf *b = calloc(1, sizeof *b);
    /* step 0: slots hold rows 0, 1 (both fresh). */
    assert_int_equal(fitrace_decode(t, 0, 0, 1, lens_of(b, 2)), FITRACE_OK);
    assert_int_equal(b->src[0], 0); assert_int_equal(b->kv[0], 100);
    assert_int_equal(b->src[1], 1); assert_int_equal(b->kv[1], 200);
    assert_int_equal(b->q[0], 1);
    /* step 1: row 0 (G=1) finished, slot 0 admits row 3 (row 2 has G=0); row 1 at t=1. */
    assert_int_equal(fitrace_decode(t, 0, 1, 1, lens_of(b, 2)), FITRACE_OK);
    assert_int_equal(b->src[0], 3); assert_int_equal(b->kv[0], 400);
    assert_int_equal(b->src[1], 1); assert_int_equal(b->kv[1], 201);
    /* step 3: row 3 admitted at 1, G=2 -> leaves at 3, slot 0 takes row 4 (slot order: slot
     * 0 first); row 1 admitted at 0, G=3 -> leaves at 3, slot 1 takes row 5. */
    assert_int_equal(fitrace_decode(t, 0, 3, 1, lens_of(b, 2)), FITRACE_OK);
    assert_int_equal(b->src[0], 4); assert_int_equal(b->kv[0], 500);
    assert_int_equal(b->src[1], 5); assert_int_equal(b->kv[1], 600);
    /* step 5 with mtp 3: row 4 at t=2, row 5 at t=2; kv = C + t + (mtp - 1). */
    assert_int_equal(fitrace_decode(t, 0, 5, 3, lens_of(b, 2)), FITRACE_OK);
    assert_int_equal(b->kv[0], 500 + 2 + 2); assert_int_equal(b->q[0], 3);
    assert_int_equal(b->kv[1], 600 + 2 + 2);
    free(b);
    fitrace_free(t);
}

/* Independent model: event times.  Slot k's request admitted at step a leaves at a + G. */
static void decode_model(const fitrace *t, int first, int n, int step, int32_t *src, int32_t *kv) {
    int64_t next = first;
    int32_t *adm = malloc((size_t)n * 4);
    for (int k = 0; k < n; k++) {
        while (t->generated_tokens[next % t->num_requests] == 0) next++;
        src[k] = (int32_t)(next++ % t->num_requests);
        adm[k] = 0;
    }
    for (int s = 1; s <= step; s++)
        for (int k = 0; k < n; k++)
            if (s - adm[k] == t->generated_tokens[src[k]]) {
                while (t->generated_tokens[next % t->num_requests] == 0) next++;
                src[k] = (int32_t)(next++ % t->num_requests);
                adm[k] = s;
            }
    for (int k = 0; k < n; k++) kv[k] = t->context_tokens[src[k]] + (step - adm[k]);
    free(adm);
}

static void decode_snapshot_kv_len_is_context_plus_own_step(void **state) {
    (void)state;
    fitrace *t = NULL;
    assert_int_equal(fitrace_load_default(NULL, &t), FITRACE_OK);
    tt_rng r = {g_seed ^ 2};
    lens_buf *b = calloc(1, sizeof *b);
    int32_t *src = malloc(4096 * 4), *kv = malloc(4096 * 4);
    lens_buf *prev = calloc(1, sizeof *prev);
    assert_non_null(b);
    assert_non_null(prev);
    for (int iter = 0; iter < 20; iter++) {
        int n = tt_rng_int(&r, 1, 1024), first = tt_rng_int(&r, 0, 2047);
        /* every step 0 .. steps (the model and the step-to-step rule checked at each),
         * then one far step (the model alone) */
        const int steps = tt_rng_int(&r, 8, 40), far = tt_rng_int(&r, 41, 1500);
        for (int step = 0; step <= steps + 1; step++) {
            const int s = step <= steps ? step : far;
            assert_int_equal(fitrace_decode(t, first, s, 1, lens_of(b, n)), FITRACE_OK);
            decode_model(t, first, n, s, src, kv);
            for (int k = 0; k < n; k++) {
                if (b->src[k] != src[k] || b->kv[k] != kv[k] || b->q[k] != 1)
                    fail_msg("first %d n %d step %d slot %d: row %d kv %d, want row %d kv %d",
                             first, n, s, k, b->src[k], b->kv[k], src[k], kv[k]);
                int32_t c = t->context_tokens[src[k]], g = t->generated_tokens[src[k]];
                assert_true(kv[k] >= c && kv[k] < c + g); /* never past its last token */
                if (s == 0) {  /* before any request can finish: row first + k at kv C */
                    assert_int_equal(b->src[k], (first + k) % 2048);
                    assert_int_equal(b->kv[k], t->context_tokens[b->src[k]]);
                } else if (step <= steps) {
                    /* one step later a slot holds the same request one token longer, or
                     * (it finished) a fresh one at its context length */
                    if (b->src[k] == prev->src[k])
                        assert_int_equal(b->kv[k], prev->kv[k] + 1);
                    else
                        assert_int_equal(b->kv[k], t->context_tokens[b->src[k]]);
                }
            }
            memcpy(prev->src, b->src, sizeof(int32_t) * (size_t)n);
            memcpy(prev->kv, b->kv, sizeof(int32_t) * (size_t)n);
        }
    }
    free(src);
    free(kv);
    free(prev);
    free(b);
    fitrace_free(t);
}

static void prefill_and_mixed_lengths_follow_context_tokens(void **state) {
    (void)state;
    fitrace *t = NULL;
    assert_int_equal(fitrace_load_default(NULL, &t), FITRACE_OK);
    tt_rng r = {g_seed ^ 3};
    lens_buf *b = calloc(1, sizeof *b);
    for (int iter = 0; iter < 10; iter++) {
        int n = tt_rng_int(&r, 1, 64), first = tt_rng_int(&r, 0, 2047);
        int prefix = tt_rng_int(&r, 0, 3000);
        assert_int_equal(fitrace_prefill(t, first, prefix, lens_of(b, n)), FITRACE_OK);
        for (int k = 0; k < n; k++) {
            int row = (first + k) % 2048, c = t->context_tokens[row];
            assert_int_equal(b->src[k], row);
            assert_int_equal(b->kv[k], c);
            assert_int_equal(b->q[k], prefix < c ? c - prefix : 1);
        }
        int np = tt_rng_int(&r, 0, n), chunk = tt_rng_int(&r, 1, 512), step = tt_rng_int(&r, 0, 50);
        assert_int_equal(fitrace_mixed(t, first, np, chunk, step, 1, lens_of(b, n)), FITRACE_OK);
        int32_t src[64], kv[64];
        decode_model(t, (first + np) % 2048, n - np, step, src, kv);
        for (int k = 0; k < n; k++) {
            if (k < np) {
                int c = t->context_tokens[(first + k) % 2048];
                assert_int_equal(b->kv[k], c);
                assert_int_equal(b->q[k], chunk < c ? chunk : c);
            } else {
                assert_int_equal(b->q[k], 1);
                assert_int_equal(b->kv[k], kv[k - np]);
                assert_int_equal(b->src[k], src[k - np]);
            }
        }
    }
    assert_int_equal(fitrace_prefill(t, 2048, 0, lens_of(b, 4)), FITRACE_ERR_ARG);
    assert_int_equal(fitrace_decode(t, 0, -1, 1, lens_of(b, 4)), FITRACE_ERR_ARG);
    free(b);
    fitrace_free(t);
}

/* Every token t < kv_len of request b maps to a page id; all ids in [0, num_pages) used
 * exactly once over the batch. */
static void batch_builders_give_every_page_id_exactly_once(void **state) {
    (void)state;
    tt_rng r = {g_seed ^ 4};
    static const fi_batch_form forms[] = {FI_FORM_BLOCK_TABLES, FI_FORM_INDPTR, FI_FORM_CUM_SEQ_LENS};
    for (int iter = 0; iter < 30; iter++) {
        fibatch_opts o = fibatch_default_opts();
        o.form = forms[iter % 3];
        o.page_size = (int32_t[]){1, 16, 32, 64, 128}[tt_rng_int(&r, 0, 4)];
        o.shuffle = tt_rng_int(&r, 0, 1);
        o.seed = tt_rng_next(&r);
        o.kv_split_pages = o.form != FI_FORM_INDPTR ? tt_rng_int(&r, 0, 1) : 0;
        int n = tt_rng_int(&r, 1, 40), ql = tt_rng_int(&r, 1, 8);
        int32_t q[40], kv[40];
        for (int i = 0; i < n; i++) {
            q[i] = o.form == FI_FORM_BLOCK_TABLES ? ql : tt_rng_int(&r, 0, 9);
            kv[i] = tt_rng_int(&r, 0, 3000);
        }
        fibatch fb;
        assert_int_equal(fibatch_build(&o, q, kv, n, NULL, &fb), FIBATCH_OK);
        char *seen = calloc((size_t)fb.num_pages, 1);
        int64_t used = 0, sum_q = 0;
        for (int bi = 0; bi < n; bi++) {
            int32_t p = (kv[bi] + o.page_size - 1) / o.page_size;
            sum_q += q[bi];
            for (int half = 0; half < (o.kv_split_pages ? 2 : 1); half++)
                for (int32_t i = 0; i < p; i++) {
                    int32_t id;
                    if (o.form == FI_FORM_INDPTR) {
                        assert_int_equal(fb.batch.kv_indptr[bi + 1] - fb.batch.kv_indptr[bi], p);
                        assert_int_equal(fb.batch.kv_len[bi], kv[bi]);
                        id = fb.batch.kv_indices[fb.batch.kv_indptr[bi] + i];
                    } else {
                        int rows = o.kv_split_pages ? 2 : 1;
                        id = fb.batch.block_tables[((int64_t)bi * rows + half) * fb.batch.max_pages_per_seq + i];
                        assert_int_equal(fb.batch.seq_lens[bi], kv[bi]);
                    }
                    assert_true(id >= 0 && id < fb.num_pages);
                    assert_int_equal(seen[id], 0);
                    seen[id] = 1;
                    used++;
                }
        }
        assert_true(used == fb.num_pages || (used == 0 && fb.num_pages == 1));
        assert_int_equal(fb.total_q_tokens, sum_q);
        if (o.form != FI_FORM_BLOCK_TABLES) {
            const int32_t *qi = o.form == FI_FORM_INDPTR ? fb.batch.qo_indptr : fb.batch.cum_seq_lens_q;
            assert_int_equal(qi[0], 0);
            for (int bi = 0; bi < n; bi++) assert_int_equal(qi[bi + 1] - qi[bi], q[bi]);
        } else {
            assert_int_equal(fb.batch.q_len_per_request, ql);
        }
        free(seen);
        fibatch_free(&fb);
        assert_null(fb.page_table);
    }
}

static void batch_builder_rejects_bad_input(void **state) {
    (void)state;
    fibatch_opts o = fibatch_default_opts();
    int32_t q[2] = {1, 2}, kv[2] = {10, 20};
    fibatch fb;
    o.form = FI_FORM_BLOCK_TABLES;
    assert_int_equal(fibatch_build(&o, q, kv, 2, NULL, &fb), FIBATCH_ERR_NONUNIFORM);
    assert_null(fb.page_table);
    o.form = FI_FORM_INDPTR;
    o.page_size = 0;
    assert_int_equal(fibatch_build(&o, q, kv, 2, NULL, &fb), FIBATCH_ERR_ARG);
    o.page_size = 16;
    kv[1] = -1;
    assert_int_equal(fibatch_build(&o, q, kv, 2, NULL, &fb), FIBATCH_ERR_ARG);
    kv[1] = 20;
    o.kv_split_pages = 1; /* no 3-D table in the indptr form */
    assert_int_equal(fibatch_build(&o, q, kv, 2, NULL, &fb), FIBATCH_ERR_ARG);
    o.kv_split_pages = 0;
    assert_int_equal(fibatch_build(&o, q, kv, 0, NULL, &fb), FIBATCH_ERR_ARG);
    assert_int_equal(fibatch_build(&o, q, kv, 2, NULL, &fb), FIBATCH_OK);
    fibatch_free(&fb);
}

int main(void) {
    g_seed = tt_test_seed();
    printf("test_trace: seed %llu (replay with FI_TEST_SEED=%llu)\n",
           (unsigned long long)g_seed, (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(trace_parse_reads_every_row_with_or_without_header),
        cmocka_unit_test(trace_parse_rejects_malformed_rows_with_their_line),
        cmocka_unit_test(trace_parse_of_header_only_is_empty),
        cmocka_unit_test(trace_embedded_excerpt_equals_data_csv),
        cmocka_unit_test(decode_snapshot_replaces_finished_requests_in_slot_order),
        cmocka_unit_test(decode_snapshot_kv_len_is_context_plus_own_step),
        cmocka_unit_test(prefill_and_mixed_lengths_follow_context_tokens),
        cmocka_unit_test(batch_builders_give_every_page_id_exactly_once),
        cmocka_unit_test(batch_builder_rejects_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
