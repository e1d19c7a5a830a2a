/* executor/mla/mla_wgt_e4m3.cu - MLA decode family, transposed fp8 wgmma body: q and KV
 * cache fp8 e4m3, out bf16, tiles of at most 16 rows (one instantiation). */
#include "executor/cuda/persistent/kernel.cuh"
#include "executor/mla/mla_launch.h"
#include "executor/mla/mla_wgt_tile.cuh"

FI_PROFILE_READERS(fi_profile_read_stamps_wgt) /* profiling builds: this module's stamps */

cudaError_t fi_mla_wgt_launch_e4m3(const fi_mla_params &p, int enable_pdl, cudaStream_t stream) {
    return fi::launch_persistent<fimlawgt::MlaWgtFamily>(p, enable_pdl, stream);
}
