/*
 * planner/listsched.h - the list schedule: what a dynamic tile scheduler would do, computed
 * on the host (and by the device planner's one thread), for rows whose partition is
 * FI_PARTITION_LIST (plan/variant.h: the context kind).
 *
 * FlashAttention-3's persistent kernel takes its tiles from a global queue: a CTA that
 * finishes a tile takes the next one.  With the tiles queued head-major, the CTAs running at
 * any moment work on tiles that are adjacent in the queue, i.e. on the same few KV heads, so
 * each K / V block is read from DRAM once and from L2 by the other CTAs of its head.  The
 * contiguous walk (planner/partition.h) gives each CTA a run of one head's tiles instead, so
 * an 8k causal prefill of 32 heads on 132 CTAs streams all 32 heads' KV at once (L2 hit rate
 * 26%, docs/perf-log.md).
 *
 * Order: the tile order (request, KV head, query tile: planner/tiles.h), and inside each run
 * of one (request, head range) the tiles by decreasing cost, ties in tile order (a causal
 * prefill's last query tile sees the most keys: longest first, so the short ones fill the
 * gaps at the end of the head).
 * Schedule (Graham's list scheduling): walk that order and give each tile to the CTA that
 * is free earliest in the cost model (a min-heap on the CTA's accumulated cost, ties to the
 * lowest CTA index).  A CTA's items are its tiles in the order received; nothing is cut, so
 * the plan has no merge groups.  Largest CTA cost <= total / n + (1 - 1 / n) * the largest
 * tile (Graham 1966): near the mean for big batches, poor when one tile is a large part of a
 * CTA's share (one long request with few tiles): the walk, which cuts, wins the model there
 * (planner/partition.c chooses).  O(tiles log tiles_per_head + tiles log num_ctas).
 */
#ifndef FIATTN_PLANNER_LISTSCHED_H
#define FIATTN_PLANNER_LISTSCHED_H

#include "planner/partition.h"

/* The list schedule of tiles[0 .. num_tiles) over n CTAs, in scratch s (owned by the plan;
 * the packing partition's arrays: by_cost, order, tile_group, load, bk_where): after it,
 * s->by_cost[0 .. num_tiles) is the queue (tile indices), s->tile_group[p] the CTA of queue
 * position p and s->load[c] CTA c's cost.  Returns the largest CTA cost (its executor model:
 * no pieces, planner/model.h). */
FI_PD int64_t fi_list_schedule(const fi_tile *tiles, int32_t num_tiles, int32_t n,
                               fi_pack_scratch *s);

/* Write the schedule fi_list_schedule left in s as the plan: work_indptr [n + 1], items (a
 * CTA's in the order received; num_tiles <= the layout's max_items), cta_cost [n], *res. */
FI_PD void fi_list_write(const fi_tile *tiles, int32_t num_tiles, int32_t n,
                         fi_pack_scratch *s, int32_t *work_indptr, fi_work_item *items,
                         int64_t *cta_cost, fi_partition_result *res);

#endif
