/*
 * plan/mask.h - the mask rule, in one place for the host (planner, CPU references) and the
 * device (kernels): which keys a query row sees (docs/DESIGN.md section 7).
 *
 * Request with q_len query rows and kv_len keys; query row i (0-based) sits at position
 * p = kv_len - q_len + i (the query block is aligned to the end of the KV range).  It sees
 * keys [lo, hi) with
 *     lo = window_left >= 0 ? max(0, p - window_left) : 0
 *     hi = causal ? min(p + 1, kv_len) : kv_len
 * and none when hi <= lo.  Both ends are non-decreasing in i and a row's range starts no
 * later than the previous row's ends, so the keys of rows [q_begin, q_end) form one range.
 *
 * Plain C11 and CUDA C++ (FI_HOST_DEVICE); no allocation, no error: callers pass
 * validated lengths (fiattn.h fi_batch_validate), int32 in and out, int64 inside.
 */
#ifndef FIATTN_PLAN_MASK_H
#define FIATTN_PLAN_MASK_H

#include <stdint.h>

#include "plan/hd.h"

/* First key seen from position p (int64: p may be negative): max(0, p - window_left), or 0
 * without a window. */
FI_HOST_DEVICE int64_t fi_mask_lo(int32_t window_left, int64_t p) {
    const int64_t l = window_left >= 0 ? p - window_left : 0;
    return l > 0 ? l : 0;
}

/* One past the last key seen from position p: min(p + 1, kv_len) when causal, else kv_len. */
FI_HOST_DEVICE int64_t fi_mask_hi(int32_t causal, int32_t kv_len, int64_t p) {
    return causal && p + 1 < kv_len ? p + 1 : kv_len;
}

/* Keys [*lo, *hi) seen by query row i of a request of q_len rows and kv_len keys, under
 * causal (0 / 1) and window_left (-1: unlimited).  An empty range has *lo == *hi (not
 * necessarily 0). */
FI_HOST_DEVICE void fi_row_kv_range(int32_t causal, int32_t window_left, int32_t q_len,
                                    int32_t kv_len, int32_t i, int32_t *lo, int32_t *hi) {
    const int64_t p = (int64_t)kv_len - q_len + i;
    const int64_t l = fi_mask_lo(window_left, p), h = fi_mask_hi(causal, kv_len, p);
    *lo = (int32_t)l;
    *hi = (int32_t)(h > l ? h : l);
}

/* Keys [*lo, *hi) seen by any of the query rows [q_begin, q_end) (q_begin < q_end): the
 * first row's start to the last row's end; *lo == *hi == 0 when no row sees a key.  Exact
 * for validated batches (a causal request has kv_len 0 or kv_len >= q_len, so no row before
 * a seeing row is blind). */
FI_HOST_DEVICE void fi_tile_kv_range(int32_t causal, int32_t window_left, int32_t q_len,
                                     int32_t kv_len, int32_t q_begin, int32_t q_end,
                                     int32_t *lo, int32_t *hi) {
    const int64_t p0 = (int64_t)kv_len - q_len + q_begin, p1 = (int64_t)kv_len - q_len + q_end - 1;
    const int64_t l = fi_mask_lo(window_left, p0), h = fi_mask_hi(causal, kv_len, p1);
    *lo = l < h ? (int32_t)l : 0;
    *hi = l < h ? (int32_t)h : 0;
}

#endif /* FIATTN_PLAN_MASK_H */
