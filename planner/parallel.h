/*
 * planner/parallel.h - the data-parallel planner's execution model, one source for the host
 * and the device (plan/hd.h).
 *
 * Code written with these runs on the host as one thread that does every iteration, and in
 * the device planner (planner/device/plan_kernel.cu) as the whole CTA: every thread calls
 * the same function, FI_PP_FOR splits a loop across the threads, FI_PP_SYNC is a barrier,
 * and the scans and reductions below combine the threads' values (identity on the host,
 * where the one thread already saw every iteration).  Integer arithmetic only, so host
 * and device results are bit-identical.  Not installed.
 */
#ifndef FIATTN_PLANNER_PARALLEL_H
#define FIATTN_PLANNER_PARALLEL_H

#include <stdint.h>

#include "plan/hd.h"

#if defined(FI_PLANNER_DEVICE_TU)
/* The planning kernel's CTA size: planner/device/plan_kernel.cu launches exactly this many
 * threads (-D...: experiments with other sizes, a multiple of 32).  A compile-time count
 * lets the loops over the warps' partial results below unroll into independent loads. */
#ifndef FI_DEVPLAN_THREADS
#define FI_DEVPLAN_THREADS 512
#endif
#define FI_PP_WARPS (FI_DEVPLAN_THREADS / 32)
#endif

#if defined(FI_PLANNER_DEVICE_TU) && defined(__CUDA_ARCH__)
#define FI_PP_TID ((int32_t)threadIdx.x)
#define FI_PP_NT ((int32_t)FI_DEVPLAN_THREADS)
#define FI_PP_SYNC() __syncthreads()
#else
#define FI_PP_TID 0
#define FI_PP_NT 1
#define FI_PP_SYNC() ((void)0)
#endif
/* i over [0, n), split across the threads (all of them on the host). */
#define FI_PP_FOR(i, n) for (int32_t i = FI_PP_TID; i < (n); i += FI_PP_NT)
/* i over [0, n) a warp each (all of them on the host), the warp's lanes splitting the
 * work of one i: lane FI_PP_LANE of FI_PP_LANES, combined by fi_pp_warp_sum32 or
 * fi_pp_warp_any. */
#if defined(FI_PLANNER_DEVICE_TU) && defined(__CUDA_ARCH__)
#define FI_PP_FOR_WARP(i, n) \
    for (int32_t i = (int32_t)threadIdx.x >> 5; i < (n); i += FI_PP_WARPS)
#define FI_PP_LANE ((int32_t)threadIdx.x & 31)
#define FI_PP_LANES 32
#else
#define FI_PP_FOR_WARP(i, n) for (int32_t i = 0; i < (n); i++)
#define FI_PP_LANE 0
#define FI_PP_LANES 1
#endif
/* Work of one thread (thread 0 on the device, the only one on the host). */
#define FI_PP_LEADER (FI_PP_TID == 0)
/* i over [0, n) in contiguous chunks, one a thread (fi_pp_chunk; all of [0, n) on the
 * host): the elements that fi_pp_scan has each thread sum first, so a loop that fills a[i]
 * right before fi_pp_scan(a, n) needs no barrier before the scan. */
#define FI_PP_FOR_CHUNK(i, n)                                                               \
    FI_PD_NO_UNROLL for (int32_t i = fi_pp_chunk((n), 0), i##_end = fi_pp_chunk((n), 1);   \
                         i < i##_end; i++)

#if defined(FI_PLANNER_DEVICE_TU)
/* The start (end 0) or the end (end 1) of this thread's chunk of [0, n): ceil(n / threads)
 * elements a thread, in thread order (n <= threads: element tid, or none). */
__device__ __forceinline__ int32_t fi_pp_chunk(int32_t n, int end) {
    const int32_t chunk = (n + FI_DEVPLAN_THREADS - 1) / FI_DEVPLAN_THREADS;
    const int32_t b = (int32_t)threadIdx.x * chunk < n ? (int32_t)threadIdx.x * chunk : n;
    return end == 0 ? b : b + chunk < n ? b + chunk : n;
}

/* The warps' partial results of a reduction or scan, [48] (a scan's sums and up to two
 * reductions' partials beside them): one buffer for all, as each ends with a barrier after
 * its last read. */
#define FI_PP_PART 48
static __shared__ int64_t fi_pp_part[FI_PP_PART];

/* Sum / min / max of every thread's v, returned to all threads (a barrier). */
static __device__ __noinline__ int64_t fi_pp_reduce(int64_t v, int op) {
    int64_t *part = fi_pp_part;
    for (int o = 16; o > 0; o >>= 1) {
        const int64_t y = __shfl_xor_sync(0xffffffffu, v, o);
        v = op == 0 ? v + y : op == 1 ? (y < v ? y : v) : (y > v ? y : v);
    }
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0)
        part[w] = v;
    __syncthreads();
    /* The warps' results combined by shuffles in every warp (a few instructions instead of
     * a load, a select and an add per warp: the planner's ~20 steps are each a few of
     * these, every warp executing every one). */
    v = part[lane < FI_PP_WARPS ? lane : 0];
    for (int o = FI_PP_WARPS / 2; o > 0; o >>= 1) {
        const int64_t y = __shfl_xor_sync(0xffffffffu, v, o);
        v = op == 0 ? v + y : op == 1 ? (y < v ? y : v) : (y > v ? y : v);
    }
    v = __shfl_sync(0xffffffffu, v, 0);
    __syncthreads(); /* part is reused by the next call */
    return v;
}
#define fi_pp_min(v) fi_pp_reduce((v), 1)

/* Sum of a and maximum of b over the lanes l ^ o, o = first .. 1 (butterfly: every lane
 * ends with the result of its group of 2 first lanes). */
__device__ __forceinline__ void fi_pp_xor_sum_max(int64_t *a, int64_t *b, int first) {
    for (int o = first; o > 0; o >>= 1) {
        *a += __shfl_xor_sync(0xffffffffu, *a, o);
        const int64_t y = __shfl_xor_sync(0xffffffffu, *b, o);
        *b = y > *b ? y : *b;
    }
}

/* The second stage of a CTA-wide sum and maximum: the warps' sums and maxima (sums[w],
 * maxs[w], written before a barrier) combined in every warp, returned to all threads. */
__device__ __forceinline__ void fi_pp_combine_sum_max(const int64_t *sums, const int64_t *maxs,
                                                      int64_t *s, int64_t *m) {
    const int lane = threadIdx.x & 31;
    int64_t a = lane < FI_PP_WARPS ? sums[lane] : 0;
    int64_t b = maxs[lane < FI_PP_WARPS ? lane : 0];
    fi_pp_xor_sum_max(&a, &b, FI_PP_WARPS / 2);
    *s = __shfl_sync(0xffffffffu, a, 0);
    *m = __shfl_sync(0xffffffffu, b, 0);
}

/* The sum of every thread's *s and the maximum of every thread's *m in one pass (one
 * barrier pair instead of two), both returned to all threads. */
static __device__ __noinline__ void fi_pp_sum_max(int64_t *s, int64_t *m) {
    static_assert(2 * FI_PP_WARPS <= FI_PP_PART, "fi_pp_part holds both halves");
    int64_t *part = fi_pp_part;
    int64_t a = *s, b = *m;
    fi_pp_xor_sum_max(&a, &b, 16);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        part[w] = a;
        part[FI_PP_WARPS + w] = b;
    }
    __syncthreads();
    fi_pp_combine_sum_max(part, part + FI_PP_WARPS, s, m);
    __syncthreads(); /* part is reused by the next call */
}

/* 32-bit sum of v over the lanes of the warp, returned to every lane: one redux.sync
 * (sm_80 on) instead of five shuffle steps (no barrier). */
__device__ __forceinline__ uint32_t fi_pp_warp_sum32(uint32_t v) {
    return __reduce_add_sync(0xffffffffu, v);
}

/* Whether any lane's x is nonzero, to every lane: one vote (no barrier). */
__device__ __forceinline__ int fi_pp_warp_any(int x) { return __any_sync(0xffffffffu, x); }

/* Exclusive prefix sum of a[0 .. n) in place; returns the total to every thread (a
 * barrier), and with kMax the largest element into *max (the same barrier: the warps'
 * maxima travel beside their sums); with kRed also the sum of every thread's *rsum and the
 * maximum of every thread's *rmax, returned through them (fi_pp_sum_max's work in the
 * scan's barriers).  Each thread scans its chunk (fi_pp_chunk: before the
 * first barrier it reads only that, which FI_PP_FOR_CHUNK wrote); the chunk sums are
 * scanned across warps.  Elements >= 0.  kMax is a constant, so fi_pp_scan compiles
 * without the maxima (measured: carrying them through every scan of a plan cost the
 * planning kernel 0.5-1.0 us, H200, docs/perf-log.md twenty-sixth session). */
template <bool kMax, bool kRed>
__device__ __forceinline__ int64_t fi_pp_scan_impl(int64_t *a, int32_t n, int64_t *max,
                                                   int64_t *rsum, int64_t *rmax) {
    static_assert(3 * FI_PP_WARPS <= FI_PP_PART, "fi_pp_part holds the sums and two more");
    int64_t *warp_sum = fi_pp_part, *warp_max = fi_pp_part + FI_PP_WARPS;
    int64_t *warp_rsum = fi_pp_part + FI_PP_WARPS, *warp_rmax = fi_pp_part + 2 * FI_PP_WARPS;
    static_assert(!(kMax && kRed), "the maxima or the reductions, not both");
    const int32_t tid = threadIdx.x;
    const int32_t b = fi_pp_chunk(n, 0), e = fi_pp_chunk(n, 1);
    int64_t s = 0, m = 0;
    FI_PD_NO_UNROLL
    for (int32_t i = b; i < e; i++) { /* one element a thread up to n = 512 */
        s += a[i];
        if (kMax)
            m = a[i] > m ? a[i] : m;
    }
    const int lane = tid & 31, w = tid >> 5;
    int64_t x = s; /* inclusive scan in the warp */
    for (int o = 1; o < 32; o <<= 1) {
        const int64_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o)
            x += y;
    }
    if (kMax) {
        for (int o = 16; o > 0; o >>= 1) {
            const int64_t y = __shfl_xor_sync(0xffffffffu, m, o);
            m = y > m ? y : m;
        }
    }
    int64_t rs = 0, rm = 0;
    if (kRed) {
        rs = *rsum;
        rm = *rmax;
        fi_pp_xor_sum_max(&rs, &rm, 16);
    }
    if (lane == 31) {
        warp_sum[w] = x;
        if (kMax)
            warp_max[w] = m;
        if (kRed) {
            warp_rsum[w] = rs;
            warp_rmax[w] = rm;
        }
    }
    __syncthreads();
    /* The warp sums scanned by shuffles in every warp (as fi_pp_reduce). */
    int64_t ws = lane < FI_PP_WARPS ? warp_sum[lane] : 0;
    for (int o = 1; o < FI_PP_WARPS; o <<= 1) {
        const int64_t y = __shfl_up_sync(0xffffffffu, ws, o);
        if (lane >= o)
            ws += y;
    }
    if (kMax) {
        m = lane < FI_PP_WARPS ? warp_max[lane] : 0;
        for (int o = FI_PP_WARPS / 2; o > 0; o >>= 1) {
            const int64_t y = __shfl_xor_sync(0xffffffffu, m, o);
            m = y > m ? y : m;
        }
        *max = __shfl_sync(0xffffffffu, m, 0);
    }
    if (kRed)
        fi_pp_combine_sum_max(warp_rsum, warp_rmax, rsum, rmax);
    const int64_t total = __shfl_sync(0xffffffffu, ws, FI_PP_WARPS - 1);
    const int64_t before = __shfl_sync(0xffffffffu, ws, w > 0 ? w - 1 : 0);
    int64_t run = (w > 0 ? before : 0) + x - s;
    FI_PD_NO_UNROLL
    for (int32_t i = b; i < e; i++) {
        const int64_t v = a[i];
        a[i] = run;
        run += v;
    }
    __syncthreads(); /* every a[] written, warp_sum free */
    return total;
}
static __device__ __noinline__ int64_t fi_pp_scan(int64_t *a, int32_t n) {
    return fi_pp_scan_impl<false, false>(a, n, nullptr, nullptr, nullptr);
}
static __device__ __noinline__ int64_t fi_pp_scan_max(int64_t *a, int32_t n, int64_t *max) {
    return fi_pp_scan_impl<true, false>(a, n, max, nullptr, nullptr);
}
static __device__ __noinline__ int64_t fi_pp_scan_sum_max(int64_t *a, int32_t n, int64_t *rsum,
                                                          int64_t *rmax) {
    return fi_pp_scan_impl<false, true>(a, n, nullptr, rsum, rmax);
}
#else
FI_PD_STATIC inline int32_t fi_pp_chunk(int32_t n, int end) { return end ? n : 0; }
FI_PD_STATIC inline uint32_t fi_pp_warp_sum32(uint32_t v) { return v; }
FI_PD_STATIC inline int fi_pp_warp_any(int x) { return x; }
FI_PD_STATIC inline int64_t fi_pp_min(int64_t v) { return v; }
FI_PD_STATIC inline void fi_pp_sum_max(int64_t *s, int64_t *m) { (void)s, (void)m; }
FI_PD_STATIC inline int64_t fi_pp_scan_max(int64_t *a, int32_t n, int64_t *max) {
    int64_t run = 0, m = 0;
    for (int32_t i = 0; i < n; i++) {
        const int64_t v = a[i];
        a[i] = run;
        run += v;
        m = v > m ? v : m;
    }
    if (max)
        *max = m;
    return run;
}
FI_PD_STATIC inline int64_t fi_pp_scan(int64_t *a, int32_t n) { return fi_pp_scan_max(a, n, NULL); }
FI_PD_STATIC inline int64_t fi_pp_scan_sum_max(int64_t *a, int32_t n, int64_t *rsum, int64_t *rmax) {
    (void)rsum, (void)rmax;
    return fi_pp_scan_max(a, n, NULL);
}
#endif

#endif /* FIATTN_PLANNER_PARALLEL_H */
