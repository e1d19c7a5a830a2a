/*
 * planner/pack.h - the packing partition, the alternative to the contiguous walk
 * (planner/partition.h) for batches of uneven requests.
 *
 * Why: every item costs the executor a fixed ~8-10 us (ring fill and drain, epilogue) and
 * the CTA that finishes a split group last pays its merge (~8 us, H200, BENCHMARKS.md).
 * The contiguous walk cuts a tile at nearly every CTA boundary, so on a trace decode
 * snapshot most CTAs run two or three items, two of them pieces.  Packing places whole
 * tiles and cuts only the tiles that do not fit.
 * Algorithm: best-fit decreasing bin packing (Johnson 1974) with item fragmentation
 * (bin packing with splittable items, Chung et al. 2006): tiles longer than the cap T are
 * cut into full pieces of one CTA each, the rest (whole tiles and the remainders) are
 * placed largest first into the CTA with the least room left that still holds them; one
 * that fits nowhere is cut into the CTA with the most room.  Caps T between the mean and
 * the walk's cap are scanned; the plan with the lowest modelled CTA cost is kept.
 */
#ifndef FIATTN_PLANNER_PACK_H
#define FIATTN_PLANNER_PACK_H

#include "planner/partition.h"

/* Packing is tried only up to this many tiles a CTA: past it every CTA runs several items
 * anyway, the walk's one cut a CTA matters less, and the search would cost more than the
 * plan-update targets allow (docs/DESIGN.md: 10 us at 128 requests, 60 us at 1024). */
#ifndef FI_PACK_MAX_TILES_PER_CTA /* -D...=0 turns packing off (comparisons) */
#define FI_PACK_MAX_TILES_PER_CTA 1
#endif

/* Pack tiles[0 .. num_tiles) over l->num_ctas CTAs under the smallest cap (>= cap_lo, the
 * walk's, found by galloping and bisection to 1/128) that packs.  If its best
 * plan's modelled cost (the largest CTA cost with every piece charged FI_COST_PIECE) is
 * below `beat`, writes that plan (work_indptr, items, groups, cta_cost, *res) and
 * *model_max; otherwise (or if no cap fits the layout bounds) writes nothing and sets
 * *model_max to its best (INT64_MAX: none). */
fi_status fi_partition_pack(const fi_tile *tiles, int32_t num_tiles, int64_t total_cost,
                            const fi_layout *l, fi_pack_scratch *s, int64_t cap_lo, int64_t beat,
                            int32_t *work_indptr, fi_work_item *items, fi_merge_group *groups,
                            int64_t *cta_cost, fi_partition_result *res, int64_t *model_max);

#endif
