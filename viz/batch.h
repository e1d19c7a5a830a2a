/*
 * viz/batch.h - turn per-request lengths into an fi_batch of any of the three forms, with
 * page tables the fibatch owns.
 *
 * Pages: request b needs ceil(kv_len[b] / page_size) pages (one more row table of V pages
 * for the 3-D [B, 2, P] block table when kv_split_pages).  Pages are numbered in request
 * order (identity: request 0 gets 0, 1, ..., then request 1, ...), or, with shuffle, the
 * same set of ids permuted by a seeded Fisher-Yates shuffle, so neighbouring tokens of a
 * request live in unrelated pages as in a real paged cache.  num_pages (what caps.num_pages
 * must be at least) is the number of ids handed out (>= 1).
 *
 *   FI_FORM_BLOCK_TABLES  block_tables [B, max_pages_per_seq] (or [B, 2, P]), seq_lens;
 *                         q_len must be the same for all requests (q_len_per_request).
 *                         Unused tail entries of a row are -1 (never read).
 *   FI_FORM_INDPTR        qo_indptr, kv_indptr (pages), kv_indices, kv_len.
 *   FI_FORM_CUM_SEQ_LENS  cum_seq_lens_q, cum_seq_lens_kv, block_tables, seq_lens.
 *
 * Names are fibatch_* (not fi_*).  All arrays come from the given fi_allocator (NULL =
 * malloc) and are released by fibatch_free.
 */
#ifndef FIATTN_VIZ_BATCH_H
#define FIATTN_VIZ_BATCH_H

#include <stdint.h>

#include "fiattn.h"

typedef struct fibatch_opts {
    fi_batch_form form;
    int32_t page_size;       /* tokens per page, >= 1 */
    int32_t shuffle;         /* 0: identity page ids; 1: seeded permutation */
    uint64_t seed;           /* shuffle seed */
    int32_t kv_split_pages;  /* 1: 3-D [B, 2, P] block table (BLOCK_TABLES / CUM_SEQ_LENS) */
    int32_t causal;          /* copied into fi_batch */
    int32_t window_left;     /* copied into fi_batch (-1 unlimited) */
} fibatch_opts;

/* Defaults: FI_FORM_INDPTR, page_size 64, identity, causal 1, window_left -1. */
fibatch_opts fibatch_default_opts(void);

/* A built batch.  `batch` points into the arrays below; valid until fibatch_free. */
typedef struct fibatch {
    fi_batch batch;
    int32_t num_pages;       /* page ids used: caps.num_pages must be >= this */
    int32_t total_q_tokens;  /* sum of q_len: caps.max_q_tokens must be >= this */
    int32_t max_q_len;
    int32_t max_kv_len;
    int32_t *q_lens;         /* [B] copies of the inputs */
    int32_t *kv_lens;        /* [B] (also seq_lens / kv_len of the batch) */
    int32_t *page_table;     /* block_tables [B, (2,) P] or kv_indices [nnz] */
    int64_t page_table_len;  /* elements of page_table */
    int32_t *q_indptr;       /* [B+1] qo_indptr / cum_seq_lens_q (NULL for BLOCK_TABLES) */
    int32_t *kv_indptr;      /* [B+1] pages (INDPTR) or tokens (CUM_SEQ_LENS), else NULL */
    fi_allocator alloc;
} fibatch;

typedef enum fibatch_status {
    FIBATCH_OK = 0,
    FIBATCH_ERR_ARG = 1,        /* NULL, n < 1, page_size < 1, negative length, bad form */
    FIBATCH_ERR_NONUNIFORM = 2, /* BLOCK_TABLES with differing q_len */
    FIBATCH_ERR_TOO_LARGE = 3,  /* a count overflows int32 */
    FIBATCH_ERR_NOMEM = 4,
} fibatch_status;

/* Build a batch of n requests from q_len[n], kv_len[n] (tokens; q_len >= 0, kv_len >= 0;
 * causal batches need q_len <= kv_len, which the library checks, not this).
 * @return FIBATCH_OK and *out filled (free with fibatch_free); on error *out is zeroed. */
fibatch_status fibatch_build(const fibatch_opts *opts, const int32_t *q_len,
                             const int32_t *kv_len, int32_t n, const fi_allocator *alloc,
                             fibatch *out);

/* Free the arrays of a built batch and zero it (NULL or zeroed is fine). */
void fibatch_free(fibatch *b);

/* Name of a status. */
const char *fibatch_status_name(fibatch_status status);

#endif /* FIATTN_VIZ_BATCH_H */
