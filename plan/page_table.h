/*
 * plan/page_table.h - the page-table geometry a batch makes the executors assume: which
 * rows and columns of block_tables (or which elements of kv_indices) they read, and at
 * which row stride.  fi_plan_update records it for the current plan (fi_plan.page_table);
 * executor/core/args.h checks a page-table tensor against it.  Not installed.
 */
#ifndef FIATTN_PLAN_PAGE_TABLE_H
#define FIATTN_PLAN_PAGE_TABLE_H

#include <stdint.h>

#include "plan/hd.h"

#include "fiattn.h"

typedef struct fi_page_table_geom {
    int32_t form;           /* fi_batch_form of the batch */
    int32_t kv_split_pages; /* 1: a [B, 2, P] table (V row at + P); block-table forms only */
    int32_t rows;           /* block-table forms: rows read, B; INDPTR: 0 */
    int32_t pages_per_row;  /* block-table forms: P (max_pages_per_seq); INDPTR: 0 */
    int64_t row_stride;     /* elements between rows, as page_row_offset assumed: P or 2P */
    int64_t max_cols;       /* columns read in the longest row: max of ceil(kv_len /
                               page_size) (what block-table forms check) */
    int64_t extent;         /* largest element read + 1 as a flat array, 0: none (what
                               INDPTR checks) */
    int32_t sparse_q_len;   /* sparse plans (caps.sparse_top_k > 0): q_len_per_request, so
                               the [B * q_len, K] table may also come as [B, q_len, K];
                               0: dense */
} fi_page_table_geom;

/* log2(page_size) for a power of two, else -1 (page addressing by shift, not division). */
FI_HOST_DEVICE int fi_page_shift(int32_t page_size) {
    if (page_size <= 0 || (page_size & (page_size - 1)) != 0)
        return -1;
    int s = 0;
    while ((1 << s) < page_size)
        ++s;
    return s;
}

/* The batch's form, rows and strides, nothing read yet; then fi_page_table_geom_add each
 * request.  batch: validated.  Pure. */
FI_HOST_DEVICE fi_page_table_geom fi_page_table_geom_begin(const fi_batch *batch) {
    fi_page_table_geom g;
    g.form = batch->form;
    g.kv_split_pages = 0;
    g.rows = 0;
    g.pages_per_row = 0;
    g.row_stride = 0;
    g.max_cols = 0;
    g.extent = 0;
    g.sparse_q_len = 0;
    if (batch->form == FI_FORM_INDPTR)
        return g;
    g.kv_split_pages = batch->kv_split_pages;
    g.rows = batch->batch_size;
    g.pages_per_row = batch->max_pages_per_seq;
    g.row_stride = (int64_t)batch->max_pages_per_seq * (batch->kv_split_pages ? 2 : 1);
    return g;
}

/* Request reads `pages` entries from element row_offset (fi_request_info.page_row_offset)
 * on: widen g to cover them. */
FI_HOST_DEVICE void fi_page_table_geom_add(fi_page_table_geom *g, int64_t row_offset,
                                          int64_t pages) {
    const int64_t end = pages > 0 ? row_offset + pages : 0;
    g->max_cols = pages > g->max_cols ? pages : g->max_cols;
    g->extent = end > g->extent ? end : g->extent;
}

/* A sparse batch's table (caps.sparse_top_k = K > 0, validated): B x q_len rows of K
 * slots, each read whole (K = max_pages_per_seq), as [B * q_len, K] or [B, q_len, K]. */
FI_HOST_DEVICE fi_page_table_geom fi_page_table_geom_sparse(const fi_batch *batch) {
    fi_page_table_geom g = fi_page_table_geom_begin(batch);
    const int64_t rows = (int64_t)batch->batch_size * batch->q_len_per_request;
    g.rows = (int32_t)rows; /* <= caps.max_q_tokens */
    g.max_cols = rows > 0 ? batch->max_pages_per_seq : 0;
    g.extent = rows * batch->max_pages_per_seq;
    g.sparse_q_len = batch->q_len_per_request;
    return g;
}

/* The whole geometry of a batch validated against caps: requests from fi_batch_validate
 * ([batch->batch_size]; a sparse batch's geometry needs none of them), caps->page_size a
 * power of two.  Pure.  O(B).  (The planner gathers the same while it validates.) */
fi_page_table_geom fi_page_table_geom_of(const fi_caps *caps, const fi_batch *batch,
                                         const fi_request_info *requests);

#endif /* FIATTN_PLAN_PAGE_TABLE_H */
