/* executor/cuda/mla_decode_f16.cu - MLA decode executor, fp16 q / KV / out. */
#include "executor/cuda/mla_decode.cuh"
#include "executor/cuda/mla_instances.h"

cudaError_t fi_mla_launch_f16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream) {
    return fimla::launch<__half>(p, enable_pdl, stream);
}
