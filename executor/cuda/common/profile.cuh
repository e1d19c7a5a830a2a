/*
 * executor/cuda/common/profile.cuh - the profiling build (-DFI_PROFILE; `make profile`,
 * which CI compiles too): per-CTA stamps, read back and printed by the profiling builds of
 * bench_mla and bench_gqa (bench_profile_ctas) through the reader each family defines in
 * one of its .cu files (FI_PROFILE_READERS(name): a module's stamps are its own).  In every
 * other build the stamps compile to nothing.
 *   g_stamp[cta]  %globaltimer: [0] kernel start, [1] plan record read, [2] a split's
 *                 arrival, [3] CTA end
 *   g_stamp2[cta] %globaltimer, first item: [0] Q landed, [1] first KV block landed (the
 *                 wgmma MLA bodies: the first scores done); last item: [2] KV loop done,
 *                 [3] output (or partial) written
 *   g_stamp3[cta] [0] the SM it ran on (%smid; SMs 2k and 2k + 1 share a TPC); the
 *                 last cooperative merge (%globaltimer): [1] its group complete, [3] its
 *                 slice's weights ready, [2] its slice written
 *   g_phase[cta][wg][k]  clock64 cycles a consumer warpgroup spent in phase k of its rounds
 *                 (k < 14; [15]: the rounds), summed over the launches since the host
 *                 last zeroed them (the reader, which 4); a tile body marks
 *                 the ends of its phases with FI_PHASE(k) on the warpgroup's first thread
 *                 (the wgmma MLA bodies: run_item64, wg_run_item and row 9's run_item
 *                 name theirs), each item's sums kept in shared memory and added to
 *                 g_phase at its end.
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
#define FI_STAMP3(i) \
    if (threadIdx.x == 0 && blockIdx.x < 1024) fi::g_stamp3[blockIdx.x][i] = fi::gtimer()
namespace fi {
__device__ unsigned long long g_phase[1024][2][16];
/* 1 KB and 1 KB-aligned: the dynamic shared memory after it stays aligned for the
 * 128-byte swizzle (with 256 bytes here the 64-token body read garbage) */
__shared__ __align__(1024) unsigned long long s_phase[2][64];
}  // namespace fi
/* A consumer warpgroup's (threads 0-255) phases, anywhere in its item code: FI_PHASE_START
 * at the item's start, FI_PHASE(k) at the end of each phase k, FI_PHASE_ROUND once a
 * round, FI_PHASE_END at the item's end ([14] holds the clock of the last mark). */
#define FI_PHASE_ON() ((threadIdx.x & 127) == 0 && threadIdx.x < 256 && blockIdx.x < 1024)
#define FI_PHASE_START()                                                                  \
    if (FI_PHASE_ON()) {                                                                  \
        for (int k_ = 0; k_ < 14; ++k_) fi::s_phase[threadIdx.x >> 7][k_] = 0;            \
        fi::s_phase[threadIdx.x >> 7][15] = 0;                                            \
        fi::s_phase[threadIdx.x >> 7][14] = (unsigned long long)clock64();                \
    }
#define FI_PHASE(k)                                                                       \
    if (FI_PHASE_ON()) {                                                                  \
        const unsigned long long n_ = (unsigned long long)clock64();                      \
        fi::s_phase[threadIdx.x >> 7][k] += n_ - fi::s_phase[threadIdx.x >> 7][14];       \
        fi::s_phase[threadIdx.x >> 7][14] = n_;                                           \
    }
#define FI_PHASE_ROUND() \
    if (FI_PHASE_ON()) fi::s_phase[threadIdx.x >> 7][15] += 1
#define FI_PHASE_END()                                                                    \
    if (FI_PHASE_ON())                                                                    \
        for (int k_ = 0; k_ < 16; ++k_)                                                   \
            if (k_ != 14)                                                                 \
                fi::g_phase[blockIdx.x][threadIdx.x >> 7][k_] += fi::s_phase[threadIdx.x >> 7][k_]
/* Host side of a profiling build, in one .cu of a family (it sees that module's stamps):
 * which 0 / 1 / 2: g_stamp / g_stamp2 / g_stamp3 ([n][4]); 3: g_phase ([n][2][16]); 4:
 * g_phase zeroed (host, n unused: a case's sums then start from nothing). */
#define FI_PROFILE_READERS(name)                                                           \
    extern "C" void name(unsigned long long *host, int which, int n) {                    \
        void *phase = NULL;                                                                \
        if (which == 4) {                                                                  \
            if (cudaGetSymbolAddress(&phase, fi::g_phase) == cudaSuccess)                  \
                cudaMemset(phase, 0, sizeof fi::g_phase);                                  \
        } else if (which == 3)                                                             \
            cudaMemcpyFromSymbol(host, fi::g_phase, sizeof(unsigned long long) * 32 * (size_t)n); \
        else                                                                               \
            cudaMemcpyFromSymbol(host, which == 2 ? fi::g_stamp3 : which ? fi::g_stamp2 : fi::g_stamp, \
                                 sizeof(unsigned long long) * 4 * (size_t)n);              \
    }
#else
#define FI_STAMP(i)
#define FI_STAMP2(i)
#define FI_STAMP3(i)
#define FI_STAMP_SM()
#define FI_PHASE_START()
#define FI_PHASE(k)
#define FI_PHASE_ROUND()
#define FI_PHASE_END()
#define FI_PROFILE_READERS(name)
#endif
