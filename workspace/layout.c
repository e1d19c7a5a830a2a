/* workspace/layout.c - region offsets and bounds of the device workspace (see layout.h). */
#include "layout.h"

#include "plan/variant.h"

static size_t align_up(size_t x) {
    return (x + FI_WORKSPACE_ALIGN - 1) / FI_WORKSPACE_ALIGN * FI_WORKSPACE_ALIGN;
}

static int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

int32_t fi_tile_rows(const fi_caps *caps) {
    const fi_variant *v = fi_variant_of(caps);
    return v ? v->tile_rows : 0;
}

fi_status fi_layout_compute(const fi_caps *caps, fi_layout *layout) {
    fi_layout l = {0};
    const int64_t group = caps->num_qo_heads / caps->num_kv_heads;
    l.num_ctas = caps->num_ctas;
    l.tile_rows = fi_tile_rows(caps);
    if (l.tile_rows <= 0)
        return FI_ERR_UNSUPPORTED_VARIANT;
    l.head_dim_vo = caps->head_dim_vo;
    l.max_batch = caps->max_batch;

    int64_t tiles;
    if (group >= l.tile_rows)
        tiles = (int64_t)caps->num_kv_heads * caps->max_q_tokens * ceil_div64(group, l.tile_rows);
    else
        /* a tile holds tile_rows / group whole query rows (integer division: group 3 of 64
         * gives 21 rows), so count q-row tiles per KV head with that step */
        tiles = (int64_t)caps->num_kv_heads *
                (ceil_div64((int64_t)caps->max_q_tokens, l.tile_rows / group) + caps->max_batch);
    const int64_t cuts = (int64_t)caps->num_ctas - 1;
    const int64_t items = tiles + cuts;
    if (items > INT32_MAX / 2 || cuts < 0)
        return FI_ERR_INVALID_CAPS;
    l.max_tiles = (int32_t)tiles;
    l.max_items = (int32_t)items;
    l.max_groups = (int32_t)(cuts > 0 ? cuts : 1);
    l.max_slots = (int32_t)(2 * cuts > 0 ? 2 * cuts : 1);

    size_t off = 0;
    l.off_header = off;
    off = align_up(off + sizeof(fi_plan_header));
    l.off_work_indptr = off;
    off = align_up(off + sizeof(int32_t) * ((size_t)l.num_ctas + 1));
    l.off_cta_starts = off;
    off = align_up(off + sizeof(fi_cta_start) * (size_t)l.num_ctas);
    l.off_requests = off;
    off = align_up(off + sizeof(fi_request_info) * (size_t)l.max_batch);
    l.off_groups = off;
    off = align_up(off + sizeof(fi_merge_group) * (size_t)l.max_groups);
    l.off_items = off;
    off = align_up(off + sizeof(fi_work_item) * (size_t)l.max_items);
    l.plan_bytes = off;
    l.off_partial_o = off;
    off = align_up(off + sizeof(float) * (size_t)l.max_slots * (size_t)l.tile_rows *
                             (size_t)l.head_dim_vo);
    l.off_partial_lse = off;
    off = align_up(off + sizeof(float) * (size_t)l.max_slots * (size_t)l.tile_rows);
    l.off_semaphores = off;
    off = align_up(off + sizeof(uint32_t) * (size_t)l.max_groups);
    l.total_bytes = off;
    *layout = l;
    return FI_OK;
}

size_t fi_layout_used_bytes(const fi_layout *layout, int32_t num_items) {
    return layout->off_items + sizeof(fi_work_item) * (size_t)num_items;
}
