/*
 * planner/listsched.c - the list schedule (planner/listsched.h): head-major queue, longest
 * tile first inside a head, each tile to the CTA free earliest.  Host C and device code
 * (plan/hd.h): the device planner's one thread runs it like the walk.
 */
#include "planner/listsched.h"

#include "planner/tiles.h"

/* Sort a[0 .. k) (tile indices) by decreasing tile cost, ties in their current order
 * (stable); tmp: scratch [k].  A causal prefill's run of one head is increasing (reversed in
 * place), a non-causal one constant but for a shorter last tile (already in order); other
 * runs (windows) by a bottom-up merge sort. */
FI_PD_STATIC void ls_sort_run(const fi_tile *tiles, int32_t *a, int32_t *tmp, int32_t k) {
    int inc = 1, noninc = 1;
    for (int32_t i = 1; i < k; i++) {
        const int64_t p = tiles[a[i - 1]].cost, q = tiles[a[i]].cost;
        inc &= q > p;
        noninc &= q <= p;
    }
    if (noninc)
        return;
    if (inc) { /* strictly increasing: no ties, so reversing is the stable order */
        for (int32_t i = 0, j = k - 1; i < j; i++, j--) {
            const int32_t x = a[i];
            a[i] = a[j];
            a[j] = x;
        }
        return;
    }
    int32_t *src = a, *dst = tmp;
    for (int32_t w = 1; w < k; w *= 2) {
        for (int32_t lo = 0; lo < k; lo += 2 * w) {
            const int32_t mid = lo + w < k ? lo + w : k, hi = lo + 2 * w < k ? lo + 2 * w : k;
            int32_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) /* the left one on ties: stable */
                dst[o++] = tiles[src[i]].cost >= tiles[src[j]].cost ? src[i++] : src[j++];
            while (i < mid)
                dst[o++] = src[i++];
            while (j < hi)
                dst[o++] = src[j++];
        }
        int32_t *x = src;
        src = dst;
        dst = x;
    }
    if (src != a)
        fi_copy_bytes(a, src, sizeof(int32_t) * (size_t)k);
}

/* Is CTA a before CTA b in the heap: less cost, ties the lower index. */
FI_PD_STATIC inline int ls_less(const int64_t *load, int32_t a, int32_t b) {
    const int64_t la = load[a], lb = load[b];
    return la < lb || (la == lb && a < b);
}

FI_PD int64_t fi_list_schedule(const fi_tile *tiles, int32_t num_tiles, int32_t n,
                               fi_pack_scratch *s) {
    int32_t *queue = s->by_cost, *cta_of = s->tile_group, *heap = s->bk_where;
    int64_t *load = s->load;
    /* The queue: tile order, each run of one (request, head range) longest first. */
    for (int32_t t = 0; t < num_tiles; t++)
        queue[t] = t;
    for (int32_t r0 = 0, r1; r0 < num_tiles; r0 = r1) {
        const fi_tile *x = &tiles[r0];
        for (r1 = r0 + 1; r1 < num_tiles && tiles[r1].request == x->request &&
                          tiles[r1].head_begin == x->head_begin;
             r1++) {
        }
        ls_sort_run(tiles, queue + r0, s->order, r1 - r0);
    }
    /* The tail, longest first across heads: the smallest suffix of the queue holding n times
     * the largest tile's cost.  Head-major to the end, the last head's long tiles start when
     * the other CTAs have about one mean tile's work left (8k prefill, 32 heads: balance
     * 1.054); sorted, the tail ends on the batch's shortest tiles.  Those CTAs work on the
     * suffix's heads at once anyway (a CTA's tile lasts at most the largest cost). */
    int64_t big = 0, tail = 0;
    for (int32_t t = 0; t < num_tiles; t++)
        big = tiles[t].cost > big ? tiles[t].cost : big;
    int32_t p0 = num_tiles;
    while (p0 > 0 && tail < (int64_t)n * big)
        tail += tiles[queue[--p0]].cost;
    ls_sort_run(tiles, queue + p0, s->order, num_tiles - p0);
    /* Every CTA free at cost 0: the identity is a heap (equal keys, indices increasing). */
    for (int32_t c = 0; c < n; c++) {
        load[c] = 0;
        heap[c] = c;
    }
    for (int32_t p = 0; p < num_tiles; p++) {
        const int32_t c = heap[0];
        cta_of[p] = c;
        load[c] += tiles[queue[p]].cost;
        for (int32_t i = 0;;) { /* sift the root down */
            const int32_t l = 2 * i + 1, r = l + 1;
            int32_t m = i;
            if (l < n && ls_less(load, heap[l], heap[m]))
                m = l;
            if (r < n && ls_less(load, heap[r], heap[m]))
                m = r;
            if (m == i)
                break;
            const int32_t x = heap[i];
            heap[i] = heap[m];
            heap[m] = x;
            i = m;
        }
    }
    int64_t max = 0;
    for (int32_t c = 0; c < n; c++)
        max = load[c] > max ? load[c] : max;
    return max;
}

FI_PD void fi_list_write(const fi_tile *tiles, int32_t num_tiles, int32_t n,
                         fi_pack_scratch *s, int32_t *work_indptr, fi_work_item *items,
                         int64_t *cta_cost, fi_partition_result *res) {
    const int32_t *queue = s->by_cost, *cta_of = s->tile_group;
    int32_t *fill = s->cta_start; /* [n + 1]: the next item of each CTA */
    for (int32_t c = 0; c <= n; c++)
        fill[c] = 0;
    for (int32_t p = 0; p < num_tiles; p++)
        fill[cta_of[p] + 1]++;
    work_indptr[0] = 0;
    for (int32_t c = 0; c < n; c++) {
        fill[c + 1] += fill[c];
        work_indptr[c + 1] = fill[c + 1];
    }
    for (int32_t p = 0; p < num_tiles; p++) {
        const fi_tile *t = &tiles[queue[p]];
        items[fill[cta_of[p]]++] = fi_tile_item(t, t->kv_begin, t->kv_end, -1, -1);
    }
    int64_t total = 0, max = 0;
    for (int32_t c = 0; c < n; c++) {
        cta_cost[c] = s->load[c];
        total += s->load[c];
        max = s->load[c] > max ? s->load[c] : max;
    }
    *res = (fi_partition_result){num_tiles, 0, 0, max, total, max};
}
