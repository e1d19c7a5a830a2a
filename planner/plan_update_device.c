/*
 * planner/plan_update_device.c - fi_plan_update_device and fi_plan_device_error (fiattn.h):
 * the host half of device planning.  The host checks what it can know without reading a
 * length (the batch's scalars, the declared capacities), records what fi_run must check
 * its tensors against, and launches the planning kernel (planner/device/plan_kernel.cu).
 * No copy, no synchronisation, no allocation: capturable.  Also fi_caps_parallel_variant,
 * the tile table's answer to which row plans on the device.
 */
#include <cuda_runtime_api.h>

#include "plan/plan.h"
#include "plan/device_guard.h"
#include "planner/device/plan_kernel.h"
#include "planner/validate.h"

static fi_status set_err(fi_plan *p, fi_status st, int64_t needed, int64_t limit,
                         int32_t cuda_error) {
    p->err = (fi_error_detail){st, needed, limit, -1, cuda_error};
    return st;
}

/* What fi_run may read of the page table under the declared capacities: every column of
 * B_max rows, or kv_indices_len entries. */
static fi_page_table_geom declared_geom(const fi_device_batch *d) {
    fi_page_table_geom g = fi_page_table_geom_begin(&d->batch);
    if (d->batch.form == FI_FORM_INDPTR)
        g.extent = d->kv_indices_len;
    else
        g.max_cols = d->batch.max_pages_per_seq;
    return g;
}

/* (plan non-NULL: the entry point checks it.) */
static fi_status update_device_here(fi_plan *plan, const fi_device_batch *dbatch,
                                    int enable_pdl, void *stream) {
    if (!dbatch)
        return set_err(plan, FI_ERR_NULL_ARGUMENT, -1, -1, 0);
    /* Sparse top-k plans are planned on the host only (fiattn.h): refused before the
     * workspace is looked at, so a host-only plan gets the same answer. */
    if (plan->caps.sparse_top_k > 0)
        return set_err(plan, FI_ERR_SPARSE_UNSUPPORTED, plan->caps.sparse_top_k, 0, 0);
    if (!plan->workspace)
        return set_err(plan, FI_ERR_HOST_PLAN, -1, -1, 0);
    const fi_batch *b = &dbatch->batch;
    fi_error_detail err;
    fi_status st = fi_batch_check_scalars(&plan->caps, b, &err);
    if (st != FI_OK) {
        plan->err = err;
        return st;
    }
    if (dbatch->max_q_tokens < 0 || dbatch->max_q_tokens > plan->caps.max_q_tokens)
        return set_err(plan, FI_ERR_Q_TOKENS_OVER_CAPS, dbatch->max_q_tokens,
                       plan->caps.max_q_tokens, 0);
    if (b->form == FI_FORM_INDPTR && dbatch->kv_indices_len < 0)
        return set_err(plan, FI_ERR_INVALID_ARGUMENT, dbatch->kv_indices_len, 0, 0);

    fi_device_plan_params p;
    p.caps = plan->caps;
    p.variant = *plan->variant;
    p.layout = plan->layout;
    p.batch = *b;
    p.batch_size = dbatch->batch_size;
    p.max_q_tokens = dbatch->max_q_tokens;
    p.kv_indices_len = b->form == FI_FORM_INDPTR ? dbatch->kv_indices_len : 0;
    p.workspace = plan->workspace;
    const int e = fi_device_plan_launch(&p, enable_pdl, stream);
    if (e != 0)
        return set_err(plan, FI_ERR_CUDA, -1, -1, e);
    plan->page_table = declared_geom(dbatch);
    plan->planned = 1;
    plan->on_device = 1;
    plan->run_q_tokens = dbatch->max_q_tokens;
    plan->device_page_table = b->form == FI_FORM_INDPTR ? b->kv_indices : b->block_tables;
    plan->err = (fi_error_detail){FI_OK, -1, -1, -1, 0};
    return FI_OK;
}

fi_status fi_plan_device_error(const fi_plan *plan, fi_error_detail *detail, void *stream) {
    if (!plan || !detail)
        return FI_ERR_NULL_ARGUMENT;
    if (!plan->workspace)
        return FI_ERR_HOST_PLAN;
    fi_device_status s;
    cudaStream_t cs = (cudaStream_t)stream;
    cudaError_t e = cudaMemcpyAsync(&s, (unsigned char *)plan->workspace +
                                            plan->layout.off_device_status,
                                    sizeof s, cudaMemcpyDeviceToHost, cs);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(cs);
    if (e != cudaSuccess)
        return FI_ERR_CUDA;
    *detail = (fi_error_detail){(fi_status)s.status, s.needed, s.limit, s.request, 0};
    return FI_OK;
}

/* The entry point: the plan's device current for the call (plan/device_guard.h). */
fi_status fi_plan_update_device(fi_plan *plan, const fi_device_batch *dbatch, int enable_pdl,
                                void *stream) {
    if (!plan)
        return FI_ERR_NULL_ARGUMENT;
    int prev;
    if (fi_device_enter(plan->device, &prev) != cudaSuccess)
        return FI_ERR_CUDA;
    const fi_status st = update_device_here(plan, dbatch, enable_pdl, stream);
    fi_device_leave(prev);
    return st;
}

fi_status fi_caps_parallel_variant(const fi_caps *caps, int32_t *variant) {
    if (!caps || !variant)
        return FI_ERR_NULL_ARGUMENT;
    const fi_status st = fi_caps_validate(caps);
    if (st != FI_OK)
        return st;
    const fi_variant *v = fi_variant_of(caps);
    const int32_t pv = !v ? 0 : v->partition == FI_PARTITION_PARALLEL ? v->variant : v->parallel_variant;
    if (pv <= 0)
        return FI_ERR_UNSUPPORTED_VARIANT;
    *variant = pv;
    return FI_OK;
}
