/*
 * planner/partition.c - contiguous cost walk (FlashMLA get_mla_metadata scheduler) with
 * flash-decoding split-KV.
 *
 * 1. Budget: B = max(ceil((total_cost + cuts * piece_overhead) / num_ctas), floor), where
 *    piece_overhead = cost of an empty full tile (each cut adds one item's alpha*rows + beta)
 *    and floor = FI_MIN_CHUNK_TOKENS.  `cuts` is unknown before walking, so the walk runs
 *    once with cuts = 0 and, if it cut, once more with the cuts it made (O(2 * tiles)).
 * 2. Walk the tiles in plan order.  CTA c ends at the global target (c + 1) * B of the
 *    cumulative cost (global targets, so rounding errors do not pile up on the last CTA).
 *    A tile (or its remaining piece) that fits before the target goes to CTA c whole.
 *    Otherwise it is cut where the target falls, the cut rounded to the nearest multiple of
 *    FI_KV_TILE_TOKENS (request-local token index); if either piece would be shorter than
 *    FI_MIN_CHUNK_TOKENS there is no cut and the boundary moves instead: the tile goes to
 *    CTA c whole if that overshoots the target less than stopping short undershoots it, else
 *    CTA c ends before it.  The last CTA takes the rest.  A CTA's range may be empty.
 * 3. Cuts happen only at CTA boundaries, so cuts <= num_ctas - 1, which gives the bounds of
 *    workspace/layout.h (items <= tiles + cuts, groups <= cuts, slots <= 2 * cuts); they are
 *    still checked on every write.
 * A cut tile becomes one fi_merge_group: consecutive items (pieces in KV order, which are
 * the last item of one CTA and the first of the next ones) with consecutive partial slots.
 * Unsplit items have out_slot = merge_group = -1.  Empty tiles (kv_begin == kv_end) still
 * become items, so every output row is written.
 */
#include "planner/partition.h"

#include "planner/cost_model.h"

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
} walk;

static fi_status over_caps(walk *w, int64_t needed, int64_t limit) {
    w->err->status = FI_ERR_PLAN_OVER_CAPS;
    w->err->request = -1;
    w->err->needed = needed;
    w->err->limit = limit;
    w->err->cuda_error = 0;
    return FI_ERR_PLAN_OVER_CAPS;
}

static void close_cta(walk *w) {
    w->indptr[w->c + 1] = w->ni;
    w->c++;
    w->target += w->budget;
}

/* Emit piece [kv0, kv1) of tile t on CTA w->c.  split: the piece belongs to a merge group
 * (*g, created on its first piece). */
static fi_status emit(walk *w, const fi_tile *t, int32_t kv0, int32_t kv1, int split,
                      int32_t *g, int64_t overhead) {
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
    const int64_t cost = (int64_t)(kv1 - kv0) + overhead;
    w->cta_cost[w->c] += cost;
    w->cum += cost;
    w->ni++;
    return FI_OK;
}

/* Nearest multiple of the KV tile (x >= 0). */
static int64_t round_kv_tile(int64_t x) {
    return (x + FI_KV_TILE_TOKENS / 2) / FI_KV_TILE_TOKENS * FI_KV_TILE_TOKENS;
}

static fi_status walk_tiles(walk *w, const fi_tile *tiles, int32_t num_tiles) {
    const int32_t n = w->l->num_ctas;
    w->c = 0;
    w->cum = 0;
    w->target = w->budget;
    w->ni = w->ng = w->ns = w->cuts = 0;
    w->indptr[0] = 0;
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
            if (w->c < n - 1 && w->cum + rest_cost > w->target) {
                const int64_t fit = w->target - w->cum - overhead;
                if (fit > 0) {
                    const int64_t cut = round_kv_tile(pos + fit);
                    if (cut - pos >= FI_MIN_CHUNK_TOKENS &&
                        t->kv_end - cut >= FI_MIN_CHUNK_TOKENS) {
                        fi_status st = emit(w, t, pos, (int32_t)cut, 1, &g, overhead);
                        if (st != FI_OK)
                            return st;
                        w->cuts++;
                        pos = (int32_t)cut;
                        close_cta(w);
                        continue;
                    }
                }
                /* No cut: move the boundary to whichever side misses the target less. */
                const int64_t over = w->cum + rest_cost - w->target;
                const int64_t under = w->target - w->cum;
                if (over >= under) {
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
    for (int32_t c = w->c + 1; c <= n; c++)
        w->indptr[c] = w->ni;
    return FI_OK;
}

fi_status fi_partition(const fi_tile *tiles, int32_t num_tiles, int64_t total_cost,
                       const fi_layout *l, int32_t *work_indptr, fi_work_item *items,
                       fi_merge_group *groups, int64_t *cta_cost, fi_partition_result *res,
                       fi_error_detail *err) {
    const int64_t n = l->num_ctas;
    const int64_t piece_overhead = fi_cost_item(0, l->tile_rows);
    walk w = {l, work_indptr, items, groups, cta_cost, err, 0, 0, 0, 0, 0, 0, 0, 0};
    w.budget = (total_cost + n - 1) / n;
    if (w.budget < FI_MIN_CHUNK_TOKENS)
        w.budget = FI_MIN_CHUNK_TOKENS;
    fi_status st = walk_tiles(&w, tiles, num_tiles);
    if (st == FI_OK && w.cuts > 0) {
        /* Second pass: make room for the overhead of the cuts the first pass made. */
        const int64_t b2 = (total_cost + w.cuts * piece_overhead + n - 1) / n;
        if (b2 > w.budget) {
            w.budget = b2;
            st = walk_tiles(&w, tiles, num_tiles);
        }
    }
    if (st != FI_OK)
        return st;
    int64_t total = 0, max = 0;
    for (int64_t c = 0; c < n; c++) {
        total += cta_cost[c];
        if (cta_cost[c] > max)
            max = cta_cost[c];
    }
    res->num_items = w.ni;
    res->num_groups = w.ng;
    res->num_slots = w.ns;
    res->budget = w.budget;
    res->total_cost = total;
    res->max_cta_cost = max;
    return FI_OK;
}
