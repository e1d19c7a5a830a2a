/*
 * tests/fuzz/fuzz_plan_update.c - libFuzzer harness over batch validation and
 * fi_plan_update on host-only plans (fi_plan_create with workspace NULL, 0 bytes).
 *
 * The input is read as a stream of decisions (tt_fz below; an exhausted input reads 0,
 * which gives the smallest valid choice): caps of all three kinds, mostly from the
 * supported sets of fiattn.h and now and then outside them; then up to four batches on
 * the same plan, in any of the three forms, the first one valid by construction and the
 * others with 0..3 mutations each (sizes over caps, bad scalars, negative or inconsistent
 * lengths, non-monotone indptr / cum_seq_lens, page ids out of range, too few pages, a
 * NULL array).  Every array is allocated to exactly the length the batch declares, so
 * AddressSanitizer reports any read the API contract does not allow.
 *
 * In-set caps use another row of the kind's tile table (caps.variant: 32-row tiles, the
 * data-parallel partition of the device planner's rows, the context walk) in about 1 of 4
 * inputs.  Caps outside the sets include each FI_LIMIT_* exceeded, a variant naming no row
 * (FI_ERR_UNSUPPORTED_VARIANT) and NVFP4 KV for MLA decode (GQA decode and context take it);
 * batch mutations include cum_seq_lens for a decode kind and a row length
 * making B x P overflow int32 (with the table far shorter than declared).
 * Sparse top-k (fiattn.h fi_caps.sparse_top_k, docs/DESIGN.md 3a): MLA decode caps get
 * K = 1..64 (sometimes 0, dense) in about 4 of 10 inputs; out of the set, K < 0 or
 * > FI_LIMIT_SPARSE_TOP_K (FI_ERR_INVALID_CAPS) or K > 0 on another kind
 * (FI_ERR_SPARSE_UNSUPPORTED), each required of create when it is the only member out.
 * A sparse plan's batches come from fuzz_sparse_batch: BLOCK_TABLES, [B, q_len, K] slots
 * in [-1, num_pages x page_size) with padding, q_len 1..8, B x q_len <= max_q_tokens,
 * seq_lens >= 0, causal 0 / 1; mutated with a row length != K, a 3-D table, a window, the
 * INDPTR or another form, a slot past the cache, a negative seq_len, q_len 0 / 9 /
 * negative, q tokens or requests over the caps, bad causal or a NULL array.
 * Invariants (a violation aborts, which libFuzzer reports as a crash):
 *   - create with in-set caps succeeds; a failed create leaves *plan untouched;
 *   - a valid batch (of a form its kind takes) is accepted;
 *   - a rejected batch leaves the plan byte-identical (tt_plan_snapshot: view, header,
 *     work_indptr, cta_starts, items, groups, requests, balance) and fi_plan_error()
 *     reports the returned status, with a request of the batch or -1 (always -1 for the
 *     batch-wide rules), and validation never answers FI_ERR_INVALID_ARGUMENT;
 *   - an accepted batch is valid by fiattn.h's rules (checked here from the arrays), its
 *     error detail is clean, and its plan passes tt_plan_check: every (request, query
 *     head, query row, visible key) exactly once, within the workspace bounds;
 *   - the device planner's unchecked build (check_unchecked_build), on the data-parallel
 *     rows and every batch whose scalars pass: within its arrays whatever the lengths, and
 *     on a batch that passes validation the checked build's status and bytes; on a planned
 *     batch, every CTA's share of the partition (planner/pslice.h) the same bytes too
 *     (check_slices);
 *   - sparse: the oracle (sparse_batch_breaks) has every rule, so a batch is accepted if
 *     and only if it is valid, mutated or not; the plan is checked as the dense batch of
 *     B x q_len one-token requests of kv_len K (tt_plan_expect_sparse): every (query
 *     token, head, key slot index in [0, K)) exactly once; the sparse statuses are
 *     batch-wide (request -1).
 * Build and run: make fuzz FUZZ_SECONDS=N (tests/fuzz/README.md).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/plan_check.h"
#include "common/rng.h"
#include "fiattn.h"
#include "plan/plan.h"
#include "plan/variant.h"
#include "planner/build.h"
#include "planner/caps_internal.h"
#include "planner/partition.h"
#include "planner/pslice.h"
#include "planner/scratch.h"
#include "planner/tiles.h"
#include "planner/validate.h"

/* ---- input stream ------------------------------------------------------------------- */
typedef struct tt_fz {
    const uint8_t *p;
    size_t n;
} tt_fz;

static uint32_t tt_fz_u32(tt_fz *f, int bytes) {
    uint32_t v = 0;
    for (int i = 0; i < bytes; i++) {
        v = v << 8 | (f->n ? *f->p : 0);
        if (f->n) {
            f->p++;
            f->n--;
        }
    }
    return v;
}
/* uniform-ish integer in [lo, hi] from one or two bytes */
static int32_t tt_fz_int(tt_fz *f, int32_t lo, int32_t hi) {
    if (hi <= lo)
        return lo;
    const uint64_t span = (uint64_t)((int64_t)hi - lo) + 1; /* up to 2^32 */
    return (int32_t)(lo + (int64_t)(tt_fz_u32(f, span > 256 ? 2 : 1) % span));
}
/* 1 with probability about n / 256 */
static int tt_fz_chance(tt_fz *f, int n) { return (int)tt_fz_u32(f, 1) >= 256 - n; }

#define TT_FZ_REQUIRE(cond, ...)                                                          \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "fuzz_plan_update: invariant failed: " __VA_ARGS__);          \
            fputc('\n', stderr);                                                          \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

/* ---- caps ---------------------------------------------------------------------------- */
static const int32_t k_pages[] = {16, 32, 64, 128, 1}; /* 0 bytes pick 16 */
static const int32_t k_dims[] = {64, 128, 256};

/* The tile table rows of a kind (executor/core/registry.c: variants 0 .. n - 1), counted
 * once by asking fi_caps_validate of caps that are valid but for the variant. */
static int32_t variant_rows(fi_kind kind) {
    static int32_t rows[3];
    const int i = (int)kind - (int)FI_KIND_MLA_DECODE;
    if (rows[i] == 0) {
        fi_caps c;
        memset(&c, 0, sizeof c);
        c.kind = kind;
        c.max_batch = c.max_q_tokens = c.num_pages = c.num_ctas = 1;
        c.page_size = 16;
        c.num_qo_heads = kind == FI_KIND_MLA_DECODE ? 16 : 1;
        c.num_kv_heads = 1;
        c.head_dim_qk = kind == FI_KIND_MLA_DECODE ? 576 : 128;
        c.head_dim_vo = kind == FI_KIND_MLA_DECODE ? 512 : 128;
        c.q_dtype = c.kv_dtype = c.o_dtype = FI_DTYPE_BF16;
        while (c.variant < 64 && fi_caps_validate(&c) == FI_OK)
            c.variant++;
        rows[i] = c.variant;
    }
    return rows[i];
}

/* Caps from the input; *in_set: every member chosen from the supported sets; *want: the
 * status fi_plan_create must return where the input knows it (FI_OK in the sets, a sparse
 * member alone out of its set), else -1. */
static fi_caps fuzz_caps(tt_fz *f, int *in_set, int *want) {
    fi_caps c;
    memset(&c, 0, sizeof c);
    *in_set = 1;
    *want = -1;
    const int k = tt_fz_int(f, 0, 15);
    c.kind = k < 5 ? FI_KIND_MLA_DECODE : k < 10 ? FI_KIND_GQA_DECODE : FI_KIND_CONTEXT;
    if (k == 15) {
        c.kind = (fi_kind)tt_fz_int(f, -1, 5);
        *in_set = c.kind >= FI_KIND_MLA_DECODE && c.kind <= FI_KIND_CONTEXT;
    }
    if (c.kind == FI_KIND_MLA_DECODE) {
        c.num_qo_heads = 16 << tt_fz_int(f, 0, 3);
        c.num_kv_heads = 1;
        c.head_dim_qk = 576;
        c.head_dim_vo = 512;
    } else {
        c.num_kv_heads = tt_fz_int(f, 1, 8);
        c.num_qo_heads = c.num_kv_heads * tt_fz_int(f, 1, 16);
        c.head_dim_qk = c.head_dim_vo = k_dims[tt_fz_int(f, 0, 2)];
    }
    c.page_size = k_pages[tt_fz_int(f, 0, 4)];
    static const fi_dtype k_in[] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16, FI_DTYPE_E4M3,
                                    FI_DTYPE_E5M2, FI_DTYPE_E2M1};
    c.q_dtype = k_in[tt_fz_int(f, 0, 4)];
    /* NVFP4 KV: GQA decode only (fiattn.h) */
    c.kv_dtype = k_in[tt_fz_int(f, 0, c.kind == FI_KIND_GQA_DECODE ? 5 : 4)];
    c.o_dtype = (fi_dtype)tt_fz_int(f, FI_DTYPE_F32, FI_DTYPE_BF16);
    c.num_ctas = tt_fz_int(f, 1, 200);
    c.max_batch = tt_fz_int(f, 1, 64);
    c.max_q_tokens = tt_fz_int(f, 1, c.kind == FI_KIND_CONTEXT ? 1024 : 512);
    c.num_pages = tt_fz_int(f, 1, 4096);
    /* sparse top-k (MLA decode): K small, sometimes 0 (dense); the request table then holds
     * max(max_batch, max_q_tokens) <= 512 entries, within the plan bound */
    if (c.kind == FI_KIND_MLA_DECODE && tt_fz_chance(f, 112))
        c.sparse_top_k = tt_fz_chance(f, 24) ? 0 : tt_fz_int(f, 1, 64);
    /* Now and then another row of the kind's tile table (tile shape, the data-parallel
     * partition of the device planner's rows, the context walk). */
    if (*in_set && tt_fz_chance(f, 64))
        c.variant = tt_fz_int(f, 1, variant_rows(c.kind) - 1);
    const int kind_ok = *in_set; /* the kind in its set: a sparse status is then known */
    if (tt_fz_chance(f, 16)) { /* one member outside its supported set */
        *in_set = 0;
        switch (tt_fz_int(f, 0, 17)) {
        case 0: c.num_qo_heads = tt_fz_int(f, -2, 300); break;
        case 1: c.num_kv_heads = tt_fz_int(f, -2, 40); break;
        case 2: c.head_dim_qk = tt_fz_int(f, -1, 600); break;
        case 3: c.head_dim_vo = tt_fz_int(f, -1, 600); break;
        case 4: c.page_size = tt_fz_int(f, -1, 300); break;
        case 5: c.q_dtype = (fi_dtype)tt_fz_int(f, -1, 8); break;
        case 6: c.o_dtype = (fi_dtype)tt_fz_int(f, -1, 8); break;
        case 7: c.max_batch = -tt_fz_int(f, 0, 3); break;
        case 8: c.num_pages = -tt_fz_int(f, 0, 3); break;
        /* past the documented limits: refused before any allocation */
        case 10: c.max_batch = FI_LIMIT_MAX_BATCH + tt_fz_int(f, 1, INT32_MAX - FI_LIMIT_MAX_BATCH); break;
        case 11: c.max_q_tokens = FI_LIMIT_MAX_Q_TOKENS + tt_fz_int(f, 1, INT32_MAX - FI_LIMIT_MAX_Q_TOKENS); break;
        case 12: c.num_pages = FI_LIMIT_NUM_PAGES + tt_fz_int(f, 1, INT32_MAX - FI_LIMIT_NUM_PAGES); break;
        case 13: c.num_ctas = FI_LIMIT_NUM_CTAS + tt_fz_int(f, 1, INT32_MAX - FI_LIMIT_NUM_CTAS); break;
        case 14: c.kv_dtype = FI_DTYPE_E2M1; *in_set = c.kind == FI_KIND_GQA_DECODE || c.kind == FI_KIND_CONTEXT; break;
        /* sparse_top_k out of range, or K > 0 on a kind without sparse top-k */
        case 15:
            c.sparse_top_k = tt_fz_chance(f, 32) ? INT32_MIN : -tt_fz_int(f, 1, 3);
            *want = kind_ok ? FI_ERR_INVALID_CAPS : -1;
            break;
        case 16:
            c.sparse_top_k = FI_LIMIT_SPARSE_TOP_K + tt_fz_int(f, 1, INT32_MAX - FI_LIMIT_SPARSE_TOP_K);
            *want = kind_ok ? FI_ERR_INVALID_CAPS : -1;
            break;
        case 17:
            c.sparse_top_k = tt_fz_int(f, 1, 64);
            *in_set = c.kind == FI_KIND_MLA_DECODE;
            *want = kind_ok && !*in_set ? FI_ERR_SPARSE_UNSUPPORTED : -1;
            break;
        default: /* no row of the kind's tile table */
            c.variant = !kind_ok || tt_fz_chance(f, 128)
                            ? -tt_fz_int(f, 1, 3)
                            : variant_rows(c.kind) + tt_fz_int(f, 0, 3);
            *want = kind_ok ? FI_ERR_UNSUPPORTED_VARIANT : -1;
            break;
        }
    }
    if (*in_set)
        *want = FI_OK;
    return c;
}

/* ---- batches ------------------------------------------------------------------------- */
typedef struct fz_batch {
    fi_batch b;
    int32_t *q_len, *kv, *seq, *qi, *ki, *kvl, *table;
    int64_t table_len; /* elements allocated for block_tables / kv_indices */
} fz_batch;

static void fz_batch_free(fz_batch *z) {
    free(z->q_len);
    free(z->kv);
    free(z->seq);
    free(z->qi);
    free(z->ki);
    free(z->kvl);
    free(z->table);
    memset(z, 0, sizeof *z);
}

static int32_t *alloc32(int64_t n) {
    int32_t *p = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 0) + (n > 0 ? 0 : 1));
    if (!p)
        abort();
    return p;
}

enum {
    MUT_BATCH_OVER, MUT_BATCH_NEG, MUT_WINDOW, MUT_CAUSAL, MUT_PAGES_DECL, MUT_SPLIT,
    MUT_Q_UNIFORM, MUT_KV_LEN, MUT_PAGE_ID, MUT_INDPTR, MUT_INDPTR0, MUT_SEQ_MISMATCH,
    MUT_FORM, MUT_NULL, MUT_Q_LONG, MUT_FORM_KIND, MUT_TABLE_HUGE, MUT_COUNT
};

/* mut[0..count): 1 for each of `mutate` edits chosen by the input (repeats merge). */
static void pick_mutations(tt_fz *f, int *mut, int count, int mutate) {
    memset(mut, 0, sizeof(int) * (size_t)count);
    for (int i = 0; i < mutate; i++)
        mut[tt_fz_int(f, 0, count - 1)] = 1;
}

/* Page ids of a row: used entries in [0, num_pages) (rng), unused ones -1 or anything. */
static void fill_row(tt_rng *r, int32_t *row, int64_t len, int64_t used, int32_t num_pages) {
    const int32_t unused = (tt_rng_next(r) & 1) ? -1 : INT32_MAX;
    const uint64_t n = (uint64_t)(num_pages > 0 ? num_pages : 1);
    for (int64_t i = 0; i < len; i++)
        row[i] = i < used ? (int32_t)(tt_rng_next(r) % n) : unused;
}

static int32_t pages_for(int32_t kv, int32_t page_size) {
    return page_size > 0 ? (int32_t)(((int64_t)kv + page_size - 1) / page_size) : kv;
}

/* A batch of caps' kind from the input; mutate: how many rule-breaking edits to make. */
static void fuzz_batch(tt_fz *f, const fi_caps *c, int mutate, fz_batch *z) {
    memset(z, 0, sizeof *z);
    fi_batch *b = &z->b;
    int mut[MUT_COUNT];
    pick_mutations(f, mut, MUT_COUNT, mutate);
    const int decode = c->kind != FI_KIND_CONTEXT;
    const int32_t ps = c->page_size;
    /* a form the kind takes (cum_seq_lens: context only), or, mutated, one it refuses */
    b->form = (fi_batch_form)tt_fz_int(f, FI_FORM_BLOCK_TABLES,
                                       decode ? FI_FORM_INDPTR : FI_FORM_CUM_SEQ_LENS);
    if (mut[MUT_FORM_KIND] && decode)
        b->form = FI_FORM_CUM_SEQ_LENS;
    b->causal = decode ? 1 : tt_fz_int(f, 0, 1);
    b->window_left = tt_fz_chance(f, 64) ? tt_fz_int(f, 0, 600) : -1;
    b->kv_split_pages = b->form != FI_FORM_INDPTR && tt_fz_chance(f, 64);
    const int32_t uq = decode ? tt_fz_int(f, 1, 8) : tt_fz_int(f, 0, 64); /* BLOCK_TABLES */
    const int32_t max_kv = tt_fz_chance(f, 8) ? 70000 : tt_fz_chance(f, 64) ? 4096 : 600;
    /* Requests: stop before the q tokens or the batch go over the caps (long requests
     * only in small batches: the tables stay small, the runs fast). */
    int32_t B = tt_fz_int(f, 0, c->max_batch > 0 ? c->max_batch : 0);
    if (max_kv > 600 && B > (max_kv > 4096 ? 4 : 16))
        B = max_kv > 4096 ? 4 : 16;
    if (mut[MUT_BATCH_OVER])
        B = c->max_batch + tt_fz_int(f, 1, 3);
    if (B > 300)
        B = 300;
    z->q_len = alloc32(B);
    z->kv = alloc32(B);
    int64_t total_q = 0;
    int32_t n = 0;
    for (; n < B; n++) {
        int32_t kv = tt_fz_chance(f, 24) ? 0 : tt_fz_int(f, 0, max_kv);
        int32_t q = b->form == FI_FORM_BLOCK_TABLES ? uq
                    : decode ? tt_fz_int(f, 1, 8) : tt_fz_int(f, 0, kv < 64 ? kv : 64);
        if (b->causal && kv > 0 && q > kv)
            kv = q;
        if (total_q + q > c->max_q_tokens && !mut[MUT_BATCH_OVER])
            break;
        total_q += q;
        z->q_len[n] = q;
        z->kv[n] = kv;
    }
    B = n;
    if (mut[MUT_KV_LEN] && B > 0) { /* a negative length, or more keys than pages */
        const int32_t at = tt_fz_int(f, 0, B - 1);
        z->kv[at] = tt_fz_chance(f, 128) ? -tt_fz_int(f, 1, 1000) : z->kv[at] + tt_fz_int(f, 1, 300);
    }
    if (mut[MUT_Q_LONG] && B > 0) /* q_len past the kind's range or past kv_len */
        z->q_len[tt_fz_int(f, 0, B - 1)] = decode ? tt_fz_int(f, 9, 12) : max_kv + 1;
    b->batch_size = mut[MUT_BATCH_NEG] ? -tt_fz_int(f, 1, 3) : B;
    tt_rng r = {tt_fz_u32(f, 2)};

    /* Pages each request's row holds: what it needs, sometimes a spare one. */
    int32_t P = 0;
    for (int32_t i = 0; i < B; i++) {
        const int32_t need = pages_for(z->kv[i] > 0 ? z->kv[i] : 0, ps);
        if (need > P)
            P = need;
    }
    P += tt_fz_int(f, 0, 1);
    if (mut[MUT_PAGES_DECL])
        P = tt_fz_chance(f, 128) ? -tt_fz_int(f, 1, 3) : P / 2;
    const int split = b->kv_split_pages == 1;
    if (b->form == FI_FORM_INDPTR) {
        z->qi = alloc32(B + 1);
        z->ki = alloc32(B + 1);
        z->kvl = alloc32(B);
        z->qi[0] = z->ki[0] = 0;
        for (int32_t i = 0; i < B; i++) {
            z->qi[i + 1] = z->qi[i] + z->q_len[i];
            z->ki[i + 1] = z->ki[i] + pages_for(z->kv[i] > 0 ? z->kv[i] : 0, ps) +
                           (mut[MUT_PAGES_DECL] ? -1 : tt_fz_int(f, 0, 1));
            if (z->ki[i + 1] < z->ki[i] && !mut[MUT_PAGES_DECL])
                z->ki[i + 1] = z->ki[i];
            z->kvl[i] = z->kv[i];
        }
        if (mut[MUT_INDPTR] && B > 0) {
            int32_t *a = tt_fz_int(f, 0, 1) ? z->qi : z->ki;
            a[tt_fz_int(f, 1, B)] = tt_fz_int(f, -3, a[B] + 3);
        }
        if (mut[MUT_INDPTR0])
            (tt_fz_int(f, 0, 1) ? z->qi : z->ki)[0] = tt_fz_chance(f, 128) ? -1 : 1;
        /* kv_indices holds exactly kv_indptr[B] entries, the API's contract (ASan sees any
         * read past it: tests/fuzz/crashes/crash-kv-indptr-decreases). */
        const int32_t len = z->ki[B];
        z->table_len = len > 0 ? len : 0;
        z->table = alloc32(z->table_len);
        for (int32_t i = 0; i < B; i++) {
            const int64_t lo = z->ki[i] < 0 ? 0 : z->ki[i];
            int64_t hi = z->ki[i + 1] > z->table_len ? z->table_len : z->ki[i + 1];
            if (hi > lo)
                fill_row(&r, z->table + lo, hi - lo, pages_for(z->kv[i] > 0 ? z->kv[i] : 0, ps),
                         c->num_pages);
        }
        b->qo_indptr = z->qi;
        b->kv_indptr = z->ki;
        b->kv_indices = z->table;
        b->kv_len = z->kvl;
    } else {
        b->max_pages_per_seq = P;
        z->table_len = P > 0 ? (int64_t)B * P * (split ? 2 : 1) : 0;
        z->table = alloc32(z->table_len);
        for (int32_t i = 0; i < B && P > 0; i++)
            for (int s = 0; s <= split; s++)
                fill_row(&r, z->table + ((int64_t)i * (split ? 2 : 1) + s) * P, P,
                         pages_for(z->kv[i] > 0 ? z->kv[i] : 0, ps), c->num_pages);
        b->block_tables = z->table;
        z->seq = alloc32(B);
        for (int32_t i = 0; i < B; i++)
            z->seq[i] = z->kv[i];
        if (b->form == FI_FORM_BLOCK_TABLES) {
            b->seq_lens = z->seq;
            b->q_len_per_request = B > 0 ? z->q_len[0] : uq;
            if (mut[MUT_Q_UNIFORM])
                b->q_len_per_request = tt_fz_int(f, -2, 10);
        } else {
            z->qi = alloc32(B + 1);
            z->ki = alloc32(B + 1);
            z->qi[0] = z->ki[0] = 0;
            for (int32_t i = 0; i < B; i++) {
                z->qi[i + 1] = z->qi[i] + z->q_len[i];
                z->ki[i + 1] = z->ki[i] + z->kv[i];
            }
            if (mut[MUT_INDPTR] && B > 0) {
                int32_t *a = tt_fz_int(f, 0, 1) ? z->qi : z->ki;
                a[tt_fz_int(f, 1, B)] = tt_fz_int(f, -3, a[B] + 3);
            }
            if (mut[MUT_INDPTR0])
                (tt_fz_int(f, 0, 1) ? z->qi : z->ki)[0] = 1;
            if (mut[MUT_SEQ_MISMATCH] && B > 0)
                z->seq[tt_fz_int(f, 0, B - 1)] += tt_fz_int(f, 0, 1) ? 1 : -1;
            b->seq_lens = tt_fz_int(f, 0, 1) || mut[MUT_SEQ_MISMATCH] ? z->seq : NULL;
            b->cum_seq_lens_q = z->qi;
            b->cum_seq_lens_kv = z->ki;
        }
    }
    if (mut[MUT_PAGE_ID] && B > 0) { /* a used page id out of range */
        const int32_t i = tt_fz_int(f, 0, B - 1);
        const int32_t used = pages_for(z->kv[i] > 0 ? z->kv[i] : 0, ps);
        int64_t at = -1;
        if (used > 0 && b->form == FI_FORM_INDPTR && z->ki[i] >= 0 && z->ki[i] < z->table_len)
            at = z->ki[i] + tt_fz_int(f, 0, used - 1);
        else if (used > 0 && b->form != FI_FORM_INDPTR && P > 0)
            at = ((int64_t)i * (split ? 2 : 1) + (split ? tt_fz_int(f, 0, 1) : 0)) * P +
                 tt_fz_int(f, 0, (used < P ? used : P) - 1);
        if (at >= 0 && at < z->table_len)
            z->table[at] = tt_fz_int(f, 0, 1) ? c->num_pages + tt_fz_int(f, 0, 3) : -tt_fz_int(f, 1, 3);
    }
    if (mut[MUT_WINDOW])
        b->window_left = -tt_fz_int(f, 2, 100);
    if (mut[MUT_CAUSAL])
        b->causal = tt_fz_int(f, 0, 1) ? 2 : -1;
    if (mut[MUT_SPLIT])
        b->kv_split_pages = tt_fz_int(f, 0, 1) ? 2 : -1; /* the table stays as allocated */
    if (mut[MUT_FORM])
        b->form = (fi_batch_form)(tt_fz_int(f, 0, 1) ? 0 : 4);
    /* a row length making B x P (x 2) overflow int32: refused before any row is read (the
     * table stays as allocated, far shorter than declared, so only where the product
     * really overflows: B >= 2, or a 3-D table) */
    const int64_t rows = (int64_t)B * (b->kv_split_pages == 1 ? 2 : 1);
    if (mut[MUT_TABLE_HUGE] && b->form != FI_FORM_INDPTR && rows >= 2)
        b->max_pages_per_seq = (int32_t)(INT32_MAX / rows + tt_fz_int(f, 1, 1000)); /* < 2^31 */
    if (mut[MUT_NULL]) {
        switch (tt_fz_int(f, 0, 3)) {
        case 0: b->block_tables = NULL; b->kv_indices = NULL; break;
        case 1: b->seq_lens = NULL; b->kv_len = NULL; break;
        case 2: b->qo_indptr = NULL; b->cum_seq_lens_q = NULL; break;
        default: b->kv_indptr = NULL; b->cum_seq_lens_kv = NULL; break;
        }
    }
}

enum {
    SM_ROW_LEN, SM_SPLIT, SM_WINDOW, SM_INDPTR, SM_SLOT, SM_SEQ_NEG, SM_Q_LEN, SM_Q_TOKENS,
    SM_BATCH_OVER, SM_CAUSAL, SM_NULL, SM_FORM, SM_COUNT
};

/* A sparse batch (caps.sparse_top_k = K > 0, fiattn.h): BLOCK_TABLES, block_tables
 * [B, q_len, K] of flat slots in [-1, num_pages x page_size) (some padding, now and then a
 * row of it or another negative), seq_lens >= 0, q_len 1..8 within the caps; mutate: how
 * many rule-breaking edits (row length != K, a 3-D table, a window, the INDPTR or another
 * form, a slot past the cache, a negative seq_len, q_len 0 / 9 / negative, q tokens or
 * requests over the caps, bad causal, a NULL array).  The table is allocated to exactly
 * the declared B x q_len x row length. */
static void fuzz_sparse_batch(tt_fz *f, const fi_caps *c, int mutate, fz_batch *z) {
    memset(z, 0, sizeof *z);
    fi_batch *b = &z->b;
    int mut[SM_COUNT];
    pick_mutations(f, mut, SM_COUNT, mutate);
    const int32_t K = c->sparse_top_k;
    const int64_t slots = (int64_t)c->num_pages * c->page_size; /* <= 2^19 in the harness */
    int32_t q = tt_fz_int(f, 1, 8);
    if (q > c->max_q_tokens)
        q = c->max_q_tokens;
    const int32_t fit = c->max_q_tokens / q; /* requests whose q tokens fit */
    int32_t B = tt_fz_int(f, 0, c->max_batch < fit ? c->max_batch : fit);
    if (mut[SM_Q_TOKENS]) /* one request more than the q tokens allow, within max_batch */
        B = fit + 1 < c->max_batch ? fit + 1 : c->max_batch;
    if (mut[SM_BATCH_OVER])
        B = c->max_batch + tt_fz_int(f, 1, 3);
    if (mut[SM_Q_LEN]) {
        const int32_t pick = tt_fz_int(f, 0, 7);
        q = pick < 3 ? 0 : pick < 6 ? 9 : pick == 6 ? tt_fz_int(f, 10, 12) : -tt_fz_int(f, 1, 3);
    }
    int32_t P = K;
    if (mut[SM_ROW_LEN]) {
        const int32_t pick = tt_fz_int(f, 0, 3);
        P = pick == 0 ? 0 : pick == 1 ? 2 * K : K + (tt_fz_int(f, 0, 1) ? 1 : -1) * tt_fz_int(f, 1, 3);
        if (P == K)
            P = K + 1;
    }
    z->table_len = B > 0 && q > 0 && P > 0 ? (int64_t)B * q * P : 0;
    z->table = alloc32(z->table_len);
    tt_rng r = {tt_fz_u32(f, 2)};
    const int32_t pad_pct = tt_fz_int(f, 0, 100);
    const int32_t pad = tt_fz_chance(f, 16) ? (tt_fz_int(f, 0, 1) ? INT32_MIN : -2) : -1;
    for (int64_t e = 0; e < z->table_len; e++)
        z->table[e] = (int32_t)(tt_rng_next(&r) % 100) < pad_pct
                          ? pad
                          : (int32_t)(tt_rng_next(&r) % (uint64_t)slots);
    if (z->table_len > 0 && tt_fz_chance(f, 32)) { /* a query token without any key */
        const int64_t row = tt_fz_int(f, 0, (int32_t)(z->table_len / P - 1));
        for (int32_t t = 0; t < P; t++)
            z->table[row * P + t] = -1;
    }
    z->seq = alloc32(B);
    for (int32_t i = 0; i < B; i++) /* they select no key: any value >= 0 */
        z->seq[i] = tt_fz_chance(f, 24) ? 0 : (int32_t)(tt_rng_next(&r) % 100001);
    b->form = FI_FORM_BLOCK_TABLES;
    b->batch_size = B;
    b->block_tables = z->table;
    b->max_pages_per_seq = P;
    b->kv_split_pages = 0;
    b->seq_lens = z->seq;
    b->q_len_per_request = q;
    b->causal = tt_fz_int(f, 0, 1); /* no effect on a sparse batch */
    b->window_left = -1;
    if (mut[SM_SLOT] && z->table_len > 0) { /* a slot past the cache */
        const int64_t at = (int64_t)(tt_rng_next(&r) % (uint64_t)z->table_len);
        z->table[at] = tt_fz_chance(f, 32) ? INT32_MAX : (int32_t)(slots + tt_fz_int(f, 0, 3));
    }
    if (mut[SM_SEQ_NEG] && B > 0)
        z->seq[tt_fz_int(f, 0, B - 1)] = tt_fz_chance(f, 32) ? INT32_MIN : -tt_fz_int(f, 1, 1000);
    if (mut[SM_SPLIT]) /* a 3-D table (the table stays as allocated), or not 0 / 1 */
        b->kv_split_pages = tt_fz_int(f, 0, 3) ? 1 : tt_fz_int(f, 0, 1) ? 2 : -1;
    if (mut[SM_WINDOW]) /* any window (< -1: the dense rule's status) */
        b->window_left = tt_fz_chance(f, 32) ? -tt_fz_int(f, 2, 100) : tt_fz_int(f, 0, 600);
    if (mut[SM_INDPTR]) /* the other decode form: refused before its arrays are looked at */
        b->form = FI_FORM_INDPTR;
    if (mut[SM_FORM])
        b->form = (fi_batch_form)(tt_fz_int(f, 0, 2) == 0 ? FI_FORM_CUM_SEQ_LENS
                                  : tt_fz_int(f, 0, 1) ? 0 : 4);
    if (mut[SM_CAUSAL])
        b->causal = tt_fz_int(f, 0, 1) ? 2 : -1;
    if (mut[SM_NULL]) {
        if (tt_fz_int(f, 0, 1))
            b->block_tables = NULL;
        else
            b->seq_lens = NULL;
    }
}

/* fiattn.h's rules for a sparse plan (caps.sparse_top_k = K > 0), in full: valid <=> NULL.
 * Reads only what the harness allocated.  @return NULL or the broken rule. */
static const char *sparse_batch_breaks(const fi_caps *c, const fz_batch *z) {
    const fi_batch *b = &z->b;
    const int32_t K = c->sparse_top_k;
    if (b->form < FI_FORM_BLOCK_TABLES || b->form > FI_FORM_CUM_SEQ_LENS) return "form";
    if (b->form == FI_FORM_CUM_SEQ_LENS && c->kind != FI_KIND_CONTEXT) return "form of the kind";
    if (b->form != FI_FORM_BLOCK_TABLES) return "sparse: form not BLOCK_TABLES";
    if (b->batch_size < 0 || b->batch_size > c->max_batch) return "batch_size";
    if (b->causal != 0 && b->causal != 1) return "causal";
    if (b->window_left != -1) return "sparse: window_left";
    if (!b->block_tables || !b->seq_lens) return "NULL array";
    if (b->max_pages_per_seq < 0) return "max_pages_per_seq";
    if (b->kv_split_pages != 0) return "sparse: kv_split_pages";
    if (b->max_pages_per_seq != K) return "sparse: row length != K";
    const int64_t q = b->q_len_per_request;
    if ((int64_t)b->batch_size * K * (q < 0 ? 0 : q > 8 ? 8 : q) > INT32_MAX) return "table size";
    if (q < 0) return "negative q_len";
    if (b->batch_size == 0) return NULL; /* no request: the per-request rules see nothing */
    if (q < 1 || q > 8) return "sparse q_len";
    if ((int64_t)b->batch_size * q > c->max_q_tokens) return "q tokens over caps";
    const int64_t n = (int64_t)b->batch_size * q * K;
    if (n > z->table_len) return "slot read past the table";
    for (int32_t i = 0; i < b->batch_size; i++)
        if (b->seq_lens[i] < 0) return "negative seq_len";
    for (int64_t e = 0; e < n; e++)
        if (z->table[e] >= (int64_t)c->num_pages * c->page_size) return "slot";
    return NULL;
}

/* fiattn.h's rules, checked on an accepted batch from its arrays (which the harness sized,
 * so every read here is in bounds or a harness bug).  @return NULL or the broken rule. */
static const char *accepted_batch_breaks(const fi_caps *c, const fz_batch *z,
                                         const tt_plan_expect *e) {
    const fi_batch *b = &z->b;
    if (b->form < FI_FORM_BLOCK_TABLES || b->form > FI_FORM_CUM_SEQ_LENS) return "form";
    if (b->form == FI_FORM_CUM_SEQ_LENS && c->kind != FI_KIND_CONTEXT) return "form of the kind";
    if (b->batch_size < 0 || b->batch_size > c->max_batch) return "batch_size";
    if (b->causal != 0 && b->causal != 1) return "causal";
    if (b->window_left < -1) return "window_left";
    const int indptr = b->form == FI_FORM_INDPTR;
    if (!indptr && (b->max_pages_per_seq < 0 || (b->kv_split_pages != 0 && b->kv_split_pages != 1)))
        return "max_pages_per_seq / kv_split_pages";
    if (!indptr && (int64_t)b->batch_size * b->max_pages_per_seq * (b->kv_split_pages ? 2 : 1) >
                       INT32_MAX)
        return "B x P over int32";
    const int32_t *q_ptr = indptr ? b->qo_indptr : b->form == FI_FORM_CUM_SEQ_LENS ? b->cum_seq_lens_q : NULL;
    const int32_t *k_ptr = indptr ? b->kv_indptr : b->form == FI_FORM_CUM_SEQ_LENS ? b->cum_seq_lens_kv : NULL;
    for (int32_t i = 0; q_ptr && i < b->batch_size; i++)
        if (q_ptr[0] != 0 || k_ptr[0] != 0 || q_ptr[i + 1] < q_ptr[i] || k_ptr[i + 1] < k_ptr[i])
            return "indptr not monotone from 0";
    int64_t total = 0;
    for (int32_t i = 0; i < e->batch_size; i++) {
        const int32_t q = e->q_len[i], kv = e->kv_len[i];
        if (kv < 0 || q < 0) return "negative length";
        const int long_q = c->kind == FI_KIND_MLA_DECODE && indptr; /* the MLA wrapper */
        if (c->kind != FI_KIND_CONTEXT && (q < 1 || (q > 8 && !long_q))) return "decode q_len";
        if (b->causal && kv > 0 && q > kv) return "causal q_len > kv_len";
        if (b->form == FI_FORM_CUM_SEQ_LENS && b->seq_lens && b->seq_lens[i] != kv)
            return "seq_lens != cum_seq_lens_kv";
        total += q;
        const int64_t used = pages_for(kv, c->page_size);
        const int64_t avail = indptr ? (int64_t)k_ptr[i + 1] - k_ptr[i] : b->max_pages_per_seq;
        if (used > avail) return "kv_len over the row's pages";
        const int rows = !indptr && b->kv_split_pages == 1 ? 2 : 1;
        for (int s = 0; s < rows; s++)
            for (int64_t k = 0; k < used; k++) {
                const int64_t at = e->page_row[i] + s * (int64_t)b->max_pages_per_seq + k;
                if (at < 0 || at >= z->table_len) return "page read past the table";
                if (z->table[at] < 0 || z->table[at] >= c->num_pages) return "page id";
            }
    }
    if (total > c->max_q_tokens) return "q tokens over caps";
    return NULL;
}

/* One CTA's share (planner/pslice.h) against the whole partition of plan `ref` (the
 * checked build's, FI_OK, scratch s after it): every CTA's share written into a copy whose
 * work_indptr, items and groups are poisoned must give ref's bytes. */
static void check_slices(const fi_caps *c, const fi_variant *v, const fi_layout *l,
                         fi_planner_scratch *s, const fi_batch *b, unsigned char *ref) {
    const fi_plan_header *h = fi_stage_header(ref, l);
    fi_tile_set ts;
    fi_error_detail e;
    TT_FZ_REQUIRE(fi_tiles_build_parallel(v, c, fi_stage_requests(ref, l), h->batch_size,
                                          b->causal, b->window_left, s->pp.batch_scan, s->tiles,
                                          l->max_tiles, &ts, &e) == FI_OK,
                  "tiles of a planned batch failed");
    if (fi_partition_pairs_apply(v, ts.T, l->num_ctas))
        return; /* packed in pairs (planner/ppair.c): no shares to compare */
    fi_pslice_totals tot;
    TT_FZ_REQUIRE(fi_pslice_prepare(v, &ts, l, s->tile_prefix, &s->pp, &tot, &e) ==
                      FI_OK, "fi_pslice_prepare refused a planned batch");
    const int32_t n = l->num_ctas;
    int32_t *wi = malloc(sizeof(int32_t) * ((size_t)n + 1));
    fi_work_item *items = malloc(sizeof(fi_work_item) * ((size_t)h->num_items + 1));
    fi_merge_group *groups = malloc(sizeof(fi_merge_group) * ((size_t)h->num_groups + 1));
    TT_FZ_REQUIRE(wi && items && groups, "oom");
    memset(wi, 0xa5, sizeof(int32_t) * ((size_t)n + 1));
    memset(items, 0xa5, sizeof(fi_work_item) * (size_t)h->num_items);
    memset(groups, 0xa5, sizeof(fi_merge_group) * (size_t)h->num_groups);
    int64_t total = 0, max = 0;
    for (int32_t k = 0; k < n; k++) {
        int64_t cost = 0;
        fi_pslice_cta(v, &ts, l, &s->pp, &tot, k, wi, items, groups, &cost);
        total += cost;
        max = cost > max ? cost : max;
    }
    TT_FZ_REQUIRE(tot.num_items == h->num_items && tot.num_groups == h->num_groups &&
                      tot.num_slots == h->num_slots && total == h->total_cost &&
                      max == h->max_cta_cost,
                  "CTA shares' totals differ from the whole partition's");
    TT_FZ_REQUIRE(memcmp(wi, fi_stage_work_indptr(ref, l), sizeof(int32_t) * ((size_t)n + 1)) ==
                          0 &&
                      memcmp(items, fi_stage_items(ref, l),
                             sizeof(fi_work_item) * (size_t)h->num_items) == 0 &&
                      memcmp(groups, fi_stage_groups(ref, l),
                             sizeof(fi_merge_group) * (size_t)h->num_groups) == 0,
                  "CTA shares differ from the whole partition");
    free(wi);
    free(items);
    free(groups);
}

/* The device planner's unchecked build (planner/build.h fi_plan_build_parallel_unchecked:
 * CTA 0 of its cluster plans the requests while CTA 1 checks the rules, and a broken rule
 * replaces CTA 0's result).  For the data-parallel rows and every batch whose scalars pass
 * (what fi_plan_update_device checks on the host before launching): it must stay within
 * its arrays whatever the lengths (the plan region is allocated to its exact size here;
 * ASan + UBSan), and on a batch that passes validation it must return what the checked
 * build returns and, on FI_OK, the same bytes. */
static void check_unchecked_build(const fi_caps *caps, const fi_batch *b) {
    fi_caps c;
    fi_layout l;
    if (fi_caps_resolve_layout(caps, &c, &l) != FI_OK)
        return;
    const fi_variant *v = fi_variant_of(&c);
    fi_error_detail e;
    if (!v || v->partition != FI_PARTITION_PARALLEL || c.sparse_top_k > 0 ||
        fi_batch_check_scalars(&c, b, &e) != FI_OK)
        return;
    const fi_allocator a = {0};
    fi_planner_scratch *s = fi_planner_scratch_create(&l, &a);
    unsigned char *spec = calloc(1, l.plan_bytes), *ref = calloc(1, l.plan_bytes);
    fi_request_info *requests = calloc((size_t)b->batch_size + 1, sizeof *requests);
    TT_FZ_REQUIRE(s && spec && ref && requests, "oom");
    const fi_status su = fi_plan_build_parallel_unchecked(&c, v, &l, s, b, spec, &e);
    int32_t total_q = 0;
    if (fi_batch_validate(&c, b, requests, &total_q, &e) == FI_OK) {
        const fi_status sc = fi_plan_build_parallel(&c, v, &l, s, b, NULL, ref, NULL, &e);
        TT_FZ_REQUIRE(su == sc, "unchecked build returned %s, checked %s", fi_status_name(su),
                      fi_status_name(sc));
        TT_FZ_REQUIRE(sc != FI_OK || memcmp(spec, ref, l.plan_bytes) == 0,
                      "unchecked build's plan differs from the checked build's");
        if (sc == FI_OK)
            check_slices(&c, v, &l, s, b, ref);
    }
    free(requests);
    free(ref);
    free(spec);
    fi_planner_scratch_destroy(s, &a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tt_fz f = {data, size};
    int in_set = 0, want = -1;
    const fi_caps caps = fuzz_caps(&f, &in_set, &want);
    const int sparse = caps.sparse_top_k > 0;
    fi_plan *const sentinel = (fi_plan *)(uintptr_t)0x10;
    fi_plan *plan = sentinel;
    const fi_status cst = fi_plan_create(&caps, NULL, 0, NULL, &plan);
    if (cst != FI_OK) {
        TT_FZ_REQUIRE(!in_set, "create of in-set caps failed: %s", fi_status_name(cst));
        TT_FZ_REQUIRE(want < 0 || cst == (fi_status)want, "create returned %s, want %s",
                      fi_status_name(cst), fi_status_name((fi_status)want));
        TT_FZ_REQUIRE(plan == sentinel, "failed create wrote *plan");
        return 0;
    }
    TT_FZ_REQUIRE(want <= 0, "create succeeded, want %s", fi_status_name((fi_status)want));
    const int nbatches = tt_fz_int(&f, 1, 4);
    char msg[512];
    for (int k = 0; k < nbatches; k++) {
        fz_batch z;
        const int mutate = k == 0 ? 0 : tt_fz_int(&f, 0, 3);
        if (sparse)
            fuzz_sparse_batch(&f, &caps, mutate, &z);
        else
            fuzz_batch(&f, &caps, mutate, &z);
        if (!sparse)
            check_unchecked_build(&caps, &z.b);
        tt_plan_snapshot before, after;
        TT_FZ_REQUIRE(tt_plan_snapshot_take(plan, &before) == 0, "oom");
        const fi_status st = fi_plan_update(plan, &z.b, NULL);
        const fi_error_detail d = fi_plan_error(plan);
        if (st != FI_OK) {
            /* A valid batch (of a form its kind takes) is accepted. */
            TT_FZ_REQUIRE(k > 0 || !in_set, "valid batch rejected: %s (request %d)",
                          fi_status_name(st), d.request);
            /* sparse: the oracle is complete, so every rejected batch breaks a rule */
            TT_FZ_REQUIRE(!sparse || sparse_batch_breaks(&caps, &z),
                          "valid sparse batch rejected: %s (request %d)", fi_status_name(st),
                          d.request);
            TT_FZ_REQUIRE(d.status == st, "fi_plan_error says %s, update returned %s",
                          fi_status_name(d.status), fi_status_name(st));
            /* The detail names a request of the batch, or -1 (no request at fault: an
             * empty batch's indptr[0] included); the batch-wide rules always -1. */
            TT_FZ_REQUIRE(d.request == -1 || (d.request >= 0 && d.request < z.b.batch_size),
                          "detail.request %d of %d (%s)", d.request, z.b.batch_size,
                          fi_status_name(st));
            const int batch_wide =
                st == FI_ERR_INVALID_FORM || st == FI_ERR_NEGATIVE_BATCH_SIZE ||
                st == FI_ERR_BATCH_OVER_CAPS || st == FI_ERR_INVALID_WINDOW ||
                st == FI_ERR_INVALID_CAUSAL || st == FI_ERR_NULL_ARGUMENT ||
                st == FI_ERR_NEGATIVE_PAGES_PER_SEQ || st == FI_ERR_INVALID_KV_SPLIT ||
                st == FI_ERR_PAGE_TABLE_TOO_LARGE || st == FI_ERR_SPARSE_UNSUPPORTED ||
                st == FI_ERR_SPARSE_TOP_K_MISMATCH;
            TT_FZ_REQUIRE(!batch_wide || d.request == -1, "%s names request %d",
                          fi_status_name(st), d.request);
            /* the catch-all is never used by validation any more */
            TT_FZ_REQUIRE(st != FI_ERR_INVALID_ARGUMENT, "FI_ERR_INVALID_ARGUMENT from validation");
            TT_FZ_REQUIRE(tt_plan_snapshot_take(plan, &after) == 0, "oom");
            const long at = tt_plan_snapshot_diff(&before, &after);
            TT_FZ_REQUIRE(at < 0, "rejected batch (%s) changed the plan at byte %ld",
                          fi_status_name(st), at);
            tt_plan_snapshot_free(&after);
        } else {
            TT_FZ_REQUIRE(d.status == FI_OK && d.request == -1, "accepted batch left detail %s",
                          fi_status_name(d.status));
            tt_plan_expect_buf e;
            fi_batch walked = z.b; /* sparse: the dense batch of one-token requests */
            const char *broken;
            if (sparse) {
                broken = sparse_batch_breaks(&caps, &z);
                TT_FZ_REQUIRE(!broken, "accepted a sparse batch that breaks a rule: %s", broken);
                TT_FZ_REQUIRE(tt_plan_expect_sparse(&z.b, &e, &walked) == 0, "oom");
            } else {
                TT_FZ_REQUIRE(tt_plan_expect_from_batch(&z.b, &e) == 0, "oom");
                broken = accepted_batch_breaks(&caps, &z, &e.e);
                TT_FZ_REQUIRE(!broken, "accepted a batch that breaks a rule: %s", broken);
            }
            TT_FZ_REQUIRE(tt_plan_check(plan, &walked, &e.e, msg, sizeof msg) == 0,
                          "accepted batch's plan: %s", msg);
            tt_plan_expect_free(&e);
        }
        tt_plan_snapshot_free(&before);
        fz_batch_free(&z);
    }
    fi_plan_destroy(plan);
    return 0;
}
