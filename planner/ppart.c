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
 *   prefix sums of tile costs -> n + 1 boundaries -> distinct interior boundaries are cuts,
 *   scanned over the boundaries with the first cuts of a tile (so tile t's first item is
 *   t + the cuts before its first boundary, its merge group the first cuts before it: no
 *   scan over the tiles) -> items and groups written per tile -> work_indptr per boundary
 *   -> CTA costs per CTA (in the cuts' pass, their sum and maximum in its scan).
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

/* Tiles a boundary from which the device's item loop takes warp groups, not chunks. */
enum { pp_dense_tiles = 8 };

FI_PD fi_status fi_partition_parallel(const fi_variant *v, const fi_tile_set *ts,
                                      fi_planner_scratch *s, const fi_layout *l,
                                      int32_t *work_indptr, fi_work_item *items,
                                      fi_merge_group *groups, fi_partition_result *res,
                                      fi_error_detail *err) {
    const int32_t n = l->num_ctas, T = ts->T;
    if (fi_partition_pairs_apply(v, T, n)) /* one block then (tiles.c) */
        return fi_partition_pairs(v, ts->first, T, s, l, work_indptr, items, groups, res, err);
    /* The scratch arrays' pointers and the tile set as locals: on the device the functions
     * below are inlined, so these stay in registers, where through s (shared memory) every
     * branch reloaded the pointer before the element (docs/perf-log.md thirty-second
     * session). */
    fi_ppart_scratch pl = s->pp;
    fi_ppart_scratch *pp = &pl;
    const fi_tile_set tsl = *ts;
    ts = &tsl;
    int64_t *prefix = s->tile_prefix; /* [period + 1] */
    const int64_t budget = pp_boundaries(v, ts, n, prefix, pp);
    if (FI_PP_LEADER)
        FI_PD_STAMP(3);
    int64_t num_items, num_groups, num_slots, cta_total = 0, cta_max = 0;
    const fi_status st = pp_cuts(l, T, pp, ts, prefix, &cta_total, &cta_max, &num_items,
                                 &num_groups, &num_slots, err);
    if (FI_PP_LEADER)
        FI_PD_STAMP(4);
    if (st != FI_OK)
        return st;
    /* Items and groups, per tile, in one of two orders.  Chunks: each thread walks its own
     * contiguous chunk of tiles, its boundaries forward from tile to tile (on the host, one
     * thread, the chunk is every tile: a search a tile cost the host GQA plan ~20%).  Warp
     * groups: a warp takes groups of FI_PP_LANES consecutive tiles (lane l: tile base + l),
     * so that its item stores are contiguous (chunks put a warp's stores 16 tiles apart at
     * 1,024 GQA requests), searching the group's first boundary once while each lane walks
     * forward to its own.  Where boundaries are dense (fewer than pp_dense_tiles tiles a
     * boundary: GQA at 32 and 128 requests) a lane would walk up to ~16 of them one
     * dependent shared-memory load at a time, and the plans lost ~1 us to the warp groups
     * (H200, docs/perf-log.md thirty-first session), so those take the chunks. */
    if (FI_PP_LANES == 1 || T < pp_dense_tiles * (n + 1)) {
        const int32_t t1 = fi_pp_chunk(T, 1);
        int32_t t = fi_pp_chunk(T, 0), b0 = 0, k = 0, j = 0;
        if (t < t1) {
            b0 = first_boundary(pp->btile, n, t);
            fi_tile_set_advance(ts, 0, 0, t, &k, &j);
        }
        FI_PD_NO_UNROLL
        for (; t < t1; t++) {
            const int32_t b1 = pp_boundary_after(pp, n, b0, t);
            const fi_tile tl = fi_tile_set_block(ts, k, j);
            pp_tile_items(v, pp, &tl, t, b0, b1, 0, INT32_MAX, items, groups);
            b0 = b1;
            fi_tile_set_advance(ts, k, j, 1, &k, &j);
        }
    } else {
        FI_PP_FOR_WARP(grp, (T + FI_PP_LANES - 1) / FI_PP_LANES) {
            const int32_t base = grp * FI_PP_LANES, t = base + FI_PP_LANE;
            int32_t b0 = first_boundary(pp->btile, n, base);
            const int32_t kb = ts->blocks == 1 ? 0 : base / ts->period; /* the group's block */
            if (t < T) {
                while (b0 <= n && pp->btile[b0] < t)
                    b0++;
                const int32_t b1 = pp_boundary_after(pp, n, b0, t);
                int32_t k, j;
                fi_tile_set_advance(ts, kb, base - kb * ts->period, FI_PP_LANE, &k, &j);
                const fi_tile tl = fi_tile_set_block(ts, k, j);
                pp_tile_items(v, pp, &tl, t, b0, b1, 0, INT32_MAX, items, groups);
            }
        }
    }
    /* Where each CTA's items start: the piece its boundary begins. */
    FI_PP_FOR(c, n + 1)
    work_indptr[c] = pp_indptr_at(pp, n, T, (int32_t)num_items, c);
    if (FI_PP_LEADER)
        FI_PD_STAMP(6);
    FI_PP_SYNC(); /* the items and work_indptr are read by other threads next */
    pp_totals(num_items, num_groups, num_slots, budget, cta_total, cta_max, res);
    return FI_OK;
}
