/* executor/mla/mla_launch.h - the MLA family's instantiations (one per .cu) and its C ABI
 * launcher (mla_launch.cu), which family.h's `launch` points at. */
#pragma once

#include "executor/mla/mla_params.h"
#include "fiattn.h"

#ifdef __cplusplus
#include <cuda_runtime.h>
cudaError_t fi_mla_launch_bf16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream);
cudaError_t fi_mla_launch_f16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream);
cudaError_t fi_mla_launch_e4m3(const fi_mla_params &p, int enable_pdl, cudaStream_t stream);
cudaError_t fi_mla_wg_launch_bf16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream);
cudaError_t fi_mla_wg_launch_f16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream);
cudaError_t fi_mla_wg_launch_e4m3(const fi_mla_params &p, int enable_pdl, cudaStream_t stream);
cudaError_t fi_mla_wg8_launch(const fi_mla_params &p, int enable_pdl, cudaStream_t stream);
cudaError_t fi_mla_wg64_launch_bf16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream);
cudaError_t fi_mla_wg64_launch_f16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream);
cudaError_t fi_mla_wgt_launch_e4m3(const fi_mla_params &p, int enable_pdl, cudaStream_t stream);
cudaError_t fi_mla_wgt16_launch_bf16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream);
cudaError_t fi_mla_wgt16_launch_f16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream);
extern "C" {
#endif

/* fi_family.launch of the MLA family: params is a fi_mla_params; dtype bf16 or fp16
 * (else cudaErrorInvalidValue; both launchers run an fp8 cache (params' kv_e4m3) whatever
 * dtype says).  See executor/core/family.h. */
int fi_mla_launch(const void *params, fi_dtype dtype, int enable_pdl, void *stream);
/* The same for the wgmma variant (mla_wg_tile.cuh). */
int fi_mla_wg_launch(const void *params, fi_dtype dtype, int enable_pdl, void *stream);
/* The same for the 64-token wgmma variant (mla_wg64_tile.cuh; 16-bit caches only). */
int fi_mla_wg64_launch(const void *params, fi_dtype dtype, int enable_pdl, void *stream);
/* The same for the transposed fp8 body (mla_wgt_tile.cuh; q and cache fp8 e4m3 only, else
 * cudaErrorInvalidValue). */
int fi_mla_wgt_launch(const void *params, fi_dtype dtype, int enable_pdl, void *stream);
/* The same for the transposed 16-bit body (mla_wgt16_tile.cuh; q, cache and out bf16 or
 * fp16, else cudaErrorInvalidValue). */
int fi_mla_wgt16_launch(const void *params, fi_dtype dtype, int enable_pdl, void *stream);

#ifdef __cplusplus
}
#endif
