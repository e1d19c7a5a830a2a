/* planner/scratch.c - allocation of the planner's scratch (planner/scratch.h): one block
 * from the plan's allocator, carved into 64-byte aligned arrays.  Host only: the device
 * planner's launcher places the arrays here and its kernel binds them (scratch.h). */
#include "planner/scratch.h"

#include <string.h>

#include "plan/host_alloc.h"

/* The place (scratch.h) of the next `bytes` (64-byte multiples) of the arena: in its fast
 * block while that holds them, else in its slow block. */
static void *take(fi_scratch_arena *a, size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    if (a->fast_cap > 0 && a->fast_off + bytes <= a->fast_cap) {
        const intptr_t at = (intptr_t)a->fast_off;
        a->fast_off += bytes;
        return (void *)at;
    }
    const intptr_t at = ~(intptr_t)a->slow_off;
    a->slow_off += bytes;
    return (void *)at;
}

size_t fi_planner_scratch_place(fi_planner_scratch *s, const fi_layout *l, fi_scratch_arena *a) {
    /* 32 arrays, one take each: a member added to fi_planner_scratch must be a pointer
     * placed here (fi_planner_scratch_bind_one reads every pointer-sized slot as a place). */
    FI_STATIC_ASSERT(sizeof(fi_planner_scratch) == 32 * sizeof(void *),
                     "fi_planner_scratch: array pointers only, each placed below");
    const size_t tiles = (size_t)l->max_tiles, items = (size_t)l->max_items;
    const size_t ctas = (size_t)l->num_ctas, groups = (size_t)l->max_groups;
    const size_t starts = (ctas > groups ? ctas : groups) + 1;
    fi_pack_scratch *p = &s->pack;
    s->tiles = (fi_tile *)take(a, sizeof(fi_tile) * tiles);
    s->cta_cost = (int64_t *)take(a, sizeof(int64_t) * ctas);
    s->tile_prefix = (int64_t *)take(a, sizeof(int64_t) * (tiles + 1));
    fi_ppart_scratch *q = &s->pp;
    q->batch_scan = (int64_t *)take(a, sizeof(int64_t) * ((size_t)l->max_batch + 1));
    q->req_row = (int64_t *)take(a, sizeof(int64_t) * ((size_t)l->max_batch + 1));
    q->req_used = (int64_t *)take(a, sizeof(int64_t) * ((size_t)l->max_batch + 1));
    q->btile = (int32_t *)take(a, sizeof(int32_t) * (ctas + 1));
    q->bkv = (int32_t *)take(a, sizeof(int32_t) * (ctas + 1));
    q->interior = (int32_t *)take(a, sizeof(int32_t) * (ctas + 1));
    q->cut_scan = (int64_t *)take(a, sizeof(int64_t) * (ctas + 2));
    q->item_off = (int64_t *)take(a, sizeof(int64_t) * (tiles + 1));
    const size_t pair_cap = tiles < 2 * ctas ? tiles : 2 * ctas;
    q->pair_cost = (int64_t *)take(a, sizeof(int64_t) * pair_cap);
    q->pair_kv = (int64_t *)take(a, sizeof(int64_t) * pair_cap);
    q->pair_tile = (int32_t *)take(a, sizeof(int32_t) * pair_cap);
    q->pair_probe = (int64_t *)take(a, sizeof(int64_t) * 2 * FI_PAIR_PROBES);
    p->pieces = (fi_pack_piece *)take(a, sizeof(fi_pack_piece) * items);
    p->sorted = (fi_pack_piece *)take(a, sizeof(fi_pack_piece) * items);
    p->by_cost = (int32_t *)take(a, sizeof(int32_t) * tiles);
    p->order = (int32_t *)take(a, sizeof(int32_t) * items);
    p->tile_group = (int32_t *)take(a, sizeof(int32_t) * tiles);
    p->cta_start = (int32_t *)take(a, sizeof(int32_t) * starts);
    p->load = (int64_t *)take(a, sizeof(int64_t) * ctas);
    p->suffix = (int64_t *)take(a, sizeof(int64_t) * (tiles + 1));
    p->bk_head = (int32_t *)take(a, sizeof(int32_t) * 512);
    p->bk_next = (int32_t *)take(a, sizeof(int32_t) * ctas);
    p->bk_where = (int32_t *)take(a, sizeof(int32_t) * ctas);
    p->items = (fi_work_item *)take(a, sizeof(fi_work_item) * items);
    p->groups = (fi_merge_group *)take(a, sizeof(fi_merge_group) * groups);
    p->work_indptr = (int32_t *)take(a, sizeof(int32_t) * (ctas + 1));
    p->cta_cost = (int64_t *)take(a, sizeof(int64_t) * ctas);
    p->finish = (int64_t *)take(a, sizeof(int64_t) * items);
    p->last = (int32_t *)take(a, sizeof(int32_t) * groups);
    return a->slow_off;
}

size_t fi_planner_scratch_bytes(const fi_layout *l) {
    fi_planner_scratch s;
    fi_scratch_arena a = {0, 0, 0};
    return fi_planner_scratch_place(&s, l, &a);
}

void fi_planner_scratch_carve(fi_planner_scratch *s, const fi_layout *l, unsigned char *base) {
    fi_planner_scratch placed;
    fi_scratch_arena a = {0, 0, 0};
    fi_planner_scratch_place(&placed, l, &a);
    for (size_t i = 0; i < FI_SCRATCH_ARRAYS; i++)
        ((void **)s)[i] = fi_planner_scratch_bind_one(&placed, i, NULL, base);
}

fi_planner_scratch *fi_planner_scratch_create(const fi_layout *l, const fi_allocator *a) {
    fi_planner_scratch *s = fi_host_alloc(a, sizeof *s, 64);
    if (!s)
        return NULL;
    memset(s, 0, sizeof *s);
    unsigned char *block = fi_host_alloc(a, fi_planner_scratch_bytes(l), 64);
    if (!block) {
        fi_host_free(a, s);
        return NULL;
    }
    fi_planner_scratch_carve(s, l, block);
    return s;
}

void fi_planner_scratch_destroy(fi_planner_scratch *s, const fi_allocator *a) {
    if (!s)
        return;
    fi_host_free(a, s->tiles); /* the block's start */
    fi_host_free(a, s);
}
