/*
 * bench/stream_read.cuh - the streaming-read kernel of bench/ceilings (the read ceiling)
 * and bench/ring_stream (its reference beside the ring's copy forms): one kernel, so the
 * two tools' read figures are the same measurement.
 */
#pragma once

#include <cstddef>
#include <cuda_runtime.h>

static const int kStreamUnroll = 8; /* independent 16-byte loads in flight a thread */

/* Sum of 16-byte words, grid-stride; n16 = number of uint4.  The XOR result is stored only
 * when it equals an impossible sentinel, so the loads cannot be removed but nothing is
 * written in practice. */
__global__ void __launch_bounds__(256) stream_read(const uint4 *__restrict__ p, size_t n16,
                                                  unsigned *sink) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + (kStreamUnroll - 1) * stride < n16; i += kStreamUnroll * stride) {
        uint4 v[kStreamUnroll];
#pragma unroll
        for (int u = 0; u < kStreamUnroll; u++) v[u] = __ldcs(p + i + u * stride); /* streaming */
#pragma unroll
        for (int u = 0; u < kStreamUnroll; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) {
        uint4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

