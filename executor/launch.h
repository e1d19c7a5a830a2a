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
 * 227 KB of dynamic shared memory each.  KV blocks reach shared memory by bulk copies (one
 * or two a token), streamed across each CTA's items.  dtype: FI_DTYPE_BF16 or FI_DTYPE_F16
 * (q, kv and out share it).  enable_pdl: launch with programmatic stream serialization.
 * stream: cudaStream_t.  Graph-capturable.
 * @return a cudaError_t value (0 = cudaSuccess); an unsupported dtype gives
 *   cudaErrorInvalidValue; num_ctas above what the device holds resident at once (SMs x
 *   occupancy; the in-kernel cooperative merge waits on other CTAs) gives
 *   cudaErrorCooperativeLaunchTooLarge, nothing launched. */
int fi_launch_mla_decode(const fi_mla_params *params, fi_dtype dtype, int enable_pdl,
                         void *stream);

#ifdef __cplusplus
}
#endif
#endif /* FIATTN_EXECUTOR_LAUNCH_H */
