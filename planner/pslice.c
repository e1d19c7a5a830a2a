/*
 * planner/pslice.c - one CTA's share of the data-parallel partition (planner/pslice.h).
 *
 * Algorithm: ppart.c's equal-share cut of the cumulative cost axis (flash-decoding's
 * split-KV, Dao et al. 2023), read per CTA.  ppart.c derives every tile's first item and
 * merge group from a scan over the tiles (item_off); here they come from a scan over the
 * n + 2 boundaries instead, so a CTA needs no per-tile array beyond the cost prefix:
 *   items before tile t  = t + the cuts at boundaries before first_boundary(t),
 *   groups before tile t = the first cuts of a tile at those boundaries,
 * where boundary c is the first cut of its tile when it is a cut and boundary c - 1 is not
 * interior to the same tile (boundaries are non-decreasing, and the first interior one of
 * a tile always differs from the one before it, so it is a cut).
 */
#include "planner/pslice.h"

#include "planner/parallel.h"
#include "planner/ppart_core.h"

/* Boundary c as the first cut of its tile (pslice.c's header). */
FI_PD_STATIC inline int64_t is_first_cut(const fi_ppart_scratch *pp, int32_t c, int32_t n) {
    return is_cut(pp, c, n) && !(c > 0 && pp->btile[c - 1] == pp->btile[c] && pp->interior[c - 1]);
}

FI_PD fi_status fi_pslice_prepare(const fi_variant *v, const fi_tile *tiles, int32_t T,
                                  const fi_layout *l, int64_t *prefix, fi_ppart_scratch *pp,
                                  fi_pslice_totals *tot, fi_error_detail *err) {
    const int32_t n = l->num_ctas;
    const int64_t budget = pp_boundaries(v, tiles, T, n, prefix, pp);
    FI_PP_FOR_CHUNK(c, n + 2)
    pp->cut_scan[c] = pp_pack(is_cut(pp, c, n), is_first_cut(pp, c, n));
    const int64_t cuts = fi_pp_scan(pp->cut_scan, n + 2);
    const int64_t num_items = T + pp_items(cuts), num_groups = pp_groups(cuts);
    const int64_t num_slots = num_items - (T - num_groups);
    if (num_items > l->max_items)
        return pp_over(err, num_items, l->max_items);
    if (num_groups > l->max_groups)
        return pp_over(err, num_groups, l->max_groups);
    if (num_slots > l->max_slots)
        return pp_over(err, num_slots, l->max_slots);
    tot->budget = budget;
    tot->total_cost = prefix[T];
    tot->num_items = (int32_t)num_items;
    tot->num_groups = (int32_t)num_groups;
    tot->num_slots = (int32_t)num_slots;
    return FI_OK;
}

/* work_indptr[c]: the item boundary c begins (ppart.c's rule). */
FI_PD_STATIC int32_t indptr_at(const fi_ppart_scratch *pp, int32_t n, int32_t T,
                               int32_t num_items, int32_t c) {
    const int32_t t = pp->btile[c];
    if (t >= T)
        return num_items;
    const int32_t fb = first_boundary(pp->btile, n, t);
    int64_t i = t + pp_items(pp->cut_scan[fb]);
    if (pp->interior[c])
        i += pp_items(pp->cut_scan[c + 1]) - pp_items(pp->cut_scan[fb]);
    return (int32_t)i;
}

FI_PD void fi_pslice_cta(const fi_variant *v, const fi_tile *tiles, int32_t T,
                         const fi_layout *l, const fi_ppart_scratch *pp,
                         const fi_pslice_totals *tot, int32_t c, int32_t *work_indptr,
                         fi_work_item *items, fi_merge_group *groups, int64_t *cost) {
    const int32_t n = l->num_ctas;
    const int32_t i0 = indptr_at(pp, n, T, tot->num_items, c);
    const int32_t i1 = indptr_at(pp, n, T, tot->num_items, c + 1);
    work_indptr[c] = i0;
    if (c == n - 1)
        work_indptr[n] = i1;
    int64_t sum = 0;
    /* The tiles from boundary c's on, until their first item is past the CTA's last;
     * b0 .. b1 are the boundaries of tile t (first_boundary of t and t + 1), walked forward. */
    int32_t t = pp->btile[c];
    int32_t b0 = t < T ? first_boundary(pp->btile, n, t) : 0;
    for (; t < T && i0 < i1; t++) {
        const int64_t before = pp->cut_scan[b0]; /* cuts and first cuts before tile t */
        const int32_t first = t + (int32_t)pp_items(before); /* ppart.c's item_off[t] */
        if (first >= i1)
            break;
        int32_t b1 = b0;
        while (b1 <= n && pp->btile[b1] < t + 1)
            b1++;
        const fi_tile *tl = &tiles[t];
        const int64_t rows = (int64_t)(tl->q_end - tl->q_begin) * (tl->head_end - tl->head_begin);
        if (pp_items(pp->cut_scan[b1]) == pp_items(before)) { /* uncut: the tile is one item */
            if (first >= i0) {
                fi_tile_item_store(&items[first], tl, tl->kv_begin, tl->kv_end, -1, -1);
                sum += fi_variant_item_cost(v, tl->kv_end - tl->kv_begin, rows);
            }
            b0 = b1;
            continue;
        }
        /* Cut: its pieces in KV order, slots of merge group g; CTA c writes those in its
         * range, and the group when the tile's first piece is its. */
        const int32_t g = (int32_t)pp_groups(before);
        const int32_t slot = (int32_t)pp_slots(pp_pack(first, g), t);
        int32_t j = 0, start = tl->kv_begin;
        for (int32_t b = b0; b <= b1; b++) {
            const int last = b == b1;
            if (!last && pp_items(pp->cut_scan[b + 1]) == pp_items(pp->cut_scan[b]))
                continue; /* not a cut of this tile */
            const int32_t end = last ? tl->kv_end : pp->bkv[b];
            if (first + j >= i0 && first + j < i1) {
                fi_tile_item_store(&items[first + j], tl, start, end, slot + j, g);
                sum += fi_variant_item_cost(v, end - start, rows);
            }
            start = end;
            j++;
        }
        if (first >= i0)
            groups[g] = fi_tile_group(tl, slot, j, first);
        b0 = b1;
    }
    *cost = sum;
}
