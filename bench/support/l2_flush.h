/*
 * bench/support/l2_flush.h - the benches' L2 flush: a read of a buffer of 4x the L2.
 *
 * Why a read and not a memset: the flush mode stands for the serving loop's state before
 * an attention kernel, whose L2 the kernels before it (the previous layer's attention
 * streaming its KV, a projection GEMM reading its weights) filled with clean lines.  A
 * memset leaves dirty lines instead, whose write-back the timed kernel then pays: ~8 us
 * more on GQA bf16 B128 x 4096 page 64 than after a read, and it made an evict-first KV
 * stream look 2.5-6% slower where after a read it is 0-3% faster (H200, docs/perf-log.md,
 * thirty-fourth session).
 */
#ifndef FI_BENCH_SUPPORT_L2_FLUSH_H
#define FI_BENCH_SUPPORT_L2_FLUSH_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Read `bytes` (a multiple of 16) of device buffer `buf` on `stream` in one kernel, each
 * 16-byte unit once, with ordinary loads: the lines enter the L2 clean and evict-normal,
 * pushing out whatever was there when bytes >= the L2's size.  Nothing is written but, by
 * chance, one word of the kernel's own.  Returns the launch's error. */
cudaError_t bench_l2_flush(const void *buf, size_t bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* FI_BENCH_SUPPORT_L2_FLUSH_H */
