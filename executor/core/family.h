/*
 * executor/core/family.h - what a GPU kernel family gives the runtime: a name, its
 * parameter-struct size, a host `prepare` that checks the family's own tensors and fills
 * its parameter struct, and a `launch` (C ABI over the CUDA instantiations).  Rows of
 * the registration table (executor/core/registry.c) point at one of these.
 *
 * A family's parameter struct starts with the common block (exec_params.h), which
 * executor/core/run.c fills and checks (plan region, out / lse, scales, sinks, page table)
 * before `prepare` sees it.
 */
#ifndef FIATTN_EXECUTOR_FAMILY_H
#define FIATTN_EXECUTOR_FAMILY_H

#include <stddef.h>

#include "executor/core/exec_params.h"
#include "fiattn_run.h"

/* The largest parameter struct a family may have (bytes): run.c keeps one on its stack. */
#define FI_FAMILY_MAX_PARAMS 1024

typedef struct fi_family {
    const char *name;
    size_t params_bytes; /* sizeof the family's parameter struct (<= FI_FAMILY_MAX_PARAMS) */
    /* Check the family's tensors of `args` against the plan (caps, current header) and
     * fill `params` (params_bytes, 16-byte aligned), whose common block `common` already
     * holds.  Reads host descriptors only (never device memory): capturable.
     * @return FI_OK, or the status of the first mismatch (nothing launched then). */
    fi_status (*prepare)(const struct fi_plan *plan, const fi_attn_args *args,
                         const fi_exec_common *common, void *params);
    /* Launch the persistent kernel of `params` for dtype (q / kv / out of the plan) on
     * stream (cudaStream_t), with programmatic dependent launch when enable_pdl.
     * @return a cudaError_t value: 0; cudaErrorInvalidValue for a dtype the family has no
     *   instantiation of; cudaErrorCooperativeLaunchTooLarge when num_ctas exceeds what
     *   the current device holds resident (nothing launched); a launch error. */
    int (*launch)(const void *params, fi_dtype dtype, int enable_pdl, void *stream);
} fi_family;

#endif /* FIATTN_EXECUTOR_FAMILY_H */
