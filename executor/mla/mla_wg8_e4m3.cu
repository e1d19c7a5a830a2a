/* executor/mla/mla_wg8_e4m3.cu - MLA decode family, fp8 wgmma tile body: q and KV cache
 * fp8 e4m3, out bf16 (one instantiation). */
#include "executor/cuda/persistent/kernel.cuh"
#include "executor/mla/mla_launch.h"
#include "executor/mla/mla_wg8_tile.cuh"

FI_PROFILE_READERS(fi_profile_read_stamps_wg8) /* profiling builds: this module's stamps */

cudaError_t fi_mla_wg8_launch(const fi_mla_params &p, int enable_pdl, cudaStream_t stream) {
    return fi::launch_persistent<fimlawg8::MlaWg8Family>(p, enable_pdl, stream);
}
