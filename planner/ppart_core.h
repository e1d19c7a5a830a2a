/*
 * planner/ppart_core.h - the pieces of the data-parallel partition that its two forms share:
 * the whole plan on one CTA (planner/ppart.c) and one CTA's share of it (planner/pslice.c).
 * Boundaries of the equal-share cut of the cumulative cost axis, their cuts, and the packed
 * (items, merge groups) counts.  Included by those two files only; host C and device code
 * (plan/hd.h).
 */
#ifndef FIATTN_PLANNER_PPART_CORE_H
#define FIATTN_PLANNER_PPART_CORE_H

#include "planner/parallel.h"
#include "planner/partition.h"
#include "planner/scratch.h"
#include "planner/tiles.h"

/* Cost-axis position x (0 <= x < S) -> boundary (tile, KV position, interior); first, P,
 * blocks, T: the tile set's (scratch.h fi_tile_set, by value: the outlined call would read
 * a set passed by address from local memory); prefix: the first block's prefix sums, S0
 * their total (a block's cost).  Tile costs are > 0 when blocks > 1 (tiles.h), so the
 * prefix sums rise strictly and the tile holding x is the one holding x - k S0 in block k
 * = floor(x / S0). */
FI_PD_STATIC FI_PD_OUTLINE void boundary_at(fi_split_grain sg, const fi_tile *first, int32_t P,
                                            int32_t blocks, int32_t T, const int64_t *prefix,
                                            int64_t S0, int64_t x, int32_t *bt, int32_t *bkv,
                                            int32_t *interior) {
    int32_t k = 0; /* at most H_kv steps, where a 64-bit division costs more */
    if (blocks > 1)
        while (x >= S0) {
            x -= S0;
            k++;
        }
    const int32_t lo = fi_last_le(prefix, P, x); /* the tile of block k holding x */
    const fi_tile *t = &first[lo];
    const int64_t kv0 = t->kv_begin, kv1 = t->kv_end;
    const int64_t fixed = t->cost - (kv1 - kv0); /* alpha * rows + beta */
    const int64_t o = x - prefix[lo];
    int64_t pos = o <= fixed ? kv0 : fi_grain_round(sg, kv0 + (o - fixed));
    if (pos - kv0 < sg.floor)
        pos = kv0;
    else if (kv1 - pos < sg.floor)
        pos = kv1;
    if (pos >= kv1 && kv1 > kv0) { /* the end of tile lo is the start of the next */
        const int32_t next = k * P + lo + 1;
        *bt = next;
        *bkv = next < T ? first[lo + 1 < P ? lo + 1 : 0].kv_begin : 0;
        *interior = 0;
        return;
    }
    *bt = k * P + lo;
    *bkv = (int32_t)pos;
    *interior = pos > kv0;
}

/* First boundary c in [0, n] whose tile is >= t (boundary tiles are non-decreasing). */
FI_PD_STATIC FI_PD_OUTLINE int32_t first_boundary(const int32_t *btile, int32_t n, int32_t t) {
    int32_t lo = 0, hi = n + 1;
    while (lo < hi) {
        const int32_t mid = (lo + hi) / 2;
        if (btile[mid] < t)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* A tile's items (high 32 bits) and merge groups (low) as one word, so that one scan sums
 * both: the sums stay below 2^31 (items <= tiles + CTAs - 1 <= max_items <=
 * FI_LIMIT_PLAN_ITEMS, groups <= tiles), so the low half never carries into the high. */
FI_PD_STATIC inline int64_t pp_pack(int64_t items, int64_t groups) {
    return items << 32 | groups;
}
FI_PD_STATIC inline int64_t pp_items(int64_t w) { return w >> 32; }
FI_PD_STATIC inline int64_t pp_groups(int64_t w) { return w & 0xffffffff; }
/* Slots before tile t (or in all T tiles) from the items and groups before it: a cut tile
 * has as many slots as items, an uncut one one item and no slot. */
FI_PD_STATIC inline int64_t pp_slots(int64_t w, int64_t t) {
    return pp_items(w) - (t - pp_groups(w));
}

/* The first block's tile costs' prefix sums into prefix [period + 1] (prefix[period] its
 * total S0; the whole set's total S = blocks S0) and the n + 1 boundaries of the CTAs into
 * pp (CTA c runs [boundary c, boundary c + 1)), under row v's split grain and charges.
 * Every thread; ends with a barrier.  Two plans:
 *  - equal share: boundary c at cost c * budget, budget = max(ceil(S / n), floor + tile);
 *  - a tile a CTA, none cut: when there are no more tiles than CTAs and the largest tile
 *    costs at most budget + the row's charge for a cut (its merging and its arriving
 *    piece), since the equal share would cut nearly every such tile in two and its
 *    largest CTA would be no cheaper (a uniform decode batch of B <= num_ctas).
 * Returns the cost a CTA is planned for: the budget, or the largest tile's cost. */
FI_PD_STATIC inline int64_t pp_boundaries(const fi_variant *v, const fi_tile_set *ts, int32_t n,
                                          int64_t *prefix, fi_ppart_scratch *pp) {
    const fi_split_grain sg = fi_split_grain_of(v);
    const int64_t cut_charge = (int64_t)v->cost_merge + v->cost_arrive;
    const fi_tile *tiles = ts->first;
    const int32_t P = ts->period, T = ts->T;
    { /* four tile loads in flight a thread (at 1024 GQA requests the tiles are in global
       * memory: one at a time, a round trip each) */
        const int32_t t1 = fi_pp_chunk(P, 1);
        int32_t t = fi_pp_chunk(P, 0);
        FI_PD_NO_UNROLL
        for (; t + 4 <= t1; t += 4) {
            const int64_t c0 = tiles[t].cost, c1 = tiles[t + 1].cost;
            const int64_t c2 = tiles[t + 2].cost, c3 = tiles[t + 3].cost;
            prefix[t] = c0;
            prefix[t + 1] = c1;
            prefix[t + 2] = c2;
            prefix[t + 3] = c3;
        }
        FI_PD_NO_UNROLL
        for (; t < t1; t++)
            prefix[t] = tiles[t].cost;
    }
    int64_t cmax; /* the largest tile cost, from the scan's own barrier */
    const int64_t S0 = fi_pp_scan_max(prefix, P, &cmax);
    if (FI_PP_LEADER)
        prefix[P] = S0;
    const int64_t S = S0 * ts->blocks;
    int64_t budget = (S + n - 1) / n;
    if (budget < (int64_t)sg.floor + sg.tile)
        budget = (int64_t)sg.floor + sg.tile;
    const int whole = T > 0 && T <= n && cmax <= budget + cut_charge;
    FI_PP_FOR(c, n + 1) {
        const int64_t x = (int64_t)c * budget;
        if (whole) { /* tile c on CTA c; CTAs T .. n - 1 idle */
            pp->btile[c] = c < T ? c : T;
            pp->bkv[c] = c < T ? fi_tile_set_at(ts, c).kv_begin : 0;
            pp->interior[c] = 0;
        } else if (x >= S || T == 0) {
            pp->btile[c] = T;
            pp->bkv[c] = 0;
            pp->interior[c] = 0;
        } else {
            boundary_at(sg, tiles, P, ts->blocks, T, prefix, S0, x, &pp->btile[c], &pp->bkv[c],
                        &pp->interior[c]);
        }
    }
    FI_PP_SYNC();
    return whole ? cmax : budget;
}

/* Boundary c (0 .. n + 1) as pp_pack(cut, first cut of its tile).  A cut: an interior
 * boundary distinct from the one before (equal ones leave the CTAs between them empty; n
 * + 1, past the last, is none).  The first cut of its tile: a cut whose boundary c - 1 is
 * not interior to the same tile (boundaries are non-decreasing, and the first interior one
 * of a tile always differs from the one before it, so it is a cut).  Boundaries c - 1 and
 * c are loaded together, then combined without branches: on the device each short-
 * circuited test was a dependent load (~850 cycles an element on one warp, H200,
 * docs/perf-log.md thirty-second session). */
FI_PD_STATIC inline int64_t pp_cut_word(const fi_ppart_scratch *pp, int32_t c, int32_t n) {
    if (c > n)
        return 0;
    const int32_t *btile = pp->btile, *bkv = pp->bkv, *interior = pp->interior;
    const int32_t p = c > 0 ? c - 1 : 0;
    const int32_t t = btile[c], tp = btile[p], kv = bkv[c], kvp = bkv[p];
    const int32_t in = interior[c], inp = interior[p];
    const int same_tile = c > 0 && t == tp;
    const int cut = in != 0 && !(same_tile && kv == kvp);
    return pp_pack(cut, cut && !(same_tile && inp != 0));
}

/* work_indptr[c], the item boundary c begins, once pp->cut_scan [n + 2] holds per boundary
 * pp_pack(cuts before it, first cuts of a tile before it), scanned: tile t's first item is
 * t + the cuts before first_boundary(t), and an interior boundary begins the piece after
 * the tile's cuts up to and including its own. */
FI_PD_STATIC inline int32_t pp_indptr_at(const fi_ppart_scratch *pp, int32_t n, int32_t T,
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

/* FI_ERR_PLAN_OVER_CAPS: the plan needs `needed` of a region that holds `limit`. */
FI_PD_STATIC fi_status pp_over(fi_error_detail *err, int64_t needed, int64_t limit) {
    err->status = FI_ERR_PLAN_OVER_CAPS;
    err->request = -1;
    err->needed = needed;
    err->limit = limit;
    err->cuda_error = 0;
    return FI_ERR_PLAN_OVER_CAPS;
}

/* The cost of tile t's piece [s, e): its KV tokens plus the tile's fixed cost (alpha *
 * rows + beta), which is fi_variant_item_cost of the piece's item, as the tile's own cost
 * is its whole item's (boundary_at splits a tile the same way). */
FI_PD_STATIC inline int64_t piece_cost(const fi_tile *t, int64_t s, int64_t e) {
    return t->cost - (t->kv_end - t->kv_begin) + (e - s);
}

/* CTA c's cost, the sum of its items' costs, from the boundaries alone (after
 * pp_boundaries): CTA c runs from boundary c to boundary c + 1, so its items are the piece
 * of tile btile[c] from boundary c on, the whole tiles after it (a difference of prefix
 * sums) and the piece of tile btile[c + 1] before boundary c + 1 (when that boundary is
 * interior): O(1) a CTA, where reading the items back was O(items) (GQA at 128 requests:
 * 1,102 items, ~10k of the planning kernel's ~52k cycles, H200). */
FI_PD_STATIC inline int64_t pp_cta_cost(const fi_tile_set *ts, const int64_t *prefix,
                                        const fi_ppart_scratch *pp, int32_t c) {
    const int32_t T = ts->T, t0 = pp->btile[c], t1 = pp->btile[c + 1];
    if (t0 >= T)
        return 0;
    /* tiles t0, t0 + 1 and t1 as (block, index): one division, then steps */
    const int32_t P = ts->period, k0 = ts->blocks == 1 ? 0 : t0 / P, j0 = t0 - k0 * P;
    const fi_tile *a = &ts->first[j0]; /* KV range and cost: the same in every block */
    const int64_t s = pp->interior[c] ? pp->bkv[c] : a->kv_begin;
    if (t1 == t0) /* one piece inside tile t0, or none (equal boundaries) */
        return pp->interior[c + 1] && pp->bkv[c + 1] > s ? piece_cost(a, s, pp->bkv[c + 1]) : 0;
    int32_t k1, j1, k2, j2;
    fi_tile_set_advance(ts, k0, j0, 1, &k1, &j1);
    fi_tile_set_advance(ts, k1, j1, t1 - t0 - 1, &k2, &j2);
    const int64_t S0 = prefix[P];
    int64_t cost = piece_cost(a, s, a->kv_end) + (k2 - k1) * S0 + prefix[j2] - prefix[j1];
    if (t1 < T && pp->interior[c + 1]) {
        const fi_tile *b = &ts->first[j2];
        cost += piece_cost(b, b->kv_begin, pp->bkv[c + 1]);
    }
    return cost;
}

/* After pp_boundaries: per boundary the cuts before it and the first cuts of a tile before
 * it into pp->cut_scan [n + 2] (pp_pack, scanned; entry n + 1 holds the totals), and the
 * plan's item, merge-group and slot counts.  Tile t's first item and merge group then
 * follow from the boundaries before it (pp_indptr_at, ppart.c), so no scan runs over the
 * T tiles.  With ts (and prefix, as pp_boundaries left them), the same pass also takes
 * each CTA's cost from its boundaries (pp_cta_cost) and the scan's barriers their sum and
 * maximum, into *cta_total and *cta_max (a step of its own cost the device planner ~0.3
 * us; docs/perf-log.md thirty-third session); ts NULL leaves them.  Every thread.
 * @return FI_OK, or FI_ERR_PLAN_OVER_CAPS (err filled) when l's items, groups or slots
 * (checked in that order) cannot hold the plan. */
FI_PD_STATIC inline fi_status pp_cuts(const fi_layout *l, int32_t T, fi_ppart_scratch *pp,
                                      const fi_tile_set *ts, const int64_t *prefix,
                                      int64_t *cta_total, int64_t *cta_max,
                                      int64_t *num_items, int64_t *num_groups,
                                      int64_t *num_slots, fi_error_detail *err) {
    const int32_t n = l->num_ctas;
    int64_t total = 0, max = 0;
    FI_PP_FOR_CHUNK(c, n + 2) {
        pp->cut_scan[c] = pp_cut_word(pp, c, n);
        if (ts && c < n) {
            const int64_t cost = pp_cta_cost(ts, prefix, pp, c);
            total += cost;
            max = cost > max ? cost : max;
        }
    }
    const int64_t cuts = ts ? fi_pp_scan_sum_max(pp->cut_scan, n + 2, &total, &max)
                            : fi_pp_scan(pp->cut_scan, n + 2);
    if (ts) {
        *cta_total = total;
        *cta_max = max;
    }
    *num_items = T + pp_items(cuts);
    *num_groups = pp_groups(cuts);
    *num_slots = *num_items - (T - *num_groups);
    if (*num_items > l->max_items)
        return pp_over(err, *num_items, l->max_items);
    if (*num_groups > l->max_groups)
        return pp_over(err, *num_groups, l->max_groups);
    if (*num_slots > l->max_slots)
        return pp_over(err, *num_slots, l->max_slots);
    return FI_OK;
}

/* The first boundary past tile t, walking forward from b (a boundary of t or before it). */
FI_PD_STATIC inline int32_t pp_boundary_after(const fi_ppart_scratch *pp, int32_t n, int32_t b,
                                              int32_t t) {
    while (b <= n && pp->btile[b] < t + 1)
        b++;
    return b;
}

/* Tile t's items in KV order once pp_cuts has scanned the boundaries; b0 .. b1: its
 * boundaries (first_boundary of t and t + 1).  Its first item is t + the cuts before b0.
 * Uncut (no cut among b0 .. b1 - 1), the tile is one item, out_slot -1; cut, its pieces
 * are the slots of merge group g (the first cuts before b0), written with the group.
 * Writes only the items whose index is in [i0, i1), and the group when its first item is;
 * returns the sum of their fi_variant_item_cost (what a CTA's share adds up). */
FI_PD_STATIC inline int64_t pp_tile_items(const fi_variant *v, const fi_ppart_scratch *pp,
                                          const fi_tile *tl, int32_t t, int32_t b0, int32_t b1,
                                          int32_t i0, int32_t i1, fi_work_item *items,
                                          fi_merge_group *groups) {
    const int64_t before = pp->cut_scan[b0];
    const int32_t first = t + (int32_t)pp_items(before);
    const int64_t rows = (int64_t)(tl->q_end - tl->q_begin) * (tl->head_end - tl->head_begin);
    if (pp_items(pp->cut_scan[b1]) == pp_items(before)) { /* uncut: whole */
        if (first < i0 || first >= i1)
            return 0;
        fi_tile_item_store(&items[first], tl, tl->kv_begin, tl->kv_end, -1, -1);
        return fi_variant_item_cost(v, tl->kv_end - tl->kv_begin, rows);
    }
    const int32_t g = (int32_t)pp_groups(before);
    const int32_t slot = (int32_t)pp_slots(pp_pack(first, g), t);
    int64_t sum = 0;
    int32_t j = 0, start = tl->kv_begin;
    FI_PD_NO_UNROLL
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
    if (first >= i0 && first < i1)
        groups[g] = fi_tile_group(tl, slot, j, first);
    return sum;
}

/* The partition's totals into *res: the counts, the budget, and the CTA costs' sum and
 * maximum (total, max: already over the whole CTA).  Every thread. */
FI_PD_STATIC inline void pp_totals(int64_t num_items, int64_t num_groups, int64_t num_slots,
                                   int64_t budget, int64_t total, int64_t max,
                                   fi_partition_result *res) {
    res->num_items = (int32_t)num_items;
    res->num_groups = (int32_t)num_groups;
    res->num_slots = (int32_t)num_slots;
    res->budget = budget;
    res->total_cost = total;
    res->max_cta_cost = max;
}

/* pp_totals with total and max this thread's share of the CTA costs, summed and maxed over
 * the CTA first (fi_pp_sum_max, whose barriers also publish what the threads wrote
 * before).  Every thread. */
FI_PD_STATIC inline void pp_result(int64_t num_items, int64_t num_groups, int64_t num_slots,
                                   int64_t budget, int64_t total, int64_t max,
                                   fi_partition_result *res) {
    fi_pp_sum_max(&total, &max);
    pp_totals(num_items, num_groups, num_slots, budget, total, max, res);
}

#endif /* FIATTN_PLANNER_PPART_CORE_H */
