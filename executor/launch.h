/*
 * executor/launch.h - C ABI of the CUDA launchers (implemented in executor/cuda/mla_launch.cu),
 * called by executor/run.c once every tensor was checked against the plan.
 */
#ifndef FIATTN_EXECUTOR_LAUNCH_H
#define FIATTN_EXECUTOR_LAUNCH_H

#include "executor/mla_params.h"
#include "fiattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Launch the persistent MLA decode executor: grid = params->num_ctas CTAs of 256 threads,
 * about 190 KB of dynamic shared memory each.  dtype: FI_DTYPE_BF16 or FI_DTYPE_F16 (q, kv
 * and out share it).  enable_pdl: launch with programmatic stream serialization.
 * stream: cudaStream_t.  Graph-capturable.
 * @return a cudaError_t value (0 = cudaSuccess); an unsupported dtype gives
 *   cudaErrorInvalidValue. */
int fi_launch_mla_decode(const fi_mla_params *params, fi_dtype dtype, int enable_pdl,
                         void *stream);

#ifdef __cplusplus
}
#endif
#endif /* FIATTN_EXECUTOR_LAUNCH_H */
