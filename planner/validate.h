/*
 * planner/validate.h - batch validation shared by the planner and the naive reference.
 *
 * Normalises any fi_batch form into the per-request table the executor reads
 * (fi_request_info: q_offset, q_len, kv_len, page_row_offset):
 *   BLOCK_TABLES  q_offset = b * q_len_per_request, q_len = q_len_per_request,
 *                 kv_len = seq_lens[b], page_row_offset = b * P * (kv_split_pages ? 2 : 1)
 *   INDPTR        q from qo_indptr, kv_len[b], page_row_offset = kv_indptr[b]
 *   CUM_SEQ_LENS  q from cum_seq_lens_q, kv_len = cum_seq_lens_kv diff (seq_lens, if given,
 *                 must equal it), page_row_offset as BLOCK_TABLES
 * Rules, in the order checked, and their status:
 *   NULL caps/batch/out or a required array of the form   FI_ERR_NULL_ARGUMENT
 *   form not one of the three                             FI_ERR_INVALID_FORM
 *   batch_size < 0                                        FI_ERR_INVALID_ARGUMENT
 *   batch_size > caps.max_batch                           FI_ERR_BATCH_OVER_CAPS
 *   window_left < -1                                      FI_ERR_INVALID_WINDOW
 *   causal not 0/1, max_pages_per_seq < 0, kv_split_pages not 0/1   FI_ERR_INVALID_ARGUMENT
 *   q_len_per_request < 0, kv_len / seq_lens < 0          FI_ERR_NEGATIVE_LENGTH
 *   an indptr / cum_seq_lens not starting at 0 or decreasing   FI_ERR_INDPTR_NOT_MONOTONE
 *   seq_lens != cum_seq_lens_kv diff; causal with 0 < kv_len < q_len
 *                                                         FI_ERR_INCONSISTENT_LENGTHS
 *     (kv_len 0 is always valid: an empty request, its rows get zeros and lse -inf)
 *   q_len outside the kind's range (decode kinds 1..8, context >= 0)  FI_ERR_Q_LEN_UNSUPPORTED
 *   sum of q_len > caps.max_q_tokens                      FI_ERR_Q_TOKENS_OVER_CAPS
 *   ceil(kv_len / page_size) > pages of the request's row FI_ERR_SEQ_LEN_EXCEEDS_PAGES
 *   a used page index (K and, for 3-D tables, V row) outside [0, caps.num_pages)
 *                                                         FI_ERR_PAGE_INDEX_OUT_OF_RANGE
 * Every form is accepted for every kind.  Only the pages a request uses are read.
 * On failure fills *err (status, request b or -1, needed, limit) and returns its status;
 * `requests` may then be partly written, so pass a buffer nobody else reads yet (the planner
 * passes its back staging buffer).  Reads the host arrays only.  No allocation.  O(B + pages).
 */
#ifndef FIATTN_PLANNER_VALIDATE_H
#define FIATTN_PLANNER_VALIDATE_H

#include "fiattn.h"

/* caps: validated caps.  batch: any form.  requests: [batch->batch_size] out.
 * *total_q_tokens: sum of q_len (out, on success).  err: may be NULL; on success its
 * status is FI_OK and the other fields -1 / 0. */
fi_status fi_batch_validate(const fi_caps *caps, const fi_batch *batch,
                            fi_request_info *requests, int32_t *total_q_tokens,
                            fi_error_detail *err);

/* Validate caps (kind, heads, dims, page size, dtypes, positive maxima).  num_ctas may
 * be 0 here (resolved later).  @return FI_OK, FI_ERR_NULL_ARGUMENT, FI_ERR_UNSUPPORTED_KIND,
 * FI_ERR_UNSUPPORTED_VARIANT (no tile table row for kind / variant), FI_ERR_INVALID_CAPS,
 * FI_ERR_UNSUPPORTED_HEADS, FI_ERR_UNSUPPORTED_HEAD_DIM, FI_ERR_UNSUPPORTED_PAGE_SIZE,
 * FI_ERR_UNSUPPORTED_DTYPE. */
fi_status fi_caps_validate(const fi_caps *caps);

#endif
