/*
 * planner/tiles.h - cut a validated batch into tiles (fi_tile, planner/scratch.h).
 *
 * Geometry (tile_rows of the variant row, plan/variant.h; group = H_q/H_kv):
 *   group >= tile_rows: a tile is 1 query row x tile_rows heads (fewer in the last chunk);
 *   else:               tile_rows / group query rows x all `group` heads of one KV head
 *                       (fewer rows at the end of a request).
 * Order: request-major, then KV head, then query-row tile, then head chunk; but when a
 * KV head's group spans several head chunks (MLA heads 128 on 64-row tiles), head chunk
 * first: all requests' chunk-0 tiles, then all chunk-1 tiles, ...  The walk then gives
 * the chunks of one request to CTAs c and c + num_ctas / chunks, which run them at the
 * same time, so the second reads the request's KV from L2 instead of DRAM (H200, heads 128
 * B128 x 4096: L2 hit rate 3% request-major).  Rows with kv_head_major (GQA decode) put
 * the KV head first in the same way: all requests' KV-head-0 tiles, then KV head 1, ...,
 * so the CTAs c + k num_ctas / H_kv run one request's KV heads together and read each of
 * its NHD token rows (every KV head's slice of it) at about the same time; batches of no
 * more tiles than the row may pack stay request-major (packing sorts them by cost anyway,
 * faster on a request's equal-cost run of KV heads).
 * KV range of a tile = union of its rows' ranges (plan/mask.h fi_tile_kv_range); an
 * empty union gives kv_begin == kv_end == 0 (the tile still becomes an item so its rows
 * are written: zeros, lse -inf).
 * Cost: fi_variant_item_cost of the variant row (plan/variant.h).
 */
#ifndef FIATTN_PLANNER_TILES_H
#define FIATTN_PLANNER_TILES_H

#include "plan/variant.h"
#include "planner/scratch.h"

/* The work item of tile t over its keys [kv_begin, kv_end): out_slot / merge_group -1 for
 * an unsplit tile, else the piece's partial slot and merge group. */
FI_HOST_DEVICE fi_work_item fi_tile_item(const fi_tile *t, int32_t kv_begin, int32_t kv_end,
                                         int32_t out_slot, int32_t merge_group) {
    const fi_work_item it = {t->request, t->head_begin, t->head_end, t->q_begin, t->q_end,
                             kv_begin, kv_end, out_slot, merge_group};
    return it;
}

/* fi_tile_item(t, kv_begin, kv_end, out_slot, merge_group) stored at *dst.  On the device
 * one 16-byte load of the tile's first bytes (laid out as the item's, scratch.h) and two
 * 16-byte stores: tiles and items are 32-byte aligned (64-byte aligned arrays, 256-byte
 * aligned plan regions), and the device planner at 1024 GQA requests was bound by its
 * store transactions when an item went out a word at a time. */
FI_HOST_DEVICE void fi_tile_item_store(fi_work_item *dst, const fi_tile *t, int32_t kv_begin,
                                       int32_t kv_end, int32_t out_slot, int32_t merge_group) {
#ifdef __CUDA_ARCH__
    uint4 *d = (uint4 *)dst;
    d[0] = *(const uint4 *)t;
    d[1] = make_uint4((uint32_t)kv_begin, (uint32_t)kv_end, (uint32_t)out_slot,
                      (uint32_t)merge_group);
#else
    *dst = fi_tile_item(t, kv_begin, kv_end, out_slot, merge_group);
#endif
}

/* The merge group of tile t's pieces: their slots first_slot .., first_item the first. */
FI_HOST_DEVICE fi_merge_group fi_tile_group(const fi_tile *t, int32_t first_slot,
                                            int32_t num_splits, int32_t first_item) {
    const fi_merge_group g = {t->request, t->head_begin, t->head_end, t->q_begin, t->q_end,
                              first_slot, num_splits, first_item, 0};
    return g;
}

/* Write the batch's tiles to tiles[0 .. *num_tiles) (capacity max_tiles) and the sum of
 * their costs to *total_cost.  v: the caps' tile table row.  requests: [batch_size] from
 * fi_batch_validate.
 * @return FI_OK; FI_ERR_PLAN_OVER_CAPS (more than max_tiles: a layout bound bug;
 *   err->needed / limit set).  O(tiles). */
FI_PD fi_status fi_tiles_build(const fi_variant *v, const fi_caps *caps,
                         const fi_request_info *requests, int32_t batch_size, int32_t causal,
                         int32_t window_left, fi_tile *tiles, int32_t max_tiles,
                         int32_t *num_tiles, int64_t *total_cost, fi_error_detail *err);

/* fi_tiles_build for the data-parallel planner (planner/parallel.h): the same tiles in the
 * same order as *ts (scratch.h fi_tile_set), without their total cost (the partition sums
 * them again).  KV-head-major batches of a row whose items cost at least cost_beta > 0
 * (so the cost prefix sums rise strictly, which the partition's block-wise boundary
 * search needs) store the first KV head's block only; every other batch is one block of
 * all its tiles.  offset: scratch [batch_size]; tiles: [max_tiles], *ts points into it.
 * Reads requests[] only after a barrier; on FI_OK the threads' last step is a barrier
 * after every write of tiles[]. */
FI_PD fi_status fi_tiles_build_parallel(const fi_variant *v, const fi_caps *caps,
                                        const fi_request_info *requests, int32_t batch_size,
                                        int32_t causal, int32_t window_left, int64_t *offset,
                                        fi_tile *tiles, int32_t max_tiles, fi_tile_set *ts,
                                        fi_error_detail *err);

#endif
