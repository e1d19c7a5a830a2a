/* executor/mla/mla_wg_f16.cu - MLA decode family, wgmma tile body, f16 q / KV / out (one
 * instantiation). */
#include "executor/cuda/persistent/kernel.cuh"
#include "executor/mla/mla_launch.h"
#include "executor/mla/mla_wg_tile.cuh"

cudaError_t fi_mla_wg_launch_f16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream) {
    return fi::launch_persistent<fimlawg::MlaWgFamily<__half>>(p, enable_pdl, stream);
}
