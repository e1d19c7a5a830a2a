/*
 * plan/variant.h - the tile table: one row per (kind, variant), read by the workspace
 * layout, the planner and the executors.  Tile shape and cost-model constants are data
 * here, never a `?:` on the kind in code.
 *
 * The rows themselves live in executor/core/registry.c (the registration table): a row
 * also names the GPU family that runs it (executor/core/family.h), which the planner never
 * looks at.  Adding a kernel family = one folder under executor/ + one row there.
 */
#ifndef FIATTN_PLAN_VARIANT_H
#define FIATTN_PLAN_VARIANT_H

#include <stdint.h>

#include "plan/hd.h"

#include "fiattn.h"

struct fi_family; /* executor/core/family.h: how the GPU runs a variant (opaque here) */

/* How a row's batches are partitioned (docs/DESIGN.md section 4). */
typedef enum fi_partition_kind {
    FI_PARTITION_WALK = 0,     /* capped contiguous walk, then packing (planner/partition.c,
                                  pack.c): the best plans; sequential (device: one thread) */
    FI_PARTITION_PARALLEL = 1, /* equal-share cuts found independently (planner/ppart.c):
                                  what the device planner computes with a whole CTA */
    FI_PARTITION_LIST = 2,     /* the walk (and packing) as FI_PARTITION_WALK, and a list
                                  schedule of the tiles (planner/listsched.h): what a dynamic
                                  tile scheduler (FlashAttention-3's persistent one) would do,
                                  computed on the host; chosen when the executor model
                                  (planner/model.h) rates it at most list_slack_64ths / 64
                                  above the walk's plan.  Concurrent CTAs then work on the same
                                  few KV heads (L2 reuse of K / V, docs/DESIGN.md section 4);
                                  sequential like the walk (device: one thread) */
} fi_partition_kind;

typedef struct fi_variant {
    fi_kind kind;
    int32_t variant;            /* fi_caps.variant (0: the kind's default) */
    const char *name;           /* e.g. "mla_decode" */
    int32_t tile_rows;          /* rows (query row x head) per tile = partial slot height */
    int32_t kv_block;           /* the executor's KV block, tokens */
    /* Planner cost model (KV-token units; docs/DESIGN.md section 4, plan/cost_model.h). */
    int32_t kv_tile_tokens;     /* split grain: pieces start on multiples (power of two) */
    int32_t min_chunk_tokens;   /* no piece shorter than this */
    int32_t cost_alpha;         /* per tile row */
    int32_t cost_beta;          /* per item */
    int32_t cost_merge;         /* the piece that completes its group (packing model) */
    int32_t cost_arrive;        /* any other piece of a group */
    int32_t pack_thin_tiles_per_cta; /* packing: tiles of <= 16 rows a CTA (0: never pack);
                                        FI_PARTITION_PARALLEL rows: >= 2 packs a batch of
                                        <= 2 num_ctas tiles in pairs (planner/ppair.c) */
    int32_t pack_max_tiles_per_cta;  /* packing: other tiles a CTA (0: never) */
    int32_t partition;          /* fi_partition_kind: how the planner cuts the batch */
    int32_t default_min_heads;  /* > 0: this row serves caps.variant 0 when num_qo_heads >=
                                   it (the largest such threshold wins); 0: never */
    int32_t default_special;    /* 1: this row serves caps.variant 0 at any head count when
                                   the plan is sparse (caps.sparse_top_k > 0): the kind's
                                   only body with that path (an fp8 cache follows the heads:
                                   fi_variant_of) */
    int32_t default_kv16_page;  /* > 0: default_min_heads and default_kv16_max_rows hold
                                   only for a 16-bit (bf16 / fp16) cache of page_size >= it;
                                   other plans take the next threshold */
    int32_t default_max_rows;   /* > 0: this row serves caps.variant 0 when the caps bound a
                                   request's rows (group x q_len, fi_variant_request_rows) to
                                   at most it: the tile then holds a whole request */
    int32_t default_fp8_max_rows; /* > 0: default_max_rows for plans whose q and cache are
                                   both fp8 e4m3 only (checked first) */
    int32_t default_kv16_max_rows; /* > 0: default_max_rows for plans of a 16-bit (bf16 /
                                   fp16) cache only (checked next) */
    int32_t parallel_variant;   /* > 0: the row with FI_PARTITION_PARALLEL that plans this
                                   row's batches on the device (fi_caps_parallel_variant);
                                   0: none (rows that are parallel themselves answer their
                                   own number) */
    int32_t list_slack_64ths;   /* FI_PARTITION_LIST rows: the list schedule is chosen while
                                   its modelled time is <= (64 + this) / 64 of the walk's plan:
                                   the model counts work, not L2 misses, and the walk's plan of
                                   an 8k prefill ran 1.4x slower than without its KV loads
                                   (docs/perf-log.md); other rows: unused (0) */
    int32_t kv_head_major;      /* 1: tiles in KV-head-major order across the batch (all
                                   requests' KV head 0 tiles, then head 1 ...: planner/tiles.h),
                                   so the CTAs running one request's KV heads read its token
                                   rows at the same time; 0: request-major */
    const struct fi_family *family;  /* GPU executor of the row; NULL: CPU reference only */
} fi_variant;

/* Cost of one item (a tile, or a piece of a split tile), KV-token units: kv_tokens keys
 * over `rows` tile rows (query rows x heads), plus the per-item overhead. */
FI_HOST_DEVICE int64_t fi_variant_item_cost(const fi_variant *v, int64_t kv_tokens, int64_t rows) {
    return kv_tokens + (int64_t)v->cost_alpha * rows + v->cost_beta;
}

/* What the packing partition charges a split piece while it cannot yet know which piece of
 * its group ends last (and merges): the mean of the merge and arrival charges. */
FI_HOST_DEVICE int64_t fi_variant_piece_charge(const fi_variant *v) {
    return ((int64_t)v->cost_merge + v->cost_arrive) / 2;
}

/* The row of (kind, variant), or NULL when there is none (callers: FI_ERR_UNSUPPORTED_VARIANT).
 * Pure; the table is static and lives as long as the program. */
const fi_variant *fi_variant_find(fi_kind kind, int32_t variant);

/* The row that serves (kind, variant) at num_qo_heads: variant 0 is the kind's default,
 * the row with default_special when `special` (a sparse plan), else (both_fp8: q and
 * cache fp8 e4m3) a row with default_fp8_max_rows >= request_rows, else (a 16-bit cache:
 * kv16_page_size > 0, at least the row's default_kv16_page) a row with
 * default_kv16_max_rows >= request_rows, else a row with
 * default_max_rows >= request_rows (request_rows > 0), else the
 * row whose default_min_heads is the largest one <= num_qo_heads (a row with
 * default_kv16_page only when kv16_page_size >= it), else the row with variant 0; any
 * other variant, its own row.  kv16_page_size: the page size of a bf16 / fp16 cache, 0
 * for any other cache; both_fp8: 1 when q and cache are both fp8 e4m3; request_rows:
 * fi_variant_request_rows (0: unknown).  NULL when there is none. */
const fi_variant *fi_variant_select(fi_kind kind, int32_t variant, int32_t num_qo_heads,
                                    int32_t special, int32_t kv16_page_size,
                                    int32_t request_rows, int32_t both_fp8);

/* The rows a request of the caps has at most, as far as the caps tell: group (H_q / H_kv)
 * x the mean MTP depth ceil(max_q_tokens / max_batch).  A batch that gives one request
 * more query rows than the mean still runs correctly on the row this picks, in more tiles
 * (a row of tile_rows 8 cuts it into tiles of 8, each reading the KV head again).  0 when
 * a field is not positive (the caps check refuses those). */
static inline int32_t fi_variant_request_rows(const fi_caps *caps) {
    if (caps->num_kv_heads <= 0 || caps->num_qo_heads <= 0 || caps->max_batch <= 0 ||
        caps->max_q_tokens <= 0)
        return 0;
    const int64_t depth = ((int64_t)caps->max_q_tokens + caps->max_batch - 1) / caps->max_batch;
    const int64_t rows = (int64_t)(caps->num_qo_heads / caps->num_kv_heads) * depth;
    return rows > INT32_MAX ? INT32_MAX : (int32_t)rows;
}

/* The row for caps->kind / variant / num_qo_heads / sparse_top_k / kv_dtype / q_dtype /
 * page_size / request rows (caps non-NULL), or NULL.  MLA decode: an fp8 cache follows the
 * heads like a 16-bit one up to the row only 16-bit caches of 64-token pages take (the
 * 64-token wgmma body), except that requests of at most 16 rows take a transposed body:
 * the fp8 one for q and cache both fp8, the 16-bit one for a 16-bit cache of 64-token
 * pages or more. */
static inline const fi_variant *fi_variant_of(const fi_caps *caps) {
    const int kv16 = caps->kv_dtype == FI_DTYPE_BF16 || caps->kv_dtype == FI_DTYPE_F16;
    const int fp8 = caps->kv_dtype == FI_DTYPE_E4M3 && caps->q_dtype == FI_DTYPE_E4M3;
    return fi_variant_select(caps->kind, caps->variant, caps->num_qo_heads, caps->sparse_top_k > 0,
                             kv16 ? caps->page_size : 0, fi_variant_request_rows(caps), fp8);
}

#endif /* FIATTN_PLAN_VARIANT_H */
