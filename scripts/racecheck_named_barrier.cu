// scripts/racecheck_named_barrier.cu - reproducer: compute-sanitizer racecheck (2025.3.1,
// CUDA 13.0, H200) reports hazards between shared-memory phases that a plain
// __syncthreads() separates, once part of the CTA has used a named barrier with a thread
// count below the block size (bar.sync 1, 128: the warp-specialised MLA kernel's math-warp
// barrier).  A barrier of the same 128 threads built on an mbarrier (arrive + try_wait)
// is understood: no report.  Measured 2026-11-21:
//   mode 0 (no named barrier)                       0 hazards
//   mode 1 (bar.sync 1, 128 in half the CTA)        2 hazards (lines of the final phases)
//   mode 2 (+ one bar.sync 1, 256 by all after)     1 hazard
//   mode 3 (final phases on bar.sync 2, 256)        2 hazards
//   mode 4 (the 128 threads on an mbarrier barrier) 0 hazards
//   mode 5 (the transposed fp8 MLA body's shape: 384 threads, the last 128 exit at once;
//           two groups of 128 each on its own bar.sync 2 / 3, 128, then an exchange
//           across bar.sync 4, 256 and a flag across bar.sync 1, 256; the pattern of the
//           2 hazards racecheck reports in sanitize_fp8_rows16_small_case, docs/perf-log.md
//           thirty-seventh session)               0 hazards (2026-12-03): the shape
//           alone does not reproduce them
// Build and run on the GPU machine:
//   nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -lineinfo \
//        -o build/scripts/racecheck_named_barrier scripts/racecheck_named_barrier.cu
//   for m in 0 1 2 3 4 5; do compute-sanitizer --tool racecheck \
//        build/scripts/racecheck_named_barrier $m; done
#include <cstdio>
#include <cstdint>
#include <cstdlib>
__device__ __forceinline__ uint32_t su(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
/* barrier of the 128 consumer threads on an mbarrier (count 128); ph: this thread's phase bit */
__device__ __forceinline__ void mb_sync(uint64_t *b, uint32_t &ph) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(su(b)) : "memory");
  asm volatile("{ .reg .pred d; W%=: mbarrier.try_wait.parity.shared::cta.b64 d, [%0], %1; @!d bra W%=; }" :: "r"(su(b)), "r"(ph) : "memory");
  ph ^= 1u;
}
template <int MODE>
__global__ void k(int *out, int iters) {
  __shared__ float buf[512];
  __shared__ __align__(8) uint64_t mb;
  const int tid = threadIdx.x;
  if (tid == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(su(&mb)), "r"(128));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
  if (tid < 128 && MODE == 4) {
    uint32_t ph = 0;
    for (int i = 0; i < iters; i++) {
      buf[tid] = (float)(i + tid);
      mb_sync(&mb, ph);
      float v = buf[127 - tid];
      mb_sync(&mb, ph);
      out[tid] += (int)v;
    }
  }
  if (tid < 128 && MODE >= 1 && MODE <= 3) {
    for (int i = 0; i < iters; i++) {
      buf[tid] = (float)(i + tid);
      asm volatile("bar.sync 1, 128;" ::: "memory");
      float v = buf[127 - tid];
      asm volatile("bar.sync 1, 128;" ::: "memory");
      out[tid] += (int)v;
    }
  }
  __syncthreads();
  if (MODE == 2) asm volatile("bar.sync 1, 256;" ::: "memory"); // all threads once on id 1
  buf[tid] = (float)tid;
  if (MODE == 3) asm volatile("bar.sync 2, 256;" ::: "memory"); else __syncthreads();
  out[tid] += (int)buf[255 - tid];
  if (MODE == 3) asm volatile("bar.sync 2, 256;" ::: "memory"); else __syncthreads();
  buf[tid] = 2.f * tid;
  if (MODE == 3) asm volatile("bar.sync 2, 256;" ::: "memory"); else __syncthreads();
  out[tid] += (int)buf[(tid + 128) & 255];
}
/* mode 5: producers (threads 256..383) leave; two warpgroups of 128 keep their own named
 * barrier, then exchange through shared memory across one of all 256 */
__global__ void k5(int *out, int iters) {
  __shared__ float buf[512];
  __shared__ int flag;
  const int tid = threadIdx.x;
  if (tid >= 256) return;
  const int wg = tid >> 7, t = tid & 127;
  for (int i = 0; i < iters; i++) {
    buf[tid] = (float)(i + tid);
    if (wg == 0) asm volatile("bar.sync 2, 128;" ::: "memory");
    else asm volatile("bar.sync 3, 128;" ::: "memory");
    float v = buf[wg * 128 + 127 - t];
    if (wg == 0) asm volatile("bar.sync 2, 128;" ::: "memory");
    else asm volatile("bar.sync 3, 128;" ::: "memory");
    buf[256 + tid] = v;
    asm volatile("bar.sync 4, 256;" ::: "memory");
    out[tid] += (int)buf[256 + ((tid + 128) & 255)];
    asm volatile("bar.sync 4, 256;" ::: "memory");
    if (tid == 0) flag = i;
    asm volatile("bar.sync 1, 256;" ::: "memory");
    out[tid] += flag;
    asm volatile("bar.sync 1, 256;" ::: "memory");
  }
}
int main(int argc, char **argv) {
  int mode = argc > 1 ? atoi(argv[1]) : 0;
  int *d; cudaMalloc(&d, 256 * 4); cudaMemset(d, 0, 1024);
  if (mode == 0) k<0><<<4, 256>>>(d, 50);
  if (mode == 1) k<1><<<4, 256>>>(d, 50);
  if (mode == 2) k<2><<<4, 256>>>(d, 50);
  if (mode == 3) k<3><<<4, 256>>>(d, 50);
  if (mode == 4) k<4><<<4, 256>>>(d, 50);
  if (mode == 5) k5<<<4, 384>>>(d, 50);
  printf("mode %d: %s\n", mode, cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}
