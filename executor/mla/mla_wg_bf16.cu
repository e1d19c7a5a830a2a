/* executor/mla/mla_wg_bf16.cu - MLA decode family, wgmma tile body, bf16 q / KV / out (one
 * instantiation). */
#include "executor/cuda/persistent/kernel.cuh"
#include "executor/mla/mla_launch.h"
#include "executor/mla/mla_wg_tile.cuh"

FI_PROFILE_READERS(fi_profile_read_stamps_wg) /* profiling builds: this module's stamps */

cudaError_t fi_mla_wg_launch_bf16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream) {
    return fi::launch_persistent<fimlawg::MlaWgFamily<__nv_bfloat16>>(p, enable_pdl, stream);
}
