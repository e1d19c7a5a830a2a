/* executor/gqa/gqa_f16_e4m3_d256_rows8.cu - GQA decode family, fp16 q, fp8 e4m3 KV, head_dim 256, plans of at most 8 rows an item (one instantiation). */
#include "executor/cuda/persistent/kernel.cuh"
#include "executor/gqa/gqa_launch.h"
#include "executor/gqa/gqa_family.cuh"

cudaError_t fi_gqa_launch_f16_e4m3_d256_rows8(const fi_gqa_params &p, int enable_pdl, cudaStream_t stream) {
    return fi::launch_persistent<figqa::GqaRows8Family<__half, __nv_fp8_e4m3, 256>>(p, enable_pdl, stream);
}
