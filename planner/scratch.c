/* planner/scratch.c - allocation of the planner's scratch (planner/scratch.h): one block
 * from the plan's allocator, carved into 64-byte aligned arrays. */
#include "planner/scratch.h"

#include <string.h>

#include "plan/host_alloc.h"

/* The next `bytes` of the block at base + *off (NULL while only sizing: base NULL). */
static void *take(unsigned char *base, size_t *off, size_t bytes) {
    void *p = base ? base + *off : NULL;
    *off += (bytes + 63) / 64 * 64;
    return p;
}

/* Point the arrays of s into base (or, base NULL, only size them); returns the bytes. */
static size_t carve(fi_planner_scratch *s, const fi_layout *l, unsigned char *base) {
    const size_t tiles = (size_t)l->max_tiles, items = (size_t)l->max_items;
    const size_t ctas = (size_t)l->num_ctas, groups = (size_t)l->max_groups;
    const size_t starts = (ctas > groups ? ctas : groups) + 1;
    fi_pack_scratch *p = &s->pack;
    size_t off = 0;
    s->tiles = take(base, &off, sizeof(fi_tile) * tiles);
    s->cta_cost = take(base, &off, sizeof(int64_t) * ctas);
    s->tile_prefix = take(base, &off, sizeof(int64_t) * (tiles + 1));
    p->pieces = take(base, &off, sizeof(fi_pack_piece) * items);
    p->sorted = take(base, &off, sizeof(fi_pack_piece) * items);
    p->by_cost = take(base, &off, sizeof(int32_t) * tiles);
    p->order = take(base, &off, sizeof(int32_t) * items);
    p->tile_group = take(base, &off, sizeof(int32_t) * tiles);
    p->cta_start = take(base, &off, sizeof(int32_t) * starts);
    p->load = take(base, &off, sizeof(int64_t) * ctas);
    p->suffix = take(base, &off, sizeof(int64_t) * (tiles + 1));
    p->bk_head = take(base, &off, sizeof(int32_t) * 512);
    p->bk_next = take(base, &off, sizeof(int32_t) * ctas);
    p->bk_prev = take(base, &off, sizeof(int32_t) * ctas);
    p->bk_where = take(base, &off, sizeof(int32_t) * ctas);
    p->items = take(base, &off, sizeof(fi_work_item) * items);
    p->groups = take(base, &off, sizeof(fi_merge_group) * groups);
    p->work_indptr = take(base, &off, sizeof(int32_t) * (ctas + 1));
    p->cta_cost = take(base, &off, sizeof(int64_t) * ctas);
    p->finish = take(base, &off, sizeof(int64_t) * items);
    p->last = take(base, &off, sizeof(int32_t) * groups);
    return off;
}

size_t fi_planner_scratch_bytes(const fi_layout *l) {
    fi_planner_scratch s;
    return carve(&s, l, NULL);
}

void fi_planner_scratch_carve(fi_planner_scratch *s, const fi_layout *l, unsigned char *base) {
    carve(s, l, base);
}

fi_planner_scratch *fi_planner_scratch_create(const fi_layout *l, const fi_allocator *a) {
    fi_planner_scratch *s = fi_host_alloc(a, sizeof *s, 64);
    if (!s)
        return NULL;
    memset(s, 0, sizeof *s);
    unsigned char *block = fi_host_alloc(a, carve(s, l, NULL), 64);
    if (!block) {
        fi_host_free(a, s);
        return NULL;
    }
    carve(s, l, block);
    return s;
}

void fi_planner_scratch_destroy(fi_planner_scratch *s, const fi_allocator *a) {
    if (!s)
        return;
    fi_host_free(a, s->tiles); /* the block's start */
    fi_host_free(a, s);
}
