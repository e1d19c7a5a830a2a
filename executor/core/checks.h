/* executor/core/checks.h - tensor descriptor checks shared by the GPU families' prepare
 * functions and executor/core/run.c (host descriptors only; nothing is dereferenced). */
#ifndef FIATTN_EXECUTOR_CHECKS_H
#define FIATTN_EXECUTOR_CHECKS_H

#include "fiattn_run.h"

/* q-like tensor [>= rows, heads, dim] of `dtype`, 16-byte aligned rows.
 * @return FI_OK, FI_ERR_NULL_ARGUMENT, FI_ERR_UNSUPPORTED_DTYPE, FI_ERR_SHAPE_MISMATCH,
 *   FI_ERR_MISALIGNED_POINTER, FI_ERR_BAD_STRIDE. */
fi_status fi_gpu_check_rows(const fi_tensor *t, fi_dtype dtype, int64_t rows, int64_t heads,
                            int64_t dim);

/* Paged cache [>= num_pages, page_size, (1,) dim] of `dtype`; *stride_page / *stride_tok
 * on success.  Same statuses. */
fi_status fi_gpu_check_cache(const fi_tensor *t, fi_dtype dtype, const fi_caps *caps,
                             int64_t dim, int64_t *stride_page, int64_t *stride_tok);

#endif
