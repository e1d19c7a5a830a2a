/*
 * planner/ppart.c - the data-parallel partition (planner/partition.h,
 * fi_partition_parallel), for tile table rows whose `partition` is FI_PARTITION_PARALLEL:
 * what the device planner can compute in a few microseconds with a whole CTA, and the
 * host computes identically.
 *
 * Algorithm: flash-decoding's split-KV (Dao et al. 2023) with the equal-share cut of the
 * cumulative cost axis that FlashMLA's scheduler approximates greedily: with S the total
 * tile cost and n CTAs, CTA c starts at cost x_c = c * budget, budget = max(ceil(S / n),
 * floor + tile) (so two cuts of one tile are at least a floor apart).  x_c falls in tile t
 * (binary search on the prefix sums); inside it, the tile's fixed cost (alpha * rows +
 * beta) counts as its first part, the rest as its KV tokens: the cut position is rounded to
 * the nearest multiple of the split grain and snapped to the tile's start or end when it
 * would leave a piece under the floor.  Every boundary is found independently, so every
 * step is a scan, a binary search or a per-element map (planner/parallel.h):
 *   prefix sums of tile costs -> n + 1 boundaries -> distinct interior boundaries are cuts
 *   -> per tile its cuts (pieces), scanned into item and group offsets (one scan; slot
 *   offsets follow from them) -> items and groups written per tile -> work_indptr per
 *   boundary -> CTA costs per CTA.
 * Unlike the capped walk (partition.c) the budget is not searched: the largest CTA can
 * exceed the mean by what snapping moves (less than a floor plus one tile's fixed cost),
 * and no packing follows (rows that pack hand a batch of at most 2 n tiles to pair
 * packing instead: planner/ppair.c, fi_partition_pairs_apply).  A batch of at most n
 * tiles whose largest costs at most the budget plus the row's charge for a cut is planned
 * a tile a CTA, none cut (pp_boundaries: the equal share would cut nearly every tile of a
 * uniform decode batch of B <= n in two, for no smaller largest CTA).  Bounds: n - 1 interior boundaries give
 * at most n - 1 cuts, so items <= tiles + n - 1, groups <= n - 1, slots <= 2 (n - 1)
 * (workspace/layout.h).
 */
#include "planner/partition.h"

#include "planner/parallel.h"
#include "planner/ppart_core.h"
#include "planner/tiles.h"

FI_PD fi_status fi_partition_parallel(const fi_variant *v, const fi_tile *tiles, int32_t T,
                                      fi_planner_scratch *s, const fi_layout *l,
                                      int32_t *work_indptr, fi_work_item *items,
                                      fi_merge_group *groups, fi_partition_result *res,
                                      fi_error_detail *err) {
    const int32_t n = l->num_ctas;
    if (fi_partition_pairs_apply(v, T, n))
        return fi_partition_pairs(v, tiles, T, s, l, work_indptr, items, groups, res, err);
    fi_ppart_scratch *pp = &s->pp;
    int64_t *prefix = s->tile_prefix; /* [T + 1] */
    const int64_t budget = pp_boundaries(v, tiles, T, n, prefix, pp);
    if (FI_PP_LEADER)
        FI_PD_STAMP(3);
    /* Cuts before each boundary; one more entry, 0, so cut_scan[n + 1] is the total. */
    FI_PP_FOR_CHUNK(c, n + 2)
    pp->cut_scan[c] = is_cut(pp, c, n);
    fi_pp_scan(pp->cut_scan, n + 2);
    /* Per tile: its k cuts give k + 1 items and, if k > 0, a merge group of k + 1 slots.
     * Items and groups are scanned as one word (pp_pack); the slots before tile t are then
     * its items before less one per uncut tile before it (pp_slots). */
    {   /* a thread's chunk of tiles: one search, then its boundaries only move forward */
        const int32_t t1 = fi_pp_chunk(T, 1);
        int32_t t = fi_pp_chunk(T, 0);
        int32_t c0 = t < t1 ? first_boundary(pp->btile, n, t) : 0;
        FI_PD_NO_UNROLL
        for (; t < t1; t++) {
            int32_t c1 = c0; /* first_boundary(btile, n, t + 1) */
            while (c1 <= n && pp->btile[c1] < t + 1)
                c1++;
            const int64_t k = pp->cut_scan[c1] - pp->cut_scan[c0];
            pp->item_off[t] = pp_pack(k + 1, k > 0);
            c0 = c1;
        }
    }
    const int64_t packed = fi_pp_scan(pp->item_off, T);
    const int64_t num_items = pp_items(packed), num_groups = pp_groups(packed);
    const int64_t num_slots = pp_slots(packed, T);
    if (FI_PP_LEADER)
        FI_PD_STAMP(4);
    if (num_items > l->max_items)
        return pp_over(err, num_items, l->max_items);
    if (num_groups > l->max_groups)
        return pp_over(err, num_groups, l->max_groups);
    if (num_slots > l->max_slots)
        return pp_over(err, num_slots, l->max_slots);
    /* Items and groups, per tile, pieces in KV order. */
    FI_PP_FOR(t, T) {
        const fi_tile *tl = &tiles[t];
        const int64_t off = pp->item_off[t], next = t + 1 < T ? pp->item_off[t + 1] : packed;
        const int32_t g = (int32_t)pp_groups(off), first = (int32_t)pp_items(off);
        if (pp_items(next) == first + 1) { /* uncut (most tiles of a large batch): whole */
            fi_tile_item_store(&items[first], tl, tl->kv_begin, tl->kv_end, -1, -1);
            continue;
        }
        /* Cut: its pieces are slots of merge group g. */
        const int32_t c0 = first_boundary(pp->btile, n, t), c1 = first_boundary(pp->btile, n, t + 1);
        const int32_t slot = (int32_t)pp_slots(off, t);
        int32_t j = 0, start = tl->kv_begin;
        FI_PD_NO_UNROLL
        for (int32_t c = c0; c <= c1; c++) {
            const int last = c == c1;
            if (!last && pp->cut_scan[c + 1] == pp->cut_scan[c])
                continue; /* not a cut of this tile */
            const int32_t end = last ? tl->kv_end : pp->bkv[c];
            fi_tile_item_store(&items[first + j], tl, start, end, slot + j, g);
            start = end;
            j++;
        }
        groups[g] = fi_tile_group(tl, slot, j, first);
    }
    /* Where each CTA's items start: the piece its boundary begins. */
    FI_PP_FOR(c, n + 1) {
        const int32_t t = pp->btile[c];
        int64_t i = num_items;
        if (t < T) {
            i = pp_items(pp->item_off[t]);
            if (pp->interior[c])
                i += pp->cut_scan[c + 1] - pp->cut_scan[first_boundary(pp->btile, n, t)];
        }
        work_indptr[c] = (int32_t)i;
    }
    if (FI_PP_LEADER)
        FI_PD_STAMP(6);
    pp_finish(tiles, prefix, pp, T, n, num_items, num_groups, num_slots, budget, res);
    return FI_OK;
}
