/*
 * viz/batch.c - per-request lengths -> fi_batch of one of the three forms with owned page
 * tables (identity or shuffled page ids).  Semantics in viz/batch.h.
 */
#include "viz/batch.h"

#include <string.h>

#include "viz/alloc.h"

fibatch_opts fibatch_default_opts(void) {
    fibatch_opts o;
    memset(&o, 0, sizeof o);
    o.form = FI_FORM_INDPTR;
    o.page_size = 64;
    o.causal = 1;
    o.window_left = -1;
    return o;
}

const char *fibatch_status_name(fibatch_status status) {
    switch (status) {
    case FIBATCH_OK: return "FIBATCH_OK";
    case FIBATCH_ERR_ARG: return "FIBATCH_ERR_ARG";
    case FIBATCH_ERR_NONUNIFORM: return "FIBATCH_ERR_NONUNIFORM";
    case FIBATCH_ERR_TOO_LARGE: return "FIBATCH_ERR_TOO_LARGE";
    case FIBATCH_ERR_NOMEM: return "FIBATCH_ERR_NOMEM";
    }
    return "FIBATCH_STATUS_UNKNOWN";
}

void fibatch_free(fibatch *b) {
    if (!b) return;
    fi_allocator a = b->alloc;
    fiviz_free(&a, b->q_lens);
    fiviz_free(&a, b->kv_lens);
    fiviz_free(&a, b->page_table);
    fiviz_free(&a, b->q_indptr);
    fiviz_free(&a, b->kv_indptr);
    memset(b, 0, sizeof *b);
}

/* splitmix64, the generator of tests/common/rng.h (duplicated: viz must not need tests/). */
static uint64_t mix_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Replace every id >= 0 in table[len] by perm(id), perm a seeded permutation of
 * [0, num_pages).  Scratch from the allocator. */
static int shuffle_ids(const fi_allocator *a, int32_t *table, int64_t len, int32_t num_pages,
                       uint64_t seed) {
    int32_t *perm = fiviz_alloc(a, (size_t)num_pages * sizeof(int32_t));
    if (!perm) return 0;
    for (int32_t i = 0; i < num_pages; i++) perm[i] = i;
    uint64_t s = seed;
    for (int32_t i = num_pages - 1; i > 0; i--) {
        int32_t j = (int32_t)(mix_next(&s) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int64_t i = 0; i < len; i++)
        if (table[i] >= 0) table[i] = perm[table[i]];
    fiviz_free(a, perm);
    return 1;
}

static int32_t pages_for(int32_t kv_len, int32_t page_size) {
    return (int32_t)(((int64_t)kv_len + page_size - 1) / page_size);
}

fibatch_status fibatch_build(const fibatch_opts *opts, const int32_t *q_len,
                             const int32_t *kv_len, int32_t n, const fi_allocator *alloc,
                             fibatch *out) {
    if (out) memset(out, 0, sizeof *out);
    if (!opts || !q_len || !kv_len || !out || n < 1 || opts->page_size < 1)
        return FIBATCH_ERR_ARG;
    fi_batch_form form = opts->form;
    if (form != FI_FORM_BLOCK_TABLES && form != FI_FORM_INDPTR && form != FI_FORM_CUM_SEQ_LENS)
        return FIBATCH_ERR_ARG;
    int split = opts->kv_split_pages ? 1 : 0;
    if (split && form == FI_FORM_INDPTR) return FIBATCH_ERR_ARG;

    int64_t sum_q = 0, sum_kv = 0, sum_pages = 0;
    int32_t max_q = 0, max_kv = 0, max_pages = 1;
    for (int32_t b = 0; b < n; b++) {
        if (q_len[b] < 0 || kv_len[b] < 0) return FIBATCH_ERR_ARG;
        if (form == FI_FORM_BLOCK_TABLES && q_len[b] != q_len[0]) return FIBATCH_ERR_NONUNIFORM;
        int32_t p = pages_for(kv_len[b], opts->page_size);
        sum_q += q_len[b];
        sum_kv += kv_len[b];
        sum_pages += p;
        if (q_len[b] > max_q) max_q = q_len[b];
        if (kv_len[b] > max_kv) max_kv = kv_len[b];
        if (p > max_pages) max_pages = p;
    }
    int64_t ids = sum_pages * (split ? 2 : 1);
    int64_t table_len = form == FI_FORM_INDPTR ? sum_pages : (int64_t)n * (split ? 2 : 1) * max_pages;
    if (sum_q > INT32_MAX || sum_kv > INT32_MAX || ids > INT32_MAX || table_len > INT32_MAX)
        return FIBATCH_ERR_TOO_LARGE;

    fibatch r;
    memset(&r, 0, sizeof r);
    r.alloc = fiviz_allocator(alloc);
    r.q_lens = fiviz_alloc(&r.alloc, (size_t)n * sizeof(int32_t));
    r.kv_lens = fiviz_alloc(&r.alloc, (size_t)n * sizeof(int32_t));
    r.page_table = fiviz_alloc(&r.alloc, (size_t)(table_len > 0 ? table_len : 1) * sizeof(int32_t));
    if (form != FI_FORM_BLOCK_TABLES) {
        r.q_indptr = fiviz_alloc(&r.alloc, (size_t)(n + 1) * sizeof(int32_t));
        r.kv_indptr = fiviz_alloc(&r.alloc, (size_t)(n + 1) * sizeof(int32_t));
    }
    if (!r.q_lens || !r.kv_lens || !r.page_table ||
        (form != FI_FORM_BLOCK_TABLES && (!r.q_indptr || !r.kv_indptr))) {
        fibatch_free(&r);
        return FIBATCH_ERR_NOMEM;
    }
    memcpy(r.q_lens, q_len, (size_t)n * sizeof(int32_t));
    memcpy(r.kv_lens, kv_len, (size_t)n * sizeof(int32_t));
    r.page_table_len = table_len;
    r.num_pages = ids > 0 ? (int32_t)ids : 1;
    r.total_q_tokens = (int32_t)sum_q;
    r.max_q_len = max_q;
    r.max_kv_len = max_kv;

    /* Page ids handed out in table order: request b's K pages, then (split) its V pages. */
    int32_t next_id = 0;
    if (form == FI_FORM_INDPTR) {
        r.q_indptr[0] = r.kv_indptr[0] = 0;
        for (int32_t b = 0; b < n; b++) {
            int32_t p = pages_for(kv_len[b], opts->page_size);
            for (int32_t i = 0; i < p; i++) r.page_table[r.kv_indptr[b] + i] = next_id++;
            r.q_indptr[b + 1] = r.q_indptr[b] + q_len[b];
            r.kv_indptr[b + 1] = r.kv_indptr[b] + p;
        }
    } else {
        int32_t rows = split ? 2 : 1;
        for (int64_t i = 0; i < table_len; i++) r.page_table[i] = -1;
        for (int32_t b = 0; b < n; b++) {
            int32_t p = pages_for(kv_len[b], opts->page_size);
            for (int32_t kv = 0; kv < rows; kv++) {
                int32_t *row = r.page_table + ((int64_t)b * rows + kv) * max_pages;
                for (int32_t i = 0; i < p; i++) row[i] = next_id++;
            }
        }
        if (form == FI_FORM_CUM_SEQ_LENS) {
            r.q_indptr[0] = r.kv_indptr[0] = 0;
            for (int32_t b = 0; b < n; b++) {
                r.q_indptr[b + 1] = r.q_indptr[b] + q_len[b];
                r.kv_indptr[b + 1] = r.kv_indptr[b] + kv_len[b];
            }
        }
    }
    if (opts->shuffle && next_id > 1 &&
        !shuffle_ids(&r.alloc, r.page_table, table_len, next_id, opts->seed)) {
        fibatch_free(&r);
        return FIBATCH_ERR_NOMEM;
    }

    fi_batch *fb = &r.batch;
    fb->form = form;
    fb->batch_size = n;
    fb->causal = opts->causal;
    fb->window_left = opts->window_left;
    switch (form) {
    case FI_FORM_BLOCK_TABLES:
        fb->block_tables = r.page_table;
        fb->max_pages_per_seq = max_pages;
        fb->kv_split_pages = split;
        fb->seq_lens = r.kv_lens;
        fb->q_len_per_request = q_len[0];
        break;
    case FI_FORM_INDPTR:
        fb->qo_indptr = r.q_indptr;
        fb->kv_indptr = r.kv_indptr;
        fb->kv_indices = r.page_table;
        fb->kv_len = r.kv_lens;
        break;
    case FI_FORM_CUM_SEQ_LENS:
        fb->block_tables = r.page_table;
        fb->max_pages_per_seq = max_pages;
        fb->kv_split_pages = split;
        fb->seq_lens = r.kv_lens;
        fb->cum_seq_lens_q = r.q_indptr;
        fb->cum_seq_lens_kv = r.kv_indptr;
        break;
    }
    *out = r;
    return FIBATCH_OK;
}
