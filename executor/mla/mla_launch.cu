/* executor/mla/mla_launch.cu - C ABI of the MLA family's two tile bodies: run-time dtype ->
 * instantiation (an fp8 cache: each body's own, whatever q's dtype). */
#include "executor/mla/mla_launch.h"

extern "C" int fi_mla_launch(const void *params, fi_dtype dtype, int enable_pdl, void *stream) {
    const fi_mla_params &p = *static_cast<const fi_mla_params *>(params);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (p.m.kv_e4m3) /* q of any kind the params name */
        return (int)fi_mla_launch_e4m3(p, enable_pdl, s);
    switch (dtype) {
    case FI_DTYPE_BF16:
        return (int)fi_mla_launch_bf16(p, enable_pdl, s);
    case FI_DTYPE_F16:
        return (int)fi_mla_launch_f16(p, enable_pdl, s);
    default:
        return (int)cudaErrorInvalidValue;
    }
}

extern "C" int fi_mla_wg_launch(const void *params, fi_dtype dtype, int enable_pdl, void *stream) {
    const fi_mla_params &p = *static_cast<const fi_mla_params *>(params);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (p.m.kv_e4m3) /* q fp8: fp8 matmuls; q 16-bit: fp16 ones on the converted cache */
        return (int)(p.m.q_kind == FI_MLA_Q_E4M3 ? fi_mla_wg8_launch(p, enable_pdl, s)
                                                 : fi_mla_wg_launch_e4m3(p, enable_pdl, s));
    switch (dtype) {
    case FI_DTYPE_BF16:
        return (int)fi_mla_wg_launch_bf16(p, enable_pdl, s);
    case FI_DTYPE_F16:
        return (int)fi_mla_wg_launch_f16(p, enable_pdl, s);
    default:
        return (int)cudaErrorInvalidValue;
    }
}

extern "C" int fi_mla_wg64_launch(const void *params, fi_dtype dtype, int enable_pdl, void *stream) {
    const fi_mla_params &p = *static_cast<const fi_mla_params *>(params);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (dtype) {
    case FI_DTYPE_BF16:
        return (int)fi_mla_wg64_launch_bf16(p, enable_pdl, s);
    case FI_DTYPE_F16:
        return (int)fi_mla_wg64_launch_f16(p, enable_pdl, s);
    default:
        return (int)cudaErrorInvalidValue;
    }
}

extern "C" int fi_mla_wgt_launch(const void *params, fi_dtype dtype, int enable_pdl, void *stream) {
    (void)dtype; /* out is bf16 whatever the caps' dtype */
    const fi_mla_params &p = *static_cast<const fi_mla_params *>(params);
    if (!p.m.kv_e4m3 || p.m.q_kind != FI_MLA_Q_E4M3)
        return (int)cudaErrorInvalidValue;
    return (int)fi_mla_wgt_launch_e4m3(p, enable_pdl, static_cast<cudaStream_t>(stream));
}

extern "C" int fi_mla_wgt16_launch(const void *params, fi_dtype dtype, int enable_pdl, void *stream) {
    const fi_mla_params &p = *static_cast<const fi_mla_params *>(params);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (p.m.kv_e4m3)
        return (int)cudaErrorInvalidValue;
    switch (dtype) {
    case FI_DTYPE_BF16:
        return (int)fi_mla_wgt16_launch_bf16(p, enable_pdl, s);
    case FI_DTYPE_F16:
        return (int)fi_mla_wgt16_launch_f16(p, enable_pdl, s);
    default:
        return (int)cudaErrorInvalidValue;
    }
}
