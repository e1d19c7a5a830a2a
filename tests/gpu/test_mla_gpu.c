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
#include "gpu/mla_gpu_case.h"
#include "gpu/gpu_test_common.h"
#include "gpu/mla_gt_family.h"
#include "plan/variant.h"

#define TOL 1e-2
#define MSG 512

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

/* ---- the case as the shared harness (gpu_test_common.h) sees it: mla_gt_family.h ----- */

/* The case as the shared tests see it (taken after init; rows within MLA_GT_TOL = TOL). */
static gt_case gt(mla_case *c) { return mla_gt(c); }

/* Run c once, or twice (runs 2: without, then with PDL; bitwise identical), compare the
 * last run with the fp64 reference, print; on failure free c and fail the test. */
static void check_case(mla_case *c, int runs) {
    const gt_case g = gt(c);
    gt_check(&g, runs);
}

/* Build one case, check it (two runs, PDL off and on), return its plan's split figures. */
static split_stats run_and_check(const mla_opts *o, const int32_t *q_len,
                                 const int32_t *kv_len, int32_t n, tt_rng *rng) {
    mla_case c;
    char msg[MSG];
    if (mla_case_init(&c, o, q_len, kv_len, n, rng, msg, sizeof msg)) fail_msg("init: %s", msg);
    split_stats s = plan_split_stats(c.plan);
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
    tt_rng rng = gt_test_rng(tag);
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
    tt_rng rng = gt_test_rng(3);
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

/* ---- the wrapper's incremental prefill at real sizes: long query blocks ------------------ */

/* The fp64 reference of chosen rows only (a full one of 1024 rows x 128 heads would take
 * minutes on the host): each chosen row (request b, row i) becomes a one-row request of a
 * decode batch over the same pages whose keys are the row's own (causal: kv_len - q_len +
 * i + 1 of them; the window then falls where it fell, plan/mask.h), its q gathered.  Every
 * output element is also checked for the NaN poison (full coverage).  c: INDPTR case, run
 * and downloaded. */
static void check_rows_sampled(const mla_case *c, tt_rng *rng) {
    const int64_t H = c->o.heads;
    int32_t rb[512] = {0}, ri[512] = {0};
    int S = 0;
    for (int32_t b = 0; b < c->B; b++) {
        const int32_t ql = c->fb.q_lens[b];
        for (int32_t i = 0; i < ql && S < 512; i++) /* short blocks whole; long ones sampled */
            if (ql <= 8 || i < 2 || i >= ql - 2 || i == ql / 2 || tt_rng_int(rng, 0, ql - 1) < 6) {
                rb[S] = b;
                ri[S++] = i;
            }
    }
    const int32_t *kvp = c->fb.kv_indptr, *kvi = c->fb.page_table;
    const int32_t ps = c->o.page_size;
    int32_t *qo = calloc((size_t)S + 1, 4), *kp = calloc((size_t)S + 1, 4), *kl = calloc((size_t)S, 4);
    int64_t nnz = 0;
    for (int s2 = 0; s2 < S; s2++) {
        const int32_t b = rb[s2], ql = c->fb.q_lens[b], kv = c->fb.kv_lens[b];
        kl[s2] = c->o.causal ? kv - ql + ri[s2] + 1 : kv;
        nnz += (kl[s2] + ps - 1) / ps;
    }
    int32_t *ki = calloc((size_t)(nnz > 0 ? nnz : 1), 4);
    uint16_t *q = malloc((size_t)S * H * MLA_D_CKV * 2), *qr = malloc((size_t)S * H * MLA_D_KPE * 2);
    float *ro = malloc((size_t)S * H * MLA_D_CKV * 4), *rl = malloc((size_t)S * H * 4);
    assert_true(qo && kp && kl && ki && q && qr && ro && rl);
    for (int s2 = 0; s2 < S; s2++) {
        const int32_t b = rb[s2], np = (kl[s2] + ps - 1) / ps;
        qo[s2 + 1] = s2 + 1;
        kp[s2 + 1] = kp[s2] + np;
        memcpy(ki + kp[s2], kvi + kvp[b], (size_t)np * 4);
        const int64_t t = c->q_offset[b] + ri[s2];
        memcpy(q + s2 * H * MLA_D_CKV, (const uint16_t *)c->h_q + t * H * MLA_D_CKV,
               (size_t)H * MLA_D_CKV * 2);
        memcpy(qr + s2 * H * MLA_D_KPE, (const uint16_t *)c->h_qr + t * H * MLA_D_KPE,
               (size_t)H * MLA_D_KPE * 2);
    }
    fi_batch bt = c->fb.batch;
    bt.batch_size = S;
    bt.qo_indptr = qo;
    bt.kv_indptr = kp;
    bt.kv_indices = ki;
    bt.kv_len = kl;
    fi_caps caps = mla_caps(&c->o, S, S, c->num_pages);
    fi_attn_args a = mla_case_args(c, 0);
    const fi_dtype dt = c->o.dtype;
    int64_t qs[3] = {S, H, MLA_D_CKV}, qst[3] = {H * MLA_D_CKV, MLA_D_CKV, 1};
    int64_t rs[3] = {S, H, MLA_D_KPE}, rst[3] = {H * MLA_D_KPE, MLA_D_KPE, 1};
    int64_t ls[2] = {S, H}, lst[2] = {H, 1}, n = nnz > 0 ? nnz : 1, one = 1;
    a.q = fi_tensor_make(q, dt, 3, qs, qst);
    a.q_rope = fi_tensor_make(qr, dt, 3, rs, rst);
    a.out = fi_tensor_make(ro, FI_DTYPE_F32, 3, qs, qst);
    a.lse = fi_tensor_make(rl, FI_DTYPE_F32, 2, ls, lst);
    a.page_table = fi_tensor_make(ki, FI_DTYPE_I32, 1, &n, &one);
    assert_int_equal(fi_naive_attention(&caps, &bt, &a), FI_OK);
    double worst = 0.0, worst_lse = 0.0;
    for (int s2 = 0; s2 < S; s2++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t t = c->q_offset[rb[s2]] + ri[s2];
            double e2 = 0.0, r2 = 0.0;
            for (int d = 0; d < MLA_D_CKV; d++) {
                const double g = mla_out_value(c, (t * H + h) * MLA_D_CKV + d);
                const double r = ro[(s2 * H + h) * MLA_D_CKV + d];
                e2 += (g - r) * (g - r);
                r2 += r * r;
            }
            const double rel = sqrt(e2) / (sqrt(r2) > 1e-30 ? sqrt(r2) : 1.0);
            const double el = c->o.return_lse ? fabs((double)c->h_lse[t * H + h] - rl[s2 * H + h]) : 0.0;
            if (!(rel <= TOL) || !(el <= TOL))
                fail_msg("request %d row %d head %lld: out rel err %g, lse err %g", rb[s2], ri[s2],
                         (long long)h, rel, el);
            worst = rel > worst ? rel : worst;
            worst_lse = el > worst_lse ? el : worst_lse;
        }
    for (int64_t e = 0; e < (int64_t)c->tokens * H * MLA_D_CKV; e++)
        if (!isfinite(mla_out_value(c, e)))
            fail_msg("output element %lld not written (NaN poison) or not finite", (long long)e);
    printf("  %d sampled rows x %lld heads vs fp64: out err %.2e lse err %.2e\n", S, (long long)H,
           worst, worst_lse);
    free(qo), free(kp), free(kl), free(ki), free(q), free(qr), free(ro), free(rl);
}

/* Query blocks of 17, 128 and 1024 rows, causal and aligned to the end of their KV ranges
 * (a cached prefix of 0..2000 keys), beside decode requests in one INDPTR batch (issue 12);
 * heads 16 and 128 (the two bodies' default rows), page sizes 1 and 64, one case on few
 * CTAs (splits), one with sinks and lse; fp64 reference on sampled rows. */
static void mla_indptr_long_query_blocks_match_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(47);
    const int32_t q[6] = {17, 1, 128, 1, 1024, 2};
    for (int k = 0; k < 4; k++) {
        mla_opts o = default_opts(k & 1 ? 128 : 16, k & 2 ? 1 : 64, FI_FORM_INDPTR);
        o.causal = 1;
        o.sinks = k == 1;
        o.return_lse = k != 2;
        o.num_ctas = k == 3 ? 7 : 0;
        int32_t kv[6];
        for (int b = 0; b < 6; b++)
            kv[b] = q[b] + tt_rng_int(&rng, 0, 2000);
        mla_case c;
        char msg[MSG], name[MSG];
        if (mla_case_init(&c, &o, q, kv, 6, &rng, msg, sizeof msg)) fail_msg("init: %s", msg);
        mla_case_name(&c, name, sizeof name);
        printf("  %s\n", name);
        if (mla_case_upload(&c, msg, sizeof msg) || mla_case_run(&c, msg, sizeof msg) ||
            mla_case_download(&c, msg, sizeof msg)) {
            mla_case_free(&c);
            fail_msg("%s", msg);
        }
        check_rows_sampled(&c, &rng);
        mla_case_free(&c);
    }
}

/* ---- split-k: few and many CTAs, merges must happen and be exact ------------------------ */

/* The split cases here are sized for 64-row tiles.  A forced row (FI_MLA_TEST_VARIANT) of
 * t < 64 rows cuts a request of more than t rows (heads x q_len) into more tiles, which
 * fill the CTAs unsplit under its charges (row 9's: plan/cost_model.h): such a case checks
 * its results only (*min_splits = 0).  That row's merges are required where a request is
 * one tile (the cases of <= t rows keep their minimum) and by sanitize_rows16_small_case. */
static void split_scale(int32_t rows, int32_t *min_splits) {
    const fi_variant *v = fi_variant_find(FI_KIND_MLA_DECODE, mla_test_variant());
    if (v && v->tile_rows < 64 && rows > v->tile_rows)
        *min_splits = 0;
}

/* Case under options o with B (<= 8) requests of q_len rows and kv_len in [kv_lo, kv_hi]
 * (request 0 without keys when empty_first), long enough for the planner to split; fails
 * unless one merge group of the plan has at least min_splits (>= 2) pieces. */
static void split_case_opts(mla_case *c, const mla_opts *o, int32_t B, int32_t q_len,
                            int32_t kv_lo, int32_t kv_hi, int empty_first, int32_t min_splits,
                            tt_rng *rng) {
    int32_t q[8], kv[8];
    assert_true(B >= 1 && B <= 8 && (!empty_first || !o->causal));
    split_scale(o->heads * q_len, &min_splits);
    for (int32_t b = 0; b < B; b++) {
        q[b] = q_len;
        kv[b] = b == 0 && empty_first ? 0 : tt_rng_int(rng, kv_lo, kv_hi);
    }
    char msg[MSG];
    if (mla_case_init(c, o, q, kv, B, rng, msg, sizeof msg)) fail_msg("init: %s", msg);
    const gt_case g = gt(c);
    if (min_splits > 0)
        gt_require_splits(&g, min_splits);
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
    tt_rng rng = gt_test_rng(4);
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
    /* page size 1, a window inside the request, no lse, request-ordered pages, 13 CTAs
     * (more than two a tile: the rows that pack pairs, planner/ppair.c, cut them too) */
    {BF, IP, 64, 1, 3, 2, 1500, 3000, 13, 1, 1000, 1, 0, 0, 1, 0, 2},
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
    tt_rng rng = gt_test_rng(11);
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
    tt_rng rng = gt_test_rng(10);
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
    tt_rng rng = gt_test_rng(5);
    mla_case c;
    split_case(&c, 132, 32, 2, 2, 2000, 4000, &rng);
    const gt_case g = gt(&c);
    gt_same_inputs_identical(&g);
}

/* ---- CUDA graph decode loop driven by the bundled trace --------------------------------- */

#define LOOP_H 16

/* One graph captured after the first plan, replayed for 64 steps of the trace's
 * continuous batching (gt_graph_decode_loop): heads 16, concatenated cache, page size 32,
 * sinks, scales by pointer. */
static void mla_graph_decode_loop_follows_trace_every_step(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(6);
    mla_opts o = default_opts(LOOP_H, LOOP_PS, FI_FORM_BLOCK_TABLES);
    o.sinks = 1;
    o.scale_ptr = 1; /* the graph must follow a new bmm1 scale written each step */
    mla_gt_graph_decode_loop(o, &rng);
}

/* ---- PDL: two chained launches (layer 2 reads layer 1's output as q_nope) --------------- */

/* Both layers right, not just equal: layer 1 against the truth, then layer 2 with the
 * GPU's layer-1 output as its host q_nope. */
static int check_layers(void *cp, const gt_pdl_bufs *p, char *msg, size_t cap) {
    mla_case *c = (mla_case *)cp;
    memcpy(c->h_out, p->o1[1], c->out_bytes);
    int bad = mla_case_reference(c, msg, cap);
    c->o.return_lse = 0;
    if (!bad) bad = mla_case_compare(c, 0, c->B, TOL, NULL, NULL, msg, cap);
    if (bad) return bad;
    fi_attn_args h = mla_case_args(c, 0);
    h.q = mla_case_args(c, 1).out; /* layer 1's out view [tokens, H, 512] */
    h.q.data = p->o1[1];
    fi_caps caps = mla_caps(&c->o, c->B, c->tokens, c->num_pages);
    fi_status st = fi_naive_attention(&caps, &c->fb.batch, &h);
    if (st != FI_OK) {
        mla_msg(msg, cap, "layer 2 reference: %s", fi_status_name(st));
        return 1;
    }
    memcpy(c->h_out, p->o2[1], c->out_bytes);
    memcpy(c->h_lse, p->l2[1], c->lse_bytes);
    c->o.return_lse = 1;
    return mla_case_compare(c, 0, c->B, TOL, NULL, NULL, msg, cap);
}

/* Layer 2: q_nope = layer 1's out [tokens, H, 512] (contiguous), same q_rope and KV
 * (gt_pdl_chain). */
static void mla_pdl_chained_graph_matches_unchained(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(7);
    mla_case c;
    split_case(&c, 132, 16, 3, 1, 1000, 3000, &rng); /* splits: semaphores reused by run 2 */
    const gt_case g = gt(&c);
    gt_pdl_chained_matches_unchained(&g, check_layers);
}

/* ---- bad arguments: statuses, and nothing written ---------------------------------------- */

static void expect_status(mla_case *c, const fi_attn_args *a, fi_status want, const char *what) {
    const gt_case g = gt(c);
    gt_expect_status(&g, a, want, what);
}

static void mla_bad_arguments_return_their_status_and_write_nothing(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(8);
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

    /* not planned: a device plan before its first update, and a host-only plan (planned
     * for a batch of the same lengths, but without a workspace) */
    const fi_caps caps = mla_caps(&o, 3, 3, c.num_pages);
    fibatch fb;
    fibatch_opts bo = fibatch_default_opts();
    bo.form = FI_FORM_BLOCK_TABLES;
    bo.page_size = 16;
    assert_int_equal(fibatch_build(&bo, q, kv, 3, NULL, &fb), FIBATCH_OK);
    const gt_case g = gt(&c);
    gt_expect_unplanned_refused(&g, &caps, &fb.batch, &good);
    fibatch_free(&fb);

    /* nothing was launched: out and lse still hold the poison bytes */
    gt_expect_untouched(&g);

    /* fi_plan_update while the stream is captured: refused, previous plan kept */
    fi_plan_view v;
    assert_int_equal(fi_plan_get_view(c.plan, &v), FI_OK);
    fi_plan_header before = *v.header;
    assert_int_equal(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
    const fi_status st = fi_plan_update(c.plan, &c.fb.batch, c.stream);
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(c.stream, &graph);
    if (graph) cudaGraphDestroy(graph);
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
    tt_rng rng = gt_test_rng(12);
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
    tt_rng rng = gt_test_rng(9);
    mla_case c;
    split_case(&c, 8, 16, 2, 2, 700, 900, &rng); /* >= 2 pieces of >= 256 keys */
    check_case(&c, 1);
    mla_case_free(&c);
}

/* The transposed 16-bit body (row 9) whatever FI_MLA_TEST_VARIANT says: two requests of
 * 900-1500 keys (one 16-row tile each; row 9's charges split them on 8 CTAs, fiplan) cut
 * into pieces, its TMA boxes of a 32-token page, its cp.async tail, its merge
 * (compute-sanitizer: as sanitize_small_case). */
static void sanitize_rows16_small_case(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(17);
    mla_opts o = default_opts(16, 32, FI_FORM_BLOCK_TABLES);
    o.num_ctas = 8;
    o.sinks = 1;
    o.variant = 9;
    mla_case c;
    split_case_opts(&c, &o, 2, 1, 900, 1500, 0, 2, &rng);
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
    tt_rng rng = gt_test_rng(41);
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

/* ---- non-finite inputs: the policy of fiattn_run.h ---------------------------------------- */

#define BF16_NAN 0x7FC0u
#define BF16_PINF 0x7F80u

/* Element d (of 576) of the concatenated cache row of key t of request b. */
static uint16_t *kv_at(mla_case *c, int32_t b, int32_t t, int32_t d) {
    const int64_t page = c->fb.page_table[(int64_t)b * c->P + t / c->o.page_size];
    return (uint16_t *)c->h_kv + (page * c->o.page_size + t % c->o.page_size) * MLA_D_QK + d;
}

/* NaN in q, NaN in the rope part of K, +inf in it, and a NaN in a request split across
 * CTAs: every row as the fp64 reference says (NaN and inf where it has them), and the
 * policy's rows checked by name.  MLA's V is K's first 512 dims, so a V-only NaN does not
 * exist here (the GQA test has one). */
static void mla_nonfinite_inputs_follow_the_policy(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(29);
    mla_opts o = default_opts(16, 64, FI_FORM_BLOCK_TABLES);
    const int32_t ql[4] = {1, 1, 1, 1}, kv[4] = {300, 500, 700, 4000};
    mla_case c;
    char msg[MSG];
    if (mla_case_init(&c, &o, ql, kv, 4, &rng, msg, sizeof msg)) fail_msg("init: %s", msg);
    const int64_t H = 16;
    ((uint16_t *)c.h_q)[((int64_t)c.q_offset[0] * H + 3) * MLA_D_QK + 5] = BF16_NAN; /* request 0, head 3 */
    *kv_at(&c, 1, 17, 520) = BF16_NAN;   /* request 1: every head */
    *kv_at(&c, 2, 40, 560) = BF16_PINF;  /* request 2: heads by the sign of q */
    *kv_at(&c, 3, 3500, 530) = BF16_NAN; /* request 3, split: every head */
    const gt_case g = gt(&c);
    gt_require_splits(&g, 2);
    if (mla_case_upload(&c, msg, sizeof msg) || mla_case_run(&c, msg, sizeof msg) ||
        mla_case_download(&c, msg, sizeof msg) || mla_case_reference(&c, msg, sizeof msg)) {
        mla_case_free(&c);
        fail_msg("%s", msg);
    }
    for (int32_t b = 0; b < 4; b++)
        for (int64_t h = 0; h < H; h++)
            if (gc_compare_nonfinite_row(mla_out_value, &c, c.h_lse, c.ref_out, c.ref_lse, H,
                                         MLA_D_CKV, c.q_offset[b], h, TOL, TOL, msg, sizeof msg)) {
                mla_case_free(&c);
                fail_msg("%s", msg);
            }
    const int64_t t0 = c.q_offset[0], t1 = c.q_offset[1], t3 = c.q_offset[3];
    assert_true(isnan(mla_out_value(&c, (t0 * H + 3) * MLA_D_CKV + 77)) && isnan(c.h_lse[t0 * H + 3]));
    assert_true(isfinite(mla_out_value(&c, (t0 * H + 4) * MLA_D_CKV)) && isfinite(c.h_lse[t0 * H + 4]));
    assert_true(isnan(c.h_lse[t1 * H]) && isnan(c.h_lse[t1 * H + 15]));
    assert_true(isnan(c.h_lse[t3 * H + 7]) && isnan(mla_out_value(&c, (t3 * H + 7) * MLA_D_CKV + 300)));
    mla_case_free(&c);
}

/* Scores that rise along every request (key t's whole row scaled by 1 + 7 t / kv_len): each
 * row's running max keeps climbing, past the lazy max's margin of 2^8 (the wgmma bodies'
 * 16-bit forms: run_ctx.cuh row_max_step) several times an item, so both warpgroups'
 * rescales of O run on accumulators that already hold keys, in unsplit items and in split
 * pieces (FI_MLA_TEST_VARIANT picks the body, as for every test here). */
static void mla_rising_scores_match_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(31);
    const int32_t heads[2] = {16, 128};
    for (int ih = 0; ih < 2; ih++)
        for (int32_t ql = 1; ql <= 2; ql++) {
            mla_opts o = default_opts(heads[ih], 64, FI_FORM_BLOCK_TABLES);
            o.causal = ql > 1;
            o.num_ctas = ql == 1 ? 0 : 5; /* q_len 2: pieces merged across CTAs */
            int32_t min_splits = 2;
            split_scale(o.heads * ql, &min_splits);
            const int32_t q[3] = {ql, ql, ql}, kv[3] = {3000, 1500, 700};
            mla_case c;
            char msg[MSG];
            if (mla_case_init(&c, &o, q, kv, 3, &rng, msg, sizeof msg)) fail_msg("init: %s", msg);
            for (int32_t b = 0; b < 3; b++)
                for (int32_t t = 0; t < kv[b]; t++) {
                    const float f = 1.0f + 7.0f * (float)t / (float)kv[b];
                    for (int32_t d = 0; d < MLA_D_QK; d++) {
                        uint16_t *e = kv_at(&c, b, t, d);
                        *e = gc_from_f32(FI_DTYPE_BF16, f * gc_to_f32(FI_DTYPE_BF16, *e));
                    }
                }
            if (ql == 2 && min_splits > 0) {
                const gt_case g = gt(&c);
                gt_require_splits(&g, min_splits);
            }
            if (mla_case_upload(&c, msg, sizeof msg)) {
                mla_case_free(&c);
                fail_msg("upload: %s", msg);
            }
            check_case(&c, 2);
            mla_case_free(&c);
        }
}

int main(void) {
    gt_begin("test_mla_gpu");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sanitize_small_case),
        cmocka_unit_test(sanitize_rows16_small_case),
        cmocka_unit_test(mla_bad_arguments_return_their_status_and_write_nothing),
        cmocka_unit_test(mla_bf16_matches_reference_every_shape),
        cmocka_unit_test(mla_f16_matches_reference),
        cmocka_unit_test(mla_indptr_causal_prefill_matches_reference),
        cmocka_unit_test(mla_indptr_long_query_blocks_match_reference),
        cmocka_unit_test(mla_split_merge_matches_reference_few_and_many_ctas),
        cmocka_unit_test(mla_split_variants_match_reference),
        cmocka_unit_test(mla_keyless_batch_writes_zeros_and_sink_lse),
        cmocka_unit_test(mla_grid_over_resident_ctas_returns_grid_not_resident),
        cmocka_unit_test(mla_same_inputs_give_bitwise_identical_outputs),
        cmocka_unit_test(mla_graph_decode_loop_follows_trace_every_step),
        cmocka_unit_test(mla_pdl_chained_graph_matches_unchained),
        cmocka_unit_test(mla_rows32_variant_matches_reference),
        cmocka_unit_test(mla_nonfinite_inputs_follow_the_policy),
        cmocka_unit_test(mla_rising_scores_match_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
