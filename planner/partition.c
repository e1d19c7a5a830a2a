/*
 * planner/partition.c - contiguous cost walk (FlashMLA get_mla_metadata /
 * get_decoding_sched_meta scheduler) with flash-decoding split-KV (Dao et al. 2023).
 *
 * Tiles are walked in plan order; each CTA takes the next run of cost, and a tile that
 * straddles a CTA boundary is cut there (split-KV), the cut on a multiple of the variant's
 * kv_tile_tokens (request-local token index) with no piece shorter than its
 * min_chunk_tokens (fi_split_grain; when the boundary would leave one, it moves instead).
 * 1. Capped walk (the plan): the smallest cap C such that "each CTA takes as much as fits
 *    under C, cutting the tile below C" covers all tiles with num_ctas CTAs, to within
 *    1/64 of a lower bound (mean cost per CTA, or the largest piece a tile cannot avoid).
 *    Dry trials (cap_trial) skip whole tiles by galloping search over prefix sums of tile
 *    costs (O(num_ctas log tiles) each) and give up early when the cost left exceeds what
 *    the remaining CTAs can hold; a failed trial also guesses the cap from the room its
 *    CTAs wasted, a trial that fits returns its achieved max CTA cost (the walk under that
 *    cap is the same), so trace decode batches take 1-3 trials (4-6 for 32 requests), then
 *    one real walk (cap_walk) writes the plan.  For batches that packing (pack.h) may
 *    replace, the trials record their walks (cap_rec) and the one under the cap gives the
 *    walk's executor model (cap_model) instead, and the walk is written only if its plan
 *    stands after packing.  Balance (max CTA cost / mean) on
 *    trace decode snapshots: ~1.01-1.08 (tests/test_plan_balance.c).
 * 2. Global walk (fallback if no cap is found, not expected): budget
 *    B = max(ceil((total_cost + cut overhead) / num_ctas), floor); CTA c ends near the
 *    global target (c + 1) * B, choosing whichever misses it least: stop before the tile,
 *    take it whole, or cut it (clamped to the floor); the last CTA takes the rest.  Each cut
 *    adds one item overhead (alpha * rows + beta), so B is recomputed from the previous
 *    walk's cuts (<= 2 walks).
 * Cuts happen only at CTA boundaries, so cuts <= num_ctas - 1, which gives the bounds of
 * workspace/layout.h (items <= tiles + cuts, groups <= cuts, slots <= 2 * cuts); they are
 * still checked on every write.  A CTA's range may be empty.
 * A cut tile becomes one fi_merge_group: consecutive items (pieces in KV order: the last
 * item of one CTA and the first of the next ones) with consecutive partial slots.
 * Unsplit items have out_slot = merge_group = -1.  Empty tiles (kv_begin == kv_end) still
 * become items, so every output row is written.
 */
#include "planner/partition.h"

#include "planner/listsched.h"
#include "planner/model.h"
#include "planner/pack.h"
#include "planner/tiles.h"

#ifndef FI_PLANNER_DEVICE_TU
int fi_partition_test_force_global = 0;
#endif

typedef struct walk {
    const fi_variant *v;
    fi_split_grain grain;
    const fi_layout *l;
    int32_t *indptr;
    fi_work_item *items;
    fi_merge_group *groups;
    int64_t *cta_cost;
    fi_error_detail *err;
    int32_t c;        /* current CTA */
    int64_t cum;      /* cost assigned so far */
    int64_t target;   /* cumulative cost at which CTA c ends */
    int64_t budget;
    int32_t ni, ng, ns, cuts;
    int64_t cut_overhead; /* sum of the extra per-item cost the cuts added */
    int dry;              /* 1: only costs and counts (trial walks), no items / groups */
} walk;

FI_PD_STATIC fi_status over_caps(walk *w, int64_t needed, int64_t limit) {
    w->err->status = FI_ERR_PLAN_OVER_CAPS;
    w->err->request = -1;
    w->err->needed = needed;
    w->err->limit = limit;
    w->err->cuda_error = 0;
    return FI_ERR_PLAN_OVER_CAPS;
}

/* End CTA c of the global walk; CTA c + 1 ends near the next global multiple of the
 * budget. */
FI_PD_STATIC void close_cta(walk *w) {
    if (!w->dry)
        w->indptr[w->c + 1] = w->ni;
    w->c++;
    w->target += w->budget;
}

/* Emit piece [kv0, kv1) of tile t on CTA w->c.  split: the piece belongs to a merge group
 * (*g, created on its first piece). */
FI_PD_STATIC fi_status emit(walk *w, const fi_tile *t, int32_t kv0, int32_t kv1, int split,
                      int32_t *g, int64_t overhead) {
    if (w->dry) {
        /* Trial walk: count only (bounds hold by construction; the real walk checks). */
        if (split) {
            if (*g < 0)
                *g = w->ng++;
            w->ns++;
        }
    } else {
        if (w->ni >= w->l->max_items)
            return over_caps(w, (int64_t)w->ni + 1, w->l->max_items);
        fi_work_item *it = &w->items[w->ni];
        *it = fi_tile_item(t, kv0, kv1, -1, -1);
        if (split) {
            if (*g < 0) {
                if (w->ng >= w->l->max_groups)
                    return over_caps(w, (int64_t)w->ng + 1, w->l->max_groups);
                w->groups[w->ng] = fi_tile_group(t, w->ns, 0, w->ni);
                *g = w->ng++;
            }
            if (w->ns >= w->l->max_slots)
                return over_caps(w, (int64_t)w->ns + 1, w->l->max_slots);
            it->out_slot = w->ns++;
            it->merge_group = *g;
            w->groups[*g].num_splits++;
        }
    }
    const int64_t cost = (int64_t)(kv1 - kv0) + overhead;
    w->cta_cost[w->c] += cost;
    w->cum += cost;
    w->ni++;
    return FI_OK;
}

/* Capped walk's cut of a tile whose rest [pos, kv_end) (plus `overhead`) does not fit in
 * the rem cost units left on the CTA: the largest KV tile multiple that fits and leaves
 * both pieces >= the floor, or -1 (no such cut: the CTA ends before this tile).
 * Branch-free: a negative value stays negative under the mask, so a room or a tile too
 * short for the floor gives a `want` below `lo` (lo >= 0). */
FI_PD_STATIC inline int64_t cap_cut(fi_split_grain sg, int32_t pos, int32_t kv_end, int64_t overhead,
                              int64_t rem) {
    const int64_t lo = fi_grain_round_up(sg, (int64_t)pos + sg.floor);
    const int64_t hi = ((int64_t)kv_end - sg.floor) & sg.mask;
    int64_t want = ((int64_t)pos + rem - overhead) & sg.mask;
    want = want < hi ? want : hi;
    return want >= lo ? want : -1;
}

/* Global-target walk (the fallback) with w->budget: CTA c ends near (c + 1) * budget, the
 * last CTA takes the rest. */
FI_PD_STATIC fi_status walk_tiles(walk *w, const fi_tile *tiles, int32_t num_tiles) {
    const int32_t n = w->l->num_ctas;
    w->c = 0;
    w->cum = 0;
    w->target = w->budget;
    w->ni = w->ng = w->ns = w->cuts = 0;
    w->cut_overhead = 0;
    w->indptr[0] = 0;
    for (int32_t c = 0; c < n; c++)
        w->cta_cost[c] = 0;
    for (int32_t i = 0; i < num_tiles; i++) {
        const fi_tile *t = &tiles[i];
        const int64_t rows = (int64_t)(t->q_end - t->q_begin) * (t->head_end - t->head_begin);
        const int64_t overhead = fi_variant_item_cost(w->v, 0, rows);
        int32_t pos = t->kv_begin;
        int32_t g = -1;
        for (;;) {
            const int64_t rest_cost = (int64_t)(t->kv_end - pos) + overhead;
            if (w->c != n - 1 && w->cum + rest_cost > w->target) {
                /* Three ways to end CTA c near its target; take the one that misses it
                 * least: stop before this piece, take it whole, or cut it where the
                 * target falls (clamped so no piece is below the floor). */
                const fi_split_grain sg = w->grain;
                const int64_t lo = fi_grain_round_up(sg, (int64_t)pos + sg.floor);
                const int64_t hi = fi_grain_round_down(sg, (int64_t)t->kv_end - sg.floor);
                const int64_t room = w->target - w->cum - overhead; /* KV tokens that fit */
                const int64_t under = w->target - w->cum;
                const int64_t over = w->cum + rest_cost - w->target;
                int64_t best = under < over ? under : over;
                int64_t cut = -1;
                if (lo <= hi) {
                    int64_t want = fi_grain_round(sg, pos + (room > 0 ? room : 0));
                    want = want < lo ? lo : want > hi ? hi : want;
                    int64_t miss = w->cum + (want - pos) + overhead - w->target;
                    miss = miss < 0 ? -miss : miss;
                    if (miss < best) {
                        best = miss;
                        cut = want;
                    }
                }
                if (cut >= 0) {
                    fi_status st = emit(w, t, pos, (int32_t)cut, 1, &g, overhead);
                    if (st != FI_OK)
                        return st;
                    w->cuts++;
                    w->cut_overhead += overhead;
                    pos = (int32_t)cut;
                    close_cta(w);
                    continue;
                }
                if (best == under) {
                    close_cta(w);
                    continue;
                }
            }
            fi_status st = emit(w, t, pos, t->kv_end, g >= 0, &g, overhead);
            if (st != FI_OK)
                return st;
            break;
        }
    }
    if (!w->dry)
        for (int32_t c = w->c + 1; c <= n; c++)
            w->indptr[c] = w->ni;
    return FI_OK;
}

FI_PD_STATIC int64_t max_cta_cost(const int64_t *cta_cost, int64_t n) {
    int64_t max = 0;
    for (int64_t c = 0; c < n; c++)
        max = cta_cost[c] > max ? cta_cost[c] : max;
    return max;
}

/* Global-target walks: each cut adds one item overhead, which the budget must include or
 * the last CTA collects it all; the number of cuts depends on the budget, so iterate a few
 * walks (budget from the previous walk's cut overhead).  Returns the budget with the
 * lowest max CTA cost in *best_budget and that cost in *best_max. */
FI_PD_STATIC fi_status global_walks(walk *w, const fi_tile *tiles, int32_t num_tiles,
                              int64_t total_cost, int64_t *best_budget, int64_t *best_max) {
    const int64_t n = w->l->num_ctas;
    int64_t budget = (total_cost + n - 1) / n;
    *best_max = INT64_MAX;
    for (int pass = 0; pass < 2; pass++) {
        w->budget = budget < w->grain.floor ? w->grain.floor : budget;
        fi_status st = walk_tiles(w, tiles, num_tiles);
        if (st != FI_OK)
            return st;
        const int64_t max = max_cta_cost(w->cta_cost, n);
        if (max < *best_max) {
            *best_max = max;
            *best_budget = w->budget;
        }
        const int64_t next = (total_cost + w->cut_overhead + n - 1) / n;
        if (w->cuts == 0 || next == budget)
            break;
        budget = next;
    }
    return FI_OK;
}

/* The largest a >= i with prefix[a] <= lim (a = i: not even the rest of tile i fits): the
 * tiles a CTA starting in tile i takes whole under a cap.  Up to 4 tiles by a scan, or
 * with `count` (batches of more tiles than CTAs) by a branch-free count: there a CTA takes
 * 0-2 whole tiles (trace decode), a number that changes from CTA to CTA, so the scan
 * loop's exit is mispredicted (~40% of the branch misses of a GQA decode update at 32
 * requests under callgrind's branch simulator); with fewer tiles than CTAs (MLA heads 16
 * at 128 requests) the scan's first test nearly always ends it.  Then galloping and
 * bisection, O(log(a - i)) (GQA decode at 1024 requests: ~60). */
FI_PD_STATIC inline int32_t cap_reach(const int64_t *prefix, int32_t num_tiles, int32_t i,
                                      int64_t lim, int count) {
    int32_t a = i;
    const int32_t stop = num_tiles - i < 4 ? num_tiles : i + 4;
    if (count && stop == i + 4) { /* the scan's stop: tile i + k only after i + k - 1 */
        const int32_t t1 = prefix[i + 1] <= lim, t2 = t1 & (prefix[i + 2] <= lim),
                      t3 = t2 & (prefix[i + 3] <= lim), t4 = t3 & (prefix[i + 4] <= lim);
        a += t1 + t2 + t3 + t4;
    } else {
        while (a < stop && prefix[a + 1] <= lim)
            a++;
    }
    if (a == stop && a < num_tiles) {
        int32_t step = 1;
        while (step <= num_tiles - a && prefix[a + step] <= lim) {
            a += step;
            step *= 2;
        }
        int32_t b = step <= num_tiles - a ? a + step - 1 : num_tiles;
        while (a < b) {
            const int32_t m = a + (b - a + 1) / 2;
            if (prefix[m] <= lim)
                a = m;
            else
                b = m - 1;
        }
    }
    return a;
}

/* The end of a capped walk's CTA in tile t at KV position pos with rem cost units left:
 * the cut where the CTA ends (cap_cut), -1 if none is legal; after a cut, the piece
 * [pos, cut) is placed (*g: cost placed, *rem: left on the CTA). */
FI_PD_STATIC FI_PD_INLINE int64_t cap_end(fi_split_grain sg, const fi_tile *t, int32_t pos,
                                          int64_t *g, int64_t *rem) {
    const int64_t overhead = t->cost - (t->kv_end - t->kv_begin);
    const int64_t cut = cap_cut(sg, pos, t->kv_end, overhead, *rem);
    if (cut >= 0) {
        *rem -= (cut - pos) + overhead;
        *g += cut - pos;
    }
    return cut;
}

/* A trial's walk as cap_model needs it, so that the walk the search ends on needs no second
 * dry walk for its model (GQA decode at 32 requests: ~10k instructions, ~12% of an
 * update's time on the 2-core EPYC VM, docs/perf-log.md).  Per CTA c < ctas: cost[c] =
 * 2 x its cost, + 1 if it ends with a cut (cap_model decodes it in place), and head[c]:
 * the cost of the rest of the tile it starts in, which it took whole iff head[c] <= cap
 * (the trial's cap).  Two stores a CTA and no branch: the trials that record are most of a
 * packed batch's walk.  cost, head: [num_ctas]. */
typedef struct cap_rec {
    int64_t *cost, *head;
    int64_t cap;
    int32_t ctas;
} cap_rec;

/* Dry capped trial in O(num_ctas * log(tiles)): the decisions of cap_walk (each CTA takes
 * as much as fits under `cap`, cutting the tile below the cap), but whole tiles are
 * skipped with a galloping search over prefix[] (prefix sums of tile costs).  With
 * `record`, rec receives the walk (complete only if it fits).
 * @return the largest CTA cost of that walk (<= cap) if every tile fits in n CTAs, else -1.
 * The walk under the returned cost makes the same decisions (every CTA's content still
 * fits and nothing more does), so the caller may lower its upper bound to it.
 * On -1, *est: a guess of the cap that would fit (not a bound; 0: no guess).
 * Positions in cost units: the walk at tile i, KV position pos has placed
 * g = prefix[i] + (pos - kv_begin) of the tiles' cost, and the rest of tile i costs
 * prefix[i + 1] - g (a later piece pays the item overhead again, which cost does include).
 * So a CTA starting at g takes whole every tile up to the largest a with
 * prefix[a] <= g + cap (its own rest first), then cuts tile a. */
FI_PD_STATIC FI_PD_INLINE int64_t cap_trial_body(fi_split_grain sg, const fi_tile *tiles,
                                                 const int64_t *prefix, int32_t num_tiles,
                                                 int32_t n, int64_t cap, int64_t *est,
                                                 const int record, cap_rec *rec) {
    int64_t *const rcost = record ? rec->cost : NULL, *const rhead = record ? rec->head : NULL;
    int32_t i = 0;
    int64_t g = 0, max = 0;
    /* total - (n - c) * cap: below it, the cost left (total - g) is more than CTAs c .. n - 1
     * can hold (one live value for both). */
    int64_t need = prefix[num_tiles] - (int64_t)n * cap;
    if (record) {
        rec->cap = cap;
        rec->ctas = n;
    }
    for (int32_t c = 0; c < n; c++, need += cap) {
        if (i == num_tiles) {
            if (record)
                rec->ctas = c;
            return max;
        }
        /* Cost still to place (cuts only add): more than the remaining CTAs can hold means
         * no fit. */
        if (g < need) {
            const int64_t total = prefix[num_tiles], room = total - need;
            /* Guess of the cap that fits: CTAs 0 .. c-1 held `waste` less tile cost
             * than c caps (room left unused, cut overhead); assume the rest lose as much
             * per CTA and spread the shortfall over all n. */
            const int64_t waste = (int64_t)c * cap - g;
            const int64_t per = c > 0 ? (waste + c - 1) / c : 0;
            *est = cap + (total - g - room + (int64_t)(n - c) * per + n - 1) / n;
            return -1;
        }
        const int64_t lim = g + cap;
        const int32_t a = cap_reach(prefix, num_tiles, i, lim, num_tiles > n);
        int64_t rem = cap;
        const int took = a > i;
        if (record)
            rhead[c] = prefix[i + 1] - g;
        if (took) {
            rem = lim - prefix[a];
            if (a == num_tiles) {
                const int64_t used = cap - rem;
                if (record) {
                    rcost[c] = 2 * used;
                    rec->ctas = c + 1;
                }
                return used > max ? used : max;
            }
            i = a;
            g = prefix[i];
        }
        /* The KV position, from g (g - pos is constant inside a tile): not a value carried
         * from one CTA to the next, which GCC kept on the stack, on the path from a CTA's
         * cut to the next one's. */
        const int32_t pos = (int32_t)(g - prefix[i]) + tiles[i].kv_begin;
        const int64_t cut = cap_end(sg, &tiles[i], pos, &g, &rem);
        if (cut < 0 && !took) {
            *est = 0; /* an empty CTA: every later one would end empty too; no guess */
            return -1;
        }
        const int64_t used = cap - rem;
        if (record)
            rcost[c] = 2 * used + (cut >= 0);
        max = used > max ? used : max;
    }
    if (i == num_tiles)
        return max;
    *est = cap + (prefix[num_tiles] - g + n - 1) / n;
    return -1;
}

/* cap_trial_body compiled twice, with and without the record (which costs the trials that
 * record nothing ~10% more instructions when it is a run-time choice). */
FI_PD_STATIC int64_t cap_trial_rec(fi_split_grain sg, const fi_tile *tiles,
                                   const int64_t *prefix, int32_t num_tiles, int32_t n,
                                   int64_t cap, int64_t *est, cap_rec *rec) {
    return cap_trial_body(sg, tiles, prefix, num_tiles, n, cap, est, 1, rec);
}
FI_PD_STATIC int64_t cap_trial_plain(fi_split_grain sg, const fi_tile *tiles,
                                     const int64_t *prefix, int32_t num_tiles, int32_t n,
                                     int64_t cap, int64_t *est) {
    return cap_trial_body(sg, tiles, prefix, num_tiles, n, cap, est, 0, NULL);
}
/* The trial, recorded into rec unless it is NULL. */
FI_PD_STATIC FI_PD_INLINE int64_t cap_trial(fi_split_grain sg, const fi_tile *tiles,
                                            const int64_t *prefix, int32_t num_tiles,
                                            int32_t n, int64_t cap, int64_t *est,
                                            cap_rec *rec) {
    return rec ? cap_trial_rec(sg, tiles, prefix, num_tiles, n, cap, est, rec)
               : cap_trial_plain(sg, tiles, prefix, num_tiles, n, cap, est);
}

/* The last probe of a bisection of [lo, hi] down to below tol in which every probe
 * fails (each failure moves lo past its probe): the highest cap it would try. */
FI_PD_STATIC int64_t all_fail_probe(int64_t lo, int64_t hi, int64_t tol) {
    int64_t mid = hi;
    while (hi - lo >= tol) {
        mid = lo + (hi - lo) / 2;
        lo = mid + 1;
    }
    return mid;
}

/* Narrow the capped walk's bracket: best fits (its achieved max CTA cost), hi = best - 1,
 * no cap below lo fits; returns the smallest achieved max the search finds, to within
 * tol.  First one step of tol under the best (the gallop's guess is usually that close),
 * then bisection.  Each time the bisection starts on a bracket (and after each fit), the
 * last probe of its all-fail path is tried first: if that fails, every lower probe is
 * taken to fail too and the search ends.  Why: on trace decode batches every probe of the
 * bisection fails (3-4 trials a walk, the larger part of the update for packed batches);
 * fitting is monotone in the cap in practice (every cap of the 442 plan_compare.sh
 * batches checked: one exception, far below the best cap), so the plans do not change.
 * A probe the bisection repeats is not redone.  At most max_trials trials. */
FI_PD_STATIC int64_t narrow_cap(fi_split_grain sg, const fi_tile *tiles, const int64_t *prefix,
                                int32_t num_tiles, int32_t n, int64_t lo, int64_t hi,
                                int64_t tol, int64_t best, int max_trials, cap_rec *rec,
                                int *held) {
    int64_t est = 0, end = -1, end_m = -1; /* the all-fail path's last probe, its result */
    int end_kept = 0;                      /* rec[w] still holds the walk of end */
    for (int t = 0, first = 1, check = 0; t < max_trials && hi - lo >= tol; first = 0) {
        const int64_t mid = first   ? hi + 1 - tol
                            : check ? all_fail_probe(lo, hi, tol)
                                    : lo + (hi - lo) / 2;
        const int w = *held == 0; /* the record a trial may overwrite */
        int64_t m = end_m;
        if (mid != end) {
            m = cap_trial(sg, tiles, prefix, num_tiles, n, mid, &est, rec ? &rec[w] : NULL);
            t++;
            end_kept = 0;
        }
        if (check) { /* the bracket stays: only its bisection's outcome is known */
            check = 0;
            if (m < 0)
                break; /* every probe of the bisection would fail: best stands */
            end = mid;
            end_m = m;
            end_kept = 1;
            continue;
        }
        if (m >= 0) {
            best = m;
            hi = m - 1;
            check = 1;
            *held = mid != end || end_kept ? w : -1;
        } else {
            lo = mid + 1;
        }
    }
    return best;
}

/* The executor model's charges (planner/model.h) of a merge group the walk just closed:
 * its pieces lie on CTAs c0 .. c, each the last item of its CTA but the one on c, which is
 * c's first (it ends at `last_cost`).  The piece that ends last (ties: the lower CTA, the
 * lower item index) pays the merge, the others an arrival; charges go to extra[]. */
FI_PD_STATIC void walk_group_charges(const fi_variant *v, const int64_t *cta_cost,
                                     int64_t *extra, int32_t c0, int32_t c, int64_t last_cost) {
    int32_t last = c;
    int64_t end = last_cost;
    for (int32_t j = c - 1; j >= c0; j--) /* downwards: ">=" keeps the lowest of a tie */
        if (cta_cost[j] >= end) {
            end = cta_cost[j];
            last = j;
        }
    for (int32_t j = c0; j <= c; j++)
        extra[j] += j == last ? v->cost_merge : v->cost_arrive;
}

/* The executor model of cap_walk's plan under a cap that fits (its *model, fi_model_max's
 * figure) without writing the plan, from the walk a trial recorded (cap_rec; the walk under
 * the trial's achieved cost is the same): each merge group is charged when its last piece
 * is placed (walk_group_charges into extra).  Why: for batches that packing replaces (GQA
 * decode at 32 requests, MLA heads 16 at 128) the walk's plan is never used; only its cap
 * and model are (planner/pack.h), and writing it was ~23k instructions an update.  Returns
 * -1 if the plan would exceed a layout bound (items = tiles + cuts, groups, slots = cuts +
 * groups): then the caller writes the walk with cap_walk, which reports what cap_walk
 * reports.  Decodes r->cost in place (once).  extra: [num_ctas]. */
FI_PD_STATIC int64_t cap_model(const fi_variant *v, cap_rec *r, int32_t num_tiles,
                               const fi_layout *l, int64_t *extra) {
    int64_t *cost = r->cost;
    int32_t cuts = 0, ng = 0, gc0 = -1; /* gc0: CTA of the open group's first piece */
    for (int32_t c = 0; c < r->ctas; c++) {
        const int cut = (int)(cost[c] & 1);
        cost[c] >>= 1;
        extra[c] = 0;
        if (gc0 >= 0 && r->head[c] <= r->cap) { /* CTA c began with the group's last piece */
            if (gc0 == c - 1) { /* two pieces (most groups): walk_group_charges without loops */
                const int first_last = cost[c - 1] >= r->head[c];
                extra[c - 1] += first_last ? v->cost_merge : v->cost_arrive;
                extra[c] += first_last ? v->cost_arrive : v->cost_merge;
            } else {
                walk_group_charges(v, cost, extra, gc0, c, r->head[c]);
            }
            gc0 = -1;
        }
        if (cut) {
            cuts++;
            if (gc0 < 0) {
                gc0 = c;
                ng++;
            }
        }
    }
    if ((int64_t)num_tiles + cuts > l->max_items || ng > l->max_groups ||
        cuts + ng > l->max_slots)
        return -1;
    int64_t mm = 0;
    for (int32_t c = 0; c < r->ctas; c++)
        mm = cost[c] + extra[c] > mm ? cost[c] + extra[c] : mm;
    return mm;
}

/* The capped walk that writes the plan (the decisions of cap_trial): items in tile order,
 * a merge group per cut tile, CTA ranges and costs.  *fits = 0 if the tiles do not fit in
 * num_ctas CTAs (outputs partial: the caller must fail).  With extra ([num_ctas] scratch;
 * NULL: not wanted) also the plan's executor model, fi_model_max's figure, in *model: one
 * pass fewer over the items for batches whose walk is scored against packing. */
FI_PD_STATIC fi_status cap_walk(const fi_variant *v, fi_split_grain sg, const fi_tile *tiles,
                                int32_t num_tiles, const fi_layout *l, int64_t cap,
                                int32_t *indptr, fi_work_item *items, fi_merge_group *groups,
                                int64_t *cta_cost, int64_t *extra, int64_t *model,
                                fi_partition_result *res, int *fits, fi_error_detail *err) {
    /* Bounds in locals: stores to items / groups may alias *l as far as the compiler
     * knows, which would force reloads. */
    const int32_t n = l->num_ctas, max_items = l->max_items, max_groups = l->max_groups,
                  max_slots = l->max_slots;
    /* gc0, gs0: CTA and slot of a group's first piece */
    int32_t c = 0, ni = 0, ng = 0, ns = 0, gc0 = 0, gs0 = 0;
    int64_t rem = cap, total = 0, max = 0;
    walk w = {.err = err};
    *fits = 0;
    indptr[0] = 0;
    if (extra)
        for (int32_t k = 0; k < n; k++)
            extra[k] = 0;
    for (int32_t i = 0; i < num_tiles; i++) {
        const fi_tile *t = &tiles[i];
        if (t->cost <= rem) { /* the whole tile fits (most tiles): one item, as the tile */
            if (ni >= max_items)
                return over_caps(&w, (int64_t)ni + 1, max_items);
            fi_copy_bytes(&items[ni], t, FI_TILE_ITEM_BYTES);
            items[ni].out_slot = -1;
            items[ni].merge_group = -1;
            ni++;
            rem -= t->cost;
            continue;
        }
        const int64_t overhead = t->cost - (t->kv_end - t->kv_begin);
        int32_t pos = t->kv_begin;
        int32_t g = -1;
        for (;;) {
            int32_t end = t->kv_end;
            int whole = 1;
            if ((int64_t)(t->kv_end - pos) + overhead > rem) {
                if (c == n - 1)
                    return FI_OK; /* the rest does not fit in the last CTA */
                const int64_t cut = cap_cut(sg, pos, t->kv_end, overhead, rem);
                if (cut < 0) { /* end the CTA before this tile */
                    cta_cost[c] = cap - rem;
                    total += cap - rem;
                    max = cap - rem > max ? cap - rem : max;
                    indptr[++c] = ni;
                    rem = cap;
                    continue;
                }
                end = (int32_t)cut;
                whole = 0;
            }
            if (ni >= max_items)
                return over_caps(&w, (int64_t)ni + 1, max_items);
            int32_t slot = -1;
            if (!whole || g >= 0) { /* a piece of a cut tile */
                if (g < 0) {
                    if (ng >= max_groups)
                        return over_caps(&w, (int64_t)ng + 1, max_groups);
                    groups[ng] = (fi_merge_group){t->request, t->head_begin, t->head_end,
                                                  t->q_begin, t->q_end, ns, 0, ni, 0};
                    g = ng++;
                    gc0 = c;
                    gs0 = ns;
                }
                if (ns >= max_slots)
                    return over_caps(&w, (int64_t)ns + 1, max_slots);
                slot = ns++;
                /* a store, not an increment: no reload of the group just written */
                groups[g].num_splits = ns - gs0;
            }
            /* The tile's first 16 bytes are the item's (scratch.h) as one move, then the
             * KV range and merge fields: GQA decode at 1024 requests writes 8192 items. */
            fi_copy_bytes(&items[ni], t, FI_TILE_ITEM_HEAD_BYTES);
            items[ni].kv_begin = pos;
            items[ni].kv_end = end;
            items[ni].out_slot = slot;
            items[ni].merge_group = g;
            ni++;
            rem -= (int64_t)(end - pos) + overhead;
            if (whole) {
                if (extra && g >= 0) /* the group's last piece: its charges are known */
                    walk_group_charges(v, cta_cost, extra, gc0, c, cap - rem);
                break;
            }
            pos = end; /* the cut ends CTA c */
            cta_cost[c] = cap - rem;
            total += cap - rem;
            max = cap - rem > max ? cap - rem : max;
            indptr[++c] = ni;
            rem = cap;
        }
    }
    cta_cost[c] = cap - rem;
    total += cap - rem;
    max = cap - rem > max ? cap - rem : max;
    for (int32_t k = c + 1; k < n; k++)
        cta_cost[k] = 0;
    for (int32_t k = c + 1; k <= n; k++)
        indptr[k] = ni;
    if (extra) {
        int64_t mm = 0;
        for (int32_t k = 0; k <= c; k++)
            mm = cta_cost[k] + extra[k] > mm ? cta_cost[k] + extra[k] : mm;
        *model = mm;
    }
    res->num_items = ni;
    res->num_groups = ng;
    res->num_slots = ns;
    res->budget = cap;
    res->total_cost = total;
    res->max_cta_cost = max;
    *fits = 1;
    return FI_OK;
}

/* prefix[0 .. num_tiles]: prefix sums of the tiles' costs.  Returns the largest item
 * overhead of a tile (its cost less its KV length: alpha * rows + beta, planner/tiles.c),
 * 0 if none is larger. */
FI_PD_STATIC int64_t tile_prefix(const fi_tile *tiles, int32_t num_tiles, int64_t *prefix);
/* The capped walk's cap (the smallest that fits, by dry trials over tile_prefix's prefix
 * and oh_max), or -1 if none is found (then the global-target fallback).  rec: NULL, or two
 * records the trials take turns in; *held: the one that holds the walk under the cap, -1 if
 * neither does. */
FI_PD_STATIC int64_t walk_cap(const fi_variant *v, const fi_tile *tiles, int32_t num_tiles,
                              int64_t total_cost, const int64_t *prefix, int64_t oh_max,
                              const fi_layout *l, cap_rec *rec, int *held);
/* The contiguous walk's plan under cap (cap_walk; cap < 0: the global-target fallback); with
 * extra ([num_ctas] scratch, else NULL) also its executor model in *model (-1 if the walk
 * did not compute it: the fallback). */
FI_PD_STATIC FI_PD_OUTLINE fi_status walk_write(const fi_variant *v, const fi_tile *tiles,
                                                int32_t num_tiles, int64_t total_cost,
                                                int64_t cap, const fi_layout *l,
                                                int32_t *work_indptr, fi_work_item *items,
                                                fi_merge_group *groups, int64_t *cta_cost,
                                                int64_t *extra, int64_t *model,
                                                fi_partition_result *res, fi_error_detail *err);

#ifndef FI_PLANNER_DEVICE_TU
int fi_partition_test_no_pack = 0;
int fi_partition_test_list = 0;
int fi_partition_test_check_model = 0;
int fi_partition_test_model_mismatches = 0;
#endif

FI_PD fi_status fi_partition(const fi_variant *v, const fi_tile *tiles, int32_t num_tiles,
                       int64_t total_cost, int64_t *prefix, fi_pack_scratch *pack,
                       const fi_layout *l, int32_t *work_indptr, fi_work_item *items,
                       fi_merge_group *groups, int64_t *cta_cost, fi_partition_result *res,
                       fi_error_detail *err) {
    const int64_t oh_max = tile_prefix(tiles, num_tiles, prefix);
    /* The walk's model is wanted when packing or the list schedule is scored against it. */
    const int packing =
        pack && !fi_partition_test_no_pack && fi_pack_wanted(v, tiles, num_tiles, oh_max, l);
    const int listing = pack && v->partition == FI_PARTITION_LIST &&
                        fi_partition_test_list >= 0 && num_tiles <= l->max_items;
    /* The trials' records: scratch that is free until packing starts (finish: max_items >=
     * num_ctas). */
    cap_rec rec[2] = {{cta_cost, pack ? pack->load : NULL, 0, 0},
                      {pack ? pack->cta_cost : NULL, pack ? pack->finish : NULL, 0, 0}};
    int held = -1;
    const int64_t cap = walk_cap(v, tiles, num_tiles, total_cost, prefix, oh_max, l,
                                 packing ? rec : NULL, &held);
    /* Packing needs only the walk's cap and model, and replaces the walk's plan on most
     * batches it is tried on, so the walk's plan is written after packing, if it stands
     * (cap_model; GQA decode at 32 requests: 256 items not written).  The test hook that
     * checks the models writes the walk anyway and compares the recorded model (rm) with
     * fi_model_max of the written plan. */
    int64_t wm = -1;
    int deferred = packing && cap >= 0;
    if (deferred && held < 0) { /* the search's records moved on: walk the cap again */
        int64_t unused = 0;
        held = 0;
        deferred = cap_trial(fi_split_grain_of(v), tiles, prefix, num_tiles, l->num_ctas, cap,
                             &unused, &rec[0]) >= 0;
    }
    deferred = deferred && (wm = cap_model(v, &rec[held], num_tiles, l, rec[!held].cost)) >= 0;
#ifndef FI_PLANNER_DEVICE_TU
    int64_t rm = -1;
    if (deferred && fi_partition_test_check_model) {
        rm = wm;
        wm = -1;
        deferred = 0;
    }
#endif
    if (deferred) {
        res->budget = cap;
    } else {
        fi_status st = walk_write(v, tiles, num_tiles, total_cost, cap, l, work_indptr, items,
                                  groups, cta_cost, packing || listing ? pack->load : NULL,
                                  &wm, res, err);
        if (st != FI_OK || !(packing || listing))
            return st;
        if (wm < 0 || fi_partition_test_check_model) {
            const int64_t m = fi_model_max(v, work_indptr, l->num_ctas, items,
                                           res->num_groups, pack->finish, pack->last);
#ifndef FI_PLANNER_DEVICE_TU
            fi_partition_test_model_mismatches += (wm >= 0 && m != wm) + (rm >= 0 && m != rm);
#endif
            wm = m;
        }
    }
    FI_PD_STAMP(3);
    if (packing) {
        FI_PD_STAMP(4);
        /* The cap search starts from the walk's cap less 1/64: packing has fewer items (less
         * overhead) but charges its pieces. */
        const int64_t pm = fi_partition_pack(v, tiles, num_tiles, total_cost, l, pack,
                                             res->budget - res->budget / 64, wm, work_indptr,
                                             items, groups, cta_cost, res);
        if (deferred && pm == wm) { /* packing did not win: the walk's plan stands */
            int64_t unused = -1;
            fi_status st = walk_write(v, tiles, num_tiles, total_cost, cap, l, work_indptr,
                                      items, groups, cta_cost, NULL, &unused, res, err);
            if (st != FI_OK)
                return st;
        }
        wm = pm;
    }
    if (!listing)
        return FI_OK;
    /* The list schedule (planner/listsched.h) replaces the walk's (or packing's) plan while
     * both its modelled time and its largest CTA cost (the same figure: it cuts nothing) are
     * within the row's slack of that plan's: the model counts work, the list schedule's gain
     * is L2 reuse, which the model does not see.  (The model alone would also take it for
     * batches of fewer tiles than CTAs, where the walk's pieces use the idle CTAs and no
     * schedule keeps few heads in flight.) */
    const int64_t lm = fi_list_schedule(tiles, num_tiles, l->num_ctas, pack);
    const int64_t room = 64 + (int64_t)v->list_slack_64ths;
    if (fi_partition_test_list > 0 ||
        (64 * lm <= room * wm && 64 * lm <= room * res->max_cta_cost))
        fi_list_write(tiles, num_tiles, l->num_ctas, pack, work_indptr, items, cta_cost, res);
    return FI_OK;
}

FI_PD_STATIC int64_t tile_prefix(const fi_tile *tiles, int32_t num_tiles, int64_t *prefix) {
    int64_t oh_max = 0;
    prefix[0] = 0;
    for (int32_t i = 0; i < num_tiles; i++) {
        prefix[i + 1] = prefix[i] + tiles[i].cost;
        const int64_t oh = tiles[i].cost - (tiles[i].kv_end - tiles[i].kv_begin);
        oh_max = oh > oh_max ? oh : oh_max;
    }
    return oh_max;
}

FI_PD_STATIC int64_t walk_cap(const fi_variant *v, const fi_tile *tiles, int32_t num_tiles,
                              int64_t total_cost, const int64_t *prefix, int64_t oh_max,
                              const fi_layout *l, cap_rec *rec, int *held) {
    const int64_t n = l->num_ctas;
    const fi_split_grain sg = fi_split_grain_of(v);
    /* The smallest cap that fits, to within tol = 1/64 of the lower bound, by dry trials
     * (cap_trial, O(num_ctas log tiles) each).  Bracket:
     *   lo: max(mean cost per CTA, the largest piece some tile cannot avoid: an uncuttable
     *       tile whole, else its shortest legal first or last piece) - no smaller cap fits;
     *   hi: a cap that always fits: the mean with every boundary cut, plus the most a CTA
     *       can leave unused (an uncuttable tile < 2 floors + 2 KV tiles, or a piece below
     *       the floor, plus one item overhead).
     * Search: try lo + tol; after a failure, the larger of the failed trial's guess and
     * lo + a doubling step, until a cap fits; then one try tol below the best and
     * bisection until hi - lo < tol.  A trial that fits lowers hi to its achieved max CTA
     * cost (the walk under that cost is the same walk).  Trace decode snapshots: 1 trial
     * at 1024 requests, 2 at 512, 3 at 128, 4-6 at 32 (narrow_cap).  tol 1/64 (not 1/128) saves about a
     * trial for ~0.5% worse worst-case balance. */
    enum { FI_CAP_TRIALS = 40 }; /* bound on trials: both phases are logarithmic */
    int64_t lo = (total_cost + n - 1) / n;
    /* The piece bound is below 2 floors + 2 KV tiles + oh_max (an uncuttable tile is
     * shorter than that; a cut piece's minimum is one floor + one KV tile), so it only
     * matters (and is only computed) when the mean is below that. */
    if (lo < 2 * sg.floor + 2 * sg.tile + oh_max) {
        for (int32_t i = 0; i < num_tiles; i++) {
            const fi_tile *t = &tiles[i];
            const int64_t oh = t->cost - (t->kv_end - t->kv_begin);
            const int64_t c0 = fi_grain_round_up(sg, (int64_t)t->kv_begin + sg.floor);
            const int64_t c1 = fi_grain_round_down(sg, (int64_t)t->kv_end - sg.floor);
            int64_t need = t->cost; /* uncuttable: whole */
            if (c0 <= c1) {         /* first piece ends at >= c0, last starts at <= c1 */
                const int64_t first = c0 - t->kv_begin, last = t->kv_end - c1;
                need = (first > last ? first : last) + oh;
            }
            lo = need > lo ? need : lo;
        }
    }
    int64_t hi =
        (total_cost + (n - 1) * oh_max + n - 1) / n + 2 * sg.floor + 2 * sg.tile + oh_max;
    hi = hi < lo ? lo : hi;
    const int64_t tol = lo / 64 + 1;
    int64_t best_cap = -1;
    int trials = 0;
    int64_t est = 0;
    if (!fi_partition_test_force_global) {
        int64_t cand = lo + tol;
        for (int64_t step = tol; trials < FI_CAP_TRIALS; step *= 2) { /* gallop */
            cand = cand < hi ? cand : hi;
            const int64_t m =
                cap_trial(sg, tiles, prefix, num_tiles, (int32_t)n, cand, &est, rec);
            trials++;
            if (m >= 0) {
                best_cap = m;
                hi = m - 1;
                *held = 0;
                break;
            }
            if (cand == hi)
                break; /* not expected: hi always fits */
            lo = cand + 1;
            /* next: the failed trial's guess, or at least the (doubling) step */
            cand = lo + step > est ? lo + step : est;
        }
        if (best_cap >= 0)
            best_cap = narrow_cap(sg, tiles, prefix, num_tiles, (int32_t)n, lo, hi, tol,
                                  best_cap, FI_CAP_TRIALS - trials, rec, held);
    }
    return best_cap;
}

FI_PD_STATIC FI_PD_OUTLINE fi_status walk_write(const fi_variant *v, const fi_tile *tiles,
                                                int32_t num_tiles, int64_t total_cost,
                                                int64_t cap, const fi_layout *l,
                                                int32_t *work_indptr, fi_work_item *items,
                                                fi_merge_group *groups, int64_t *cta_cost,
                                                int64_t *extra, int64_t *model,
                                                fi_partition_result *res, fi_error_detail *err) {
    const int64_t n = l->num_ctas;
    const fi_split_grain sg = fi_split_grain_of(v);
    if (cap >= 0) {
        /* The real walk, writing items, groups and CTA ranges (trials were dry). */
        int fits = 0;
        fi_status st = cap_walk(v, sg, tiles, num_tiles, l, cap, work_indptr, items, groups,
                                cta_cost, extra, model, res, &fits, err);
        if (st != FI_OK)
            return st;
        if (!fits) { /* cap_trial and cap_walk disagree: a bug, never a partial plan */
            err->status = FI_ERR_PLAN_OVER_CAPS;
            err->request = -1;
            err->needed = cap;
            err->limit = -1;
            err->cuda_error = 0;
            return FI_ERR_PLAN_OVER_CAPS;
        }
        return FI_OK;
    }
    /* Fallback (not expected; tests force it): global-target walks, then the real one. */
    walk w = {.v = v, .grain = sg, .l = l, .indptr = work_indptr, .items = items,
              .groups = groups, .cta_cost = cta_cost, .err = err, .dry = 1};
    int64_t g_budget = 0, g_max = 0;
    fi_status st = global_walks(&w, tiles, num_tiles, total_cost, &g_budget, &g_max);
    if (st != FI_OK)
        return st;
    w.dry = 0;
    w.budget = g_budget;
    st = walk_tiles(&w, tiles, num_tiles);
    if (st != FI_OK)
        return st;
    int64_t total = 0;
    for (int64_t c = 0; c < n; c++)
        total += cta_cost[c];
    res->num_items = w.ni;
    res->num_groups = w.ng;
    res->num_slots = w.ns;
    res->budget = w.budget;
    res->total_cost = total;
    res->max_cta_cost = max_cta_cost(cta_cost, n);
    return FI_OK;
}
