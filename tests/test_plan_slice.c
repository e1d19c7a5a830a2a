/*
 * tests/test_plan_slice.c - one CTA's share of the data-parallel partition
 * (planner/pslice.h) against the whole partition (planner/ppart.c, inside
 * fi_plan_build_parallel), on random batches of the decode kinds (both forms, every shape
 * of tests/common/batchgen.h, 1 to 300 CTAs, up to 1024 requests; not the batches that
 * rows 2 and 8 pack in pairs, planner/ppair.c, which the shares do not cover):
 *   - the shares of all CTAs, each written into a poisoned plan, give the whole plan's
 *     work_indptr, items and merge groups byte for byte, and the header's totals (items,
 *     groups, slots, budget, the sum and maximum of the CTA costs);
 *   - one CTA's share, alone on a poisoned plan, writes only its items, its work_indptr
 *     entry (and the last one) and merge groups that start in it.
 * Seed printed; replay with FI_TEST_SEED.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/batchgen.h"
#include "fiattn.h"
#include "plan/plan.h"
#include "plan/variant.h"
#include "planner/build.h"
#include "planner/caps_internal.h"
#include "planner/partition.h"
#include "planner/pslice.h"
#include "planner/scratch.h"
#include "planner/tiles.h"
#include "workspace/layout.h"

#define POISON 0xa5
#define SLICE_BATCHES 2000

static uint64_t g_seed;

/* The whole plan of one batch and what the shares are computed from. */
typedef struct slice_ctx {
    fi_caps caps;
    const fi_variant *v;
    fi_layout l;
    fi_allocator a;
    fi_planner_scratch *s;
    unsigned char *full;  /* [l.plan_bytes]: fi_plan_build_parallel's plan */
    unsigned char *parts; /* [l.plan_bytes]: poisoned, then the CTAs' shares */
    int64_t *prefix;      /* [max_tiles + 1] */
    fi_tile_set ts;       /* the batch's tiles (fi_tiles_build_parallel) */
    fi_pslice_totals tot;
} slice_ctx;

static void ctx_open(slice_ctx *x, const batchgen_batch *g) {
    memset(x, 0, sizeof *x);
    assert_int_equal(fi_caps_resolve_layout(&g->caps, &x->caps, &x->l), FI_OK);
    x->v = fi_variant_of(&x->caps);
    assert_non_null(x->v);
    assert_int_equal(x->v->partition, FI_PARTITION_PARALLEL);
    x->s = fi_planner_scratch_create(&x->l, &x->a);
    x->full = calloc(1, x->l.plan_bytes);
    x->parts = malloc(x->l.plan_bytes);
    x->prefix = malloc(sizeof(int64_t) * ((size_t)x->l.max_tiles + 1));
    assert_true(x->s && x->full && x->parts && x->prefix);
}

static void ctx_close(slice_ctx *x) {
    fi_planner_scratch_destroy(x->s, &x->a);
    free(x->full);
    free(x->parts);
    free(x->prefix);
}

/* The whole plan, the batch's tiles again (from the plan's request table) and the
 * boundaries; 0 when the whole plan packs pairs (no shares to compare). */
static int plan_and_prepare(slice_ctx *x, const batchgen_batch *g, const char *what) {
    fi_error_detail e;
    fi_status st = fi_plan_build_parallel(&x->caps, x->v, &x->l, x->s, &g->batch, NULL,
                                          x->full, NULL, &e);
    if (st != FI_OK)
        fail_msg("seed %llu: whole plan: %s (%s)", (unsigned long long)g_seed,
                 fi_status_name(st), what);
    const fi_plan_header *h = fi_stage_header(x->full, &x->l);
    st = fi_tiles_build_parallel(x->v, &x->caps, fi_stage_requests(x->full, &x->l),
                                 h->batch_size, g->batch.causal, g->batch.window_left,
                                 x->s->pp.batch_scan, x->s->tiles, x->l.max_tiles, &x->ts, &e);
    assert_int_equal(st, FI_OK);
    if (fi_partition_pairs_apply(x->v, x->ts.T, x->l.num_ctas))
        return 0;
    st = fi_pslice_prepare(x->v, &x->ts, &x->l, x->prefix, &x->s->pp, &x->tot, &e);
    if (st != FI_OK)
        fail_msg("seed %llu: fi_pslice_prepare: %s (%s)", (unsigned long long)g_seed,
                 fi_status_name(st), what);
    return 1;
}

static void share(slice_ctx *x, int32_t c, unsigned char *base, int64_t *cost) {
    fi_pslice_cta(x->v, &x->ts, &x->l, &x->s->pp, &x->tot, c,
                  fi_stage_work_indptr(base, &x->l), fi_stage_items(base, &x->l),
                  fi_stage_groups(base, &x->l), cost);
}

/* Every CTA's share into one poisoned plan: the whole plan's regions and totals. */
static void all_shares_equal_whole(slice_ctx *x, const char *what) {
    const fi_layout *l = &x->l;
    const int32_t n = l->num_ctas;
    memset(x->parts, POISON, l->plan_bytes);
    int64_t total = 0, max = 0;
    for (int32_t c = 0; c < n; c++) {
        int64_t cost = -1;
        share(x, c, x->parts, &cost);
        total += cost;
        max = cost > max ? cost : max;
    }
    const fi_plan_header *h = fi_stage_header(x->full, l);
    if (x->tot.num_items != h->num_items || x->tot.num_groups != h->num_groups ||
        x->tot.num_slots != h->num_slots || x->tot.budget != h->kv_chunk ||
        total != h->total_cost || max != h->max_cta_cost)
        fail_msg("seed %llu: totals: items %d/%d groups %d/%d slots %d/%d budget %lld/%d cost "
                 "%lld/%lld max %lld/%lld (%s)", (unsigned long long)g_seed, x->tot.num_items,
                 h->num_items, x->tot.num_groups, h->num_groups, x->tot.num_slots, h->num_slots,
                 (long long)x->tot.budget, h->kv_chunk, (long long)total,
                 (long long)h->total_cost, (long long)max, (long long)h->max_cta_cost, what);
    const size_t ib = sizeof(int32_t) * ((size_t)n + 1);
    const size_t tb = sizeof(fi_work_item) * (size_t)h->num_items;
    const size_t gb = sizeof(fi_merge_group) * (size_t)h->num_groups;
    if (memcmp(fi_stage_work_indptr(x->parts, l), fi_stage_work_indptr(x->full, l), ib) != 0)
        fail_msg("seed %llu: work_indptr differs (%s)", (unsigned long long)g_seed, what);
    if (memcmp(fi_stage_items(x->parts, l), fi_stage_items(x->full, l), tb) != 0)
        fail_msg("seed %llu: items differ (%s)", (unsigned long long)g_seed, what);
    if (memcmp(fi_stage_groups(x->parts, l), fi_stage_groups(x->full, l), gb) != 0)
        fail_msg("seed %llu: merge groups differ (%s)", (unsigned long long)g_seed, what);
}

/* CTA c alone on a poisoned plan: only its items, work_indptr entries and the groups that
 * start in it changed. */
static void one_share_writes_its_own(slice_ctx *x, int32_t c, const char *what) {
    const fi_layout *l = &x->l;
    const int32_t n = l->num_ctas;
    memset(x->parts, POISON, l->plan_bytes);
    int64_t cost;
    share(x, c, x->parts, &cost);
    const int32_t *wi = fi_stage_work_indptr(x->full, l);
    const int32_t i0 = wi[c], i1 = wi[c + 1];
    const unsigned char *items = (const unsigned char *)fi_stage_items(x->parts, l);
    for (int32_t i = 0; i < x->tot.num_items; i++) {
        int poisoned = 1;
        for (size_t k = 0; k < sizeof(fi_work_item); k++)
            poisoned &= items[sizeof(fi_work_item) * (size_t)i + k] == POISON;
        if ((i >= i0 && i < i1) == poisoned)
            fail_msg("seed %llu: CTA %d of %d (items %d..%d): item %d %s (%s)",
                     (unsigned long long)g_seed, c, n, i0, i1, i,
                     poisoned ? "not written" : "written", what);
    }
    const fi_merge_group *fg = fi_stage_groups(x->full, l);
    const unsigned char *groups = (const unsigned char *)fi_stage_groups(x->parts, l);
    for (int32_t g = 0; g < x->tot.num_groups; g++) {
        int poisoned = 1;
        for (size_t k = 0; k < sizeof(fi_merge_group); k++)
            poisoned &= groups[sizeof(fi_merge_group) * (size_t)g + k] == POISON;
        const int32_t first = fg[g].first_item;
        if ((first >= i0 && first < i1) == poisoned)
            fail_msg("seed %llu: CTA %d: merge group %d (first item %d) %s (%s)",
                     (unsigned long long)g_seed, c, g, first,
                     poisoned ? "not written" : "written", what);
    }
    const int32_t *pw = fi_stage_work_indptr(x->parts, l);
    for (int32_t k = 0; k <= n; k++) {
        const int mine = k == c || (k == n && c == n - 1);
        if (mine != (pw[k] != (int32_t)0xa5a5a5a5))
            fail_msg("seed %llu: CTA %d: work_indptr[%d] %s (%s)", (unsigned long long)g_seed,
                     c, k, mine ? "not written" : "written", what);
    }
}

static void shares_equal_the_whole_partition(void **state) {
    (void)state;
    tt_rng rng = {g_seed ^ 0x5ce1ull};
    int cut_plans = 0, more_ctas_than_tiles = 0, pairs = 0, blocks = 0;
    for (int it = 0; it < SLICE_BATCHES; it++) {
        batchgen_opts o = {0};
        o.kind = tt_rng_int(&rng, 0, 1) ? FI_KIND_MLA_DECODE : FI_KIND_GQA_DECODE;
        o.form = tt_rng_int(&rng, 0, 1) ? FI_FORM_BLOCK_TABLES : FI_FORM_INDPTR;
        o.num_ctas = tt_rng_int(&rng, 0, 3) ? tt_rng_int(&rng, 1, 160) : tt_rng_int(&rng, 161, 300);
        o.max_batch = tt_rng_int(&rng, 0, 1) ? 0 : tt_rng_int(&rng, 65, 1024);
        batchgen_batch g;
        assert_int_equal(batchgen_make(&rng, &o, &g), 0);
        g.caps.variant = g.caps.kind == FI_KIND_MLA_DECODE ? 2 + 3 * tt_rng_int(&rng, 0, 2) : 1;
        const char *what = batchgen_describe(&g);
        slice_ctx x;
        ctx_open(&x, &g);
        if (!plan_and_prepare(&x, &g, what)) {
            pairs++;
            ctx_close(&x);
            batchgen_free(&g);
            continue;
        }
        all_shares_equal_whole(&x, what);
        if (it % 8 == 0)
            for (int32_t c = 0; c < x.l.num_ctas; c++)
                one_share_writes_its_own(&x, c, what);
        cut_plans += x.tot.num_groups > 0;
        more_ctas_than_tiles += x.l.num_ctas > x.ts.T;
        blocks += x.ts.blocks > 1; /* KV-head-major: one KV head's tiles stored */
        ctx_close(&x);
        batchgen_free(&g);
    }
    print_message("  %d plans: %d packed in pairs (skipped), %d with merge groups, %d with more "
                  "CTAs than tiles, %d of tile blocks\n", SLICE_BATCHES, pairs, cut_plans,
                  more_ctas_than_tiles, blocks);
    assert_true(cut_plans > SLICE_BATCHES / 4 && more_ctas_than_tiles > SLICE_BATCHES / 50 &&
                blocks > SLICE_BATCHES / 20);
}

int main(void) {
    g_seed = tt_test_seed();
    printf("FI_TEST_SEED=%llu\n", (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shares_equal_the_whole_partition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
