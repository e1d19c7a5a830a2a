/*
 * planner/pslice.h - one CTA's share of the data-parallel partition (planner/ppart.c),
 * computed from the tiles and the boundaries alone, without the other CTAs' items.
 *
 * What for: a device planner with one CTA per executor CTA (or the executor's own CTAs)
 * instead of one CTA planning everything.  Each CTA prepares the O(n) boundaries from the
 * O(T) tile costs, then writes only its own items, its work_indptr entry and the merge
 * groups that start in it.  The bytes are the ones fi_partition_parallel writes for the
 * same tiles (tests/test_plan_slice.c), so host and device plans stay identical.
 * Host C and device code (plan/hd.h); scratch arrays from fi_ppart_scratch.  Not installed.
 */
#ifndef FIATTN_PLANNER_PSLICE_H
#define FIATTN_PLANNER_PSLICE_H

#include "planner/partition.h"
#include "planner/scratch.h"
#include "planner/tiles.h"

/* The plan's totals, the same in every CTA. */
typedef struct fi_pslice_totals {
    int64_t budget;     /* cost per CTA: max(ceil(S / n), floor + tile), as ppart.c */
    int64_t total_cost; /* S, the sum of the tile costs */
    int32_t num_items, num_groups, num_slots;
} fi_pslice_totals;

/* The boundaries every CTA's share is read from: prefix [period + 1] the first block's
 * tile-cost prefix sums (ts: the tiles as fi_tiles_build_parallel leaves them, scratch.h
 * fi_tile_set); for the n + 1 boundaries (n = l->num_ctas) pp->btile, pp->bkv,
 * pp->interior; and pp->cut_scan [n + 2], per boundary the cuts before it and the first
 * cuts of a tile before it, packed as planner/ppart_core.h's pp_pack (items high, groups
 * low).  Every thread of a CTA (planner/parallel.h), the host once.
 * @return FI_OK, or FI_ERR_PLAN_OVER_CAPS (err filled) when the plan would exceed l's
 * items, groups or slots (ppart.c's order). */
FI_PD fi_status fi_pslice_prepare(const fi_variant *v, const fi_tile_set *ts,
                                  const fi_layout *l, int64_t *prefix, fi_ppart_scratch *pp,
                                  fi_pslice_totals *tot, fi_error_detail *err);

/* CTA c's share (0 <= c < n), after fi_pslice_prepare: work_indptr[c] (and work_indptr[n]
 * from the last CTA), items [work_indptr[c], work_indptr[c + 1]), and the merge groups
 * whose first item is CTA c's; *cost the CTA's cost (the sum of its items'
 * fi_variant_item_cost).  Writes nothing else.  One thread (the host form). */
FI_PD void fi_pslice_cta(const fi_variant *v, const fi_tile_set *ts, const fi_layout *l,
                         const fi_ppart_scratch *pp, const fi_pslice_totals *tot, int32_t c,
                         int32_t *work_indptr, fi_work_item *items, fi_merge_group *groups,
                         int64_t *cost);

#endif /* FIATTN_PLANNER_PSLICE_H */
