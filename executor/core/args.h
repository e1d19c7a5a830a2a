/*
 * executor/core/args.h - tensor checks shared by the GPU runner (fi_run, executor/run.c)
 * and the CPU references (fi_ref_run, fi_naive_attention): element sizes, q-like and
 * paged-cache shapes, pointer alignment, strides, and the page table against the plan.
 *
 * Each check reads only the fi_tensor descriptor (never the data) and returns the status
 * of the first rule broken; nothing is written.  Shapes: fiattn_run.h.
 */
#ifndef FIATTN_EXECUTOR_ARGS_H
#define FIATTN_EXECUTOR_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "fiattn_run.h"
#include "plan/page_table.h"

struct fi_plan;

/* Bytes of one element: F32 / I32 4, F16 / BF16 2, E4M3 / E5M2 1, E2M1 1 (its tensors
 * count bytes, two values each); 0 for any other value. */
size_t fi_dtype_size(fi_dtype dtype);

/* What an executor needs of a tensor's memory layout. */
typedef enum fi_layout_rule {
    /* CPU reference: the base aligned to the element size (it loads whole elements). */
    FI_LAYOUT_HOST = 0,
    /* GPU: also the base 16-byte aligned, the last stride 1 and every outer stride >= 0 and
     * a multiple of 16 bytes, so each row moves with 16-byte copies. */
    FI_LAYOUT_DEVICE = 1,
} fi_layout_rule;

/* t's layout under `rule` (t->ndim in 1..FI_MAX_DIMS, dtype with a size).
 * @return FI_OK; FI_ERR_SHAPE_MISMATCH (ndim out of range); FI_ERR_UNSUPPORTED_DTYPE
 *   (no element size); FI_ERR_MISALIGNED_POINTER; FI_ERR_BAD_STRIDE. */
fi_status fi_check_layout(const fi_tensor *t, fi_layout_rule rule);

/* A q-like tensor [>= rows, heads, dim] (q, q_rope, out), then its layout.  The dtype is
 * the caller's to check (the CPU takes any float type, the GPU the plan's).
 * @return FI_OK; FI_ERR_NULL_ARGUMENT (no data); FI_ERR_SHAPE_MISMATCH; a layout status. */
fi_status fi_check_rows(const fi_tensor *t, int64_t rows, int64_t heads, int64_t dim,
                        fi_layout_rule rule);

/* A paged cache [>= pages, page_size, heads, dim] (k, k_rope, v); with head_axis_optional
 * and heads 1 a 3-D [pages, page_size, dim] view is taken too.  Then its layout.
 * @return FI_OK; FI_ERR_NULL_ARGUMENT; FI_ERR_SHAPE_MISMATCH; a layout status. */
fi_status fi_check_cache(const fi_tensor *t, int64_t pages, int64_t page_size, int64_t heads,
                         int64_t dim, int head_axis_optional, fi_layout_rule rule);

/* The optional lse output [>= rows, heads] fp32 (NULL data: absent, FI_OK).  Its rows are
 * written one float at a time, so the GPU rule asks only a 4-byte base, a last stride of 1
 * and non-negative strides; the host rule the element alignment.
 * @return FI_OK; FI_ERR_UNSUPPORTED_DTYPE (not F32); FI_ERR_SHAPE_MISMATCH;
 *   FI_ERR_MISALIGNED_POINTER; FI_ERR_BAD_STRIDE. */
fi_status fi_check_lse(const fi_tensor *t, int64_t rows, int64_t heads, fi_layout_rule rule);

/* An optional fp32 scalar / vector argument (scale pointers, sinks): NULL, or 4-byte
 * aligned.  @return FI_OK or FI_ERR_MISALIGNED_POINTER. */
fi_status fi_check_f32_pointer(const float *p);

/* The page table against the geometry g of the batch it will be read with (plan/
 * page_table.h).  Rule: every element the plan makes the executor read lies inside the
 * view, and the view's strides are those the plan assumed.
 *   data NULL                                                   FI_ERR_NULL_ARGUMENT
 *   dtype not I32                                               FI_ERR_UNSUPPORTED_DTYPE
 *   base not 4-byte aligned                                     FI_ERR_MISALIGNED_POINTER
 *   BLOCK_TABLES / CUM_SEQ_LENS: ndim not 2 (3 for kv_split_pages), fewer than B rows,
 *     a [B, 2, P] middle axis not 2, fewer columns than the longest row reads;
 *   INDPTR: ndim not 1, fewer elements than the largest index read + 1
 *   sparse plans (g->sparse_q_len = q_len > 0): [>= B * q_len, >= K] as above, or
 *     [>= B, q_len, >= K] (middle axis exactly q_len)
 *                                                               FI_ERR_SHAPE_MISMATCH
 *   last stride not 1; row stride (B > 1) not P (2P for [B, 2, P]); middle stride not P;
 *     sparse [B, q_len, K]: middle stride (q_len > 1) not K, outer (B > 1) not q_len x K
 *                                                               FI_ERR_BAD_STRIDE
 * So a table declared [1, P] or [B, 1] for a batch that reads more, or an indptr [1], is
 * FI_ERR_SHAPE_MISMATCH. */
fi_status fi_check_page_table_geom(const fi_page_table_geom *g, const fi_tensor *page_table);

/* fi_check_page_table_geom against the geometry of the plan's current batch (recorded by
 * fi_plan_update).  @return those statuses; FI_ERR_NULL_ARGUMENT (NULL plan or tensor);
 * FI_ERR_NOT_PLANNED. */
fi_status fi_check_page_table(const struct fi_plan *plan, const fi_tensor *page_table);

#endif /* FIATTN_EXECUTOR_ARGS_H */
