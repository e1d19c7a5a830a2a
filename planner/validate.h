/*
 * planner/validate.h - batch validation shared by the planner and the naive reference.
 *
 * Normalises any fi_batch form into the per-request table the executor reads
 * (fi_request_info: q_offset, q_len, kv_len, page_row_offset), checking every rule of
 * fiattn.h: lengths >= 0, indptr monotone from 0, q tokens and batch within caps, q_len in
 * the kind's range, kv_len covered by the request's pages, every used page index in
 * [0, caps->num_pages), window_left >= -1, causal rows (q_len <= kv_len when causal).
 * Writes `requests` only on success; on failure fills *err (status, request, needed,
 * limit) and returns its status.  Reads the host arrays only.  No allocation.
 */
#ifndef FIATTN_PLANNER_VALIDATE_H
#define FIATTN_PLANNER_VALIDATE_H

#include "fiattn.h"

/* caps: validated caps.  requests: [batch->batch_size] out.  *total_q_tokens: sum q_len.
 * The request table is built in a caller scratch buffer first by implementations, so a
 * failure leaves `requests` untouched only if the caller passes scratch; callers that
 * need atomicity (the planner) pass their staging buffer. */
fi_status fi_batch_validate(const fi_caps *caps, const fi_batch *batch,
                            fi_request_info *requests, int32_t *total_q_tokens,
                            fi_error_detail *err);

/* Validate caps (kind, heads, dims, page size, dtypes, positive maxima).  num_ctas may
 * be 0 here (resolved later). */
fi_status fi_caps_validate(const fi_caps *caps);

#endif
