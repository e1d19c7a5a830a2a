/* executor/context/ctx_launch.cu - C ABI of the context family: run-time q dtype x KV kind
 * x head_dim -> instantiation. */
#include "executor/context/ctx_launch.h"

#define FI_CTX_BY_DIM(tag)                                                                   \
    switch (p.g.head_dim) {                                                                  \
    case 64: return (int)fi_ctx_launch_##tag##_d64(p, enable_pdl, s);                         \
    case 128: return (int)fi_ctx_launch_##tag##_d128(p, enable_pdl, s);                       \
    case 256: return (int)fi_ctx_launch_##tag##_d256(p, enable_pdl, s);                       \
    default: return (int)cudaErrorInvalidValue;                                              \
    }

extern "C" int fi_ctx_launch(const void *params, fi_dtype dtype, int enable_pdl, void *stream) {
    const fi_ctx_params &p = *static_cast<const fi_ctx_params *>(params);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (p.g.kv_kind == 0 && dtype == FI_DTYPE_BF16)
        FI_CTX_BY_DIM(bf16)
    if (p.g.kv_kind == 0 && dtype == FI_DTYPE_F16)
        FI_CTX_BY_DIM(f16)
    if (p.g.kv_kind == 1 && dtype == FI_DTYPE_BF16)
        FI_CTX_BY_DIM(bf16_e4m3)
    if (p.g.kv_kind == 1 && dtype == FI_DTYPE_F16)
        FI_CTX_BY_DIM(f16_e4m3)
    if (p.g.kv_kind == 2 && dtype == FI_DTYPE_BF16)
        FI_CTX_BY_DIM(bf16_nvfp4)
    if (p.g.kv_kind == 2 && dtype == FI_DTYPE_F16)
        FI_CTX_BY_DIM(f16_nvfp4)
    return (int)cudaErrorInvalidValue;
}
