/*
 * executor/cuda/common/ptx.cuh - PTX wrappers every kernel family shares (sm_90): shared
 * addresses, ldmatrix, cp.async, mbarrier, bulk (TMA-engine) copies, proxy fences, the
 * self-resetting group counter, acquire loads, griddepcontrol (PDL), warp-uniform values,
 * setmaxnreg and the flush-to-zero exp2.  No family
 * constants here.  Source: the PTX ISA 8.x (sm_90), chapters on the named instructions.
 */
#pragma once

#include <stdint.h>

namespace fi {

/* v (the same in every lane) as a value ptxas knows to be warp-uniform: setmaxnreg and
 * wgmma on paths it cannot prove uniform cost serialisation (wgmma families). */
__device__ __forceinline__ int uniform(int v) { return __shfl_sync(0xffffffffu, v, 0); }

/* Move this warpgroup's register budget to N a thread (every warp of the warpgroup):
 * producers give registers back, consumers take them (the CTA's total stays fixed). */
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* 2^x, MUFU.EX2 alone: subnormal inputs and results flush to zero (exp2f's non-ftz form
 * adds a range test and two multiplies a call).  For softmax terms 2^(s - m) <= 1, where a
 * term below 2^-126 of the row's largest is below every output dtype's resolution; NaN
 * stays NaN, -inf gives 0. */
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* threadIdx.x as a new value the compiler cannot merge with earlier reads (asm volatile):
 * lets an epilogue re-derive thread coordinates without stretching their live ranges. */
__device__ __forceinline__ int fresh_tid() {
    int t;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
    return t;
}
__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* ldmatrix: four 8x8 b16 matrices, plain and transposed. */
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

/* max(a, b) that returns NaN when either is NaN (PTX max.NaN, sm_80+); fmaxf drops a NaN,
 * which would turn a row whose every partial LSE is NaN into an empty row. */
__device__ __forceinline__ float fmax_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

/* Transpose an 8x8 b16 matrix held in the ldmatrix fragment layout across the warp (lane
 * 4 g + q4 holds row g, columns 2 q4, 2 q4 + 1; afterwards it holds those of the transpose). */
__device__ __forceinline__ uint32_t movm_t(uint32_t x) {
    uint32_t r;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
    return r;
}

/* 16-byte async copy; src_bytes 0 zero-fills the destination (src must still be valid).
 * kL2Line: the L2::128B prefetch hint, L2 fetching the source's whole 128-byte line from
 * DRAM at once (GQA K / V rows of >= 128 bytes: bench_gqa H200, bf16 B128 x 4096 537 ->
 * 525 us, fp8 305 -> 300; 64-byte NVFP4 rows lose 2%, and L2::256B fetches a neighbour
 * head's row: fp8 392 us). */
template <bool kL2Line = false>
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    if constexpr (kL2Line)
        asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                     "r"(src_bytes));
    else
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                     "r"(src_bytes));
}
/* An L2 cache policy for the copies below that take one: the first `fraction` (0 or 1 here)
 * of the lines a copy brings in are evict-first, the rest keep their priority (a copy
 * without a policy).  A run-time fraction, not a choice between two policies: ptxas
 * spilled on a 64-bit policy selected and held across a loop. */
__device__ __forceinline__ uint64_t l2_evict_first(float fraction) {
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.L2::evict_unchanged.b64 %0, %1;\n" : "=l"(pol) : "f"(fraction));
    return pol;
}
/* cp_async16 under an L2 cache policy. */
template <bool kL2Line = false>
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes, uint64_t pol) {
    if constexpr (kL2Line)
        asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
                     "l"(src), "r"(src_bytes), "l"(pol));
    else
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                     "r"(src_bytes), "l"(pol));
}
/* A 4-, 8- or 16-byte async copy through L1 (cp.async.ca takes the small sizes); !valid
 * zero-fills the destination (src must still be a valid address). */
template <int N> __device__ __forceinline__ void cp_async_small(uint32_t dst, const void *src, bool valid) {
    static_assert(N == 4 || N == 8 || N == 16, "cp.async size");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(N),
                 "r"(valid ? N : 0));
}
/* Bring the 128-byte line holding `p` into the L2 (no register written, nothing waited). */
__device__ __forceinline__ void prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
/* 16 bytes to shared memory (a producer's converted chunk). */
__device__ __forceinline__ void st_shared16(uint32_t dst, uint4 v) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w)
                 : "memory");
}
/* Arrive on mbarrier `bar` once every cp.async this thread issued so far has landed
 * (.noinc: the arrival is one of the barrier's initial count). */
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Named barrier 1 over the first N threads of the CTA: a family's consumer threads when
 * it has producer warps (which never join it), the whole CTA otherwise.  N % 32 == 0. */
template <int N> __device__ __forceinline__ void cta_sync() {
    asm volatile("bar.sync 1, %0;\n" ::"n"(N) : "memory");
}

/* mbarrier (shared::cta addresses). */
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* Make mbarrier inits visible to the async proxy (bulk copies) before first use. */
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* An arrival that counts `count` of the barrier's expected arrivals. */
__device__ __forceinline__ void mbar_arrive_n(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
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

/* Bulk copy global -> shared (TMA engine, no tensor map), completing on mbarrier `bar`,
 * under L2 cache policy `pol` (l2_evict_first). */
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar,
                                         uint64_t pol) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar), "l"(pol)
        : "memory");
}
/* Add `bytes` to the transaction count the current phase of `bar` waits for, without an
 * arrival (each TMA-issuing lane expects its own box before issuing it). */
__device__ __forceinline__ void mbar_expect_tx_only(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
/* A 4-D box of a tensor map (a __grid_constant__ kernel parameter's address) global ->
 * shared by the TMA engine, coordinates innermost first, completing on mbarrier `bar`. */
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void *tmap, int c0, int c1, int c2,
                                            int c3, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
        "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}
/* The same for a 3-D box, under L2 cache policy `pol` (l2_evict_first). */
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void *tmap, int c0, int c1, int c2,
                                            uint32_t bar, uint64_t pol) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
        "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(pol)
        : "memory");
}
/* Order generic-proxy shared-memory writes before later async-proxy (bulk copy) accesses. */
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* Self-resetting group counter: returns the old value (old >= bound stores 0, else
 * old + 1).  acq_rel at gpu scope: the release is cumulative over what the CTA barrier
 * ordered before it (the pattern of CUTLASS's split-k semaphore). */
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

/* Programmatic dependent launch: wait for the previous grid's memory (before the first
 * global read of anything it may write), and let the next grid start its prologue. */
__device__ __forceinline__ void griddep_wait() {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
__device__ __forceinline__ void griddep_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

}  // namespace fi
