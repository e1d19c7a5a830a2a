/*
 * tests/test_ref_nonfinite.c - the NaN / Inf policy of fiattn_run.h in both CPU
 * references (fi_ref_run on the plan, split pieces included, and the fp64
 * fi_naive_attention): one non-finite value is put into fresh random inputs and every
 * output row is checked against a clean run of the same executor:
 *   NaN in q of a row / in K of a key                 -> the rows that see it: out, lse NaN
 *   NaN / +inf in V at dim d of a key (not MLA)        -> out[d] of the rows that see it
 *   a sink NaN                                         -> every row of that head NaN
 *   every logit of a row +inf                          -> out, lse NaN
 *   every logit of a row -inf                          -> an empty row (0, lse -inf / sink)
 * and every other row bit-identical to the clean run.  Outputs are pre-filled with a
 * finite sentinel, so a NaN that is found was written.  Random each run (seed printed;
 * FI_TEST_SEED replays).
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
#include "common/tensors.h"
#include "fiattn_ref.h"
#include "plan/mask.h"

static uint64_t g_seed;
static int g_split_cases;   /* cases whose plan had a merge group */

enum inject { IN_Q_NAN, IN_K_NAN, IN_V_NAN, IN_V_INF, IN_SINK_NAN, IN_ROW_PINF, IN_ROW_NINF,
              IN_COUNT };
static const char *const k_inject_name[IN_COUNT] = {
    "q NaN", "K NaN", "V NaN", "V +inf", "sink NaN", "row logits +inf", "row logits -inf"};

/* What a row (token, head) must hold after the injection. */
enum expect { EX_SAME, EX_ROW_NAN, EX_DIM_NAN, EX_DIM_PINF, EX_EMPTY };

typedef struct nf_case {
    batchgen_batch g;
    fi_plan *plan;
    tt_test_attn ta;
    int mla, sinks;
    int32_t group;
} nf_case;

static void fill(fi_tensor *t, float v) {
    const int64_t n = tt_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) ((float *)t->data)[i] = v;   /* F32, dense row-major */
}

static void case_make(nf_case *c, tt_rng *rng, fi_kind kind, int sinks) {
    fi_caps caps;
    batchgen_caps(rng, kind, &caps);
    caps.num_ctas = tt_rng_int(rng, 0, 1) ? 16 : tt_rng_int(rng, 1, 15); /* split pieces */
    const fi_batch_form form = (fi_batch_form)tt_rng_int(rng, 1, kind == FI_KIND_CONTEXT ? 3 : 2);
    const int32_t n = tt_rng_int(rng, 1, 3), uq = tt_rng_int(rng, 1, 4);
    int32_t q[3], kv[3];
    for (int32_t b = 0; b < n; b++) {
        q[b] = form == FI_FORM_BLOCK_TABLES ? uq : tt_rng_int(rng, 1, kind == FI_KIND_CONTEXT ? 6 : 8);
        kv[b] = q[b] + tt_rng_int(rng, 0, tt_rng_int(rng, 0, 1) ? 300 : 800);
    }
    const int32_t window = tt_rng_int(rng, 0, 3) == 0 ? tt_rng_int(rng, 0, 100) : -1;
    assert_int_equal(batchgen_from_lens(rng, &caps, form, q, kv, n,
                                        form != FI_FORM_INDPTR && tt_rng_int(rng, 0, 1), 1,
                                        tt_rng_int(rng, 0, 3) != 0, window, &c->g), 0);
    c->plan = NULL;
    assert_int_equal(fi_plan_create(&c->g.caps, NULL, 0, NULL, &c->plan), FI_OK);
    assert_int_equal(fi_plan_update(c->plan, &c->g.batch, NULL), FI_OK);
    fi_plan_view v;
    assert_int_equal(fi_plan_get_view(c->plan, &v), FI_OK);
    g_split_cases += v.header->num_groups > 0;
    fi_test_attn_opts o = {.sinks = sinks, .hnd = tt_rng_int(rng, 0, 1)};
    assert_int_equal(tt_test_attn_make(&c->ta, &c->g.caps, &c->g.batch, &o, rng), 0);
    c->mla = kind == FI_KIND_MLA_DECODE;
    c->sinks = sinks;
    c->group = c->g.caps.num_qo_heads / c->g.caps.num_kv_heads;
}

static void case_free(nf_case *c) {
    fi_plan_destroy(c->plan);
    tt_test_attn_free(&c->ta);
    batchgen_free(&c->g);
}

/* Page of key t of request b (the V row of a 3-D table with v = 1). */
static int32_t page_of(const nf_case *c, int32_t b, int32_t t, int v) {
    const int32_t row = c->g.page_row[b] + (v ? c->g.batch.max_pages_per_seq : 0);
    return c->g.page_table[row + t / c->g.caps.page_size];
}

static void set4(fi_tensor *t, int64_t a, int64_t b, int64_t x, int64_t d, double v) {
    const int64_t idx[4] = {a, b, x, d};
    tt_tensor_set(t, idx, v);
}

static void set3(fi_tensor *t, int64_t a, int64_t b, int64_t d, double v) {
    const int64_t idx[3] = {a, b, d};
    tt_tensor_set(t, idx, v);
}

/* Does row i of request b see key t (fiattn.h's causal / window rule)? */
static int sees(const nf_case *c, int32_t b, int32_t i, int32_t t) {
    int32_t lo, hi;
    fi_row_kv_range(c->g.batch.causal, c->g.batch.window_left, c->g.q_len[b], c->g.kv_len[b],
                    i, &lo, &hi);
    return t >= lo && t < hi;
}

static int has_keys(const nf_case *c, int32_t b, int32_t i) {
    int32_t lo, hi;
    fi_row_kv_range(c->g.batch.causal, c->g.batch.window_left, c->g.q_len[b], c->g.kv_len[b],
                    i, &lo, &hi);
    return lo < hi;
}

typedef fi_status (*run_fn)(const nf_case *c, fi_attn_args *a);
static fi_status run_ref(const nf_case *c, fi_attn_args *a) { return fi_ref_run(c->plan, a); }
static fi_status run_naive(const nf_case *c, fi_attn_args *a) {
    return fi_naive_attention(&c->g.caps, &c->g.batch, a);
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* Run `run` into sentinel-filled outputs; compare with `clean` row by row per `ex`. */
static void check_run(const nf_case *c, run_fn run, const char *who, const char *what,
                      const fi_tensor *clean_o, const fi_tensor *clean_l, const int8_t *ex,
                      int32_t dim) {
    fi_attn_args a = c->ta.args;
    fill(&a.out, 7.25f);
    fill(&a.lse, 7.25f);
    assert_int_equal(run(c, &a), FI_OK);
    const int32_t H = c->g.caps.num_qo_heads, D = c->g.caps.head_dim_vo;
    for (int32_t tok = 0; tok < c->g.total_q_tokens; tok++)
        for (int32_t h = 0; h < H; h++) {
            const int8_t e = ex[(size_t)tok * H + h];
            const int64_t li[2] = {tok, h};
            const float lse = (float)tt_tensor_get(&a.lse, li);
            const float lse0 = (float)tt_tensor_get(clean_l, li);
            int ok = 1;
            for (int32_t d = 0; d < D && ok; d++) {
                const int64_t oi[3] = {tok, h, d};
                const float o = (float)tt_tensor_get(&a.out, oi);
                const float o0 = (float)tt_tensor_get(clean_o, oi);
                switch (e) {
                case EX_SAME: ok = same_bits(o, o0); break;
                case EX_ROW_NAN: ok = isnan(o); break;
                case EX_DIM_NAN: ok = d == dim ? isnan(o) : same_bits(o, o0); break;
                case EX_DIM_PINF: ok = d == dim ? (isinf(o) && o > 0) : same_bits(o, o0); break;
                default: ok = o == 0.0f; break;   /* EX_EMPTY */
                }
            }
            if (ok) {
                if (e == EX_ROW_NAN) ok = isnan(lse);
                else if (e == EX_EMPTY)
                    ok = c->sinks ? same_bits(lse, c->ta.sinks[h]) : (isinf(lse) && lse < 0);
                else ok = same_bits(lse, lse0);
            }
            if (!ok)
                fail_msg("seed %llu: %s, %s: token %d head %d (expect %d) out / lse wrong, "
                         "lse %g clean %g (%s)", (unsigned long long)g_seed, who, what, tok, h,
                         e, (double)lse, (double)lse0, batchgen_describe(&c->g));
        }
}

static void one_injection(tt_rng *rng, fi_kind kind, int what) {
    nf_case c;
    const int sinks = what == IN_SINK_NAN || tt_rng_int(rng, 0, 2) == 0;
    case_make(&c, rng, kind, sinks);
    if (c.mla && (what == IN_V_NAN || what == IN_V_INF))
        what = IN_K_NAN;   /* MLA's V is its K (ckv) */
    const int32_t H = c.g.caps.num_qo_heads, B = c.g.batch.batch_size;
    const int32_t dqk = c.mla ? 576 : c.g.caps.head_dim_qk, dvo = c.g.caps.head_dim_vo;
    int8_t *ex = calloc((size_t)c.g.total_q_tokens * H, 1);
    assert_non_null(ex);
    /* the request, KV head, key, query row and head it is about */
    const int32_t b = tt_rng_int(rng, 0, B - 1);
    const int32_t kvh = tt_rng_int(rng, 0, c.g.caps.num_kv_heads - 1);
    const int32_t t = tt_rng_int(rng, 0, c.g.kv_len[b] - 1);   /* kv_len >= q_len >= 1 */
    const int32_t i = tt_rng_int(rng, 0, c.g.q_len[b] - 1);
    const int32_t h = kvh * c.group + tt_rng_int(rng, 0, c.group - 1);
    const int32_t tok = c.g.q_offset[b] + i;
    int32_t dim = tt_rng_int(rng, 0, dvo - 1);
    /* rows-of-a-logit injections: K dim 0 of every key of (b, kvh) set to +-0.5 first,
     * part of the clean inputs, then q[tok][h][0] = +inf makes every logit of that row
     * +-inf */
    if (what == IN_ROW_PINF || what == IN_ROW_NINF)
        for (int32_t k = 0; k < c.g.kv_len[b]; k++)
            set4(&c.ta.k_buf, page_of(&c, b, k, 0), k % c.g.caps.page_size, c.mla ? 0 : kvh, 0,
                 what == IN_ROW_PINF ? 0.5 : -0.5);
    fi_tensor clean_o[2], clean_l[2];
    for (int r = 0; r < 2; r++) {   /* 0: fi_ref_run, 1: fi_naive_attention */
        assert_int_equal(tt_test_attn_alloc_outputs(&c.ta, &clean_o[r], &clean_l[r]), 0);
        fi_attn_args a = c.ta.args;
        a.out = clean_o[r];
        a.lse = clean_l[r];
        assert_int_equal(r == 0 ? run_ref(&c, &a) : run_naive(&c, &a), FI_OK);
    }
    /* the injection and the rows it reaches */
    for (int32_t bb = 0; bb < B; bb++)
        for (int32_t ii = 0; ii < c.g.q_len[bb]; ii++)
            for (int32_t hh = 0; hh < H; hh++) {
                int8_t *e = &ex[(size_t)(c.g.q_offset[bb] + ii) * H + hh];
                const int same_key = bb == b && hh / c.group == kvh && sees(&c, bb, ii, t);
                switch (what) {
                case IN_Q_NAN: case IN_ROW_PINF: case IN_ROW_NINF:
                    if (bb == b && ii == i && hh == h && has_keys(&c, bb, ii))
                        *e = what == IN_ROW_NINF ? EX_EMPTY : EX_ROW_NAN;
                    break;
                case IN_K_NAN: if (same_key) *e = EX_ROW_NAN; break;
                case IN_V_NAN: if (same_key) *e = EX_DIM_NAN; break;
                case IN_V_INF: if (same_key) *e = EX_DIM_PINF; break;
                default: if (hh == h) *e = EX_ROW_NAN; break;   /* IN_SINK_NAN */
                }
            }
    const int32_t slot = t % c.g.caps.page_size;
    switch (what) {
    case IN_Q_NAN: set3(&c.ta.q_buf, tok, h, tt_rng_int(rng, 0, dqk - 1), NAN); break;
    case IN_ROW_PINF: case IN_ROW_NINF: set3(&c.ta.q_buf, tok, h, 0, INFINITY); break;
    case IN_K_NAN:
        set4(&c.ta.k_buf, page_of(&c, b, t, 0), slot, c.mla ? 0 : kvh,
             tt_rng_int(rng, 0, dqk - 1), NAN);
        break;
    case IN_V_NAN: case IN_V_INF:
        set4(&c.ta.v_buf, page_of(&c, b, t, c.g.batch.kv_split_pages), slot, kvh, dim,
             what == IN_V_NAN ? NAN : INFINITY);
        break;
    default: c.ta.sinks[h] = NAN; break;
    }
    char label[96];
    snprintf(label, sizeof label, "%s (request %d key %d token %d head %d dim %d)",
             k_inject_name[what], b, t, tok, h, dim);
    check_run(&c, run_ref, "fi_ref_run", label, &clean_o[0], &clean_l[0], ex, dim);
    check_run(&c, run_naive, "fi_naive_attention", label, &clean_o[1], &clean_l[1], ex, dim);
    for (int r = 0; r < 2; r++) {
        tt_tensor_free(&clean_o[r]);
        tt_tensor_free(&clean_l[r]);
    }
    free(ex);
    case_free(&c);
}

static void each_kind(int what) {
    tt_rng rng = {g_seed + (uint64_t)what * 7919};
    g_split_cases = 0;
    /* 15 cases, and more until one plan had split pieces (their merge is exercised) */
    int it = 0;
    for (; it < 15 || (g_split_cases == 0 && it < 60); it++)
        one_injection(&rng, (fi_kind)(1 + it % 3), what);
    assert_true(g_split_cases > 0);
}

static void nan_in_q_reaches_exactly_its_row(void **state) { (void)state; each_kind(IN_Q_NAN); }
static void nan_in_k_reaches_the_rows_that_see_the_key(void **state) {
    (void)state;
    each_kind(IN_K_NAN);
}
static void nan_in_v_reaches_one_dim_of_the_rows_that_see_the_key(void **state) {
    (void)state;
    each_kind(IN_V_NAN);
}
static void inf_in_v_reaches_one_dim(void **state) { (void)state; each_kind(IN_V_INF); }
static void nan_sink_reaches_its_head(void **state) { (void)state; each_kind(IN_SINK_NAN); }
static void plus_inf_logits_give_nan(void **state) { (void)state; each_kind(IN_ROW_PINF); }
static void minus_inf_logits_give_an_empty_row(void **state) {
    (void)state;
    each_kind(IN_ROW_NINF);
}

int main(void) {
    g_seed = tt_test_seed();
    printf("FI_TEST_SEED=%llu\n", (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nan_in_q_reaches_exactly_its_row),
        cmocka_unit_test(nan_in_k_reaches_the_rows_that_see_the_key),
        cmocka_unit_test(nan_in_v_reaches_one_dim_of_the_rows_that_see_the_key),
        cmocka_unit_test(inf_in_v_reaches_one_dim),
        cmocka_unit_test(nan_sink_reaches_its_head),
        cmocka_unit_test(plus_inf_logits_give_nan),
        cmocka_unit_test(minus_inf_logits_give_an_empty_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
