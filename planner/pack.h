/*
 * planner/pack.h - the packing partition, the alternative to the contiguous walk
 * (planner/partition.h) for decode batches of thin tiles.
 *
 * Why: every item costs the executor a fixed ~8-10 us (ring fill and drain, epilogue) and
 * the CTA that finishes a split group last pays its merge (~8 us, H200; docs/perf-log.md).
 * The contiguous walk cuts a tile at nearly every CTA boundary, so on a trace decode
 * snapshot most CTAs run two or three items, two of them pieces.  Packing places whole
 * tiles and cuts only the tiles that do not fit.
 * Algorithm: best-fit decreasing bin packing (Johnson 1974) with item fragmentation
 * (bin packing with splittable items, Chung et al. 2006): tiles longer than the cap T are
 * cut into full pieces of one CTA each, the rest (whole tiles and the remainders) are
 * placed largest first into the CTA with the least room left that still holds them; one
 * that fits nowhere is cut into the CTA with the most room.  Every piece is charged the
 * row's piece charge (fi_variant_piece_charge) while packing.  The smallest cap that packs
 * is searched (a cap that packs bounds the largest CTA cost); the result is scored by the
 * executor model (planner/model.h) against the walk's plan.
 */
#ifndef FIATTN_PLANNER_PACK_H
#define FIATTN_PLANNER_PACK_H

#include "planner/partition.h"

/* Packing is tried for batches of thin tiles (<= 16 rows: heads <= 16 at q_len 1, where a
 * tile's keys are bandwidth-bound and an item's fixed cost weighs most) up to the row's
 * pack_thin_tiles_per_cta tiles a CTA, and for other tiles up to its
 * pack_max_tiles_per_cta (0: never: the model, calibrated on thin tiles, does not yet rank
 * tall-tile plans; measured mixed, docs/perf-log.md).  Past that every CTA runs several items
 * anyway, and the search would cost more than the plan-update targets allow (docs/
 * DESIGN.md: 10 us at 128 requests, 60 us at 1024, for H_q 128). */
/* (The default rows' limits: plan/cost_model.h FI_PACK_*_TILES_PER_CTA.) */

/* 1 if the batch's tiles are packed at all (row v's limits, above), 0 if the walk's plan
 * stands unexamined.  oh_max: the largest item overhead of a tile (cost less KV length,
 * planner/partition.c tile_prefix).  O(1) for rows whose overhead grows with the rows
 * (cost_alpha > 0), else O(tiles), stopping at the first tall tile. */
FI_PD int fi_pack_wanted(const fi_variant *v, const fi_tile *tiles, int32_t num_tiles,
                         int64_t oh_max, const fi_layout *l);

/* Pack tiles[0 .. num_tiles) (tile order; a batch fi_pack_wanted accepts; row v; scratch
 * s, owned by the plan) over l->num_ctas CTAs under the smallest cap that packs (from
 * cap_lo, the walk's cap in cost units, galloping up by cap_lo / 32 and bisecting to
 * cap_lo / 64).  If that plan's executor model (planner/model.h, KV-token units) is below
 * `beat` (the walk's), writes it over the walk's (work_indptr [num_ctas + 1], items,
 * groups, cta_cost, *res); otherwise, or if no cap fits the layout bounds, writes nothing:
 * the walk's plan stands.  Returns the model of the plan that stands (the packing's, or
 * `beat`).  Cost: O(tiles + CTAs) per packing, 1-3 packings. */
FI_PD int64_t fi_partition_pack(const fi_variant *v, const fi_tile *tiles, int32_t num_tiles,
                       int64_t total_cost, const fi_layout *l, fi_pack_scratch *s,
                       int64_t cap_lo, int64_t beat, int32_t *work_indptr, fi_work_item *items,
                       fi_merge_group *groups, int64_t *cta_cost, fi_partition_result *res);

#endif
