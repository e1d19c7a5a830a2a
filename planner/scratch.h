/*
 * planner/scratch.h - the planner's host scratch: tiles before partitioning and the
 * packing partition's working arrays.  Allocated once at fi_plan_create from the layout's
 * bounds, owned by the plan (fi_plan.scratch), never seen by an executor.  Not installed.
 */
#ifndef FIATTN_PLANNER_SCRATCH_H
#define FIATTN_PLANNER_SCRATCH_H

#include <stddef.h>
#include <stdint.h>

#include "fiattn.h"
#include "fiattn_work.h"
#include "plan/hd.h"
#include "workspace/layout.h"

/* A tile before partitioning: the rectangle of one request and KV head, its effective KV
 * range (after causal / window_left trimming) and its cost (KV-token units). */
typedef struct fi_tile {
    int32_t request;
    int16_t head_begin, head_end;
    int32_t q_begin, q_end;
    int32_t kv_begin, kv_end;
    int64_t cost;
} fi_tile;
/* A tile's first bytes (request, heads, query rows, then its KV range) lie as a work
 * item's do, so the walk copies them into an item as one block: the first 16 (then the
 * item's own KV range), or all 24 for an item that is the whole tile. */
#define FI_TILE_ITEM_HEAD_BYTES 16
#define FI_TILE_ITEM_BYTES 24
FI_STATIC_ASSERT(offsetof(fi_tile, request) == offsetof(fi_work_item, request) &&
                     offsetof(fi_tile, head_begin) == offsetof(fi_work_item, head_begin) &&
                     offsetof(fi_tile, head_end) == offsetof(fi_work_item, head_end) &&
                     offsetof(fi_tile, q_begin) == offsetof(fi_work_item, q_begin) &&
                     offsetof(fi_tile, q_end) == offsetof(fi_work_item, q_end) &&
                     offsetof(fi_tile, kv_begin) == FI_TILE_ITEM_HEAD_BYTES &&
                     offsetof(fi_work_item, kv_begin) == FI_TILE_ITEM_HEAD_BYTES &&
                     offsetof(fi_tile, kv_end) == offsetof(fi_work_item, kv_end) &&
                     offsetof(fi_work_item, out_slot) == FI_TILE_ITEM_BYTES,
                 "fi_tile and fi_work_item share their first 24 bytes");

/* The tiles of the data-parallel build (fi_tiles_build_parallel, planner/tiles.h): T tiles
 * as `blocks` blocks of `period`, of which only the first block is stored; tile k * period
 * + j is tile j with its heads moved up by k * block_heads.  A KV-head-major decode batch
 * (tiles.h's order) repeats its first KV head's tiles for every KV head with the same
 * requests, query rows, KV ranges and costs, so one block of B tiles stands for H_kv B
 * (GQA 32/8 at 1,024 requests: 1,024 of 8,192), and the cost prefix sums and the boundary
 * searches over them shrink with it.  Every other batch: one block of T. */
typedef struct fi_tile_set {
    const fi_tile *first; /* [period] */
    int32_t T;            /* period * blocks */
    int32_t period, blocks;
    int32_t block_heads;
} fi_tile_set;

/* Tile j of block k, by value. */
FI_HOST_DEVICE fi_tile fi_tile_set_block(const fi_tile_set *ts, int32_t k, int32_t j) {
    fi_tile t = ts->first[j];
    t.head_begin = (int16_t)(t.head_begin + k * ts->block_heads);
    t.head_end = (int16_t)(t.head_end + k * ts->block_heads);
    return t;
}
/* Tile t (0 <= t < T), by value. */
FI_HOST_DEVICE fi_tile fi_tile_set_at(const fi_tile_set *ts, int32_t t) {
    const int32_t k = ts->blocks == 1 ? 0 : t / ts->period;
    return fi_tile_set_block(ts, k, t - k * ts->period);
}
/* Block *k and index *j (t = *k * period + *j) of tile t >= t0, from tile t0's (k0, j0):
 * a step a block crossed instead of a division (a division is ~20 instructions on the
 * GPU; the tiles a CTA or a warp visits span few blocks). */
FI_HOST_DEVICE void fi_tile_set_advance(const fi_tile_set *ts, int32_t k0, int32_t j0,
                                        int32_t dt, int32_t *k, int32_t *j) {
    int32_t kk = k0, jj = j0 + dt;
    while (jj >= ts->period) {
        jj -= ts->period;
        kk++;
    }
    *k = kk;
    *j = jj;
}

/* One piece while packing: tile, KV range, CTA (bin), split flag (a piece of a cut tile,
 * charged the variant's piece charge while packing, plan/variant.h), cost (KV-token units,
 * without the charge). */
typedef struct fi_pack_piece {
    int32_t tile, kv0, kv1, bin;
    int32_t split, pad;
    int64_t cost;
} fi_pack_piece;

/* Scratch of the packing partition (planner/pack.h); sizes from the layout: max_items >=
 * max_tiles, max_slots, max_groups + 1. */
typedef struct fi_pack_scratch {
    fi_pack_piece *pieces; /* [max_items] */
    fi_pack_piece *sorted; /* [max_items] */
    int32_t *by_cost;      /* [max_tiles]: tiles by decreasing cost */
    int32_t *order;        /* [max_items]: sort scratch, remainder queue, slot lists */
    int32_t *tile_group;   /* [max_tiles] */
    int32_t *cta_start;    /* [max(num_ctas, max_groups) + 1] */
    int64_t *load;         /* [num_ctas] */
    int64_t *suffix;       /* [max_tiles + 1]: cost of by_cost[i ..] */
    int32_t *bk_head;      /* [512]: CTAs by load bucket (planner/pack.c) */
    int32_t *bk_next, *bk_where; /* [num_ctas] each */
    /* The packing's plan before it is chosen (planner/model.h scores it first). */
    fi_work_item *items;   /* [max_items] */
    fi_merge_group *groups; /* [max_groups] */
    int32_t *work_indptr;  /* [num_ctas + 1] */
    int64_t *cta_cost;     /* [num_ctas] */
    int64_t *finish;       /* [max_items]: fi_model_max scratch */
    int32_t *last;         /* [max_groups] */
} fi_pack_scratch;

/* Caps that pair packing (planner/ppair.c) tries a round, a warp each on the device. */
#define FI_PAIR_PROBES 8

/* Scratch of the data-parallel planner (planner/parallel.h: validation, tiles and
 * planner/ppart.c's partition). */
typedef struct fi_ppart_scratch {
    int64_t *batch_scan;   /* [max_batch + 1]: q tokens, then tile offsets, per request */
    int64_t *req_row;      /* [max_batch + 1]: device page scan: a request's row, */
    int64_t *req_used;     /* [max_batch + 1]:   and its used pages */
    int32_t *btile;        /* [num_ctas + 1]: boundary c's tile (num_tiles: the end) */
    int32_t *bkv;          /* [num_ctas + 1]: its KV position in that tile */
    int32_t *interior;     /* [num_ctas + 1]: 1 if it cuts the tile */
    int64_t *cut_scan;     /* [num_ctas + 2]: cuts before boundary c */
    int64_t *item_off;     /* [max_tiles + 1]: pair packing's per-tile pieces (ppair.c) */
    /* Pair packing (planner/ppair.c), batches of at most 2 num_ctas tiles: [pair_cap] each,
     * pair_cap = min(max_tiles, 2 num_ctas), the tiles by increasing (cost, index). */
    int64_t *pair_cost;    /* their costs */
    int64_t *pair_kv;      /* their KV lengths */
    int32_t *pair_tile;    /* their indices */
    int64_t *pair_probe;   /* [2 FI_PAIR_PROBES]: the caps tried, fits or not, by round parity */
} fi_ppart_scratch;

typedef struct fi_planner_scratch {
    fi_tile *tiles;        /* [max_tiles] */
    int64_t *cta_cost;     /* [num_ctas] */
    int64_t *tile_prefix;  /* [max_tiles + 1]: prefix sums of tile costs */
    fi_ppart_scratch pp;   /* the data-parallel planner's */
    fi_pack_scratch pack;  /* the packing partition's (planner/pack.h) */
} fi_planner_scratch;

#ifdef __cplusplus
extern "C" {
#endif

/* The number of arrays in fi_planner_scratch, which holds array pointers and nothing else
 * (fi_planner_scratch_bind_one reads it as FI_SCRATCH_ARRAYS pointers). */
#define FI_SCRATCH_ARRAYS (sizeof(fi_planner_scratch) / sizeof(void *))

/* Where scratch arrays are carved: a fast block of fast_cap bytes (the device planner's
 * shared memory; none on the host) filled from fast_off first while arrays fit, then a slow
 * block (host memory, or the workspace's planner_scratch region). */
typedef struct fi_scratch_arena {
    size_t fast_cap, fast_off;
    size_t slow_off;
} fi_scratch_arena;

/* Give each array of s its place in arena a, hottest first: s's pointers then hold places,
 * not addresses (a place p >= 0: byte p of the fast block; p < 0: byte ~p of the slow
 * one), until fi_planner_scratch_bind_one.  Integer work only, so the device planner's
 * launcher places the arrays on the host and the kernel only binds them (one pointer a
 * thread: the sequential carve cost its first thread ~1.65k cycles).  Returns the bytes
 * taken from the slow block. */
size_t fi_planner_scratch_place(fi_planner_scratch *s, const fi_layout *l,
                                fi_scratch_arena *a);

/* Place i of a placed scratch (0 <= i < FI_SCRATCH_ARRAYS) as an address: in the fast
 * block at `fast` or the slow one at `slow`. */
FI_HOST_DEVICE void *fi_planner_scratch_bind_one(const fi_planner_scratch *placed, size_t i,
                                                 unsigned char *fast, unsigned char *slow) {
    const intptr_t at = (intptr_t)((void *const *)placed)[i];
    return at >= 0 ? (void *)(fast + at) : (void *)(slow + ~at);
}

/* Bytes of the scratch arrays for layout l (64-byte aligned pieces, one block). */
size_t fi_planner_scratch_bytes(const fi_layout *l);

/* Point s's arrays into the block at base (fi_planner_scratch_bytes(l) bytes, 64-byte
 * aligned; host memory, or the workspace's planner_scratch region for the device planner). */
void fi_planner_scratch_carve(fi_planner_scratch *s, const fi_layout *l, unsigned char *base);

/* Allocate the scratch for layout l through allocator a (plan/host_alloc.h).
 * @return the scratch, or NULL when an allocation fails (nothing left allocated). */
fi_planner_scratch *fi_planner_scratch_create(const fi_layout *l, const fi_allocator *a);

/* Free s (NULL is fine) through the allocator it was created with. */
void fi_planner_scratch_destroy(fi_planner_scratch *s, const fi_allocator *a);

#ifdef __cplusplus
}
#endif
#endif /* FIATTN_PLANNER_SCRATCH_H */
