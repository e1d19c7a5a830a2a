/* executor/mla/mla_e4m3.cu - MLA decode family, mma.sync tile body, fp8 e4m3 KV cache read
 * as fp16 in the matmuls, q fp8 e4m3 / bf16 / fp16 (run time, converted to fp16), out bf16
 * (one instantiation). */
#include "executor/cuda/persistent/kernel.cuh"
#include "executor/mla/mla_launch.h"
#include "executor/mla/mla_tile.cuh"

FI_PROFILE_READERS(fi_profile_read_stamps_e4m3) /* profiling builds: this module's stamps */

cudaError_t fi_mla_launch_e4m3(const fi_mla_params &p, int enable_pdl, cudaStream_t stream) {
    return fi::launch_persistent<fimla::MlaFamily<__half, __nv_fp8_e4m3>>(p, enable_pdl, stream);
}
