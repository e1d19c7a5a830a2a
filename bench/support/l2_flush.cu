/*
 * bench/support/l2_flush.cu - bench_l2_flush (bench/support/l2_flush.h): a grid-stride
 * read of the flush buffer.
 */
#include "bench/support/l2_flush.h"

#include <stdint.h>

namespace {

__device__ uint32_t g_l2_flush_sink;

/* XOR of every word; the store (of a value the buffer's bytes would have to hit by chance,
 * into a word nobody reads) keeps the compiler from dropping the loads. */
__global__ void l2_flush_kernel(const uint4 *p, size_t n) {
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u)
        g_l2_flush_sink = acc;
}

}  // namespace

extern "C" cudaError_t bench_l2_flush(const void *buf, size_t bytes, cudaStream_t stream) {
    int dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
        return e;
    l2_flush_kernel<<<sms * 8, 256, 0, stream>>>(static_cast<const uint4 *>(buf), bytes / 16);
    return cudaGetLastError();
}
