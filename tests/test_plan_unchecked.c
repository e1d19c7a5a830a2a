/*
 * tests/test_plan_unchecked.c - the device planner's unchecked build
 * (planner/build.h fi_plan_build_parallel_unchecked, on fi_batch_read_parallel's requests),
 * run here on the host as one thread.  In the device planner's cluster one CTA plans this
 * way while the other checks the batch's rules, and a broken rule replaces the plan, so:
 *   - on every valid batch it must equal the checked build (fi_plan_build_parallel):
 *     same status, same plan bytes (random batches of the decode kinds, both forms, on the
 *     data-parallel rows: tests/common/batchgen.h);
 *   - on per-request arrays that break the rules while the scalars pass (what the device
 *     planner launches on) it must stay within its arrays (the plan region is allocated to
 *     its exact size: `make asan` reports a write past it) and, when it finishes, within the
 *     layout's bounds: counts under the caps, work_indptr a CSR over the items.
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
#include "plan/variant.h"
#include "planner/build.h"
#include "planner/caps_internal.h"
#include "planner/scratch.h"
#include "plan/plan.h"
#include "planner/validate.h"
#include "workspace/layout.h"

static uint64_t g_seed;

/* What one build needs: the resolved caps, row, layout, scratch and two plan regions. */
typedef struct build_ctx {
    fi_caps caps;
    const fi_variant *v;
    fi_layout l;
    fi_allocator a;
    fi_planner_scratch *s;
    unsigned char *checked, *unchecked; /* [l.plan_bytes] each, zeroed */
} build_ctx;

static void ctx_open(build_ctx *x, const fi_caps *caps) {
    memset(x, 0, sizeof *x);
    assert_int_equal(fi_caps_resolve_layout(caps, &x->caps, &x->l), FI_OK);
    x->v = fi_variant_of(&x->caps);
    assert_non_null(x->v);
    assert_int_equal(x->v->partition, FI_PARTITION_PARALLEL);
    x->s = fi_planner_scratch_create(&x->l, &x->a);
    x->checked = calloc(1, x->l.plan_bytes);
    x->unchecked = calloc(1, x->l.plan_bytes);
    assert_true(x->s && x->checked && x->unchecked);
}

static void ctx_close(build_ctx *x) {
    fi_planner_scratch_destroy(x->s, &x->a);
    free(x->checked);
    free(x->unchecked);
}

/* A valid batch of a decode kind on a data-parallel row (MLA variant 2, or 8: 16-row tiles
 * of 64-token blocks; GQA variant 1). */
static void make_parallel_batch(tt_rng *rng, batchgen_batch *g) {
    batchgen_opts o = {0};
    o.kind = tt_rng_int(rng, 0, 1) ? FI_KIND_MLA_DECODE : FI_KIND_GQA_DECODE;
    o.form = tt_rng_int(rng, 0, 1) ? FI_FORM_BLOCK_TABLES : FI_FORM_INDPTR;
    assert_int_equal(batchgen_make(rng, &o, g), 0);
    g->caps.variant = g->caps.kind == FI_KIND_MLA_DECODE ? (tt_rng_int(rng, 0, 1) ? 8 : 2) : 1;
}

static void unchecked_build_equals_checked_on_valid_batches(void **state) {
    (void)state;
    tt_rng rng = {g_seed ^ 0x51ull};
    for (int it = 0; it < 1500; it++) {
        batchgen_batch g;
        make_parallel_batch(&rng, &g);
        build_ctx x;
        ctx_open(&x, &g.caps);
        fi_error_detail ec, eu;
        const fi_status sc =
            fi_plan_build_parallel(&x.caps, x.v, &x.l, x.s, &g.batch, NULL, x.checked, NULL, &ec);
        const fi_status su =
            fi_plan_build_parallel_unchecked(&x.caps, x.v, &x.l, x.s, &g.batch, x.unchecked, &eu);
        if (sc != FI_OK || su != FI_OK)
            fail_msg("seed %llu iter %d: checked %s, unchecked %s (%s)",
                     (unsigned long long)g_seed, it, fi_status_name(sc), fi_status_name(su),
                     batchgen_describe(&g));
        if (memcmp(x.checked, x.unchecked, x.l.plan_bytes) != 0)
            fail_msg("seed %llu iter %d: plans differ (%s)", (unsigned long long)g_seed, it,
                     batchgen_describe(&g));
        ctx_close(&x);
        batchgen_free(&g);
    }
}

/* Break request b's lengths in one of several ways the scalar rules cannot see. */
static void break_lengths(tt_rng *rng, batchgen_batch *g, int how) {
    fi_batch *bt = &g->batch;
    const int32_t B = bt->batch_size, b = tt_rng_int(rng, 0, B - 1);
    int32_t *kv = bt->form == FI_FORM_INDPTR ? (int32_t *)bt->kv_len : (int32_t *)bt->seq_lens;
    switch (how) {
    case 0:
        kv[b] = -1 - tt_rng_int(rng, 0, 999);
        break;
    case 1:
        kv[b] = INT32_MAX - (int32_t)tt_rng_int(rng, 0, 1);
        break;
    case 2: /* one key, and with INDPTR 7 more query rows: more rows than keys if causal */
        kv[b] = 1;
        if (bt->form == FI_FORM_INDPTR) {
            int32_t *q = (int32_t *)bt->qo_indptr;
            for (int32_t i = b + 1; i <= B; i++)
                q[i] += 7;
        }
        break;
    default: /* INDPTR: qo_indptr decreases at b (a negative q_len), or jumps by 2^30 */
        if (bt->form == FI_FORM_INDPTR) {
            int32_t *q = (int32_t *)bt->qo_indptr;
            const int32_t d = tt_rng_int(rng, 0, 1) ? -3 : 1 << 30;
            for (int32_t i = b + 1; i <= B; i++)
                q[i] += d;
        } else {
            kv[b] = INT32_MIN;
        }
        break;
    }
}

static void unchecked_build_stays_in_bounds_on_broken_lengths(void **state) {
    (void)state;
    tt_rng rng = {g_seed ^ 0xb4ull};
    int finished = 0, tried = 0;
    for (int it = 0; it < 1200; it++) {
        batchgen_batch g;
        make_parallel_batch(&rng, &g);
        if (g.batch.batch_size == 0) {
            batchgen_free(&g);
            continue;
        }
        break_lengths(&rng, &g, it % 4);
        build_ctx x;
        ctx_open(&x, &g.caps);
        fi_error_detail e;
        assert_int_equal(fi_batch_check_scalars(&x.caps, &g.batch, &e), FI_OK);
        const fi_status su =
            fi_plan_build_parallel_unchecked(&x.caps, x.v, &x.l, x.s, &g.batch, x.unchecked, &e);
        tried++;
        if (su == FI_OK) {
            finished++;
            const fi_plan_header *h = fi_stage_header(x.unchecked, &x.l);
            assert_in_range(h->num_items, 0, x.l.max_items);
            assert_in_range(h->num_groups, 0, x.l.max_groups);
            assert_in_range(h->num_slots, 0, x.l.max_slots);
            const int32_t *wi = fi_stage_work_indptr(x.unchecked, &x.l);
            assert_int_equal(wi[0], 0);
            for (int32_t c = 0; c < x.l.num_ctas; c++)
                if (wi[c + 1] < wi[c])
                    fail_msg("seed %llu iter %d: work_indptr decreases at CTA %d",
                             (unsigned long long)g_seed, it, c);
            assert_int_equal(wi[x.l.num_ctas], h->num_items);
        }
        ctx_close(&x);
        batchgen_free(&g);
    }
    /* the broken lengths reach the whole build, not only its capacity checks */
    printf("  %d of %d broken batches planned to the end\n", finished, tried);
    assert_true(finished > tried / 4);
}

int main(void) {
    g_seed = tt_test_seed();
    printf("FI_TEST_SEED=%llu\n", (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(unchecked_build_equals_checked_on_valid_batches),
        cmocka_unit_test(unchecked_build_stays_in_bounds_on_broken_lengths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
