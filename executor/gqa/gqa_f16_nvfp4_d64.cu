/* executor/gqa/gqa_f16_nvfp4_d64.cu - GQA decode family, f16 q, NVFP4 KV, head_dim 64 (one instantiation). */
#include "executor/cuda/persistent/kernel.cuh"
#include "executor/gqa/gqa_launch.h"
#include "executor/gqa/gqa_family.cuh"

cudaError_t fi_gqa_launch_f16_nvfp4_d64(const fi_gqa_params &p, int enable_pdl, cudaStream_t stream) {
    return fi::launch_persistent<figqa::GqaFamily<__half, fi::nvfp4, 64>>(p, enable_pdl, stream);
}
