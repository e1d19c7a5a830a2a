/*
 * plan/hd.h - how code shared by the host and the device is declared.
 *
 * The planner (planner/validate.c, tiles.c, partition.c, pack.c, model.c, build.c) is one
 * source compiled twice: as C11 into the library (host planning, fi_plan_update), and
 * #included by planner/device/plan_kernel.cu (device planning, fi_plan_update_device), which
 * defines FI_PLANNER_DEVICE_TU first.  In that translation unit every planner function becomes
 * a file-local device function, so the two copies never clash at link time.
 *
 *   FI_HOST_DEVICE  small inline helpers in headers (plan/mask.h, plan/plan.h, ...):
 *                   `static inline` in C, `__host__ __device__` inline under nvcc.
 *   FI_PD           planner functions with external linkage in C (declared in headers);
 *                   `static __device__` in the device planner's translation unit.
 *   FI_PD_STATIC    file-local planner helpers: `static` in C, `static __device__` there.
 */
#ifndef FIATTN_PLAN_HD_H
#define FIATTN_PLAN_HD_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define FI_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FI_HOST_DEVICE static inline
#endif

#ifdef FI_PLANNER_DEVICE_TU
#define FI_PD static __device__
#define FI_PD_STATIC static __device__
#else
#define FI_PD
#define FI_PD_STATIC static
#endif
/* FI_PD_OUTLINE: a per-request helper called from several places: one copy in the device
 * planner (it runs as one CTA, often with a cold L2: the instructions it executes, not the
 * ones it has, cost DRAM round trips), inlined into the host planner's loops (a call per
 * request showed as +7-9% instructions a plan update under callgrind). */
#ifdef FI_PLANNER_DEVICE_TU
#define FI_PD_OUTLINE __noinline__
#else
#define FI_PD_OUTLINE inline __attribute__((always_inline))
#endif

/* FI_PD_INLINE: a step of a hot loop that several loops share, inlined on both sides (gcc
 * -O2 may keep a call: a shared CTA step of the capped walk, planner/partition.c, left as
 * a call cost +7-11% instructions a plan update under callgrind). */
#ifdef FI_PLANNER_DEVICE_TU
#define FI_PD_INLINE __forceinline__
#else
#define FI_PD_INLINE inline __attribute__((always_inline))
#endif

/* FI_PD_NO_UNROLL: before a loop of a few iterations (a tile's pieces, a thread's share of
 * a scan), which nvcc would unroll into code that a cold instruction cache fetches from
 * DRAM; nothing on the host. */
#ifdef FI_PLANNER_DEVICE_TU
#define FI_PD_NO_UNROLL _Pragma("unroll 1")
#else
#define FI_PD_NO_UNROLL
#endif

/* FI_PD_STAMP(k): in the device planner built with -DFI_PROFILE (make PROFILE=1), the
 * SM clock at point k of a plan (planner/device/plan_kernel.cu keeps them); else nothing. */
#if defined(FI_PLANNER_DEVICE_TU) && defined(FI_PROFILE)
#define FI_PD_STAMP(k) fi_pd_stamp(k)
#else
#define FI_PD_STAMP(k) ((void)0)
#endif

/* Count of trailing zero bits of x != 0, on either side. */
FI_HOST_DEVICE int fi_ctz64(unsigned long long x) {
#ifdef __CUDA_ARCH__
    return __ffsll((long long)x) - 1;
#else
    return __builtin_ctzll(x);
#endif
}

/* memcpy / memset of `bytes` (a multiple of 4, 4-byte aligned pointers) on either side: the
 * libc calls on the host; 32-bit word loops on the device, where memcpy / memset of
 * generic pointers compile to byte loops (one thread: ~7 cycles a byte, measured). */
FI_HOST_DEVICE void fi_copy_bytes(void *dst, const void *src, size_t bytes) {
#ifdef __CUDA_ARCH__
    FI_PD_NO_UNROLL
    for (size_t i = 0; i < bytes / 4; i++)
        ((uint32_t *)dst)[i] = ((const uint32_t *)src)[i];
#else
    memcpy(dst, src, bytes);
#endif
}
FI_HOST_DEVICE void fi_zero_bytes(void *dst, size_t bytes) {
#ifdef __CUDA_ARCH__
    FI_PD_NO_UNROLL
    for (size_t i = 0; i < bytes / 4; i++)
        ((uint32_t *)dst)[i] = 0;
#else
    memset(dst, 0, bytes);
#endif
}

/* Move n int32 from src down to dst (dst <= src, ranges may overlap), on either side. */
FI_HOST_DEVICE void fi_move_down_i32(int32_t *dst, const int32_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        dst[i] = src[i];
}

/* The last index i of a[0 .. n) (non-decreasing, a[0] <= x, n >= 1) with a[i] <= x. */
FI_HOST_DEVICE int32_t fi_last_le(const int64_t *a, int32_t n, int64_t x) {
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const int32_t mid = (lo + hi + 1) / 2;
        if (a[mid] <= x)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

#endif /* FIATTN_PLAN_HD_H */
