/*
 * workspace/layout.h - where everything lives in the device workspace.
 *
 * Offsets depend only on the caps (never on a batch), so a captured CUDA graph keeps
 * valid pointers across re-plans.  Every region starts on a 256-byte boundary.
 *
 *   plan region (copied from pinned staging each fi_plan_update, prefix up to the last
 *   used item):
 *     header       fi_plan_header                       64 B
 *     work_indptr  int32 [num_ctas + 1]                  CSR CTA ranges
 *     cta_starts   fi_cta_start [num_ctas]               64 B each: range + first item + its request
 *     requests     fi_request_info [max_requests]        16 B each (max_requests below)
 *     groups       fi_merge_group [max_groups]           32 B each
 *     items        fi_work_item [max_items]              32 B each
 *   device-only region:
 *     partial_o    fp32 [max_slots, tile_rows, head_dim_vo]
 *     partial_lse  fp32 [max_slots, tile_rows]
 *     semaphores   uint32 [max_groups]   zeroed once at create, self-resetting after
 *   device planner region (fi_plan_update_device; never copied, never read by executors):
 *     device_status    fi_device_status                the last device-planned step's verdict
 *     page_verdict     int64 [max_requests]            per request: pages all in range, or
 *                                                      the first bad index (planner/validate.h)
 *     planner_scratch  the planner's working arrays (planner/scratch.h), carved as on the host
 *
 * Bounds (derived for the contiguous cost walk of planner/partition.c):
 *   requests     R = max_batch, or max(max_batch, max_q_tokens) for a sparse plan
 *                  (caps.sparse_top_k > 0: every query token is a request of q_len 1)
 *   q tiles      T <= H_kv * (ceil(max_q_tokens / (tile_rows / group)) + R)
 *                  (each request's rows are cut into tiles; the ceil adds < 1 tile/request)
 *                  when group >= tile_rows: T <= H_kv * max_q_tokens * ceil(group/tile_rows)
 *   cuts         C <= num_ctas - 1        (the walk cuts a tile only at a CTA boundary)
 *   items        I <= T + C
 *   groups       G <= C                   (a tile cut k times is one group)
 *   slots        S <= 2 * C               (k cuts make k + 1 pieces: sum <= C + G)
 */
#ifndef FIATTN_WORKSPACE_LAYOUT_H
#define FIATTN_WORKSPACE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "fiattn.h"
#include "plan/hd.h"

#define FI_WORKSPACE_ALIGN 256

typedef struct fi_layout {
    int32_t num_ctas;
    int32_t tile_rows;      /* rows (query row x head) per tile, see fi_tile_rows() */
    int32_t head_dim_vo;
    int32_t max_batch;      /* entries of the request table (and of every per-request
                               array: page_verdict, the planner's per-request scratch):
                               fi_layout_max_requests(caps), which is caps.max_batch for a
                               dense plan and max(max_batch, max_q_tokens) for a sparse one */
    int32_t max_tiles;
    int32_t max_items;
    int32_t max_groups;
    int32_t max_slots;
    size_t off_header;
    size_t off_work_indptr;
    size_t off_cta_starts;
    size_t off_requests;
    size_t off_groups;
    size_t off_items;
    size_t plan_bytes;      /* end of the items region = largest copy */
    size_t off_partial_o;
    size_t off_partial_lse;
    size_t off_semaphores;
    size_t off_device_status;
    size_t off_page_verdict;
    size_t off_planner_scratch;
    size_t total_bytes;     /* fi_workspace_size() */
} fi_layout;

/* The device planner's verdict on the step it planned last (fi_plan_device_error): the
 * fi_error_detail of the first broken rule, or status FI_OK.  32 bytes, zeroed at create. */
typedef struct fi_device_status {
    int32_t status;     /* fi_status */
    int32_t request;    /* offending request, else -1 */
    int64_t needed;
    int64_t limit;
    int64_t reserved;
} fi_device_status;

/* Rows per tile of the caps' tile table row (plan/variant.h): the M of the executor's tile
 * (query rows x heads of one KV head); today MLA 64 (one wgmma M), GQA decode 64,
 * context 128.  0 when kind / variant name no row. */
int32_t fi_tile_rows(const fi_caps *caps);

/* Requests a plan of these caps may hold: caps.max_batch, or for a sparse plan
 * (caps.sparse_top_k > 0, one request per query token) max(max_batch, max_q_tokens).
 * <= FI_LIMIT_MAX_Q_TOKENS for caps within the limits. */
FI_HOST_DEVICE int32_t fi_layout_max_requests(const fi_caps *caps) {
    if (caps->sparse_top_k > 0 && caps->max_q_tokens > caps->max_batch)
        return caps->max_q_tokens;
    return caps->max_batch;
}

/* The item bound of the caps, I = T + C above (C = num_ctas - 1; 0 when num_ctas is 0,
 * not resolved yet), computed in int64 without overflow from any int32 caps; INT64_MAX
 * when it would not fit or the caps have no tile table row / a non-positive count. */
int64_t fi_layout_item_bound(const fi_caps *caps);

/* Fill *layout from validated caps with num_ctas already resolved (> 0).  Every size is
 * computed with checked arithmetic.
 * @return FI_OK, FI_ERR_UNSUPPORTED_VARIANT (no tile table row), FI_ERR_INVALID_CAPS
 *   (num_ctas or max_batch <= 0), FI_ERR_NUM_CTAS_OVER_LIMIT, or FI_ERR_PLAN_OVER_LIMIT
 *   (items over FI_LIMIT_PLAN_ITEMS, or a size that would wrap size_t). */
fi_status fi_layout_compute(const fi_caps *caps, fi_layout *layout);

/* Bytes of the plan prefix that an update must copy: through the last used item. */
FI_HOST_DEVICE size_t fi_layout_used_bytes(const fi_layout *layout, int32_t num_items) {
    return layout->off_items + sizeof(fi_work_item) * (size_t)num_items;
}

#endif /* FIATTN_WORKSPACE_LAYOUT_H */
