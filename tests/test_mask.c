/*
 * tests/test_mask.c - plan/mask.h against the mask rule written out key by key
 * (docs/DESIGN.md section 7): query row i of q_len rows sits at p = kv_len - q_len + i and
 * sees key j when j <= p (causal only) and j >= p - window_left (window_left >= 0 only).
 * Random (q_len, kv_len, causal, window_left) each run, seed printed (FI_TEST_SEED replays).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "common/rng.h"
#include "plan/mask.h"

static uint64_t g_seed;

/* The rule for one key, straight from its definition. */
static int tt_sees(int32_t causal, int32_t window_left, int32_t q_len, int32_t kv_len,
                   int32_t i, int32_t j) {
    const int64_t p = (int64_t)kv_len - q_len + i;
    if (j < 0 || j >= kv_len)
        return 0;
    if (causal && j > p)
        return 0;
    if (window_left >= 0 && j < p - window_left)
        return 0;
    return 1;
}

/* A random case: lengths around the edges (0, 1, q_len == kv_len) as well as at random. */
typedef struct mask_case {
    int32_t causal, window_left, q_len, kv_len;
} mask_case;

static mask_case tt_random_case(tt_rng *rng) {
    mask_case c;
    c.causal = tt_rng_int(rng, 0, 1);
    c.q_len = tt_rng_int(rng, 1, 40);
    switch (tt_rng_int(rng, 0, 3)) {
    case 0: c.kv_len = tt_rng_int(rng, 0, 2); break;
    case 1: c.kv_len = c.q_len; break;
    default: c.kv_len = tt_rng_int(rng, 0, 300); break;
    }
    c.window_left = tt_rng_int(rng, 0, 2) == 0 ? -1 : tt_rng_int(rng, 0, 80);
    return c;
}

/* fi_row_kv_range gives exactly the keys the rule lets row i see. */
static void row_range_matches_the_rule(void **state) {
    (void)state;
    tt_rng rng = {g_seed};
    for (int it = 0; it < 20000; it++) {
        const mask_case c = tt_random_case(&rng);
        for (int32_t i = 0; i < c.q_len; i++) {
            int32_t lo = -7, hi = -7;
            fi_row_kv_range(c.causal, c.window_left, c.q_len, c.kv_len, i, &lo, &hi);
            if (lo > hi || lo < 0 || hi > (c.kv_len > 0 ? c.kv_len : 0))
                fail_msg("seed %llu: causal %d window %d q_len %d kv_len %d row %d: [%d, %d)",
                         (unsigned long long)g_seed, c.causal, c.window_left, c.q_len, c.kv_len,
                         i, lo, hi);
            for (int32_t j = -1; j <= c.kv_len; j++) {
                const int in_range = j >= lo && j < hi;
                if (in_range != tt_sees(c.causal, c.window_left, c.q_len, c.kv_len, i, j))
                    fail_msg("seed %llu: causal %d window %d q_len %d kv_len %d row %d key %d: "
                             "range [%d, %d) says %d",
                             (unsigned long long)g_seed, c.causal, c.window_left, c.q_len,
                             c.kv_len, i, j, lo, hi, in_range);
            }
        }
    }
}

/* fi_tile_kv_range over rows [q_begin, q_end) is the union of those rows' keys, (0, 0)
 * when empty, for the lengths validation admits (causal: kv_len 0 or kv_len >= q_len). */
static void tile_range_is_the_union_of_its_rows(void **state) {
    (void)state;
    tt_rng rng = {g_seed ^ 0x5bd1e995u};
    for (int it = 0; it < 20000; it++) {
        mask_case c = tt_random_case(&rng);
        if (c.causal && c.kv_len > 0 && c.kv_len < c.q_len)
            c.kv_len = c.q_len + tt_rng_int(&rng, 0, 50);
        const int32_t q_begin = tt_rng_int(&rng, 0, c.q_len - 1);
        const int32_t q_end = tt_rng_int(&rng, q_begin + 1, c.q_len);
        int32_t lo = -7, hi = -7;
        fi_tile_kv_range(c.causal, c.window_left, c.q_len, c.kv_len, q_begin, q_end, &lo, &hi);
        int32_t want_lo = 0, want_hi = 0, any = 0;
        for (int32_t j = 0; j < c.kv_len; j++) {
            int seen = 0;
            for (int32_t i = q_begin; i < q_end && !seen; i++)
                seen = tt_sees(c.causal, c.window_left, c.q_len, c.kv_len, i, j);
            if (seen && !any)
                want_lo = j;
            if (seen) {
                if (any && j != want_hi)
                    fail_msg("seed %llu: the union has a hole at key %d",
                             (unsigned long long)g_seed, j);
                want_hi = j + 1;
                any = 1;
            }
        }
        if (lo != want_lo || hi != want_hi)
            fail_msg("seed %llu: causal %d window %d q_len %d kv_len %d rows [%d, %d): "
                     "[%d, %d), want [%d, %d)",
                     (unsigned long long)g_seed, c.causal, c.window_left, c.q_len, c.kv_len,
                     q_begin, q_end, lo, hi, want_lo, want_hi);
    }
}

int main(void) {
    g_seed = tt_test_seed();
    printf("test_mask: FI_TEST_SEED=%llu\n", (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(row_range_matches_the_rule),
        cmocka_unit_test(tile_range_is_the_union_of_its_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
