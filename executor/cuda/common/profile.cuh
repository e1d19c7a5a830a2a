/*
 * executor/cuda/common/profile.cuh - the profiling build (-DFI_PROFILE; `make profile`,
 * which CI compiles too): per-CTA stamps, read back and printed by the profiling builds of
 * bench_mla and bench_gqa (bench_profile_ctas) through the reader each family defines in
 * one of its .cu files (FI_PROFILE_READERS(name): a module's stamps are its own).  In every
 * other build the stamps compile to nothing.
 *   g_stamp[cta]  %globaltimer: [0] kernel start, [1] plan record read, [2] a split's
 *                 arrival, [3] CTA end
 *   g_stamp2[cta] %globaltimer, first item: [0] Q landed, [1] first KV block landed; last
 *                 item: [2] KV loop done, [3] output (or partial) written
 *   g_stamp3[cta] [0] the SM it ran on (%smid; SMs 2k and 2k + 1 share a TPC)
 */
#pragma once

#ifdef FI_PROFILE
namespace fi {
__device__ unsigned long long g_stamp[1024][4];
__device__ unsigned long long g_stamp2[1024][4];
__device__ unsigned long long g_stamp3[1024][4];
__device__ __forceinline__ unsigned long long gtimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
}  // namespace fi
#define FI_STAMP(i) \
    if (threadIdx.x == 0 && blockIdx.x < 1024) fi::g_stamp[blockIdx.x][i] = fi::gtimer()
#define FI_STAMP_SM()                                                  \
    if (threadIdx.x == 0 && blockIdx.x < 1024) {                      \
        unsigned sm;                                                  \
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));               \
        fi::g_stamp3[blockIdx.x][0] = sm;                             \
    }
#define FI_STAMP2(i) \
    if (threadIdx.x == 0 && blockIdx.x < 1024) fi::g_stamp2[blockIdx.x][i] = fi::gtimer()
/* Host side of a profiling build, in one .cu of a family (it sees that module's stamps). */
#define FI_PROFILE_READERS(name)                                                           \
    extern "C" void name(unsigned long long *host, int which, int n) {                    \
        cudaMemcpyFromSymbol(host, which == 2 ? fi::g_stamp3 : which ? fi::g_stamp2 : fi::g_stamp, \
                             sizeof(unsigned long long) * 4 * (size_t)n);                  \
    }
#else
#define FI_STAMP(i)
#define FI_STAMP2(i)
#define FI_STAMP_SM()
#define FI_PROFILE_READERS(name)
#endif
