/*
 * tests/common/batchgen.h - random fi_caps + fi_batch generator for tests and benches.
 *
 * One call gives a batch of any form (BLOCK_TABLES, INDPTR, CUM_SEQ_LENS) and kind (MLA
 * decode, GQA decode, context), caps that fit it, and the arrays it points into (owned by
 * the returned batchgen_batch; free with batchgen_free).  Every batch it returns is VALID
 * for its caps (tests that want a bad batch corrupt a copy of one).  Deterministic in the
 * tt_rng state (tests/common/rng.h), so FI_TEST_SEED replays a failure.
 *
 * Shapes (batchgen_shape) cover the edges the planner must survive:
 *   RANDOM      B in 1..max_batch, kv_len mostly log-uniform in 0..max_kv_len
 *   BATCH1      one request
 *   KV_EDGES    kv_len in {0, 1, page_size*k, page_size*k + 1, page_size*k - 1} (lengths at
 *               and one past a page boundary)
 *   LONG_TAIL   one request of 131072 tokens among short ones (B = min(128, max_batch))
 *   MAX_BATCH   B = max_batch
 * Decode kinds get q_len 1..8 (MTP; uniform for BLOCK_TABLES), context q_len 0..kv_len.
 * Sometimes: window_left >= 0, causal 0, 3-D [B, 2, P] tables (kv_split_pages), page ids
 * a random permutation (non-identity), unused table entries -1, spare pages in a row.
 */
#ifndef FI_TEST_BATCHGEN_H
#define FI_TEST_BATCHGEN_H

#include <stdint.h>

#include "plan_check.h"
#include "rng.h"
#include "fiattn.h"

typedef enum batchgen_shape {
    BATCHGEN_ANY = 0, /* pick one of the below at random (RANDOM most often) */
    BATCHGEN_RANDOM = 1,
    BATCHGEN_BATCH1 = 2,
    BATCHGEN_KV_EDGES = 3,
    BATCHGEN_LONG_TAIL = 4,
    BATCHGEN_MAX_BATCH = 5,
} batchgen_shape;

/* Zero members mean "random" / defaults. */
typedef struct batchgen_opts {
    fi_kind kind;         /* 0: random kind */
    fi_batch_form form;   /* 0: random form of those the kind takes (CUM_SEQ_LENS: context) */
    batchgen_shape shape; /* 0: random shape */
    int32_t max_batch;    /* caps.max_batch and upper bound on B; 0: 64 */
    int32_t max_kv_len;   /* upper bound of RANDOM kv_len; 0: 4096 */
    int32_t num_ctas;     /* caps.num_ctas; 0: random in 1..160 */
    int32_t page_size;    /* 0: random supported size (>= 16 for LONG_TAIL) */
    int32_t window_left;  /* used when fixed_window is 1 */
    int32_t fixed_window; /* 1: use window_left above; 0: random (mostly -1) */
    int32_t causal;       /* used when fixed_causal is 1 */
    int32_t fixed_causal;
} batchgen_opts;

typedef struct batchgen_batch {
    fi_batch batch;          /* points into the arrays below */
    fi_caps caps;            /* valid caps that fit the batch (max_q_tokens = total q,
                                num_pages >= every page id + 1) */
    int32_t *q_len;          /* [B] */
    int32_t *kv_len;         /* [B] */
    int32_t *q_offset;       /* [B] expected fi_request_info.q_offset */
    int32_t *page_row;       /* [B] expected fi_request_info.page_row_offset */
    int32_t *page_table;     /* block_tables [B, (2,) P] or kv_indices [nnz] */
    int64_t page_table_len;  /* elements */
    int32_t *q_indptr;       /* [B+1] qo_indptr / cum_seq_lens_q (all forms, filled) */
    int32_t *kv_indptr;      /* [B+1] INDPTR: pages; CUM_SEQ_LENS: tokens */
    int32_t *seq_lens;       /* [B] (NULL in the batch for CUM_SEQ_LENS half the time) */
    int32_t total_q_tokens;
    batchgen_shape shape;    /* the shape used */
} batchgen_batch;

/* Random caps for `kind` (0: random kind): heads, dims, page_size from the supported sets,
 * F32 dtypes; max_batch / max_q_tokens / num_pages / num_ctas are left for the batch. */
void batchgen_caps(tt_rng *rng, fi_kind kind, fi_caps *caps);

/* Generate a valid batch and caps.  opts may be NULL (all random).
 * @return 0, or -1 if out of memory (*out zeroed). */
int batchgen_make(tt_rng *rng, const batchgen_opts *opts, batchgen_batch *out);

/* Build a batch of form `form` over the given caps and lengths (q_len, kv_len [n]);
 * BLOCK_TABLES needs uniform q_len.  kv_split: 3-D table (ignored for INDPTR); shuffle:
 * random page permutation; causal / window_left copied.  Sets caps->num_pages (and
 * max_batch / max_q_tokens if smaller than needed) in out->caps (copied from *caps).
 * @return 0, -1 out of memory or bad arguments (*out zeroed). */
int batchgen_from_lens(tt_rng *rng, const fi_caps *caps, fi_batch_form form,
                       const int32_t *q_len, const int32_t *kv_len, int32_t n, int kv_split,
                       int shuffle, int32_t causal, int32_t window_left, batchgen_batch *out);

/* The request table a plan of b's batch must hold (points into *b). */
tt_plan_expect batchgen_expect(const batchgen_batch *b);

/* Free the arrays (NULL or zeroed is fine) and zero *b. */
void batchgen_free(batchgen_batch *b);

/* One-line description for failure messages ("kind 1 form 2 B 37 ..."), static buffer. */
const char *batchgen_describe(const batchgen_batch *b);

#endif
