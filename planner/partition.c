/*
 * planner/partition.c - contiguous cost walk (FlashMLA get_mla_metadata /
 * get_decoding_sched_meta scheduler) with flash-decoding split-KV (Dao et al. 2023).
 *
 * Tiles are walked in plan order; each CTA takes the next run of cost, and a tile that
 * straddles a CTA boundary is cut there (split-KV), the cut on a multiple of
 * FI_KV_TILE_TOKENS (request-local token index) with no piece shorter than
 * FI_MIN_CHUNK_TOKENS (when the boundary would leave one, it moves instead).
 * 1. Capped walk (the plan): the smallest cap C such that "each CTA takes as much as fits
 *    under C, cutting the tile below C" covers all tiles with num_ctas CTAs, found by
 *    bisection (to 1/128 of the mean cost) between the mean and a cap that always fits.
 *    Trials are dry and skip whole tiles by binary search over prefix sums of tile costs
 *    (O(num_ctas log tiles) each); then one real walk writes the plan.  Balance (max CTA
 *    cost / mean) on trace decode snapshots: ~1.01-1.07 (tests/test_plan_balance.c).
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

#include "planner/cost_model.h"

int fi_partition_test_force_global = 0;

typedef struct walk {
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

static fi_status over_caps(walk *w, int64_t needed, int64_t limit) {
    w->err->status = FI_ERR_PLAN_OVER_CAPS;
    w->err->request = -1;
    w->err->needed = needed;
    w->err->limit = limit;
    w->err->cuda_error = 0;
    return FI_ERR_PLAN_OVER_CAPS;
}

/* End CTA c.  cap: the next CTA may take up to budget from where this one ended;
 * else its end target is the next global multiple of the budget. */
static void close_cta(walk *w, int cap) {
    if (!w->dry)
        w->indptr[w->c + 1] = w->ni;
    w->c++;
    w->target = cap ? w->cum + w->budget : w->target + w->budget;
}

/* Emit piece [kv0, kv1) of tile t on CTA w->c.  split: the piece belongs to a merge group
 * (*g, created on its first piece). */
static fi_status emit(walk *w, const fi_tile *t, int32_t kv0, int32_t kv1, int split,
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
        it->request = t->request;
        it->head_begin = t->head_begin;
        it->head_end = t->head_end;
        it->q_begin = t->q_begin;
        it->q_end = t->q_end;
        it->kv_begin = kv0;
        it->kv_end = kv1;
        it->out_slot = -1;
        it->merge_group = -1;
        if (split) {
            if (*g < 0) {
                if (w->ng >= w->l->max_groups)
                    return over_caps(w, (int64_t)w->ng + 1, w->l->max_groups);
                fi_merge_group *mg = &w->groups[w->ng];
                mg->request = t->request;
                mg->head_begin = t->head_begin;
                mg->head_end = t->head_end;
                mg->q_begin = t->q_begin;
                mg->q_end = t->q_end;
                mg->first_slot = w->ns;
                mg->num_splits = 0;
                mg->first_item = w->ni;
                mg->reserved = 0;
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

/* Nearest / next / previous multiple of the KV tile (x >= 0). */
static int64_t round_kv_tile(int64_t x) {
    return (x + FI_KV_TILE_TOKENS / 2) / FI_KV_TILE_TOKENS * FI_KV_TILE_TOKENS;
}
static int64_t round_up_kv_tile(int64_t x) {
    return (x + FI_KV_TILE_TOKENS - 1) / FI_KV_TILE_TOKENS * FI_KV_TILE_TOKENS;
}
static int64_t round_down_kv_tile(int64_t x) {
    return x < 0 ? -1 : x / FI_KV_TILE_TOKENS * FI_KV_TILE_TOKENS;
}

/* Walk the tiles once with w->budget.  cap == 0: global targets (CTA c ends near
 * (c + 1) * budget, the last CTA takes the rest).  cap == 1: no CTA exceeds budget (each
 * takes as much as fits, cutting the tile below the cap); *feasible = 0 if the tiles do
 * not fit in num_ctas CTAs (outputs are then partial and must be rebuilt). */
static fi_status walk_tiles(walk *w, const fi_tile *tiles, int32_t num_tiles, int cap,
                            int *feasible) {
    const int32_t n = w->l->num_ctas;
    w->c = 0;
    w->cum = 0;
    w->target = w->budget;
    w->ni = w->ng = w->ns = w->cuts = 0;
    w->cut_overhead = 0;
    w->indptr[0] = 0;
    *feasible = 1;
    for (int32_t c = 0; c < n; c++)
        w->cta_cost[c] = 0;
    for (int32_t i = 0; i < num_tiles; i++) {
        const fi_tile *t = &tiles[i];
        const int64_t rows = (int64_t)(t->q_end - t->q_begin) * (t->head_end - t->head_begin);
        const int64_t overhead = fi_cost_item(0, rows);
        int32_t pos = t->kv_begin;
        int32_t g = -1;
        for (;;) {
            const int64_t rest_cost = (int64_t)(t->kv_end - pos) + overhead;
            const int last = w->c == n - 1;
            if ((cap || !last) && w->cum + rest_cost > w->target) {
                /* Possible cut points: KV tile multiples leaving both pieces >= floor. */
                const int64_t lo = round_up_kv_tile((int64_t)pos + FI_MIN_CHUNK_TOKENS);
                const int64_t hi = round_down_kv_tile((int64_t)t->kv_end - FI_MIN_CHUNK_TOKENS);
                const int64_t room = w->target - w->cum - overhead; /* KV tokens that fit */
                int64_t cut = -1;
                int close = 0;
                if (cap) {
                    if (last) { /* the rest does not fit in the last CTA */
                        *feasible = 0;
                        return FI_OK;
                    }
                    /* Largest cut that stays under the cap, else end the CTA here. */
                    int64_t want = room >= 0 ? round_down_kv_tile(pos + room) : -1;
                    if (want > hi)
                        want = hi;
                    if (lo <= hi && want >= lo)
                        cut = want;
                    else
                        close = 1;
                } else {
                    /* Three ways to end CTA c near its target; take the one that misses it
                     * least: stop before this piece, take it whole, or cut it where the
                     * target falls (clamped so no piece is below the floor). */
                    const int64_t under = w->target - w->cum;
                    const int64_t over = w->cum + rest_cost - w->target;
                    int64_t best = under < over ? under : over;
                    if (lo <= hi) {
                        int64_t want = round_kv_tile(pos + (room > 0 ? room : 0));
                        want = want < lo ? lo : want > hi ? hi : want;
                        int64_t miss = w->cum + (want - pos) + overhead - w->target;
                        miss = miss < 0 ? -miss : miss;
                        if (miss < best) {
                            best = miss;
                            cut = want;
                        }
                    }
                    close = cut < 0 && best == under;
                }
                if (cut >= 0) {
                    fi_status st = emit(w, t, pos, (int32_t)cut, 1, &g, overhead);
                    if (st != FI_OK)
                        return st;
                    w->cuts++;
                    w->cut_overhead += overhead;
                    pos = (int32_t)cut;
                    close_cta(w, cap);
                    continue;
                }
                if (close) {
                    close_cta(w, cap);
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

static int64_t max_cta_cost(const int64_t *cta_cost, int64_t n) {
    int64_t max = 0;
    for (int64_t c = 0; c < n; c++)
        max = cta_cost[c] > max ? cta_cost[c] : max;
    return max;
}

/* Global-target walks: each cut adds one item overhead, which the budget must include or
 * the last CTA collects it all; the number of cuts depends on the budget, so iterate a few
 * walks (budget from the previous walk's cut overhead).  Returns the budget with the
 * lowest max CTA cost in *best_budget and that cost in *best_max. */
static fi_status global_walks(walk *w, const fi_tile *tiles, int32_t num_tiles,
                              int64_t total_cost, int64_t *best_budget, int64_t *best_max) {
    const int64_t n = w->l->num_ctas;
    int64_t budget = (total_cost + n - 1) / n;
    int feasible;
    *best_max = INT64_MAX;
    for (int pass = 0; pass < 2; pass++) {
        w->budget = budget < FI_MIN_CHUNK_TOKENS ? FI_MIN_CHUNK_TOKENS : budget;
        fi_status st = walk_tiles(w, tiles, num_tiles, 0, &feasible);
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

/* Dry capped walk in O(num_ctas * log(tiles)): the same decisions as walk_tiles(cap = 1)
 * but whole tiles are skipped with a binary search over prefix[] (prefix sums of tile
 * costs).  @return 1 if every tile fits in num_ctas CTAs of at most `cap` each. */
static int cap_fits(const fi_tile *tiles, const int64_t *prefix, int32_t num_tiles,
                    int32_t n, int64_t cap) {
    int32_t i = 0;
    int32_t pos = num_tiles > 0 ? tiles[0].kv_begin : 0;
    for (int32_t c = 0; c < n; c++) {
        int64_t rem = cap;
        for (;;) {
            if (i == num_tiles)
                return 1;
            const fi_tile *t = &tiles[i];
            const int64_t overhead = t->cost - (t->kv_end - t->kv_begin);
            const int64_t rest = (int64_t)(t->kv_end - pos) + overhead;
            if (rest <= rem) {
                rem -= rest;
                i++;
                /* largest j with prefix[j] - prefix[i] <= rem: tiles i .. j-1 fit whole.
                 * Galloping then bisection: O(log(j - i)), usually a step or two. */
                const int64_t lim = prefix[i] + rem;
                int32_t a = i, step = 1;
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
                rem -= prefix[a] - prefix[i];
                i = a;
                if (i < num_tiles)
                    pos = tiles[i].kv_begin;
                continue;
            }
            if (c == n - 1)
                return 0;
            const int64_t lo = round_up_kv_tile((int64_t)pos + FI_MIN_CHUNK_TOKENS);
            const int64_t hi = round_down_kv_tile((int64_t)t->kv_end - FI_MIN_CHUNK_TOKENS);
            const int64_t room = rem - overhead;
            int64_t want = room >= 0 ? round_down_kv_tile(pos + room) : -1;
            if (want > hi)
                want = hi;
            if (lo <= hi && want >= lo)
                pos = (int32_t)want;
            break; /* next CTA */
        }
    }
    return i == num_tiles;
}

fi_status fi_partition(const fi_tile *tiles, int32_t num_tiles, int64_t total_cost,
                       int64_t *prefix, const fi_layout *l, int32_t *work_indptr, fi_work_item *items,
                       fi_merge_group *groups, int64_t *cta_cost, fi_partition_result *res,
                       fi_error_detail *err) {
    const int64_t n = l->num_ctas;
    walk w = {.l = l, .indptr = work_indptr, .items = items, .groups = groups,
              .cta_cost = cta_cost, .err = err, .dry = 1};
    /* The smallest cap that fits, by bisection to 1/128 of the mean, between the mean (a
     * lower bound) and a cap that always fits: the mean with every boundary cut, plus the
     * most a CTA can leave unused (an uncuttable tile < 2 floors + 2 KV tiles, or a piece
     * below the floor, plus one item overhead).  Each trial is a dry O(num_ctas log tiles)
     * walk (cap_fits).  Lowers the max CTA cost where tiles are about one CTA long. */
    enum { FI_CAP_STEPS = 16 };
    int64_t oh_max = 0;
    prefix[0] = 0;
    for (int32_t i = 0; i < num_tiles; i++) {
        prefix[i + 1] = prefix[i] + tiles[i].cost;
        const int64_t oh = tiles[i].cost - (tiles[i].kv_end - tiles[i].kv_begin);
        oh_max = oh > oh_max ? oh : oh_max;
    }
    int64_t lo = (total_cost + n - 1) / n;
    int64_t hi = (total_cost + (n - 1) * oh_max + n - 1) / n + 2 * FI_MIN_CHUNK_TOKENS +
                 2 * FI_KV_TILE_TOKENS + oh_max;
    int64_t best_cap = -1;
    const int64_t tol = lo / 128 + 1;
    if (!fi_partition_test_force_global && cap_fits(tiles, prefix, num_tiles, (int32_t)n, hi)) {
        best_cap = hi;
        hi--;
        for (int step = 0; step < FI_CAP_STEPS && lo <= hi && hi - lo >= tol; step++) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (cap_fits(tiles, prefix, num_tiles, (int32_t)n, mid)) {
                best_cap = mid;
                hi = mid - 1;
            } else {
                lo = mid + 1;
            }
        }
    }
    int feasible = 0;
    fi_status st = FI_OK;
    int64_t g_budget = 0;
    if (best_cap < 0) { /* not expected; the global walk always succeeds */
        int64_t g_max = 0;
        st = global_walks(&w, tiles, num_tiles, total_cost, &g_budget, &g_max);
        if (st != FI_OK)
            return st;
    }
    /* The real walk, writing items, groups and CTA ranges (trial walks were dry). */
    w.dry = 0;
    if (best_cap >= 0) {
        w.budget = best_cap;
        st = walk_tiles(&w, tiles, num_tiles, 1, &feasible);
        if (st != FI_OK)
            return st;
        if (!feasible) { /* cap_fits and walk_tiles disagree: a bug, never a partial plan */
            w.err->status = FI_ERR_PLAN_OVER_CAPS;
            w.err->request = -1;
            w.err->needed = best_cap;
            w.err->limit = -1;
            w.err->cuda_error = 0;
            return FI_ERR_PLAN_OVER_CAPS;
        }
    } else {
        w.budget = g_budget;
        st = walk_tiles(&w, tiles, num_tiles, 0, &feasible);
        if (st != FI_OK)
            return st;
    }
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
