/*
 * tests/gpu/test_context_gpu.c - the CUDA context (prefill) family (fi_run, FI_KIND_CONTEXT,
 * the surface of trtllm_batch_context_with_kv_cache) against the naive fp64 reference
 * (fi_naive_attention), on the GPU machine.  Every test skips without a device.
 *
 * Fresh random inputs each run; the seed is printed and FI_TEST_SEED=<seed> replays it.
 * Outputs are poisoned with NaN before each run; every output element and lse is checked
 * (a NaN, an inf or poison left anywhere fails: full coverage).  Rows checked against the
 * fp64 truth: all rows of a request whose reference is cheap, blocks of sampled rows
 * (first, middle, last, either side of the plan's tile starts, random) of the long ones
 * (tests/gpu/context_gpu_case.h).  Tolerance: per (token, head) row ||out - ref|| / ||ref||
 * <= 1e-2 for bf16 / fp16 out, 7e-2 for fp8 out (after out x o_scale); lse within 1e-2
 * absolute, -inf exactly where the reference is -inf.
 * Cases are planned through the public API only (caps.num_ctas picks the CTAs, the planner
 * the splits; tests that need splits assert the plan has them).  Most cases run twice
 * (without, then with PDL) and must repeat bitwise.
 *
 * Before the GPU family lands fi_run returns FI_ERR_UNSUPPORTED_KIND and every test fails
 * saying "NOT SUPPORTED BY THE GPU FAMILY YET".  fp8 e4m3 KV is checked against the
 * reference like every other case (context_fp8_kv_matches_reference); NVFP4 KV against
 * the reference run on the dequantised cache (context_nvfp4_kv_matches_dequantised_reference),
 * its bad block scales by context_nvfp4_bad_scale_tensors_return_their_status.  NVFP4 out
 * (codes + e4m3 block scales, o_sf) is decoded and held to the quantisation bound and to
 * bit agreement with a host quantisation of the reference (tests/gpu/context_nvfp4_case.h),
 * on unmerged and merged (split) rows.
 *
 * Run one test only (e.g. under compute-sanitizer):
 *   FI_GPU_TEST_FILTER=sanitize_small_case compute-sanitizer --tool memcheck \
 *       build/tests/gpu/test_context_gpu
 *   FI_GPU_TEST_FILTER=sanitize_small_case compute-sanitizer --tool racecheck \
 *       build/tests/gpu/test_context_gpu
 * and the same with sanitize_small_case_fp8_kv / sanitize_small_case_nvfp4_kv (the
 * producer's register path; sanitize_small_case* runs all three).  The filter is a cmocka
 * glob over test names.
 */
#include <math.h>

#include "gpu/context_gpu_case.h"
#include "gpu/context_nvfp4_case.h"
#include "gpu/gpu_test_common.h"

#define MSG 1024
#define NOT_YET "NOT SUPPORTED BY THE GPU FAMILY YET: "

/* 1 when the message says the library refused the case as not supported (yet). */
static int unsupported(const char *msg) {
    return strstr(msg, "FI_ERR_UNSUPPORTED_DTYPE") || strstr(msg, "FI_ERR_UNSUPPORTED_KIND");
}

/* ---- the case as the shared harness (gpu_test_common.h) sees it ------------------------- */

static fi_attn_args fam_args(const void *c) { return gqa_case_args(&((const ctx_case *)c)->g); }
static int fam_upload(void *c, char *msg, size_t cap) {
    return gqa_case_upload(&((ctx_case *)c)->g, msg, cap);
}
static int fam_reference(void *c, char *msg, size_t cap) {
    return ctx_case_reference((ctx_case *)c, msg, cap);
}
static int fam_compare(void *c, double *wo, double *wl, char *msg, size_t cap) {
    return ctx_case_compare((const ctx_case *)c, wo, wl, msg, cap);
}
static void fam_name(const void *c, char *buf, size_t cap) {
    ctx_case_name((const ctx_case *)c, buf, cap);
}
static void fam_free(void *c) { ctx_case_free((ctx_case *)c); }

/* In gt_family's order: args, upload, reference, compare, name, free, new_step_inputs (no
 * graph decode loop here), unsupported. */
static const gt_family CTX_FAMILY = {fam_args, fam_upload, fam_reference, fam_compare,
                                     fam_name, fam_free, NULL, unsupported};

/* The case as the shared tests see it (taken after init). */
static gt_case gt(ctx_case *x) {
    gqa_case *c = &x->g;
    return gt_case_make(x, &CTX_FAMILY, c->plan, c->stream, &c->fb, c->B, c->P, c->num_pages,
                        gqa_case_outputs(c));
}

/* ctx_case_init or fail the test (naming an unsupported dtype as such). */
static void init_or_fail(ctx_case *x, const gqa_opts *o, const int32_t *q, const int32_t *kv,
                         int32_t n, int full, tt_rng *rng) {
    char msg[MSG];
    if (ctx_case_init(x, o, q, kv, n, full, rng, msg, sizeof msg))
        fail_msg("%sinit (H %d/%d D %d page_size %d B %d q %s kv %s out %s): %s",
                 unsupported(msg) ? "NOT SUPPORTED YET: " : "", o->heads_q, o->heads_kv,
                 o->head_dim, o->page_size, n, gqa_dtype_name(o->dtype),
                 gqa_dtype_name(o->kv_dtype ? o->kv_dtype : o->dtype),
                 gqa_dtype_name(o->o_dtype ? o->o_dtype : o->dtype), msg);
}

/* Build, run `runs` times (2: without then with PDL, bitwise identical), check against the
 * fp64 truth, free; the plan's split figures for the caller's counts. */
static split_stats run_and_check(const gqa_opts *o, const int32_t *q, const int32_t *kv,
                                 int32_t n, tt_rng *rng, int runs) {
    ctx_case x;
    init_or_fail(&x, o, q, kv, n, 0, rng);
    const split_stats s = plan_split_stats(x.g.plan);
    const gt_case g = gt(&x);
    gt_check(&g, runs);
    ctx_case_free(&x);
    return s;
}

/* ---- every shape: D x group x page size, q_len mixes over cached prefixes ----------------- */

static const int32_t DIMS[3] = {64, 128, 256};
static const int32_t GROUPS[4] = {1, 4, 5, 8};
static const int32_t PAGES[2] = {16, 64};
static const int32_t Q_MIX[5] = {1, 17, 128, 300, 1000};

/* One case per (D, group, page size): 24 cases of 4 requests.  q_len: four of 1, 17, 128,
 * 300, 1000 (rotating, so every case has a block of 300 or 1000 rows); cached prefix
 * (kv_len - q_len): none, 1 .. page_size, up to 1200, whole pages.  H_kv 2 or 4 (group 1,
 * 4) or 1 or 2 (group 5, 8), so H_q <= 16 and the fp64 reference stays in seconds.  bf16 /
 * fp16 alternate with the parity of the three indices; layout NHD / HND, one tensor /
 * pair, [B, 2, P] tables, sinks, lse, scale pointers, page padding, non-causal, window_left
 * (0, 37, a page + 1, 250), page order and CTAs (the device's count, or 2..25) rotate on
 * index bits (gqa_sweep_opts). */
static void context_matches_reference_every_shape(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(1);
    int idx = 0, n_split = 0, n_multi = 0, n_dt[2] = {0, 0};
    for (int id = 0; id < 3; id++)
        for (int ig = 0; ig < 4; ig++)
            for (int ip = 0; ip < 2; ip++, idx++) {
                const int32_t hkv = GROUPS[ig] >= 5 ? 1 + (idx & 1) : 2 + 2 * (idx & 1);
                gqa_opts o = ctx_default_opts(GROUPS[ig] * hkv, hkv, DIMS[id], PAGES[ip]);
                o.dtype = (id + ig + ip) & 1 ? FI_DTYPE_F16 : FI_DTYPE_BF16;
                gqa_sweep_opts(&o, idx, PAGES[ip]);
                o.kv_split_pages = idx % 4 == 2;
                o.non_causal = idx % 6 == 5;
                int32_t q[4], kv[4];
                for (int32_t b = 0; b < 4; b++) {
                    const int32_t prefix[4] = {0, tt_rng_int(&rng, 1, PAGES[ip]),
                                               tt_rng_int(&rng, 0, 1200),
                                               PAGES[ip] * tt_rng_int(&rng, 1, 4)};
                    q[b] = Q_MIX[(idx + b) % 5];
                    kv[b] = q[b] + prefix[b];
                }
                const split_stats s = run_and_check(&o, q, kv, 4, &rng, 2);
                n_split += s.groups > 0;
                n_multi += s.multi_item_ctas > 0;
                n_dt[o.dtype == FI_DTYPE_F16]++;
            }
    print_message("  %d cases (%d bf16, %d fp16): %d with merged splits, %d with CTAs running "
                  "several items\n", idx, n_dt[0], n_dt[1], n_split, n_multi);
    assert_true(n_multi > 0);
}

/* ---- window_left and sinks --------------------------------------------------------------- */

/* window_left 0 (each row its own key), 1, 37, a page + 1, 250 and 2000 (wider than most
 * prefixes) with and without sinks, on Llama-3-8B heads (32/8, D 128) and MQA 16/1 (D 64);
 * q_len 17, 300 and 1 over prefixes up to 1500. */
static void context_window_left_and_sinks_match_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(2);
    static const int32_t WINS[6] = {0, 1, 37, -2 /* a page + 1 */, 250, 2000};
    for (int k = 0; k < 12; k++) {
        gqa_opts o = k & 1 ? ctx_default_opts(16, 1, 64, 16) : ctx_default_opts(32, 8, 128, 64);
        o.dtype = k & 2 ? FI_DTYPE_F16 : FI_DTYPE_BF16;
        o.windowed = 1;
        o.window_left = WINS[k / 2] == -2 ? o.page_size + 1 : WINS[k / 2];
        o.sinks = ((k >> 1) ^ k) & 1; /* each window with and without */
        o.layout = (k >> 2) & 1 ? GQA_HND : GQA_NHD;
        o.num_ctas = k % 3 ? 11 : 0;
        int32_t q[3] = {17, 300, 1}, kv[3];
        for (int32_t b = 0; b < 3; b++) kv[b] = q[b] + tt_rng_int(&rng, 0, 1500);
        run_and_check(&o, q, kv, 3, &rng, 2);
    }
}

/* ---- non-causal: every row sees every key (a window still applies) ----------------------- */

/* Non-causal batches (caps allow causal 0 for context): no window and window_left 100,
 * sinks on and off; one request with fewer keys than query rows (allowed when not causal)
 * and one without keys. */
static void context_non_causal_matches_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(3);
    for (int k = 0; k < 4; k++) {
        gqa_opts o = k & 1 ? ctx_default_opts(20, 4, 128, 32) : ctx_default_opts(8, 8, 64, 16);
        o.non_causal = 1;
        o.windowed = k >= 2;
        o.window_left = 100;
        o.sinks = k == 1 || k == 2;
        o.num_ctas = k & 1 ? 0 : 9;
        int32_t q[4] = {40, 130, 1, 7}, kv[4] = {20, 0, 0, 0};
        kv[1] = 130 + tt_rng_int(&rng, 0, 900);
        kv[2] = tt_rng_int(&rng, 1, 2000);
        kv[3] = k & 1 ? 0 : 7; /* no keys at all (odd k) */
        run_and_check(&o, q, kv, 4, &rng, 2);
    }
}

/* ---- batch forms: cum_seq_lens (2-D / 3-D tables), indptr, block_tables ------------------- */

/* The same kind of batch in every form the planner takes for FI_KIND_CONTEXT: cum_seq_lens_q
 * / cum_seq_lens_kv with block_tables [B, P] and [B, 2, P] (K and V page ids differ),
 * qo_indptr / kv_indptr / kv_indices, and block_tables + seq_lens with one q_len for all
 * (2-D and 3-D). */
static void context_batch_forms_match_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(4);
    static const struct { fi_batch_form form; int32_t split; } F[5] = {
        {FI_FORM_CUM_SEQ_LENS, 0}, {FI_FORM_CUM_SEQ_LENS, 1}, {FI_FORM_INDPTR, 0},
        {FI_FORM_BLOCK_TABLES, 0}, {FI_FORM_BLOCK_TABLES, 1}};
    for (int k = 0; k < 5; k++) {
        gqa_opts o = ctx_default_opts(32, 8, 128, k & 1 ? 16 : 64);
        o.form = F[k].form;
        o.kv_split_pages = F[k].split;
        o.layout = k & 2 ? GQA_HND : GQA_NHD;
        o.sinks = k & 1;
        o.num_ctas = k == 2 ? 13 : 0;
        const int uniform = F[k].form == FI_FORM_BLOCK_TABLES;
        int32_t q[5] = {200, 1, 33, 77, 640}, kv[5];
        for (int32_t b = 0; b < 5; b++) {
            if (uniform) q[b] = 77;
            kv[b] = q[b] + tt_rng_int(&rng, 0, 1000);
        }
        run_and_check(&o, q, kv, 5, &rng, 2);
    }
}

/* ---- layouts: NHD / HND, single tensor / (K, V) pair, padded pages: bitwise identical ----- */

/* The first KV form's outputs against the fp64 truth (gqa_case_forms_identical). */
static int check_truth(void *x, char *msg, size_t cap) {
    return ctx_case_reference((ctx_case *)x, msg, cap) ||
           ctx_case_compare((const ctx_case *)x, NULL, NULL, msg, cap);
}

static void context_layouts_and_kv_forms_are_bitwise_identical(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(5);
    /* D 64 / 128 / 256, groups 1 / 5 / 8 / 16, splits on some, q_len 1 / 150 / 40 */
    const int32_t shapes[5][5] = {/* hq hkv d ps ctas */
                                  {4, 4, 64, 16, 0},   {40, 8, 128, 64, 9},
                                  {16, 2, 256, 32, 0}, {16, 1, 128, 128, 7},
                                  {32, 2, 64, 16, 11}};
    for (int s = 0; s < 5; s++) {
        gqa_opts o = ctx_default_opts(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3]);
        o.num_ctas = shapes[s][4];
        o.sinks = s & 1;
        o.dtype = s & 1 ? FI_DTYPE_F16 : FI_DTYPE_BF16;
        int32_t q[3] = {1, 150, 40}, kv[3];
        for (int32_t b = 0; b < 3; b++) kv[b] = q[b] + tt_rng_int(&rng, 0, 1200);
        ctx_case x;
        init_or_fail(&x, &o, q, kv, 3, 0, &rng);
        char msg[MSG], name[MSG];
        ctx_case_name(&x, name, sizeof name);
        const int bad = gqa_case_forms_identical(&x.g, check_truth, &x, msg, sizeof msg);
        print_message("  %s: 5 forms%s\n", name, bad ? " FAILED" : " identical");
        ctx_case_free(&x);
        if (bad) fail_msg("%s%s: %s", unsupported(msg) ? NOT_YET : "", name, msg);
    }
}

/* ---- scales from device pointers ------------------------------------------------------ */

/* bmm1_scale / bmm2_scale read from device memory at run time (the value fields then hold
 * 1000 / -1000, which would show), with and without splits, sinks and fp8 out. */
static void context_device_pointer_scales_match_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(6);
    for (int k = 0; k < 4; k++) {
        gqa_opts o = k & 1 ? ctx_default_opts(32, 8, 128, 64) : ctx_default_opts(24, 8, 64, 32);
        o.scale_ptr = 1;
        o.sinks = k >= 2;
        o.num_ctas = k & 2 ? 8 : 0;
        o.o_dtype = k == 3 ? FI_DTYPE_E4M3 : 0;
        int32_t q[3] = {64, 1, 333}, kv[3];
        for (int32_t b = 0; b < 3; b++) kv[b] = q[b] + tt_rng_int(&rng, 0, 2500);
        run_and_check(&o, q, kv, 3, &rng, 2);
    }
}

/* ---- fp8 e4m3 output with o_scale ------------------------------------------------------- */

/* fp8 e4m3 out, stored as fp8(out / o_scale) (the case's o_scale ~0.01..0.02, or 0.25):
 * D 64 / 128 / 256, bf16 and fp16 q, sinks, 9 CTAs (merged pieces store through the fp8
 * path too); compared after x o_scale within 7e-2 a row. */
static void context_fp8_out_matches_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(7);
    for (int k = 0; k < 6; k++) {
        gqa_opts o = k & 1 ? ctx_default_opts(32, 8, 128, 64) : ctx_default_opts(40, 8, 64, 16);
        if (k >= 4) o = ctx_default_opts(16, 2, 256, 32);
        o.o_dtype = FI_DTYPE_E4M3;
        o.dtype = k & 2 ? FI_DTYPE_F16 : FI_DTYPE_BF16;
        o.sinks = k & 1;
        o.num_ctas = k & 2 ? 9 : 0; /* merged pieces store through the fp8 path too */
        o.o_scale = k == 3 ? 0.25f : 0.0f; /* 0: the case picks ~0.01..0.02 */
        int32_t q[3] = {1, 129, 500}, kv[3];
        for (int32_t b = 0; b < 3; b++) kv[b] = q[b] + tt_rng_int(&rng, 0, 1500);
        run_and_check(&o, q, kv, 3, &rng, 2);
    }
}

/* ---- split-k: few and many CTAs, merges must happen and be exact ------------------------- */

/* Long KV under few tiles: on 8 CTAs and on 132 the planner cuts tiles across CTAs and the
 * pieces are merged in the kernel.  min: pieces the largest merge group must have (0: the
 * case need not split, it checks a window inside a long request). */
static void context_split_merge_matches_reference_few_and_many_ctas(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(8);
    static const gqa_split_variant V[] = { /* hq hkv d ps q_len B kv_lo kv_hi ctas sinks win min */
        /* few CTAs: two tiles of 16 rows x 8 heads over 6000..8000 keys on 8 CTAs */
        {16, 2, 128, 64, 16, 1, 6000, 8000, 8, 1, -1, 2},
        /* few CTAs, two requests of 200 rows (group 4: 32-row tiles) */
        {32, 8, 128, 16, 200, 2, 3000, 5000, 8, 0, -1, 2},
        /* 132 CTAs: one 32-row block, 8 KV heads (8 tiles) over 12k keys */
        {32, 8, 128, 64, 32, 1, 10000, 12000, 132, 1, -1, 4},
        {40, 8, 256, 32, 48, 1, 8000, 10000, 132, 0, -1, 4},
        /* MQA group 16 (8-row tiles), a 300-row block over 12k keys */
        {16, 1, 64, 128, 300, 1, 10000, 12000, 132, 1, -1, 2},
        /* a window inside long requests, many CTAs */
        {32, 8, 128, 16, 500, 3, 4000, 6000, 132, 1, 1500, 0},
    };
    for (size_t i = 0; i < sizeof V / sizeof V[0]; i++) {
        gqa_opts o = ctx_default_opts(V[i].hq, V[i].hkv, V[i].d, V[i].ps);
        gqa_split_opts(&o, &V[i], i);
        o.variant = 1; /* context_walk: the default row may pick the list schedule, which
                          never splits, and this test is about the merge */
        int32_t q[3], kv[3];
        for (int32_t b = 0; b < V[i].B; b++) {
            q[b] = V[i].ql;
            kv[b] = tt_rng_int(&rng, V[i].lo, V[i].hi);
        }
        ctx_case x;
        init_or_fail(&x, &o, q, kv, V[i].B, 0, &rng);
        const gt_case g = gt(&x);
        if (V[i].min > 0) gt_require_splits(&g, V[i].min);
        gt_check(&g, 2);
        ctx_case_free(&x);
    }
}

/* ---- requests without rows or without keys ----------------------------------------------- */

/* q_len 0 requests (only cached keys this step) between others, and requests whose kv_len
 * is 0 (their rows: zeros, lse -inf or the sink); sinks on and off, few CTAs. */
static void context_empty_requests_write_zeros_and_sink_lse(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(9);
    for (int k = 0; k < 4; k++) {
        gqa_opts o = k & 1 ? ctx_default_opts(32, 8, 128, 16) : ctx_default_opts(20, 4, 64, 64);
        o.sinks = k >= 2;
        o.num_ctas = 5;
        int32_t q[6] = {0, 3, 0, 50, 2, 0}, kv[6] = {0, 0, 0, 0, 0, 0};
        kv[2] = tt_rng_int(&rng, 1, 500); /* keys, no rows */
        kv[3] = 50 + tt_rng_int(&rng, 0, 300);
        kv[5] = tt_rng_int(&rng, 1, 100);
        run_and_check(&o, q, kv, 6, &rng, 2);
    }
}

/* ---- determinism ---------------------------------------------------------------------- */

/* Run, re-plan the same batch (a byte-identical plan), run again: out and lse bitwise
 * identical, on a split plan over 132 CTAs (pieces merged in split order, never in order of
 * arrival). */
static void context_same_inputs_give_bitwise_identical_outputs(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(10);
    gqa_opts o = ctx_default_opts(32, 8, 128, 32);
    o.num_ctas = 132;
    o.sinks = 1;
    int32_t q[2] = {32, 700}, kv[2];
    kv[0] = tt_rng_int(&rng, 6000, 9000);
    kv[1] = 700 + tt_rng_int(&rng, 0, 2000);
    ctx_case x;
    init_or_fail(&x, &o, q, kv, 2, 0, &rng);
    const gt_case g = gt(&x);
    gt_require_splits(&g, 2);
    gt_same_inputs_identical(&g);
}

/* ---- batches from the bundled trace ---------------------------------------------------- */

/* Prefill batches of the trace's prompts: the prompt lengths as they come (no cache), and
 * with a cached prefix of 300 tokens (q_len = ContextTokens - 300, at least 1); 32/8 heads
 * D 128 and 16/4 D 64; the device's CTAs and 24. */
static void context_trace_prefill_batches_match_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(11);
    for (int k = 0; k < 4; k++) {
        gqa_opts o = k & 1 ? ctx_default_opts(16, 4, 64, 16) : ctx_default_opts(32, 8, 128, 64);
        o.sinks = k == 3;
        o.num_ctas = k >= 2 ? 24 : 0;
        o.layout = GQA_HND;
        const int32_t prefix = k & 1 ? 300 : 0, n = 6;
        int32_t q[6], kv[6];
        char msg[MSG];
        if (ctx_trace_lengths(tt_rng_int(&rng, 0, 2047), n, prefix, -1, 0, 0, q, kv, msg,
                              sizeof msg))
            fail_msg("%s", msg);
        print_message("  trace prefill, cached prefix %d: q_len %d %d %d %d %d %d\n", prefix,
                      q[0], q[1], q[2], q[3], q[4], q[5]);
        run_and_check(&o, q, kv, n, &rng, 1);
    }
}

/* A mixed batch in one context plan and one fi_run: trace prompts' last chunks (512 tokens,
 * their earlier chunks cached) beside q_len-1 decodes of the trace's continuous batching
 * (fitrace_mixed); 32/8 heads D 128, on the device's CTAs and on 20. */
static void context_mixed_prefill_chunks_and_decodes_in_one_run(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(12);
    for (int k = 0; k < 2; k++) {
        gqa_opts o = ctx_default_opts(32, 8, 128, 32);
        o.num_ctas = k ? 20 : 0;
        o.sinks = k;
        o.layout = k ? GQA_HND : GQA_NHD;
        o.kv_form = GQA_KV_PAIR;
        const int32_t n = 24, num_prefill = 3;
        int32_t q[24], kv[24];
        char msg[MSG];
        if (ctx_trace_lengths(tt_rng_int(&rng, 0, 2047), n, 0, num_prefill, 512,
                              tt_rng_int(&rng, 0, 60), q, kv, msg, sizeof msg))
            fail_msg("%s", msg);
        print_message("  mixed: %d chunks (q_len %d %d %d) + %d decodes\n", num_prefill, q[0],
                      q[1], q[2], n - num_prefill);
        run_and_check(&o, q, kv, n, &rng, 2);
    }
}

/* ---- bad tensors: each a specific status, nothing launched -------------------------------- */

/* fi_run(a) must return want (nothing launched); else free the case and fail naming what. */
static void expect_status(ctx_case *x, const fi_attn_args *a, fi_status want, const char *what) {
    const gt_case g = gt(x);
    gt_expect_status(&g, a, want, what);
}

/* Out and lse still all 0xff after the refusals (stream synchronised first). */
static void expect_untouched(ctx_case *x) {
    const gt_case g = gt(x);
    gt_expect_untouched(&g);
}

/* Poison the case's outputs and wait, so expect_untouched can tell a write. */
static void poison_or_fail(ctx_case *x) {
    char msg[MSG];
    assert_int_equal(gqa_case_poison(&x->g, msg, sizeof msg), 0);
    assert_int_equal(cudaStreamSynchronize(x->g.stream), cudaSuccess);
}

/* The first call must already pass: the case's own arguments run (else the family has not
 * landed and every status below would be that refusal). */
static void context_bad_tensors_return_their_status_and_write_nothing(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(13);
    gqa_opts o = ctx_default_opts(32, 8, 128, 16);
    o.kv_form = GQA_KV_PAIR;
    o.sinks = 1;
    int32_t q[3] = {100, 17, 300}, kv[3] = {150, 17, 600};
    ctx_case x;
    char msg[MSG];
    init_or_fail(&x, &o, q, kv, 3, 0, &rng);
    gqa_case *c = &x.g;
    if (gqa_case_run(c, msg, sizeof msg)) { /* the good arguments run */
        ctx_case_free(&x);
        fail_msg("%sgood arguments: %s", unsupported(msg) ? NOT_YET : "", msg);
    }
    poison_or_fail(&x);
    const fi_attn_args good = gqa_case_args(c);
    const gt_case g = gt(&x);
    /* what the GQA decode family refuses too (the same tensor checks) */
    gt_expect_paged_tensor_statuses(&g, &good);
    /* and the context batch's own: rows of cum_seq_lens_q[B], the block table's shape */
    fi_attn_args a;
    a = good; a.page_table.data = NULL;
    expect_status(&x, &a, FI_ERR_NULL_ARGUMENT, "block_tables missing");
    a = good; a.out.shape[0] = c->tokens - 1;
    expect_status(&x, &a, FI_ERR_SHAPE_MISMATCH, "out fewer rows than cum_seq_lens_q[B]");
    a = good; a.lse.shape[0] = c->tokens - 1;
    expect_status(&x, &a, FI_ERR_SHAPE_MISMATCH, "lse fewer rows than cum_seq_lens_q[B]");
    a = good; a.lse.shape[1] = 8;
    expect_status(&x, &a, FI_ERR_SHAPE_MISMATCH, "lse 8 heads under H_q 32");
    a = good; a.page_table.shape[0] = c->B - 1;
    expect_status(&x, &a, FI_ERR_SHAPE_MISMATCH, "block_tables B - 1 rows");
    a = good; a.page_table.shape[1] = c->P - 1;
    expect_status(&x, &a, FI_ERR_SHAPE_MISMATCH, "block_tables P - 1 columns");
    a = good; a.page_table.ndim = 3; a.page_table.shape[1] = 1; a.page_table.shape[2] = c->P;
    expect_status(&x, &a, FI_ERR_SHAPE_MISMATCH, "block_tables [B, 1, P] under a 2-D plan");
    a = good; a.page_table.stride[0] = c->P + 1;
    expect_status(&x, &a, FI_ERR_BAD_STRIDE, "block_tables row stride P + 1");
    /* KV views of another dtype than this bf16 plan's (every KV dtype has its plan) */
    a = good; a.k.dtype = a.v.dtype = FI_DTYPE_E4M3;
    expect_status(&x, &a, FI_ERR_UNSUPPORTED_DTYPE, "k / v fp8 e4m3 under bf16 KV caps");
    a = good; a.k.dtype = a.v.dtype = FI_DTYPE_E2M1; a.k.shape[3] = a.v.shape[3] = 64;
    expect_status(&x, &a, FI_ERR_UNSUPPORTED_DTYPE, "k / v NVFP4 under bf16 KV caps");
    a = good; a.bmm1_scale_ptr = (const float *)((uintptr_t)c->d_scales + 2);
    expect_status(&x, &a, FI_ERR_MISALIGNED_POINTER, "bmm1_scale_ptr + 2 bytes");
    a = good; a.skip_softmax_threshold_scale_factor = -1.f;
    expect_status(&x, &a, FI_ERR_INVALID_ARGUMENT, "skip_softmax factor -1");
    a = good; a.skip_softmax_threshold_scale_factor = NAN;
    expect_status(&x, &a, FI_ERR_INVALID_ARGUMENT, "skip_softmax factor NaN");
    a = good; a.skip_softmax_threshold_scale_factor = 1.f;
    a.skip_softmax_stats = (unsigned long long *)((uintptr_t)c->d_scales + 4);
    expect_status(&x, &a, FI_ERR_MISALIGNED_POINTER, "skip_softmax_stats + 4 bytes");
    expect_untouched(&x);

    /* not planned: a device plan before its first update, and a host-only plan */
    const fi_caps caps = gqa_caps(&c->o, c->B, c->tokens, c->num_pages);
    gt_expect_unplanned_refused(&g, &caps, &c->fb.batch, &good);
    expect_untouched(&x);
    /* and the plan still runs right */
    gt_check(&g, 1);
    ctx_case_free(&x);
}

/* ---- fp8 e4m3 KV ------------------------------------------------------------------------- */

/* fp8 e4m3 caches (random e4m3 bytes, every finite value; the fp64 reference reads the
 * same bytes, the dequantisation scale folded into bmm1 / bmm2 as the API asks): D 64 /
 * 128 / 256, bf16 and fp16 q, groups 1 / 4 / 8, page sizes 16 / 64, the sweep's layouts,
 * forms, sinks, windows and CTA counts (gqa_sweep_opts), q_len mixes over cached prefixes,
 * and fp8 output on two of them; then a long request whose tiles must be cut and merged. */
/* Case k (0..11) of the quantised-KV sweeps (fp8 e4m3, NVFP4): D 64 / 128 / 256 (k % 3),
 * group 1 / 4 / 8 over 2 or 1 KV heads, page size 16 / 64, bf16 / fp16 by k's parity, the
 * every-shape sweep's options of index k + sweep (gqa_sweep_opts); three requests of q_len
 * Q_MIX[(k + qstep b) % 5] into q, request 0 without a cached prefix, the others with 1 ..
 * 900 keys before their rows, into kv. */
static gqa_opts quant_kv_case(int k, fi_dtype kv_dtype, int sweep, int qstep, int32_t *q,
                              int32_t *kv, tt_rng *rng) {
    const int32_t d = DIMS[k % 3], g = k % 4 == 3 ? 8 : k % 2 ? 4 : 1;
    const int32_t hkv = g == 8 ? 1 : 2, ps = PAGES[(k / 3) & 1];
    gqa_opts o = ctx_default_opts(g * hkv, hkv, d, ps);
    o.kv_dtype = kv_dtype;
    o.dtype = k & 1 ? FI_DTYPE_F16 : FI_DTYPE_BF16;
    gqa_sweep_opts(&o, k + sweep, ps);
    for (int32_t b = 0; b < 3; b++) {
        q[b] = Q_MIX[(k + qstep * b) % 5];
        kv[b] = q[b] + (b == 0 ? 0 : tt_rng_int(rng, 1, 900));
    }
    return o;
}

/* 8 tiles (one per KV head, 32/8 heads D 128) of an 11000-key request beside a decode, on
 * the device's CTAs: the tiles must be cut and merged.  Its plan's split figures. */
static split_stats quant_kv_long_request(fi_dtype kv_dtype, int sinks, tt_rng *rng) {
    gqa_opts o = ctx_default_opts(32, 8, 128, 64);
    o.kv_dtype = kv_dtype;
    o.sinks = sinks;
    int32_t q[2] = {32, 1}, kv[2] = {11000, 700};
    return run_and_check(&o, q, kv, 2, rng, 2);
}

static void context_fp8_kv_matches_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(14);
    int n_split = 0;
    for (int k = 0; k < 12; k++) {
        int32_t q[3], kv[3];
        gqa_opts o = quant_kv_case(k, FI_DTYPE_E4M3, 5, 1, q, kv, &rng);
        o.o_dtype = k % 5 == 4 ? FI_DTYPE_E4M3 : 0;
        n_split += run_and_check(&o, q, kv, 3, &rng, 2).groups > 0;
    }
    const split_stats s = quant_kv_long_request(FI_DTYPE_E4M3, 0, &rng);
    print_message("  13 fp8 KV cases: %d of the first 12 with merged splits, the last %d groups\n",
                  n_split, s.groups);
    assert_true(s.groups > 0); /* the long request's tiles were cut and merged */
}

/* ---- NVFP4 KV ------------------------------------------------------------------------------- */

/* NVFP4 caches (random bytes: every e2m1 pair, signs and zeros included; random e4m3 block
 * scales per 16 values, k_sf / v_sf packed in the cache's own layout and form) against the
 * fp64 reference run on the same cache dequantised to fp32 (e2m1 x scale: the kernel's
 * conversion is exact, so the bound is the 16-bit cache's, 1e-2 a row): D 64 / 128 / 256,
 * bf16 and fp16 q, groups 1 / 4 / 8, page sizes 16 / 64, the sweep's layouts, one tensor /
 * (K, V) pair, sinks, windows and CTA counts (gqa_sweep_opts), [B, 2, P] tables, q_len mixes
 * over cached prefixes, fp8 output on two; then a long request whose tiles must be cut and
 * merged. */
static void context_nvfp4_kv_matches_dequantised_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(16);
    int n_split = 0, n_win = 0, n_sinks = 0, n_pair = 0, n_hnd = 0;
    for (int k = 0; k < 12; k++) {
        int32_t q[3], kv[3];
        gqa_opts o = quant_kv_case(k, FI_DTYPE_E2M1, 7, 2, q, kv, &rng);
        o.o_dtype = k % 5 == 2 ? FI_DTYPE_E4M3 : 0;
        o.kv_split_pages = k % 4 == 1;
        n_split += run_and_check(&o, q, kv, 3, &rng, 2).groups > 0;
        n_win += o.windowed;
        n_sinks += o.sinks;
        n_pair += o.kv_form == GQA_KV_PAIR;
        n_hnd += o.layout == GQA_HND;
    }
    const split_stats s = quant_kv_long_request(FI_DTYPE_E2M1, 1, &rng);
    print_message("  13 NVFP4 KV cases: of the first 12 %d with merged splits, %d windowed, %d "
                  "with sinks, %d (K, V) pairs, %d HND; the last %d groups\n",
                  n_split, n_win, n_sinks, n_pair, n_hnd, s.groups);
    assert_true(n_win > 0 && n_sinks > 0 && n_pair > 0 && n_pair < 12 && n_hnd > 0 && n_hnd < 12);
    assert_true(s.groups > 0); /* the long request's tiles were cut and merged */
}

/* An NVFP4 plan refuses broken block scales and k / v rows of the wrong width, each with its
 * status and nothing written (the shared checks, gt_expect_nvfp4_scale_statuses); the
 * case's own arguments run before and after. */
static void context_nvfp4_bad_scale_tensors_return_their_status(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(17);
    gqa_opts o = ctx_default_opts(32, 8, 128, 16);
    o.kv_dtype = FI_DTYPE_E2M1;
    o.kv_form = GQA_KV_PAIR;
    int32_t q[3] = {100, 1, 40}, kv[3] = {300, 50, 40};
    ctx_case x;
    init_or_fail(&x, &o, q, kv, 3, 0, &rng);
    const fi_attn_args good = gqa_case_args(&x.g);
    const gt_case g = gt(&x);
    gt_expect_nvfp4_scale_statuses(&g, &good);
    gt_check(&g, 1);
    ctx_case_free(&x);
}

/* ---- skip-softmax (skip_softmax_threshold_scale_factor) -------------------------------- */

/* Plant keys every query row attends to: dims [0, 32) of every q row and of the K rows of
 * each request's first 64 tokens set to 2 (the rest of the data random in [-1, 1]), so
 * those keys' logits stand about 11 nats (32 x 4 x bmm1_scale 1/sqrt(128)) above the
 * others', whose blocks then fall under factor / kv_len of the running max. */
static void plant_dominant_keys(ctx_case *x) {
    gqa_case *c = &x->g;
    const int64_t D = c->o.head_dim, Hq = c->o.heads_q, Hkv = c->o.heads_kv, ps = c->o.page_size;
    const uint16_t two = gc_from_f32(c->o.dtype, 2.f);
    for (int64_t t = 0; t < (int64_t)c->tokens; t++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t d = 0; d < 32; d++)
                c->h_q[(t * Hq + h) * D + d] = two;
    for (int32_t b = 0; b < c->B; b++) {
        const int32_t *pages = ctx_request_pages(c, b, 0);
        for (int64_t t = 0; t < 64 && t < c->fb.kv_lens[b]; t++)
            for (int64_t h = 0; h < Hkv; h++) {
                const int64_t row = ((int64_t)pages[t / ps] * ps + t % ps) * Hkv + h;
                uint16_t *k = (uint16_t *)(c->h_k + row * c->row_bytes);
                for (int64_t d = 0; d < 32; d++)
                    k[d] = two;
            }
    }
}

/* Run the case with the skip factor (stats counted into d_stats, zeroed first) and
 * download; fails the test on an error. */
static void run_skip(ctx_case *x, float factor, unsigned long long *d_stats, unsigned long long *stats) {
    gqa_case *c = &x->g;
    char msg[MSG];
    assert_int_equal(cudaMemset(d_stats, 0, 16), cudaSuccess);
    fi_attn_args a = gqa_case_args(c);
    a.skip_softmax_threshold_scale_factor = factor;
    a.skip_softmax_stats = d_stats;
    if (gqa_case_run_args(c, &a, msg, sizeof msg) || gqa_case_download(c, msg, sizeof msg))
        fail_msg("skip factor %g: %s", (double)factor, msg);
    assert_int_equal(cudaMemcpy(stats, d_stats, 16, cudaMemcpyDeviceToHost), cudaSuccess);
}

/* Factor absent (0): the dense kernel, nothing counted.  A factor too small to skip a
 * block with a key (1e-30): the same bytes; every block decided, and skipped only where no
 * row of the half tile has a key in it (exact: such a block adds nothing).  Factor 1 on
 * planted data: many more blocks skipped, the output within the bf16 tolerance of the
 * exact fp64 truth (a row's dropped mass is under factor / 64 of its sum: 64 dominant
 * keys); the fractions and errors reported.  32/8 heads, D 128, page 64, two requests over cached
 * prefixes, 24 CTAs (splits merged). */
static void context_skip_softmax_skips_dominated_blocks(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(16);
    gqa_opts o = ctx_default_opts(32, 8, 128, 64);
    o.num_ctas = 24;
    int32_t q[2] = {1000, 700}, kv[2] = {2000, 1500};
    ctx_case x;
    char msg[MSG];
    init_or_fail(&x, &o, q, kv, 2, 0, &rng);
    gqa_case *c = &x.g;
    plant_dominant_keys(&x);
    if (gqa_case_upload(c, msg, sizeof msg) || gqa_case_set_layout(c, c->o.layout, c->o.kv_form, msg, sizeof msg) ||
        ctx_case_reference(&x, msg, sizeof msg))
        fail_msg("planted case: %s", msg);
    unsigned long long *d_stats = NULL, st[2];
    assert_int_equal(cudaMalloc((void **)&d_stats, 16), cudaSuccess);
    double wo[3], wl;
    run_skip(&x, 0.f, d_stats, st);
    assert_true(st[0] == 0 && st[1] == 0); /* off: nothing counted */
    if (ctx_case_compare(&x, &wo[0], &wl, msg, sizeof msg)) fail_msg("dense: %s", msg);
    const size_t n = c->out_bytes;
    unsigned char *dense = malloc(n);
    assert_non_null(dense);
    memcpy(dense, c->h_out, n);
    run_skip(&x, 1e-30f, d_stats, st);
    assert_true(st[0] > 0);
    assert_memory_equal(dense, c->h_out, n);
    if (ctx_case_compare(&x, &wo[1], &wl, msg, sizeof msg)) fail_msg("factor 1e-30: %s", msg);
    const unsigned long long decided = st[0], empty = st[1];
    run_skip(&x, 1.f, d_stats, st);
    assert_true(st[0] == decided);
    assert_true(st[1] - empty > (decided - empty) / 4); /* a quarter of the rest at least */
    if (ctx_case_compare(&x, &wo[2], &wl, msg, sizeof msg)) fail_msg("factor 1: %s", msg);
    print_message("  skip-softmax: %llu half-tile blocks decided, %llu without keys (skipped "
                  "at 1e-30, bitwise the dense output); factor 1: %llu skipped (%.1f%% of those "
                  "with keys), worst row error %.2e (dense %.2e)\n", decided, empty, st[1],
                  100.0 * (double)(st[1] - empty) / (double)(decided - empty), wo[2], wo[0]);
    free(dense);
    cudaFree(d_stats);
    ctx_case_free(&x);
}

/* ---- NVFP4 out ------------------------------------------------------------------------------ */

/* Build x with NVFP4 out (caps.o_dtype E2M1), run it twice (nv4_run_twice), check against
 * the fp64 truth (nv4_compare), log the figures; the plan's split figures returned.  g:
 * the global scale (0: one drawn from [100, 1000], keeping (amax / 6) g in e4m3's normal
 * range for |out| ~ 0.01 .. 2). */
static split_stats nvfp4_run_and_check(gqa_opts o, const int32_t *q, const int32_t *kv,
                                       int32_t n, int full, float g, int32_t vec_size,
                                       int32_t min_splits, tt_rng *rng) {
    o.o_dtype = FI_DTYPE_E2M1;
    if (!(g > 0.0f)) g = 100.0f + 900.0f * 0.5f * (tt_rng_float(rng) + 1.0f);
    ctx_case x;
    char msg[MSG], name[MSG];
    init_or_fail(&x, &o, q, kv, n, full, rng);
    const split_stats s = plan_split_stats(x.g.plan);
    if (min_splits > 0) {
        const gt_case gc = gt(&x);
        gt_require_splits(&gc, min_splits);
    }
    ctx_case_name(&x, name, sizeof name);
    nv4_stats st = {0}; /* (fail_msg longjmps: some compilers think st may be read unset) */
    if (nv4_run_twice(&x, g, vec_size, msg, sizeof msg) || ctx_case_reference(&x, msg, sizeof msg) ||
        nv4_compare(&x, g, &st, msg, sizeof msg)) {
        ctx_case_free(&x);
        fail_msg("%sNVFP4 out, g %g: %s\n  case: %s", unsupported(msg) ? NOT_YET : "", g, msg,
                 name);
    }
    print_message("  nvfp4 out g %.1f: %lld blocks, scale bytes off the host's %lld, codes "
                  "off %lld / %lld, worst error / bound %.2f; %s\n", g, (long long)st.blocks,
                  (long long)st.scale_flips, (long long)st.code_flips, (long long)st.elems,
                  st.worst, name);
    ctx_case_free(&x);
    return s;
}

/* NVFP4 out (two e2m1 codes a byte + an e4m3 scale a 16-element block, global scale g):
 * D 64 / 128 / 256, bf16 and fp16 q, groups 1 / 4 / 8, sinks, HND / NHD, q_len mixes over
 * cached prefixes on the device's CTAs (mostly unsplit rows) and on few CTAs; then long
 * requests on few CTAs whose tiles must be cut (merged rows quantised by the merge), every
 * row checked. */
static void context_nvfp4_out_matches_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(16);
    for (int k = 0; k < 6; k++) {
        const int32_t d = DIMS[k % 3], grp = k % 3 == 2 ? 8 : k & 1 ? 4 : 1;
        const int32_t hkv = grp == 8 ? 1 : 2;
        gqa_opts o = ctx_default_opts(grp * hkv, hkv, d, PAGES[k & 1]);
        o.dtype = k & 2 ? FI_DTYPE_F16 : FI_DTYPE_BF16;
        o.sinks = k & 1;
        o.layout = k & 2 ? GQA_HND : GQA_NHD;
        o.num_ctas = k >= 3 ? 7 : 0;
        int32_t q[3], kv[3];
        for (int32_t b = 0; b < 3; b++) {
            q[b] = Q_MIX[(k + b) % 5];
            kv[b] = q[b] + (b == 0 ? 0 : tt_rng_int(&rng, 1, 900));
        }
        nvfp4_run_and_check(o, q, kv, 3, 0, 0.0f, k & 1 ? 16 : 0, 0, &rng);
    }
    /* merged rows: short blocks over long KV on 8 CTAs, the walk schedule (which splits) */
    static const int32_t M[3][4] = {{16, 2, 128, 64}, {32, 8, 64, 16}, {16, 2, 256, 32}};
    int n_merged = 0;
    for (int k = 0; k < 3; k++) {
        gqa_opts o = ctx_default_opts(M[k][0], M[k][1], M[k][2], M[k][3]);
        o.num_ctas = 8;
        o.variant = 1;
        o.sinks = k != 1;
        int32_t q[2] = {16 + 8 * k, 3}, kv[2];
        kv[0] = tt_rng_int(&rng, 5000, 7000);
        kv[1] = tt_rng_int(&rng, 3, 400);
        n_merged += nvfp4_run_and_check(o, q, kv, 2, 1, 0.0f, 16, 2, &rng).groups > 0;
    }
    assert_int_equal(n_merged, 3);
}

/* Bad NVFP4 arguments: each its status, nothing launched (out, scales and lse untouched);
 * the good arguments run first. */
static void context_nvfp4_out_bad_arguments_return_their_status(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(17);
    gqa_opts o = ctx_default_opts(16, 4, 128, 16);
    o.o_dtype = FI_DTYPE_E2M1;
    int32_t q[2] = {70, 1}, kv[2] = {90, 300};
    ctx_case x;
    char msg[MSG];
    init_or_fail(&x, &o, q, kv, 2, 0, &rng);
    gqa_case *c = &x.g;
    if (nv4_run_twice(&x, 200.0f, 16, msg, sizeof msg)) {
        ctx_case_free(&x);
        fail_msg("%sgood NVFP4 arguments: %s", unsupported(msg) ? NOT_YET : "", msg);
    }
    poison_or_fail(&x);
    const fi_attn_args good = nv4_args(c, 200.0f, 16);
    fi_attn_args a;
    a = good; a.o_sf_vec_size = 32;
    expect_status(&x, &a, FI_ERR_UNSUPPORTED_SF_VEC_SIZE, "o_sf_vec_size 32");
    a = good; a.o_sf_vec_size = 8;
    expect_status(&x, &a, FI_ERR_UNSUPPORTED_SF_VEC_SIZE, "o_sf_vec_size 8");
    a = good; a.o_sf_scale = 0.0f;
    expect_status(&x, &a, FI_ERR_INVALID_ARGUMENT, "o_sf_scale 0");
    a = good; a.o_sf_scale = -2.0f;
    expect_status(&x, &a, FI_ERR_INVALID_ARGUMENT, "o_sf_scale -2");
    a = good; a.o_sf_scale = NAN;
    expect_status(&x, &a, FI_ERR_INVALID_ARGUMENT, "o_sf_scale NaN");
    a = good; a.o_sf_scale = INFINITY;
    expect_status(&x, &a, FI_ERR_INVALID_ARGUMENT, "o_sf_scale inf");
    a = good; a.o_sf.data = NULL;
    expect_status(&x, &a, FI_ERR_NULL_ARGUMENT, "o_sf missing");
    a = good; a.o_sf.dtype = FI_DTYPE_BF16;
    expect_status(&x, &a, FI_ERR_UNSUPPORTED_DTYPE, "o_sf bf16");
    a = good; a.o_sf.shape[2] = 16;
    expect_status(&x, &a, FI_ERR_SHAPE_MISMATCH, "o_sf [.., D / 8]");
    a = good; a.o_sf.shape[1] = 8;
    expect_status(&x, &a, FI_ERR_SHAPE_MISMATCH, "o_sf 8 heads under H_q 16");
    a = good; a.o_sf.shape[0] = c->tokens - 1;
    expect_status(&x, &a, FI_ERR_SHAPE_MISMATCH, "o_sf a token short");
    a = good; a.o_sf.ndim = 2; a.o_sf.shape[1] = 16 * 8;
    expect_status(&x, &a, FI_ERR_SHAPE_MISMATCH, "o_sf 2-D [T, H D / 16]");
    a = good; a.o_sf.stride[2] = 2;
    expect_status(&x, &a, FI_ERR_BAD_STRIDE, "o_sf last stride 2");
    a = good; a.o_sf.stride[1] = -8;
    expect_status(&x, &a, FI_ERR_BAD_STRIDE, "o_sf negative head stride");
    a = good; a.out.dtype = FI_DTYPE_BF16;
    expect_status(&x, &a, FI_ERR_UNSUPPORTED_DTYPE, "out bf16 under an NVFP4 plan");
    a = good; a.out.shape[2] = 128;
    expect_status(&x, &a, FI_ERR_SHAPE_MISMATCH, "out [.., D] elements, not D / 2 bytes");
    a = good; a.out.stride[2] = 2;
    expect_status(&x, &a, FI_ERR_BAD_STRIDE, "out last stride 2");
    expect_untouched(&x);
    /* block scales on a plan whose out is not NVFP4; NVFP4 out for another kind */
    ctx_case y;
    o.o_dtype = 0;
    init_or_fail(&y, &o, q, kv, 2, 0, &rng);
    poison_or_fail(&y);
    a = gqa_case_args(&y.g);
    a.o_sf = good.o_sf;
    a.o_sf_scale = 1.0f;
    expect_status(&y, &a, FI_ERR_INVALID_ARGUMENT, "o_sf given for bf16 out");
    expect_untouched(&y);
    ctx_case_free(&y);
    gqa_opts od = o;
    od.kind = FI_KIND_GQA_DECODE;
    od.o_dtype = FI_DTYPE_E2M1;
    fi_caps caps = gqa_caps(&od, 2, 2, 16);
    assert_int_equal(fi_caps_validate(&caps), FI_ERR_UNSUPPORTED_DTYPE);
    ctx_case_free(&x);
}

/* ---- one small split case, for compute-sanitizer memcheck / racecheck -------------------- */

/* 16/4 heads D 128, page 16, HND (K, V) pair, sinks, 8 CTAs: a 40-row block over 1500 keys
 * cut into merged pieces beside a short request; every row checked. */
static void sanitize_case(fi_dtype kv_dtype) {
    tt_rng rng = gt_test_rng(15);
    gqa_opts o = ctx_default_opts(16, 4, 128, 16);
    o.kv_dtype = kv_dtype;
    o.num_ctas = 8;
    o.sinks = 1;
    o.layout = GQA_HND;
    o.kv_form = GQA_KV_PAIR;
    int32_t q[2] = {40, 3}, kv[2] = {1500, 700};
    ctx_case x;
    init_or_fail(&x, &o, q, kv, 2, 1, &rng);
    const gt_case g = gt(&x);
    gt_require_splits(&g, 2);
    gt_check(&g, 1);
    ctx_case_free(&x);
}
static void sanitize_small_case(void **state) {
    (void)state;
    REQUIRE_GPU();
    sanitize_case(0);
}
/* The same with an fp8 e4m3 cache (the producer's register path, ordinary stores). */
static void sanitize_small_case_fp8_kv(void **state) {
    (void)state;
    REQUIRE_GPU();
    sanitize_case(FI_DTYPE_E4M3);
}
/* The same with an NVFP4 cache (the register path with the block-scale rows). */
static void sanitize_small_case_nvfp4_kv(void **state) {
    (void)state;
    REQUIRE_GPU();
    sanitize_case(FI_DTYPE_E2M1);
}
/* The same with NVFP4 out (the quad's shuffles and byte stores in the tile's epilogue and
 * in the merge), every row checked. */
static void sanitize_small_case_nvfp4_out(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(18);
    gqa_opts o = ctx_default_opts(16, 4, 128, 16);
    o.num_ctas = 8;
    o.sinks = 1;
    o.layout = GQA_HND;
    o.kv_form = GQA_KV_PAIR;
    int32_t q[2] = {40, 3}, kv[2] = {1500, 700};
    nvfp4_run_and_check(o, q, kv, 2, 1, 0.0f, 16, 2, &rng);
}

int main(void) {
    gt_begin("test_context_gpu");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sanitize_small_case),
        cmocka_unit_test(sanitize_small_case_fp8_kv),
        cmocka_unit_test(sanitize_small_case_nvfp4_kv),
        cmocka_unit_test(context_skip_softmax_skips_dominated_blocks),
        cmocka_unit_test(sanitize_small_case_nvfp4_out),
        cmocka_unit_test(context_nvfp4_out_bad_arguments_return_their_status),
        cmocka_unit_test(context_nvfp4_out_matches_reference),
        cmocka_unit_test(context_bad_tensors_return_their_status_and_write_nothing),
        cmocka_unit_test(context_nvfp4_bad_scale_tensors_return_their_status),
        cmocka_unit_test(context_fp8_kv_matches_reference),
        cmocka_unit_test(context_nvfp4_kv_matches_dequantised_reference),
        cmocka_unit_test(context_matches_reference_every_shape),
        cmocka_unit_test(context_window_left_and_sinks_match_reference),
        cmocka_unit_test(context_non_causal_matches_reference),
        cmocka_unit_test(context_batch_forms_match_reference),
        cmocka_unit_test(context_layouts_and_kv_forms_are_bitwise_identical),
        cmocka_unit_test(context_device_pointer_scales_match_reference),
        cmocka_unit_test(context_fp8_out_matches_reference),
        cmocka_unit_test(context_split_merge_matches_reference_few_and_many_ctas),
        cmocka_unit_test(context_empty_requests_write_zeros_and_sink_lse),
        cmocka_unit_test(context_same_inputs_give_bitwise_identical_outputs),
        cmocka_unit_test(context_trace_prefill_batches_match_reference),
        cmocka_unit_test(context_mixed_prefill_chunks_and_decodes_in_one_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
