/* executor/mla/mla_f16.cu - MLA decode family, fp16 q / KV / out (one instantiation). */
#include "executor/cuda/persistent/kernel.cuh"
#include "executor/mla/mla_launch.h"
#include "executor/mla/mla_tile.cuh"

cudaError_t fi_mla_launch_f16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream) {
    return fi::launch_persistent<fimla::MlaFamily<__half>>(p, enable_pdl, stream);
}
