/*
 * tests/gpu/test_mla_fp8_gpu.c - fp8 e4m3 KV caches on both MLA bodies (the mma.sync body,
 * the default below 32 heads, and the wgmma body) and the wgmma body's sparse top-k plans
 * (fi_run) against the fp64 reference, on the GPU machine.  Every test skips without a
 * device.
 *
 * fp8: caps.kv_dtype E4M3 (ckv / kpe caches of random e4m3 codes, |x| < 2), q e4m3 or
 * bf16 (fp16 in one case; the transposed fp8 body, row 7, q e4m3 only), out bf16; the truth is fi_naive_attention on the same bytes
 * (fp8 widened exactly, no scale of its own: bmm1 / bmm2 carry it, as the reference APIs'
 * callers fold q_scale * kv_scale and kv_scale).  Tolerance per (token, head) row
 * ||out - ref|| / ||ref|| <= 2e-2 (MLA_TOL_FP8: the kernel's matmuls are fp16, a bf16 q
 * and P are rounded to fp16), lse within 2e-2; every case prints its worst row error.
 * Sparse (fiattn.h fi_caps.sparse_top_k): top-k tables of flat KV slots drawn from each
 * request's own positions, with -1 padding, rows all -1 and rows shared between a
 * request's query tokens (tests/gpu/mla_gpu_case.h); the truth gathers each query token's
 * listed keys into a dense cache and runs the dense reference on it, so it does not
 * depend on the library's sparse planning.  Rows without keys must be exact zeros with
 * lse -inf (or the sink's lse).
 * Outputs are poisoned with NaN before every run; a NaN left anywhere fails.  Refused
 * arguments must write nothing (out / lse keep the poison bytes).
 *
 * Fresh random inputs each run; the seed is printed and FI_TEST_SEED=<seed> replays it.
 * One small case each for compute-sanitizer (split pieces and merges included; the fp8
 * one on the body FI_MLA_TEST_VARIANT names, 4 or 3, else the default: mma.sync; the
 * rows16 one on the transposed fp8 body, row 7):
 *   FI_GPU_TEST_FILTER=sanitize_fp8_small_case compute-sanitizer --tool memcheck \
 *       build/tests/gpu/test_mla_fp8_gpu
 *   FI_GPU_TEST_FILTER=sanitize_fp8_rows16_small_case compute-sanitizer --tool memcheck \
 *       build/tests/gpu/test_mla_fp8_gpu
 *   FI_GPU_TEST_FILTER=sanitize_sparse_small_case compute-sanitizer --tool memcheck \
 *       build/tests/gpu/test_mla_fp8_gpu
 * (racecheck likewise; the filter is a cmocka glob over test names).
 */
#include "gpu/mla_gpu_case.h"
#include "gpu/gpu_test_common.h"
#include "gpu/mla_gt_family.h"

#define MSG 512
#define E4M3 FI_DTYPE_E4M3
#define BF16 FI_DTYPE_BF16

/* An fp8 case's options: cache e4m3, q qdt, out bf16, lse on. */
static mla_opts fp8_opts(fi_dtype qdt, int32_t heads, int32_t page_size, fi_batch_form form) {
    mla_opts o;
    memset(&o, 0, sizeof o);
    o.dtype = BF16; /* what a 0 in the dtypes below would mean; out is bf16 */
    o.q_dtype = qdt;
    o.kv_dtype = E4M3;
    o.heads = heads;
    o.page_size = page_size;
    o.form = form;
    o.return_lse = 1;
    return o;
}

/* Build, run (twice: PDL off then on, bitwise identical, when runs is 2), check against the
 * reference and print the case with its worst row errors; fails the test on a mismatch. */
static void build_and_check(const mla_opts *o, const int32_t *q, const int32_t *kv, int32_t n,
                            int runs, tt_rng *rng) {
    mla_case c;
    char msg[MSG];
    if (mla_case_init(&c, o, q, kv, n, rng, msg, sizeof msg)) fail_msg("init: %s", msg);
    const gt_case g = mla_gt(&c);
    gt_check(&g, runs);
    mla_case_free(&c);
}

/* ---- small cases for compute-sanitizer ------------------------------------------------ */

/* fp8 q and cache, heads 16 on 8 CTAs, on registry row `variant` (0: the default, or the
 * row FI_MLA_TEST_VARIANT names): two requests cut into merged pieces, sinks, lse. */
static void sanitize_fp8_on(int32_t variant, uint64_t seed) {
    tt_rng rng = gt_test_rng(seed);
    mla_opts o = fp8_opts(E4M3, 16, 32, FI_FORM_BLOCK_TABLES);
    o.num_ctas = 8;
    o.sinks = 1;
    o.variant = variant;
    const int32_t q[2] = {1, 1}, kv[2] = {700, 900};
    mla_case c;
    char msg[MSG];
    if (mla_case_init(&c, &o, q, kv, 2, &rng, msg, sizeof msg)) fail_msg("init: %s", msg);
    const gt_case g = mla_gt(&c);
    gt_require_splits(&g, 2);
    gt_check(&g, 1);
    mla_case_free(&c);
}

static void sanitize_fp8_small_case(void **state) {
    (void)state;
    REQUIRE_GPU();
    sanitize_fp8_on(0, 201);
}

/* The same on the transposed fp8 body (row 7): its TMA boxes of a 32-token page, its
 * cp.async tail, its split pieces. */
static void sanitize_fp8_rows16_small_case(void **state) {
    (void)state;
    REQUIRE_GPU();
    sanitize_fp8_on(7, 213);
}

/* Sparse, bf16, heads 16, q_len 2, K 64 on 4 CTAs: -1 padding, a row without keys. */
static void sanitize_sparse_small_case(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(202);
    mla_opts o = fp8_opts(BF16, 16, 32, FI_FORM_BLOCK_TABLES);
    o.kv_dtype = 0; /* bf16 cache */
    o.causal = 1;
    o.num_ctas = 4;
    o.sparse_top_k = 64;
    o.sparse_pad = 20;
    o.sparse_empty_every = 3;
    const int32_t q[2] = {2, 2}, kv[2] = {50, 500};
    build_and_check(&o, q, kv, 2, 1, &rng);
}

/* ---- fp8: every head count, q_len 1 / 2 / 4, both q dtypes ------------------------------ */

/* kv_len of request b (of a case with q_len ql and page size ps): 0 for request 0 of a
 * non-causal case (an empty request next to full ones), one key, a page boundary, or up
 * to 1500 (splits on the few-CTA cases). */
static int32_t fp8_kv_len(tt_rng *r, int32_t b, int32_t ql, int32_t ps, int causal) {
    const int32_t v = b == 0 ? (causal ? ql : 0)
                    : b == 1 ? (ql > 1 ? ql : 1)
                    : b == 2 ? ps + tt_rng_int(r, -1, 1)
                             : tt_rng_int(r, ql, 1500);
    return causal && v < ql ? ql : v;
}

/* One case per (heads, q_len, q dtype) on registry row `variant` (0: the default rows, the
 * mma.sync body below 32 heads and the wgmma body from 32 on; 4: the mma.sync body at every
 * head count); options rotate over the case index: page size (16 / 32 / 64 / 128),
 * concatenated (BLOCK_TABLES) or split (INDPTR) caches, sinks, lse, scales by value or by
 * device pointer, CTAs (the device's count or 3..17: splits), causal (q_len 4 also
 * non-causal, with an empty request). */
static void fp8_every_shape(int32_t variant, uint64_t seed, int q8_only) {
    tt_rng rng = gt_test_rng(seed);
    const int32_t heads[4] = {16, 32, 64, 128}, qls[3] = {1, 2, 4}, pss[4] = {16, 32, 64, 128};
    int idx = 0, n_split = 0, n_run = 0;
    for (int ih = 0; ih < 4; ih++)
        for (int iq = 0; iq < 3; iq++)
            for (int qd = 0; qd < 2; qd++, idx++) {
                if (q8_only && qd)
                    continue; /* the options still rotate with idx */
                n_run++;
                const int32_t ql = qls[iq];
                mla_opts o = fp8_opts(qd ? BF16 : E4M3, heads[ih], pss[(idx + ih) % 4],
                                      (idx >> 1) & 1 ? FI_FORM_INDPTR : FI_FORM_BLOCK_TABLES);
                o.causal = ql > 1 && !(ql == 4 && qd);
                o.sinks = (idx % 3) == 1;
                o.return_lse = idx % 5 != 4;
                o.scale_ptr = ((idx >> 2) ^ idx) & 1;
                o.num_ctas = idx % 3 == 0 ? 0 : 3 + (idx * 5) % 15;
                o.contig_pages = idx % 7 == 3;
                o.variant = variant;
                const int32_t B = heads[ih] >= 64 ? 4 : 6; /* the fp64 reference's time */
                int32_t q[6], kv[6];
                for (int32_t b = 0; b < B; b++) {
                    q[b] = ql;
                    kv[b] = fp8_kv_len(&rng, b, ql, o.page_size, o.causal);
                }
                mla_case c;
                char msg[MSG];
                if (mla_case_init(&c, &o, q, kv, B, &rng, msg, sizeof msg))
                    fail_msg("init: %s", msg);
                n_split += plan_split_stats(c.plan).groups > 0;
                const gt_case g = mla_gt(&c);
                gt_check(&g, idx % 4 == 0 ? 2 : 1);
                mla_case_free(&c);
            }
    print_message("  %d fp8 cases on variant %d, %d with merged splits\n", n_run, (int)variant, n_split);
    assert_true(n_split > 0);
}

static void mla_fp8_matches_reference_every_shape(void **state) {
    (void)state;
    REQUIRE_GPU();
    fp8_every_shape(0, 203, 0);
}

/* The mma.sync body (row 4) reads an fp8 cache at every head count, not only where it is
 * the default (below 32 heads). */
static void mla_fp8_mma_sync_body_every_shape(void **state) {
    (void)state;
    REQUIRE_GPU();
    fp8_every_shape(4, 208, 0);
}

/* The transposed fp8 body (row 7: q and cache fp8, 16-row tiles, 64-token blocks) at every
 * head count (heads 32 to 128 cut into tiles of 16 rows), q_len 1 / 2 / 4, every page size
 * (TMA boxes of a page, or 16 rows of a larger one; cp.async for an item's ragged end). */
static void mla_fp8_rows16_body_every_shape(void **state) {
    (void)state;
    REQUIRE_GPU();
    fp8_every_shape(7, 212, 1);
}

/* Row 8 (row 7's body, tiles and charges with the data-parallel partition the device
 * planner runs; pairs where a batch has at most two tiles a CTA, planner/ppair.c) at every
 * shape, planned on the host (its device plans are the same bytes: test_device_plan_gpu). */
static void mla_fp8_rows16_parallel_row_every_shape(void **state) {
    (void)state;
    REQUIRE_GPU();
    fp8_every_shape(8, 218, 1);
}

/* Row 7 on pages of one token (caps.c takes 1, 16, 32, 64, 128; the every-shape test
 * covers 16-128): every token copied by cp.async through its own page-table entry; both
 * forms, splits (few CTAs over long requests), sinks. */
static void mla_fp8_rows16_small_pages(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(217);
    for (int i = 0; i < 3; i++) {
        mla_opts o = fp8_opts(E4M3, 16, 1, i == 1 ? FI_FORM_INDPTR : FI_FORM_BLOCK_TABLES);
        o.variant = 7;
        o.num_ctas = 5 + 3 * i;
        o.sinks = i == 2;
        const int32_t q[3] = {1, 1, 1}, kv[3] = {1 + 64 * i, 333, 777 + 5 * i};
        build_and_check(&o, q, kv, 3, 1, &rng);
    }
}

/* fp16 q over an fp8 cache (the third q type the body converts), and the wgmma row named
 * explicitly (caps.variant 3) instead of the default. */
static void mla_fp8_f16_q_and_explicit_wgmma_row(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(204);
    const int32_t q[3] = {2, 2, 2}, kv[3] = {2, 333, 1500};
    mla_opts o = fp8_opts(FI_DTYPE_F16, 64, 64, FI_FORM_BLOCK_TABLES);
    o.causal = 1;
    o.sinks = 1;
    build_and_check(&o, q, kv, 3, 2, &rng);
    o = fp8_opts(E4M3, 32, 16, FI_FORM_INDPTR);
    o.variant = 3;
    o.num_ctas = 5;
    build_and_check(&o, q, kv, 3, 1, &rng);
}

/* A batch of empty requests (kv_len 0, non-causal) between full ones, and one with every
 * request empty: zeros, lse -inf or the sink's; both q dtypes, few CTAs. */
static void mla_fp8_empty_requests_write_zeros(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(205);
    for (int k = 0; k < 4; k++) {
        mla_opts o = fp8_opts(k & 1 ? BF16 : E4M3, k & 2 ? 128 : 16, 32, FI_FORM_BLOCK_TABLES);
        o.sinks = k == 3;
        o.num_ctas = 6;
        int32_t q[4], kv[4];
        for (int32_t b = 0; b < 4; b++) {
            q[b] = 1 + (k & 1);
            kv[b] = k == 2 || b % 2 == 0 ? 0 : tt_rng_int(&rng, 1, 1200);
        }
        build_and_check(&o, q, kv, 4, 2, &rng);
    }
}

/* The CUDA graph decode loop of the MLA suite (gt_graph_decode_loop: one capture, 64
 * steps following the trace's lengths, fresh q and bmm1 scale each step, each step
 * replayed LOOP_REPLAYS times and bitwise equal) over an fp8 cache with fp8 q, sinks and
 * scales by pointer: the transposed fp8 body (row 7).  Its stage-release race (a block's
 * V overwritten by the next tensor-map copy before ldmatrix read it: docs/perf-log.md,
 * thirty-seventh session) showed here as one request's rows off by 2-8e-2 with the LSE
 * exact.  A failing run prints that step's plan. */
static void mla_fp8_graph_decode_loop_follows_trace(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(206);
    mla_opts o = fp8_opts(E4M3, 16, LOOP_PS, FI_FORM_BLOCK_TABLES);
    o.sinks = 1;
    o.scale_ptr = 1;
    mla_gt_graph_decode_loop(o, &rng);
}

/* ---- fp8: refused arguments ------------------------------------------------------------ */

/* A case of options o (heads 16, q_len 1, three requests), poisoned and synchronised. */
static void open_poisoned(mla_case *c, const mla_opts *o, tt_rng *rng) {
    const int32_t q[3] = {1, 1, 1}, kv[3] = {100, 17, 300};
    char msg[MSG];
    if (mla_case_init(c, o, q, kv, 3, rng, msg, sizeof msg)) fail_msg("init: %s", msg);
    assert_int_equal(mla_case_poison(c, msg, sizeof msg), 0);
    assert_int_equal(cudaStreamSynchronize(c->stream), cudaSuccess);
}

/* fi_run of c with arguments a (the case's own, or one member broken) must return want,
 * and out / lse must still hold the poison. */
static void expect_refused(mla_case *c, const fi_attn_args *a, fi_status want, const char *what) {
    const gt_case g = mla_gt(c);
    gt_expect_status(&g, a, want, what);
    gt_expect_untouched(&g);
}

/* An fp8 cache with out f16 (on either body), tensors whose dtype is not the caps' (k /
 * k_rope bf16 under an fp8 cache, q bf16 under fp8 q, k e4m3 under a bf16 cache):
 * FI_ERR_UNSUPPORTED_DTYPE before any launch, nothing written. */
static void mla_fp8_bad_dtypes_refused_and_nothing_written(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(207);
    mla_case c;
    fi_attn_args a;

    mla_opts o = fp8_opts(E4M3, 16, 16, FI_FORM_BLOCK_TABLES);
    o.o_dtype = FI_DTYPE_F16;
    open_poisoned(&c, &o, &rng);
    a = mla_case_args(&c, 1);
    expect_refused(&c, &a, FI_ERR_UNSUPPORTED_DTYPE, "kv e4m3 with out f16");
    mla_case_free(&c);

    o.variant = 3; /* the wgmma body (the default above is the mma.sync body at heads 16) */
    open_poisoned(&c, &o, &rng);
    a = mla_case_args(&c, 1);
    expect_refused(&c, &a, FI_ERR_UNSUPPORTED_DTYPE, "kv e4m3 with out f16 on variant 3 (wgmma)");
    mla_case_free(&c);

    o = fp8_opts(E4M3, 32, 16, FI_FORM_INDPTR);
    open_poisoned(&c, &o, &rng);
    const fi_attn_args good = mla_case_args(&c, 1);
    a = good; a.k.dtype = BF16;
    expect_refused(&c, &a, FI_ERR_UNSUPPORTED_DTYPE, "k bf16 under an e4m3 cache");
    a = good; a.k_rope.dtype = BF16;
    expect_refused(&c, &a, FI_ERR_UNSUPPORTED_DTYPE, "k_rope bf16 under an e4m3 cache");
    a = good; a.q.dtype = BF16;
    expect_refused(&c, &a, FI_ERR_UNSUPPORTED_DTYPE, "q bf16 under e4m3 q caps");
    a = good; a.out.dtype = FI_DTYPE_F16;
    expect_refused(&c, &a, FI_ERR_UNSUPPORTED_DTYPE, "out f16 under bf16 out caps");
    mla_case_free(&c);

    o = fp8_opts(BF16, 32, 16, FI_FORM_BLOCK_TABLES);
    o.kv_dtype = 0; /* bf16 cache */
    open_poisoned(&c, &o, &rng);
    a = mla_case_args(&c, 1);
    a.k.dtype = E4M3;
    expect_refused(&c, &a, FI_ERR_UNSUPPORTED_DTYPE, "k e4m3 under a bf16 cache");
    /* and the case still runs right afterwards */
    const gt_case g = mla_gt(&c);
    gt_check(&g, 1);
    mla_case_free(&c);
}

/* ---- sparse top-k ------------------------------------------------------------------------- */

typedef struct sparse_variant {
    fi_dtype q, kv;           /* kv 0: the q dtype (bf16) */
    int32_t heads, q_len, K, page_size, B, kv_lo, kv_hi;
    int32_t pad, empty_every, dup, sinks, scale_ptr, num_ctas;
} sparse_variant;

static const sparse_variant SPARSE_VARIANTS[] = {
    /* q     kv    H   ql  K     ps  B  kv_lo kv_hi pad empty dup sinks sptr ctas */
    {BF16, 0,    16,  1, 64,    1,  4,  10,  300,  0,  3,   0,  0,    0,   0},
    {BF16, 0,    16,  2, 512,   32, 3,  300, 3000, 10, 4,   1,  1,    1,   5},
    {BF16, 0,    128, 1, 2048,  64, 2,  2500, 5000, 0, 0,   0,  0,    0,   0},
    {BF16, 0,    128, 2, 64,    64, 3,  40,  200,  25, 5,   0,  1,    0,   7},
    {E4M3, E4M3, 16,  2, 2048,  32, 2,  1000, 6000, 5, 3,   1,  0,    1,   0},
    {E4M3, E4M3, 128, 1, 512,   1,  3,  100, 900,  0,  0,   0,  1,    0,   0},
    {BF16, E4M3, 128, 2, 512,   64, 2,  600, 2000, 50, 2,   0,  0,    1,   9},
    {BF16, E4M3, 16,  1, 2048,  1,  3,  500, 4000, 0,  0,   1,  0,    0,   0},
};

/* Every entry of SPARSE_VARIANTS against the gathered reference; kv lengths below K leave
 * the tail of a row -1 besides the pad percent; rows all -1 (empty_every) must be exact
 * zeros with lse -inf (or the sink). */
static void mla_sparse_matches_gathered_reference(void **state) {
    (void)state;
    REQUIRE_GPU();
    tt_rng rng = gt_test_rng(208);
    for (size_t i = 0; i < sizeof SPARSE_VARIANTS / sizeof SPARSE_VARIANTS[0]; i++) {
        const sparse_variant *v = &SPARSE_VARIANTS[i];
        mla_opts o = fp8_opts(v->q, v->heads, v->page_size, FI_FORM_BLOCK_TABLES);
        o.kv_dtype = v->kv;
        o.causal = v->q_len > 1; /* as trtllm decode passes it; a sparse row ignores it */
        o.sparse_top_k = v->K;
        o.sparse_pad = v->pad;
        o.sparse_empty_every = v->empty_every;
        o.sparse_dup = v->dup;
        o.sinks = v->sinks;
        o.scale_ptr = v->scale_ptr;
        o.num_ctas = v->num_ctas;
        int32_t q[4], kv[4];
        for (int32_t b = 0; b < v->B; b++) {
            q[b] = v->q_len;
            kv[b] = tt_rng_int(&rng, v->kv_lo, v->kv_hi);
        }
        build_and_check(&o, q, kv, v->B, i % 3 == 0 ? 2 : 1, &rng);
    }
}

/* A plan the chosen row has no path for is refused by fi_run with its status and writes
 * nothing (a planner that refuses the caps already, with the same status, is accepted
 * too): kv_dtype 0 = bf16 cache; want the status. */
static void expect_row_refuses_q(int32_t variant, int32_t sparse_top_k, fi_dtype q_dtype,
                                 fi_dtype kv_dtype, fi_status want, uint64_t seed, const char *what) {
    tt_rng rng = gt_test_rng(seed);
    mla_opts o = fp8_opts(q_dtype, 16, 64, FI_FORM_BLOCK_TABLES);
    o.kv_dtype = kv_dtype;
    o.variant = variant;
    o.sparse_top_k = sparse_top_k;
    const int32_t q[2] = {1, 1}, kv[2] = {100, 300};
    mla_case c;
    char msg[MSG];
    if (mla_case_init(&c, &o, q, kv, 2, &rng, msg, sizeof msg)) {
        if (!strstr(msg, fi_status_name(want))) fail_msg("%s: init: %s", what, msg);
        print_message("  refused when planned: %s\n", msg);
        return;
    }
    assert_int_equal(mla_case_poison(&c, msg, sizeof msg), 0);
    assert_int_equal(cudaStreamSynchronize(c.stream), cudaSuccess);
    const fi_attn_args a = mla_case_args(&c, 1);
    expect_refused(&c, &a, want, what);
    mla_case_free(&c);
}

/* The same with q in the cache's dtype (fp8 e4m3 over an fp8 cache, else bf16). */
static void expect_row_refuses(int32_t variant, int32_t sparse_top_k, fi_dtype kv_dtype,
                               fi_status want, uint64_t seed, const char *what) {
    expect_row_refuses_q(variant, sparse_top_k, kv_dtype == E4M3 ? E4M3 : BF16, kv_dtype, want,
                         seed, what);
}

/* Sparse plans run on the 32-token wgmma body only: the mma.sync row (caps.variant 4), the
 * 64-token wgmma row (6) and the transposed fp8 row (7) refuse them with
 * FI_ERR_SPARSE_UNSUPPORTED; the 64-token row runs 16-bit caches only: an fp8 cache there
 * is FI_ERR_UNSUPPORTED_DTYPE; row 7 runs q and cache fp8 only: a bf16 q or a bf16 cache
 * there is FI_ERR_UNSUPPORTED_DTYPE. */
static void mla_rows_without_a_path_refuse(void **state) {
    (void)state;
    REQUIRE_GPU();
    expect_row_refuses(4, 64, 0, FI_ERR_SPARSE_UNSUPPORTED, 209, "sparse plan on variant 4 (mma.sync)");
    expect_row_refuses(6, 64, 0, FI_ERR_SPARSE_UNSUPPORTED, 210, "sparse plan on variant 6 (wgmma64)");
    expect_row_refuses(6, 0, E4M3, FI_ERR_UNSUPPORTED_DTYPE, 211, "fp8 cache on variant 6 (wgmma64)");
    expect_row_refuses(7, 64, E4M3, FI_ERR_SPARSE_UNSUPPORTED, 214, "sparse plan on variant 7 (fp8 rows16)");
    expect_row_refuses(7, 0, 0, FI_ERR_UNSUPPORTED_DTYPE, 215, "bf16 cache on variant 7 (fp8 rows16)");
    expect_row_refuses_q(7, 0, BF16, E4M3, FI_ERR_UNSUPPORTED_DTYPE, 216,
                         "bf16 q over an fp8 cache on variant 7 (fp8 rows16)");
}

int main(void) {
    gt_begin("test_mla_fp8_gpu");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sanitize_fp8_small_case),
        cmocka_unit_test(sanitize_fp8_rows16_small_case),
        cmocka_unit_test(sanitize_sparse_small_case),
        cmocka_unit_test(mla_fp8_bad_dtypes_refused_and_nothing_written),
        cmocka_unit_test(mla_fp8_matches_reference_every_shape),
        cmocka_unit_test(mla_fp8_mma_sync_body_every_shape),
        cmocka_unit_test(mla_fp8_rows16_body_every_shape),
        cmocka_unit_test(mla_fp8_rows16_parallel_row_every_shape),
        cmocka_unit_test(mla_fp8_rows16_small_pages),
        cmocka_unit_test(mla_fp8_f16_q_and_explicit_wgmma_row),
        cmocka_unit_test(mla_fp8_empty_requests_write_zeros),
        cmocka_unit_test(mla_fp8_graph_decode_loop_follows_trace),
        cmocka_unit_test(mla_sparse_matches_gathered_reference),
        cmocka_unit_test(mla_rows_without_a_path_refuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
