/* executor/cuda/mla_decode_bf16.cu - MLA decode executor, bf16 q / KV / out. */
#include "executor/cuda/mla_decode.cuh"
#include "executor/cuda/mla_instances.h"

cudaError_t fi_mla_launch_bf16(const fi_mla_params &p, int enable_pdl, cudaStream_t stream) {
    return fimla::launch<__nv_bfloat16>(p, enable_pdl, stream);
}

#ifdef FIMLA_TIMING
extern "C" void fimla_read_stamps(unsigned long long *host, int n) {
    cudaMemcpyFromSymbol(host, fimla::g_stamp, sizeof(unsigned long long) * 4 * n);
}
extern "C" void fimla_read_stamps2(unsigned long long *host, int n) {
    cudaMemcpyFromSymbol(host, fimla::g_stamp2, sizeof(unsigned long long) * 4 * n);
}
extern "C" void fimla_phases(unsigned long long *host, int n, int reset) {
    if (reset == 2) {
        cudaMemcpyFromSymbol(host, fimla::g_item, sizeof(unsigned long long) * 8 * n);
        return;
    }
    if (reset) {
        static unsigned long long z[1024 * 8];
        cudaMemcpyToSymbol(fimla::g_phase, z, sizeof z);
        cudaMemcpyToSymbol(fimla::g_item, z, sizeof z);
        return;
    }
    if (reset == 2) {
        cudaMemcpyFromSymbol(host, fimla::g_item, sizeof(unsigned long long) * 8 * n);
        return;
    }
    cudaMemcpyFromSymbol(host, fimla::g_phase, sizeof(unsigned long long) * 8 * n);
}
#endif
