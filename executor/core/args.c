/* executor/core/args.c - tensor checks shared by fi_run and the CPU references (args.h). */
#include "executor/core/args.h"

#include "plan/plan.h"

size_t fi_dtype_size(fi_dtype dtype) {
    switch (dtype) {
    case FI_DTYPE_F32:
    case FI_DTYPE_I32: return 4;
    case FI_DTYPE_F16:
    case FI_DTYPE_BF16: return 2;
    case FI_DTYPE_E4M3:
    case FI_DTYPE_E5M2:
    case FI_DTYPE_E2M1: return 1; /* E2M1 tensors are described in bytes (two values each) */
    }
    return 0;
}

fi_status fi_check_layout(const fi_tensor *t, fi_layout_rule rule) {
    if (t->ndim < 1 || t->ndim > FI_MAX_DIMS)
        return FI_ERR_SHAPE_MISMATCH;
    const int64_t elem = (int64_t)fi_dtype_size(t->dtype);
    if (elem == 0)
        return FI_ERR_UNSUPPORTED_DTYPE;
    const uintptr_t align = rule == FI_LAYOUT_DEVICE ? 16u : (uintptr_t)elem;
    if ((uintptr_t)t->data % align != 0)
        return FI_ERR_MISALIGNED_POINTER;
    if (rule == FI_LAYOUT_HOST)
        return FI_OK;
    if (t->stride[t->ndim - 1] != 1)
        return FI_ERR_BAD_STRIDE;
    for (int32_t i = 0; i < t->ndim - 1; i++)
        if (t->stride[i] < 0 || (t->stride[i] * elem) % 16 != 0)
            return FI_ERR_BAD_STRIDE;
    return FI_OK;
}

fi_status fi_check_rows(const fi_tensor *t, int64_t rows, int64_t heads, int64_t dim,
                        fi_layout_rule rule) {
    if (!t->data)
        return FI_ERR_NULL_ARGUMENT;
    if (t->ndim != 3 || t->shape[0] < rows || t->shape[1] != heads || t->shape[2] != dim)
        return FI_ERR_SHAPE_MISMATCH;
    return fi_check_layout(t, rule);
}

fi_status fi_check_cache(const fi_tensor *t, int64_t pages, int64_t page_size, int64_t heads,
                         int64_t dim, int head_axis_optional, fi_layout_rule rule) {
    if (!t->data)
        return FI_ERR_NULL_ARGUMENT;
    const int three_d = head_axis_optional && heads == 1 && t->ndim == 3;
    if (!three_d && (t->ndim != 4 || t->shape[2] != heads))
        return FI_ERR_SHAPE_MISMATCH;
    if (t->shape[0] < pages || t->shape[1] != page_size || t->shape[t->ndim - 1] != dim)
        return FI_ERR_SHAPE_MISMATCH;
    return fi_check_layout(t, rule);
}

fi_status fi_check_lse(const fi_tensor *t, int64_t rows, int64_t heads, fi_layout_rule rule) {
    if (!t->data)
        return FI_OK;
    if (t->dtype != FI_DTYPE_F32)
        return FI_ERR_UNSUPPORTED_DTYPE;
    if (t->ndim != 2 || t->shape[0] < rows || t->shape[1] != heads)
        return FI_ERR_SHAPE_MISMATCH;
    const fi_status st = fi_check_layout(t, FI_LAYOUT_HOST); /* 4-byte base */
    if (st != FI_OK || rule == FI_LAYOUT_HOST)
        return st;
    return t->stride[1] == 1 && t->stride[0] >= 0 ? FI_OK : FI_ERR_BAD_STRIDE;
}

fi_status fi_check_f32_pointer(const float *p) {
    return (uintptr_t)p % sizeof(float) == 0 ? FI_OK : FI_ERR_MISALIGNED_POINTER;
}

/* kv_indices [>= extent], contiguous. */
static fi_status check_indptr_table(const fi_page_table_geom *g, const fi_tensor *t) {
    if (t->ndim != 1 || t->shape[0] < g->extent)
        return FI_ERR_SHAPE_MISMATCH;
    return t->stride[0] == 1 ? FI_OK : FI_ERR_BAD_STRIDE;
}

/* A sparse plan's table as [>= B, q_len, >= K]: its [B * q_len, K] rows, q_len a batch
 * request, so row r = b * q_len + i sits at b * stride[0] + i * stride[1] = r * K. */
static fi_status check_sparse_table3(const fi_page_table_geom *g, const fi_tensor *t) {
    const int64_t q = g->sparse_q_len, B = g->rows / q;
    if (t->shape[0] < B || t->shape[1] != q || t->shape[2] < g->max_cols)
        return FI_ERR_SHAPE_MISMATCH;
    if (t->stride[2] != 1 || (q > 1 && t->stride[1] != g->row_stride) ||
        (B > 1 && t->stride[0] != q * g->row_stride))
        return FI_ERR_BAD_STRIDE;
    return FI_OK;
}

/* block_tables [>= B, (2,) >= max_cols] with the row (and middle) stride the plan used. */
static fi_status check_block_table(const fi_page_table_geom *g, const fi_tensor *t) {
    if (g->sparse_q_len > 0 && t->ndim == 3)
        return check_sparse_table3(g, t);
    const int32_t ndim = g->kv_split_pages ? 3 : 2;
    if (t->ndim != ndim || t->shape[0] < g->rows || t->shape[ndim - 1] < g->max_cols ||
        (g->kv_split_pages && t->shape[1] != 2))
        return FI_ERR_SHAPE_MISMATCH;
    if (t->stride[ndim - 1] != 1 || (g->rows > 1 && t->stride[0] != g->row_stride) ||
        (g->kv_split_pages && t->stride[1] != g->pages_per_row))
        return FI_ERR_BAD_STRIDE;
    return FI_OK;
}

fi_status fi_check_page_table_geom(const fi_page_table_geom *g, const fi_tensor *page_table) {
    if (!page_table->data)
        return FI_ERR_NULL_ARGUMENT;
    if (page_table->dtype != FI_DTYPE_I32)
        return FI_ERR_UNSUPPORTED_DTYPE;
    if ((uintptr_t)page_table->data % sizeof(int32_t) != 0)
        return FI_ERR_MISALIGNED_POINTER;
    return g->form == FI_FORM_INDPTR ? check_indptr_table(g, page_table)
                                     : check_block_table(g, page_table);
}

fi_status fi_check_page_table(const struct fi_plan *plan, const fi_tensor *page_table) {
    if (!plan || !page_table)
        return FI_ERR_NULL_ARGUMENT;
    if (!plan->planned)
        return FI_ERR_NOT_PLANNED;
    return fi_check_page_table_geom(&plan->page_table, page_table);
}
