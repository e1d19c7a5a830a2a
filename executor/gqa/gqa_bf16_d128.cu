/* executor/gqa/gqa_bf16_d128.cu - GQA decode family, bf16 q / KV, head_dim 128 (one instantiation). */
#include "executor/cuda/persistent/kernel.cuh"
#include "executor/gqa/gqa_launch.h"
#include "executor/gqa/gqa_family.cuh"

cudaError_t fi_gqa_launch_bf16_d128(const fi_gqa_params &p, int enable_pdl, cudaStream_t stream) {
    return fi::launch_persistent<figqa::GqaFamily<__nv_bfloat16, __nv_bfloat16, 128>>(p, enable_pdl, stream);
}

FI_PROFILE_READERS(fi_profile_read_stamps_gqa)
