/*
 * tests/gpu/test_mla_gpu.c - the CUDA MLA decode executor (fi_run) against the naive fp64
 * reference (fi_naive_attention), on the GPU machine.  Every test skips without a device.
 *
 * Fresh random inputs each run; the seed is printed and FI_TEST_SEED=<seed> replays it.
 * Outputs are poisoned with NaN before each run; a NaN left anywhere fails (full coverage).
 * Tolerance: per (token, head) row ||out - ref|| / ||ref|| <= 1e-2 (bf16 and fp16 inputs).
 * Cases planned through the public API only (caps.num_ctas picks the CTAs, the planner
 * the splits; tests that need splits assert the plan has them).  The sweeps, the split
 * variants and the keyless batch also run each case twice, without and with PDL, and
 * require bitwise-identical outputs.
 *
 * Run one test only (e.g. under compute-sanitizer; the two small split tests are what
 * scripts/gpu_check.sh gives memcheck and racecheck):
 *   FI_GPU_TEST_FILTER=sanitize_small_case compute-sanitizer --tool memcheck \
 *       build/tests/gpu/test_mla_gpu
 *   FI_GPU_TEST_FILTER=mla_split_merge_matches_reference_few_and_many_ctas ...
 * (the filter is a cmocka glob over test names).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gpu/mla_gpu_case.h"
#include "viz/trace.h"

#define TOL 1e-2
#define MSG 512

static uint64_t g_seed;

#define REQUIRE_GPU()                                                                       \
    do {                                                                                    \
        if (!mla_gpu_available()) {                                                         \
            print_message("no CUDA device: skipped\n");                                      \
            skip();                                                                         \
        }                                                                                   \
    } while (0)

/* Fresh generator per test, derived from the printed seed and the test's own tag, so a
 * single test replays alone with FI_TEST_SEED. */
static tt_rng test_rng(uint64_t tag) {
    tt_rng r = {g_seed ^ (tag * 0x9e3779b97f4a7c15ull)};
    tt_rng_next(&r);
    return r;
}

static mla_opts default_opts(int32_t heads, int32_t page_size, fi_batch_form form) {
    mla_opts o;
    memset(&o, 0, sizeof o);
    o.dtype = FI_DTYPE_BF16;
    o.heads = heads;
    o.page_size = page_size;
    o.form = form;
    o.return_lse = 1;
    return o;
}

/* kv_len for request b of a decode batch: 0 (only when allow_zero: non-causal, where a
 * request may have fewer keys than query rows), 1, page boundaries (ps - 1, ps, ps + 1,
 * 2 ps), or uniform up to max_kv.  Causal requests get at least q_len keys. */
static int32_t pick_kv_len(tt_rng *r, int32_t b, int32_t q_len, int32_t ps, int32_t max_kv,
                           int allow_zero) {
    int32_t v;
    switch (b % 6) {
    case 0: v = allow_zero ? 0 : q_len; break;
    case 1: v = 1; break;
    case 2: v = ps - 1 + tt_rng_int(r, 0, 2); break;
    case 3: v = 2 * ps; break;
    default: v = tt_rng_int(r, 1, max_kv); break;
    }
    if (!allow_zero && v < q_len) v = q_len;
    return v;
}

/* What a case's plan asks of the executor: merge groups, the most pieces of one group,
 * CTAs that run more than one item. */
typedef struct split_stats {
    int32_t groups, max_splits, multi_item_ctas;
} split_stats;

static split_stats plan_split_stats(const mla_case *c) {
    split_stats s = {0, 0, 0};
    fi_plan_view v;
    if (fi_plan_get_view(c->plan, &v) != FI_OK) return s;
    s.groups = v.header->num_groups;
    for (int32_t g = 0; g < s.groups; g++)
        if (v.groups[g].num_splits > s.max_splits) s.max_splits = v.groups[g].num_splits;
    for (int32_t k = 0; k < v.num_ctas; k++)
        s.multi_item_ctas += v.work_indptr[k + 1] - v.work_indptr[k] > 1;
    return s;
}

/* Run c once, or twice (runs 2: without, then with PDL; the two outputs and lse must be
 * bitwise identical), then compare the last run with the fp64 reference.  0, or -1 and
 * the first difference in msg. */
static int verify_case(mla_case *c, int runs, double *wo, double *wl, char *msg, size_t cap) {
    uint16_t *o1 = NULL;
    float *l1 = NULL;
    int bad = mla_case_run(c, msg, cap) || mla_case_download(c, msg, cap);
    if (!bad && runs > 1) {
        o1 = malloc(c->out_bytes);
        l1 = malloc(c->lse_bytes);
        if (!o1 || !l1) {
            mla_msg(msg, cap, "host allocation failed");
            bad = 1;
        } else {
            memcpy(o1, c->h_out, c->out_bytes);
            memcpy(l1, c->h_lse, c->lse_bytes);
            fi_attn_args a = mla_case_args(c, 1);
            a.enable_pdl = 1;
            bad = mla_case_run_args(c, &a, msg, cap) || mla_case_download(c, msg, cap);
            if (!bad && (memcmp(o1, c->h_out, c->out_bytes) != 0 ||
                         memcmp(l1, c->h_lse, c->lse_bytes) != 0)) {
                mla_msg(msg, cap, "a second run (PDL on) is not bitwise identical to the first");
                bad = 1;
            }
        }
    }
    free(o1);
    free(l1);
    if (!bad) bad = mla_case_reference(c, msg, cap);
    if (!bad) bad = mla_case_compare(c, 0, c->B, TOL, wo, wl, msg, cap);
    return bad ? -1 : 0;
}

/* verify_case, print the case and its errors; on failure free c and fail the test. */
static void check_case(mla_case *c, int runs) {
    char msg[MSG], name[MSG];
    mla_case_name(c, name, sizeof name);
    double wo = 0, wl = 0;
    int bad = verify_case(c, runs, &wo, &wl, msg, sizeof msg);
    print_message("  %s: out err %.2e lse err %.2e%s\n", name, wo, wl, bad ? " FAILED" : "");
    if (bad) {
        mla_case_free(c);
        fail_msg("%s: %s", name, msg);
    }
}

/* Build one case, check it (two runs, PDL off and on), return its plan's split figures. */
static split_stats run_and_check(const mla_opts *o, const int32_t *q_len,
                                 const int32_t *kv_len, int32_t n, tt_rng *rng) {
    mla_case c;
    char msg[MSG];
    if (mla_case_init(&c, o, q_len, kv_len, n, rng, msg, sizeof msg)) fail_msg("init: %s", msg);
    split_stats s = plan_split_stats(&c);
    check_case(&c, 2);
    mla_case_free(&c);
    return s;
}

/* ---- every shape: heads x page sizes x q_len, both forms, every option --------------- */

/* One case per (heads, page size, q_len); the options rotate over the case index so each
 * is on and off across the sweep and within every head count: concatenated / split caches
 * (form), sinks, lse, scales by pointer (parities of mixed index bits); CTAs (the device's
 * count, or 2..25 so tiles are cut into merged pieces and CTAs run several items);
 * window_left (none, or 0, 37, a page + 1, 250); page ids shuffled or in request order;
 * causal, or not (then requests without keys occur, and MTP rows see every key); kv_len
 * up to 600, or 2000 on the few CTAs. */
static void sweep(fi_dtype dt, const int32_t *heads, int nh, const int32_t *pss, int nps,
                  int32_t max_q_len, int require_paths, uint64_t tag) {
    tt_rng rng = test_rng(tag);
    int idx = 0, n_split = 0, n_multi = 0, n_empty = 0;
    for (int ih = 0; ih < nh; ih++)
        for (int ip = 0; ip < nps; ip++)
            for (int32_t ql = 1; ql <= max_q_len; ql++, idx++) {
                int form = (idx ^ (idx >> 2)) & 1;
                mla_opts o = default_opts(heads[ih], pss[ip],
                                          form ? FI_FORM_INDPTR : FI_FORM_BLOCK_TABLES);
                o.dtype = dt;
                o.causal = ql > 1 && idx % 5 != 0;
                o.sinks = ((idx >> 1) ^ (idx >> 2)) & 1;
                o.return_lse = (((idx >> 3) ^ idx) & 1) == 0;
                o.scale_ptr = ((idx >> 4) ^ (idx >> 1)) & 1;
                o.num_ctas = idx % 3 == 0 ? 0 : 2 + (idx * 7) % 24;
                if (idx % 4 == 1) {
                    const int32_t wins[4] = {0, 37, pss[ip] + 1, 250};
                    o.windowed = 1;
                    o.window_left = wins[(idx / 4) % 4];
                }
                o.contig_pages = idx % 5 == 2;
                int32_t B = heads[ih] >= 128 ? tt_rng_int(&rng, 3, 4) : tt_rng_int(&rng, 3, 8);
                int32_t q[8], kv[8];
                for (int32_t b = 0; b < B; b++) {
                    q[b] = ql;
                    kv[b] = pick_kv_len(&rng, b, ql, pss[ip], o.num_ctas ? 2000 : 600,
                                        !o.causal);
                    n_empty += kv[b] == 0;
                }
                split_stats s = run_and_check(&o, q, kv, B, &rng);
                n_split += s.groups > 0;
                n_multi += s.multi_item_ctas > 0;
            }
    print_message("  %d cases: %d with merged splits, %d with CTAs running several items, "
                  "%d requests without keys\n", idx, n_split, n_multi, n_empty);
    /* the sweep is there for these paths too: a planner change must not remove them (the
     * 64-case sweep has 14+ of each; the 16-case one only prints its counts) */
    if (require_paths) {
        assert_true(n_split > 0);
        assert_true(n_multi > 0);
        assert_true(n_empty > 0);
    }
}

static void mla_bf16_matches_reference_every_shape(void **state) {
    (void)state;
    REQUIRE_GPU();
    const int32_t heads[] = {16, 32, 64, 128}, pss[] = {1, 16, 32, 64};
    sweep(FI_DTYPE_BF16, heads, 4, pss, 4, 4, 1, 1);
}

static void mla_f16_matches_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    const int32_t heads[] = {16, 32, 64, 128}, pss[] = {16, 64};
    sweep(FI_DTYPE_F16, heads, 4, pss, 2, 2, 0, 2);
}

/* ---- the wrapper's causal incremental prefill, INDPTR form, q_len up to 8 ------------- */

static void mla_indptr_causal_prefill_matches_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = test_rng(3);
    const int32_t heads[] = {16, 128}, pss[] = {1, 64};
    for (int ih = 0; ih < 2; ih++)
        for (int ip = 0; ip < 2; ip++)
            for (int causal = 0; causal <= 1; causal++) {
                mla_opts o = default_opts(heads[ih], pss[ip], FI_FORM_INDPTR);
                o.causal = causal;
                o.sinks = causal;
                int32_t B = tt_rng_int(&rng, 3, heads[ih] >= 128 ? 4 : 7);
                int32_t q[8], kv[8];
                for (int32_t b = 0; b < B; b++) {
                    q[b] = b == 0 ? 8 : tt_rng_int(&rng, 1, 8);
                    kv[b] = q[b] + (b == 1 ? 0 : tt_rng_int(&rng, 0, 590));
                }
                run_and_check(&o, q, kv, B, &rng);
            }
}

/* ---- split-k: few and many CTAs, merges must happen and be exact ------------------------ */

/* Case under options o with B (<= 8) requests of q_len rows and kv_len in [kv_lo, kv_hi]
 * (request 0 without keys when empty_first), long enough for the planner to split; fails
 * unless one merge group of the plan has at least min_splits (>= 2) pieces. */
static void split_case_opts(mla_case *c, const mla_opts *o, int32_t B, int32_t q_len,
                            int32_t kv_lo, int32_t kv_hi, int empty_first, int32_t min_splits,
                            tt_rng *rng) {
    int32_t q[8], kv[8];
    assert_true(B >= 1 && B <= 8 && (!empty_first || !o->causal));
    for (int32_t b = 0; b < B; b++) {
        q[b] = q_len;
        kv[b] = b == 0 && empty_first ? 0 : tt_rng_int(rng, kv_lo, kv_hi);
    }
    char msg[MSG];
    if (mla_case_init(c, o, q, kv, B, rng, msg, sizeof msg)) fail_msg("init: %s", msg);
    split_stats s = plan_split_stats(c);
    if (s.groups <= 0 || s.max_splits < min_splits) {
        char name[MSG];
        mla_case_name(c, name, sizeof name);
        mla_case_free(c);
        fail_msg("%s: the plan's largest merge group has %d pieces (%d groups); the test "
                 "needs %d", name, s.max_splits, s.groups, min_splits);
    }
}

/* The bf16 concatenated-cache split case of the tests below (page size 32, sinks). */
static void split_case(mla_case *c, int32_t num_ctas, int32_t heads, int32_t B, int32_t q_len,
                       int32_t kv_lo, int32_t kv_hi, tt_rng *rng) {
    mla_opts o = default_opts(heads, 32, FI_FORM_BLOCK_TABLES);
    o.num_ctas = num_ctas;
    o.causal = q_len > 1;
    o.sinks = 1;
    split_case_opts(c, &o, B, q_len, kv_lo, kv_hi, 0, 2, rng);
}

static void mla_split_merge_matches_reference_few_and_many_ctas(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = test_rng(4);
    mla_case c;
    split_case(&c, 8, 16, 3, 1, 1500, 2500, &rng);      /* 3 tiles on 8 CTAs */
    check_case(&c, 1);
    mla_case_free(&c);
    split_case(&c, 8, 64, 3, 2, 1500, 3000, &rng);      /* MTP, 2 tiles per request */
    check_case(&c, 1);
    mla_case_free(&c);
    split_case(&c, 132, 16, 1, 1, 3000, 4000, &rng);    /* batch 1: split-k decides */
    check_case(&c, 1);
    mla_case_free(&c);
    split_case(&c, 132, 128, 2, 4, 1000, 3000, &rng);
    check_case(&c, 1);
    mla_case_free(&c);
}

/* ---- split-k in every layout and option: few pieces, and many pieces per group --------- */

typedef struct split_variant {
    fi_dtype dtype;
    fi_batch_form form;          /* BLOCK_TABLES: concatenated caches; INDPTR: split ones */
    int32_t heads, page_size, q_len, B, kv_lo, kv_hi;
    int32_t num_ctas;            /* 0: the device's count */
    int32_t causal, window_left; /* window_left -1: none */
    int32_t sinks, lse, scale_ptr, contig_pages;
    int32_t empty_first;         /* request 0 without keys (non-causal only) */
    int32_t min_splits;          /* the plan must cut one tile into at least this many */
} split_variant;

#define BT FI_FORM_BLOCK_TABLES
#define IP FI_FORM_INDPTR
#define BF FI_DTYPE_BF16
#define HF FI_DTYPE_F16
static const split_variant SPLIT_VARIANTS[] = {
    /* dtype form  H  ps  q  B  kv_lo kv_hi ctas causal win sinks lse sptr contig empty min */
    /* two long requests, 64-row tiles (one q row x 64 heads), 5+ pieces: merged by every
     * CTA of the group (pieces x rows > 256, docs/DESIGN.md section 9) */
    {BF, BT, 128, 64, 2, 2, 3000, 5000, 0, 1, -1, 1, 1, 1, 0, 0, 5},
    /* one request over every CTA, split caches, no sinks, non-causal; 17+ pieces of 16
     * rows: the cooperative merge too */
    {HF, IP, 16, 16, 1, 1, 20000, 30000, 0, 0, -1, 0, 1, 0, 0, 0, 17},
    /* page size 1, a window inside the request, no lse, request-ordered pages, 9 CTAs */
    {BF, IP, 64, 1, 3, 2, 1500, 3000, 9, 1, 1000, 1, 0, 0, 1, 0, 2},
    /* non-causal MTP, request 0 without keys next to split ones, 11 CTAs */
    {HF, BT, 32, 32, 4, 4, 800, 2000, 11, 0, -1, 0, 1, 1, 1, 1, 2},
    /* a window on non-causal rows (keys [p - 700, kv_len)), every CTA */
    {BF, BT, 128, 16, 1, 5, 1000, 3000, 0, 0, 700, 1, 1, 0, 0, 1, 4},
    /* heads 16 x q_len 2 (32-row tiles), a window across pages, every CTA */
    {HF, IP, 16, 64, 2, 6, 2000, 4000, 0, 1, 1000, 1, 1, 1, 1, 0, 4},
};
#undef BT
#undef IP
#undef BF
#undef HF

static void mla_split_variants_match_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = test_rng(11);
    for (size_t i = 0; i < sizeof SPLIT_VARIANTS / sizeof SPLIT_VARIANTS[0]; i++) {
        const split_variant *sv = &SPLIT_VARIANTS[i];
        mla_opts o = default_opts(sv->heads, sv->page_size, sv->form);
        o.dtype = sv->dtype;
        o.num_ctas = sv->num_ctas;
        o.causal = sv->causal;
        o.windowed = sv->window_left >= 0;
        o.window_left = sv->window_left;
        o.sinks = sv->sinks;
        o.return_lse = sv->lse;
        o.scale_ptr = sv->scale_ptr;
        o.contig_pages = sv->contig_pages;
        mla_case c;
        split_case_opts(&c, &o, sv->B, sv->q_len, sv->kv_lo, sv->kv_hi, sv->empty_first,
                        sv->min_splits, &rng);
        check_case(&c, 2);
        mla_case_free(&c);
    }
}

/* ---- a batch without keys: zeros, and lse -inf or the sink -------------------------------- */

static void mla_keyless_batch_writes_zeros_and_sink_lse(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = test_rng(10);
    for (int k = 0; k < 8; k++) {
        /* heads 16 q_len 1 and heads 64 q_len 2, both forms, sinks off and on */
        mla_opts o = default_opts(k & 1 ? 64 : 16, 16,
                                  k & 2 ? FI_FORM_INDPTR : FI_FORM_BLOCK_TABLES);
        o.sinks = (k >> 2) & 1;
        o.scale_ptr = k == 5;
        o.num_ctas = 5;
        int32_t q[4], kv[4];
        for (int32_t b = 0; b < 4; b++) {
            q[b] = 1 + (k & 1);
            kv[b] = 0;
        }
        run_and_check(&o, q, kv, 4, &rng);
    }
}

/* ---- determinism ---------------------------------------------------------------------- */

static void mla_same_inputs_give_bitwise_identical_outputs(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = test_rng(5);
    mla_case c;
    split_case(&c, 132, 32, 2, 2, 2000, 4000, &rng);
    char msg[MSG];
    uint16_t *o1 = malloc(c.out_bytes);
    float *l1 = malloc(c.lse_bytes);
    assert_non_null(o1);
    assert_non_null(l1);
    int bad = mla_case_run(&c, msg, sizeof msg) || mla_case_download(&c, msg, sizeof msg);
    if (!bad) {
        memcpy(o1, c.h_out, c.out_bytes);
        memcpy(l1, c.h_lse, c.lse_bytes);
        /* re-plan the same batch (must be byte-identical) and run again */
        fi_status st = fi_plan_update(c.plan, &c.fb.batch, c.stream);
        if (st != FI_OK) {
            mla_msg(msg, sizeof msg, "second fi_plan_update: %s", fi_status_name(st));
            bad = 1;
        }
    }
    if (!bad) bad = mla_case_run(&c, msg, sizeof msg) || mla_case_download(&c, msg, sizeof msg);
    int same_o = !bad && memcmp(o1, c.h_out, c.out_bytes) == 0;
    int same_l = !bad && memcmp(l1, c.h_lse, c.lse_bytes) == 0;
    free(o1);
    free(l1);
    mla_case_free(&c);
    if (bad) fail_msg("%s", msg);
    assert_true(same_o);
    assert_true(same_l);
}

/* ---- CUDA graph decode loop driven by the bundled trace --------------------------------- */

#define LOOP_B 8
#define LOOP_STEPS 64
#define LOOP_H 16
#define LOOP_PS 32
#define LOOP_MAX_KV 3000 /* keeps the fp64 reference of 64 steps to seconds */

static void shuffle_row(int32_t *row, int32_t P, int32_t first_page, tt_rng *rng) {
    for (int32_t j = 0; j < P; j++) row[j] = first_page + j;
    for (int32_t j = P - 1; j > 0; j--) {
        int32_t k = tt_rng_int(rng, 0, j), t = row[j];
        row[j] = row[k];
        row[k] = t;
    }
}

static void mla_graph_decode_loop_follows_trace_every_step(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = test_rng(6);
    fitrace *tr = NULL;
    assert_int_equal(fitrace_load_default(NULL, &tr), FITRACE_OK);

    /* All 64 steps' lengths up front: pick a start row whose requests stay <= LOOP_MAX_KV
     * and where at least one request finishes and is replaced within the 64 steps. */
    static int32_t kv[LOOP_STEPS][LOOP_B], src[LOOP_STEPS][LOOP_B];
    int32_t ql[LOOP_B] = {0}, first = -1, max_kv = 0, replaced = 0;
    for (int attempt = 0; attempt < 1000 && first < 0; attempt++) {
        int32_t f = tt_rng_int(&rng, 0, tr->num_requests - 1);
        max_kv = 0;
        replaced = 0;
        for (int32_t s = 0; s < LOOP_STEPS; s++) {
            fitrace_lens l = {LOOP_B, ql, kv[s], src[s]};
            assert_int_equal(fitrace_decode(tr, f, s, 1, &l), FITRACE_OK);
            for (int b = 0; b < LOOP_B; b++) {
                if (kv[s][b] > max_kv) max_kv = kv[s][b];
                if (s > 0) replaced += src[s][b] != src[s - 1][b];
            }
        }
        if (max_kv <= LOOP_MAX_KV && replaced > 0) first = f;
    }
    fitrace_free(tr);
    assert_true(first >= 0);
    print_message("  trace rows from %d, max kv_len %d, %d requests replaced in %d steps\n",
                  first, max_kv, replaced, LOOP_STEPS);

    /* A case sized for the whole loop: slot b owns pages [b P, (b+1) P), block_tables row
     * stride P fixed, so every step's table lands at the same device address. */
    const int32_t P = (max_kv + LOOP_PS - 1) / LOOP_PS;
    mla_opts o = default_opts(LOOP_H, LOOP_PS, FI_FORM_BLOCK_TABLES);
    o.sinks = 1;
    o.scale_ptr = 1; /* the graph must follow a new bmm1 scale written each step */
    int32_t q1[LOOP_B], kv_full[LOOP_B];
    for (int b = 0; b < LOOP_B; b++) {
        q1[b] = 1;
        kv_full[b] = P * LOOP_PS; /* the case's own batch: every slot's full page row */
    }
    mla_case c;
    char msg[MSG];
    if (mla_case_init(&c, &o, q1, kv_full, LOOP_B, &rng, msg, sizeof msg))
        fail_msg("init: %s", msg);
    assert_int_equal(c.P, P);
    assert_int_equal(c.num_pages, LOOP_B * P);
    int32_t *bt = c.fb.page_table; /* host [B, P], rewritten in place per step */
    c.fb.batch.seq_lens = c.fb.kv_lens; /* rewritten in place per step */
    fi_attn_args dargs = mla_case_args(&c, 1);

    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    int bad = 0, bad_step = -1;
    double worst = 0, worst_lse = 0;
    for (int32_t s = 0; s < LOOP_STEPS && !bad; s++) {
        bad_step = s;
        for (int b = 0; b < LOOP_B; b++) {
            if (s == 0 || src[s][b] != src[s - 1][b]) /* new request in slot b: new pages */
                shuffle_row(bt + (int64_t)b * P, P, b * P, &rng);
            c.fb.kv_lens[b] = kv[s][b];
        }
        fi_status st = fi_plan_update(c.plan, &c.fb.batch, c.stream);
        if (st != FI_OK) {
            mla_msg(msg, sizeof msg, "step %d fi_plan_update: %s", s, fi_status_name(st));
            bad = 1;
            break;
        }
        /* new inputs at the same addresses: q, block_tables, bmm1 scale */
        mla_fill_random(c.h_q, c.n_q, c.o.dtype, &rng);
        c.bmm1_scale = 0.05f + 0.1f * (tt_rng_float(&rng) + 1.0f) * 0.5f;
        if (mla_case_upload(&c, msg, sizeof msg) || mla_case_poison(&c, msg, sizeof msg)) {
            bad = 1;
            break;
        }
        if (s == 0) { /* capture once, after the first plan */
            cudaError_t e = cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeGlobal);
            st = e == cudaSuccess ? fi_run(c.plan, &dargs, c.stream) : FI_ERR_CUDA;
            cudaError_t e2 = cudaStreamEndCapture(c.stream, &graph);
            if (e != cudaSuccess || st != FI_OK || e2 != cudaSuccess ||
                cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
                mla_msg(msg, sizeof msg, "capture: begin %d fi_run %s end %d", (int)e,
                        fi_status_name(st), (int)e2);
                bad = 1;
                break;
            }
        }
        if (cudaGraphLaunch(exec, c.stream) != cudaSuccess ||
            cudaStreamSynchronize(c.stream) != cudaSuccess) {
            mla_msg(msg, sizeof msg, "step %d: graph launch failed: %s", s,
                    cudaGetErrorString(cudaGetLastError()));
            bad = 1;
            break;
        }
        if (mla_case_reference(&c, msg, sizeof msg) ||
            mla_case_check(&c, TOL, &worst, &worst_lse, msg, sizeof msg)) {
            bad = 1;
        }
    }
    print_message("  64 replays: worst out err %.2e lse err %.2e\n", worst, worst_lse);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    mla_case_free(&c);
    if (bad) fail_msg("step %d: %s", bad_step, msg);
}

/* ---- PDL: two chained launches (layer 2 reads layer 1's output as q_nope) --------------- */

/* Capture run1 -> run2 with the given enable_pdl, replay once, return out1 and out2. */
static int pdl_pair(mla_case *c, fi_attn_args *a1, fi_attn_args *a2, int pdl, uint16_t *o1,
                    uint16_t *o2, float *l2, char *msg, size_t cap) {
    a1->enable_pdl = a2->enable_pdl = pdl;
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    MLA_CUDA(cudaMemsetAsync(a1->out.data, 0xff, c->out_bytes, c->stream), msg, cap);
    MLA_CUDA(cudaMemsetAsync(a2->out.data, 0xff, c->out_bytes, c->stream), msg, cap);
    MLA_CUDA(cudaMemsetAsync(a2->lse.data, 0xff, c->lse_bytes, c->stream), msg, cap);
    MLA_CUDA(cudaStreamSynchronize(c->stream), msg, cap);
    MLA_CUDA(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeGlobal), msg, cap);
    fi_status s1 = fi_run(c->plan, a1, c->stream);
    fi_status s2 = fi_run(c->plan, a2, c->stream);
    MLA_CUDA(cudaStreamEndCapture(c->stream, &g), msg, cap);
    if (s1 != FI_OK || s2 != FI_OK) {
        cudaGraphDestroy(g);
        mla_msg(msg, cap, "pdl=%d: fi_run %s / %s", pdl, fi_status_name(s1), fi_status_name(s2));
        return -1;
    }
    cudaError_t e = cudaGraphInstantiate(&x, g, 0);
    if (e == cudaSuccess) e = cudaGraphLaunch(x, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (x) cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        mla_msg(msg, cap, "pdl=%d: graph: %s", pdl, cudaGetErrorString(e));
        return -1;
    }
    MLA_CUDA(cudaMemcpy(o1, a1->out.data, c->out_bytes, cudaMemcpyDeviceToHost), msg, cap);
    MLA_CUDA(cudaMemcpy(o2, a2->out.data, c->out_bytes, cudaMemcpyDeviceToHost), msg, cap);
    MLA_CUDA(cudaMemcpy(l2, a2->lse.data, c->lse_bytes, cudaMemcpyDeviceToHost), msg, cap);
    return 0;
}

static void mla_pdl_chained_graph_matches_unchained(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = test_rng(7);
    mla_case c;
    split_case(&c, 132, 16, 3, 1, 1000, 3000, &rng); /* splits: semaphores reused by run 2 */
    char msg[MSG];
    void *d_out2 = NULL, *d_lse2 = NULL;
    size_t ob = c.out_bytes, lb = c.lse_bytes;
    uint16_t *o1[2] = {malloc(ob), malloc(ob)}, *o2[2] = {malloc(ob), malloc(ob)};
    float *l2[2] = {malloc(lb), malloc(lb)};
    int bad = !o1[0] || !o1[1] || !o2[0] || !o2[1] || !l2[0] || !l2[1];
    if (bad) mla_msg(msg, sizeof msg, "host allocation failed");
    if (!bad && (cudaMalloc(&d_out2, ob) != cudaSuccess || cudaMalloc(&d_lse2, lb) != cudaSuccess)) {
        mla_msg(msg, sizeof msg, "cudaMalloc failed");
        bad = 1;
    }
    fi_attn_args a1 = mla_case_args(&c, 1), a2 = a1;
    /* layer 2: q_nope = layer 1's out [tokens, H, 512] (contiguous), same q_rope and KV */
    a2.q = a1.out;
    a2.out.data = d_out2;
    a2.lse.data = d_lse2;
    for (int pdl = 0; pdl <= 1 && !bad; pdl++)
        bad = pdl_pair(&c, &a1, &a2, pdl, o1[pdl], o2[pdl], l2[pdl], msg, sizeof msg);
    int same = !bad && memcmp(o1[0], o1[1], ob) == 0 && memcmp(o2[0], o2[1], ob) == 0 &&
               memcmp(l2[0], l2[1], lb) == 0;
    /* both layers are right, not just equal: layer 1 vs the truth, then layer 2 with the
     * GPU's layer-1 output as its host q_nope */
    if (!bad) {
        memcpy(c.h_out, o1[1], ob);
        bad = mla_case_reference(&c, msg, sizeof msg);
        c.o.return_lse = 0;
        if (!bad) bad = mla_case_compare(&c, 0, c.B, TOL, NULL, NULL, msg, sizeof msg);
    }
    if (!bad) {
        fi_attn_args h = mla_case_args(&c, 0);
        h.q = a1.out;
        h.q.data = o1[1];
        fi_caps caps = mla_caps(&c.o, c.B, c.tokens, c.num_pages);
        fi_status st = fi_naive_attention(&caps, &c.fb.batch, &h);
        if (st != FI_OK) {
            mla_msg(msg, sizeof msg, "layer 2 reference: %s", fi_status_name(st));
            bad = 1;
        } else {
            memcpy(c.h_out, o2[1], ob);
            memcpy(c.h_lse, l2[1], lb);
            c.o.return_lse = 1;
            bad = mla_case_compare(&c, 0, c.B, TOL, NULL, NULL, msg, sizeof msg);
        }
    }
    for (int i = 0; i < 2; i++) {
        free(o1[i]);
        free(o2[i]);
        free(l2[i]);
    }
    if (d_out2) cudaFree(d_out2);
    if (d_lse2) cudaFree(d_lse2);
    mla_case_free(&c);
    if (bad) fail_msg("%s", msg);
    assert_true(same);
}

/* ---- bad arguments: statuses, and nothing written ---------------------------------------- */

static void expect_status(mla_case *c, const fi_attn_args *a, fi_status want, const char *what) {
    fi_status got = fi_run(c->plan, a, c->stream);
    if (got != want) {
        mla_case_free(c);
        fail_msg("%s: fi_run returned %s, want %s", what, fi_status_name(got),
                 fi_status_name(want));
    }
}

static void mla_bad_arguments_return_their_status_and_write_nothing(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = test_rng(8);
    mla_opts o = default_opts(32, 16, FI_FORM_BLOCK_TABLES);
    int32_t q[3] = {1, 1, 1}, kv[3] = {100, 17, 300};
    mla_case c;
    char msg[MSG];
    if (mla_case_init(&c, &o, q, kv, 3, &rng, msg, sizeof msg)) fail_msg("init: %s", msg);
    assert_int_equal(mla_case_poison(&c, msg, sizeof msg), 0);
    assert_int_equal(cudaStreamSynchronize(c.stream), cudaSuccess);
    const fi_attn_args good = mla_case_args(&c, 1);
    fi_attn_args a;

    expect_status(&c, NULL, FI_ERR_NULL_ARGUMENT, "args NULL");
    a = good; a.q.data = NULL;
    expect_status(&c, &a, FI_ERR_NULL_ARGUMENT, "q.data NULL");
    a = good; a.out.data = NULL;
    expect_status(&c, &a, FI_ERR_NULL_ARGUMENT, "out.data NULL");
    a = good; a.q.dtype = FI_DTYPE_F16;
    expect_status(&c, &a, FI_ERR_UNSUPPORTED_DTYPE, "q f16 under bf16 caps");
    a = good; a.out.dtype = FI_DTYPE_F32;
    expect_status(&c, &a, FI_ERR_UNSUPPORTED_DTYPE, "out f32 under bf16 caps");
    a = good; a.page_table.dtype = FI_DTYPE_F32;
    expect_status(&c, &a, FI_ERR_UNSUPPORTED_DTYPE, "page_table f32");
    a = good; a.q.shape[1] = 16;
    expect_status(&c, &a, FI_ERR_SHAPE_MISMATCH, "q heads 16 under 32-head caps");
    a = good; a.q.shape[0] = c.tokens - 1;
    expect_status(&c, &a, FI_ERR_SHAPE_MISMATCH, "q fewer rows than the plan's tokens");
    a = good; a.out.shape[2] = 256;
    expect_status(&c, &a, FI_ERR_SHAPE_MISMATCH, "out head dim 256");
    a = good; a.k_rope.shape[3] = 32;
    expect_status(&c, &a, FI_ERR_SHAPE_MISMATCH, "k_rope dim 32");
    a = good; a.k.shape[1] = 32;
    expect_status(&c, &a, FI_ERR_SHAPE_MISMATCH, "k page_size 32 under page_size 16 caps");
    a = good; a.out.data = (uint16_t *)good.out.data + 1;
    expect_status(&c, &a, FI_ERR_MISALIGNED_POINTER, "out + 2 bytes");
    a = good; a.q.data = (uint16_t *)good.q.data + 4;
    expect_status(&c, &a, FI_ERR_MISALIGNED_POINTER, "q + 8 bytes");
    a = good; a.q.stride[2] = 2;
    expect_status(&c, &a, FI_ERR_BAD_STRIDE, "q last stride 2");
    a = good; a.k.stride[3] = 2;
    expect_status(&c, &a, FI_ERR_BAD_STRIDE, "k last stride 2");
    a = good; a.out.stride[2] = 2;
    expect_status(&c, &a, FI_ERR_BAD_STRIDE, "out last stride 2");

    /* not planned: a device plan before its first update */
    fi_caps caps = mla_caps(&o, 3, 3, c.num_pages);
    size_t bytes = 0;
    void *ws = NULL;
    fi_plan *p = NULL;
    assert_int_equal(fi_workspace_size(&caps, &bytes), FI_OK);
    assert_int_equal(cudaMalloc(&ws, bytes), cudaSuccess);
    assert_int_equal(fi_plan_create(&caps, ws, bytes, NULL, &p), FI_OK);
    fi_status st = fi_run(p, &good, c.stream); /* valid args for these caps, but no plan */
    fi_plan_destroy(p);
    cudaFree(ws);
    assert_int_equal(st, FI_ERR_NOT_PLANNED);

    /* host-only plan: planned, but has no workspace */
    p = NULL;
    assert_int_equal(fi_plan_create(&caps, NULL, 0, NULL, &p), FI_OK);
    fibatch fb;
    fibatch_opts bo = fibatch_default_opts();
    bo.form = FI_FORM_BLOCK_TABLES;
    bo.page_size = 16;
    assert_int_equal(fibatch_build(&bo, q, kv, 3, NULL, &fb), FIBATCH_OK);
    st = fi_plan_update(p, &fb.batch, NULL);
    fi_status st_run = st == FI_OK ? fi_run(p, &good, c.stream) : st;
    fibatch_free(&fb);
    fi_plan_destroy(p);
    assert_int_equal(st, FI_OK);
    assert_int_equal(st_run, FI_ERR_HOST_PLAN);

    /* nothing was launched: out and lse still hold the poison bytes */
    assert_int_equal(cudaStreamSynchronize(c.stream), cudaSuccess);
    assert_int_equal(mla_case_download(&c, msg, sizeof msg), 0);
    const unsigned char *ob = (const unsigned char *)c.h_out, *lbp = (const unsigned char *)c.h_lse;
    size_t touched = 0;
    for (size_t i = 0; i < c.out_bytes; i++) touched += ob[i] != 0xff;
    for (size_t i = 0; i < c.lse_bytes; i++) touched += lbp[i] != 0xff;
    if (touched) {
        mla_case_free(&c);
        fail_msg("a rejected fi_run wrote %zu bytes of out/lse", touched);
    }

    /* fi_plan_update while the stream is captured: refused, previous plan kept */
    fi_plan_view v;
    assert_int_equal(fi_plan_get_view(c.plan, &v), FI_OK);
    fi_plan_header before = *v.header;
    assert_int_equal(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
    st = fi_plan_update(c.plan, &c.fb.batch, c.stream);
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c.stream, &g);
    if (g) cudaGraphDestroy(g);
    (void)cudaGetLastError();
    if (st != FI_ERR_STREAM_CAPTURING || e != cudaSuccess) {
        mla_case_free(&c);
        fail_msg("fi_plan_update while capturing: %s (want FI_ERR_STREAM_CAPTURING), "
                 "end capture %s", fi_status_name(st), cudaGetErrorString(e));
    }
    assert_int_equal(fi_plan_get_view(c.plan, &v), FI_OK);
    assert_memory_equal(&before, v.header, sizeof before);
    /* and the plan still runs right */
    check_case(&c, 1);
    mla_case_free(&c);

}

/* ---- a grid the device cannot hold resident ----------------------------------------------- */

/* The in-kernel merge waits on other CTAs, so fi_run refuses a plan whose caps.num_ctas
 * exceeds SMs x occupancy with its own status (no CPU-side equivalent: the limit comes
 * from the device).  FI_LIMIT_NUM_CTAS is far above any GPU's resident CTAs. */
static void mla_grid_over_resident_ctas_returns_grid_not_resident(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = test_rng(12);
    mla_opts o = default_opts(16, 16, FI_FORM_BLOCK_TABLES);
    o.num_ctas = FI_LIMIT_NUM_CTAS;
    int32_t q[2] = {1, 1}, kv[2] = {100, 300};
    mla_case c;
    char msg[MSG];
    if (mla_case_init(&c, &o, q, kv, 2, &rng, msg, sizeof msg)) fail_msg("init: %s", msg);
    const fi_attn_args a = mla_case_args(&c, 1);
    expect_status(&c, &a, FI_ERR_GRID_NOT_RESIDENT, "num_ctas FI_LIMIT_NUM_CTAS");
    mla_case_free(&c);
}

/* ---- one small split case, for compute-sanitizer memcheck / racecheck ------------------- */

static void sanitize_small_case(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = test_rng(9);
    mla_case c;
    split_case(&c, 8, 16, 2, 2, 700, 900, &rng); /* >= 2 pieces of >= 256 keys */
    check_case(&c, 1);
    mla_case_free(&c);
}

/* ---- a second registered variant: the same tile body on 32-row tiles ------------------ */

/* caps.variant 1 (executor/core/registry.c "mla_decode_rows32"): the planner cuts 32-row
 * tiles (heads 64 / 128: two / four tiles a query row; heads 16 x q_len 2-4: one or two
 * tiles a request) and the executor runs them with 32-row partial slots; with few CTAs the
 * tiles split, so the merge runs at that slot height too. */
static void mla_rows32_variant_matches_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = test_rng(41);
    const int32_t heads[] = {16, 64, 128};
    for (int ih = 0; ih < 3; ih++)
        for (int32_t ql = 1; ql <= 4; ql += 3)
            for (int few = 0; few <= 1; few++) {
                mla_opts o = default_opts(heads[ih], few ? 32 : 16,
                                          few ? FI_FORM_BLOCK_TABLES : FI_FORM_INDPTR);
                o.variant = 1;
                o.causal = ql > 1;
                o.sinks = few;
                o.num_ctas = few ? 5 : 0;
                /* few CTAs: one long request, so a tile count below the grid must split */
                int32_t B = few ? 1 : tt_rng_int(&rng, 2, 4), q[4], kv[4];
                for (int32_t b = 0; b < B; b++) {
                    q[b] = ql;
                    kv[b] = few ? tt_rng_int(&rng, 2000, 3000) : pick_kv_len(&rng, b, ql, 16, 600, !o.causal);
                }
                mla_case c;
                char msg[MSG];
                if (mla_case_init(&c, &o, q, kv, B, &rng, msg, sizeof msg)) fail_msg("init: %s", msg);
                fi_plan_view v;
                assert_int_equal(fi_plan_get_view(c.plan, &v), FI_OK);
                assert_int_equal(v.header->tile_rows, 32);
                const int32_t tiles = (ql * heads[ih] + 31) / 32;
                if (few && tiles < o.num_ctas && v.header->num_groups <= 0) {
                    mla_case_free(&c);
                    fail_msg("rows32 heads %d q_len %d: %d tiles on %d CTAs and no split", heads[ih],
                             ql, tiles, o.num_ctas);
                }
                check_case(&c, 2);
                mla_case_free(&c);
            }
}

int main(void) {
    g_seed = tt_test_seed();
    printf("test_mla_gpu: seed %llu (replay with FI_TEST_SEED=%llu)\n",
           (unsigned long long)g_seed, (unsigned long long)g_seed);
    const char *filter = getenv("FI_GPU_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sanitize_small_case),
        cmocka_unit_test(mla_bad_arguments_return_their_status_and_write_nothing),
        cmocka_unit_test(mla_bf16_matches_reference_every_shape),
        cmocka_unit_test(mla_f16_matches_reference),
        cmocka_unit_test(mla_indptr_causal_prefill_matches_reference),
        cmocka_unit_test(mla_split_merge_matches_reference_few_and_many_ctas),
        cmocka_unit_test(mla_split_variants_match_reference),
        cmocka_unit_test(mla_keyless_batch_writes_zeros_and_sink_lse),
        cmocka_unit_test(mla_grid_over_resident_ctas_returns_grid_not_resident),
        cmocka_unit_test(mla_same_inputs_give_bitwise_identical_outputs),
        cmocka_unit_test(mla_graph_decode_loop_follows_trace_every_step),
        cmocka_unit_test(mla_pdl_chained_graph_matches_unchained),
        cmocka_unit_test(mla_rows32_variant_matches_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
