/*
 * bench/stream_read.cuh - the streaming-read kernel of bench/ceilings (the read ceiling)
 * and bench/ring_stream (its reference beside the ring's copy forms): one kernel, so the
 * two tools' read figures are the same measurement; and its form with ordinary loads, the
 * benches' L2 flush (bench/support/l2_flush.cu).
 */
#pragma once

#include <cstddef>
#include <cuda_runtime.h>

static const int kStreamUnroll = 8; /* independent 16-byte loads in flight a thread */

/* Sum of 16-byte words, grid-stride; n16 = number of uint4.  The XOR result is stored only
 * when it equals an impossible sentinel, so the loads cannot be removed but nothing is
 * written in practice.  kStreaming: loads marked read-once (__ldcs, the ceiling's), else
 * ordinary cached loads (__ldca), whose lines enter the L2 at normal priority
 * (bench_l2_flush). */
template <bool kStreaming>
__device__ __forceinline__ void stream_read_body(const uint4 *__restrict__ p, size_t n16, unsigned *sink) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + (kStreamUnroll - 1) * stride < n16; i += kStreamUnroll * stride) {
        uint4 v[kStreamUnroll];
#pragma unroll
        for (int u = 0; u < kStreamUnroll; u++) v[u] = kStreaming ? __ldcs(p + i + u * stride) : __ldca(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < kStreamUnroll; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) {
        uint4 v = kStreaming ? __ldcs(p + i) : __ldca(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

/* The read ceiling's kernel (bench/ceilings, bench/ring_stream). */
__global__ void __launch_bounds__(256) stream_read(const uint4 *__restrict__ p, size_t n16,
                                                  unsigned *sink) {
    stream_read_body<true>(p, n16, sink);
}

/* The same read with ordinary loads (the benches' L2 flush, bench/support/l2_flush.cu). */
__global__ void __launch_bounds__(256) stream_read_normal(const uint4 *__restrict__ p, size_t n16,
                                                         unsigned *sink) {
    stream_read_body<false>(p, n16, sink);
}
