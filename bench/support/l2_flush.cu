/*
 * bench/support/l2_flush.cu - bench_l2_flush (bench/support/l2_flush.h): the read ceiling's
 * grid-stride read (bench/stream_read.cuh) with ordinary loads, over the flush buffer.
 */
#include "bench/support/l2_flush.h"

#include "bench/stream_read.cuh"

namespace {
__device__ unsigned g_l2_flush_sink; /* stream_read's sentinel store, never read */
}  // namespace

extern "C" cudaError_t bench_l2_flush(const void *buf, size_t bytes, cudaStream_t stream) {
    int dev = 0, sms = 0;
    unsigned *sink = nullptr;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess)
        e = cudaGetSymbolAddress(reinterpret_cast<void **>(&sink), g_l2_flush_sink);
    if (e != cudaSuccess)
        return e;
    stream_read_normal<<<sms * 8, 256, 0, stream>>>(static_cast<const uint4 *>(buf), bytes / 16, sink);
    return cudaGetLastError();
}
