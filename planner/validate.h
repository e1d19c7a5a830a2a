/*
 * planner/validate.h - the planner's single-pass form of fi_batch_validate (fiattn.h).
 * Not installed.
 */
#ifndef FIATTN_PLANNER_VALIDATE_H
#define FIATTN_PLANNER_VALIDATE_H

#include "fiattn.h"
#include "plan/page_table.h"

/* fi_batch_validate's rules and statuses in one pass that writes requests[b] as soon as
 * request b passes (so a failure leaves requests partly written: fi_plan_update passes its
 * back staging buffer, which nobody reads until the update succeeds).  requests may be
 * NULL: check only.  *total_q_tokens is written on success, and *geom (may be NULL) with
 * what the batch reads of its page table (plan/page_table.h). */
fi_status fi_batch_check(const fi_caps *caps, const fi_batch *batch,
                         fi_request_info *requests, int32_t *total_q_tokens,
                         fi_page_table_geom *geom, fi_error_detail *err);

#endif /* FIATTN_PLANNER_VALIDATE_H */
