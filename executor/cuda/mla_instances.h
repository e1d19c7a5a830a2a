/* executor/cuda/mla_instances.h - the MLA decode instantiations (one per small .cu). */
#pragma once

#include <cuda_runtime.h>

#include "executor/mla_params.h"

cudaError_t fi_mla_launch_bf16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream);
cudaError_t fi_mla_launch_f16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream);
