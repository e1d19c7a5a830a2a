/*
 * tests/gpu/test_gqa_gpu.c - the CUDA GQA paged decode family (fi_run, FI_KIND_GQA_DECODE,
 * the surface of xqa_batch_decode_with_kv_cache) against the naive fp64 reference
 * (fi_naive_attention), on the GPU machine.  Every test skips without a device.
 *
 * Fresh random inputs each run; the seed is printed and FI_TEST_SEED=<seed> replays it.
 * Outputs are poisoned with NaN before each run; a NaN left anywhere fails (full coverage).
 * Tolerance (tests/gpu/gqa_gpu_case.h): per (token, head) row ||out - ref|| / ||ref|| <=
 * 1e-2 for bf16 / fp16 out (also with fp8 KV, against the dequantised reference), 7e-2 for
 * fp8 out (after out x o_scale: e4m3 rounding alone is up to 6.25% an element); lse within
 * 1e-2 absolute; keyless rows exactly zero with lse -inf (or the sink).
 * Cases are planned through the public API only (caps.num_ctas picks the CTAs, the planner
 * the splits; tests that need splits assert the plan has them).
 *
 * fp8 KV / fp8 out / NVFP4 KV are separate tests: while the GPU family refuses a dtype the
 * fp8 tests FAIL with a line saying so (not skip: the missing support must show); the
 * NVFP4 tests skip with a line while the caps refuse E2M1 (planned later).
 *
 * Run one test only (e.g. under compute-sanitizer):
 *   FI_GPU_TEST_FILTER=sanitize_small_case compute-sanitizer --tool memcheck \
 *       build/tests/gpu/test_gqa_gpu
 *   FI_GPU_TEST_FILTER=sanitize_small_case compute-sanitizer --tool racecheck \
 *       build/tests/gpu/test_gqa_gpu
 * (the filter is a cmocka glob over test names).
 */
#include "gpu/gqa_gpu_case.h"
#include "gpu/gpu_test_common.h"

#define MSG 768

static gqa_opts default_opts(int32_t hq, int32_t hkv, int32_t d, int32_t ps) {
    gqa_opts o;
    memset(&o, 0, sizeof o);
    o.dtype = FI_DTYPE_BF16;
    o.heads_q = hq;
    o.heads_kv = hkv;
    o.head_dim = d;
    o.page_size = ps;
    o.q_len = 1;
    o.return_lse = 1;
    return o;
}

/* 1 when the message says the library refused the case as not supported (yet). */
static int unsupported(const char *msg) {
    return strstr(msg, "FI_ERR_UNSUPPORTED_DTYPE") || strstr(msg, "FI_ERR_UNSUPPORTED_KIND");
}

/* kv_len of request b: 0 (allowed for every request, causal too: an empty request), 1 ..
 * page boundaries (ps - 1, ps, ps + 1, 2 ps) or uniform up to max_kv; causal requests with
 * keys get at least q_len of them. */
static int32_t pick_kv_len(tt_rng *r, int32_t b, int32_t q_len, int32_t ps, int32_t max_kv) {
    int32_t v;
    switch (b % 6) {
    case 0: v = b == 0 ? 0 : q_len; break;
    case 1: v = 1; break;
    case 2: v = ps - 1 + tt_rng_int(r, 0, 2); break;
    case 3: v = 2 * ps; break;
    default: v = tt_rng_int(r, 1, max_kv); break;
    }
    if (v > 0 && v < q_len) v = q_len;
    return v;
}

/* ---- the case as the shared harness (gpu_test_common.h) sees it ------------------------- */

static fi_attn_args fam_args(const void *c) { return gqa_case_args((const gqa_case *)c); }
static int fam_upload(void *c, char *msg, size_t cap) {
    return gqa_case_upload((gqa_case *)c, msg, cap);
}
static int fam_reference(void *c, char *msg, size_t cap) {
    return gqa_case_reference((gqa_case *)c, msg, cap);
}
/* Every request at the tolerance of the case's output dtype. */
static int fam_compare(void *c, double *wo, double *wl, char *msg, size_t cap) {
    const gqa_case *g = (const gqa_case *)c;
    return gqa_case_compare(g, 0, g->B, gqa_case_tol(g), wo, wl, msg, cap);
}
static void fam_name(const void *c, char *buf, size_t cap) {
    gqa_case_name((const gqa_case *)c, buf, cap);
}
static void fam_free(void *c) { gqa_case_free((gqa_case *)c); }
/* The graph loop's fresh q and bmm1 scale (bmm1 scaled by sqrt(576 / D) as at init). */
static void fam_new_step_inputs(void *c, tt_rng *rng) {
    gqa_case *g = (gqa_case *)c;
    gc_fill_random(g->h_q, g->n_q, g->o.dtype, rng);
    g->bmm1_scale = (0.05f + 0.1f * (tt_rng_float(rng) + 1.0f) * 0.5f) *
                    sqrtf(576.0f / (float)g->o.head_dim);
}

/* In gt_family's order: args, upload, reference, compare, name, free, new_step_inputs,
 * unsupported. */
static const gt_family GQA_FAMILY = {fam_args, fam_upload, fam_reference, fam_compare,
                                     fam_name, fam_free, fam_new_step_inputs, unsupported};

/* The case as the shared tests see it (taken after init). */
static gt_case gt(gqa_case *c) {
    return gt_case_make(c, &GQA_FAMILY, c->plan, c->stream, &c->fb, c->B, c->P, c->num_pages,
                        gqa_case_outputs(c));
}

/* Run c once, or twice (runs 2: without, then with PDL; bitwise identical), compare with
 * the fp64 reference, print; on failure free c and fail the test (a refusal as
 * unsupported says so first). */
static void check_case(gqa_case *c, int runs) {
    const gt_case g = gt(c);
    gt_check(&g, runs);
}

/* gqa_case_init or fail the test (naming an unsupported dtype as such). */
static void init_or_fail(gqa_case *c, const gqa_opts *o, const int32_t *kv, int32_t n,
                         tt_rng *rng) {
    char msg[MSG];
    if (gqa_case_init(c, o, kv, n, rng, msg, sizeof msg))
        fail_msg("%sinit (H %d/%d D %d page_size %d q %s kv %s out %s): %s",
                 unsupported(msg) ? "NOT SUPPORTED YET: " : "", o->heads_q, o->heads_kv,
                 o->head_dim, o->page_size, gqa_dtype_name(o->dtype),
                 gqa_dtype_name(o->kv_dtype ? o->kv_dtype : o->dtype),
                 gqa_dtype_name(o->o_dtype ? o->o_dtype : o->dtype), msg);
}

static split_stats run_and_check(const gqa_opts *o, const int32_t *kv, int32_t n, tt_rng *rng,
                                 int runs) {
    gqa_case c;
    init_or_fail(&c, o, kv, n, rng);
    split_stats s = plan_split_stats(c.plan);
    check_case(&c, runs);
    gqa_case_free(&c);
    return s;
}

/* ---- every shape: D x group x page size (full cross), dtypes, every option ---------------- */

static const int32_t DIMS[3] = {64, 128, 256};
static const int32_t GROUPS[6] = {1, 2, 4, 5, 8, 16};
static const int32_t PAGES[4] = {16, 32, 64, 128};

/* One case per (D, group, page size): 72 cases.  dtype bf16 / fp16 alternates with the
 * parity of the three indices, so each D, each group and each page size runs in both;
 * H_kv rotates over 1, 2, 4, 8 (group 5 with H_kv 8 is Qwen's 40/8, 16 x 8 = 128 heads
 * the widest); q_len cycles 1..8 (causal when > 1); layout NHD / HND, single tensor / pair,
 * sinks, lse, scale pointers, page padding rotate on mixed index bits; CTAs: the device's
 * count or 2..25 (so tiles split into merged pieces and CTAs run several items);
 * window_left none or 0, 37, a page + 1, 250; page ids shuffled or in request order;
 * kv_len up to 700 (2000 on few CTAs), request 0 without keys. */
static void gqa_matches_reference_every_shape(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(1);
    int idx = 0, n_split = 0, n_multi = 0, n_empty = 0, n_dt[2] = {0, 0};
    for (int id = 0; id < 3; id++)
        for (int ig = 0; ig < 6; ig++)
            for (int ip = 0; ip < 4; ip++, idx++) {
                static const int32_t HKV[4] = {1, 2, 4, 8};
                int32_t hkv = HKV[(idx + ig) % 4];
                if (GROUPS[ig] == 16 && hkv > 4) hkv = 4;
                gqa_opts o = default_opts(GROUPS[ig] * hkv, hkv, DIMS[id], PAGES[ip]);
                o.dtype = (id + ig + ip) & 1 ? FI_DTYPE_F16 : FI_DTYPE_BF16;
                o.q_len = 1 + (idx * 3) % 8;
                gqa_sweep_opts(&o, idx, PAGES[ip]);
                const int32_t B = o.heads_q * o.q_len >= 256 ? tt_rng_int(&rng, 2, 3)
                                                             : tt_rng_int(&rng, 3, 6);
                int32_t kv[8];
                for (int32_t b = 0; b < B; b++) {
                    kv[b] = pick_kv_len(&rng, b, o.q_len, PAGES[ip], o.num_ctas ? 2000 : 700);
                    n_empty += kv[b] == 0;
                }
                split_stats s = run_and_check(&o, kv, B, &rng, 2);
                n_split += s.groups > 0;
                n_multi += s.multi_item_ctas > 0;
                n_dt[o.dtype == FI_DTYPE_F16]++;
            }
    print_message("  %d cases (%d bf16, %d fp16): %d with merged splits, %d with CTAs running "
                  "several items, %d requests without keys\n", idx, n_dt[0], n_dt[1], n_split,
                  n_multi, n_empty);
    assert_true(n_split > 0);
    assert_true(n_multi > 0);
    assert_true(n_empty > 0);
}

/* ---- speculative decoding: q_len 1..8, causal, with windows and sinks -------------------- */

/* Every q_len 1..8 under no window, window_left 0 (each row sees its own key only), a
 * window shorter than q_len, one across a page boundary; sinks on and off; Llama-3-8B
 * 32/8 and MQA 16/1; FlashInfer runs these option mixes on its generic kernel only. */
static void gqa_spec_decoding_causal_window_sinks_match_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(2);
    int k = 0;
    for (int32_t ql = 1; ql <= 8; ql++)
        for (int w = 0; w < 4; w++, k++) {
            gqa_opts o = k & 1 ? default_opts(16, 1, 64, 16) : default_opts(32, 8, 128, 32);
            o.dtype = k & 2 ? FI_DTYPE_F16 : FI_DTYPE_BF16;
            o.q_len = ql;
            o.sinks = (k >> 2) & 1;
            o.layout = (k >> 3) & 1 ? GQA_HND : GQA_NHD;
            o.num_ctas = k % 3 ? 7 : 0;
            const int32_t wins[4] = {-1, 0, ql > 1 ? ql - 2 : 0, o.page_size + 3};
            o.windowed = wins[w] >= 0;
            o.window_left = wins[w];
            const int32_t B = tt_rng_int(&rng, 2, 4);
            int32_t kv[4];
            for (int32_t b = 0; b < B; b++) kv[b] = ql + tt_rng_int(&rng, 0, 900);
            run_and_check(&o, kv, B, &rng, 1);
        }
}

/* ---- layouts: NHD / HND, single tensor / (K, V) pair, padded pages: bitwise identical ----- */

/* The first KV form's outputs against the fp64 truth (gqa_case_forms_identical). */
static int check_truth(void *c, char *msg, size_t cap) {
    gqa_case *g = (gqa_case *)c;
    return gqa_case_reference(g, msg, cap) ||
           gqa_case_compare(g, 0, g->B, GQA_TOL, NULL, NULL, msg, cap);
}

static void gqa_layouts_and_kv_forms_are_bitwise_identical(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(3);
    /* D 64 / 128 / 256, groups 1 / 5 / 8 / 16, splits on half of them */
    const int32_t shapes[5][5] = {/* hq hkv d ps ctas */
                                  {8, 8, 64, 16, 0},   {40, 8, 128, 64, 9},
                                  {32, 4, 256, 32, 0}, {16, 1, 128, 128, 5},
                                  {64, 4, 64, 16, 11}};
    for (int s = 0; s < 5; s++) {
        gqa_opts o = default_opts(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3]);
        o.num_ctas = shapes[s][4];
        o.q_len = 1 + s % 3;
        o.sinks = s & 1;
        o.dtype = s & 1 ? FI_DTYPE_F16 : FI_DTYPE_BF16;
        int32_t kv[4];
        for (int32_t b = 0; b < 4; b++) kv[b] = o.q_len + tt_rng_int(&rng, 0, 1500);
        gqa_case c;
        init_or_fail(&c, &o, kv, 4, &rng);
        char msg[MSG], name[MSG];
        gqa_case_name(&c, name, sizeof name);
        const int bad = gqa_case_forms_identical(&c, check_truth, &c, msg, sizeof msg);
        print_message("  %s: 5 forms%s\n", name, bad ? " FAILED" : " identical");
        gqa_case_free(&c);
        if (bad) fail_msg("%s%s: %s", unsupported(msg) ? "NOT SUPPORTED YET: " : "", name, msg);
    }
}

/* ---- split-k: few and many CTAs, merges must happen and be exact ------------------------- */

/* B (<= 8) requests of kv_len in [lo, hi] under o; fails unless one merge group of the
 * plan has at least min_splits pieces. */
static void split_case(gqa_case *c, const gqa_opts *o, int32_t B, int32_t lo, int32_t hi,
                       int32_t min_splits, tt_rng *rng) {
    int32_t kv[8];
    assert_true(B >= 1 && B <= 8);
    for (int32_t b = 0; b < B; b++) kv[b] = tt_rng_int(rng, lo, hi);
    init_or_fail(c, o, kv, B, rng);
    const gt_case g = gt(c);
    gt_require_splits(&g, min_splits);
}

static void gqa_split_merge_matches_reference_few_and_many_ctas(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(4);
    static const gqa_split_variant V[] = {
        /* few CTAs: a handful of tiles cut into pieces (7 CTAs: on 8, the KV-head-major
         * tiles of 3 requests give every CTA one KV head's 3 whole tiles, no split) */
        {32, 8, 128, 64, 1, 3, 3000, 5000, 7, 1, -1, 2},
        {64, 8, 128, 16, 2, 1, 2000, 4000, 16, 0, -1, 2},
        /* batch 1 over 132 CTAs: split-k decides everything */
        {32, 8, 128, 64, 1, 1, 20000, 30000, 132, 1, -1, 8},
        {40, 8, 256, 32, 4, 1, 8000, 12000, 132, 0, -1, 4},
        {16, 1, 64, 128, 1, 2, 10000, 16000, 132, 1, -1, 4},
        /* batch 4, long, many CTAs, a window inside the request */
        {32, 8, 128, 16, 3, 4, 4000, 8000, 132, 1, 1500, 2},
    };
    for (size_t i = 0; i < sizeof V / sizeof V[0]; i++) {
        gqa_opts o = default_opts(V[i].hq, V[i].hkv, V[i].d, V[i].ps);
        gqa_split_opts(&o, &V[i], i);
        gqa_case c;
        split_case(&c, &o, V[i].B, V[i].lo, V[i].hi, V[i].min, &rng);
        check_case(&c, 2);
        gqa_case_free(&c);
    }
}

/* ---- a batch without keys: zeros, and lse -inf or the sink -------------------------------- */

static void gqa_keyless_batch_writes_zeros_and_sink_lse(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(5);
    for (int k = 0; k < 8; k++) {
        gqa_opts o = k & 1 ? default_opts(32, 8, 128, 16) : default_opts(20, 4, 64, 64);
        o.q_len = k & 2 ? 3 : 1;
        o.sinks = (k >> 2) & 1;
        o.scale_ptr = k == 5;
        o.num_ctas = 5;
        int32_t kv[4] = {0, 0, 0, 0};
        run_and_check(&o, kv, 4, &rng, 2);
    }
}

/* ---- determinism ---------------------------------------------------------------------- */

static void gqa_same_inputs_give_bitwise_identical_outputs(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(6);
    gqa_opts o = default_opts(32, 8, 128, 32);
    o.q_len = 2;
    o.num_ctas = 132;
    o.sinks = 1;
    gqa_case c;
    split_case(&c, &o, 2, 3000, 6000, 2, &rng);
    const gt_case g = gt(&c);
    gt_same_inputs_identical(&g);
}

/* ---- CUDA graph decode loop driven by the bundled trace --------------------------------- */

/* One graph captured after the first plan, replayed for 64 steps of the trace's
 * continuous batching (gt_graph_decode_loop): 32/8 heads, D 128, HND pair, sinks,
 * window none. */
static void gqa_graph_decode_loop_follows_trace_every_step(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(7);
    static gt_loop_trace t;
    gt_loop_trace_pick(&t, &rng);
    const int32_t P = (t.max_kv + LOOP_PS - 1) / LOOP_PS;
    gqa_opts o = default_opts(32, 8, 128, LOOP_PS);
    o.sinks = 1;
    o.scale_ptr = 1; /* the graph must follow a new bmm1 scale written each step */
    o.layout = GQA_HND;
    o.kv_form = GQA_KV_PAIR;
    int32_t kv_full[LOOP_B];
    for (int b = 0; b < LOOP_B; b++) kv_full[b] = P * LOOP_PS;
    gqa_case c;
    init_or_fail(&c, &o, kv_full, LOOP_B, &rng);
    const gt_case g = gt(&c);
    gt_graph_decode_loop(&g, &t, P, &rng);
}

/* ---- PDL: two chained launches (layer 2 reads layer 1's output as q) --------------------- */

/* Both layers right: layer 1 against the truth, then layer 2 with the GPU's layer-1 output
 * (same dtype and shape as q) as its host q. */
static int check_layers(void *cp, const gt_pdl_bufs *p, char *msg, size_t cap) {
    gqa_case *c = (gqa_case *)cp;
    memcpy(c->h_out, p->o1[1], c->out_bytes);
    int bad = gqa_case_reference(c, msg, cap);
    c->o.return_lse = 0;
    if (!bad) bad = gqa_case_compare(c, 0, c->B, GQA_TOL, NULL, NULL, msg, cap);
    if (bad) return bad;
    memcpy(c->h_q, p->o1[1], c->out_bytes);
    bad = gqa_case_reference(c, msg, cap);
    if (bad) return bad;
    memcpy(c->h_out, p->o2[1], c->out_bytes);
    memcpy(c->h_lse, p->l2[1], c->lse_bytes);
    c->o.return_lse = 1;
    return gqa_case_compare(c, 0, c->B, GQA_TOL, NULL, NULL, msg, cap);
}

/* Layer 2's q is layer 1's out [tokens, H_q, D], same KV (gt_pdl_chain). */
static void gqa_pdl_chained_graph_matches_unchained(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(8);
    gqa_opts o = default_opts(32, 8, 128, 64);
    o.num_ctas = 132;
    o.sinks = 1;
    gqa_case c;
    split_case(&c, &o, 3, 2000, 5000, 2, &rng); /* splits: semaphores reused by run 2 */
    const gt_case g = gt(&c);
    gt_pdl_chained_matches_unchained(&g, check_layers);
}

/* ---- bad tensors: each a specific status, nothing launched -------------------------------- */

/* Out and lse still all 0xff after the refusals (stream synchronised first). */
static void expect_untouched(gqa_case *c) {
    const gt_case g = gt(c);
    gt_expect_untouched(&g);
}

/* The first call must already pass: the case's own arguments run (else the family has not
 * landed and every status below would be that refusal). */
static void gqa_bad_tensors_return_their_status_and_write_nothing(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(9);
    gqa_opts o = default_opts(32, 8, 128, 16);
    o.layout = GQA_NHD;
    o.kv_form = GQA_KV_PAIR;
    o.sinks = 1;
    int32_t kv[3] = {100, 17, 300};
    gqa_case c;
    char msg[MSG];
    init_or_fail(&c, &o, kv, 3, &rng);
    if (gqa_case_run(&c, msg, sizeof msg)) { /* the good arguments run */
        gqa_case_free(&c);
        fail_msg("%sgood arguments: %s", unsupported(msg) ? "NOT SUPPORTED YET: " : "", msg);
    }
    assert_int_equal(gqa_case_poison(&c, msg, sizeof msg), 0);
    assert_int_equal(cudaStreamSynchronize(c.stream), cudaSuccess);
    const fi_attn_args good = gqa_case_args(&c);
    const gt_case g = gt(&c);
    gt_expect_paged_tensor_statuses(&g, &good);
    fi_attn_args a = good;
    a.skip_softmax_threshold_scale_factor = 1.f; /* context attention only */
    gt_expect_status(&g, &a, FI_ERR_SKIP_SOFTMAX_UNSUPPORTED, "skip-softmax factor on GQA decode");
    expect_untouched(&c);

    /* not planned: a device plan before its first update, and a host-only plan */
    const fi_caps caps = gqa_caps(&c.o, c.B, c.tokens, c.num_pages);
    gt_expect_unplanned_refused(&g, &caps, &c.fb.batch, &good);
    expect_untouched(&c);
    /* and the plan still runs right */
    check_case(&c, 1);
    gqa_case_free(&c);
}

/* ---- one small split case, for compute-sanitizer memcheck / racecheck -------------------- */

/* Batch 1 x 1500-2000 keys, heads 16 / 4, head_dim 128, page 16, sinks, on `ctas` CTAs of
 * tile table row `variant`: split into >= 2 pieces, checked once against the reference. */
static void sanitize_split(uint64_t seed, int32_t variant, int32_t q_len, int32_t ctas,
                           gqa_layout layout) {
    tt_rng rng = gt_test_rng(seed);
    gqa_opts o = default_opts(16, 4, 128, 16);
    o.variant = variant;
    o.q_len = q_len;
    o.num_ctas = ctas;
    o.sinks = 1;
    o.layout = layout;
    gqa_case c;
    split_case(&c, &o, 1, 1500, 2000, 2, &rng);
    check_case(&c, 1);
    gqa_case_free(&c);
}

static void sanitize_small_case(void **state) {
    (void)state;
    REQUIRE_GPU();
    /* row 3: the 64-row kernel (group 4 x q_len 2 = 8 rows would take row 2 by default);
     * 4 tiles on 8 CTAs: >= 2 pieces */
    sanitize_split(10, 3, 2, 8, GQA_HND);
}

/* The rows-8 row (caps.variant 2), q_len 1, 16 CTAs: the transposed-only kernel and its
 * one-row solo merge (4 rows a KV head), for compute-sanitizer
 * (FI_GPU_TEST_FILTER=sanitize_rows8_small_case). */
static void sanitize_rows8_small_case(void **state) {
    (void)state;
    REQUIRE_GPU();
    sanitize_split(18, 2, 1, 16, GQA_NHD);
}

/* ---- fp8 e4m3 KV (scale folded into bmm1 / bmm2) against the dequantised reference -------- */

static void gqa_fp8_kv_matches_dequantised_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(11);
    int k = 0;
    for (int id = 0; id < 3; id++)
        for (int ig = 0; ig < 6; ig += 1, k++) {
            const int32_t hkv = ig == 5 ? 2 : 4;
            gqa_opts o = default_opts(GROUPS[ig] * hkv, hkv, DIMS[id], PAGES[k % 4]);
            o.kv_dtype = FI_DTYPE_E4M3;
            o.dtype = k & 1 ? FI_DTYPE_F16 : FI_DTYPE_BF16;
            o.q_len = 1 + (k * 5) % 8;
            o.layout = k & 2 ? GQA_HND : GQA_NHD;
            o.kv_form = k & 4 ? GQA_KV_PAIR : GQA_KV_SINGLE;
            o.sinks = (k >> 1) & 1;
            o.scale_ptr = k % 3 == 0;
            o.num_ctas = k % 3 == 1 ? 6 : 0;
            if (k % 4 == 3) {
                o.windowed = 1;
                o.window_left = 100;
            }
            int32_t kv[4];
            const int32_t B = 3;
            for (int32_t b = 0; b < B; b++)
                kv[b] = pick_kv_len(&rng, b + 1, o.q_len, o.page_size, o.num_ctas ? 2500 : 800);
            run_and_check(&o, kv, B, &rng, 2);
        }
}

/* ---- fp8 e4m3 output with o_scale ---------------------------------------------------------- */

static void gqa_fp8_out_matches_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(12);
    for (int k = 0; k < 8; k++) {
        gqa_opts o = k & 1 ? default_opts(32, 8, 128, 64) : default_opts(40, 8, 64, 16);
        o.o_dtype = FI_DTYPE_E4M3;
        o.kv_dtype = k >= 6 ? FI_DTYPE_E4M3 : 0; /* fp8 in and out */
        o.dtype = k & 2 ? FI_DTYPE_F16 : FI_DTYPE_BF16;
        o.q_len = k & 4 ? 4 : 1;
        o.sinks = k & 1;
        o.num_ctas = k & 2 ? 9 : 0; /* merged pieces store through the fp8 path too */
        o.o_scale = k == 3 ? 0.25f : 0.0f; /* 0: the case picks ~0.01..0.02 */
        int32_t kv[3];
        for (int32_t b = 0; b < 3; b++) kv[b] = o.q_len + tt_rng_int(&rng, 0, 2500);
        run_and_check(&o, kv, 3, &rng, 2);
    }
}

/* ---- NVFP4 KV (planned: skipped with a line while the caps refuse E2M1) ------------------ */

static int nvfp4_refused(void) {
    gqa_opts o = default_opts(32, 8, 128, 64);
    o.kv_dtype = FI_DTYPE_E2M1;
    fi_caps caps = gqa_caps(&o, 1, 1, 16);
    const fi_status st = fi_caps_validate(&caps);
    if (st == FI_OK) return 0;
    print_message("NVFP4 KV not supported yet (fi_caps_validate: %s): skipped\n",
                  fi_status_name(st));
    return 1;
}

static void gqa_nvfp4_kv_matches_dequantised_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    if (nvfp4_refused()) skip();
    tt_rng rng = gt_test_rng(13);
    /* k 6..8: head_dim 64 and 256 on pages of 64 and 128 tokens, where the producer finds
     * a slot's page once (gqa_ring.cuh produce_kv) */
    for (int k = 0; k < 9; k++) {
        gqa_opts o = k >= 6  ? default_opts(32, 8, k == 7 ? 256 : 64, k == 8 ? 128 : 64)
                     : k & 1 ? default_opts(32, 8, 128, 64)
                             : default_opts(64, 8, 128, 16);
        o.kv_dtype = FI_DTYPE_E2M1;
        o.q_len = k == 4 || k == 5 ? 3 : 1;
        o.layout = k & 2 ? GQA_HND : GQA_NHD;
        o.kv_form = k & 1 ? GQA_KV_PAIR : GQA_KV_SINGLE;
        o.sinks = k & 1;
        o.num_ctas = k == 2 || k == 6 ? 7 : 0;
        int32_t kv[3];
        for (int32_t b = 0; b < 3; b++) kv[b] = o.q_len + tt_rng_int(&rng, 0, 2000);
        run_and_check(&o, kv, 3, &rng, 2);
    }
}

/* ---- the tile_rows-8 row (caps.variant 2: gqa_decode_rows8, its transposed-only kernel) -- */

/* Every KV dtype and head_dim on the rows-8 row (and, for k in 8..15 and 24..26, on row 3:
 * the 64-row kernel's transposed path, which the default rows no longer give few-row
 * tiles) against the (dequantising) fp64 reference: groups 1 to 16 and q_len 1 to 3, so
 * requests of more than 8 rows are cut into several tiles (group 16: tiles of 8 heads);
 * kv_len 2 pages or random up to 900 (2500 on 7 CTAs); and batch 1 x 16-20k over every CTA
 * (16-split groups: the one-row solo merge, SplitMerge kOneRow). */
static void gqa_rows8_row_matches_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(17);
    const int fp4 = !nvfp4_refused();
    static const fi_dtype KVD[3] = {(fi_dtype)0 /* the q dtype */, FI_DTYPE_E4M3, FI_DTYPE_E2M1};
    int n = 0, n3 = 0;
    for (int k = 0; k < 27; k++) {
        const int32_t d = DIMS[k % 3], group = GROUPS[(k / 3) % 6], hkv = group == 16 ? 2 : 4;
        const fi_dtype kvd = KVD[(k / 9) % 3];
        if (kvd == FI_DTYPE_E2M1 && !fp4)
            continue;
        gqa_opts o = default_opts(group * hkv, hkv, d, PAGES[k % 4]);
        o.variant = (k >> 3) & 1 ? 3 : 2; /* 3: row 0's kernel by number, on few rows */
        o.kv_dtype = kvd;
        o.dtype = k & 1 ? FI_DTYPE_F16 : FI_DTYPE_BF16;
        o.q_len = 1 + k % 3;
        o.layout = k & 2 ? GQA_HND : GQA_NHD;
        o.sinks = (k >> 2) & 1;
        o.num_ctas = k % 4 == 1 ? 7 : 0;
        int32_t kv[3];
        for (int32_t b = 0; b < 3; b++)
            kv[b] = pick_kv_len(&rng, b + 3, o.q_len, o.page_size, o.num_ctas ? 2500 : 900);
        run_and_check(&o, kv, 3, &rng, 2);
        n += o.variant == 2;
        n3 += o.variant == 3;
    }
    for (int k = 0; k < 3; k++) { /* batch 1, long: 16 splits a KV head on 132 CTAs */
        gqa_opts o = default_opts(32, 8, DIMS[k], 64);
        o.variant = 2;
        o.kv_dtype = KVD[k];
        if (o.kv_dtype == FI_DTYPE_E2M1 && !fp4)
            continue;
        o.dtype = k & 1 ? FI_DTYPE_F16 : FI_DTYPE_BF16;
        const int32_t kv = tt_rng_int(&rng, 16000, 20000);
        const split_stats st = run_and_check(&o, &kv, 1, &rng, 2);
        assert_true(st.groups > 0);
        n++;
    }
    print_message("  %d cases on gqa_decode_rows8, %d on gqa_decode_rows64\n", n, n3);
}

static void gqa_nvfp4_bad_scale_tensors_return_their_status(void **state) {
    (void)state;
    REQUIRE_GPU();
    if (nvfp4_refused()) skip();
    tt_rng rng = gt_test_rng(14);
    gqa_opts o = default_opts(32, 8, 128, 16);
    o.kv_dtype = FI_DTYPE_E2M1;
    int32_t kv[2] = {200, 33};
    gqa_case c;
    init_or_fail(&c, &o, kv, 2, &rng);
    const fi_attn_args good = gqa_case_args(&c);
    const gt_case g = gt(&c);
    gt_expect_nvfp4_scale_statuses(&g, &good);
    gqa_case_free(&c);
}

/* ---- non-finite inputs: the policy of fiattn_run.h ---------------------------------------- */

#define BF16_NAN 0x7FC0u
#define BF16_PINF 0x7F80u

/* Canonical K / V row of KV head h at key t of request b. */
static int64_t kv_row(const gqa_case *c, int32_t b, int32_t t, int32_t h) {
    const int64_t page = c->fb.page_table[(int64_t)b * c->P + t / c->o.page_size];
    return (page * c->o.page_size + t % c->o.page_size) * c->o.heads_kv + h;
}
static void put_kv(gqa_case *c, int which, int32_t b, int32_t t, int32_t h, int32_t d, uint16_t bits) {
    memcpy((which ? c->h_v : c->h_k) + kv_row(c, b, t, h) * c->row_bytes + d * 2, &bits, 2);
}

static void expect_row_like_reference(const gqa_case *c, int64_t tok, int64_t h) {
    char msg[MSG];
    if (gc_compare_nonfinite_row(gqa_out_value_at, c, c->h_lse, c->ref_out, c->ref_lse, c->o.heads_q,
                                 c->o.head_dim, tok, h, GQA_TOL, GQA_TOL_LSE, msg, sizeof msg))
        fail_msg("%s", msg);
}

/* NaN in q, NaN and +inf in K, NaN in V (one request long enough to be split across CTAs,
 * the NaN in one of its pieces): every row as the fp64 reference says, and the policy's
 * rows checked by name (the reference's own policy tests: test_ref_nonfinite). */
static void gqa_nonfinite_inputs_follow_the_policy(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(23);
    gqa_opts o = default_opts(32, 8, 128, 16);
    int32_t kv[5] = {300, 400, 500, 600, 3000};
    gqa_case c;
    init_or_fail(&c, &o, kv, 5, &rng);
    const int64_t Hq = 32, D = 128;
    c.h_q[((int64_t)c.q_offset[0] * Hq + 3) * D + 5] = BF16_NAN; /* request 0, head 3 */
    put_kv(&c, 0, 1, 17, 2, 7, BF16_NAN);    /* request 1: heads 8..11 */
    put_kv(&c, 1, 2, 250, 5, 9, BF16_NAN);   /* request 2: heads 20..23, dim 9 */
    put_kv(&c, 0, 3, 40, 1, 0, BF16_PINF);   /* request 3: heads 4..7, by the sign of q */
    put_kv(&c, 1, 4, 2500, 7, 100, BF16_NAN); /* request 4 (split): heads 28..31, dim 100 */
    char msg[MSG];
    const gt_case g = gt(&c);
    gt_require_splits(&g, 2);
    if (gqa_case_set_layout(&c, c.o.layout, c.o.kv_form, msg, sizeof msg) ||
        gqa_case_upload(&c, msg, sizeof msg) || gqa_case_run(&c, msg, sizeof msg) ||
        gqa_case_download(&c, msg, sizeof msg) || gqa_case_reference(&c, msg, sizeof msg)) {
        gqa_case_free(&c);
        fail_msg("%s", msg);
    }
    for (int32_t b = 0; b < 5; b++)
        for (int64_t h = 0; h < Hq; h++)
            expect_row_like_reference(&c, c.q_offset[b], h);
    /* the policy, by name */
    const int64_t t0 = c.q_offset[0], t1 = c.q_offset[1], t2 = c.q_offset[2], t4 = c.q_offset[4];
    assert_true(isnan(gqa_out_value(&c, (t0 * Hq + 3) * D + 77)) && isnan(c.h_lse[t0 * Hq + 3]));
    assert_true(isfinite(gqa_out_value(&c, (t0 * Hq + 2) * D)) && isfinite(c.h_lse[t0 * Hq + 2]));
    assert_true(isnan(c.h_lse[t1 * Hq + 8]) && isnan(c.h_lse[t1 * Hq + 11]));
    assert_true(isfinite(c.h_lse[t1 * Hq + 12]) && isfinite(c.h_lse[t1 * Hq + 7]));
    assert_true(isnan(gqa_out_value(&c, (t2 * Hq + 20) * D + 9)) &&
                isfinite(gqa_out_value(&c, (t2 * Hq + 20) * D + 8)) && isfinite(c.h_lse[t2 * Hq + 20]));
    assert_true(isnan(gqa_out_value(&c, (t4 * Hq + 31) * D + 100)) &&
                isfinite(gqa_out_value(&c, (t4 * Hq + 31) * D + 99)) && isfinite(c.h_lse[t4 * Hq + 31]));
    gqa_case_free(&c);
}

int main(void) {
    gt_begin("test_gqa_gpu");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sanitize_small_case),
        cmocka_unit_test(sanitize_rows8_small_case),
        cmocka_unit_test(gqa_bad_tensors_return_their_status_and_write_nothing),
        cmocka_unit_test(gqa_matches_reference_every_shape),
        cmocka_unit_test(gqa_spec_decoding_causal_window_sinks_match_reference),
        cmocka_unit_test(gqa_layouts_and_kv_forms_are_bitwise_identical),
        cmocka_unit_test(gqa_split_merge_matches_reference_few_and_many_ctas),
        cmocka_unit_test(gqa_keyless_batch_writes_zeros_and_sink_lse),
        cmocka_unit_test(gqa_same_inputs_give_bitwise_identical_outputs),
        cmocka_unit_test(gqa_graph_decode_loop_follows_trace_every_step),
        cmocka_unit_test(gqa_pdl_chained_graph_matches_unchained),
        cmocka_unit_test(gqa_fp8_kv_matches_dequantised_reference),
        cmocka_unit_test(gqa_fp8_out_matches_reference),
        cmocka_unit_test(gqa_nvfp4_kv_matches_dequantised_reference),
        cmocka_unit_test(gqa_nvfp4_bad_scale_tensors_return_their_status),
        cmocka_unit_test(gqa_rows8_row_matches_reference),
        cmocka_unit_test(gqa_nonfinite_inputs_follow_the_policy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
