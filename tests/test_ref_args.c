/*
 * tests/test_ref_args.c - the CPU references refuse arguments that would make them read
 * outside a tensor, before writing anything (executor/core/args.h):
 *   - a page table shorter than the plan reads, in each form ([1, P] or [B, 1] block
 *     tables, 2-D or 3-D; a [1] kv_indices): FI_ERR_SHAPE_MISMATCH;
 *   - a page table with another row stride than the plan assumed: FI_ERR_BAD_STRIDE;
 *   - an fp32 tensor or sink pointer not aligned to 4 bytes: FI_ERR_MISALIGNED_POINTER;
 *   - caps naming no tile table row: FI_ERR_UNSUPPORTED_VARIANT.
 * Outputs are poisoned first and must still be all NaN after each refusal.  Random kinds,
 * forms and lengths each run (seed printed; FI_TEST_SEED replays).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/batchgen.h"
#include "common/tensors.h"
#include "fiattn_ref.h"

static uint64_t g_seed;

/* One random planned case: a batch of 2..6 requests of which at least one spans several
 * pages, its plan, and run arguments with poisoned outputs.  F32 data (batchgen_caps). */
typedef struct tt_case {
    batchgen_batch g;
    fi_plan *plan;
    tt_test_attn ta;
} tt_case;

static void tt_case_make(tt_case *c, tt_rng *rng, fi_batch_form form) {
    /* cum_seq_lens is the context kind's form (fiattn.h) */
    const fi_kind kind = form == FI_FORM_CUM_SEQ_LENS
                             ? FI_KIND_CONTEXT
                             : (fi_kind)tt_rng_int(rng, FI_KIND_MLA_DECODE, FI_KIND_CONTEXT);
    fi_caps caps;
    batchgen_caps(rng, kind, &caps);
    caps.num_ctas = tt_rng_int(rng, 1, 12);
    const int32_t n = tt_rng_int(rng, 2, 6), uq = tt_rng_int(rng, 1, 4);
    int32_t q[6] = {0}, kv[6] = {0};
    for (int32_t b = 0; b < n; b++) {
        /* block tables take one q_len for every request */
        q[b] = form == FI_FORM_BLOCK_TABLES ? uq
               : tt_rng_int(rng, 1, kind == FI_KIND_CONTEXT ? 12 : 8);
        kv[b] = q[b] + tt_rng_int(rng, 0, 3 * caps.page_size);
    }
    const int32_t longest = tt_rng_int(rng, 0, n - 1);
    kv[longest] = q[longest] + 2 * caps.page_size + tt_rng_int(rng, 1, caps.page_size);
    const int split = form != FI_FORM_INDPTR && tt_rng_int(rng, 0, 1);
    assert_int_equal(batchgen_from_lens(rng, &caps, form, q, kv, n, split, 1,
                                        tt_rng_int(rng, 0, 1), -1, &c->g), 0);
    c->plan = NULL;
    assert_int_equal(fi_plan_create(&c->g.caps, NULL, 0, NULL, &c->plan), FI_OK);
    assert_int_equal(fi_plan_update(c->plan, &c->g.batch, NULL), FI_OK);
    assert_int_equal(tt_test_attn_make(&c->ta, &c->g.caps, &c->g.batch, NULL, rng), 0);
    tt_tensor_poison(&c->ta.args.out);
    tt_tensor_poison(&c->ta.args.lse);
}

static void tt_case_free(tt_case *c) {
    fi_plan_destroy(c->plan);
    tt_test_attn_free(&c->ta);
    batchgen_free(&c->g);
}

/* Both references refuse `bad` with `want` and leave the outputs all NaN. */
static void tt_expect_refused(tt_case *c, const fi_attn_args *bad, fi_status want,
                              const char *what) {
    const fi_status run = fi_ref_run(c->plan, bad);
    const fi_status naive = fi_naive_attention(&c->g.caps, &c->g.batch, bad);
    if (run != want || naive != want)
        fail_msg("seed %llu: %s (%s): fi_ref_run %s, fi_naive_attention %s, want %s",
                 (unsigned long long)g_seed, what, batchgen_describe(&c->g),
                 fi_status_name(run), fi_status_name(naive), fi_status_name(want));
    const int64_t rows = c->g.total_q_tokens;
    const fi_tensor *out = &c->ta.args.out, *lse = &c->ta.args.lse;
    if (tt_tensor_count_nan(out, rows) != tt_tensor_numel(out) / out->shape[0] * rows ||
        tt_tensor_count_nan(lse, rows) != tt_tensor_numel(lse) / lse->shape[0] * rows)
        fail_msg("seed %llu: %s: outputs written", (unsigned long long)g_seed, what);
}

/* Pages request b reads. */
static int64_t tt_pages(const batchgen_batch *g, int32_t b) {
    return (g->kv_len[b] + g->caps.page_size - 1) / g->caps.page_size;
}

/* Most pages any request reads (the longest row of a block table). */
static int64_t tt_max_pages(const batchgen_batch *g) {
    int64_t m = 0;
    for (int32_t b = 0; b < g->batch.batch_size; b++)
        m = tt_pages(g, b) > m ? tt_pages(g, b) : m;
    return m;
}

/* kv_indices elements read: up to the last used index + 1 (rows may hold spare pages). */
static int64_t tt_indices_read(const batchgen_batch *g) {
    int64_t m = 0;
    for (int32_t b = 0; b < g->batch.batch_size; b++) {
        const int64_t end = tt_pages(g, b) > 0 ? g->kv_indptr[b] + tt_pages(g, b) : 0;
        m = end > m ? end : m;
    }
    return m;
}

static void short_page_tables_are_shape_mismatches(void **state) {
    (void)state;
    tt_rng rng = {g_seed};
    const fi_batch_form forms[3] = {FI_FORM_BLOCK_TABLES, FI_FORM_INDPTR, FI_FORM_CUM_SEQ_LENS};
    for (int it = 0; it < 30; it++) {
        tt_case c;
        tt_case_make(&c, &rng, forms[it % 3]);
        fi_attn_args bad = c.ta.args;
        fi_tensor *pt = &bad.page_table;
        if (c.g.batch.form == FI_FORM_INDPTR) {
            pt->shape[0] = 1; /* [1]: the longest request alone reads 3 pages */
            tt_expect_refused(&c, &bad, FI_ERR_SHAPE_MISMATCH, "kv_indices [1]");
            bad = c.ta.args;
            pt->shape[0] = tt_indices_read(&c.g) - 1; /* one short */
            tt_expect_refused(&c, &bad, FI_ERR_SHAPE_MISMATCH, "kv_indices one short");
            bad = c.ta.args;
            pt->stride[0] = 2;
            tt_expect_refused(&c, &bad, FI_ERR_BAD_STRIDE, "kv_indices stride 2");
        } else {
            pt->shape[0] = 1; /* [1, P]: B >= 2 rows are read */
            tt_expect_refused(&c, &bad, FI_ERR_SHAPE_MISMATCH, "block table [1, P]");
            bad = c.ta.args;
            pt->shape[pt->ndim - 1] = 1; /* [B, 1]: a row reads >= 3 pages */
            tt_expect_refused(&c, &bad, FI_ERR_SHAPE_MISMATCH, "block table [B, 1]");
            bad = c.ta.args;
            pt->shape[pt->ndim - 1] = tt_max_pages(&c.g) - 1;
            tt_expect_refused(&c, &bad, FI_ERR_SHAPE_MISMATCH, "block table one column short");
            bad = c.ta.args;
            pt->stride[0] += tt_rng_int(&rng, 1, 5); /* rows not where the plan put them */
            tt_expect_refused(&c, &bad, FI_ERR_BAD_STRIDE, "block table row stride");
            bad = c.ta.args;
            pt->ndim = pt->ndim == 2 ? 3 : 2; /* [B, P] vs [B, 2, P] disagree with the plan */
            tt_expect_refused(&c, &bad, FI_ERR_SHAPE_MISMATCH, "block table rank");
        }
        /* and the table as given works */
        assert_int_equal(fi_ref_run(c.plan, &c.ta.args), FI_OK);
        tt_case_free(&c);
    }
}

static void misaligned_fp32_pointers_are_refused(void **state) {
    (void)state;
    tt_rng rng = {g_seed ^ 0x9e37u};
    for (int it = 0; it < 20; it++) {
        tt_case c;
        tt_case_make(&c, &rng, (fi_batch_form)tt_rng_int(&rng, 1, 3));
        assert_int_equal(c.ta.args.q.dtype, FI_DTYPE_F32);
        /* q over a buffer one element longer, its base 1..3 bytes past a 4-byte boundary */
        const int64_t shape[3] = {c.ta.args.q.shape[0] + 1, c.ta.args.q.shape[1],
                                  c.ta.args.q.shape[2]};
        fi_tensor buf;
        assert_int_equal(tt_tensor_alloc(&buf, FI_DTYPE_F32, 3, shape, NULL), 0);
        fi_attn_args bad = c.ta.args;
        bad.q = buf;
        bad.q.shape[0] = c.ta.args.q.shape[0];
        bad.q.data = (char *)buf.data + tt_rng_int(&rng, 1, 3);
        tt_expect_refused(&c, &bad, FI_ERR_MISALIGNED_POINTER, "q base");
        bad.q.data = buf.data; /* aligned: accepted */
        assert_int_equal(fi_ref_run(c.plan, &bad), FI_OK);
        tt_tensor_poison(&c.ta.args.out);
        tt_tensor_poison(&c.ta.args.lse);
        /* sinks [H_q] at an odd address */
        float *sinks = calloc((size_t)c.g.caps.num_qo_heads + 1, sizeof(float));
        assert_non_null(sinks);
        bad = c.ta.args;
        bad.sinks = (const float *)(const void *)((const char *)sinks + 2);
        tt_expect_refused(&c, &bad, FI_ERR_MISALIGNED_POINTER, "sinks");
        free(sinks);
        tt_tensor_free(&buf);
        tt_case_free(&c);
    }
}

static void unknown_variant_is_refused(void **state) {
    (void)state;
    tt_rng rng = {g_seed ^ 0x51u};
    for (int it = 0; it < 10; it++) {
        tt_case c;
        tt_case_make(&c, &rng, (fi_batch_form)tt_rng_int(&rng, 1, 3));
        fi_caps caps = c.g.caps;
        caps.variant = tt_rng_int(&rng, 1, 1 << 20) * (tt_rng_int(&rng, 0, 1) ? 1 : -1);
        size_t bytes = 7;
        assert_int_equal(fi_workspace_size(&caps, &bytes), FI_ERR_UNSUPPORTED_VARIANT);
        assert_int_equal(bytes, 7);
        assert_int_equal(fi_caps_validate(&caps), FI_ERR_UNSUPPORTED_VARIANT);
        assert_int_equal(fi_naive_attention(&caps, &c.g.batch, &c.ta.args),
                         FI_ERR_UNSUPPORTED_VARIANT);
        fi_plan *p = NULL;
        assert_int_equal(fi_plan_create(&caps, NULL, 0, NULL, &p), FI_ERR_UNSUPPORTED_VARIANT);
        assert_null(p);
        const int64_t rows = c.g.total_q_tokens;
        assert_int_equal(tt_tensor_count_nan(&c.ta.args.out, rows),
                         tt_tensor_numel(&c.ta.args.out) / c.ta.args.out.shape[0] * rows);
        tt_case_free(&c);
    }
}

int main(void) {
    g_seed = tt_test_seed();
    printf("test_ref_args: FI_TEST_SEED=%llu\n", (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(short_page_tables_are_shape_mismatches),
        cmocka_unit_test(misaligned_fp32_pointers_are_refused),
        cmocka_unit_test(unknown_variant_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
