/*
 * tests/test_sparse.c - sparse top-k MLA decode (fi_caps.sparse_top_k = K > 0, DeepSeek
 * sparse attention) on the host:
 *   - caps and batch rules: each sparse rule of fiattn.h gets its own status, detail and
 *     leaves the previous plan byte-identical (fi_plan_update) / the caller's table
 *     untouched (fi_batch_validate); device planning of a sparse plan is refused;
 *   - the request table: query token (b, i) = request r = b * q_len + i {q_offset r, q_len
 *     1, kv_len K, page_row_offset r * K}, more requests than caps.max_batch;
 *   - coverage: every (request, head, row, key) once (tests/common/plan_check.h), for the
 *     walk / packing and the data-parallel partition rows, 16 to 128 heads;
 *   - fi_ref_run (the plan) equals fi_naive_attention (fp64, straight from the batch) on
 *     random sparse batches (K, q_len 1..4, page sizes 1 / 16 / 64, -1 padding, a row of
 *     all -1, duplicated slots), outputs poisoned and required fully written;
 *   - a sparse batch whose rows list exactly a dense batch's keys (in order, with -1
 *     padding anywhere) gives the dense batch's output;
 *   - the page-table tensor as [B, q_len, K] or [B * q_len, K], and its shape / stride rules.
 * Fresh random inputs each run (seed printed; FI_TEST_SEED replays).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/plan_check.h"
#include "common/rng.h"
#include "common/tensors.h"
#include "fiattn.h"
#include "fiattn_ref.h"

static uint64_t g_seed;
static tt_rng g_rng;

/* ---- batches ----------------------------------------------------------------------------- */

/* MLA decode caps (fp32 tensors: the CPU references' exact path), sparse when top_k > 0. */
static fi_caps sparse_caps(int32_t heads, int32_t page_size, int32_t num_pages, int32_t max_batch,
                           int32_t max_q_tokens, int32_t top_k, int32_t num_ctas) {
    fi_caps c = tt_test_caps(FI_KIND_MLA_DECODE, heads, 1, 576, page_size, num_pages, max_batch,
                             max_q_tokens);
    c.num_ctas = num_ctas;
    c.sparse_top_k = top_k;
    return c;
}

/* A sparse batch and its arrays: table [B, q_len, K] of flat slots, seq_lens [B]. */
typedef struct sparse_batch {
    fi_batch batch;
    int32_t *table;
    int32_t *seq_lens;
} sparse_batch;

/* B requests of q_len tokens, K slots a token drawn from [0, num_slots) (repeats allowed),
 * about pad_pct % of them -1; row `empty_row` (< 0: none) all -1.  seq_lens random: they
 * select no key. */
static sparse_batch sparse_make(int32_t B, int32_t q_len, int32_t K, int64_t num_slots,
                                int32_t pad_pct, int32_t empty_row) {
    sparse_batch s;
    memset(&s, 0, sizeof s);
    const int64_t n = (int64_t)B * q_len * K;
    s.table = malloc(sizeof(int32_t) * (size_t)(n + 1));
    s.seq_lens = malloc(sizeof(int32_t) * (size_t)(B + 1));
    assert_non_null(s.table);
    assert_non_null(s.seq_lens);
    for (int64_t e = 0; e < n; e++) {
        const int pad = tt_rng_int(&g_rng, 0, 99) < pad_pct;
        s.table[e] = pad ? -1 : (int32_t)(tt_rng_next(&g_rng) % (uint64_t)num_slots);
    }
    if (empty_row >= 0)
        for (int32_t t = 0; t < K; t++) s.table[(int64_t)empty_row * K + t] = -1;
    for (int32_t b = 0; b < B; b++) s.seq_lens[b] = tt_rng_int(&g_rng, 0, 100000);
    s.batch.form = FI_FORM_BLOCK_TABLES;
    s.batch.batch_size = B;
    s.batch.block_tables = s.table;
    s.batch.max_pages_per_seq = K;
    s.batch.seq_lens = s.seq_lens;
    s.batch.q_len_per_request = q_len;
    s.batch.causal = tt_rng_int(&g_rng, 0, 1); /* no effect on a sparse batch */
    s.batch.window_left = -1;
    return s;
}

static void sparse_free(sparse_batch *s) {
    free(s->table);
    free(s->seq_lens);
    memset(s, 0, sizeof *s);
}

/* The table as the [B, q_len, K] int32 tensor of the reference API, or flat [B * q_len, K]. */
static fi_tensor table_view(const sparse_batch *s, int three_d) {
    const fi_batch *b = &s->batch;
    const int64_t K = b->max_pages_per_seq, q = b->q_len_per_request;
    if (three_d) {
        const int64_t shape[3] = {b->batch_size, q, K}, stride[3] = {q * K, K, 1};
        return fi_tensor_make(s->table, FI_DTYPE_I32, 3, shape, stride);
    }
    const int64_t shape[2] = {(int64_t)b->batch_size * q, K}, stride[2] = {K, 1};
    return fi_tensor_make(s->table, FI_DTYPE_I32, 2, shape, stride);
}

/* ---- caps rules ---------------------------------------------------------------------------- */

static void caps_sparse_rules(void **state) {
    (void)state;
    fi_caps c = sparse_caps(64, 64, 128, 8, 64, 2048, 8);
    assert_int_equal(fi_caps_validate(&c), FI_OK);
    c.sparse_top_k = FI_LIMIT_SPARSE_TOP_K;
    assert_int_equal(fi_caps_validate(&c), FI_OK);
    c.sparse_top_k = FI_LIMIT_SPARSE_TOP_K + 1;
    assert_int_equal(fi_caps_validate(&c), FI_ERR_INVALID_CAPS);
    c.sparse_top_k = -1;
    assert_int_equal(fi_caps_validate(&c), FI_ERR_INVALID_CAPS);
    size_t bytes = 0;
    assert_int_equal(fi_workspace_size(&c, &bytes), FI_ERR_INVALID_CAPS);
    assert_int_equal(bytes, 0);
    /* other kinds: not defined */
    fi_caps g = c;
    g.kind = FI_KIND_GQA_DECODE;
    g.num_qo_heads = 8;
    g.num_kv_heads = 2;
    g.head_dim_qk = g.head_dim_vo = 128;
    g.sparse_top_k = 0;
    assert_int_equal(fi_caps_validate(&g), FI_OK);
    g.sparse_top_k = 64;
    assert_int_equal(fi_caps_validate(&g), FI_ERR_SPARSE_UNSUPPORTED);
    g.kind = FI_KIND_CONTEXT;
    assert_int_equal(fi_caps_validate(&g), FI_ERR_SPARSE_UNSUPPORTED);
    fi_plan *p = NULL;
    assert_int_equal(fi_plan_create(&g, NULL, 0, NULL, &p), FI_ERR_SPARSE_UNSUPPORTED);
    assert_null(p);
}

/* The request table holds one request per query token: more workspace than the dense
 * plan of the same caps when max_q_tokens > max_batch, the same otherwise. */
static void workspace_holds_a_request_per_query_token(void **state) {
    (void)state;
    fi_caps dense = sparse_caps(16, 64, 128, 4, 32, 0, 8);
    fi_caps sparse = dense;
    sparse.sparse_top_k = 256;
    size_t nd = 0, ns = 0;
    assert_int_equal(fi_workspace_size(&dense, &nd), FI_OK);
    assert_int_equal(fi_workspace_size(&sparse, &ns), FI_OK);
    assert_true(ns >= nd + (32 - 4) * sizeof(fi_request_info));
    dense.max_q_tokens = sparse.max_q_tokens = 4;
    assert_int_equal(fi_workspace_size(&dense, &nd), FI_OK);
    assert_int_equal(fi_workspace_size(&sparse, &ns), FI_OK);
    assert_int_equal(ns, nd);
    /* the largest caps: still a checked, finite size (or a limit status), never a wrap */
    fi_caps big = sparse_caps(128, 128, FI_LIMIT_NUM_PAGES, FI_LIMIT_MAX_BATCH,
                              FI_LIMIT_MAX_Q_TOKENS, FI_LIMIT_SPARSE_TOP_K, 132);
    const fi_status st = fi_workspace_size(&big, &ns);
    assert_true(st == FI_OK || st == FI_ERR_PLAN_OVER_LIMIT);
}

/* ---- batch rules ---------------------------------------------------------------------------- */

/* A host plan of sparse caps planned with a valid batch, and a writable copy to break. */
typedef struct fixture {
    fi_caps caps;
    sparse_batch good;
    fi_plan *plan;
} fixture;

enum { FX_B = 5, FX_Q = 3, FX_K = 40, FX_PAGES = 20, FX_PS = 16 };

static void setup(fixture *f) {
    memset(f, 0, sizeof *f);
    f->caps = sparse_caps(16, FX_PS, FX_PAGES, FX_B, FX_B * FX_Q, FX_K, tt_rng_int(&g_rng, 1, 12));
    f->good = sparse_make(FX_B, FX_Q, FX_K, (int64_t)FX_PAGES * FX_PS, 20, -1);
    assert_int_equal(fi_plan_create(&f->caps, NULL, 0, NULL, &f->plan), FI_OK);
    assert_int_equal(fi_plan_update(f->plan, &f->good.batch, NULL), FI_OK);
}

static void teardown(fixture *f) {
    fi_plan_destroy(f->plan);
    sparse_free(&f->good);
}

/* bad must get `want` (request `req`, needed / limit unless -2) from both fi_plan_update
 * (plan unchanged, still usable) and fi_batch_validate (table untouched). */
static void expect_rejected(fixture *f, const fi_batch *bad, fi_status want, int32_t req,
                            int64_t needed, int64_t limit, const char *what) {
    tt_plan_snapshot before, after;
    assert_int_equal(tt_plan_snapshot_take(f->plan, &before), 0);
    const fi_status st = fi_plan_update(f->plan, bad, NULL);
    if (st != want)
        fail_msg("seed %llu: %s: got %s, want %s", (unsigned long long)g_seed, what,
                 fi_status_name(st), fi_status_name(want));
    const fi_error_detail d = fi_plan_error(f->plan);
    if (d.status != want || d.request != req || (needed != -2 && d.needed != needed) ||
        (limit != -2 && d.limit != limit))
        fail_msg("seed %llu: %s: detail request %d needed %lld limit %lld, want %d %lld %lld",
                 (unsigned long long)g_seed, what, d.request, (long long)d.needed,
                 (long long)d.limit, req, (long long)needed, (long long)limit);
    assert_int_equal(tt_plan_snapshot_take(f->plan, &after), 0);
    if (tt_plan_snapshot_diff(&before, &after) >= 0)
        fail_msg("seed %llu: %s changed the previous plan", (unsigned long long)g_seed, what);
    tt_plan_snapshot_free(&before);
    tt_plan_snapshot_free(&after);

    fi_request_info table[FX_B * FX_Q + 1];
    memset(table, 0x5a, sizeof table);
    int32_t tokens = -7;
    fi_error_detail e;
    assert_int_equal(fi_batch_validate(&f->caps, bad, table, &tokens, &e), want);
    assert_int_equal(e.request, d.request);
    assert_int_equal(e.needed, d.needed);
    assert_int_equal(tokens, -7);
    for (size_t i = 0; i < sizeof table; i++) assert_int_equal(((unsigned char *)table)[i], 0x5a);
    assert_int_equal(fi_plan_update(f->plan, &f->good.batch, NULL), FI_OK);
}

static void sparse_batch_scalar_rules(void **state) {
    (void)state;
    fixture f;
    setup(&f);
    fi_batch b = f.good.batch;
    /* forms: INDPTR is a decode form, but not a sparse one; CUM_SEQ_LENS keeps its
     * INVALID_FORM (not a decode form at all), as does an unknown form */
    b.form = FI_FORM_INDPTR;
    expect_rejected(&f, &b, FI_ERR_SPARSE_UNSUPPORTED, -1, FI_FORM_INDPTR, -2, "indptr form");
    b.form = FI_FORM_CUM_SEQ_LENS;
    expect_rejected(&f, &b, FI_ERR_INVALID_FORM, -1, -2, -2, "cum_seq_lens form");
    b.form = (fi_batch_form)9;
    expect_rejected(&f, &b, FI_ERR_INVALID_FORM, -1, -2, -2, "unknown form");
    b = f.good.batch;
    b.window_left = 7;
    expect_rejected(&f, &b, FI_ERR_SPARSE_UNSUPPORTED, -1, 7, -1, "window_left 7");
    b.window_left = -2; /* the dense rule first */
    expect_rejected(&f, &b, FI_ERR_INVALID_WINDOW, -1, -2, -2, "window_left -2");
    b = f.good.batch;
    b.kv_split_pages = 1;
    expect_rejected(&f, &b, FI_ERR_SPARSE_UNSUPPORTED, -1, 1, 0, "3-D table");
    b.kv_split_pages = 2;
    expect_rejected(&f, &b, FI_ERR_INVALID_KV_SPLIT, -1, -2, -2, "kv_split_pages 2");
    b = f.good.batch;
    const int32_t wrong_k[3] = {FX_K - 1, FX_K + 1, 0};
    for (int i = 0; i < 3; i++) {
        b.max_pages_per_seq = wrong_k[i];
        expect_rejected(&f, &b, FI_ERR_SPARSE_TOP_K_MISMATCH, -1, wrong_k[i], FX_K, "row != K");
    }
    b.max_pages_per_seq = -1;
    expect_rejected(&f, &b, FI_ERR_NEGATIVE_PAGES_PER_SEQ, -1, -2, -2, "row < 0");
    b = f.good.batch;
    b.q_len_per_request = -1;
    expect_rejected(&f, &b, FI_ERR_NEGATIVE_LENGTH, -1, -2, -2, "q_len -1");
    b.q_len_per_request = 0;
    expect_rejected(&f, &b, FI_ERR_Q_LEN_UNSUPPORTED, 0, 0, 8, "q_len 0");
    b.q_len_per_request = 9;
    expect_rejected(&f, &b, FI_ERR_Q_LEN_UNSUPPORTED, 0, 9, 8, "q_len 9");
    /* causal is still 0 / 1 */
    b = f.good.batch;
    b.causal = 2;
    expect_rejected(&f, &b, FI_ERR_INVALID_CAUSAL, -1, -2, -2, "causal 2");
    teardown(&f);
}

static void sparse_batch_request_rules(void **state) {
    (void)state;
    fixture f;
    setup(&f);
    const int64_t slots = (int64_t)FX_PAGES * FX_PS;
    const int32_t bad_b = tt_rng_int(&g_rng, 0, FX_B - 1);
    /* seq_lens: only their sign */
    sparse_batch s = sparse_make(FX_B, FX_Q, FX_K, slots, 20, -1);
    s.seq_lens[bad_b] = -1;
    expect_rejected(&f, &s.batch, FI_ERR_NEGATIVE_LENGTH, bad_b, -1, 0, "seq_lens -1");
    s.seq_lens[bad_b] = INT32_MAX; /* far past any page count: unused, fine */
    assert_int_equal(fi_plan_update(f.plan, &s.batch, NULL), FI_OK);
    /* a slot at num_pages x page_size, anywhere in request bad_b's q_len rows */
    const int64_t at = (int64_t)bad_b * FX_Q * FX_K + tt_rng_int(&g_rng, 0, FX_Q * FX_K - 1);
    s.table[at] = (int32_t)slots;
    expect_rejected(&f, &s.batch, FI_ERR_PAGE_INDEX_OUT_OF_RANGE, bad_b, slots, slots,
                    "slot = num_pages x page_size");
    s.table[at] = INT32_MAX;
    expect_rejected(&f, &s.batch, FI_ERR_PAGE_INDEX_OUT_OF_RANGE, bad_b, INT32_MAX, slots,
                    "slot INT32_MAX");
    /* the last slot and any negative entry are fine */
    s.table[at] = (int32_t)slots - 1;
    assert_int_equal(fi_plan_update(f.plan, &s.batch, NULL), FI_OK);
    s.table[at] = INT32_MIN;
    assert_int_equal(fi_plan_update(f.plan, &s.batch, NULL), FI_OK);
    /* query tokens over the caps: the first request whose tokens pass max_q_tokens */
    fi_caps small = f.caps;
    small.max_q_tokens = FX_Q * 2 + 1;
    fi_plan *p = NULL;
    assert_int_equal(fi_plan_create(&small, NULL, 0, NULL, &p), FI_OK);
    assert_int_equal(fi_plan_update(p, &s.batch, NULL), FI_ERR_Q_TOKENS_OVER_CAPS);
    assert_int_equal(fi_plan_error(p).request, 2);
    assert_int_equal(fi_plan_error(p).needed, 3 * FX_Q);
    fi_plan_destroy(p);
    sparse_free(&s);
    teardown(&f);
}

/* B x q_len x K entries past INT32_MAX: the row offsets r * K would overflow.  The dense
 * rule (B x K) alone passes here; nothing is read. */
static void sparse_table_size_counts_query_tokens(void **state) {
    (void)state;
    const int32_t K = FI_LIMIT_SPARSE_TOP_K, B = 4096;
    fi_caps c = sparse_caps(128, 64, 1024, B, B * 8, K, 8);
    const int32_t one = 0;
    fi_batch b = {.form = FI_FORM_BLOCK_TABLES, .batch_size = B, .block_tables = &one,
                  .max_pages_per_seq = K, .seq_lens = &one, .q_len_per_request = 8,
                  .causal = 1, .window_left = -1};
    fi_request_info r;
    int32_t tokens;
    fi_error_detail e;
    assert_int_equal(fi_batch_validate(&c, &b, &r, &tokens, &e), FI_ERR_PAGE_TABLE_TOO_LARGE);
    assert_int_equal(e.needed, (int64_t)B * 8 * K);
    assert_int_equal(e.limit, INT32_MAX);
}

/* fi_plan_update_device: sparse plans are planned on the host only (refused before the
 * workspace is looked at, so a host-only plan answers the same). */
static void device_planning_refuses_sparse_plans(void **state) {
    (void)state;
    fixture f;
    setup(&f);
    fi_device_batch d = {.batch = f.good.batch, .batch_size = NULL, .max_q_tokens = FX_B * FX_Q};
    tt_plan_snapshot before, after;
    assert_int_equal(tt_plan_snapshot_take(f.plan, &before), 0);
    assert_int_equal(fi_plan_update_device(f.plan, &d, 0, NULL), FI_ERR_SPARSE_UNSUPPORTED);
    assert_int_equal(fi_plan_error(f.plan).status, FI_ERR_SPARSE_UNSUPPORTED);
    assert_int_equal(tt_plan_snapshot_take(f.plan, &after), 0);
    assert_true(tt_plan_snapshot_diff(&before, &after) < 0);
    tt_plan_snapshot_free(&before);
    tt_plan_snapshot_free(&after);
    teardown(&f);
}

/* ---- the request table and coverage ----------------------------------------------------------- */

static void sparse_batches_are_covered(void **state) {
    (void)state;
    static const int32_t heads[4] = {16, 32, 64, 128};
    static const int32_t variants[4] = {0, 2, 3, 4};
    char msg[512];
    int64_t splits = 0, over_max_batch = 0;
    for (int it = 0; it < 240; it++) {
        const int32_t B = tt_rng_int(&g_rng, 1, 24), q = tt_rng_int(&g_rng, 1, 8);
        const int32_t K = tt_rng_int(&g_rng, 0, 3) ? tt_rng_int(&g_rng, 1, 700)
                                                    : tt_rng_int(&g_rng, 2048, 4096);
        const int32_t ps = (int32_t[]){1, 16, 64}[it % 3], pages = tt_rng_int(&g_rng, 1, 64);
        /* max_batch exactly B: the table then holds B x q_len > max_batch requests */
        fi_caps c = sparse_caps(heads[tt_rng_int(&g_rng, 0, 3)], ps, pages, B,
                                B * q + tt_rng_int(&g_rng, 0, 5), K, tt_rng_int(&g_rng, 1, 160));
        c.variant = variants[(it >> 2) & 3];
        if (c.variant == 3 && c.num_qo_heads < 32) c.variant = 0;
        sparse_batch s = sparse_make(B, q, K, (int64_t)pages * ps, tt_rng_int(&g_rng, 0, 60),
                                     tt_rng_int(&g_rng, -1, B * q - 1));
        fi_plan *p = NULL;
        assert_int_equal(fi_plan_create(&c, NULL, 0, NULL, &p), FI_OK);
        const fi_status st = fi_plan_update(p, &s.batch, NULL);
        if (st != FI_OK)
            fail_msg("seed %llu iter %d: update %s", (unsigned long long)g_seed, it,
                     fi_status_name(st));
        /* B x q_len requests of one token, kv_len K: what tt_plan_check walks */
        tt_plan_expect_buf x;
        fi_batch as_dense;
        assert_int_equal(tt_plan_expect_sparse(&s.batch, &x, &as_dense), 0);
        if (tt_plan_check(p, &as_dense, &x.e, msg, sizeof msg) != 0)
            fail_msg("seed %llu iter %d (B %d q %d K %d heads %d ctas %d variant %d): %s",
                     (unsigned long long)g_seed, it, B, q, K, c.num_qo_heads, c.num_ctas,
                     c.variant, msg);
        fi_plan_view v;
        assert_int_equal(fi_plan_get_view(p, &v), FI_OK);
        assert_int_equal(v.header->form, FI_FORM_BLOCK_TABLES);
        assert_int_equal(v.header->kv_split_pages, 0);
        splits += v.header->num_groups > 0;
        over_max_batch += B * q > B;
        tt_plan_expect_free(&x);
        fi_plan_destroy(p);
        sparse_free(&s);
    }
    assert_true(splits > 0);
    assert_true(over_max_batch > 0);
}

/* ---- ref vs naive ------------------------------------------------------------------------------ */

/* Run the naive reference and the plan's CPU executor on the same inputs; both outputs
 * poisoned first and required fully written; ||ref - naive|| / ||naive|| <= 1e-5.
 * Also: rows without a key are zeros with lse -inf (no sinks) in both. */
static void check_sparse_case(const char *label, const fi_caps *caps, const sparse_batch *s,
                              const fi_test_attn_opts *opts, int three_d, int *split) {
    tt_test_attn ta;
    assert_int_equal(tt_test_attn_make(&ta, caps, &s->batch, opts, &g_rng), 0);
    ta.args.page_table = table_view(s, three_d);
    fi_attn_args ref_args;
    assert_int_equal(tt_test_attn_args_fork(&ta, &ref_args), 0);
    const fi_tensor ref_out = ref_args.out, ref_lse = ref_args.lse;
    const int64_t rows = ta.q_tokens;
    tt_tensor_poison(&ta.args.out);
    tt_tensor_poison(&ta.args.lse);

    fi_status st = fi_naive_attention(caps, &s->batch, &ta.args);
    if (st != FI_OK) fail_msg("%s: naive %s", label, fi_status_name(st));
    fi_plan *plan = NULL;
    assert_int_equal(fi_plan_create(caps, NULL, 0, NULL, &plan), FI_OK);
    st = fi_plan_update(plan, &s->batch, NULL);
    if (st != FI_OK) fail_msg("%s: update %s", label, fi_status_name(st));
    st = fi_ref_run(plan, &ref_args);
    if (st != FI_OK) fail_msg("%s: ref_run %s", label, fi_status_name(st));
    fi_plan_view v;
    assert_int_equal(fi_plan_get_view(plan, &v), FI_OK);
    *split += v.header->num_groups > 0;

    if (tt_tensor_count_nonfinite(&ta.args.out, rows) || tt_tensor_count_nonfinite(&ref_out, rows))
        fail_msg("%s: out not fully written", label);
    if (tt_tensor_count_nan(&ta.args.lse, rows) || tt_tensor_count_nan(&ref_lse, rows))
        fail_msg("%s: lse not fully written", label);
    double err = 0.0;
    if (tt_tensor_compare(&ref_out, &ta.args.out, rows, &err) != 0 || !(err <= 1e-5))
        fail_msg("%s: out rel err %.3g (groups %d)", label, err, v.header->num_groups);
    if (tt_tensor_compare(&ref_lse, &ta.args.lse, rows, &err) != 0 || !(err <= 1e-5))
        fail_msg("%s: lse rel err %.3g", label, err);
    /* rows without a valid slot: zeros, lse -inf (or the sink alone) */
    const int32_t K = caps->sparse_top_k;
    for (int64_t r = 0; r < rows; r++) {
        int any = 0;
        for (int32_t t = 0; t < K; t++) any |= s->table[r * K + t] >= 0;
        if (any) continue;
        for (int64_t h = 0; h < caps->num_qo_heads; h++) {
            const int64_t li[2] = {r, h};
            const double l = tt_tensor_get(&ref_lse, li);
            if (ta.sinks) assert_float_equal(l, ta.sinks[h], 1e-6);
            else assert_true(isinf(l) && l < 0);
            for (int64_t d = 0; d < 512; d += 37) {
                const int64_t oi[3] = {r, h, d};
                assert_true(tt_tensor_get(&ref_out, oi) == 0.0);
                assert_true(tt_tensor_get(&ta.args.out, oi) == 0.0);
            }
        }
    }
    fi_plan_destroy(plan);
    tt_test_attn_args_free(&ref_args);
    tt_test_attn_free(&ta);
}

static void ref_matches_naive_on_sparse_batches(void **state) {
    (void)state;
    static const int32_t page_sizes[3] = {1, 16, 64};
    static const int32_t ctas[3] = {1, 7, 132};
    int split = 0;
    char label[200];
    for (int it = 0; it < 12; it++) {
        const int32_t B = tt_rng_int(&g_rng, 1, 3), q = tt_rng_int(&g_rng, 1, 4);
        /* every fourth case long enough to be cut on 132 CTAs: a tile below 2 floors + 2 KV tiles
         * (2 x 128 + 2 x 64 = 384 tokens) is never cut (planner/partition.c) */
        const int32_t K = it % 4 == 3 ? tt_rng_int(&g_rng, 400, 640) : tt_rng_int(&g_rng, 1, 160);
        const int32_t ps = page_sizes[it % 3], pages = tt_rng_int(&g_rng, 1, 24);
        fi_caps c = sparse_caps(16, ps, pages, B, B * q, K, it % 4 == 3 ? 132 : ctas[(it / 3) % 3]);
        /* few slots: duplicates; one row all -1 in most cases */
        sparse_batch s = sparse_make(B, q, K, (int64_t)pages * ps, tt_rng_int(&g_rng, 0, 50),
                                     it % 3 ? tt_rng_int(&g_rng, 0, B * q - 1) : -1);
        fi_test_attn_opts opts = {.sinks = it % 2, .scale_ptrs = it % 4 == 1,
                                  .bmm1_scale = 0.05f, .bmm2_scale = 1.5f};
        snprintf(label, sizeof label, "seed %llu iter %d: B %d q %d K %d ps %d pages %d ctas %d",
                 (unsigned long long)g_seed, it, B, q, K, ps, pages, c.num_ctas);
        check_sparse_case(label, &c, &s, &opts, it % 2, &split);
        sparse_free(&s);
    }
    assert_true(split > 0); /* the merge was exercised */
}

/* ---- sparse == dense over the same keys ----------------------------------------------------------- */

/* Dense batch: B requests of q_len Q (non-causal: every row sees all of its request's keys),
 * kv_len L_b, random pages with repeats (repeated keys).  Sparse batch over the same q and
 * cache: row (b, i) lists exactly request b's key slots in order, -1 padding spread
 * anywhere between them.  fi_ref_run of both plans must agree (fp32, different blocks and
 * splits: 1e-5), and the naive references (fp64) to 1e-12. */
static void sparse_equals_dense_over_the_same_keys(void **state) {
    (void)state;
    static const int32_t page_sizes[3] = {1, 16, 64};
    for (int it = 0; it < 6; it++) {
        const int32_t B = tt_rng_int(&g_rng, 1, 3), Q = tt_rng_int(&g_rng, 1, 4);
        const int32_t ps = page_sizes[it % 3], pages = tt_rng_int(&g_rng, 2, 16);
        int32_t L[3], maxL = 0;
        for (int32_t b = 0; b < B; b++) {
            L[b] = tt_rng_int(&g_rng, 1, it == 5 ? 500 : 150);
            maxL = L[b] > maxL ? L[b] : maxL;
        }
        const int32_t P = (maxL + ps - 1) / ps, K = maxL + tt_rng_int(&g_rng, 0, 40);
        int32_t *dense_table = malloc(sizeof(int32_t) * (size_t)(B * P));
        int32_t seq[3];
        assert_non_null(dense_table);
        for (int32_t e = 0; e < B * P; e++) dense_table[e] = tt_rng_int(&g_rng, 0, pages - 1);
        for (int32_t b = 0; b < B; b++) seq[b] = L[b];
        fi_batch dense = {.form = FI_FORM_BLOCK_TABLES, .batch_size = B,
                          .block_tables = dense_table, .max_pages_per_seq = P, .seq_lens = seq,
                          .q_len_per_request = Q, .causal = 0, .window_left = -1};
        /* sparse rows: key t of request b at a random increasing position, -1 elsewhere */
        sparse_batch s = sparse_make(B, Q, K, 1, 100, -1); /* all -1 */
        for (int32_t b = 0; b < B; b++)
            for (int32_t i = 0; i < Q; i++) {
                int32_t *row = s.table + ((int64_t)b * Q + i) * K;
                int32_t gaps = K - L[b], at = 0;
                for (int32_t t = 0; t < L[b]; t++) {
                    const int32_t skip = gaps > 0 ? tt_rng_int(&g_rng, 0, gaps < 3 ? gaps : 3) : 0;
                    at += skip;
                    gaps -= skip;
                    row[at++] = dense_table[b * P + t / ps] * ps + t % ps;
                }
            }
        fi_caps dc = sparse_caps(16, ps, pages, B, B * Q, 0, tt_rng_int(&g_rng, 1, 40));
        fi_caps sc = dc;
        sc.sparse_top_k = K;
        fi_test_attn_opts opts = {.sinks = it % 2, .bmm1_scale = 0.05f};
        tt_test_attn ta;
        assert_int_equal(tt_test_attn_make(&ta, &dc, &dense, &opts, &g_rng), 0);
        fi_tensor o[4], l[4]; /* dense ref, sparse ref, dense naive, sparse naive */
        fi_attn_args a[4];
        for (int k = 0; k < 4; k++) {
            assert_int_equal(tt_test_attn_args_fork(&ta, &a[k]), 0);
            o[k] = a[k].out;
            l[k] = a[k].lse;
            if (k % 2) a[k].page_table = table_view(&s, k == 1);
        }
        fi_plan *pd = NULL, *pz = NULL;
        assert_int_equal(fi_plan_create(&dc, NULL, 0, NULL, &pd), FI_OK);
        assert_int_equal(fi_plan_create(&sc, NULL, 0, NULL, &pz), FI_OK);
        assert_int_equal(fi_plan_update(pd, &dense, NULL), FI_OK);
        assert_int_equal(fi_plan_update(pz, &s.batch, NULL), FI_OK);
        assert_int_equal(fi_ref_run(pd, &a[0]), FI_OK);
        assert_int_equal(fi_ref_run(pz, &a[1]), FI_OK);
        assert_int_equal(fi_naive_attention(&dc, &dense, &a[2]), FI_OK);
        assert_int_equal(fi_naive_attention(&sc, &s.batch, &a[3]), FI_OK);
        const int64_t rows = (int64_t)B * Q;
        double err = 0.0;
        for (int k = 0; k < 4; k++) assert_int_equal(tt_tensor_count_nonfinite(&o[k], rows), 0);
        if (tt_tensor_compare(&o[1], &o[0], rows, &err) != 0 || !(err <= 1e-5))
            fail_msg("seed %llu iter %d: sparse ref vs dense ref out %.3g", (unsigned long long)g_seed,
                     it, err);
        if (tt_tensor_compare(&l[1], &l[0], rows, &err) != 0 || !(err <= 1e-5))
            fail_msg("seed %llu iter %d: lse %.3g", (unsigned long long)g_seed, it, err);
        if (tt_tensor_compare(&o[3], &o[2], rows, &err) != 0 || !(err <= 1e-12))
            fail_msg("seed %llu iter %d: sparse naive vs dense naive out %.3g",
                     (unsigned long long)g_seed, it, err);
        if (tt_tensor_compare(&l[3], &l[2], rows, &err) != 0 || !(err <= 1e-12))
            fail_msg("seed %llu iter %d: naive lse %.3g", (unsigned long long)g_seed, it, err);
        for (int k = 0; k < 4; k++) tt_test_attn_args_free(&a[k]);
        fi_plan_destroy(pd);
        fi_plan_destroy(pz);
        tt_test_attn_free(&ta);
        sparse_free(&s);
        free(dense_table);
    }
}

/* ---- the page-table tensor -------------------------------------------------------------------- */

static void sparse_page_table_shapes(void **state) {
    (void)state;
    const int32_t B = 3, Q = 2, K = 24;
    fi_caps c = sparse_caps(16, 16, 8, B, B * Q, K, 4);
    sparse_batch s = sparse_make(B, Q, K, 8 * 16, 10, -1);
    tt_test_attn ta;
    assert_int_equal(tt_test_attn_make(&ta, &c, &s.batch, NULL, &g_rng), 0);
    fi_plan *p = NULL;
    assert_int_equal(fi_plan_create(&c, NULL, 0, NULL, &p), FI_OK);
    assert_int_equal(fi_plan_update(p, &s.batch, NULL), FI_OK);
    fi_attn_args a = ta.args;
    a.page_table = table_view(&s, 1);
    assert_int_equal(fi_ref_run(p, &a), FI_OK);
    assert_int_equal(fi_naive_attention(&c, &s.batch, &a), FI_OK);
    a.page_table = table_view(&s, 0);
    assert_int_equal(fi_ref_run(p, &a), FI_OK);
    assert_int_equal(fi_naive_attention(&c, &s.batch, &a), FI_OK);
    /* the dense [B, K] shape holds B rows, not B x q_len */
    const int64_t shape2[2] = {B, K}, stride2[2] = {K, 1};
    a.page_table = fi_tensor_make(s.table, FI_DTYPE_I32, 2, shape2, stride2);
    assert_int_equal(fi_ref_run(p, &a), FI_ERR_SHAPE_MISMATCH);
    assert_int_equal(fi_naive_attention(&c, &s.batch, &a), FI_ERR_SHAPE_MISMATCH);
    /* [B, q_len + 1, K]: the middle axis must be q_len; [B, q_len, K - 1]: too narrow */
    int64_t shape3[3] = {B, Q + 1, K}, stride3[3] = {(int64_t)(Q + 1) * K, K, 1};
    a.page_table = fi_tensor_make(s.table, FI_DTYPE_I32, 3, shape3, stride3);
    assert_int_equal(fi_ref_run(p, &a), FI_ERR_SHAPE_MISMATCH);
    shape3[1] = Q;
    shape3[2] = K - 1;
    stride3[0] = (int64_t)Q * K;
    a.page_table = fi_tensor_make(s.table, FI_DTYPE_I32, 3, shape3, stride3);
    assert_int_equal(fi_ref_run(p, &a), FI_ERR_SHAPE_MISMATCH);
    /* strides other than the rows the plan assumed */
    shape3[2] = K;
    stride3[1] = K + 1;
    a.page_table = fi_tensor_make(s.table, FI_DTYPE_I32, 3, shape3, stride3);
    assert_int_equal(fi_ref_run(p, &a), FI_ERR_BAD_STRIDE);
    stride3[1] = K;
    stride3[0] = (int64_t)Q * K + 1;
    a.page_table = fi_tensor_make(s.table, FI_DTYPE_I32, 3, shape3, stride3);
    assert_int_equal(fi_ref_run(p, &a), FI_ERR_BAD_STRIDE);
    fi_plan_destroy(p);
    tt_test_attn_free(&ta);
    sparse_free(&s);
}

int main(void) {
    g_seed = tt_test_seed();
    g_rng.s = g_seed;
    printf("test_sparse seed %llu (FI_TEST_SEED to replay)\n", (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(caps_sparse_rules),
        cmocka_unit_test(workspace_holds_a_request_per_query_token),
        cmocka_unit_test(sparse_batch_scalar_rules),
        cmocka_unit_test(sparse_batch_request_rules),
        cmocka_unit_test(sparse_table_size_counts_query_tokens),
        cmocka_unit_test(device_planning_refuses_sparse_plans),
        cmocka_unit_test(sparse_batches_are_covered),
        cmocka_unit_test(ref_matches_naive_on_sparse_batches),
        cmocka_unit_test(sparse_equals_dense_over_the_same_keys),
        cmocka_unit_test(sparse_page_table_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
