/* planner/tiles.c - tiles of a batch: geometry, order, trimmed KV range, cost (tiles.h). */
#include "planner/tiles.h"

#include "plan/mask.h"

FI_PD fi_status fi_tiles_build(const fi_variant *v, const fi_caps *caps,
                         const fi_request_info *requests, int32_t batch_size, int32_t causal,
                         int32_t window_left, fi_tile *tiles, int32_t max_tiles,
                         int32_t *num_tiles, int64_t *total_cost, fi_error_detail *err) {
    /* A local copy: the tile stores below could alias *v, which would reload it per tile. */
    const fi_variant row = *v;
    const int32_t tile_rows = row.tile_rows;
    const int32_t h_kv = caps->num_kv_heads;
    const int32_t group = caps->num_qo_heads / h_kv;
    /* q rows per tile and heads per tile */
    const int32_t q_step = group >= tile_rows ? 1 : tile_rows / group;
    const int32_t h_step = group >= tile_rows ? tile_rows : group;
    int32_t n = 0;
    int64_t total = 0;
    /* Decode (one q block a request, as every GQA / MLA decode batch): the KV range and the
     * cost depend on the request only, so they are computed once for its h_kv x head-block
     * tiles (GQA decode at 1024 requests: 8192 tiles); same tiles, same order. */
    const int32_t n_hb = (group + h_step - 1) / h_step;
    const int32_t tiles_per_q_block = h_kv * n_hb;
    for (int32_t b = 0; b < batch_size; b++) {
        const int32_t q_len = requests[b].q_len, kv_len = requests[b].kv_len;
        if (q_len >= 1 && q_len <= q_step && group % h_step == 0) {
            if (n + tiles_per_q_block > max_tiles) {
                err->status = FI_ERR_PLAN_OVER_CAPS;
                err->request = b;
                err->needed = (int64_t)max_tiles + 1;
                err->limit = max_tiles;
                err->cuda_error = 0;
                return FI_ERR_PLAN_OVER_CAPS;
            }
            int32_t lo, hi;
            fi_tile_kv_range(causal, window_left, q_len, kv_len, 0, q_len, &lo, &hi);
            const int64_t cost = fi_variant_item_cost(&row, hi - lo, (int64_t)q_len * h_step);
            /* One tile copied and its heads set: fewer stores than a compound literal a tile. */
            fi_tile t = {b, 0, (int16_t)h_step, 0, q_len, lo, hi, cost};
            for (int32_t hb = 0; hb < h_kv * group; hb += h_step) {
                tiles[n++] = t;
                t.head_begin = (int16_t)(hb + h_step);
                t.head_end = (int16_t)(hb + 2 * h_step);
            }
            total += cost * tiles_per_q_block;
            continue;
        }
        for (int32_t kvh = 0; kvh < h_kv; kvh++) {
            const int32_t h0 = kvh * group, h1 = h0 + group;
            for (int32_t q0 = 0; q0 < q_len; q0 += q_step) {
                const int32_t q1 = q0 + q_step < q_len ? q0 + q_step : q_len;
                int32_t lo, hi;
                fi_tile_kv_range(causal, window_left, q_len, kv_len, q0, q1, &lo, &hi);
                for (int32_t hb = h0; hb < h1; hb += h_step) {
                    const int32_t he = hb + h_step < h1 ? hb + h_step : h1;
                    if (n >= max_tiles) {
                        err->status = FI_ERR_PLAN_OVER_CAPS;
                        err->request = b;
                        err->needed = (int64_t)n + 1;
                        err->limit = max_tiles;
                        err->cuda_error = 0;
                        return FI_ERR_PLAN_OVER_CAPS;
                    }
                    const int64_t rows = (int64_t)(q1 - q0) * (he - hb);
                    const int64_t cost = fi_variant_item_cost(&row, hi - lo, rows);
                    tiles[n++] = (fi_tile){b, (int16_t)hb, (int16_t)he, q0, q1, lo, hi, cost};
                    total += cost;
                }
            }
        }
    }
    *num_tiles = n;
    *total_cost = total;
    return FI_OK;
}
