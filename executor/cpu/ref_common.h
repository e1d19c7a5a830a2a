/*
 * executor/cpu/ref_common.h - small helpers shared by the two CPU references
 * (naive.c: fp64, no plan; ref_run.c: fp32, runs the plan): strided element access in
 * F32 / F16 / BF16 and page lookup (a query row's visible keys: plan/mask.h).
 *
 * Tensor indices are logical (fiattn_run.h shapes); strides are in elements, so NHD and
 * HND KV caches, and the 512 + 64 views of a concatenated MLA tensor, need no special case.
 */
#ifndef FIATTN_CPU_REF_COMMON_H
#define FIATTN_CPU_REF_COMMON_H

#include <stdint.h>

#include "executor/cpu/dtype_convert.h"
#include "fiattn_run.h"
#include "plan/mask.h" /* fi_row_kv_range: a query row's visible keys */

/* Element offset of a logical index in a 2/3/4-D view. */
static inline int64_t fi_off2(const fi_tensor *t, int64_t i0, int64_t i1) {
    return i0 * t->stride[0] + i1 * t->stride[1];
}
static inline int64_t fi_off3(const fi_tensor *t, int64_t i0, int64_t i1, int64_t i2) {
    return i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2];
}
static inline int64_t fi_off4(const fi_tensor *t, int64_t i0, int64_t i1, int64_t i2,
                              int64_t i3) {
    return i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2] + i3 * t->stride[3];
}

/* Element `off` of a F32 / F16 / BF16 / E4M3 / E5M2 tensor, widened to fp32 (exact). */
static inline float fi_elem_load(const fi_tensor *t, int64_t off) {
    switch (t->dtype) {
    case FI_DTYPE_F32: return ((const float *)t->data)[off];
    case FI_DTYPE_F16: return fi_f16_to_f32(((const uint16_t *)t->data)[off]);
    case FI_DTYPE_BF16: return fi_bf16_to_f32(((const uint16_t *)t->data)[off]);
    case FI_DTYPE_E4M3: return fi_e4m3_to_f32(((const uint8_t *)t->data)[off]);
    case FI_DTYPE_E5M2: return fi_e5m2_to_f32(((const uint8_t *)t->data)[off]);
    default: return NAN; /* rejected by fi_cpu_check_args before any load */
    }
}

/* Store v at element `off`, rounding to nearest even for F16 / BF16. */
static inline void fi_elem_store(const fi_tensor *t, int64_t off, float v) {
    switch (t->dtype) {
    case FI_DTYPE_F32: ((float *)t->data)[off] = v; break;
    case FI_DTYPE_F16: ((uint16_t *)t->data)[off] = fi_f32_to_f16_rne(v); break;
    case FI_DTYPE_BF16: ((uint16_t *)t->data)[off] = fi_f32_to_bf16_rne(v); break;
    default: break;
    }
}

/* n consecutive elements of the last dimension starting at `off`, as fp32. */
static inline void fi_row_load(const fi_tensor *t, int64_t off, int32_t n, float *dst) {
    const int64_t s = t->stride[t->ndim - 1];
    for (int32_t d = 0; d < n; ++d) dst[d] = fi_elem_load(t, off + d * s);
}

/* Page holding request-local KV token `t`: page_table[row_offset + t / page_size]
 * (row_offset = fi_request_info.page_row_offset, + pages_per_row for the V row of a
 * [B, 2, P] table).  The slot inside the page is t % page_size. */
static inline int32_t fi_kv_page(const int32_t *page_table, int32_t row_offset,
                                 int32_t page_size, int32_t t) {
    return page_table[row_offset + t / page_size];
}

/* max(a, b) that keeps a NaN of either (fmaxf would drop it: fiattn_run.h's NaN policy). */
static inline float fi_max_nan_f(float a, float b) { return (a > b || a != a) ? a : b; }
static inline double fi_max_nan_d(double a, double b) { return (a > b || a != a) ? a : b; }

/* Dimensions of one run, derived from the caps (kind-specific widths). */
typedef struct fi_cpu_geom {
    int32_t mla;       /* 1: MLA (q_nope.ckv + q_pe.kpe, V = ckv) */
    int32_t num_qo_heads, num_kv_heads, group, page_size;
    int32_t d_main;    /* width of q and k: head_dim_qk, MLA 512 (q_nope / ckv) */
    int32_t d_rope;    /* MLA 64 (q_pe / kpe), else 0 */
    int32_t d_vo;      /* width of v and out */
} fi_cpu_geom;

/* Check the run arguments but the page table (executor/core/args.h checks that against
 * the batch) against the caps before anything is written: required pointers (q, k, out;
 * MLA q_rope + k_rope; others v), dtypes (inputs F32/F16/BF16/E4M3/E5M2, not E2M1; out
 * F32/F16/BF16; lse F32),
 * logical shapes (q/out/lse at least q_tokens rows, k/v at least caps->num_pages pages),
 * bases aligned to their element size, and the scale / sink pointers to 4 bytes.
 * @return FI_OK and *geom, or FI_ERR_NULL_ARGUMENT / FI_ERR_UNSUPPORTED_DTYPE /
 *   FI_ERR_SHAPE_MISMATCH / FI_ERR_MISALIGNED_POINTER. */
fi_status fi_cpu_check_args(const fi_caps *caps, const fi_attn_args *args, int32_t q_tokens,
                            fi_cpu_geom *geom);

/* bmm1 / bmm2 scale of a run: the pointer, when given, overrides the value. */
static inline float fi_cpu_bmm1_scale(const fi_attn_args *a) {
    return a->bmm1_scale_ptr ? *a->bmm1_scale_ptr : a->bmm1_scale;
}
static inline float fi_cpu_bmm2_scale(const fi_attn_args *a) {
    return a->bmm2_scale_ptr ? *a->bmm2_scale_ptr : a->bmm2_scale;
}

#endif /* FIATTN_CPU_REF_COMMON_H */
