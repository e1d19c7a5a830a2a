/*
 * executor/cuda/mla_common.cuh - what the parts of the MLA decode executor share: tile and
 * shared-memory constants, the dtype traits (mma.sync per input type), the PTX wrappers
 * (ldmatrix, cp.async, mbarrier, bulk copy, atom.inc), the per-run constants, and the
 * -DFIMLA_TIMING instrumentation.  Source of the PTX: the PTX ISA (sm_90).
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>
#include <stdint.h>

#include "executor/mla_params.h"

namespace fimla {

#ifdef FIMLA_TIMING
/* Profiling builds only (-DFIMLA_TIMING; bench/bench_mla and scripts/mla_check read these
 * through the fimla_* functions of mla_decode_bf16.cu): per-CTA %globaltimer stamps. */
__device__ unsigned long long g_stamp[1024][4];
__device__ __forceinline__ unsigned long long gtimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
#define FIMLA_STAMP(i) \
    if (threadIdx.x == 0 && blockIdx.x < 1024) g_stamp[blockIdx.x][i] = gtimer()
/* Item-edge stamps of thread 0: [0] first item's Q landed, [1] its first KV block landed
 * (the item FIMLA_STAMP_ITEM, below, instead of the first when set),
 * [2] last item's KV loop done, [3] last item's output (or partial) written. */
__device__ unsigned long long g_stamp2[1024][4];
#define FIMLA_STAMP2(i) \
    if (threadIdx.x == 0 && blockIdx.x < 1024) g_stamp2[blockIdx.x][i] = gtimer()
/* Phase clocks of warp 0 (lane 0) summed over the CTA's steps: [0] data wait, [1] S,
 * [2] sync after S, [3] softmax, [4] sync after softmax, [5] PV, [6] top sync, [7] steps.
 * Item phases (thread 0, summed over items): [0] prologue issued, [1] Q landed,
 * [2] loop done, [3] combine + output written, [4] fence + semaphore, [5] merge. */
__device__ unsigned long long g_phase[1024][8];
__device__ unsigned long long g_item[1024][8];
#else
#define FIMLA_STAMP(i)
#define FIMLA_STAMP2(i)
#endif
/* Which item of a CTA the [0] / [1] item-edge stamps describe (profiling: -D...=1 for the
 * second item, whose start follows the first's epilogue). */
#ifndef FIMLA_STAMP_ITEM
#define FIMLA_STAMP_ITEM 0
#endif

/* The clock64 phase sums, unless -DFIMLA_STAMPS_ONLY: they slow the KV loop by ~30% at
 * heads 16, the globaltimer stamps do not. */
#if defined(FIMLA_TIMING) && !defined(FIMLA_STAMPS_ONLY)
#define FIMLA_PH_DECL long long ph_t = clock64(); long long ph_acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#define FIMLA_PH(i) { long long n_ = clock64(); ph_acc[i] += n_ - ph_t; ph_t = n_; }
#define FIMLA_IT_DECL long long it_t = clock64();
#define FIMLA_IT(i) { long long n_ = clock64(); if (threadIdx.x == 0 && blockIdx.x < 1024) g_item[blockIdx.x][i] += n_ - it_t; it_t = n_; }
#define FIMLA_PH_STORE \
    if (threadIdx.x == 0 && blockIdx.x < 1024) for (int q_ = 0; q_ < 8; ++q_) g_phase[blockIdx.x][q_] += ph_acc[q_];
#else
#define FIMLA_PH_DECL
#define FIMLA_PH(i)
#define FIMLA_IT_DECL
#define FIMLA_IT(i)
#define FIMLA_PH_STORE
#endif

constexpr int kThreads = 256;
constexpr int kRows = 64;                 /* tile rows (fi_tile_rows for MLA) */
constexpr int kDqk = 576;                 /* 512 ckv + 64 kpe */
constexpr int kDv = 512;
constexpr int kChunksNope = kDv / 8;      /* 16-byte chunks of a 512-element row: 64 */
constexpr int kChunks = kDqk / 8;         /* 72 */
constexpr int kBlockN = 32;               /* KV tokens per block */
constexpr int kMaxStages = 5;             /* ring depth when Q needs <= 32 rows */
constexpr int kPitch = kDqk + 8;          /* elements per smem row: 1168 B, 292 words */
constexpr int kPPitch = kBlockN + 8;      /* P row: 80 B */
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

/* Shared memory: [P 4x16 rows][row max / sums][flag] then Q (16 rows per live row group)
 * then the KV ring, as many 32-token stages as fit (4 with 64 Q rows, 5 with <= 32). */
constexpr size_t kSmemP = (size_t)4 * 16 * kPPitch * 2;
constexpr size_t kSmemRed = (size_t)2 * 2 * kRows * sizeof(float); /* max and l, per half */
constexpr size_t kSmemFixed = (kSmemP + kSmemRed + 16 + 8 * kMaxStages + 127) / 128 * 128;
constexpr size_t kStageBytes = (size_t)kBlockN * kPitch * 2;
constexpr size_t kSmemBytes = 232448; /* the sm_90 opt-in maximum per block */
static_assert(kSmemFixed + (size_t)kRows * kPitch * 2 + 4 * kStageBytes <= kSmemBytes, "smem");

template <typename T> struct Dt;
template <> struct Dt<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&v);
    }
    static __device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0,
                                               uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct Dt<__half> {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __half2 v = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&v);
    }
    static __device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0,
                                               uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

/* threadIdx.x as a new value the compiler cannot merge with earlier reads (asm volatile). */
__device__ __forceinline__ int fresh_tid() {
    int t;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
    return t;
}
__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t *r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t *r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
/* 16-byte async copy; src_bytes 0 zero-fills the destination (src must still be valid). */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
/* mbarrier + bulk-copy (TMA engine, no tensor map) helpers; addresses are shared::cta. */
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes,
                                         uint32_t bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* Self-resetting group counter: returns the old value (old >= bound stores 0, else old+1). */
__device__ __forceinline__ uint32_t sem_inc(uint32_t *sem, uint32_t bound) {
    uint32_t old;
    asm volatile("atom.acq_rel.gpu.global.inc.u32 %0, [%1], %2;\n"
                 : "=r"(old)
                 : "l"(sem), "r"(bound)
                 : "memory");
    return old;
}
__device__ __forceinline__ uint32_t ld_acquire(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ float logaddexp(float a, float b) {
    const float m = fmaxf(a, b);
    if (m == -CUDART_INF_F)
        return -CUDART_INF_F;
    return m + logf(expf(a - m) + expf(b - m));
}

/* Per-run constants shared by every item of a CTA. */
struct RunCtx {
    float scale_log2;  /* bmm1_scale * log2(e) */
    float scale2;      /* bmm2_scale */
    int causal;
    int window_left;
};

}  // namespace fimla
