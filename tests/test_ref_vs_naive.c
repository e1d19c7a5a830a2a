/*
 * tests/test_ref_vs_naive.c - the CPU reference executor, running the plan, equals the
 * naive fp64 reference, for every kind and feature; and the naive itself is pinned by a
 * hand-computed case.
 *
 * Each case: fresh random batch and data (seed printed; FI_TEST_SEED=<seed> replays),
 * outputs poisoned with NaN before each run and required fully overwritten, then
 * ||out_ref - out_naive|| / ||out_naive|| <= 1e-5 (fp32 outputs) on out and on the finite
 * lse, with the -inf lse positions identical.  CTA counts 1, 7 and 132 make the planner
 * split tiles, so the partial slots and the merge are exercised (checked: splits > 0).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/batchgen.h"
#include "common/rng.h"
#include "common/tensors.h"
#include "fiattn.h"
#include "fiattn_ref.h"

static tt_rng g_rng;

/* ---- batches --------------------------------------------------------------------------- */

/* A batch plus the arrays it points to. */
typedef struct test_batch {
    fi_batch batch;
    int32_t *q_lens, *kv_lens;
    int32_t *table;     /* block_tables or kv_indices */
    int32_t *indptr_q;  /* qo_indptr / cum_seq_lens_q */
    int32_t *indptr_kv; /* kv_indptr / cum_seq_lens_kv */
    int32_t num_pages;  /* pages the cache must hold */
} test_batch;

static void test_batch_free(test_batch *t) {
    free(t->q_lens);
    free(t->kv_lens);
    free(t->table);
    free(t->indptr_q);
    free(t->indptr_kv);
    memset(t, 0, sizeof *t);
}

/* Random page ids in [0, num_pages): a real cache scatters a request's pages. */
static void fill_pages(int32_t *dst, int32_t n, int32_t num_pages) {
    for (int32_t i = 0; i < n; ++i) dst[i] = tt_rng_int(&g_rng, 0, num_pages - 1);
}

/* B requests with the given q / kv lengths, in `form`; page ids drawn from num_pages. */
static test_batch make_batch(fi_batch_form form, int32_t B, const int32_t *q_lens,
                             const int32_t *kv_lens, int32_t page_size, int32_t num_pages,
                             int32_t split_pages, int32_t causal, int32_t window_left) {
    test_batch t;
    memset(&t, 0, sizeof t);
    t.q_lens = malloc(sizeof(int32_t) * (size_t)B);
    t.kv_lens = malloc(sizeof(int32_t) * (size_t)B);
    t.indptr_q = malloc(sizeof(int32_t) * (size_t)(B + 1));
    t.indptr_kv = malloc(sizeof(int32_t) * (size_t)(B + 1));
    assert_non_null(t.q_lens);
    assert_non_null(t.kv_lens);
    assert_non_null(t.indptr_q);
    assert_non_null(t.indptr_kv);
    memcpy(t.q_lens, q_lens, sizeof(int32_t) * (size_t)B);
    memcpy(t.kv_lens, kv_lens, sizeof(int32_t) * (size_t)B);
    t.num_pages = num_pages;
    int32_t max_pages = 1;
    t.indptr_q[0] = t.indptr_kv[0] = 0;
    for (int32_t b = 0; b < B; ++b) {
        const int32_t np = (kv_lens[b] + page_size - 1) / page_size;
        if (np > max_pages) max_pages = np;
        t.indptr_q[b + 1] = t.indptr_q[b] + q_lens[b];
        t.indptr_kv[b + 1] = t.indptr_kv[b] + (form == FI_FORM_INDPTR ? np : kv_lens[b]);
    }
    fi_batch *bt = &t.batch;
    bt->form = form;
    bt->batch_size = B;
    bt->causal = causal;
    bt->window_left = window_left;
    if (form == FI_FORM_INDPTR) {
        const int32_t nnz = t.indptr_kv[B];
        t.table = malloc(sizeof(int32_t) * (size_t)(nnz > 0 ? nnz : 1));
        assert_non_null(t.table);
        fill_pages(t.table, nnz, num_pages);
        bt->qo_indptr = t.indptr_q;
        bt->kv_indptr = t.indptr_kv;
        bt->kv_indices = t.table;
        bt->kv_len = t.kv_lens;
        return t;
    }
    /* Row slack (+1 page) so P differs from the pages used. */
    const int32_t P = max_pages + 1, rows = split_pages ? 2 : 1;
    t.table = malloc(sizeof(int32_t) * (size_t)B * rows * P);
    assert_non_null(t.table);
    fill_pages(t.table, B * rows * P, num_pages);
    bt->block_tables = t.table;
    bt->max_pages_per_seq = P;
    bt->kv_split_pages = split_pages;
    bt->seq_lens = t.kv_lens;
    if (form == FI_FORM_BLOCK_TABLES) {
        bt->q_len_per_request = q_lens[0];
    } else {
        bt->cum_seq_lens_q = t.indptr_q;
        bt->cum_seq_lens_kv = t.indptr_kv;
    }
    return t;
}

/* ---- one comparison ---------------------------------------------------------------------- */

typedef struct case_stats {
    int32_t cases;
    int32_t split_cases;   /* plans with at least one merge group */
} case_stats;

/* Run naive and ref on the same random inputs and compare.  tol: relative tolerance on
 * out (fp32 outputs 1e-5; 16-bit outputs differ by rounding ties). */
static void check_case(const char *label, const fi_caps *caps, const fi_batch *batch,
                       const fi_test_attn_opts *opts, double tol, case_stats *stats) {
    tt_test_attn ta;
    assert_int_equal(tt_test_attn_make(&ta, caps, batch, opts, &g_rng), 0);
    fi_attn_args ref_args;
    assert_int_equal(tt_test_attn_args_fork(&ta, &ref_args), 0);
    const fi_tensor ref_out = ref_args.out, ref_lse = ref_args.lse;
    const int64_t rows = ta.q_tokens;

    tt_tensor_poison(&ta.args.out);
    if (ta.args.lse.data) tt_tensor_poison(&ta.args.lse);
    fi_status st = fi_naive_attention(caps, batch, &ta.args);
    if (st != FI_OK) fail_msg("%s: naive returned %s", label, fi_status_name(st));

    fi_plan *plan = NULL;
    st = fi_plan_create(caps, NULL, 0, NULL, &plan);
    if (st != FI_OK) fail_msg("%s: plan_create returned %s", label, fi_status_name(st));
    st = fi_plan_update(plan, batch, NULL);
    if (st != FI_OK) fail_msg("%s: plan_update returned %s", label, fi_status_name(st));
    fi_plan_view view;
    assert_int_equal(fi_plan_get_view(plan, &view), FI_OK);
    assert_int_equal(view.header->total_q_tokens, rows);
    stats->cases++;
    stats->split_cases += view.header->num_groups > 0;
    st = fi_ref_run(plan, &ref_args);
    if (st != FI_OK) fail_msg("%s: ref_run returned %s", label, fi_status_name(st));

    if (tt_tensor_count_nonfinite(&ta.args.out, rows) != 0)
        fail_msg("%s: naive out has unwritten / non-finite elements", label);
    if (tt_tensor_count_nonfinite(&ref_out, rows) != 0)
        fail_msg("%s: ref out has unwritten / non-finite elements", label);
    double err = 0.0;
    if (tt_tensor_compare(&ref_out, &ta.args.out, rows, &err) != 0 || !(err <= tol))
        fail_msg("%s: out rel err %.3g > %.1g (ctas %d, groups %d)", label, err, tol,
                 caps->num_ctas, view.header->num_groups);
    if (ta.args.lse.data) {
        if (tt_tensor_count_nan(&ta.args.lse, rows) || tt_tensor_count_nan(&ref_lse, rows))
            fail_msg("%s: lse has unwritten / NaN elements", label);
        const int64_t mism = tt_tensor_compare(&ref_lse, &ta.args.lse, rows, &err);
        if (mism != 0 || !(err <= 1e-5))
            fail_msg("%s: lse rel err %.3g, %lld -inf mismatches (ctas %d)", label, err,
                     (long long)mism, caps->num_ctas);
    }
    fi_plan_destroy(plan);
    tt_test_attn_args_free(&ref_args);
    tt_test_attn_free(&ta);
}

static const int32_t k_ctas[3] = {1, 7, 132};

/* ---- the naive reference, by hand ---------------------------------------------------------- */

/* One head, D 64, keys k0 = e0 and k1 = 0, q = e0, bmm1 = ln 3: logits ln 3 and 0, so the
 * softmax is (3/4, 1/4).  v0 = 1, v1 = 5 everywhere: out = bmm2 * 2, lse = ln 4.  With
 * sink ln 4: den 8, out = bmm2 * 8/8, lse ln 8.  Causal + window_left 0 on q_len 1: only
 * key 1: out = bmm2 * 5, lse 0.  A second request with kv_len 0 (non-causal): zeros, -inf. */
static void run_hand_case(float sink, int32_t causal, int32_t window_left, double want_out,
                          double want_lse) {
    fi_caps caps = tt_test_caps(FI_KIND_GQA_DECODE, 1, 1, 64, 16, 2, 2, 2);
    const int32_t q_lens[2] = {1, 1}, kv_lens[2] = {2, 0};
    test_batch tb = make_batch(FI_FORM_BLOCK_TABLES, 2, q_lens, kv_lens, 16, 2, 0, causal,
                               window_left);
    if (causal) tb.batch.batch_size = 1;   /* causal needs q_len <= kv_len: drop request 1 */
    tb.table[0] = 1;                        /* request 0's only page: page 1 */
    fi_test_attn_opts opts = {.bmm1_scale = (float)log(3.0), .bmm2_scale = 0.5f,
                              .sinks = sink != 0.0f};
    tt_test_attn ta;
    assert_int_equal(tt_test_attn_make(&ta, &caps, &tb.batch, &opts, &g_rng), 0);
    if (ta.sinks) ta.sinks[0] = sink;
    for (int64_t d = 0; d < 64; ++d) {
        const int64_t qi[3] = {0, 0, d}, k0[4] = {1, 0, 0, d}, k1[4] = {1, 1, 0, d};
        tt_tensor_set(&ta.args.q, qi, d == 0 ? 1.0 : 0.0);
        tt_tensor_set(&ta.args.k, k0, d == 0 ? 1.0 : 0.0);
        tt_tensor_set(&ta.args.k, k1, 0.0);
        tt_tensor_set(&ta.args.v, k0, 1.0);
        tt_tensor_set(&ta.args.v, k1, 5.0);
    }
    tt_tensor_poison(&ta.args.out);
    tt_tensor_poison(&ta.args.lse);
    assert_int_equal(fi_naive_attention(&caps, &tb.batch, &ta.args), FI_OK);
    for (int64_t d = 0; d < 64; ++d) {
        const int64_t o0[3] = {0, 0, d}, o1[3] = {1, 0, d};
        assert_float_equal(tt_tensor_get(&ta.args.out, o0), want_out, 1e-6);
        if (!causal) assert_true(tt_tensor_get(&ta.args.out, o1) == 0.0);
    }
    const int64_t l0[2] = {0, 0}, l1[2] = {1, 0};
    assert_float_equal(tt_tensor_get(&ta.args.lse, l0), want_lse, 1e-6);
    if (!causal) {
        const double l1v = tt_tensor_get(&ta.args.lse, l1);
        if (sink != 0.0f) assert_float_equal(l1v, sink, 1e-6);   /* den = e^sink alone */
        else assert_true(isinf(l1v) && l1v < 0);
    }
    tt_test_attn_free(&ta);
    test_batch_free(&tb);
}

static void naive_matches_hand_computed_softmax(void **state) {
    (void)state;
    run_hand_case(0.0f, 0, -1, 0.5 * 2.0, log(4.0));
    run_hand_case((float)log(4.0), 0, -1, 0.5 * 8.0 / 8.0, log(8.0));
    run_hand_case(0.0f, 1, 0, 0.5 * 5.0, 0.0);
    run_hand_case(0.0f, 1, 1, 0.5 * 2.0, log(4.0));
}

/* ---- ref vs naive, per kind ------------------------------------------------------------------ */

/* Random lengths: q_len in [q_lo, q_hi] (uniform when `uniform_q`), kv_len in
 * [q_len (causal) or 0, kv_hi], except one random request with kv_len in
 * [FI_TEST_LONG_KV, 2 * FI_TEST_LONG_KV]: long enough (> 2 x the planner's minimum chunk)
 * that the plan splits it when CTAs are many. */
#define FI_TEST_LONG_KV 1000
static void random_lengths(int32_t B, int32_t q_lo, int32_t q_hi, int32_t uniform_q,
                           int32_t kv_hi, int32_t causal, int32_t *q_lens, int32_t *kv_lens) {
    const int32_t q0 = tt_rng_int(&g_rng, q_lo, q_hi);
    const int32_t long_b = tt_rng_int(&g_rng, 0, B - 1);
    for (int32_t b = 0; b < B; ++b) {
        q_lens[b] = uniform_q ? q0 : tt_rng_int(&g_rng, q_lo, q_hi);
        kv_lens[b] = b == long_b ? tt_rng_int(&g_rng, FI_TEST_LONG_KV, 2 * FI_TEST_LONG_KV)
                                 : tt_rng_int(&g_rng, causal ? q_lens[b] : 0, kv_hi);
    }
}

static void ref_matches_naive_mla_decode(void **state) {
    (void)state;
    static const int32_t page_sizes[3] = {1, 16, 64};
    case_stats st = {0};
    char label[160];
    for (int32_t ci = 0; ci < 3; ++ci) {
        for (int32_t variant = 0; variant < 2; ++variant) {
            /* variant 0: INDPTR form, ragged MTP q_len 1..8, causal, sinks, scale pointers.
             * variant 1: BLOCK_TABLES form, uniform q_len, non-causal, window, plain scales. */
            const int32_t B = 4, ps = page_sizes[tt_rng_int(&g_rng, 0, 2)];
            const int32_t causal = variant == 0, window = variant == 0 ? -1 : tt_rng_int(&g_rng, 8, 60);
            int32_t q_lens[4], kv_lens[4];
            random_lengths(B, 1, variant == 0 ? 8 : 4, variant == 1, 160, causal, q_lens, kv_lens);
            fi_caps caps = tt_test_caps(FI_KIND_MLA_DECODE, 16, 1, 576, ps, 64, B, 32);
            caps.num_ctas = k_ctas[ci];
            test_batch tb = make_batch(variant == 0 ? FI_FORM_INDPTR : FI_FORM_BLOCK_TABLES, B,
                                       q_lens, kv_lens, ps, 64, 0,
                                       causal, window);
            caps.num_pages = tb.num_pages;
            fi_test_attn_opts opts = {.sinks = variant == 0, .scale_ptrs = variant == 0,
                                      .bmm1_scale = 0.05f, .bmm2_scale = 1.5f};
            snprintf(label, sizeof label, "mla ctas %d ps %d variant %d window %d", caps.num_ctas,
                     ps, variant, window);
            check_case(label, &caps, &tb.batch, &opts, 1e-5, &st);
            test_batch_free(&tb);
        }
    }
    assert_true(st.split_cases > 0);   /* the merge was exercised */
}

static void ref_matches_naive_gqa_decode(void **state) {
    (void)state;
    static const int32_t groups[4] = {1, 4, 8, 16};
    static const int32_t dims[3] = {64, 128, 256};
    case_stats st = {0};
    char label[200];
    for (int32_t ci = 0; ci < 3; ++ci) {
        for (int32_t gi = 0; gi < 4; ++gi) {
            const int32_t group = groups[gi], H_kv = group == 16 ? 1 : 2;
            const int32_t D = dims[tt_rng_int(&g_rng, 0, 2)];
            const int32_t ps = (gi & 1) ? 16 : 32, B = 5;
            const int32_t split = gi >= 2, hnd = gi & 1, sinks = gi != 1;
            const int32_t window = gi == 3 ? tt_rng_int(&g_rng, 4, 50) : -1;
            int32_t q_lens[5], kv_lens[5];
            random_lengths(B, 1, 8, 1, 300, 1, q_lens, kv_lens);
            fi_caps caps = tt_test_caps(FI_KIND_GQA_DECODE, group * H_kv, H_kv, D, ps, 48, B, 40);
            caps.num_ctas = k_ctas[ci];
            if (gi == 2) caps.q_dtype = caps.kv_dtype = FI_DTYPE_BF16;
            if (gi == 1) caps.kv_dtype = FI_DTYPE_F16;
            test_batch tb = make_batch(FI_FORM_BLOCK_TABLES, B, q_lens, kv_lens, ps, 48, split, 1,
                                       window);
            fi_test_attn_opts opts = {.hnd = hnd, .sinks = sinks, .scale_ptrs = gi == 0,
                                      .bmm2_scale = 0.75f};
            snprintf(label, sizeof label,
                     "gqa ctas %d group %d D %d ps %d q_len %d 3d %d hnd %d sinks %d window %d",
                     caps.num_ctas, group, D, ps, q_lens[0], split, hnd, sinks, window);
            check_case(label, &caps, &tb.batch, &opts, 1e-5, &st);
            test_batch_free(&tb);
        }
    }
    assert_true(st.split_cases > 0);
}

static void ref_matches_naive_context(void **state) {
    (void)state;
    case_stats st = {0};
    char label[200];
    for (int32_t ci = 0; ci < 3; ++ci) {
        for (int32_t variant = 0; variant < 3; ++variant) {
            /* 0: group 2, NHD, causal;  1: group 16, HND, 3-D table, window, sinks;
             * 2: group 1, non-causal, prefix of cached keys. */
            const int32_t group = variant == 0 ? 2 : variant == 1 ? 16 : 1;
            const int32_t H_kv = 2, B = 3, ps = variant == 1 ? 16 : 64;
            const int32_t causal = variant != 2;
            const int32_t window = variant == 1 ? tt_rng_int(&g_rng, 10, 80) : -1;
            int32_t q_lens[3], kv_lens[3];
            random_lengths(B, 1, 40, 0, 200, 1, q_lens, kv_lens);
            fi_caps caps = tt_test_caps(FI_KIND_CONTEXT, group * H_kv, H_kv, 64, ps, 40, B, 120);
            caps.num_ctas = k_ctas[ci];
            test_batch tb = make_batch(FI_FORM_CUM_SEQ_LENS, B, q_lens, kv_lens, ps, 40,
                                       variant == 1, causal, window);
            fi_test_attn_opts opts = {.hnd = variant == 1, .sinks = variant == 1,
                                      .bmm1_scale = 0.2f};
            snprintf(label, sizeof label, "context ctas %d group %d variant %d window %d",
                     caps.num_ctas, group, variant, window);
            check_case(label, &caps, &tb.batch, &opts, 1e-5, &st);
            test_batch_free(&tb);
        }
    }
    assert_true(st.split_cases > 0);
}

/* kv_len 0 requests (non-causal decode): zeros and lse -inf, or lse = sink with sinks;
 * mixed with long requests so the others still split. */
static void ref_matches_naive_with_empty_requests(void **state) {
    (void)state;
    case_stats st = {0};
    char label[120];
    for (int32_t ci = 0; ci < 3; ++ci) {
        for (int32_t sinks = 0; sinks < 2; ++sinks) {
            const int32_t B = 4;
            const int32_t q_lens[4] = {2, 2, 2, 2};
            int32_t kv_lens[4] = {0, tt_rng_int(&g_rng, 1000, 2000), 0, tt_rng_int(&g_rng, 1, 50)};
            fi_caps caps = tt_test_caps(FI_KIND_GQA_DECODE, 8, 2, 64, 16, 64, B, 8);
            caps.num_ctas = k_ctas[ci];
            test_batch tb = make_batch(FI_FORM_BLOCK_TABLES, B, q_lens, kv_lens, 16, 64, 0, 0, -1);
            fi_test_attn_opts opts = {.sinks = sinks};
            snprintf(label, sizeof label, "empty ctas %d sinks %d", caps.num_ctas, sinks);
            check_case(label, &caps, &tb.batch, &opts, 1e-5, &st);
            test_batch_free(&tb);
        }
    }
    assert_true(st.split_cases > 0);
}

/* 16-bit outputs: both references round the same fp32/fp64 value to bf16 / f16, so they
 * agree to the output's rounding (one ulp where the two land on either side of a tie). */
static void ref_matches_naive_16bit_outputs(void **state) {
    (void)state;
    case_stats st = {0};
    for (int32_t o = 0; o < 2; ++o) {
        const int32_t B = 3;
        int32_t q_lens[3], kv_lens[3];
        random_lengths(B, 1, 4, 1, 200, 1, q_lens, kv_lens);
        fi_caps caps = tt_test_caps(FI_KIND_GQA_DECODE, 8, 1, 128, 16, 40, B, 12);
        caps.num_ctas = 7;
        caps.o_dtype = o == 0 ? FI_DTYPE_BF16 : FI_DTYPE_F16;
        caps.q_dtype = caps.kv_dtype = caps.o_dtype;
        test_batch tb = make_batch(FI_FORM_BLOCK_TABLES, B, q_lens, kv_lens, 16, 40, 0, 1, -1);
        check_case(o == 0 ? "bf16 out" : "f16 out", &caps, &tb.batch, NULL, o == 0 ? 4e-3 : 5e-4, &st);
        test_batch_free(&tb);
    }
}

/* Batches of the shared generator (every form and kind, page-boundary kv lengths, kv_len
 * 0, q_len 0 context requests, 3-D tables, shuffled pages, random CTA counts 1..160),
 * heads trimmed so that the fp64 naive stays fast; batches over a work budget are
 * skipped, at least 40 are checked. */
static void ref_matches_naive_on_generated_batches(void **state) {
    (void)state;
    case_stats st = {0};
    char label[300];
    for (int32_t attempt = 0; attempt < 600 && st.cases < 40; ++attempt) {
        batchgen_opts o = {.max_batch = 6, .max_kv_len = 1500,
                           .shape = (batchgen_shape)tt_rng_int(&g_rng, BATCHGEN_RANDOM,
                                                               BATCHGEN_KV_EDGES)};
        batchgen_batch gb;
        assert_int_equal(batchgen_make(&g_rng, &o, &gb), 0);
        fi_caps caps = gb.caps;
        if (caps.kind == FI_KIND_MLA_DECODE) {
            caps.num_qo_heads = 16;
        } else {
            const int32_t group = caps.num_qo_heads / caps.num_kv_heads;
            caps.num_kv_heads = caps.num_kv_heads > 2 ? 2 : caps.num_kv_heads;
            caps.num_qo_heads = caps.num_kv_heads * group;
        }
        double work = 0.0;   /* multiply-adds of the naive, upper bound */
        for (int32_t b = 0; b < gb.batch.batch_size; ++b)
            work += (double)gb.q_len[b] * gb.kv_len[b] * caps.num_qo_heads *
                    (caps.head_dim_qk + caps.head_dim_vo);
        if (work > 1e8) {
            batchgen_free(&gb);
            continue;
        }
        fi_test_attn_opts opts = {.hnd = tt_rng_int(&g_rng, 0, 1), .sinks = tt_rng_int(&g_rng, 0, 1),
                                  .scale_ptrs = tt_rng_int(&g_rng, 0, 1)};
        snprintf(label, sizeof label, "generated: %s", batchgen_describe(&gb));
        check_case(label, &caps, &gb.batch, &opts, 1e-5, &st);
        batchgen_free(&gb);
    }
    assert_true(st.cases >= 40);
    printf("generated batches: %d checked, %d with splits\n", st.cases, st.split_cases);
}

/* ---- errors leave the outputs untouched ------------------------------------------------------ */

static int all_nan(const fi_tensor *t, int64_t rows) {
    return tt_tensor_count_nan(t, rows) == tt_tensor_numel(t) / t->shape[0] * rows;
}

static void references_reject_bad_arguments_and_write_nothing(void **state) {
    (void)state;
    const int32_t B = 2, q_lens[2] = {1, 1}, kv_lens[2] = {30, 70};
    fi_caps caps = tt_test_caps(FI_KIND_GQA_DECODE, 4, 1, 64, 16, 16, B, 2);
    caps.num_ctas = 3;
    test_batch tb = make_batch(FI_FORM_BLOCK_TABLES, B, q_lens, kv_lens, 16, 16, 0, 1, -1);
    tt_test_attn ta;
    assert_int_equal(tt_test_attn_make(&ta, &caps, &tb.batch, NULL, &g_rng), 0);
    fi_plan *plan = NULL;
    assert_int_equal(fi_plan_create(&caps, NULL, 0, NULL, &plan), FI_OK);
    tt_tensor_poison(&ta.args.out);
    tt_tensor_poison(&ta.args.lse);

    assert_int_equal(fi_ref_run(plan, &ta.args), FI_ERR_NOT_PLANNED);
    assert_int_equal(fi_plan_update(plan, &tb.batch, NULL), FI_OK);

    fi_attn_args bad = ta.args;
    bad.v.data = NULL;
    assert_int_equal(fi_naive_attention(&caps, &tb.batch, &bad), FI_ERR_NULL_ARGUMENT);
    assert_int_equal(fi_ref_run(plan, &bad), FI_ERR_NULL_ARGUMENT);
    bad = ta.args;
    bad.k.shape[3] = 128;   /* head dim disagrees with caps */
    assert_int_equal(fi_naive_attention(&caps, &tb.batch, &bad), FI_ERR_SHAPE_MISMATCH);
    assert_int_equal(fi_ref_run(plan, &bad), FI_ERR_SHAPE_MISMATCH);
    bad = ta.args;
    bad.out.shape[0] = 1;   /* fewer rows than the batch's 2 query tokens */
    assert_int_equal(fi_naive_attention(&caps, &tb.batch, &bad), FI_ERR_SHAPE_MISMATCH);
    assert_int_equal(fi_ref_run(plan, &bad), FI_ERR_SHAPE_MISMATCH);
    bad = ta.args;
    bad.page_table.dtype = FI_DTYPE_F32;
    assert_int_equal(fi_naive_attention(&caps, &tb.batch, &bad), FI_ERR_UNSUPPORTED_DTYPE);
    assert_int_equal(fi_ref_run(plan, &bad), FI_ERR_UNSUPPORTED_DTYPE);
    bad = ta.args;
    bad.q.dtype = FI_DTYPE_E2M1;   /* NVFP4 is not read by the CPU references */
    assert_int_equal(fi_naive_attention(&caps, &tb.batch, &bad), FI_ERR_UNSUPPORTED_DTYPE);
    assert_int_equal(fi_ref_run(plan, &bad), FI_ERR_UNSUPPORTED_DTYPE);
    bad = ta.args;
    bad.out.dtype = FI_DTYPE_E5M2;   /* fp8 inputs are read, fp8 out is not written */
    assert_int_equal(fi_naive_attention(&caps, &tb.batch, &bad), FI_ERR_UNSUPPORTED_DTYPE);
    assert_int_equal(fi_ref_run(plan, &bad), FI_ERR_UNSUPPORTED_DTYPE);
    fi_batch bb = tb.batch;
    bb.window_left = -2;
    assert_int_equal(fi_naive_attention(&caps, &bb, &ta.args), FI_ERR_INVALID_WINDOW);
    bb = tb.batch;
    tb.kv_lens[1] = 1000;   /* more keys than the row's pages */
    assert_int_equal(fi_naive_attention(&caps, &bb, &ta.args), FI_ERR_SEQ_LEN_EXCEEDS_PAGES);
    tb.kv_lens[1] = kv_lens[1];

    assert_true(all_nan(&ta.args.out, 2));
    assert_true(all_nan(&ta.args.lse, 2));
    /* and the good arguments work on the same buffers */
    assert_int_equal(fi_ref_run(plan, &ta.args), FI_OK);
    assert_int_equal(tt_tensor_count_nonfinite(&ta.args.out, 2), 0);
    fi_plan_destroy(plan);
    tt_test_attn_free(&ta);
    test_batch_free(&tb);
}

/* Counting allocator: fi_ref_run takes its scratch from the plan's hooks and gives all
 * of it back before returning. */
typedef struct count_alloc {
    int64_t allocs, frees;
} count_alloc;

static void *count_alloc_fn(void *ctx, size_t bytes, size_t alignment) {
    void *p = NULL;
    if (posix_memalign(&p, alignment < sizeof(void *) ? sizeof(void *) : alignment, bytes))
        return NULL;
    ((count_alloc *)ctx)->allocs++;
    return p;
}

static void count_free_fn(void *ctx, void *p) {
    ((count_alloc *)ctx)->frees++;
    free(p);
}

static void ref_run_scratch_comes_from_the_plan_allocator(void **state) {
    (void)state;
    const int32_t B = 2, q_lens[2] = {1, 1}, kv_lens[2] = {1500, 900};
    fi_caps caps = tt_test_caps(FI_KIND_GQA_DECODE, 8, 2, 64, 16, 200, B, 2);
    caps.num_ctas = 16;
    test_batch tb = make_batch(FI_FORM_BLOCK_TABLES, B, q_lens, kv_lens, 16, 200, 0, 1, -1);
    tt_test_attn ta;
    assert_int_equal(tt_test_attn_make(&ta, &caps, &tb.batch, NULL, &g_rng), 0);
    count_alloc ctr = {0, 0};
    const fi_allocator al = {count_alloc_fn, count_free_fn, &ctr};
    fi_plan *plan = NULL;
    assert_int_equal(fi_plan_create(&caps, NULL, 0, &al, &plan), FI_OK);
    assert_int_equal(fi_plan_update(plan, &tb.batch, NULL), FI_OK);
    fi_plan_view view;
    assert_int_equal(fi_plan_get_view(plan, &view), FI_OK);
    assert_true(view.header->num_slots > 0);   /* partials needed */
    const count_alloc before = ctr;
    assert_int_equal(fi_ref_run(plan, &ta.args), FI_OK);
    assert_true(ctr.allocs > before.allocs);
    assert_int_equal(ctr.allocs - before.allocs, ctr.frees - before.frees);
    fi_plan_destroy(plan);
    assert_int_equal(ctr.allocs, ctr.frees);
    tt_test_attn_free(&ta);
    test_batch_free(&tb);
}

/* ---- the conversions the references read and write with --------------------------------------- */

static void bf16_and_f16_round_to_nearest_even(void **state) {
    (void)state;
    /* bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even mantissa (1) wins; 1 + 3*2^-8
     * ties between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up. */
    assert_int_equal(fi_f32_to_bf16_rne(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(fi_f32_to_bf16_rne(1.0f + 3 * 0x1p-8f), 0x3f82);
    assert_int_equal(fi_f32_to_bf16_rne(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    assert_true(isnan(fi_bf16_to_f32(fi_f32_to_bf16_rne(NAN))));
    /* f16: same ties at 2^-11; 65520 rounds to inf; 2^-24 is the smallest subnormal and
     * 2^-25 ties to 0 (even), 3 * 2^-25 to 2 * 2^-24. */
    assert_int_equal(fi_f32_to_f16_rne(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(fi_f32_to_f16_rne(1.0f + 3 * 0x1p-11f), 0x3c02);
    assert_int_equal(fi_f32_to_f16_rne(65520.0f), 0x7c00);
    assert_int_equal(fi_f32_to_f16_rne(65504.0f), 0x7bff);
    assert_int_equal(fi_f32_to_f16_rne(0x1p-24f), 0x0001);
    assert_int_equal(fi_f32_to_f16_rne(0x1p-25f), 0x0000);
    assert_int_equal(fi_f32_to_f16_rne(3 * 0x1p-25f), 0x0002);
    assert_int_equal(fi_f32_to_f16_rne(-2.0f), 0xc000);
    /* random round trips: 16-bit -> f32 -> 16-bit is the identity on finite values */
    for (int i = 0; i < 10000; ++i) {
        const uint16_t h = (uint16_t)tt_rng_next(&g_rng);
        if ((h & 0x7c00) != 0x7c00) assert_int_equal(fi_f32_to_f16_rne(fi_f16_to_f32(h)), h);
        if ((h & 0x7f80) != 0x7f80) assert_int_equal(fi_f32_to_bf16_rne(fi_bf16_to_f32(h)), h);
    }
}

int main(void) {
    const uint64_t seed = tt_test_seed();
    printf("test_ref_vs_naive: seed %llu (FI_TEST_SEED=%llu replays)\n",
           (unsigned long long)seed, (unsigned long long)seed);
    g_rng.s = seed;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(naive_matches_hand_computed_softmax),
        cmocka_unit_test(bf16_and_f16_round_to_nearest_even),
        cmocka_unit_test(ref_matches_naive_mla_decode),
        cmocka_unit_test(ref_matches_naive_gqa_decode),
        cmocka_unit_test(ref_matches_naive_context),
        cmocka_unit_test(ref_matches_naive_with_empty_requests),
        cmocka_unit_test(ref_matches_naive_16bit_outputs),
        cmocka_unit_test(ref_matches_naive_on_generated_batches),
        cmocka_unit_test(references_reject_bad_arguments_and_write_nothing),
        cmocka_unit_test(ref_run_scratch_comes_from_the_plan_allocator),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
