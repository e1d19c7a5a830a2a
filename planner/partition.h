/*
 * planner/partition.h - balanced split-k: tiles -> work items, CTA ranges, merge groups.
 *
 * Algorithm: the contiguous cost walk of FlashMLA's decode scheduler (get_mla_metadata /
 * get_decoding_sched_meta: requests in order, each SM takes the next fixed "payload" of
 * KV blocks plus per-request overhead, cutting a request where an SM boundary falls) with
 * flash-decoding's split-KV merge (Dao et al. 2023): a cut tile's pieces write fp32
 * partials that the last CTA of the group merges in split order.  planner/partition.c has
 * the details (budget, rounding, floor).  Then, for batches of thin tiles (pack.h), the
 * packing partition replaces the walk's plan when the executor model (planner/model.h)
 * rates it cheaper.  Rows whose partition is FI_PARTITION_LIST (plan/variant.h: context)
 * then also compute the list schedule (planner/listsched.h) and take it while its model is
 * within the row's list_slack_64ths of the plan so far.
 */
#ifndef FIATTN_PLANNER_PARTITION_H
#define FIATTN_PLANNER_PARTITION_H

#include "plan/variant.h"
#include "planner/scratch.h"

typedef struct fi_partition_result {
    int32_t num_items;
    int32_t num_groups;
    int32_t num_slots;
    int64_t budget;        /* cost per CTA the walk aimed at */
    int64_t total_cost;    /* sum of item costs (a cut adds one item's overhead) */
    int64_t max_cta_cost;
} fi_partition_result;

/* Where a tile may be cut, from the variant row: on request-local token multiples of
 * `tile` (kv_tile_tokens, a power of two: rounding is a mask), never leaving a piece
 * shorter than `floor` (min_chunk_tokens).  Read into locals once per update. */
typedef struct fi_split_grain {
    int64_t mask;  /* ~(tile - 1) */
    int32_t tile;
    int32_t floor;
} fi_split_grain; /* 16 bytes: passed in two registers */

FI_HOST_DEVICE fi_split_grain fi_split_grain_of(const fi_variant *v) {
    const fi_split_grain g = {~((int64_t)v->kv_tile_tokens - 1), v->kv_tile_tokens,
                              v->min_chunk_tokens};
    return g;
}
/* Nearest / next / previous multiple of the tile (x >= 0; round_down gives -1 for x < 0). */
FI_HOST_DEVICE int64_t fi_grain_round(fi_split_grain g, int64_t x) {
    return (x + g.tile / 2) & g.mask;
}
FI_HOST_DEVICE int64_t fi_grain_round_up(fi_split_grain g, int64_t x) {
    return (x + g.tile - 1) & g.mask;
}
FI_HOST_DEVICE int64_t fi_grain_round_down(fi_split_grain g, int64_t x) {
    return x < 0 ? -1 : x & g.mask;
}

/* Partition tiles[0 .. num_tiles) (tile order) over l->num_ctas CTAs under the cost model
 * and split grain of row v (plan/variant.h).
 * prefix: scratch [num_tiles + 1] (prefix sums of tile costs).
 * Writes work_indptr[num_ctas + 1], items[< l->max_items], groups[< l->max_groups],
 * cta_cost[num_ctas] and *res.  total_cost: sum of the tiles' costs.
 * @return FI_OK; FI_ERR_PLAN_OVER_CAPS if a layout bound (items, groups, slots) would be
 *   exceeded (err filled; nothing is written past a bound).
 * O(tiles + trials * num_ctas * log tiles); trials: 1-5 on trace decode batches. */
FI_PD fi_status fi_partition(const fi_variant *v, const fi_tile *tiles, int32_t num_tiles,
                       int64_t total_cost, int64_t *prefix, fi_pack_scratch *pack,
                       const fi_layout *l, int32_t *work_indptr, fi_work_item *items,
                       fi_merge_group *groups, int64_t *cta_cost, fi_partition_result *res,
                       fi_error_detail *err);

/* The data-parallel partition (planner/ppart.c) of the tiles of *ts (scratch.h
 * fi_tile_set, as fi_tiles_build_parallel leaves them; one block when pair packing
 * applies) over l->num_ctas CTAs: every thread of the device planner calls it
 * (planner/parallel.h), the host once.  Writes work_indptr [num_ctas + 1], items, groups
 * and *res (budget: the equal share per CTA); scratch s->tile_prefix and s->pp.
 * @return FI_OK, or FI_ERR_PLAN_OVER_CAPS (err filled) if a layout bound would be exceeded
 * (a bug).  O((tiles + CTAs) log) work, O(log) depth. */
FI_PD fi_status fi_partition_parallel(const fi_variant *v, const fi_tile_set *ts,
                                      fi_planner_scratch *s, const fi_layout *l,
                                      int32_t *work_indptr, fi_work_item *items,
                                      fi_merge_group *groups, fi_partition_result *res,
                                      fi_error_detail *err);

/* Whether fi_partition_parallel packs tiles[0 .. T) on n CTAs in pairs (planner/ppair.c,
 * fi_partition_pairs) instead of cutting the equal share: rows that pack
 * (pack_thin_tiles_per_cta >= 2) and batches of 1 to 2 n tiles. */
FI_HOST_DEVICE int fi_partition_pairs_apply(const fi_variant *v, int32_t T, int32_t n) {
    return v->pack_thin_tiles_per_cta >= 2 && T > 0 && T <= 2 * (int64_t)n;
}

/* Pair packing (planner/ppair.c): fi_partition_parallel's plan where
 * fi_partition_pairs_apply holds, the same outputs and scratch (s->tile_prefix, s->pp;
 * budget: the cap C).  Bin packing, at most two tiles a CTA, tiles above C split (the
 * file's header).  @return FI_OK, or FI_ERR_PLAN_OVER_CAPS (err filled) if a layout bound
 * would be exceeded (a bug).  O(T^2 / threads + T log T) work, O(T) depth on the device. */
FI_PD fi_status fi_partition_pairs(const fi_variant *v, const fi_tile *tiles, int32_t T,
                                   fi_planner_scratch *s, const fi_layout *l,
                                   int32_t *work_indptr, fi_work_item *items,
                                   fi_merge_group *groups, fi_partition_result *res,
                                   fi_error_detail *err);

/* Test hook: nonzero makes fi_partition use the global-target walk (its fallback) instead
 * of the capped bisection, so tests can cover both.  Not for production use. */
/* Test hook: nonzero keeps the contiguous walk's plan (no packing, planner/pack.h). */
/* Test hook for FI_PARTITION_LIST rows: 0 chooses by the model (the product), > 0 always
 * the list schedule (planner/listsched.h), < 0 never. */
/* Test hook: nonzero makes fi_partition recompute with fi_model_max (planner/model.h) the
 * executor model that the walk (cap_walk) and the packing (pk_model) compute inside their
 * own passes, and count each disagreement in fi_partition_test_model_mismatches: the three
 * must agree, as the choice between plans depends on it. */
#ifdef FI_PLANNER_DEVICE_TU /* the device planner has no test hooks */
#define fi_partition_test_force_global 0
#define fi_partition_test_no_pack 0
#define fi_partition_test_list 0
#define fi_partition_test_check_model 0
#else
extern int fi_partition_test_force_global;
extern int fi_partition_test_no_pack;
extern int fi_partition_test_list;
extern int fi_partition_test_check_model;
extern int fi_partition_test_model_mismatches;
#endif

#endif
