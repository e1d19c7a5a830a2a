/* executor/mla/mla_bf16.cu - MLA decode family, bf16 q / KV / out (one instantiation). */
#include "executor/cuda/persistent/kernel.cuh"
#include "executor/mla/mla_launch.h"
#include "executor/mla/mla_tile.cuh"

cudaError_t fi_mla_launch_bf16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream) {
    return fi::launch_persistent<fimla::MlaFamily<__nv_bfloat16>>(p, enable_pdl, stream);
}

FI_PROFILE_READERS(fi_profile_read_stamps)
