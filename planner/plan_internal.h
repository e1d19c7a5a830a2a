/*
 * planner/plan_internal.h - the opaque fi_plan, shared by the planner (planner/), the
 * CPU reference executor (executor/cpu/) and the GPU launcher (executor/run.c).
 * Not installed.
 *
 * Staging: two host buffers of layout.plan_bytes each (pinned for device plans).  An update
 * builds the new plan in staging[cur ^ 1] (after waiting on that buffer's event, i.e. the
 * copy issued from it two updates ago), then on success issues one cudaMemcpyAsync of the
 * used prefix, records the buffer's event and flips cur.  On any error cur is unchanged,
 * so the host view and the device copy stay those of the previous plan.
 */
#ifndef FIATTN_PLAN_INTERNAL_H
#define FIATTN_PLAN_INTERNAL_H

#include <stdint.h>

#include "fiattn.h"
#include "workspace/layout.h"

/* A tile before partitioning: the rectangle of one request and KV head, its effective KV
 * range (after causal / window_left trimming) and its cost.  Scratch, host only. */
typedef struct fi_tile {
    int32_t request;
    int16_t head_begin, head_end;
    int32_t q_begin, q_end;
    int32_t kv_begin, kv_end;
    int64_t cost;
} fi_tile;

/* One piece while packing: tile, KV range, CTA (bin), split flag (a piece of a cut tile,
 * charged FI_COST_PIECE while packing), cost (KV-token units, plan/cost_model.h,
 * without the charge). */
typedef struct fi_pack_piece {
    int32_t tile, kv0, kv1, bin;
    int32_t split, pad;
    int64_t cost;
} fi_pack_piece;

/* Scratch of the packing partition (planner/pack.h), owned by the plan (allocated once at
 * create; sizes from the layout: max_items >= max_tiles, max_slots, max_groups + 1). */
typedef struct fi_pack_scratch {
    fi_pack_piece *pieces; /* [max_items] */
    fi_pack_piece *sorted; /* [max_items] */
    int32_t *by_cost;      /* [max_tiles]: tiles by decreasing cost */
    int32_t *order;        /* [max_items]: sort scratch, remainder queue, slot lists */
    int32_t *tile_group;   /* [max_tiles] */
    int32_t *cta_start;    /* [max(num_ctas, max_groups) + 1] */
    int64_t *load;         /* [num_ctas] */
    int64_t *suffix;       /* [max_tiles + 1]: cost of by_cost[i ..] */
    int32_t *bk_head;      /* [512]: CTAs by load bucket (planner/pack.c) */
    int32_t *bk_next, *bk_prev, *bk_where; /* [num_ctas] each */
    /* The packing's plan before it is chosen (planner/model.h scores it first). */
    fi_work_item *items;   /* [max_items] */
    fi_merge_group *groups; /* [max_groups] */
    int32_t *work_indptr;  /* [num_ctas + 1] */
    int64_t *cta_cost;     /* [num_ctas] */
    int64_t *finish;       /* [max_items]: fi_model_max scratch */
    int32_t *last;         /* [max_groups] */
} fi_pack_scratch;

struct fi_plan {
    fi_caps caps;              /* num_ctas resolved */
    fi_layout layout;
    fi_allocator alloc;
    void *workspace;           /* device workspace (NULL: host-only plan) */
    int owns_workspace;        /* 1: created by fi_plan_create_owned, cudaFree at destroy */
    unsigned char *staging[2]; /* [plan_bytes] each; pinned (device plan) or host memory */
    void *staging_event[2];    /* cudaEvent_t per staging buffer, NULL for host plans */
    int staging_pending[2];    /* 1 once a copy was issued from that buffer */
    int cur;                   /* staging buffer holding the current plan */
    int planned;               /* 1 after the first successful update */
    fi_tile *tiles;            /* scratch [layout.max_tiles] */
    int64_t *cta_cost;         /* scratch [num_ctas] */
    int64_t *tile_prefix;      /* scratch [max_tiles + 1]: prefix sums of tile costs */
    fi_pack_scratch pack;      /* scratch of the packing partition (planner/pack.h) */
    fi_error_detail err;
};

/* Pointers into a staging buffer (or a device workspace: same offsets). */
static inline fi_plan_header *fi_stage_header(unsigned char *base, const fi_layout *l) {
    return (fi_plan_header *)(base + l->off_header);
}
static inline int32_t *fi_stage_work_indptr(unsigned char *base, const fi_layout *l) {
    return (int32_t *)(base + l->off_work_indptr);
}
static inline fi_cta_start *fi_stage_cta_starts(unsigned char *base, const fi_layout *l) {
    return (fi_cta_start *)(base + l->off_cta_starts);
}
static inline fi_request_info *fi_stage_requests(unsigned char *base, const fi_layout *l) {
    return (fi_request_info *)(base + l->off_requests);
}
static inline fi_merge_group *fi_stage_groups(unsigned char *base, const fi_layout *l) {
    return (fi_merge_group *)(base + l->off_groups);
}
static inline fi_work_item *fi_stage_items(unsigned char *base, const fi_layout *l) {
    return (fi_work_item *)(base + l->off_items);
}

#endif /* FIATTN_PLAN_INTERNAL_H */
