/*
 * planner/plan_update.c - fi_plan_update (fiattn.h): validate, tile, partition and lay out
 * a batch into the back staging buffer, then (device plans) one cudaMemcpyAsync of the
 * used prefix and an event record, then flip.  Allocates nothing; never syncs the device
 * (it waits on the back buffer's event only if the copy issued from it two updates ago is
 * still pending).  On any error the front buffer, the device copy and the view are those
 * of the previous plan; only the error detail changes.  O(batch + used pages + items).
 */
#include <cuda_runtime_api.h>

#include "plan/plan.h"
#include "plan/device_guard.h"
#include "planner/build.h"

static fi_status set_err(fi_plan *p, fi_status st, int32_t cuda_error) {
    p->err = (fi_error_detail){st, -1, -1, -1, cuda_error};
    return st;
}

/* Staging buffer `next` now holds the current plan (host view and device copy). */
static void plan_current(fi_plan *p, int next, const fi_page_table_geom *geom) {
    p->cur = next;
    p->page_table = *geom;
    p->planned = 1;
    p->on_device = 0;
    p->run_q_tokens = fi_stage_header(p->staging[next], &p->layout)->total_q_tokens;
    p->device_page_table = NULL;
}

/* (plan non-NULL: the entry point checks it.) */
static fi_status update_here(fi_plan *plan, const fi_batch *batch, void *stream) {
    if (!batch)
        return set_err(plan, FI_ERR_NULL_ARGUMENT, 0);
    const int device = plan->workspace != NULL;
    const int next = plan->cur ^ 1;
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e;
    if (device) {
        enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        e = cudaStreamIsCapturing(s, &cs);
        if (e == cudaErrorStreamCaptureImplicit || e == cudaErrorStreamCaptureUnsupported) {
            (void)cudaGetLastError(); /* the legacy stream while another stream captures */
            return set_err(plan, FI_ERR_STREAM_CAPTURING, (int32_t)e);
        }
        if (e != cudaSuccess)
            return set_err(plan, FI_ERR_CUDA, (int32_t)e);
        if (cs != cudaStreamCaptureStatusNone)
            return set_err(plan, FI_ERR_STREAM_CAPTURING, 0);
        if (plan->staging_pending[next]) {
            /* The copy issued from this buffer two updates ago may still be reading it. */
            e = cudaEventSynchronize((cudaEvent_t)plan->staging_event[next]);
            if (e != cudaSuccess)
                return set_err(plan, FI_ERR_CUDA, (int32_t)e);
            plan->staging_pending[next] = 0;
        }
    }
    unsigned char *base = plan->staging[next];
    fi_page_table_geom geom;
    fi_status st =
        plan->variant->partition == FI_PARTITION_PARALLEL
            ? fi_plan_build_parallel(&plan->caps, plan->variant, &plan->layout, plan->scratch,
                                     batch, NULL, base, &geom, &plan->err)
            : fi_plan_build(&plan->caps, plan->variant, &plan->layout, plan->scratch, batch,
                            NULL, base, &geom, &plan->err);
    if (st != FI_OK)
        return st; /* build filled plan->err */
    if (device) {
        const size_t bytes =
            fi_layout_used_bytes(&plan->layout, fi_stage_header(base, &plan->layout)->num_items);
        e = cudaMemcpyAsync(plan->workspace, base, bytes, cudaMemcpyHostToDevice, s);
        if (e != cudaSuccess)
            return set_err(plan, FI_ERR_CUDA, (int32_t)e);
        e = cudaEventRecord((cudaEvent_t)plan->staging_event[next], s);
        if (e != cudaSuccess) {
            /* The copy is enqueued but unguarded: wait for it so staging stays safe, and
             * make the new plan current since the device copy now holds it. */
            cudaStreamSynchronize(s);
            plan_current(plan, next, &geom);
            return set_err(plan, FI_ERR_CUDA, (int32_t)e);
        }
        plan->staging_pending[next] = 1;
    }
    plan_current(plan, next, &geom);
    plan->err = (fi_error_detail){FI_OK, -1, -1, -1, 0};
    return FI_OK;
}

/* The entry point: the plan's device current for the call (plan/device_guard.h). */
fi_status fi_plan_update(fi_plan *plan, const fi_batch *batch, void *stream) {
    if (!plan)
        return FI_ERR_NULL_ARGUMENT;
    if (!plan->workspace)
        return update_here(plan, batch, stream); /* host plan: no CUDA call */
    int prev;
    if (fi_device_enter(plan->device, &prev) != cudaSuccess)
        return FI_ERR_CUDA;
    const fi_status st = update_here(plan, batch, stream);
    fi_device_leave(prev);
    return st;
}
