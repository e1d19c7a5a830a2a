/*
 * planner/device/plan_kernel.cu - the device planner: fi_plan_update_device's kernel.
 *
 * One CTA (a cluster of two for the parallel rows: the second scans the page table and
 * checks the batch's rules, see plan_kernel).  The planner's C sources are compiled here a
 * second time, as file-local device functions (plan/hd.h: FI_PLANNER_DEVICE_TU), so host
 * and device plans come from one source and are byte-identical for the same batch.
 *   1. every thread reads the step's batch size (after griddepcontrol.wait: the engine's
 *      previous kernel may have written it);
 *   2. the used page indices are scanned (the O(used pages) part, fi_batch_validate's
 *      range rule; a contiguous range of entries a warp) into page_verdict [B]: by the
 *      whole CTA, or for the parallel rows by the cluster's second CTA, which then checks
 *      the batch's rules while the first plans unchecked (plan_kernel);
 *   3. the plan: fi_plan_build on thread 0 (the walk and packing rows) or
 *      fi_plan_build_parallel on every thread (planner/ppart.c), straight into the plan
 *      region, then the three capacity rules of fi_device_batch.  On any broken rule it
 *      writes the empty plan instead (the executor then writes nothing) and the rule into
 *      the status word.
 * The walk's partition is sequential (planner/partition.c, pack.c): one thread, so what it
 * touches lives in shared memory where it fits (dynamic, up to the opt-in maximum): the
 * page verdicts, the plan region (built there, zeroed first, copied out by the whole CTA at
 * the end), then the scratch arrays hottest first (planner/scratch.c); the rest in the
 * workspace's planner_scratch region.  A global access from the one thread costs an L2
 * round trip each (the first version, all in global memory: ~600 us a plan).
 */
#define FI_PLANNER_DEVICE_TU 1
/* This file is built once per CTA size: as itself (FI_DEVPLAN_THREADS, planner/parallel.h)
 * and through plan_kernel_small.cu, which sets a smaller size, its own namespace and
 * launcher first. */
#ifndef FI_DEVPLAN_NS
#define FI_DEVPLAN_NS fi_devplan
#define FI_DEVPLAN_LAUNCH fi_device_plan_launch_default
#endif

#include <cooperative_groups.h>
#include <cuda/ptx>
#include <cuda_runtime.h>

#include "executor/cuda/common/ptx.cuh"
#include "planner/device/plan_kernel.h"

#ifdef FI_PROFILE
/* Clock stamps of the last plan (plan/hd.h FI_PD_STAMP), read back by
 * fi_device_plan_read_stamps: profiling builds only. */
__device__ long long fi_pd_stamps[FI_PD_STAMPS];
__device__ __forceinline__ void fi_pd_stamp(int k) { fi_pd_stamps[k] = clock64(); }
#endif

#include "planner/validate.c"
#include "planner/tiles.c"
#include "planner/model.c"
#include "planner/pack.c"
#include "planner/listsched.c"
#include "planner/partition.c"
#include "planner/ppair.c"
#include "planner/ppart.c"
#include "planner/build.c"

/* A named namespace (not an anonymous one): the kernels' mangled names stay the same from
 * build to build, for scripts/accepted-spills.txt. */
namespace FI_DEVPLAN_NS {

constexpr int kThreads = FI_DEVPLAN_THREADS; /* planner/parallel.h */

__device__ void set_status(fi_device_status *s, const fi_error_detail &e) {
    s->status = (int32_t)e.status;
    s->request = e.request;
    s->needed = e.needed;
    s->limit = e.limit;
    s->reserved = 0;
}

__device__ fi_error_detail detail(fi_status st, int32_t request, int64_t needed, int64_t limit) {
    fi_error_detail e;
    e.status = st;
    e.request = request;
    e.needed = needed;
    e.limit = limit;
    e.cuda_error = 0;
    return e;
}

/* What every thread reads through pointers (the planner's functions take the caps, tile
 * table row, layout, batch and scratch arrays by address): in shared memory, written once
 * (stage_params).  A per-thread copy would live in local memory, and so would every load
 * through it (MLA heads 16 at 128 requests: most of the plan's memory traffic was local);
 * a pointer into the __grid_constant__ parameter is a generic load from the global path. */
struct plan_shared {
    fi_caps caps;
    fi_variant variant; /* its pointers are host pointers, never read here */
    fi_layout layout;
    fi_batch batch; /* batch_size: this step's B */
    fi_planner_scratch scratch;
    fi_error_detail check; /* CTA 0's: the batch check's verdict, written by CTA 1 */
};
/* The launcher leaves 2 KiB of the opt-in shared memory to static arrays: this and
 * planner/parallel.h's combine buffer (FI_PP_PART x 8 bytes). */
constexpr unsigned kStaticSmem = 2048;
static_assert(sizeof(plan_shared) + FI_PP_PART * sizeof(int64_t) <= kStaticSmem,
              "static shared memory");

/* Where request b's used page entries are (its row; *used entries a row, the V row at +P),
 * or none to scan (*used 0): a request whose other rules fail is not scanned
 * (fi_batch_check_pages reports the earlier rule first), and only rows inside the declared
 * arrays are read. */
__device__ int64_t scan_row(const fi_device_plan_params &p, const fi_batch &bt,
                            const table_geo &t, int32_t b, int64_t *used) {
    const fi_request_fields f = fi_request_read(&bt, b, t.row_stride);
    *used = f.kv_len >= 0 ? table_pages_used(&t, f.kv_len) : 0;
    const int in_table = bt.form != FI_FORM_INDPTR || f.row + *used <= p.kv_indices_len;
    if (!(*used > 0 && *used <= f.avail && f.row >= 0 && in_table))
        *used = 0;
    return f.row;
}

/* page_verdict[b] of every request (planner/validate.h): all used entries of all rows are
 * read at once, the first bad position of a request kept by an atomic minimum (K row first,
 * then V), then turned into the bad index.  offset, row, used: scratch [B + 1] each.
 * Entries are numbered request by request (offset: the exclusive scan of each request's
 * count); warp w reads the w-th contiguous range of them, 32 consecutive entries a warp
 * load (one or two table rows, coalesced), kGather loads a lane in flight (a cold table
 * costs a DRAM round trip a round, not one an entry).  A lane's request only moves
 * forward, so it is found by one binary search a warp and then a step per request
 * crossed (a binary search an entry was most of the scan at 1024 requests). */
__device__ void scan_pages(const fi_device_plan_params &p, const plan_shared &sh,
                           int64_t *verdict, int64_t *offset, int64_t *rows, int64_t *useds) {
    const fi_batch &bt = sh.batch;
    const int32_t B = bt.batch_size;
    const table_geo t = table_geo_of(&sh.caps, &bt);
    const int64_t rows_per_request = t.row_stride > t.P ? 2 : 1; /* [B, 2, P]: K and V */
    const uint32_t limit = (uint32_t)p.caps.num_pages;
    FI_PP_FOR_CHUNK(b, B) { /* fi_pp_scan's chunks: no barrier before it */
        int64_t used;
        rows[b] = scan_row(p, bt, t, b, &used);
        useds[b] = used;
        offset[b] = used * rows_per_request;
        verdict[b] = INT64_MAX; /* no bad position yet */
    }
    const int64_t total = fi_pp_scan(offset, B);
    constexpr int kGather = 8;
    const int64_t per = (total + FI_PP_WARPS - 1) / FI_PP_WARPS;
    const int lane = threadIdx.x & 31;
    const int64_t begin = (threadIdx.x >> 5) * per;
    const int64_t end = begin + per < total ? begin + per : total;
    int32_t lo = begin < end ? fi_last_le(offset, B, begin) : 0;
    for (int64_t i0 = begin + lane; i0 < end; i0 += 32 * kGather) {
        int32_t at[kGather], page[kGather];
        int64_t k[kGather];
#pragma unroll
        for (int u = 0; u < kGather; u++) {
            const int64_t i = i0 + 32 * u;
            at[u] = -1;
            if (i < end) {
                while (lo + 1 < B && offset[lo + 1] <= i)
                    lo++;
                at[u] = lo;
                const int64_t used = useds[lo];
                k[u] = i - offset[lo];
                page[u] = t.table[rows[lo] + (k[u] < used ? k[u] : t.P + (k[u] - used))];
            }
        }
#pragma unroll
        for (int u = 0; u < kGather; u++)
            if (at[u] >= 0 && (uint32_t)page[u] >= limit)
                atomicMin((unsigned long long *)&verdict[at[u]], (unsigned long long)k[u]);
    }
    __syncthreads();
    for (int32_t b = threadIdx.x; b < B; b += kThreads) {
        const int64_t k = verdict[b], row = rows[b], used = useds[b];
        verdict[b] =
            k == INT64_MAX ? FI_PAGES_OK : t.table[row + (k < used ? k : t.P + (k - used))];
    }
}

/* After a build on unchecked requests (fi_plan_build_parallel_unchecked): wait for the
 * checking CTA's release (scan_and_check) and take its verdict when a rule is broken: the
 * host validates first, so its error (the lowest failing request's first broken rule)
 * replaces whatever the build returned; on a batch that passes, the build's result stands.
 * Every thread of CTA 0. */
__device__ fi_status apply_check(const plan_shared &sh, fi_status st, fi_error_detail *err) {
    cuda::ptx::barrier_cluster_wait(); /* phase 0 (plan_kernel), long complete */
    cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
    cuda::ptx::barrier_cluster_wait(cuda::ptx::sem_acquire);
    if (sh.check.status == FI_OK)
        return st;
    *err = sh.check;
    return sh.check.status;
}

/* CTA 1 of the cluster: the page scan into `pages` (the workspace's page_verdict region),
 * then the batch check on those verdicts (fi_batch_check_parallel: the host's rules and
 * order), its arrays in this CTA's shared memory (`arrays`: three of arr_bytes); the
 * verdict goes into CTA 0's sh.check, then the release CTA 0's apply_check waits for.
 * Every thread of CTA 1. */
__device__ void scan_and_check(const fi_device_plan_params &p, plan_shared &sh,
                               int64_t *pages, unsigned char *arrays, size_t arr_bytes) {
    scan_pages(p, sh, pages, (int64_t *)arrays, (int64_t *)(arrays + arr_bytes),
               (int64_t *)(arrays + 2 * arr_bytes));
    __syncthreads(); /* the verdicts are read by other threads; the arrays are reused */
    fi_error_detail e = detail(FI_OK, -1, -1, -1);
    int32_t total_q = 0;
    fi_batch_check_parallel(&sh.caps, &sh.batch, pages, (int64_t *)arrays,
                            (fi_request_info *)(arrays + arr_bytes), &total_q, NULL, &e);
    cuda::ptx::barrier_cluster_wait(); /* phase 0: CTA 0 is running (distributed shared memory) */
    if (threadIdx.x == 0)
        *cooperative_groups::this_cluster().map_shared_rank(&sh.check, 0) = e;
    cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
}

/* plan_shared's descriptors from the parameter block, a 4-byte word a thread (the batch's
 * batch_size word becomes the step's B), and the scratch arrays bound to their places (the
 * launcher's, planner/scratch.h) by the last warp, a pointer a thread, at the same time.
 * Every thread; the caller's barrier publishes it. */
__device__ void stage_params(const fi_device_plan_params &p, plan_shared &sh, int32_t step_b,
                             unsigned char *smem) {
    static_assert(sizeof(fi_caps) % 4 == 0 && sizeof(fi_variant) % 4 == 0 &&
                      sizeof(fi_layout) % 4 == 0 && sizeof(fi_batch) % 4 == 0,
                  "word copies");
    constexpr int kC = sizeof(fi_caps) / 4, kV = sizeof(fi_variant) / 4,
                  kL = sizeof(fi_layout) / 4, kB = sizeof(fi_batch) / 4;
    static_assert(kC + kV + kL + kB <= kThreads - 32 && FI_SCRATCH_ARRAYS <= 32,
                  "the words and the scratch pointers on distinct threads");
    constexpr int kBatchSizeWord = offsetof(fi_batch, batch_size) / 4;
    const int i = threadIdx.x;
    if (i < kC) {
        ((uint32_t *)&sh.caps)[i] = ((const uint32_t *)&p.caps)[i];
    } else if (i < kC + kV) {
        ((uint32_t *)&sh.variant)[i - kC] = ((const uint32_t *)&p.variant)[i - kC];
    } else if (i < kC + kV + kL) {
        ((uint32_t *)&sh.layout)[i - kC - kV] = ((const uint32_t *)&p.layout)[i - kC - kV];
    } else if (i < kC + kV + kL + kB) {
        const int w = i - kC - kV - kL;
        ((uint32_t *)&sh.batch)[w] =
            w == kBatchSizeWord ? (uint32_t)step_b : ((const uint32_t *)&p.batch)[w];
    } else if (i >= kThreads - 32 && i - (kThreads - 32) < (int)FI_SCRATCH_ARRAYS) {
        const int a = i - (kThreads - 32);
        ((void **)&sh.scratch)[a] = fi_planner_scratch_bind_one(
            &p.scratch_places, a, smem, p.workspace + p.layout.off_planner_scratch);
    }
}

/* The plan into `base` (shared or the workspace), or the empty plan and the broken rule.
 * Rows with the parallel partition: every thread; the others: thread 0 alone. */
template <bool kParallel>
__device__ void plan_step(const fi_device_plan_params &p, plan_shared &sh,
                          const int64_t *verdict, bool checked_elsewhere, unsigned char *base,
                          fi_device_status *status) {
    const fi_batch &bt = sh.batch;
    fi_error_detail err = detail(FI_OK, -1, -1, -1);
    fi_status st;
    if constexpr (kParallel) {
        st = checked_elsewhere
                 ? fi_plan_build_parallel_unchecked(&sh.caps, &sh.variant, &sh.layout,
                                                    &sh.scratch, &bt, base, &err)
                 : fi_plan_build_parallel(&sh.caps, &sh.variant, &sh.layout, &sh.scratch, &bt,
                                          verdict, base, NULL, &err);
        __syncthreads(); /* the header is the leader's */
        if (checked_elsewhere)
            st = apply_check(sh, st, &err);
    } else {
        st = fi_plan_build(&sh.caps, &sh.variant, &sh.layout, &sh.scratch, &bt, verdict, base,
                           NULL, &err);
    }
    if (threadIdx.x != 0)
        return;
    if (st == FI_OK) {
        const fi_plan_header *h = fi_stage_header(base, &sh.layout);
        if (h->total_q_tokens > p.max_q_tokens)
            err = detail(FI_ERR_DEVICE_BATCH_OVER_DECLARED, -1, h->total_q_tokens,
                         p.max_q_tokens);
        else if (bt.form == FI_FORM_INDPTR && bt.kv_indptr[bt.batch_size] > p.kv_indices_len)
            err = detail(FI_ERR_DEVICE_BATCH_OVER_DECLARED, -1, bt.kv_indptr[bt.batch_size],
                         p.kv_indices_len);
    }
    if (err.status != FI_OK)
        fi_plan_build_empty(&sh.layout, base);
    set_status(status, err);
}

/* Whole CTA: n bytes (a multiple of 16, 16-byte aligned ends) from src to dst, or zeros. */
__device__ void block_copy16(unsigned char *dst, const unsigned char *src, size_t n) {
    for (size_t i = (size_t)threadIdx.x * 16; i < n; i += (size_t)kThreads * 16)
        *(uint4 *)(dst + i) = src ? *(const uint4 *)(src + i) : make_uint4(0, 0, 0, 0);
}

__host__ __device__ inline size_t round64(size_t x) { return (x + 63) / 64 * 64; }

/* Where the kernel's dynamic shared memory (smem_bytes) holds what: the page verdicts [B_max]
 * at 0 when they fit, then the plan region when it fits, then the scratch arrays from
 * scratch_off (the launcher places them, planner/scratch.h, the kernel binds them); split:
 * the parallel rows' second CTA holds its three scan arrays (offset, row, used: [B_max + 1]
 * each, scan_arr bytes apiece) in its own shared memory, CTA 0's scratch possibly being in
 * the workspace, where CTA 1 would overwrite it (the verdicts are then in shared memory). */
struct smem_map {
    bool verdict_in_smem, plan_in_smem, split;
    size_t plan_off, scratch_off, scan_arr;
};
__host__ __device__ inline smem_map smem_map_of(const fi_layout &l, size_t smem_bytes,
                                                bool parallel) {
    smem_map m;
    size_t off = round64(sizeof(int64_t) * (size_t)l.max_batch);
    m.verdict_in_smem = off <= smem_bytes;
    if (!m.verdict_in_smem)
        off = 0;
    m.scan_arr = round64(sizeof(int64_t) * ((size_t)l.max_batch + 1));
    m.split = parallel && 3 * m.scan_arr <= smem_bytes;
    m.plan_in_smem = off + round64(l.plan_bytes) <= smem_bytes;
    m.plan_off = off;
    m.scratch_off = m.plan_in_smem ? off + round64(l.plan_bytes) : off;
    return m;
}

/* One kernel per partition kind: the parallel one carries none of the walk's and packing's
 * code (a single CTA runs through it, often with the L2 cold after the previous step's
 * executor: every instruction-cache miss is a DRAM round trip).  p is __grid_constant__, so
 * no thread copies it (408 bytes) into local memory; what the planner takes by address is
 * copied once into plan_shared. */
template <bool kParallel>
__global__ void __launch_bounds__(kThreads, 1)
    plan_kernel(const __grid_constant__ fi_device_plan_params p, unsigned smem_bytes) {
    extern __shared__ __align__(64) unsigned char smem[];
    __shared__ plan_shared sh;
#ifdef FI_PROFILE
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        for (int k = 0; k < FI_PD_STAMPS; k++)
            fi_pd_stamps[k] = 0;
        FI_PD_STAMP(9);
    }
#endif
    fi::griddep_wait(); /* the lengths may come from the previous kernel */
    /* griddepcontrol.launch_dependents only once the plan is built (before the copy-out):
     * the executor's grid then launches while this CTA copies the plan out, and waits for
     * this grid's completion (its griddepcontrol.wait) before it reads anything.  Launched
     * at the start instead, its persistent grid became resident on every SM but the
     * planner's, whose CTAs then started last and held up the in-kernel merge: slower for
     * MLA (docs/perf-log.md, 2026-11-29 twelfth session); launched at the end, as the
     * planner's threads exit, its launch latency was on the step's path (twenty-ninth
     * session: the trigger after the build took e2e with PDL up to 3 us lower, level at
     * MLA heads 16 with 1 and 32 requests). */
    const fi_layout &l = p.layout;
    fi_device_status *status = (fi_device_status *)(p.workspace + l.off_device_status);
    /* Shared memory: verdicts, the plan region, then scratch (smem_map). */
    const smem_map m = smem_map_of(l, smem_bytes, kParallel);
    int64_t *const pages_region = (int64_t *)(p.workspace + l.off_page_verdict);
    int64_t *verdict = m.verdict_in_smem ? (int64_t *)smem : pages_region;
    /* The parallel rows run as a cluster of two CTAs (fi_device_plan_launch): CTA 1 scans
     * the page table into the workspace's page_verdict region and checks the batch's rules
     * while CTA 0 plans without checking and takes CTA 1's verdict at the end
     * (apply_check), so the scan, a chain of global round trips, and the rules are off the
     * plan's path.  Where the verdicts do not fit in shared memory CTA 0 scans and checks
     * alone, as the walk's kernel does. */
    const unsigned rank = kParallel ? cooperative_groups::this_cluster().block_rank() : 0;
    const size_t scan_arr = m.scan_arr;
    const bool split = m.split;
    if (rank == 1 && !split)
        return;
    unsigned char *base = m.plan_in_smem ? smem + m.plan_off : p.workspace;
    const size_t plan_bytes = round64(l.plan_bytes);
    stage_params(p, sh, p.batch_size ? *p.batch_size : p.batch.batch_size, smem);
    __syncthreads();
    if (threadIdx.x == 0 && rank == 0)
        FI_PD_STAMP(11);
    const int32_t B = sh.batch.batch_size;
    if (B < 0 || B > p.batch.batch_size) {
        if (threadIdx.x == 0 && rank == 0) {
            fi_plan_build_empty(&l, p.workspace);
            set_status(status, B < 0 ? detail(FI_ERR_NEGATIVE_BATCH_SIZE, -1, B, 0)
                                     : detail(FI_ERR_DEVICE_BATCH_OVER_DECLARED, -1, B,
                                              p.batch.batch_size));
        }
        return;
    }
    if (split) /* phase 0 of the cluster barrier: both CTAs have started */
        cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_relaxed);
    if (rank == 1) { /* the page scan and the check; CTA 0 waits for its release */
        scan_and_check(p, sh, pages_region, smem, scan_arr);
        return;
    }
    if (base != p.workspace)
        block_copy16(base, NULL, plan_bytes); /* padding copies out as zeros */
    if (!split)
        scan_pages(p, sh, verdict, sh.scratch.pp.batch_scan, sh.scratch.pp.req_row,
                   sh.scratch.pp.req_used);
    __syncthreads();
    if (threadIdx.x == 0)
        FI_PD_STAMP(0);
    if (kParallel || threadIdx.x == 0)
        plan_step<kParallel>(p, sh, verdict, split, base, status);
    fi::griddep_launch_dependents(); /* CTA 0 (CTA 1 exits after its check) */
    if (threadIdx.x == 0)
        FI_PD_STAMP(8);
    if (base == p.workspace)
        return;
    __syncthreads();
    const int32_t items = fi_stage_header(base, &sh.layout)->num_items;
    block_copy16(p.workspace, base, (fi_layout_used_bytes(&sh.layout, items) + 15) / 16 * 16);
#ifdef FI_PROFILE
    __syncthreads();
    if (threadIdx.x == 0)
        FI_PD_STAMP(10);
#endif
}

}  // namespace FI_DEVPLAN_NS

using FI_DEVPLAN_NS::kStaticSmem;
using FI_DEVPLAN_NS::kThreads;
using FI_DEVPLAN_NS::plan_kernel;
using FI_DEVPLAN_NS::round64;
using FI_DEVPLAN_NS::smem_map_of;

#ifdef FI_PROFILE
extern "C" int fi_device_plan_read_stamps(long long *host) {
    return (int)cudaMemcpyFromSymbol(host, fi_pd_stamps, sizeof(long long) * FI_PD_STAMPS);
}
#endif

extern "C" int FI_DEVPLAN_LAUNCH(const fi_device_plan_params *p, int enable_pdl,
                                 void *stream) {
    /* As much shared memory as the plan wants (verdicts + plan region + scratch), up to what
     * the current device grants a CTA. */
    int dev = 0, optin = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess)
        return (int)e;
    const fi_layout &l = p->layout;
    const size_t want = round64(sizeof(int64_t) * (size_t)l.max_batch) + round64(l.plan_bytes) +
                        (l.total_bytes - l.off_planner_scratch); /* the scratch region */
    size_t room = (size_t)optin > kStaticSmem ? (size_t)optin - kStaticSmem : 0;
#ifdef FI_DEVPLAN_MAX_SMEM /* experiments: a smaller shared-memory carve-out */
    room = room < (size_t)FI_DEVPLAN_MAX_SMEM ? room : (size_t)FI_DEVPLAN_MAX_SMEM;
#endif
    const unsigned smem = (unsigned)(want < room ? want : room);
    void (*kernel)(fi_device_plan_params, unsigned) =
        p->variant.partition == FI_PARTITION_PARALLEL ? plan_kernel<true> : plan_kernel<false>;
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return (int)e;
    /* The parallel rows: a cluster of two CTAs, the second scanning the page table and
     * checking the batch's rules (plan_kernel). */
    const int ctas = p->variant.partition == FI_PARTITION_PARALLEL ? 2 : 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(ctas);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = (cudaStream_t)stream;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (ctas > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = (unsigned)ctas;
        attr[n].val.clusterDim.y = 1;
        attr[n].val.clusterDim.z = 1;
        n++;
    }
    if (enable_pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    /* The scratch arrays placed here, on the host, for the kernel to bind (scratch.h). */
    fi_device_plan_params q = *p;
    fi_scratch_arena arena = {smem, smem_map_of(l, smem, ctas > 1).scratch_off, 0};
    fi_planner_scratch_place(&q.scratch_places, &l, &arena);
    e = cudaLaunchKernelEx(&cfg, kernel, q, smem);
    if (e == cudaSuccess)
        e = cudaGetLastError();
    return (int)e;
}

#ifndef FI_DEVPLAN_SMALL
extern "C" int fi_device_plan_launch(const fi_device_plan_params *p, int enable_pdl,
                                     void *stream) {
    if (p->variant.partition == FI_PARTITION_PARALLEL &&
        p->layout.max_tiles <= FI_DEVPLAN_SMALL_MAX_TILES)
        return fi_device_plan_launch_small(p, enable_pdl, stream);
    return fi_device_plan_launch_default(p, enable_pdl, stream);
}
#endif
