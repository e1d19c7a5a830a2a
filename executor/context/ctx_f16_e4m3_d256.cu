/* executor/context/ctx_f16_e4m3_d256.cu - context family, fp16 q / out, fp8 e4m3 KV,
 * head_dim 256 (one instantiation). */
#include "executor/context/ctx_launch.h"
#include "executor/context/ctx_tile.cuh"
#include "executor/cuda/persistent/kernel.cuh"

cudaError_t fi_ctx_launch_f16_e4m3_d256(const fi_ctx_params &p, int enable_pdl, cudaStream_t stream) {
    return fi::launch_persistent<fictx::CtxFamily<__half, 256, __nv_fp8_e4m3>>(p, enable_pdl, stream);
}
