/* executor/mla/mla_wgt16_bf16.cu - MLA decode family, transposed 16-bit wgmma body: bf16 q /
 * KV / out, tiles of at most 16 rows (one instantiation). */
#include "executor/cuda/persistent/kernel.cuh"
#include "executor/mla/mla_launch.h"
#include "executor/mla/mla_wgt16_tile.cuh"

FI_PROFILE_READERS(fi_profile_read_stamps_wgt16) /* profiling builds: this module's stamps */

cudaError_t fi_mla_wgt16_launch_bf16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream) {
    return fi::launch_persistent<fimlawgt16::MlaWgt16Family<__nv_bfloat16>>(p, enable_pdl, stream);
}
