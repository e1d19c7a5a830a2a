/* executor/gqa/gqa_launch.h - the GQA family's instantiations (one per .cu: q dtype x KV
 * dtype (the q dtype, fp8 e4m3 or NVFP4) x head_dim, each also as a rows-8 kernel) and its
 * C ABI launcher (gqa_launch.cu), which family.h's `launch` points at. */
#pragma once

#include "executor/gqa/gqa_params.h"
#include "fiattn.h"

#ifdef __cplusplus
#include <cuda_runtime.h>
#define FI_GQA_DECLARE(tag)                                                                  \
    cudaError_t fi_gqa_launch_##tag(const fi_gqa_params &p, int enable_pdl, cudaStream_t stream);
FI_GQA_DECLARE(bf16_d64)
FI_GQA_DECLARE(bf16_d128)
FI_GQA_DECLARE(bf16_d256)
FI_GQA_DECLARE(f16_d64)
FI_GQA_DECLARE(f16_d128)
FI_GQA_DECLARE(f16_d256)
FI_GQA_DECLARE(bf16_e4m3_d64)
FI_GQA_DECLARE(bf16_e4m3_d128)
FI_GQA_DECLARE(bf16_e4m3_d256)
FI_GQA_DECLARE(f16_e4m3_d64)
FI_GQA_DECLARE(f16_e4m3_d128)
FI_GQA_DECLARE(f16_e4m3_d256)
FI_GQA_DECLARE(bf16_nvfp4_d64)
FI_GQA_DECLARE(bf16_nvfp4_d128)
FI_GQA_DECLARE(bf16_nvfp4_d256)
FI_GQA_DECLARE(f16_nvfp4_d64)
FI_GQA_DECLARE(f16_nvfp4_d128)
FI_GQA_DECLARE(f16_nvfp4_d256)
/* ... and the same for plans of items of at most FI_GQA_SWAP_ROWS rows (GqaRows8Family) */
FI_GQA_DECLARE(bf16_d64_rows8)
FI_GQA_DECLARE(bf16_d128_rows8)
FI_GQA_DECLARE(bf16_d256_rows8)
FI_GQA_DECLARE(bf16_e4m3_d64_rows8)
FI_GQA_DECLARE(bf16_e4m3_d128_rows8)
FI_GQA_DECLARE(bf16_e4m3_d256_rows8)
FI_GQA_DECLARE(bf16_nvfp4_d64_rows8)
FI_GQA_DECLARE(bf16_nvfp4_d128_rows8)
FI_GQA_DECLARE(bf16_nvfp4_d256_rows8)
FI_GQA_DECLARE(f16_d64_rows8)
FI_GQA_DECLARE(f16_d128_rows8)
FI_GQA_DECLARE(f16_d256_rows8)
FI_GQA_DECLARE(f16_e4m3_d64_rows8)
FI_GQA_DECLARE(f16_e4m3_d128_rows8)
FI_GQA_DECLARE(f16_e4m3_d256_rows8)
FI_GQA_DECLARE(f16_nvfp4_d64_rows8)
FI_GQA_DECLARE(f16_nvfp4_d128_rows8)
FI_GQA_DECLARE(f16_nvfp4_d256_rows8)
#undef FI_GQA_DECLARE
extern "C" {
#endif

/* fi_family.launch of the GQA family: params is a fi_gqa_params (its head_dim and kv_kind
 * pick the instantiation, and a plan of tile_rows <= FI_GQA_SWAP_ROWS the rows-8 kernel:
 * the tile_rows of the plan's registry row, fixed at plan creation, so a captured graph
 * keeps a valid kernel across updates); dtype (q) bf16 or fp16, else
 * cudaErrorInvalidValue.  See executor/core/family.h. */
int fi_gqa_launch(const void *params, fi_dtype dtype, int enable_pdl, void *stream);

#ifdef __cplusplus
}
#endif
