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
 * Also where some plans put work: a request's head chunks and KV heads side by side, and
 * the data-parallel rows' whole tiles for small uniform batches.
 * The checks are tt_plan_check (tests/common/plan_check.h, shared with the fuzzer); the
 * expected request table is batchgen's.  Seed printed; replay with FI_TEST_SEED.
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
#include "planner/partition.h"

static uint64_t g_seed;

/* Nonzero: plan the decode kinds with their data-parallel partition rows (ppart.c). */
static int g_parallel_rows;
/* Nonzero: plan GQA decode on its tile_rows-8 row (gqa_decode_rows8), whose kernel runs
 * items of at most 8 rows only: every item is checked for it too. */
static int g_gqa_rows8;

/* 0 when every work item of p has at most max_rows rows (query rows x heads). */
static int items_over_rows(const fi_plan *p, int32_t max_rows) {
    fi_plan_view v;
    assert_int_equal(fi_plan_get_view(p, &v), FI_OK);
    for (int32_t i = 0; i < v.header->num_items; i++) {
        const fi_work_item *it = &v.items[i];
        if ((it->q_end - it->q_begin) * (it->head_end - it->head_begin) > max_rows)
            return 1;
    }
    return 0;
}

static void run_many(int iters, const batchgen_opts *base) {
    tt_rng rng = {g_seed ^ (uint64_t)iters * 0x9e37ull ^ (uint64_t)(base ? base->shape : 0)};
    char msg[512];
    for (int it = 0; it < iters; it++) {
        batchgen_batch g;
        batchgen_opts o = base ? *base : (batchgen_opts){0};
        assert_int_equal(batchgen_make(&rng, &o, &g), 0);
        if (g_parallel_rows && g.caps.kind != FI_KIND_CONTEXT) /* GQA: rows 1 and 4 */
            g.caps.variant = g.caps.kind == FI_KIND_MLA_DECODE ? 2 : it & 1 ? 4 : 1;
        if (g_gqa_rows8 && g.caps.kind == FI_KIND_GQA_DECODE)
            g.caps.variant = 2;
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
        const tt_plan_expect want = batchgen_expect(&g);
        if (tt_plan_check(p, &g.batch, &want, msg, sizeof msg) != 0)
            fail_msg("seed %llu iter %d: %s (%s)", (unsigned long long)g_seed, it, msg,
                     batchgen_describe(&g));
        if (g.caps.kind == FI_KIND_GQA_DECODE && fi_variant_of(&g.caps)->tile_rows == 8 &&
            items_over_rows(p, 8))
            fail_msg("seed %llu iter %d: an item of more than 8 rows on a rows-8 row (%s)",
                     (unsigned long long)g_seed, it, batchgen_describe(&g));
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

/* 2000 random batches and 200 long-tailed ones with *mode set (a row override above). */
static void run_many_with(int *mode) {
    *mode = 1;
    run_many(2000, NULL);
    batchgen_opts o = {0};
    o.shape = BATCHGEN_LONG_TAIL;
    run_many(200, &o);
    *mode = 0;
}

/* The data-parallel partition (planner/ppart.c) on the same random batches: every KV token
 * once, bounds, groups and slots as for the walk (tt_plan_check). */
static void plan_covers_every_kv_token_once_parallel_partition(void **state) {
    (void)state;
    run_many_with(&g_parallel_rows);
}

/* GQA decode on the tile_rows-8 row: every KV token once (tt_plan_check) and no item of
 * more than 8 rows, whatever the group and q_len (a request of more rows is cut). */
static void plan_covers_every_kv_token_once_gqa_rows8(void **state) {
    (void)state;
    run_many_with(&g_gqa_rows8);
}

static void plan_with_one_cta_never_splits(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 7};
    for (int it = 0; it < 200; it++) {
        batchgen_batch g;
        batchgen_opts o = {0};
        o.num_ctas = 1;
        assert_int_equal(batchgen_make(&rng, &o, &g), 0);
        if (g_parallel_rows && g.caps.kind != FI_KIND_CONTEXT) /* GQA: rows 1 and 4 */
            g.caps.variant = g.caps.kind == FI_KIND_MLA_DECODE ? 2 : it & 1 ? 4 : 1;
        if (g_gqa_rows8 && g.caps.kind == FI_KIND_GQA_DECODE)
            g.caps.variant = 2;
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

/* The BLOCK_TABLES decode batch of B requests of q_len 1 over bt [B * P] and lens [B]. */
static fi_batch decode_batch(int32_t B, int32_t P, int32_t *bt, int32_t *lens) {
    fi_batch bb;
    memset(&bb, 0, sizeof bb);
    bb.form = FI_FORM_BLOCK_TABLES;
    bb.batch_size = B;
    bb.block_tables = bt;
    bb.max_pages_per_seq = P;
    bb.seq_lens = lens;
    bb.q_len_per_request = 1;
    bb.window_left = -1;
    return bb;
}

/* MLA decode caps (576 / 512 dims, one KV head) of `heads` query heads on tile table row
 * `variant`; the rest zero for the caller. */
static fi_caps mla_caps(int32_t heads, int32_t variant) {
    fi_caps c;
    memset(&c, 0, sizeof c);
    c.kind = FI_KIND_MLA_DECODE;
    c.num_qo_heads = heads;
    c.num_kv_heads = 1;
    c.head_dim_qk = 576;
    c.head_dim_vo = 512;
    c.variant = variant;
    return c;
}

/* A uniform decode batch (the side-by-side tests below): B requests of kv_len kv each, q_len
 * 1, request b on pages b * P ..; c holds the kind, heads, dims and variant, the rest is set
 * here.  bt [B * P], lens [B]: the caller's.  Returns the updated plan (the caller destroys
 * it) and its view. */
static fi_plan *plan_uniform_decode(fi_caps c, int32_t B, int32_t P, int32_t PS, int32_t ctas,
                                    int32_t kv, int32_t *bt, int32_t *lens, fi_plan_view *v) {
    for (int i = 0; i < B * P; i++)
        bt[i] = i;
    for (int b = 0; b < B; b++)
        lens[b] = kv;
    c.max_batch = B;
    c.max_q_tokens = B;
    c.num_pages = B * P;
    c.page_size = PS;
    c.q_dtype = c.kv_dtype = c.o_dtype = FI_DTYPE_BF16;
    c.num_ctas = ctas;
    const fi_batch bb = decode_batch(B, P, bt, lens);
    fi_plan *p = NULL;
    assert_int_equal(fi_plan_create(&c, NULL, 0, NULL, &p), FI_OK);
    assert_int_equal(fi_plan_update(p, &bb, NULL), FI_OK);
    assert_int_equal(fi_plan_get_view(p, v), FI_OK);
    return p;
}

/* CTAs a and b run the same (request, KV range) items in the same order, a's on heads from
 * ha, b's from hb. */
static void assert_side_by_side(const fi_plan_view *v, int a, int b, int ha, int hb) {
    const int a0 = v->work_indptr[a], a1 = v->work_indptr[a + 1];
    const int b0 = v->work_indptr[b], b1 = v->work_indptr[b + 1];
    assert_true(a1 > a0);
    assert_int_equal(a1 - a0, b1 - b0);
    for (int i = 0; i < a1 - a0; i++) {
        const fi_work_item *x = &v->items[a0 + i], *y = &v->items[b0 + i];
        assert_int_equal(x->request, y->request);
        assert_int_equal(x->kv_begin, y->kv_begin);
        assert_int_equal(x->kv_end, y->kv_end);
        assert_int_equal(x->head_begin, ha);
        assert_int_equal(y->head_begin, hb);
    }
}

/* MLA heads 128 on 64-row tiles: the two head chunks of a request go to CTAs c and
 * c + num_ctas / 2 (tiles.h, head-chunk-major order), so they run side by side and the
 * second reads the KV from L2.  Uniform batch (every request the same cost), default row
 * (variant 0 at 128 heads: the wgmma row) and the mma.sync row by number; random kv_len. */
static void mla_head_chunks_of_a_request_run_side_by_side(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 11};
    enum { B = 64, P = 64, PS = 64, CTAS = 32 };
    static int32_t bt[B * P], lens[B];
    const int32_t kv = (int32_t)tt_rng_int(&rng, 1000, P * PS);
    for (int variant = 0; variant <= 4; variant += 4) {
        const fi_caps c = mla_caps(128, variant);
        fi_plan_view v;
        fi_plan *p = plan_uniform_decode(c, B, P, PS, CTAS, kv, bt, lens, &v);
        assert_int_equal(v.header->tile_rows, 64);
        for (int cta = 0; cta < CTAS / 2; cta++)
            assert_side_by_side(&v, cta, cta + CTAS / 2, 0, 64);
        fi_plan_destroy(p);
    }
}

/* GQA decode batches past the packing limit: tiles KV-head-major (tiles.h), so with 64
 * uniform requests x 8 KV heads on 64 CTAs (8 whole tiles a CTA) CTA c + 8 k runs KV head
 * k of the requests CTA c runs head 0 of, in the same order.  The five GQA rows (the
 * default, the data-parallel partition, the rows-8 tiles, the 64-row tiles by number, the
 * rows-8 tiles on the data-parallel partition); random kv_len. */
static void gqa_kv_heads_of_a_request_run_side_by_side(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 12};
    enum { B = 64, P = 64, PS = 16, CTAS = 64, HKV = 8, GROUP = 4 };
    static int32_t bt[B * P], lens[B];
    const int32_t kv = (int32_t)tt_rng_int(&rng, 100, P * PS);
    for (int variant = 0; variant <= 4; variant++) {
        fi_caps c;
        memset(&c, 0, sizeof c);
        c.kind = FI_KIND_GQA_DECODE;
        c.num_qo_heads = HKV * GROUP;
        c.num_kv_heads = HKV;
        c.head_dim_qk = c.head_dim_vo = 128;
        c.variant = variant;
        fi_plan_view v;
        fi_plan *p = plan_uniform_decode(c, B, P, PS, CTAS, kv, bt, lens, &v);
        for (int cta = 0; cta < CTAS / HKV; cta++)
            for (int k = 1; k < HKV; k++)
                assert_side_by_side(&v, cta, cta + k * (CTAS / HKV), 0, k * GROUP);
        fi_plan_destroy(p);
    }
}

/* The data-parallel rows plan a batch of no more tiles than CTAs a tile a CTA, none cut,
 * when its largest tile costs at most the equal share plus the row's charge for a cut:
 * uniform decode batches of B <= num_ctas requests (MLA heads 16 on row 2: a tile a
 * request, planned by pair packing, planner/ppair.c, which must reach the same plan; GQA
 * 32 / 8 on rows 1 and 4: 8 tiles a request, planner/ppart_core.h pp_boundaries), random
 * B, CTAs and kv_len, each checked against that rule; and one request 32x longer than the
 * rest is still cut. */
static void parallel_partition_gives_small_uniform_batches_whole_tiles(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 13};
    enum { P = 512, PS = 64, MAXB = 132 };
    int32_t *bt = malloc(sizeof(int32_t) * MAXB * P), *lens = malloc(sizeof(int32_t) * MAXB);
    assert_true(bt && lens);
    int wholes = 0;
    for (int it = 0; it < 60; it++) {
        const int gqa = it % 3 != 0;
        fi_caps c;
        memset(&c, 0, sizeof c);
        c.kind = gqa ? FI_KIND_GQA_DECODE : FI_KIND_MLA_DECODE;
        c.num_qo_heads = gqa ? 32 : 16;
        c.num_kv_heads = gqa ? 8 : 1;
        c.head_dim_qk = gqa ? 128 : 576;
        c.head_dim_vo = gqa ? 128 : 512;
        c.variant = gqa ? (it & 1 ? 4 : 1) : 2;
        const int32_t per = gqa ? 8 : 1; /* tiles a request */
        /* the first four: T = ctas = 128, so the share is a whole tile */
        const int32_t ctas = it < 4 ? 128 : tt_rng_int(&rng, 16, 132);
        const int32_t B = ctas / per - (it < 4 ? 0 : tt_rng_int(&rng, 0, ctas / per > 3 ? 3 : ctas / per - 1));
        const int32_t kv = it < 4 ? 4096 : tt_rng_int(&rng, 1, 8192);
        fi_plan_view v;
        fi_plan *p = plan_uniform_decode(c, B, P, PS, ctas, kv, bt, lens, &v);
        const fi_variant *row = fi_variant_find(c.kind, c.variant);
        assert_non_null(row);
        const int32_t T = B * per;
        const int64_t cost = fi_variant_item_cost(row, kv, v.header->tile_rows < c.num_qo_heads / c.num_kv_heads
                                                               ? v.header->tile_rows
                                                               : c.num_qo_heads / c.num_kv_heads);
        int64_t budget = (T * cost + ctas - 1) / ctas;
        if (budget < (int64_t)row->min_chunk_tokens + row->kv_tile_tokens)
            budget = (int64_t)row->min_chunk_tokens + row->kv_tile_tokens;
        if (cost <= budget + row->cost_merge + row->cost_arrive) {
            wholes++;
            assert_int_equal(v.header->num_groups, 0);
            assert_int_equal(v.header->num_items, T);
            for (int32_t k = 0; k <= ctas; k++)
                assert_int_equal(v.work_indptr[k], k < T ? k : T);
        }
        if (it < 4) { /* one request 32x longer: its tile is cut */
            lens[0] = 32 * 4096 < P * PS ? 32 * 4096 : P * PS;
            const fi_batch bb = decode_batch(B, P, bt, lens);
            assert_int_equal(fi_plan_update(p, &bb, NULL), FI_OK);
            assert_int_equal(fi_plan_get_view(p, &v), FI_OK);
            assert_true(v.header->num_groups > 0);
        }
        fi_plan_destroy(p);
    }
    assert_true(wholes >= 4); /* the kv 4096 batches at least */
    free(bt);
    free(lens);
}

/* Rows 2 and 8 pack a batch of at most two tiles a CTA in pairs (planner/ppair.c): heads
 * 16 (a tile a request), long-tailed random lengths (1 to 2k, a quarter to 16k), random
 * CTAs and B up to twice them.  Every CTA holds one piece of a cut tile, one whole tile or
 * two whole tiles, and the largest costs at most the cap (the header's kv_chunk) plus a
 * grain (a piece's rounded ends); across the batches some CTAs hold pairs and some tiles
 * are cut.  The equal share breaks the first rule on such batches. */
static void parallel_rows_pack_small_batches_in_pairs(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 17};
    enum { P = 256, PS = 64, MAXB = 264 };
    int32_t *bt = malloc(sizeof(int32_t) * MAXB * P), *lens = malloc(sizeof(int32_t) * MAXB);
    assert_true(bt && lens);
    for (int i = 0; i < MAXB * P; i++)
        bt[i] = i;
    int pairs = 0, cut = 0;
    for (int it = 0; it < 80; it++) {
        fi_caps c = mla_caps(16, it & 1 ? 8 : 2);
        c.q_dtype = c.kv_dtype = it & 1 ? FI_DTYPE_E4M3 : FI_DTYPE_BF16;
        c.o_dtype = FI_DTYPE_BF16;
        c.num_ctas = tt_rng_int(&rng, 1, 132);
        const int32_t B = tt_rng_int(&rng, 1, 2 * c.num_ctas);
        c.max_batch = c.max_q_tokens = B;
        c.num_pages = MAXB * P;
        c.page_size = PS;
        for (int32_t b = 0; b < B; b++)
            lens[b] = tt_rng_int(&rng, 1, tt_rng_int(&rng, 0, 3) ? 2048 : 16384);
        const fi_batch bb = decode_batch(B, P, bt, lens);
        fi_plan *p = NULL;
        fi_plan_view v;
        assert_int_equal(fi_plan_create(&c, NULL, 0, NULL, &p), FI_OK);
        assert_int_equal(fi_plan_update(p, &bb, NULL), FI_OK);
        assert_int_equal(fi_plan_get_view(p, &v), FI_OK);
        const fi_variant *row = fi_variant_find(c.kind, c.variant);
        for (int32_t k = 0; k < c.num_ctas; k++) {
            const int32_t i0 = v.work_indptr[k], n_items = v.work_indptr[k + 1] - i0;
            if (n_items > 2 || (n_items == 2 && (v.items[i0].merge_group >= 0 ||
                                                 v.items[i0 + 1].merge_group >= 0)))
                fail_msg("seed %llu iter %d: CTA %d of %d holds %d items (groups %d, %d): not "
                         "a piece, a tile or a pair", (unsigned long long)g_seed, it, k,
                         c.num_ctas, n_items, v.items[i0].merge_group,
                         n_items > 1 ? v.items[i0 + 1].merge_group : -1);
            pairs += n_items == 2;
        }
        cut += v.header->num_groups > 0;
        if (v.header->max_cta_cost > (int64_t)v.header->kv_chunk + row->kv_tile_tokens)
            fail_msg("seed %llu iter %d: largest CTA %lld over the cap %d + a grain",
                     (unsigned long long)g_seed, it, (long long)v.header->max_cta_cost,
                     v.header->kv_chunk);
        fi_plan_destroy(p);
    }
    assert_true(pairs > 0 && cut > 0);
    free(bt);
    free(lens);
}

/* MLA decode in the INDPTR form takes query blocks of any length (the wrapper's
 * incremental prefill): 17, 128 and 1024 causal rows beside decode requests, heads 16 and
 * 128, the MLA bodies' rows (the 64-token wgmma one too) and the data-parallel ones,
 * random CTAs; every (row, visible key) once.  The BLOCK_TABLES form and GQA decode still stop at 8 rows. */
static void mla_indptr_long_query_blocks_are_covered(void **state) {
    (void)state;
    tt_rng rng = {g_seed + 13};
    const int32_t q[6] = {17, 1, 128, 3, 1024, 1};
    char msg[512];
    for (int it = 0; it < 20; it++) {
        fi_caps c;
        batchgen_caps(&rng, FI_KIND_MLA_DECODE, &c);
        c.num_qo_heads = it & 1 ? 128 : 16;
        c.variant = (int32_t[]){0, 4, 2, 5, 6}[(it >> 1) % 5];
        c.num_ctas = tt_rng_int(&rng, 1, 160);
        int32_t kv[6];
        for (int b = 0; b < 6; b++)
            kv[b] = q[b] + tt_rng_int(&rng, 0, 3000);
        batchgen_batch g;
        assert_int_equal(batchgen_from_lens(&rng, &c, FI_FORM_INDPTR, q, kv, 6, 0, 1, 1,
                                            it % 3 == 0 ? 700 : -1, &g), 0);
        fi_plan *p = NULL;
        assert_int_equal(fi_plan_create(&g.caps, NULL, 0, NULL, &p), FI_OK);
        assert_int_equal(fi_plan_update(p, &g.batch, NULL), FI_OK);
        const tt_plan_expect want = batchgen_expect(&g);
        if (tt_plan_check(p, &g.batch, &want, msg, sizeof msg) != 0)
            fail_msg("seed %llu iter %d: %s (%s)", (unsigned long long)g_seed, it, msg,
                     batchgen_describe(&g));
        fi_plan_destroy(p);
        batchgen_free(&g);
    }
    /* the other kinds' decode limit stays: 9 rows refused in GQA INDPTR and MLA BLOCK_TABLES */
    for (int k = 0; k < 2; k++) {
        fi_caps c;
        batchgen_caps(&rng, k ? FI_KIND_MLA_DECODE : FI_KIND_GQA_DECODE, &c);
        const int32_t q9[2] = {9, 9}, kv9[2] = {100, 200};
        batchgen_batch g;
        assert_int_equal(batchgen_from_lens(&rng, &c, k ? FI_FORM_BLOCK_TABLES : FI_FORM_INDPTR,
                                            q9, kv9, 2, 0, 1, 1, -1, &g), 0);
        fi_plan *p = NULL;
        assert_int_equal(fi_plan_create(&g.caps, NULL, 0, NULL, &p), FI_OK);
        assert_int_equal(fi_plan_update(p, &g.batch, NULL), FI_ERR_Q_LEN_UNSUPPORTED);
        fi_plan_destroy(p);
        batchgen_free(&g);
    }
}

/* fi_caps_parallel_variant: the data-parallel row that plans the caps' own row on the
 * device (the default row for variant 0), from the tile table; refusals leave *variant. */
static int32_t parallel_of(fi_caps c, fi_status want) {
    int32_t v = -7;
    assert_int_equal(fi_caps_parallel_variant(&c, &v), want);
    return v;
}

static void parallel_variant_follows_the_row(void **state) {
    (void)state;
    fi_caps m = {.kind = FI_KIND_MLA_DECODE, .max_batch = 128, .max_q_tokens = 128,
                 .num_pages = 4096, .page_size = 64, .num_qo_heads = 16, .num_kv_heads = 1,
                 .head_dim_qk = 576, .head_dim_vo = 512, .q_dtype = FI_DTYPE_BF16,
                 .kv_dtype = FI_DTYPE_BF16, .o_dtype = FI_DTYPE_BF16, .num_ctas = 132};
    assert_int_equal(parallel_of(m, FI_OK), 10); /* row 9, transposed 16-bit */
    m.max_q_tokens = 256; /* q_len 2: 32 rows */
    assert_int_equal(parallel_of(m, FI_OK), 2); /* row 0, mma.sync */
    m.max_q_tokens = 128;
    m.page_size = 32; /* row 9 from 64-token pages only */
    assert_int_equal(parallel_of(m, FI_OK), 2);
    m.page_size = 64;
    m.num_qo_heads = 32;
    assert_int_equal(parallel_of(m, FI_OK), 5); /* row 3, wgmma */
    m.num_qo_heads = 128;
    assert_int_equal(parallel_of(m, FI_OK), 5); /* row 6, the 64-token body */
    m.num_qo_heads = 16;
    m.q_dtype = m.kv_dtype = FI_DTYPE_E4M3;
    assert_int_equal(parallel_of(m, FI_OK), 8); /* row 7, transposed fp8 */
    m.page_size = 1;
    assert_int_equal(parallel_of(m, FI_OK), 8);
    m.max_q_tokens = 256; /* q_len 2: 32 rows, row 0 */
    assert_int_equal(parallel_of(m, FI_OK), 2);
    m.variant = 8; /* a parallel row answers itself */
    assert_int_equal(parallel_of(m, FI_OK), 8);
    m.variant = 4;
    assert_int_equal(parallel_of(m, FI_OK), 2);
    m.variant = 1; /* mla_decode_rows32: none */
    assert_int_equal(parallel_of(m, FI_ERR_UNSUPPORTED_VARIANT), -7);
    m.variant = 99;
    assert_int_equal(parallel_of(m, FI_ERR_UNSUPPORTED_VARIANT), -7);
    fi_caps g = {.kind = FI_KIND_GQA_DECODE, .max_batch = 128, .max_q_tokens = 128,
                 .num_pages = 4096, .page_size = 16, .num_qo_heads = 32, .num_kv_heads = 8,
                 .head_dim_qk = 128, .head_dim_vo = 128, .q_dtype = FI_DTYPE_BF16,
                 .kv_dtype = FI_DTYPE_BF16, .o_dtype = FI_DTYPE_BF16, .num_ctas = 132};
    assert_int_equal(parallel_of(g, FI_OK), 4); /* 4 rows a request: rows-8 row */
    g.max_q_tokens = 384;                       /* q_len 3: 12 rows */
    assert_int_equal(parallel_of(g, FI_OK), 1);
    g.variant = 2;
    assert_int_equal(parallel_of(g, FI_OK), 4);
    g.variant = 3;
    assert_int_equal(parallel_of(g, FI_OK), 1);
    g.num_kv_heads = 5; /* 32 % 5: invalid caps, fi_caps_validate's status */
    assert_int_equal(parallel_of(g, FI_ERR_INVALID_CAPS), -7);
    int32_t v = -7;
    assert_int_equal(fi_caps_parallel_variant(NULL, &v), FI_ERR_NULL_ARGUMENT);
    assert_int_equal(fi_caps_parallel_variant(&m, NULL), FI_ERR_NULL_ARGUMENT);
    assert_int_equal(v, -7);
}

/* caps.variant 0 picks the kind's default row by heads (plan/variant.h fi_variant_select):
 * MLA decode, the mma.sync row below 32 heads, the wgmma row from 32 on, and for a 16-bit
 * cache of page_size >= 64 the 64-token wgmma row from 128 on (an fp8 cache or smaller
 * pages stay on the wgmma row; at every head count a sparse plan takes the wgmma row; q
 * and cache fp8 with requests of at most 16 rows take the transposed fp8 row 7); a
 * number picks its row whatever the heads; GQA, the rows-8 row while the caps bound a
 * request to 8 rows (group x ceil(max_q_tokens / max_batch)), else the 64-row one. */
static void default_variant_follows_heads(void **state) {
    (void)state;
    const int32_t heads[] = {1, 16, 31, 32, 64, 128};
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        const fi_variant *v = fi_variant_select(FI_KIND_MLA_DECODE, 0, heads[i], 0, 64, 0, 0);
        assert_non_null(v);
        assert_string_equal(v->name, heads[i] >= 128 ? "mla_decode_wgmma64"
                                     : heads[i] >= 32 ? "mla_decode_wgmma" : "mla_decode");
        /* an fp8 cache (0), a 16-bit one of page_size 32 */
        assert_string_equal(fi_variant_select(FI_KIND_MLA_DECODE, 0, heads[i], 0, 0, 0, 0)->name,
                            heads[i] >= 32 ? "mla_decode_wgmma" : "mla_decode");
        assert_string_equal(fi_variant_select(FI_KIND_MLA_DECODE, 0, heads[i], 0, 32, 0, 0)->name,
                            heads[i] >= 32 ? "mla_decode_wgmma" : "mla_decode");
        assert_string_equal(fi_variant_select(FI_KIND_MLA_DECODE, 4, heads[i], 0, 64, 0, 0)->name, "mla_decode_mma");
        assert_string_equal(fi_variant_select(FI_KIND_MLA_DECODE, 2, heads[i], 0, 64, 0, 0)->name,
                            "mla_decode_parallel_plan");
        assert_string_equal(fi_variant_select(FI_KIND_GQA_DECODE, 0, heads[i], 0, 64, 0, 0)->name, "gqa_decode");
    }
    assert_null(fi_variant_select(FI_KIND_MLA_DECODE, 99, 128, 0, 64, 0, 0));
    /* a sparse plan: the wgmma row at every head count (the mma.sync body has no sparse
     * path); a numbered variant still wins; GQA unaffected */
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        assert_string_equal(fi_variant_select(FI_KIND_MLA_DECODE, 0, heads[i], 1, 64, 0, 0)->name, "mla_decode_wgmma");
        assert_string_equal(fi_variant_select(FI_KIND_MLA_DECODE, 4, heads[i], 1, 64, 0, 0)->name, "mla_decode_mma");
        assert_string_equal(fi_variant_select(FI_KIND_GQA_DECODE, 0, heads[i], 1, 64, 0, 0)->name, "gqa_decode");
    }
    fi_caps c = {.kind = FI_KIND_MLA_DECODE, .num_qo_heads = 16, .kv_dtype = FI_DTYPE_E4M3};
    assert_string_equal(fi_variant_of(&c)->name, "mla_decode"); /* fp8 at heads 16: mma.sync */
    c.num_qo_heads = 32;
    assert_string_equal(fi_variant_of(&c)->name, "mla_decode_wgmma");
    c.num_qo_heads = 128;
    c.page_size = 64;
    assert_string_equal(fi_variant_of(&c)->name, "mla_decode_wgmma"); /* no fp8 path in row 6 */
    c.kv_dtype = FI_DTYPE_F16;
    assert_string_equal(fi_variant_of(&c)->name, "mla_decode_wgmma64");
    c.page_size = 16;
    assert_string_equal(fi_variant_of(&c)->name, "mla_decode_wgmma"); /* row 6 copies by cp.async */
    c.page_size = 128;
    c.sparse_top_k = 2048;
    assert_string_equal(fi_variant_of(&c)->name, "mla_decode_wgmma"); /* sparse: row 3 */
    c.sparse_top_k = 0;
    c.num_qo_heads = 16;
    c.kv_dtype = FI_DTYPE_BF16;
    assert_string_equal(fi_variant_of(&c)->name, "mla_decode");
    c.sparse_top_k = 2048;
    assert_string_equal(fi_variant_of(&c)->name, "mla_decode_wgmma");
    /* q and cache fp8 with requests of at most 16 rows (heads x ceil(max_q_tokens /
     * max_batch)), on every page size: the transposed fp8 row 7; more rows, a 16-bit q, a
     * sparse plan or a numbered variant: as before */
    fi_caps f = {.kind = FI_KIND_MLA_DECODE, .num_qo_heads = 16, .num_kv_heads = 1,
                 .q_dtype = FI_DTYPE_E4M3, .kv_dtype = FI_DTYPE_E4M3, .page_size = 64,
                 .max_batch = 128, .max_q_tokens = 128};
    assert_string_equal(fi_variant_of(&f)->name, "mla_decode_fp8_rows16");
    f.page_size = 1;
    assert_string_equal(fi_variant_of(&f)->name, "mla_decode_fp8_rows16");
    f.page_size = 16;
    assert_string_equal(fi_variant_of(&f)->name, "mla_decode_fp8_rows16");
    f.max_q_tokens = 256; /* q_len 2: 32 rows */
    assert_string_equal(fi_variant_of(&f)->name, "mla_decode");
    f.max_q_tokens = 128;
    f.num_qo_heads = 8;
    assert_string_equal(fi_variant_of(&f)->name, "mla_decode_fp8_rows16");
    f.num_qo_heads = 32;
    assert_string_equal(fi_variant_of(&f)->name, "mla_decode_wgmma");
    f.num_qo_heads = 16;
    f.q_dtype = FI_DTYPE_BF16;
    assert_string_equal(fi_variant_of(&f)->name, "mla_decode");
    f.q_dtype = FI_DTYPE_E4M3;
    f.sparse_top_k = 64;
    assert_string_equal(fi_variant_of(&f)->name, "mla_decode_wgmma");
    f.sparse_top_k = 0;
    f.variant = 4;
    assert_string_equal(fi_variant_of(&f)->name, "mla_decode_mma");
    assert_string_equal(fi_variant_select(FI_KIND_MLA_DECODE, 0, 16, 0, 0, 16, 1)->name,
                        "mla_decode_fp8_rows16");
    assert_string_equal(fi_variant_select(FI_KIND_MLA_DECODE, 0, 16, 0, 0, 17, 1)->name, "mla_decode");
    assert_string_equal(fi_variant_select(FI_KIND_MLA_DECODE, 0, 16, 0, 0, 16, 0)->name, "mla_decode");
    assert_string_equal(fi_variant_select(FI_KIND_MLA_DECODE, 0, 16, 0, 0, 0, 1)->name, "mla_decode");
    assert_string_equal(fi_variant_select(FI_KIND_GQA_DECODE, 0, 32, 0, 0, 4, 1)->name, "gqa_decode_rows8");
    /* GQA: rows a request = group x ceil(max_q_tokens / max_batch); up to 8 the rows-8 row */
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        assert_string_equal(fi_variant_select(FI_KIND_GQA_DECODE, 0, heads[i], 0, 64, 8, 0)->name,
                            "gqa_decode_rows8");
        assert_string_equal(fi_variant_select(FI_KIND_GQA_DECODE, 0, heads[i], 0, 64, 9, 0)->name,
                            "gqa_decode");
        assert_string_equal(fi_variant_select(FI_KIND_GQA_DECODE, 3, heads[i], 0, 64, 1, 0)->name,
                            "gqa_decode_rows64");
    }
    fi_caps g = {.kind = FI_KIND_GQA_DECODE, .num_qo_heads = 32, .num_kv_heads = 8,
                 .max_batch = 128, .max_q_tokens = 256}; /* group 4, depth 2: 8 rows */
    assert_string_equal(fi_variant_of(&g)->name, "gqa_decode_rows8");
    assert_int_equal(fi_variant_request_rows(&g), 8);
    g.max_q_tokens = 257; /* the mean depth rounds up to 3: 12 rows */
    assert_string_equal(fi_variant_of(&g)->name, "gqa_decode");
    g.max_q_tokens = 100; /* fewer tokens than requests: depth 1 */
    assert_int_equal(fi_variant_request_rows(&g), 4);
    g.num_qo_heads = 72; /* group 9 */
    assert_string_equal(fi_variant_of(&g)->name, "gqa_decode");
    g.variant = 2;
    assert_string_equal(fi_variant_of(&g)->name, "gqa_decode_rows8");
    g.max_batch = 0; /* the caps check refuses it; the row then follows the number alone */
    g.variant = 0;
    assert_int_equal(fi_variant_request_rows(&g), 0);
    assert_string_equal(fi_variant_of(&g)->name, "gqa_decode");
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
        cmocka_unit_test(parallel_variant_follows_the_row),
        cmocka_unit_test(plan_covers_every_kv_token_once_parallel_partition),
        cmocka_unit_test(plan_covers_every_kv_token_once_gqa_rows8),
        cmocka_unit_test(plan_with_one_cta_never_splits),
        cmocka_unit_test(mla_head_chunks_of_a_request_run_side_by_side),
        cmocka_unit_test(gqa_kv_heads_of_a_request_run_side_by_side),
        cmocka_unit_test(default_variant_follows_heads),
        cmocka_unit_test(mla_indptr_long_query_blocks_are_covered),
        cmocka_unit_test(parallel_partition_gives_small_uniform_batches_whole_tiles),
        cmocka_unit_test(parallel_rows_pack_small_batches_in_pairs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
