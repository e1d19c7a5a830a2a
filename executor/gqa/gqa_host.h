/*
 * executor/gqa/gqa_host.h - the GQA family's host-side tensor checks, shared with the
 * context family (executor/context/), whose kernels take the same tensors (q [q_tokens,
 * H_q, D]; k / v paged views [num_pages, page_size, H_kv, D] in any NHD / HND / one-tensor /
 * (K, V)-pair strides; NVFP4 k_sf / v_sf) in the same parameter struct (gqa_params.h).
 */
#ifndef FIATTN_EXECUTOR_GQA_HOST_H
#define FIATTN_EXECUTOR_GQA_HOST_H

#include "executor/core/exec_params.h"
#include "fiattn_run.h"

struct fi_plan;

/* Check a's q, k, v (and NVFP4 k_sf / v_sf) against the plan (caps, current header) and
 * fill params (a fi_gqa_params, 16-byte aligned) from them and common.  The caller has
 * checked the caps against what its kernels run.  Reads host descriptors only.
 * @return FI_OK; FI_ERR_UNSUPPORTED_DTYPE (q or KV not the plan's dtype; k_sf / v_sf not
 *   E4M3), FI_ERR_SHAPE_MISMATCH, FI_ERR_BAD_STRIDE, FI_ERR_MISALIGNED_POINTER,
 *   FI_ERR_NULL_ARGUMENT (a required tensor or NVFP4 scale absent), FI_ERR_INVALID_ARGUMENT
 *   (block scales given for a KV dtype other than NVFP4); params untouched then. */
fi_status fi_gqa_fill_params(const struct fi_plan *plan, const fi_attn_args *a,
                             const fi_exec_common *common, void *params);

#endif /* FIATTN_EXECUTOR_GQA_HOST_H */
