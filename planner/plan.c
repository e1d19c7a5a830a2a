/*
 * planner/plan.c - plan lifetime and accessors: fi_plan_create, fi_plan_create_owned,
 * fi_plan_destroy, fi_plan_error, fi_plan_caps, fi_plan_get_view, fi_plan_balance
 * (fiattn.h).  fi_plan_update is in planner/plan_update.c.
 *
 * Host-only plans (workspace NULL, bytes 0) make no CUDA call (unless caps.num_ctas is 0,
 * which asks the device for its SM count); their staging comes from the allocator.
 * Device plans: two cudaHostAlloc staging buffers, two timing-free events, and the
 * semaphore region zeroed once with cudaMemset + cudaDeviceSynchronize (the only sync).
 */
#include <cuda_runtime_api.h>
#include <string.h>

#include "planner/caps_internal.h"
#include "plan/host_alloc.h"
#include "plan/device_guard.h"
#include "plan/plan.h"
#include "planner/scratch.h"

static fi_status cuda_status(cudaError_t e) {
    (void)cudaGetLastError(); /* clear a non-sticky error so later calls are not poisoned */
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
        return FI_ERR_NO_DEVICE;
    return FI_ERR_CUDA;
}

static void release(fi_plan *p) {
    const fi_allocator *a = &p->alloc;
    const int device = p->workspace != NULL;
    for (int i = 0; i < 2; i++) {
        if (device) {
            if (p->staging_event[i]) {
                if (p->staging_pending[i])
                    cudaEventSynchronize((cudaEvent_t)p->staging_event[i]);
                cudaEventDestroy((cudaEvent_t)p->staging_event[i]);
            }
            if (p->staging[i])
                cudaFreeHost(p->staging[i]);
        } else {
            fi_host_free(a, p->staging[i]);
        }
    }
    if (p->owns_workspace && p->workspace)
        cudaFree(p->workspace);
    fi_planner_scratch_destroy(p->scratch, a);
    fi_allocator copy = *a;
    fi_host_free(&copy, p);
}

static fi_status create_device_parts(fi_plan *p) {
    const size_t bytes = p->layout.plan_bytes;
    cudaError_t e;
    for (int i = 0; i < 2; i++) {
        void *h = NULL;
        e = cudaHostAlloc(&h, bytes, cudaHostAllocDefault);
        if (e != cudaSuccess)
            return cuda_status(e);
        p->staging[i] = h;
        memset(h, 0, bytes);
        cudaEvent_t ev;
        e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (e != cudaSuccess)
            return cuda_status(e);
        p->staging_event[i] = ev;
    }
    /* Semaphores self-reset after each merge (DESIGN.md), so they are zeroed only here, with
     * the device planner's status word that follows them (FI_OK until a device update). */
    e = cudaMemset((unsigned char *)p->workspace + p->layout.off_semaphores, 0,
                   p->layout.off_page_verdict - p->layout.off_semaphores);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    return e == cudaSuccess ? FI_OK : cuda_status(e);
}

/* fi_plan_create with the workspace's device current (device: -1 for host plans). */
static fi_status create_here(const fi_caps *caps, void *workspace, size_t workspace_bytes,
                             const fi_allocator *allocator, int device, fi_plan **plan) {
    fi_caps c;
    fi_layout l;
    fi_status st = fi_caps_resolve_layout(caps, &c, &l);
    if (st != FI_OK)
        return st;
    const int host = workspace == NULL && workspace_bytes == 0;
    if (!host) {
        if (!workspace)
            return FI_ERR_NULL_ARGUMENT;
        if ((uintptr_t)workspace % FI_WORKSPACE_ALIGN != 0)
            return FI_ERR_WORKSPACE_MISALIGNED;
        if (workspace_bytes < l.total_bytes)
            return FI_ERR_WORKSPACE_TOO_SMALL;
    }
    fi_allocator a = {0};
    if (allocator && allocator->alloc && allocator->free)
        a = *allocator;
    fi_plan *p = fi_host_alloc(&a, sizeof *p, 64);
    if (!p)
        return FI_ERR_OUT_OF_MEMORY;
    memset(p, 0, sizeof *p);
    p->caps = c;
    p->variant = fi_variant_of(&c);
    p->layout = l;
    p->alloc = a;
    p->workspace = workspace;
    p->device = device;
    p->err = (fi_error_detail){FI_OK, -1, -1, -1, 0};
    p->scratch = fi_planner_scratch_create(&l, &a);
    if (!p->scratch) {
        release(p);
        return FI_ERR_OUT_OF_MEMORY;
    }
    if (host) {
        for (int i = 0; i < 2; i++) {
            p->staging[i] = fi_host_alloc(&a, l.plan_bytes, FI_WORKSPACE_ALIGN);
            if (!p->staging[i]) {
                release(p);
                return FI_ERR_OUT_OF_MEMORY;
            }
            /* Zeroed once: padding and unused regions then copy as zeros forever. */
            memset(p->staging[i], 0, l.plan_bytes);
        }
    } else {
        st = create_device_parts(p);
        if (st != FI_OK) {
            release(p);
            return st;
        }
    }
    *plan = p;
    return FI_OK;
}

fi_status fi_plan_create(const fi_caps *caps, void *workspace, size_t workspace_bytes,
                         const fi_allocator *allocator, fi_plan **plan) {
    if (!caps || !plan)
        return FI_ERR_NULL_ARGUMENT;
    if (workspace == NULL && workspace_bytes == 0) /* host-only: no CUDA call at all */
        return create_here(caps, NULL, 0, allocator, -1, plan);
    int device = workspace ? fi_pointer_device(workspace) : -1, prev;
    if (device < 0 && cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        device = -1;
    }
    if (fi_device_enter(device, &prev) != cudaSuccess)
        return FI_ERR_NO_DEVICE;
    const fi_status st = create_here(caps, workspace, workspace_bytes, allocator, device, plan);
    fi_device_leave(prev);
    return st;
}

fi_status fi_plan_create_owned(const fi_caps *caps, const fi_allocator *allocator,
                               fi_plan **plan) {
    if (!caps || !plan)
        return FI_ERR_NULL_ARGUMENT;
    size_t bytes;
    fi_status st = fi_workspace_size(caps, &bytes);
    if (st != FI_OK)
        return st;
    void *ws = NULL;
    cudaError_t e = cudaMalloc(&ws, bytes);
    if (e != cudaSuccess)
        return cuda_status(e);
    st = fi_plan_create(caps, ws, bytes, allocator, plan);
    if (st != FI_OK) {
        cudaFree(ws);
        return st;
    }
    (*plan)->owns_workspace = 1;
    return FI_OK;
}

void fi_plan_destroy(fi_plan *plan) {
    if (!plan)
        return;
    int prev = -1;
    (void)fi_device_enter(plan->device, &prev); /* events and pinned memory of its device */
    release(plan);
    fi_device_leave(prev);
}

fi_error_detail fi_plan_error(const fi_plan *plan) {
    if (!plan)
        return (fi_error_detail){FI_ERR_NULL_ARGUMENT, -1, -1, -1, 0};
    return plan->err;
}

const fi_caps *fi_plan_caps(const fi_plan *plan) { return plan ? &plan->caps : NULL; }

fi_status fi_plan_get_view(const fi_plan *plan, fi_plan_view *view) {
    if (!plan || !view)
        return FI_ERR_NULL_ARGUMENT;
    if (!plan->planned)
        return FI_ERR_NOT_PLANNED;
    if (plan->on_device)
        return FI_ERR_PLAN_ON_DEVICE;
    unsigned char *base = plan->staging[plan->cur];
    const fi_layout *l = &plan->layout;
    view->header = fi_stage_header(base, l);
    view->work_indptr = fi_stage_work_indptr(base, l);
    view->cta_starts = fi_stage_cta_starts(base, l);
    view->items = fi_stage_items(base, l);
    view->groups = fi_stage_groups(base, l);
    view->requests = fi_stage_requests(base, l);
    view->num_ctas = l->num_ctas;
    return FI_OK;
}

/* Derived from the current header: max CTA cost over the mean (total / num_ctas). */
double fi_plan_balance(const fi_plan *plan) {
    if (!plan || !plan->planned || plan->on_device)
        return 0.0;
    const fi_plan_header *h = fi_stage_header(plan->staging[plan->cur], &plan->layout);
    return h->total_cost > 0
               ? (double)h->max_cta_cost * plan->layout.num_ctas / (double)h->total_cost
               : 1.0;
}
