/*
 * executor/cuda/persistent/kernel.cuh - the persistent CTA loop every family runs, and
 * its launcher.
 *
 * A family F is a traits struct:
 *   using Params = ...;        its parameter struct; member `c` is the common block
 *                              (executor/core/exec_params.h)
 *   using Merge = fi::SplitMerge<W, Rows, O, kThreads>;   its split merge
 *   static constexpr int kThreads;     the threads that run items (and the merge)
 *   static constexpr int kProducerWarps;  0, or warps after the kThreads that only load
 *   static constexpr int kConsumerRegs;   0, or the registers a thread the kThreads take
 *                                      (setmaxnreg.inc) once the producers gave theirs back
 *   static constexpr size_t kSmemBytes;
 *   struct State;                      what a CTA's item runs carry from one to the next
 *   static __device__ State setup(unsigned char *smem);   every thread, before the roles
 *                                      split (e.g. mbarrier init by one thread); followed
 *                                      by a CTA barrier
 *   static __device__ bool run_item(const Params &, const RunCtx &, const fi_work_item &,
 *                                   const fi_request_info &, unsigned char *smem, bool first,
 *                                   State &);
 *     one work item, the kThreads threads; returns 1 when the item is a split of a group
 *     that is merged cooperatively after the CTA's last item (merge_phase).
 *   static __device__ void produce(const Params &, const fi_cta_start &, unsigned char *smem);
 *     (kProducerWarps > 0 only) the producer warps' whole life: every load of every item
 *     of the CTA, handed to run_item through shared-memory mbarriers.
 *
 * CTA c walks items cta_starts[c].item_begin .. item_end - 1 of the plan region (the grid
 * never changes, so a captured graph follows fi_plan_update).  The first item and its
 * request row come in the start record; the next item and its request row are loaded
 * while the current one runs (two dependent round trips off each item's critical path).
 * PDL: nothing global is read before griddepcontrol.wait; launch_dependents comes last
 * (a dependent grid started earlier could take SMs from CTAs of this one not yet
 * resident, and the merge phase needs the whole grid resident).
 */
#pragma once

#include <cuda_runtime.h>

#include "executor/cuda/common/profile.cuh"
#include "executor/cuda/common/ptx.cuh"
#include "executor/cuda/common/run_ctx.cuh"

namespace fi {

template <class F> constexpr int block_threads() { return F::kThreads + 32 * F::kProducerWarps; }

/* Families that run wgmma (kConsumerRegs > 0) see the CTA's role split, item range and
 * merge flag through fi::uniform, as values ptxas knows to be warp-uniform; the others see
 * the plain values (the GQA bodies spill more with the extra shuffles). */

template <class F>
__global__ void __launch_bounds__(block_threads<F>(), 1)
    persistent_kernel(const __grid_constant__ typename F::Params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    FI_STAMP(0);
    FI_STAMP_SM();
    typename F::State st = F::setup(smem);
    if constexpr (F::kProducerWarps > 0)
        __syncthreads(); /* setup done; the last CTA-wide barrier (producers join no other) */
    griddep_wait(); /* everything global (plan, q, KV, scales) may come from the previous kernel */
    const RunCtx ctx = run_ctx(p.c);
    const fi_cta_start cs = p.c.cta_starts[blockIdx.x];
    if constexpr (F::kProducerWarps > 0) {
        bool producer = threadIdx.x >= F::kThreads;
        if constexpr (F::kConsumerRegs > 0)
            producer = uniform(producer);
        if (producer) {
            F::produce(p, cs, smem);
            return; /* an exited thread counts as having triggered the dependents */
        }
        if constexpr (F::kConsumerRegs > 0)
            setmaxnreg_inc<F::kConsumerRegs>();
    }
    int i0 = cs.item_begin, i1 = cs.item_end;
    if constexpr (F::kConsumerRegs > 0) {
        i0 = uniform(i0);
        i1 = uniform(i1);
    }
    FI_STAMP(1);
    fi_work_item it = cs.first;
    fi_request_info rq = cs.request;
    bool any_coop = false;
    for (int i = i0; i < i1; ++i) {
        fi_work_item nit = it;
        fi_request_info nrq = rq;
        if (i + 1 < i1) {
            nit = p.c.items[i + 1];
            nrq = p.c.requests[nit.request];
        }
        any_coop |= F::run_item(p, ctx, it, rq, smem, i == i0, st);
        it = nit;
        rq = nrq;
    }
    if constexpr (F::kConsumerRegs > 0)
        any_coop = uniform(any_coop);
    if (any_coop) /* uniform over the CTA */
        F::Merge::merge_phase(p.c, ctx, i0, i1, smem, F::kSmemBytes);
    FI_STAMP(3);
    griddep_launch_dependents();
}

/* Resident-CTA limit of kernel `fn` on the current device (SMs x occupancy), with its
 * shared-memory attribute set there; cached per device (a process that drives several
 * GPUs gets each device's own limit).  Setting the attribute is idempotent, so a race
 * between host threads only repeats the work.  0 and the error on failure. */
template <class F> cudaError_t resident_ctas(int *limit) {
    constexpr int kMaxDevices = 64;
    static int cache[kMaxDevices]; /* 0: not yet known */
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return e;
    if (dev < kMaxDevices && cache[dev] > 0) {
        *limit = cache[dev];
        return cudaSuccess;
    }
    const void *fn = reinterpret_cast<const void *>(persistent_kernel<F>);
    int sms = 0, per_sm = 0;
    e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)F::kSmemBytes);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel<F>,
                                                          block_threads<F>(), F::kSmemBytes);
    if (e != cudaSuccess)
        return e;
    *limit = sms * per_sm;
    if (dev < kMaxDevices)
        cache[dev] = *limit;
    return cudaSuccess;
}

/* Launch family F's persistent grid (p.c.num_ctas CTAs) on stream, with programmatic
 * stream serialization when enable_pdl.  cudaErrorCooperativeLaunchTooLarge when the grid
 * cannot be resident at once (nothing launched). */
template <class F>
cudaError_t launch_persistent(const typename F::Params &p, int enable_pdl, cudaStream_t stream) {
    int limit = 0;
    cudaError_t e = resident_ctas<F>(&limit);
    if (e != cudaSuccess)
        return e;
    if (p.c.num_ctas > limit)
        return cudaErrorCooperativeLaunchTooLarge;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)p.c.num_ctas);
    cfg.blockDim = dim3(block_threads<F>());
    cfg.dynamicSmemBytes = F::kSmemBytes;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = enable_pdl ? 1 : 0;
    e = cudaLaunchKernelEx(&cfg, persistent_kernel<F>, p);
    if (e != cudaSuccess)
        return e;
    return cudaGetLastError();
}

}  // namespace fi
