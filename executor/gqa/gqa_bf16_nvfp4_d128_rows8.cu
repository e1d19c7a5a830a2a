/* executor/gqa/gqa_bf16_nvfp4_d128_rows8.cu - GQA decode family, bf16 q, NVFP4 KV, head_dim 128, plans of at most 8 rows an item (one instantiation). */
#include "executor/cuda/persistent/kernel.cuh"
#include "executor/gqa/gqa_launch.h"
#include "executor/gqa/gqa_family.cuh"

cudaError_t fi_gqa_launch_bf16_nvfp4_d128_rows8(const fi_gqa_params &p, int enable_pdl, cudaStream_t stream) {
    return fi::launch_persistent<figqa::GqaRows8Family<__nv_bfloat16, fi::nvfp4, 128>>(p, enable_pdl, stream);
}
