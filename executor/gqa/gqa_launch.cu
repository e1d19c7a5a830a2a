/* executor/gqa/gqa_launch.cu - C ABI of the GQA family: run-time q dtype x KV dtype x
 * head_dim -> instantiation. */
#include "executor/gqa/gqa_launch.h"

#define FI_GQA_BY_DIM(tag)                                                                   \
    switch (p.g.head_dim) {                                                                  \
    case 64: return (int)fi_gqa_launch_##tag##_d64(p, enable_pdl, s);                         \
    case 128: return (int)fi_gqa_launch_##tag##_d128(p, enable_pdl, s);                       \
    case 256: return (int)fi_gqa_launch_##tag##_d256(p, enable_pdl, s);                       \
    default: return (int)cudaErrorInvalidValue;                                              \
    }

extern "C" int fi_gqa_launch(const void *params, fi_dtype dtype, int enable_pdl, void *stream) {
    const fi_gqa_params &p = *static_cast<const fi_gqa_params *>(params);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const int k = p.g.kv_kind;
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
