/*
 * tests/common/plan_check.h - checks of a planned fi_plan shared by the cmocka suites and
 * the libFuzzer harness (tests/fuzz/): no cmocka here, every check returns a status and a
 * message instead of asserting.
 *
 *   tt_plan_check     the plan computes every (request, query head, query row, visible key)
 *                     exactly once, with consistent bookkeeping, within the workspace bounds
 *   tt_plan_expect_from_batch   the per-request table an accepted batch must give, derived
 *                     from fiattn.h's definition of the three forms (not from the planner)
 *   tt_plan_snapshot  every byte the public view exposes (cta_starts included) and the
 *                     balance, to prove a rejected update changed nothing
 */
#ifndef FI_TEST_PLAN_CHECK_H
#define FI_TEST_PLAN_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "fiattn.h"

/* What the request table of a plan for `batch` must hold (fi_request_info per request). */
typedef struct tt_plan_expect {
    int32_t batch_size;
    int32_t total_q_tokens;
    const int32_t *q_len;    /* [B] */
    const int32_t *kv_len;   /* [B] */
    const int32_t *q_offset; /* [B] */
    const int32_t *page_row; /* [B] page_row_offset */
} tt_plan_expect;

/* Check every invariant of plan's current view for `batch` (the batch last accepted):
 * header fields, request table against *want, CSR ranges and CTA start records, each
 * output row written once, each visible key of each row read once (KV range of a row from
 * fiattn.h's causal / window_left definition), merge groups (consecutive slots in KV
 * order, pieces >= the floor, cuts on the KV tile), counts within workspace/layout.h's
 * bounds and the used plan bytes within the plan region, balance >= 1.
 * @return 0, or -1 with a message in msg[msz]. */
int tt_plan_check(const fi_plan *plan, const fi_batch *batch, const tt_plan_expect *want,
                  char *msg, size_t msz);

/* Arrays behind a tt_plan_expect derived from a batch. */
typedef struct tt_plan_expect_buf {
    tt_plan_expect e;
    int32_t *mem; /* one allocation, 4 * B */
} tt_plan_expect_buf;

/* Derive the expected request table of a batch the library accepted (fiattn.h fi_batch:
 * BLOCK_TABLES q_offset b*q, rows b*P*(1+split); INDPTR offsets from qo_indptr/kv_indptr;
 * CUM_SEQ_LENS diffs of the cumulative arrays).  @return 0, -1 out of memory. */
int tt_plan_expect_from_batch(const fi_batch *batch, tt_plan_expect_buf *out);
/* The request table fiattn.h defines for a sparse batch the library accepted (caps.sparse_top_k
 * = K = batch->max_pages_per_seq > 0): B x q_len requests of one query token, request
 * r = b * q_len + i {q_offset r, q_len 1, kv_len K, page_row_offset r * K}; and in *as_dense
 * the dense batch with that table (batch_size B x q_len, q_len_per_request 1), the batch
 * tt_plan_check walks.  @return 0, -1 out of memory. */
int tt_plan_expect_sparse(const fi_batch *batch, tt_plan_expect_buf *out, fi_batch *as_dense);
void tt_plan_expect_free(tt_plan_expect_buf *b);

/* Every byte of the plan's public view (the view struct, header, work_indptr, cta_starts,
 * items, groups, requests) and fi_plan_balance.  A plan without a view (FI_ERR_NOT_PLANNED)
 * gives a snapshot of the status alone. */
typedef struct tt_plan_snapshot {
    unsigned char *bytes;
    size_t len;
} tt_plan_snapshot;

/* @return 0, -1 out of memory (*s empty). */
int tt_plan_snapshot_take(const fi_plan *plan, tt_plan_snapshot *s);
/* @return -1 if equal, else the first differing byte (or the shorter length). */
long tt_plan_snapshot_diff(const tt_plan_snapshot *a, const tt_plan_snapshot *b);
void tt_plan_snapshot_free(tt_plan_snapshot *s);

#endif
