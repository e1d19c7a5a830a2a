/* executor/context/ctx_bf16_nvfp4_d64.cu - context family, bf16 q / out, NVFP4 KV (e2m1 +
 * e4m3 block scales), head_dim 64 (one instantiation). */
#include "executor/context/ctx_launch.h"
#include "executor/context/ctx_tile.cuh"
#include "executor/cuda/persistent/kernel.cuh"

cudaError_t fi_ctx_launch_bf16_nvfp4_d64(const fi_ctx_params &p, int enable_pdl, cudaStream_t stream) {
    return fi::launch_persistent<fictx::CtxFamily<__nv_bfloat16, 64, fi::nvfp4>>(p, enable_pdl, stream);
}
