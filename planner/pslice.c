/*
 * planner/pslice.c - one CTA's share of the data-parallel partition (planner/pslice.h).
 *
 * Algorithm: ppart.c's equal-share cut of the cumulative cost axis (flash-decoding's
 * split-KV, Dao et al. 2023), read per CTA.  As in ppart.c, every tile's first item and
 * merge group come from one scan over the n + 2 boundaries (ppart_core.h pp_cuts), so a
 * CTA needs no per-tile array beyond the cost prefix:
 *   items before tile t  = t + the cuts at boundaries before first_boundary(t),
 *   groups before tile t = the first cuts of a tile at those boundaries,
 * where boundary c is the first cut of its tile when it is a cut and boundary c - 1 is not
 * interior to the same tile (boundaries are non-decreasing, and the first interior one of
 * a tile always differs from the one before it, so it is a cut).
 */
#include "planner/pslice.h"

#include "planner/parallel.h"
#include "planner/ppart_core.h"

FI_PD fi_status fi_pslice_prepare(const fi_variant *v, const fi_tile_set *ts,
                                  const fi_layout *l, int64_t *prefix, fi_ppart_scratch *pp,
                                  fi_pslice_totals *tot, fi_error_detail *err) {
    const int32_t n = l->num_ctas;
    const int64_t budget = pp_boundaries(v, ts, n, prefix, pp);
    int64_t num_items, num_groups, num_slots;
    const fi_status st = pp_cuts(l, ts->T, pp, NULL, NULL, NULL, NULL, &num_items, &num_groups,
                                 &num_slots, err);
    if (st != FI_OK)
        return st;
    tot->budget = budget;
    tot->total_cost = ts->blocks * prefix[ts->period]; /* S = blocks x a block's cost */
    tot->num_items = (int32_t)num_items;
    tot->num_groups = (int32_t)num_groups;
    tot->num_slots = (int32_t)num_slots;
    return FI_OK;
}

FI_PD void fi_pslice_cta(const fi_variant *v, const fi_tile_set *ts, const fi_layout *l,
                         const fi_ppart_scratch *pp, const fi_pslice_totals *tot, int32_t c,
                         int32_t *work_indptr, fi_work_item *items, fi_merge_group *groups,
                         int64_t *cost) {
    const int32_t n = l->num_ctas, T = ts->T;
    const int32_t i0 = pp_indptr_at(pp, n, T, tot->num_items, c);
    const int32_t i1 = pp_indptr_at(pp, n, T, tot->num_items, c + 1);
    work_indptr[c] = i0;
    if (c == n - 1)
        work_indptr[n] = i1;
    int64_t sum = 0;
    /* The tiles from boundary c's on, until their first item is past the CTA's last;
     * b0 .. b1 are the boundaries of tile t (first_boundary of t and t + 1), walked forward. */
    int32_t t = pp->btile[c];
    int32_t b0 = t < T ? first_boundary(pp->btile, n, t) : 0;
    for (; t < T && i0 < i1; t++) {
        if (t + pp_items(pp->cut_scan[b0]) >= i1) /* tile t's first item is past the CTA's */
            break;
        const int32_t b1 = pp_boundary_after(pp, n, b0, t);
        const fi_tile tl = fi_tile_set_at(ts, t);
        sum += pp_tile_items(v, pp, &tl, t, b0, b1, i0, i1, items, groups);
        b0 = b1;
    }
    *cost = sum;
}
