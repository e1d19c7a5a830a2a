/*
 * tests/test_plan_determinism.c - the same batch gives a byte-identical plan: twice on one
 * plan (the two staging buffers), on two plans, and after other batches in between (no
 * state leaks from an older plan); the whole copied prefix (what goes to the device) is
 * compared, not only the view.  Also: fi_plan_update allocates nothing.
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
#include "plan/plan.h"

static uint64_t g_seed;

/* The bytes an update copies to the device (front staging buffer, used prefix). */
static unsigned char *copied_bytes(const fi_plan *p, size_t *len) {
    const unsigned char *base = p->staging[p->cur];
    const fi_plan_header *h = (const fi_plan_header *)(base + p->layout.off_header);
    *len = fi_layout_used_bytes(&p->layout, h->num_items);
    unsigned char *c = malloc(*len);
    assert_non_null(c);
    memcpy(c, base, *len);
    return c;
}

static void assert_same_plan(const fi_plan *a, const fi_plan *b, const char *what,
                             const batchgen_batch *g) {
    size_t la, lb;
    unsigned char *x = copied_bytes(a, &la), *y = copied_bytes(b, &lb);
    if (la != lb || memcmp(x, y, la) != 0)
        fail_msg("seed %llu: %s: plans differ (%zu vs %zu bytes) (%s)",
                 (unsigned long long)g_seed, what, la, lb, batchgen_describe(g));
    /* and the public view regions */
    fi_plan_view va, vb;
    assert_int_equal(fi_plan_get_view(a, &va), FI_OK);
    assert_int_equal(fi_plan_get_view(b, &vb), FI_OK);
    assert_memory_equal(va.header, vb.header, sizeof *va.header);
    assert_memory_equal(va.items, vb.items, sizeof(fi_work_item) * (size_t)va.header->num_items);
    assert_memory_equal(va.groups, vb.groups,
                        sizeof(fi_merge_group) * (size_t)va.header->num_groups);
    assert_memory_equal(va.work_indptr, vb.work_indptr,
                        sizeof(int32_t) * (size_t)(va.num_ctas + 1));
    assert_memory_equal(va.requests, vb.requests,
                        sizeof(fi_request_info) * (size_t)va.header->batch_size);
    assert_true(fi_plan_balance(a) == fi_plan_balance(b));
    free(x);
    free(y);
}

static void same_batch_gives_byte_identical_plan(void **state) {
    (void)state;
    tt_rng rng = {g_seed};
    for (int it = 0; it < 400; it++) {
        batchgen_opts o = {0};
        o.max_batch = 48;
        batchgen_batch g, other;
        assert_int_equal(batchgen_make(&rng, &o, &g), 0);
        fi_plan *p1 = NULL, *p2 = NULL;
        assert_int_equal(fi_plan_create(&g.caps, NULL, 0, NULL, &p1), FI_OK);
        assert_int_equal(fi_plan_create(&g.caps, NULL, 0, NULL, &p2), FI_OK);
        assert_int_equal(fi_plan_update(p1, &g.batch, NULL), FI_OK);
        size_t l1;
        unsigned char *first = copied_bytes(p1, &l1);
        /* same plan, other staging buffer */
        assert_int_equal(fi_plan_update(p1, &g.batch, NULL), FI_OK);
        assert_int_equal(p1->cur, 0); /* flipped twice from 0 */
        size_t l2;
        unsigned char *second = copied_bytes(p1, &l2);
        assert_int_equal(l1, l2);
        if (memcmp(first, second, l1) != 0)
            fail_msg("seed %llu iter %d: same plan, two updates differ (%s)",
                     (unsigned long long)g_seed, it, batchgen_describe(&g));
        /* second plan: a different batch over the same caps first (always accepted, so the
         * "after another batch" check runs every iteration), then g */
        enum { NO = 48 };
        int32_t oq[NO], okv[NO];
        const int32_t on = tt_rng_int(&rng, 1, NO);
        const int32_t uq = g.caps.kind == FI_KIND_CONTEXT ? 0 : tt_rng_int(&rng, 1, 8);
        for (int32_t i = 0; i < on; i++) {
            okv[i] = tt_rng_int(&rng, 0, 3000);
            oq[i] = uq ? uq : tt_rng_int(&rng, 0, okv[i] < 64 ? okv[i] : 64);
            if (okv[i] > 0 && okv[i] < oq[i])
                okv[i] = oq[i];
        }
        /* decode kinds: block tables or indptr (cum_seq_lens is the context form) */
        const fi_batch_form oform = uq ? (fi_batch_form)tt_rng_int(&rng, 1, 2) : FI_FORM_INDPTR;
        assert_int_equal(batchgen_from_lens(&rng, &g.caps, oform, oq, okv, on, 0, 1, 1, -1, &other), 0);
        fi_caps c2 = g.caps;
        c2.num_pages = other.caps.num_pages > g.caps.num_pages ? other.caps.num_pages
                                                               : g.caps.num_pages;
        c2.max_q_tokens = other.caps.max_q_tokens > g.caps.max_q_tokens
                              ? other.caps.max_q_tokens : g.caps.max_q_tokens;
        c2.max_batch = other.caps.max_batch > g.caps.max_batch ? other.caps.max_batch
                                                               : g.caps.max_batch;
        fi_plan *p3 = NULL;
        assert_int_equal(fi_plan_create(&c2, NULL, 0, NULL, &p3), FI_OK);
        fi_plan *p4 = NULL;
        assert_int_equal(fi_plan_create(&c2, NULL, 0, NULL, &p4), FI_OK);
        assert_int_equal(fi_plan_update(p3, &other.batch, NULL), FI_OK);
        assert_int_equal(fi_plan_update(p3, &other.batch, NULL), FI_OK);
        assert_int_equal(fi_plan_update(p3, &g.batch, NULL), FI_OK);
        assert_int_equal(fi_plan_update(p4, &g.batch, NULL), FI_OK);
        assert_same_plan(p3, p4, "after another batch", &g);
        assert_int_equal(fi_plan_update(p2, &g.batch, NULL), FI_OK);
        assert_same_plan(p1, p2, "two plans", &g);
        free(first);
        free(second);
        fi_plan_destroy(p1);
        fi_plan_destroy(p2);
        fi_plan_destroy(p3);
        fi_plan_destroy(p4);
        batchgen_free(&g);
        batchgen_free(&other);
    }
}

typedef struct counting { int allocs, frees; } counting;
static void *count_alloc(void *ctx, size_t bytes, size_t alignment) {
    ((counting *)ctx)->allocs++;
    void *p = NULL;
    return posix_memalign(&p, alignment < sizeof(void *) ? sizeof(void *) : alignment, bytes)
               ? NULL : p;
}
static void count_free(void *ctx, void *p) {
    ((counting *)ctx)->frees++;
    free(p);
}

static void plan_update_allocates_nothing(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 1};
    for (int it = 0; it < 50; it++) {
        batchgen_batch g;
        assert_int_equal(batchgen_make(&rng, NULL, &g), 0);
        counting cnt = {0, 0};
        fi_allocator a = {count_alloc, count_free, &cnt};
        fi_plan *p = NULL;
        assert_int_equal(fi_plan_create(&g.caps, NULL, 0, &a, &p), FI_OK);
        const int after_create = cnt.allocs;
        assert_true(after_create > 0);
        for (int k = 0; k < 5; k++)
            assert_int_equal(fi_plan_update(p, &g.batch, NULL), FI_OK);
        fi_batch bad = g.batch;
        bad.window_left = -5;
        assert_int_equal(fi_plan_update(p, &bad, NULL), FI_ERR_INVALID_WINDOW);
        assert_int_equal(cnt.allocs, after_create);
        assert_int_equal(cnt.frees, 0);
        fi_plan_destroy(p);
        assert_int_equal(cnt.frees, cnt.allocs);
        batchgen_free(&g);
    }
}

int main(void) {
    g_seed = tt_test_seed();
    printf("FI_TEST_SEED=%llu\n", (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(same_batch_gives_byte_identical_plan),
        cmocka_unit_test(plan_update_allocates_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
