/* executor/context/ctx_launch.h - the context family's instantiations (one per .cu: q
 * dtype x KV dtype (the q dtype, fp8 e4m3 or NVFP4) x head_dim) and its C ABI launcher
 * (ctx_launch.cu), which family.h's `launch` points at. */
#pragma once

#include "executor/context/ctx_params.h"
#include "fiattn.h"

/* The tile height of the family's kernels (executor/context/ctx_tile.cuh): its registry
 * rows must plan 128-row tiles. */
#define FI_CTX_TILE_ROWS 128

#ifdef __cplusplus
#include <cuda_runtime.h>
#define FI_CTX_DECLARE(tag)                                                                  \
    cudaError_t fi_ctx_launch_##tag(const fi_ctx_params &p, int enable_pdl, cudaStream_t stream);
FI_CTX_DECLARE(bf16_d64)
FI_CTX_DECLARE(bf16_d128)
FI_CTX_DECLARE(bf16_d256)
FI_CTX_DECLARE(f16_d64)
FI_CTX_DECLARE(f16_d128)
FI_CTX_DECLARE(f16_d256)
FI_CTX_DECLARE(bf16_e4m3_d64)
FI_CTX_DECLARE(bf16_e4m3_d128)
FI_CTX_DECLARE(bf16_e4m3_d256)
FI_CTX_DECLARE(f16_e4m3_d64)
FI_CTX_DECLARE(f16_e4m3_d128)
FI_CTX_DECLARE(f16_e4m3_d256)
FI_CTX_DECLARE(bf16_nvfp4_d64)
FI_CTX_DECLARE(bf16_nvfp4_d128)
FI_CTX_DECLARE(bf16_nvfp4_d256)
FI_CTX_DECLARE(f16_nvfp4_d64)
FI_CTX_DECLARE(f16_nvfp4_d128)
FI_CTX_DECLARE(f16_nvfp4_d256)
#undef FI_CTX_DECLARE
extern "C" {
#endif

/* fi_family.launch of the context family: params is a fi_ctx_params (its head_dim and
 * kv_kind (0: the q dtype, 1: fp8 e4m3, 2: NVFP4) pick the instantiation); dtype (q) bf16
 * or fp16, else cudaErrorInvalidValue.  See executor/core/family.h. */
int fi_ctx_launch(const void *params, fi_dtype dtype, int enable_pdl, void *stream);

#ifdef __cplusplus
}
#endif
