/*
 * planner/validate.h - the planner's single-pass form of fi_batch_validate (fiattn.h).
 * Not installed.
 */
#ifndef FIATTN_PLANNER_VALIDATE_H
#define FIATTN_PLANNER_VALIDATE_H

#include "fiattn.h"
#include "plan/page_table.h"

/* One request's fields as its batch form gives them, before any check (every read is of
 * index b or b + 1 of the form's arrays, in bounds for b < batch_size whatever the values):
 * the query offset and length, kv_len, the element offset of its page row and the pages
 * that row holds (INDPTR: the kv_indptr difference; others: max_pages_per_seq).
 * row_stride: elements between block-table rows (P, or 2P for [B, 2, P]); 0 for INDPTR. */
typedef struct fi_request_fields {
    int64_t q_offset, q_len, kv_len, row, avail;
} fi_request_fields;

FI_HOST_DEVICE fi_request_fields fi_request_read(const fi_batch *bt, int32_t b,
                                                 int64_t row_stride) {
    fi_request_fields f;
    switch (bt->form) {
    case FI_FORM_BLOCK_TABLES:
        f.q_len = bt->q_len_per_request;
        f.q_offset = (int64_t)b * f.q_len;
        f.kv_len = bt->seq_lens[b];
        f.row = b * row_stride;
        f.avail = bt->max_pages_per_seq;
        break;
    case FI_FORM_INDPTR:
        f.q_offset = bt->qo_indptr[b];
        f.q_len = (int64_t)bt->qo_indptr[b + 1] - bt->qo_indptr[b];
        f.kv_len = bt->kv_len[b];
        f.row = bt->kv_indptr[b];
        f.avail = (int64_t)bt->kv_indptr[b + 1] - bt->kv_indptr[b];
        break;
    default: /* FI_FORM_CUM_SEQ_LENS */
        f.q_offset = bt->cum_seq_lens_q[b];
        f.q_len = (int64_t)bt->cum_seq_lens_q[b + 1] - bt->cum_seq_lens_q[b];
        f.kv_len = (int64_t)bt->cum_seq_lens_kv[b + 1] - bt->cum_seq_lens_kv[b];
        f.row = b * row_stride;
        f.avail = bt->max_pages_per_seq;
        break;
    }
    return f;
}

/* Requests in the table of a batch validated against caps (total_q: its query tokens):
 * B, or for a sparse plan (caps.sparse_top_k > 0) one per query token, B x q_len. */
FI_HOST_DEVICE int32_t fi_batch_num_requests(const fi_caps *caps, const fi_batch *bt,
                                             int32_t total_q) {
    return caps->sparse_top_k > 0 ? total_q : bt->batch_size;
}

/* page_verdict[b] of a request whose used pages are all in [0, caps.num_pages). */
#define FI_PAGES_OK INT64_MIN

/* The rules of fi_batch_validate that read no array (form, batch size, window, causal,
 * NULL arrays, page-table shape, q_len_per_request), in its order. */
FI_PD fi_status fi_batch_check_scalars(const fi_caps *caps, const fi_batch *batch,
                                       fi_error_detail *err);

/* fi_batch_check with the page scan done elsewhere: page_verdict [batch_size] holds, per
 * request, FI_PAGES_OK or the first used page index out of range (K row, then V row), and
 * is consulted at the point fi_batch_check would scan (so the first broken rule is the
 * same).  page_verdict NULL: scan here. */
FI_PD fi_status fi_batch_check_pages(const fi_caps *caps, const fi_batch *batch,
                                     const int64_t *page_verdict, fi_request_info *requests,
                                     int32_t *total_q_tokens, fi_page_table_geom *geom,
                                     fi_error_detail *err);

/* fi_batch_check_pages for the data-parallel planner (planner/parallel.h: every thread of
 * the device planner calls it; one pass on the host): the same rules, the same first broken
 * rule reported, requests[b] written for every request that passes.  page_verdict: as
 * above, or NULL (host).  q_scan: scratch [batch_size].  geom: may be NULL.  On FI_OK the
 * threads' last step is a barrier after every write of requests[]. */
FI_PD fi_status fi_batch_check_parallel(const fi_caps *caps, const fi_batch *batch,
                                        const int64_t *page_verdict, int64_t *q_scan,
                                        fi_request_info *requests, int32_t *total_q_tokens,
                                        fi_page_table_geom *geom, fi_error_detail *err);

/* The device planner's speculative read (its cluster: the other CTA checks the rules at the
 * same time): requests[b] and the q tokens as fi_batch_check_parallel writes them for a
 * batch that passes, no rule checked.  Fields are clamped to what a valid request can hold
 * (kv_len >= 0, 0 <= q_len <= caps.max_q_tokens, and <= kv_len when causal), no-ops on a
 * valid batch, so the build that follows stays within its arrays whatever the lengths; its
 * plan is discarded when the check fails.  The batch's scalars and arrays must have passed
 * the host's checks (fi_plan_update_device).  q_scan: scratch [batch_size].  Every thread;
 * returns the q tokens (clamped to INT32_MAX). */
FI_PD int32_t fi_batch_read_parallel(const fi_caps *caps, const fi_batch *batch,
                                     int64_t *q_scan, fi_request_info *requests);

/* fi_batch_validate's rules and statuses in one pass that writes requests[b] as soon as
 * request b passes (so a failure leaves requests partly written: fi_plan_update passes its
 * back staging buffer, which nobody reads until the update succeeds).  requests may be
 * NULL: check only.  *total_q_tokens is written on success, and *geom (may be NULL) with
 * what the batch reads of its page table (plan/page_table.h). */
FI_PD fi_status fi_batch_check(const fi_caps *caps, const fi_batch *batch,
                         fi_request_info *requests, int32_t *total_q_tokens,
                         fi_page_table_geom *geom, fi_error_detail *err);

#endif /* FIATTN_PLANNER_VALIDATE_H */
