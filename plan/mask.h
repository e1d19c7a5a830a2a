/*
 * plan/mask.h - the mask rule, in one place for the planner, the CPU references and the
 * GPU kernels (C11 and CUDA C++).
 *
 * Query row i (0-based) of a request with q_len rows and kv_len keys sits at position
 * p = kv_len - q_len + i (the query block is aligned to the end of the KV range).  It sees
 * keys [lo, hi): hi = p + 1 when causal, else kv_len; lo = p - window_left when
 * window_left >= 0, else 0; both clamped to [0, kv_len], and hi >= lo (empty: lo == hi).
 */
#ifndef FIATTN_PLAN_MASK_H
#define FIATTN_PLAN_MASK_H

#include <stdint.h>

#ifdef __CUDACC__
#define FI_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FI_HOST_DEVICE static inline
#endif

/* Keys [*lo, *hi) seen by query row i; see the rule above. */
FI_HOST_DEVICE void fi_row_kv_range(int32_t causal, int32_t window_left, int32_t q_len,
                                    int32_t kv_len, int32_t i, int32_t *lo, int32_t *hi) {
    const int64_t p = (int64_t)kv_len - q_len + i;
    int64_t h = causal ? p + 1 : kv_len;
    int64_t l = window_left >= 0 ? p - window_left : 0;
    if (h > kv_len)
        h = kv_len;
    if (l < 0)
        l = 0;
    if (h < l)
        h = l;
    *lo = (int32_t)l;
    *hi = (int32_t)h;
}

#endif /* FIATTN_PLAN_MASK_H */
