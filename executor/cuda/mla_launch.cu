/* executor/cuda/mla_launch.cu - C ABI of the MLA launchers: run-time dtype -> instantiation. */
#include "executor/cuda/mla_instances.h"
#include "executor/launch.h"

extern "C" int fi_launch_mla_decode(const fi_mla_params *params, fi_dtype dtype,
                                    int enable_pdl, void *stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (dtype) {
    case FI_DTYPE_BF16:
        return (int)fi_mla_launch_bf16(*params, enable_pdl, s);
    case FI_DTYPE_F16:
        return (int)fi_mla_launch_f16(*params, enable_pdl, s);
    default:
        return (int)cudaErrorInvalidValue;
    }
}
