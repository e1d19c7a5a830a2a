/* executor/cuda/mla_decode_bf16.cu - MLA decode executor, bf16 q / KV / out. */
#include "executor/cuda/mla_decode.cuh"
#include "executor/cuda/mla_instances.h"

cudaError_t fi_mla_launch_bf16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream) {
    return fimla::launch<__nv_bfloat16>(p, enable_pdl, stream);
}
