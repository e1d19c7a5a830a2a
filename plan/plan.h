/*
 * plan/plan.h - the opaque fi_plan: the object between the planner (planner/, which
 * makes it) and the executors (executor/cpu/, executor/run.c, which read its current host
 * view and its workspace).  Not installed.
 *
 * Staging: two host buffers of layout.plan_bytes each (pinned for device plans).  An update
 * builds the new plan in staging[cur ^ 1] (after waiting on that buffer's event, i.e. the
 * copy issued from it two updates ago), then on success issues one cudaMemcpyAsync of the
 * used prefix, records the buffer's event and flips cur.  On any error cur is unchanged,
 * so the host view and the device copy stay those of the previous plan.
 */
#ifndef FIATTN_PLAN_PLAN_H
#define FIATTN_PLAN_PLAN_H

#include <stdint.h>

#include "plan/hd.h"

#include "fiattn.h"
#include "plan/page_table.h"
#include "plan/variant.h"
#include "workspace/layout.h"

struct fi_planner_scratch; /* planner/scratch.h: the planner's own working arrays */

struct fi_plan {
    fi_caps caps;              /* num_ctas resolved */
    const fi_variant *variant; /* the caps' tile table row (never NULL: checked at create) */
    fi_layout layout;
    fi_allocator alloc;
    void *workspace;           /* device workspace (NULL: host-only plan) */
    int device;                /* the GPU of the workspace, made current by every device
                                  entry point (plan/device_guard.h); -1: host plan */
    int owns_workspace;        /* 1: created by fi_plan_create_owned, cudaFree at destroy */
    unsigned char *staging[2]; /* [plan_bytes] each; pinned (device plan) or host memory */
    void *staging_event[2];    /* cudaEvent_t per staging buffer, NULL for host plans */
    int staging_pending[2];    /* 1 once a copy was issued from that buffer */
    int cur;                   /* staging buffer holding the current plan */
    int planned;               /* 1 after the first successful update */
    fi_page_table_geom page_table; /* the current plan's batch: what it reads of the page
                                      table (set with cur, host only); after a device
                                      update, what the declared capacities allow */
    int on_device;             /* 1: the current plan was made by fi_plan_update_device */
    int32_t run_q_tokens;      /* rows fi_run's q / out / lse must hold: the plan's total q
                                  tokens, or the device batch's declared max_q_tokens */
    const int32_t *device_page_table; /* on_device: the table the device planner validated
                                         (block_tables or kv_indices); fi_run must pass it */
    struct fi_planner_scratch *scratch; /* owned; allocated at create */
    fi_error_detail err;
};

/* Pointers into a staging buffer (or a device workspace: same offsets). */
FI_HOST_DEVICE fi_plan_header *fi_stage_header(unsigned char *base, const fi_layout *l) {
    return (fi_plan_header *)(base + l->off_header);
}
FI_HOST_DEVICE int32_t *fi_stage_work_indptr(unsigned char *base, const fi_layout *l) {
    return (int32_t *)(base + l->off_work_indptr);
}
FI_HOST_DEVICE fi_cta_start *fi_stage_cta_starts(unsigned char *base, const fi_layout *l) {
    return (fi_cta_start *)(base + l->off_cta_starts);
}
FI_HOST_DEVICE fi_request_info *fi_stage_requests(unsigned char *base, const fi_layout *l) {
    return (fi_request_info *)(base + l->off_requests);
}
FI_HOST_DEVICE fi_merge_group *fi_stage_groups(unsigned char *base, const fi_layout *l) {
    return (fi_merge_group *)(base + l->off_groups);
}
FI_HOST_DEVICE fi_work_item *fi_stage_items(unsigned char *base, const fi_layout *l) {
    return (fi_work_item *)(base + l->off_items);
}

#endif /* FIATTN_PLAN_PLAN_H */
