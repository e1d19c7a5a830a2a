/*
 * planner/plan_update.c - fi_plan_update (fiattn.h): validate, tile, partition and lay out
 * a batch into the back staging buffer, then (device plans) one cudaMemcpyAsync of the
 * used prefix and an event record, then flip.  Allocates nothing; never syncs the device
 * (it waits on the back buffer's event only if the copy issued from it two updates ago is
 * still pending).  On any error the front buffer, the device copy and the view are those
 * of the previous plan; only the error detail changes.  O(batch + used pages + items).
 */
#include <cuda_runtime_api.h>
#include <string.h>

#include "plan/plan.h"
#include "planner/partition.h"
#include "planner/scratch.h"
#include "planner/tiles.h"
#include "planner/validate.h"

static fi_status set_err(fi_plan *p, fi_status st, int32_t cuda_error) {
    p->err = (fi_error_detail){st, -1, -1, -1, cuda_error};
    return st;
}

/* Build the whole plan for `batch` into staging buffer `base`, and in *geom what it reads
 * of the page table.  Host only. */
static fi_status build(fi_plan *p, const fi_batch *batch, unsigned char *base,
                       fi_page_table_geom *geom) {
    const fi_layout *l = &p->layout;
    fi_error_detail *err = &p->err;
    fi_request_info *requests = fi_stage_requests(base, l);
    int32_t total_q = 0;
    fi_planner_scratch *s = p->scratch;
    fi_status st = fi_batch_check(&p->caps, batch, requests, &total_q, geom, err);
    if (st != FI_OK)
        return st;
    int32_t num_tiles = 0;
    int64_t tile_cost = 0;
    st = fi_tiles_build(p->variant, &p->caps, requests, batch->batch_size, batch->causal,
                        batch->window_left, s->tiles, l->max_tiles, &num_tiles, &tile_cost,
                        err);
    if (st != FI_OK)
        return st;
    fi_merge_group *groups = fi_stage_groups(base, l);
    fi_partition_result r;
    st = fi_partition(p->variant, s->tiles, num_tiles, tile_cost, s->tile_prefix, &s->pack, l,
                      fi_stage_work_indptr(base, l), fi_stage_items(base, l), groups,
                      s->cta_cost, &r, err);
    if (st != FI_OK)
        return st;
    /* Unused tails of the copied regions are zeroed so the copied bytes depend only on the
     * batch (byte-identical plans, no stale entries from an older plan on the device). */
    memset(requests + batch->batch_size, 0,
           sizeof(fi_request_info) * (size_t)(l->max_batch - batch->batch_size));
    memset(groups + r.num_groups, 0,
           sizeof(fi_merge_group) * (size_t)(l->max_groups - r.num_groups));

    /* Per-CTA start records, from the CSR ranges just written. */
    const int32_t *indptr = fi_stage_work_indptr(base, l);
    const fi_work_item *items = fi_stage_items(base, l);
    fi_cta_start *starts = fi_stage_cta_starts(base, l);
    for (int32_t c = 0; c < l->num_ctas; c++)
        starts[c] = fi_cta_start_make(indptr, items, requests, c);

    fi_plan_header *h = fi_stage_header(base, l);
    const int split = batch->form != FI_FORM_INDPTR && batch->kv_split_pages;
    h->num_items = r.num_items;
    h->num_groups = r.num_groups;
    h->num_slots = r.num_slots;
    h->batch_size = batch->batch_size;
    h->total_q_tokens = total_q;
    h->tile_rows = l->tile_rows;
    h->kv_chunk = r.budget > INT32_MAX ? INT32_MAX : (int32_t)r.budget;
    h->pages_per_row = split ? batch->max_pages_per_seq : 0;
    h->kv_split_pages = split;
    h->causal = batch->causal;
    h->window_left = batch->window_left;
    h->form = batch->form;
    h->total_cost = r.total_cost;
    h->max_cta_cost = r.max_cta_cost;
    return FI_OK;
}

fi_status fi_plan_update(fi_plan *plan, const fi_batch *batch, void *stream) {
    if (!plan)
        return FI_ERR_NULL_ARGUMENT;
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
    fi_status st = build(plan, batch, base, &geom);
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
            plan->cur = next;
            plan->page_table = geom;
            plan->planned = 1;
            return set_err(plan, FI_ERR_CUDA, (int32_t)e);
        }
        plan->staging_pending[next] = 1;
    }
    plan->cur = next;
    plan->page_table = geom;
    plan->planned = 1;
    plan->err = (fi_error_detail){FI_OK, -1, -1, -1, 0};
    return FI_OK;
}
