/*
 * planner/ppair.c - pair packing: the data-parallel partition of a batch of at most
 * 2 num_ctas tiles for the rows that pack (fi_variant.pack_thin_tiles_per_cta >= 2,
 * planner/partition.h fi_partition_pairs_apply).  Host C and device code (plan/hd.h,
 * planner/parallel.h): one thread on the host, the whole CTA in the device planner.
 *
 * Why: where a batch has about one tile a CTA (decode at heads 16: a tile a request), the
 * equal share (ppart.c) cuts nearly every tile at a boundary, and every cut costs a merge;
 * the host rows pack instead (planner/pack.c).  This is the packing the device can
 * compute in a few CTA-wide steps.
 *
 * Algorithm: bin packing with at most two items a bin, by the least cap C (Coffman, Garey
 * and Johnson's bin-packing survey: pairing the largest with the smallest is optimal for
 * two items a bin), with the tiles above the cap split as flash-decoding does (Dao et al.
 * 2023).  Under a cap C, a tile costing more than C goes in ceil(kv / D) pieces of a CTA
 * each, D = C less its fixed cost and the row's piece charge, rounded down to the split
 * grain; the m tiles costing at most C go a CTA each, except that the 2k smallest are
 * paired outside in (smallest with largest), k the fewest pairs that fit the CTAs.  That
 * fits when those k pairs each cost at most C; fitting is monotone in C (more cap: fewer
 * pieces, more small tiles, fewer pairs needed, the same pairs cheaper), so C is found by
 * a search: each round tries FI_PAIR_PROBES caps evenly inside (lo, hi], a warp each,
 * until hi - lo <= max(16, hi / 128) (three rounds on the bundled trace's snapshots).
 * The plan: CTAs 0 .. P - 1 the pieces (tiles by decreasing cost; a tile's pieces are one
 * merge group, their slots their item indices), then the unpaired small tiles, then the
 * pairs (larger first); the CTAs after those idle.  In row 7's cost units (fixed 784, piece
 * charge 578) the largest CTA is within 3% of the host's walk and packing on the trace's
 * snapshots of 8 to 256 requests (scripts/pack_model.py's model; docs/perf-log.md).
 */
#include "planner/partition.h"

#include "planner/parallel.h"
#include "planner/ppart_core.h"
#include "planner/tiles.h"

#ifndef FI_PLANNER_DEVICE_TU
#include <stdlib.h>
#endif

/* (cost, tile index) as one ordered key: costs < 2^39 (KV lengths < 2^31 plus a row's
 * fixed cost), indices < 2^24 (T <= 2 num_ctas). */
#define PAIR_KEY_SHIFT 24

/* What a cap is tried against. */
typedef struct pair_geo {
    fi_split_grain sg;
    int64_t charge; /* fi_variant_piece_charge */
    int64_t least;  /* the floor (rounded up to the grain) + half a grain: the least mean
                       piece length m that keeps every piece at the floor once its ends are
                       rounded to the nearest grain (an inner piece >= the grain multiple at
                       or below m, an end piece >= m - grain / 2) */
} pair_geo;

/* Pieces of a tile (cost, kv) above cap C: p = ceil(kv / D), D = the grain multiple at or
 * below C - (cost - kv) - charge; 0 (C does not fit) when D is under a grain or the mean
 * piece kv / p under g->least.  A tile above C gets at least two (kv > C - fixed >=
 * D).  Monotone: a larger C never gives more pieces or breaks the floor. */
FI_PD_STATIC inline int64_t pair_pieces(const pair_geo *g, int64_t cost, int64_t kv, int64_t C) {
    const int64_t d = fi_grain_round_down(g->sg, C - (cost - kv) - g->charge);
    if (d < g->sg.tile)
        return 0;
    if (d >= kv)
        return 1;
    /* kv < 2^31 and d < kv: a 32-bit division (the device's 64-bit one is a long call) */
    const int64_t p = ((uint32_t)kv + (uint32_t)d - 1) / (uint32_t)d;
    return p * g->least <= kv ? p : 0;
}

/* floor(j len / p), the start of piece j of p equal pieces of len keys (0 <= j <= p, len <
 * 2^31, p <= n < 2^16: pieces are CTAs), in 32-bit arithmetic: j (len / p) + j (len % p) /
 * p, where j (len % p) < p^2 < 2^32 (the device's 64-bit division is a long call). */
FI_PD_STATIC inline int64_t piece_at(int64_t len, int64_t j, int64_t p) {
    const uint32_t l = (uint32_t)len, d = (uint32_t)p, jj = (uint32_t)j;
    const uint32_t q = l / d, r = l - q * d;
    return (int64_t)jj * q + jj * r / d;
}

/* Whether cap C fits n CTAs (the file's rule), on one warp (all of it on the host): the
 * pieces and the small tiles counted over the ascending tiles (a lane's pieces saturate
 * at n + 1, as does a tile C cannot split: either way more than n CTAs, which no pairing
 * brings back), then the k pairs checked.  32-bit counts (pieces: 32 lanes x (n + 1) <
 * 2^20; small tiles < 2^15), each summed by one warp reduction, and the pairs' verdict by
 * one vote: a search round is a chain of these on the device. */
FI_PD_STATIC int pair_fits(const pair_geo *g, const fi_ppart_scratch *pp, int32_t T, int32_t n,
                           int64_t C) {
    uint32_t pieces = 0, small = 0;
    FI_PD_NO_UNROLL
    for (int32_t i = FI_PP_LANE; i < T; i += FI_PP_LANES) {
        if (pp->pair_cost[i] <= C) {
            small++;
            continue;
        }
        const int64_t p = pair_pieces(g, pp->pair_cost[i], pp->pair_kv[i], C);
        pieces = p == 0 || pieces + p > (uint32_t)n ? (uint32_t)n + 1 : pieces + (uint32_t)p;
    }
    small = fi_pp_warp_sum32(small);
    const int64_t k = (int64_t)fi_pp_warp_sum32(pieces) + small - n; /* pairs needed */
    if (k <= 0)
        return 1;
    if (2 * k > small)
        return 0;
    int over = 0;
    FI_PD_NO_UNROLL
    for (int64_t i = FI_PP_LANE; i < k; i += FI_PP_LANES)
        over |= pp->pair_cost[i] + pp->pair_cost[2 * k - 1 - i] > C;
    return !fi_pp_warp_any(over);
}

#ifndef FI_PLANNER_DEVICE_TU
static int pair_key_cmp(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}
#endif

/* The tiles in increasing (cost, index) order into pp->pair_* (keys: scratch [T], 16-byte
 * aligned).  The device ranks each key by counting the smaller ones: w threads a tile (w
 * = 1, 2 or 4, the most with T w <= the CTA's threads; adjacent lanes, their counts
 * summed by shuffles), two keys a 16-byte shared load; the host sorts.  Ends with a
 * barrier. */
FI_PD_STATIC void pair_sort(const fi_tile *tiles, int32_t T, int64_t *keys, fi_ppart_scratch *pp) {
    FI_PP_FOR(t, T)
    keys[t] = tiles[t].cost << PAIR_KEY_SHIFT | t;
    FI_PP_SYNC();
#ifdef FI_PLANNER_DEVICE_TU
    const int32_t w = 4 * T <= FI_PP_NT ? 4 : 2 * T <= FI_PP_NT ? 2 : 1;
    const int32_t part = FI_PP_TID & (w - 1), half = T >> 1;
    const uint32_t lane = (uint32_t)FI_PP_TID & 31u;
    const uint32_t group = ((1u << w) - 1u) << (lane & ~(uint32_t)(w - 1));
    const longlong2 *pairs = (const longlong2 *)keys;
    for (int32_t t = FI_PP_TID / w; t < T; t += FI_PP_NT / w) {
        const int64_t key = keys[t];
        int32_t r = 0;
#pragma unroll 4
        for (int32_t u = part; u < half; u += w) {
            const longlong2 k2 = pairs[u];
            r += (k2.x < key) + (k2.y < key);
        }
        if ((T & 1) && part == 0)
            r += keys[T - 1] < key;
        for (int32_t o = 1; o < w; o <<= 1)
            r += __shfl_xor_sync(group, r, o);
        if (part == 0) {
            pp->pair_cost[r] = tiles[t].cost;
            pp->pair_kv[r] = (int64_t)tiles[t].kv_end - tiles[t].kv_begin;
            pp->pair_tile[r] = t;
        }
    }
#else
    qsort(keys, (size_t)T, sizeof *keys, pair_key_cmp);
    for (int32_t r = 0; r < T; r++) {
        const int32_t t = (int32_t)(keys[r] & ((1 << PAIR_KEY_SHIFT) - 1));
        pp->pair_cost[r] = tiles[t].cost;
        pp->pair_kv[r] = (int64_t)tiles[t].kv_end - tiles[t].kv_begin;
        pp->pair_tile[r] = t;
    }
#endif
    FI_PP_SYNC();
}

/* The least fitting cap, to the search's tolerance (the file's rule).  hi starts at a cap
 * that always fits: the largest tile when T <= n (a tile a CTA), else twice it (every
 * tile small, ceil(T / 2) <= n CTAs of pairs).  Every thread; a barrier a round. */
FI_PD_STATIC int64_t pair_cap(const pair_geo *g, fi_ppart_scratch *pp, int32_t T, int32_t n) {
    const int64_t cmax = pp->pair_cost[T - 1];
    int64_t lo = 0, hi = T <= n ? cmax : 2 * cmax;
    FI_PD_NO_UNROLL
    for (int32_t round = 0;; round++) {
        const int64_t tol = hi / 128 > 16 ? hi / 128 : 16;
        if (hi - lo <= tol)
            return hi;
        int64_t *probe = pp->pair_probe + (round & 1) * FI_PAIR_PROBES;
        FI_PP_FOR_WARP(j, FI_PAIR_PROBES) {
            const int fits = pair_fits(g, pp, T, n, lo + (hi - lo) * (j + 1) / (FI_PAIR_PROBES + 1));
            if (FI_PP_LANE == 0)
                probe[j] = fits;
        }
        /* One barrier a round: the next round writes the other half of pair_probe. */
        FI_PP_SYNC();
        uint32_t fit = 0; /* bit j: probe j fits (independent loads, not a dependent walk) */
        for (int32_t q = 0; q < FI_PAIR_PROBES; q++)
            fit |= (probe[q] != 0) << q;
        const int32_t j = fit ? fi_ctz64(fit) : FI_PAIR_PROBES; /* the first that fits */
        const int64_t nlo = j > 0 ? lo + (hi - lo) * j / (FI_PAIR_PROBES + 1) : lo;
        if (j < FI_PAIR_PROBES)
            hi = lo + (hi - lo) * (j + 1) / (FI_PAIR_PROBES + 1);
        lo = nlo;
    }
}

FI_PD fi_status fi_partition_pairs(const fi_variant *v, const fi_tile *tiles, int32_t T,
                                  fi_planner_scratch *s, const fi_layout *l,
                                  int32_t *work_indptr,
                                  fi_work_item *items, fi_merge_group *groups,
                                  fi_partition_result *res, fi_error_detail *err) {
    const int32_t n = l->num_ctas;
    fi_ppart_scratch *pp = &s->pp;
    const fi_split_grain sg = fi_split_grain_of(v);
    const pair_geo g = {sg, fi_variant_piece_charge(v),
                        fi_grain_round_up(sg, sg.floor) + sg.tile / 2};
    pair_sort(tiles, T, s->tile_prefix, pp);
    if (FI_PP_LEADER)
        FI_PD_STAMP(3);
    const int64_t C = pair_cap(&g, pp, T, n);
    if (FI_PP_LEADER)
        FI_PD_STAMP(4);
    /* Tiles by decreasing cost (r; ascending index T - 1 - r): pieces and big-tile count as
     * one word (pp_pack), scanned into each big tile's first item (= slot) and group. */
    int64_t *off = pp->item_off;
    FI_PP_FOR_CHUNK(r, T) {
        const int32_t i = T - 1 - r;
        const int64_t p =
            pp->pair_cost[i] > C ? pair_pieces(&g, pp->pair_cost[i], pp->pair_kv[i], C) : 0;
        off[r] = pp_pack(p, p > 0);
    }
    const int64_t packed = fi_pp_scan(off, T);
    const int64_t P = pp_items(packed), nb = pp_groups(packed);
    const int64_t m = T - nb;               /* small tiles: ranks nb .. T - 1 */
    const int64_t k = P + m > n ? P + m - n : 0; /* pairs: the 2k smallest */
    const int64_t lone = m - 2 * k;
    const int64_t num_items = P + m;
    if (num_items > l->max_items)
        return pp_over(err, num_items, l->max_items);
    if (nb > l->max_groups)
        return pp_over(err, nb, l->max_groups);
    if (P > l->max_slots)
        return pp_over(err, P, l->max_slots);
    /* The pieces, a thread an item (B1 x 32k: 128 of one tile): the tile by a search over
     * the big tiles' words, off[r] = first item << 32 | r; pieces of kv / p (>= g.least),
     * ends rounded to the grain; a tile's first piece writes its group.  Each thread sums
     * the costs of the CTAs it writes (a piece or a lone tile: a CTA; a pair: both
     * items; a whole tile's cost is its item's), so the totals need no pass over the
     * items. */
    int64_t total = 0, max = 0;
    FI_PP_FOR(it, (int32_t)P) {
        const int32_t r = fi_last_le(off, (int32_t)nb, (int64_t)it << 32 | 0xffffffff);
        const fi_tile *tl = &tiles[pp->pair_tile[T - 1 - r]];
        const int32_t first = (int32_t)pp_items(off[r]);
        const int64_t p = (r + 1 < nb ? pp_items(off[r + 1]) : P) - first, j = it - first;
        const int64_t kv0 = tl->kv_begin, len = tl->kv_end - tl->kv_begin;
        const int32_t start = j == 0 ? tl->kv_begin : (int32_t)fi_grain_round(sg, kv0 + piece_at(len, j, p));
        const int32_t end =
            j + 1 == p ? tl->kv_end : (int32_t)fi_grain_round(sg, kv0 + piece_at(len, j + 1, p));
        fi_tile_item_store(&items[it], tl, start, end, it, r);
        if (j == 0)
            groups[r] = fi_tile_group(tl, first, (int32_t)p, first);
        const int64_t cost = fi_variant_item_cost(
            v, end - start, (int64_t)(tl->q_end - tl->q_begin) * (tl->head_end - tl->head_begin));
        total += cost;
        max = cost > max ? cost : max;
    }
    /* The small tiles (ranks nb ..), a thread a CTA: the unpaired ones (u < lone) alone,
     * then pair q: the q-th largest of the 2k smallest and the q-th smallest, larger first. */
    FI_PP_FOR(u, (int32_t)(lone + k)) {
        const fi_tile *tl = &tiles[pp->pair_tile[m - 1 - u]];
        const int64_t at = u < lone ? P + u : P + lone + 2 * (u - lone);
        fi_tile_item_store(&items[at], tl, tl->kv_begin, tl->kv_end, -1, -1);
        int64_t cost = tl->cost;
        if (u >= lone) {
            const fi_tile *sm = &tiles[pp->pair_tile[u - lone]];
            fi_tile_item_store(&items[at + 1], sm, sm->kv_begin, sm->kv_end, -1, -1);
            cost += sm->cost;
        }
        total += cost;
        max = cost > max ? cost : max;
    }
    FI_PP_FOR(c, n + 1) {
        const int64_t pair = c - P - lone;
        work_indptr[c] = (int32_t)(pair <= 0 ? c : pair <= k ? P + lone + 2 * pair : num_items);
    }
    if (FI_PP_LEADER)
        FI_PD_STAMP(6);
    pp_result(num_items, nb, P, C, total, max, res); /* publishes the items too */
    return FI_OK;
}
