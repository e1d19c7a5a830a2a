/* executor/core/checks.c - see checks.h. */
#include "executor/core/checks.h"

#include <stdint.h>

static int64_t elem_bytes(fi_dtype d) {
    switch (d) {
    case FI_DTYPE_F32:
    case FI_DTYPE_I32: return 4;
    case FI_DTYPE_F16:
    case FI_DTYPE_BF16: return 2;
    case FI_DTYPE_E4M3: return 1;
    default: return 0;
    }
}

/* Base 16-byte aligned, last stride 1, outer strides non-negative multiples of 16 bytes. */
static fi_status check_layout(const fi_tensor *t) {
    const int64_t eb = elem_bytes(t->dtype);
    if (((uintptr_t)t->data & 15u) != 0)
        return FI_ERR_MISALIGNED_POINTER;
    if (t->stride[t->ndim - 1] != 1)
        return FI_ERR_BAD_STRIDE;
    for (int i = 0; i < t->ndim - 1; ++i)
        if (t->stride[i] < 0 || (t->stride[i] * eb) % 16 != 0)
            return FI_ERR_BAD_STRIDE;
    return FI_OK;
}

fi_status fi_gpu_check_rows(const fi_tensor *t, fi_dtype dtype, int64_t rows, int64_t heads,
                            int64_t dim) {
    if (!t->data)
        return FI_ERR_NULL_ARGUMENT;
    if (t->dtype != dtype)
        return FI_ERR_UNSUPPORTED_DTYPE;
    if (t->ndim != 3 || t->shape[0] < rows || t->shape[1] != heads || t->shape[2] != dim)
        return FI_ERR_SHAPE_MISMATCH;
    return check_layout(t);
}

fi_status fi_gpu_check_cache(const fi_tensor *t, fi_dtype dtype, const fi_caps *caps,
                             int64_t dim, int64_t *stride_page, int64_t *stride_tok) {
    if (!t->data)
        return FI_ERR_NULL_ARGUMENT;
    if (t->dtype != dtype)
        return FI_ERR_UNSUPPORTED_DTYPE;
    if (t->ndim == 4) {
        if (t->shape[2] != 1)
            return FI_ERR_SHAPE_MISMATCH;
    } else if (t->ndim != 3) {
        return FI_ERR_SHAPE_MISMATCH;
    }
    if (t->shape[0] < caps->num_pages || t->shape[1] != caps->page_size ||
        t->shape[t->ndim - 1] != dim)
        return FI_ERR_SHAPE_MISMATCH;
    const fi_status st = check_layout(t);
    if (st != FI_OK)
        return st;
    *stride_page = t->stride[0];
    *stride_tok = t->stride[1];
    return FI_OK;
}
