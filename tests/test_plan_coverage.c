/*
 * tests/test_plan_coverage.c - the plan computes every (request, query head, query row,
 * visible KV token) exactly once, over thousands of random batches of every kind, form
 * and edge shape (tests/common/batchgen.h), and its bookkeeping is consistent:
 *   - each output row has exactly one writer (an unsplit item or one merge group), rows of
 *     items never overlap, empty rows are still written;
 *   - split items: a group's slots consecutive and in KV order (its pieces contiguous, in
 *     any CTAs), first_item its first piece, pieces >= the floor, cuts on the KV tile,
 *     every slot used once, counts within the workspace/layout.h bounds;
 *   - work_indptr is a CSR over all items; the request table matches the batch.
 * The expected KV range of a row is computed here from fiattn.h's definition, not from
 * the planner's code.  Seed printed; replay with FI_TEST_SEED.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/batchgen.h"
#include "fiattn.h"
#include "plan/mask.h" /* the row rule; tests/test_mask.c checks it by brute force */
#include "plan/variant.h"
#include "planner/partition.h"
#include "workspace/layout.h"

static uint64_t g_seed;

typedef struct span { int64_t row; int32_t lo, hi; } span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->row != y->row) return x->row < y->row ? -1 : 1;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            snprintf(msg, msz, __VA_ARGS__);                                              \
            goto out;                                                                     \
        }                                                                                 \
    } while (0)

/* Check every invariant of the plan for batch g; returns 0 or -1 with msg set. */
static int check_plan(const batchgen_batch *g, const fi_plan *plan, char *msg, size_t msz) {
    int rc = -1;
    span *spans = NULL;
    int32_t *writers = NULL, *slot_used = NULL, *group_items = NULL, *slot_item = NULL;
    fi_plan_view v;
    CHECK(fi_plan_get_view(plan, &v) == FI_OK, "no view");
    const fi_caps *caps = fi_plan_caps(plan);
    const fi_variant *var = fi_variant_of(caps);
    CHECK(var != NULL, "no tile table row");
    fi_layout l;
    CHECK(fi_layout_compute(caps, &l) == FI_OK, "layout");
    const fi_plan_header *h = v.header;
    const fi_batch *bt = &g->batch;
    const int32_t B = bt->batch_size, Hq = caps->num_qo_heads;
    const int32_t group = Hq / caps->num_kv_heads;
    CHECK(v.num_ctas == caps->num_ctas, "num_ctas");
    CHECK(h->batch_size == B && h->total_q_tokens == g->total_q_tokens, "header sizes");
    CHECK(h->tile_rows == var->tile_rows && h->tile_rows == fi_tile_rows(caps), "tile_rows");
    CHECK(h->causal == bt->causal && h->window_left == bt->window_left && h->form == (int32_t)bt->form,
          "header batch fields");
    CHECK(h->num_items >= 0 && h->num_items <= l.max_items, "items %d > bound %d", h->num_items,
          l.max_items);
    CHECK(h->num_groups >= 0 && h->num_groups <= l.max_groups, "groups %d > %d", h->num_groups,
          l.max_groups);
    CHECK(h->num_slots >= 0 && h->num_slots <= l.max_slots, "slots %d > %d", h->num_slots,
          l.max_slots);
    CHECK(h->num_groups <= caps->num_ctas - 1 || h->num_groups == 0, "groups > cuts");
    CHECK(h->max_cta_cost <= h->total_cost || h->total_cost == 0, "max cost > total");
    for (int32_t b = 0; b < B; b++) {
        const fi_request_info *r = &v.requests[b];
        CHECK(r->q_offset == g->q_offset[b] && r->q_len == g->q_len[b] &&
                  r->kv_len == g->kv_len[b] && r->page_row_offset == g->page_row[b],
              "request %d table (%d %d %d %d)", b, r->q_offset, r->q_len, r->kv_len,
              r->page_row_offset);
    }
    CHECK(v.work_indptr[0] == 0 && v.work_indptr[v.num_ctas] == h->num_items, "indptr ends");
    for (int32_t c = 0; c < v.num_ctas; c++)
        CHECK(v.work_indptr[c] <= v.work_indptr[c + 1], "indptr not monotone at %d", c);
    /* The executor's first read: CTA c's start record repeats its range, its first item and
     * that item's request row, byte for byte; an empty CTA's record is zero past its range. */
    for (int32_t c = 0; c < v.num_ctas; c++) {
        const fi_cta_start *cs = &v.cta_starts[c];
        fi_cta_start want;
        memset(&want, 0, sizeof want);
        want.item_begin = v.work_indptr[c];
        want.item_end = v.work_indptr[c + 1];
        if (want.item_begin < want.item_end) {
            want.first = v.items[want.item_begin];
            want.request = v.requests[want.first.request];
        }
        CHECK(memcmp(cs, &want, sizeof want) == 0, "cta %d start record (range %d..%d)", c,
              cs->item_begin, cs->item_end);
    }

    const int64_t rows = (int64_t)g->total_q_tokens * Hq;
    writers = calloc((size_t)rows + 1, sizeof(int32_t));
    slot_used = calloc((size_t)h->num_slots + 1, sizeof(int32_t));
    group_items = calloc((size_t)h->num_groups + 1, sizeof(int32_t));
    slot_item = calloc((size_t)h->num_slots + 1, sizeof(int32_t));
    int64_t nspans = 0, cap_spans = 1024;
    spans = malloc(sizeof(span) * (size_t)cap_spans);
    CHECK(writers && slot_used && group_items && slot_item && spans, "oom");
    for (int32_t k = 0; k < h->num_items; k++) {
        const fi_work_item *it = &v.items[k];
        CHECK(it->request >= 0 && it->request < B, "item %d request %d", k, it->request);
        const fi_request_info *r = &v.requests[it->request];
        CHECK(it->head_begin >= 0 && it->head_begin < it->head_end && it->head_end <= Hq &&
                  it->head_begin / group == (it->head_end - 1) / group,
              "item %d heads [%d,%d)", k, it->head_begin, it->head_end);
        CHECK(it->q_begin >= 0 && it->q_begin < it->q_end && it->q_end <= r->q_len,
              "item %d q [%d,%d) of %d", k, it->q_begin, it->q_end, r->q_len);
        CHECK((it->q_end - it->q_begin) * (it->head_end - it->head_begin) <= h->tile_rows,
              "item %d taller than a tile", k);
        CHECK(it->kv_begin >= 0 && it->kv_begin <= it->kv_end && it->kv_end <= r->kv_len,
              "item %d kv [%d,%d) of %d", k, it->kv_begin, it->kv_end, r->kv_len);
        CHECK((it->out_slot < 0) == (it->merge_group < 0), "item %d slot/group", k);
        if (it->merge_group >= 0) {
            CHECK(it->merge_group < h->num_groups && it->out_slot < h->num_slots,
                  "item %d group/slot out of range", k);
            slot_used[it->out_slot]++;
            slot_item[it->out_slot] = k;
            group_items[it->merge_group]++;
        }
        for (int32_t i = it->q_begin; i < it->q_end; i++) {
            int32_t lo, hi;
            fi_row_kv_range(bt->causal, bt->window_left, r->q_len, r->kv_len, i, &lo, &hi);
            for (int32_t hh = it->head_begin; hh < it->head_end; hh++) {
                const int64_t row = (int64_t)(r->q_offset + i) * Hq + hh;
                if (it->merge_group < 0)
                    writers[row]++;
                const int32_t a = it->kv_begin > lo ? it->kv_begin : lo;
                const int32_t z = it->kv_end < hi ? it->kv_end : hi;
                if (a >= z)
                    continue;
                if (nspans == cap_spans) {
                    cap_spans *= 2;
                    span *ns = realloc(spans, sizeof(span) * (size_t)cap_spans);
                    CHECK(ns, "oom");
                    spans = ns;
                }
                spans[nspans++] = (span){row, a, z};
            }
        }
    }
    int32_t next_slot = 0;
    for (int32_t gi = 0; gi < h->num_groups; gi++) {
        const fi_merge_group *mg = &v.groups[gi];
        CHECK(mg->num_splits >= 2 && group_items[gi] == mg->num_splits,
              "group %d splits %d items %d", gi, mg->num_splits, group_items[gi]);
        CHECK(mg->first_slot == next_slot, "group %d slots not consecutive", gi);
        next_slot += mg->num_splits;
        CHECK(mg->first_item >= 0 && mg->first_item < h->num_items &&
                  slot_used[mg->first_slot] == 1 && slot_item[mg->first_slot] == mg->first_item,
              "group %d first item", gi);
        for (int32_t s = 0; s < mg->num_splits; s++) {
            CHECK(slot_used[mg->first_slot + s] == 1, "group %d slot %d", gi, s);
            const fi_work_item *it = &v.items[slot_item[mg->first_slot + s]];
            CHECK(it->merge_group == gi && it->out_slot == mg->first_slot + s,
                  "group %d piece %d bookkeeping", gi, s);
            CHECK(it->request == mg->request && it->head_begin == mg->head_begin &&
                      it->head_end == mg->head_end && it->q_begin == mg->q_begin &&
                      it->q_end == mg->q_end,
                  "group %d piece %d rectangle", gi, s);
            CHECK(it->kv_end - it->kv_begin >= var->min_chunk_tokens,
                  "group %d piece %d below floor", gi, s);
            if (s > 0) {
                CHECK(v.items[slot_item[mg->first_slot + s - 1]].kv_end == it->kv_begin,
                      "group %d pieces not contiguous", gi);
                CHECK(it->kv_begin % var->kv_tile_tokens == 0, "group %d cut off the KV tile", gi);
            }
        }
        const fi_request_info *r = &v.requests[mg->request];
        for (int32_t i = mg->q_begin; i < mg->q_end; i++)
            for (int32_t hh = mg->head_begin; hh < mg->head_end; hh++)
                writers[(int64_t)(r->q_offset + i) * Hq + hh]++;
    }
    CHECK(next_slot == h->num_slots, "slots used %d != %d", next_slot, h->num_slots);
    for (int32_t s = 0; s < h->num_slots; s++)
        CHECK(slot_used[s] == 1, "slot %d used %d times", s, slot_used[s]);
    for (int64_t row = 0; row < rows; row++)
        CHECK(writers[row] == 1, "row %lld (token %lld head %lld) written %d times",
              (long long)row, (long long)(row / Hq), (long long)(row % Hq), writers[row]);
    qsort(spans, (size_t)nspans, sizeof(span), span_cmp);
    /* Walk rows in order: each row's spans must tile its visible range exactly. */
    int64_t s = 0;
    for (int32_t b = 0; b < B; b++) {
        const fi_request_info *r = &v.requests[b];
        for (int32_t i = 0; i < r->q_len; i++) {
            int32_t lo, hi;
            fi_row_kv_range(bt->causal, bt->window_left, r->q_len, r->kv_len, i, &lo, &hi);
            for (int32_t hh = 0; hh < Hq; hh++) {
                const int64_t row = (int64_t)(r->q_offset + i) * Hq + hh;
                int32_t at = lo;
                while (s < nspans && spans[s].row == row) {
                    CHECK(spans[s].lo == at, "request %d row %d head %d: key %d seen %s", b, i,
                          hh, spans[s].lo < at ? spans[s].lo : at,
                          spans[s].lo < at ? "twice" : "never");
                    at = spans[s].hi;
                    s++;
                }
                CHECK(at == hi, "request %d row %d head %d: keys [%d,%d) never seen", b, i, hh,
                      at, hi);
            }
        }
    }
    CHECK(s == nspans, "spans outside the batch rows");
    CHECK(fi_plan_balance(plan) >= 1.0 - 1e-9, "balance %f < 1", fi_plan_balance(plan));
    rc = 0;
out:
    free(spans);
    free(writers);
    free(slot_used);
    free(slot_item);
    free(group_items);
    return rc;
}

static void run_many(int iters, const batchgen_opts *base) {
    tt_rng rng = {g_seed ^ (uint64_t)iters * 0x9e37ull ^ (uint64_t)(base ? base->shape : 0)};
    char msg[512];
    for (int it = 0; it < iters; it++) {
        batchgen_batch g;
        batchgen_opts o = base ? *base : (batchgen_opts){0};
        assert_int_equal(batchgen_make(&rng, &o, &g), 0);
        fi_plan *p = NULL;
        fi_status st = fi_plan_create(&g.caps, NULL, 0, NULL, &p);
        if (st != FI_OK)
            fail_msg("seed %llu iter %d: create %s (%s)", (unsigned long long)g_seed, it,
                     fi_status_name(st), batchgen_describe(&g));
        st = fi_plan_update(p, &g.batch, NULL);
        if (st != FI_OK) {
            fi_error_detail d = fi_plan_error(p);
            fail_msg("seed %llu iter %d: update %s request %d needed %lld limit %lld (%s)",
                     (unsigned long long)g_seed, it, fi_status_name(st), d.request,
                     (long long)d.needed, (long long)d.limit, batchgen_describe(&g));
        }
        if (check_plan(&g, p, msg, sizeof msg) != 0)
            fail_msg("seed %llu iter %d: %s (%s)", (unsigned long long)g_seed, it, msg,
                     batchgen_describe(&g));
        fi_plan_destroy(p);
        batchgen_free(&g);
    }
}

static void plan_covers_every_kv_token_once_random(void **state) {
    (void)state;
    run_many(2000, NULL);
}

static void plan_covers_every_kv_token_once_at_page_edges(void **state) {
    (void)state;
    batchgen_opts o = {0};
    o.shape = BATCHGEN_KV_EDGES;
    run_many(500, &o);
    o.shape = BATCHGEN_BATCH1;
    o.max_kv_len = 70000;
    run_many(500, &o);
}

static void plan_covers_long_request_among_short_ones(void **state) {
    (void)state;
    batchgen_opts o = {0};
    o.shape = BATCHGEN_LONG_TAIL;
    o.max_batch = 128;
    o.kind = FI_KIND_MLA_DECODE;
    run_many(40, &o);
    o.kind = FI_KIND_GQA_DECODE;
    run_many(40, &o);
    o.kind = FI_KIND_CONTEXT;
    o.num_ctas = 132;
    run_many(20, &o);
}

static void plan_covers_max_batch(void **state) {
    (void)state;
    batchgen_opts o = {0};
    o.shape = BATCHGEN_MAX_BATCH;
    o.max_batch = 256;
    o.kind = FI_KIND_MLA_DECODE;
    run_many(40, &o);
    o.kind = FI_KIND_GQA_DECODE;
    run_many(40, &o);
}

static void plan_covers_windows_and_non_causal(void **state) {
    (void)state;
    batchgen_opts o = {0};
    o.fixed_window = 1;
    for (int32_t w = 0; w <= 300; w += 37) {
        o.window_left = w;
        o.fixed_causal = 1;
        o.causal = w % 2;
        run_many(60, &o);
    }
}

static void plan_covers_every_kv_token_once_global_walk(void **state) {
    (void)state;
    fi_partition_test_force_global = 1;
    run_many(1000, NULL);
    batchgen_opts o = {0};
    o.shape = BATCHGEN_LONG_TAIL;
    o.max_batch = 128;
    run_many(30, &o);
    fi_partition_test_force_global = 0;
}

static void plan_with_one_cta_never_splits(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 7};
    for (int it = 0; it < 200; it++) {
        batchgen_batch g;
        batchgen_opts o = {0};
        o.num_ctas = 1;
        assert_int_equal(batchgen_make(&rng, &o, &g), 0);
        fi_plan *p = NULL;
        assert_int_equal(fi_plan_create(&g.caps, NULL, 0, NULL, &p), FI_OK);
        assert_int_equal(fi_plan_update(p, &g.batch, NULL), FI_OK);
        fi_plan_view v;
        assert_int_equal(fi_plan_get_view(p, &v), FI_OK);
        assert_int_equal(v.header->num_groups, 0);
        assert_int_equal(v.work_indptr[1], v.header->num_items);
        fi_plan_destroy(p);
        batchgen_free(&g);
    }
}

int main(void) {
    g_seed = tt_test_seed();
    printf("FI_TEST_SEED=%llu\n", (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plan_covers_every_kv_token_once_random),
        cmocka_unit_test(plan_covers_every_kv_token_once_at_page_edges),
        cmocka_unit_test(plan_covers_long_request_among_short_ones),
        cmocka_unit_test(plan_covers_max_batch),
        cmocka_unit_test(plan_covers_windows_and_non_causal),
        cmocka_unit_test(plan_covers_every_kv_token_once_global_walk),
        cmocka_unit_test(plan_with_one_cta_never_splits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
