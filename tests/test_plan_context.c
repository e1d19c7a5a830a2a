/*
 * tests/test_plan_context.c - the context row's list schedule (planner/listsched.h) and how
 * the planner chooses it over the contiguous walk (planner/partition.c, plan/variant.h
 * FI_PARTITION_LIST, list_slack_64ths).
 *
 * Each case plans one batch three times through the test hook fi_partition_test_list: the
 * walk alone (-1), the list schedule alone (1) and the planner's choice (0); every plan must
 * pass tt_plan_check (every (request, head, row, visible key) once, groups, bounds), and:
 *   - the list schedule cuts nothing (no groups) and meets Graham's bound for list
 *     scheduling, max CTA cost <= total / n + (1 - 1 / n) * the largest tile;
 *   - the choice is the list schedule iff its modelled time (planner/model.h) and its largest
 *     CTA cost are both within the row's slack of the walk's plan's, so the plan returned
 *     is never above (64 + slack) / 64 of the walk's in either;
 *   - the figures (balance, KV heads in flight in the modelled timeline, fiplan's figure) are
 *     printed for the report: the 8k causal prefill of 32 heads, trace prefill batches, one
 *     4k chunk beside 127 decodes, and one short-query long-prefix request (the walk's case).
 * Seed printed; replay with FI_TEST_SEED.
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
#include "plan/variant.h"
#include "planner/model.h"
#include "planner/partition.h"
#include "viz/trace.h"

static uint64_t g_seed;

/* Figures of one plan of a batch. */
typedef struct plan_figs {
    int64_t max, total, model, big; /* max / total CTA cost, executor model, largest item */
    int32_t items, groups, ctas;
    int32_t inflight_max;           /* fi_model_heads_in_flight */
    double inflight_mean;
    int32_t rank0_heads;            /* distinct KV heads among the CTAs' first items */
} plan_figs;

static void figs_of(fi_plan *p, plan_figs *f) {
    fi_plan_view v;
    assert_int_equal(fi_plan_get_view(p, &v), FI_OK);
    const fi_caps *c = fi_plan_caps(p);
    const fi_variant *row = fi_variant_of(c);
    const int32_t ni = v.header->num_items, n = v.num_ctas, group = c->num_qo_heads / c->num_kv_heads;
    int64_t *finish = malloc(sizeof(int64_t) * ((size_t)ni + 1));
    int64_t *keys = malloc(sizeof(int64_t) * ((size_t)n + 1));
    int32_t *last = malloc(sizeof(int32_t) * ((size_t)v.header->num_groups + 1));
    assert_true(finish && keys && last);
    memset(f, 0, sizeof *f);
    f->items = ni;
    f->groups = v.header->num_groups;
    f->ctas = n;
    f->max = v.header->max_cta_cost;
    f->total = v.header->total_cost;
    for (int32_t i = 0; i < ni; i++) {
        const fi_work_item *it = &v.items[i];
        const int64_t cost = fi_variant_item_cost(
            row, it->kv_end - it->kv_begin,
            (int64_t)(it->q_end - it->q_begin) * (it->head_end - it->head_begin));
        f->big = cost > f->big ? cost : f->big;
    }
    f->model = fi_model_max(row, v.work_indptr, n, v.items, v.header->num_groups, finish, last);
    fi_model_heads_in_flight(row, v.work_indptr, n, v.items, group, finish, keys,
                             &f->inflight_max, &f->inflight_mean);
    /* first items: distinct (request, KV head) */
    int32_t k = 0;
    for (int32_t cta = 0; cta < n; cta++)
        if (v.work_indptr[cta + 1] > v.work_indptr[cta]) {
            const fi_work_item *it = &v.items[v.work_indptr[cta]];
            const int64_t key = (int64_t)it->request * 65536 + it->head_begin / group;
            int seen = 0;
            for (int32_t j = 0; j < k && !seen; j++)
                seen = keys[j] == key;
            if (!seen)
                keys[k++] = key;
        }
    f->rank0_heads = k;
    free(finish);
    free(keys);
    free(last);
}

/* Plan g with the hook at `mode` into *f and check the plan's invariants. */
static void plan_with(const batchgen_batch *g, int mode, plan_figs *f, const char *what) {
    char msg[512];
    fi_plan *p = NULL;
    assert_int_equal(fi_plan_create(&g->caps, NULL, 0, NULL, &p), FI_OK);
    fi_partition_test_list = mode;
    const fi_status st = fi_plan_update(p, &g->batch, NULL);
    fi_partition_test_list = 0;
    if (st != FI_OK)
        fail_msg("%s: update %s (%s)", what, fi_status_name(st), batchgen_describe(g));
    const tt_plan_expect want = batchgen_expect(g);
    if (tt_plan_check(p, &g->batch, &want, msg, sizeof msg) != 0)
        fail_msg("seed %llu %s mode %d: %s (%s)", (unsigned long long)g_seed, what, mode, msg,
                 batchgen_describe(g));
    figs_of(p, f);
    fi_plan_destroy(p);
}

/* The three plans of g, the checks of the file comment; prints one line.  Returns 1 if
 * the planner chose the list schedule. */
static int check_batch(const batchgen_batch *g, const char *what, plan_figs *list_out) {
    const fi_variant *row = fi_variant_of(&g->caps);
    assert_non_null(row);
    assert_int_equal(row->partition, FI_PARTITION_LIST);
    plan_figs walk, list, chosen;
    plan_with(g, -1, &walk, what);
    plan_with(g, 1, &list, what);
    plan_with(g, 0, &chosen, what);
    const int32_t n = list.ctas;
    /* the list schedule: no cuts, Graham's bound */
    assert_int_equal(list.groups, 0);
    assert_int_equal(list.model, list.max);
    if ((int64_t)n * list.max > list.total + (int64_t)(n - 1) * list.big)
        fail_msg("%s: list schedule max %lld over Graham's bound (total %lld, n %d, largest "
                 "tile %lld)", what, (long long)list.max, (long long)list.total, n,
                 (long long)list.big);
    /* the choice */
    const int64_t room = 64 + (int64_t)row->list_slack_64ths;
    const int take = 64 * list.model <= room * walk.model && 64 * list.max <= room * walk.max;
    const plan_figs *want = take ? &list : &walk;
    assert_int_equal(chosen.items, want->items);
    assert_int_equal(chosen.groups, want->groups);
    assert_int_equal(chosen.model, want->model);
    assert_true(64 * chosen.model <= room * walk.model);
    assert_true(64 * chosen.max <= room * walk.max);
    const double mean = list.total > 0 ? (double)list.total / n : 1.0;
    const double wmean = walk.total > 0 ? (double)walk.total / n : 1.0;
    printf("%-44s walk: balance %.3f model %lld items %d groups %d heads in flight %d (mean "
           "%.1f) | list: balance %.3f model %lld (%.3f of walk) heads in flight %d (mean %.1f), "
           "first items on %d heads | chose %s\n",
           what, (double)walk.max / wmean, (long long)walk.model, walk.items, walk.groups,
           walk.inflight_max, walk.inflight_mean, (double)list.max / mean, (long long)list.model,
           (double)list.model / (double)walk.model, list.inflight_max, list.inflight_mean,
           list.rank0_heads, take ? "list" : "walk");
    if (list_out)
        *list_out = list;
    return take;
}

static void context_caps(tt_rng *rng, int32_t hq, int32_t hkv, int32_t dim, fi_caps *c) {
    batchgen_caps(rng, FI_KIND_CONTEXT, c);
    c->num_qo_heads = hq;
    c->num_kv_heads = hkv;
    c->head_dim_qk = c->head_dim_vo = dim;
    c->page_size = 64;
    c->num_ctas = 132;
    c->q_dtype = c->kv_dtype = c->o_dtype = FI_DTYPE_BF16;
}

/* check_batch of a causal CUM_SEQ_LENS batch of these lengths, heads 32 / hkv, d 128. */
static int check_lens(tt_rng *rng, int32_t hkv, const int32_t *q, const int32_t *kv, int32_t B,
                      const char *what, plan_figs *list) {
    fi_caps c;
    context_caps(rng, 32, hkv, 128, &c);
    batchgen_batch g;
    assert_int_equal(batchgen_from_lens(rng, &c, FI_FORM_CUM_SEQ_LENS, q, kv, B, 0, 1, 1, -1, &g),
                     0);
    const int take = check_batch(&g, what, list);
    batchgen_free(&g);
    return take;
}

/* 8k causal prefill, 32 / 32 heads, head_dim 128, 132 CTAs: 32 heads x 64 query tiles.
 * The list schedule is chosen, balances within 3%, and its CTAs work on few heads at once:
 * the queue is head-major and a CTA's tile lasts at most the largest tile's cost M = 8512
 * units, while the 132 CTAs get through a head's 286720 units in ~2172, so the tiles running
 * at any moment were queued within ~n M / 286720 = 3.9 heads of each other, plus the heads
 * being finished; the figure is exact (the plan is deterministic): 7 at most, ~4 on average,
 * asserted <= 8 and <= 5.  The walk's plan runs ~all 32 at once (each CTA one head's run).
 * The CTAs' first items are queue positions 0 .. 131: heads 0, 1 and 2 (64 tiles a head). */
static void list_schedule_8k_causal_prefill(void **state) {
    (void)state;
    tt_rng rng = {g_seed};
    const int32_t q[1] = {8192}, kv[1] = {8192};
    plan_figs list;
    assert_true(check_lens(&rng, 32, q, kv, 1, "8k causal h32/32 d128", &list));
    assert_int_equal(list.items, 2048);
    assert_true((double)list.max * list.ctas <= 1.03 * (double)list.total);
    assert_true(list.inflight_max <= 8);
    assert_true(list.inflight_mean <= 5.0);
    assert_int_equal(list.rank0_heads, 3);
}

/* Trace prefill batches (viz/trace.h fitrace_prefill) of 8 .. 64 requests at random trace
 * offsets, cached prefixes 0 and 512, heads 32 / 8 and 32 / 32. */
static void list_schedule_trace_prefill(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 1};
    fitrace *tr = NULL;
    assert_int_equal(fitrace_load_default(NULL, &tr), FITRACE_OK);
    enum { BMAX = 64 };
    int32_t q[BMAX] = {0}, kv[BMAX] = {0}, src[BMAX] = {0}; /* outputs of fitrace_prefill */
    const int32_t sizes[4] = {8, 16, 32, 64};
    for (int it = 0; it < 8; it++) {
        const int32_t B = sizes[it % 4], prefix = it & 4 ? 512 : 0;
        const int32_t first = tt_rng_int(&rng, 0, tr->num_requests - 1);
        fitrace_lens lens = {B, q, kv, src};
        assert_int_equal(fitrace_prefill(tr, first, prefix, &lens), FITRACE_OK);
        const int32_t hkv = it & 1 ? 32 : 8;
        char what[96];
        snprintf(what, sizeof what, "trace prefill B%d first %d prefix %d h32/%d", B, first,
                 prefix, hkv);
        check_lens(&rng, hkv, q, kv, B, what, NULL);
    }
    fitrace_free(tr);
}

/* One 4k prompt chunk (4096 query rows over 4096 + prefix keys) beside 127 decode requests of
 * q_len 1 (trace decode snapshot lengths), chunk first or last, heads 32 / 8 and 32 / 32. */
static void list_schedule_mixed_chunk_and_decodes(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 2};
    fitrace *tr = NULL;
    assert_int_equal(fitrace_load_default(NULL, &tr), FITRACE_OK);
    enum { B = 128 };
    int32_t q[B] = {0}, kv[B] = {0}, src[B] = {0}; /* outputs of fitrace_decode */
    for (int it = 0; it < 4; it++) {
        fitrace_lens lens = {B - 1, it & 2 ? q : q + 1, it & 2 ? kv : kv + 1, src};
        assert_int_equal(fitrace_decode(tr, tt_rng_int(&rng, 0, tr->num_requests - 1),
                                        tt_rng_int(&rng, 0, 500), 1, &lens), FITRACE_OK);
        const int32_t at = it & 2 ? B - 1 : 0;
        q[at] = 4096;
        kv[at] = 4096 + (it & 1) * tt_rng_int(&rng, 0, 8192);
        const int32_t hkv = it & 1 ? 32 : 8;
        char what[96];
        snprintf(what, sizeof what, "4k chunk (kv %d, %s) + 127 decodes h32/%d", kv[at],
                 it & 2 ? "last" : "first", hkv);
        check_lens(&rng, hkv, q, kv, B, what, NULL);
    }
    fitrace_free(tr);
}

/* Few tiles, each far above a CTA's share (one request, 128 query rows over 32k keys, 8 KV
 * heads: 8 tiles on 132 CTAs): the list schedule leaves 124 CTAs idle, the walk cuts each
 * tile into ~16 pieces and is chosen. */
static void walk_kept_for_few_large_tiles(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 3};
    const int32_t q[1] = {128}, kv[1] = {32768};
    assert_false(check_lens(&rng, 8, q, kv, 1, "q 128 over 32k keys h32/8", NULL));
}

/* Random context batches of every shape (tests/common/batchgen.h), windows and non-causal
 * included, at random CTA counts: every plan covered exactly once, whichever is chosen. */
static void list_schedule_random_context_batches(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 4};
    int chose = 0;
    for (int it = 0; it < 300; it++) {
        batchgen_opts o = {0};
        o.kind = FI_KIND_CONTEXT;
        if (it % 3 == 0)
            o.num_ctas = 132;
        batchgen_batch g;
        assert_int_equal(batchgen_make(&rng, &o, &g), 0);
        const fi_variant *row = fi_variant_of(&g.caps);
        plan_figs walk, list, chosen;
        plan_with(&g, -1, &walk, "random");
        plan_with(&g, 1, &list, "random");
        plan_with(&g, 0, &chosen, "random");
        const int32_t n = list.ctas;
        assert_int_equal(list.groups, 0);
        if ((int64_t)n * list.max > list.total + (int64_t)(n - 1) * list.big)
            fail_msg("seed %llu iter %d: Graham's bound (%s)", (unsigned long long)g_seed, it,
                     batchgen_describe(&g));
        const int64_t room = 64 + (int64_t)row->list_slack_64ths;
        assert_true(64 * chosen.model <= room * walk.model);
        assert_true(64 * chosen.max <= room * walk.max);
        chose += chosen.items == list.items && chosen.groups == 0 && chosen.model == list.model;
        batchgen_free(&g);
    }
    printf("random context batches: the list schedule chosen for %d of 300\n", chose);
}

/* Only the default context row is FI_PARTITION_LIST: the decode kinds' plans stay the
 * walk's (and byte-identical to before: scripts/plan_compare.sh), and context variant 1
 * (`context_walk`) is the walk, the list schedule's A/B baseline. */
static void only_context_rows_list_schedule(void **state) {
    (void)state;
    const fi_kind kinds[3] = {FI_KIND_MLA_DECODE, FI_KIND_GQA_DECODE, FI_KIND_CONTEXT};
    for (int k = 0; k < 3; k++)
        for (int32_t variant = 0; variant < 8; variant++) {
            const fi_variant *v = fi_variant_find(kinds[k], variant);
            if (!v)
                continue;
            assert_int_equal(v->partition == FI_PARTITION_LIST, kinds[k] == FI_KIND_CONTEXT && variant == 0);
            assert_true(v->list_slack_64ths >= 0);
        }
}

int main(void) {
    g_seed = tt_test_seed();
    printf("FI_TEST_SEED=%llu\n", (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(list_schedule_8k_causal_prefill),
        cmocka_unit_test(list_schedule_trace_prefill),
        cmocka_unit_test(list_schedule_mixed_chunk_and_decodes),
        cmocka_unit_test(walk_kept_for_few_large_tiles),
        cmocka_unit_test(list_schedule_random_context_batches),
        cmocka_unit_test(only_context_rows_list_schedule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
