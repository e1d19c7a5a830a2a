/* executor/gqa/gqa_launch.cu - C ABI of the GQA family: run-time dtype x head_dim ->
 * instantiation. */
#include "executor/gqa/gqa_launch.h"

extern "C" int fi_gqa_launch(const void *params, fi_dtype dtype, int enable_pdl, void *stream) {
    const fi_gqa_params &p = *static_cast<const fi_gqa_params *>(params);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const int d = p.g.head_dim;
    if (dtype == FI_DTYPE_BF16) {
        if (d == 64) return (int)fi_gqa_launch_bf16_d64(p, enable_pdl, s);
        if (d == 128) return (int)fi_gqa_launch_bf16_d128(p, enable_pdl, s);
        if (d == 256) return (int)fi_gqa_launch_bf16_d256(p, enable_pdl, s);
    } else if (dtype == FI_DTYPE_F16) {
        if (d == 64) return (int)fi_gqa_launch_f16_d64(p, enable_pdl, s);
        if (d == 128) return (int)fi_gqa_launch_f16_d128(p, enable_pdl, s);
        if (d == 256) return (int)fi_gqa_launch_f16_d256(p, enable_pdl, s);
    }
    return (int)cudaErrorInvalidValue;
}
