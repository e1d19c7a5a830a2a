/* executor/gqa/gqa_launch.cu - C ABI of the GQA family: run-time q dtype x KV dtype x
 * head_dim x (tile_rows <= 8) -> instantiation. */
#include "executor/gqa/gqa_launch.h"

#define FI_GQA_BY_DIM(tag)                                                                   \
    switch (p.g.head_dim) {                                                                  \
    case 64:                                                                                 \
        return (int)(rows8 ? fi_gqa_launch_##tag##_d64_rows8(p, enable_pdl, s)               \
                           : fi_gqa_launch_##tag##_d64(p, enable_pdl, s));                   \
    case 128:                                                                                \
        return (int)(rows8 ? fi_gqa_launch_##tag##_d128_rows8(p, enable_pdl, s)              \
                           : fi_gqa_launch_##tag##_d128(p, enable_pdl, s));                  \
    case 256:                                                                                \
        return (int)(rows8 ? fi_gqa_launch_##tag##_d256_rows8(p, enable_pdl, s)              \
                           : fi_gqa_launch_##tag##_d256(p, enable_pdl, s));                  \
    default: return (int)cudaErrorInvalidValue;                                              \
    }

extern "C" int fi_gqa_launch(const void *params, fi_dtype dtype, int enable_pdl, void *stream) {
    const fi_gqa_params &p = *static_cast<const fi_gqa_params *>(params);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const int k = p.g.kv_kind;
    /* every item of a plan has at most tile_rows rows (planner/tiles.h) */
    const int rows8 = p.c.tile_rows <= FI_GQA_SWAP_ROWS;
    if (dtype == FI_DTYPE_BF16 && k == 0)
        FI_GQA_BY_DIM(bf16)
    if (dtype == FI_DTYPE_BF16 && k == 1)
        FI_GQA_BY_DIM(bf16_e4m3)
    if (dtype == FI_DTYPE_BF16 && k == 2)
        FI_GQA_BY_DIM(bf16_nvfp4)
    if (dtype == FI_DTYPE_F16 && k == 0)
        FI_GQA_BY_DIM(f16)
    if (dtype == FI_DTYPE_F16 && k == 1)
        FI_GQA_BY_DIM(f16_e4m3)
    if (dtype == FI_DTYPE_F16 && k == 2)
        FI_GQA_BY_DIM(f16_nvfp4)
    return (int)cudaErrorInvalidValue;
}
