/* workspace/layout.c - region offsets and bounds of the device workspace (see layout.h). */
#include "layout.h"

#include "plan/variant.h"
#include "planner/scratch.h"

static int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Checked size arithmetic: a region of n elements of `size` bytes after *off, then the
 * next 256-byte boundary.  Returns 0 (and leaves *off) when anything would wrap size_t. */
static int region(size_t *off, size_t size, uint64_t n) {
    if (n != 0 && size > SIZE_MAX / n)
        return 0;
    const size_t bytes = size * (size_t)n;
    if (bytes > SIZE_MAX - (FI_WORKSPACE_ALIGN - 1) ||
        *off > SIZE_MAX - (FI_WORKSPACE_ALIGN - 1) - bytes)
        return 0;
    const size_t end = *off + bytes;
    *off = (end + FI_WORKSPACE_ALIGN - 1) / FI_WORKSPACE_ALIGN * FI_WORKSPACE_ALIGN;
    return 1;
}

int32_t fi_tile_rows(const fi_caps *caps) {
    const fi_variant *v = fi_variant_of(caps);
    return v ? v->tile_rows : 0;
}

int64_t fi_layout_item_bound(const fi_caps *caps) {
    const int64_t tile_rows = fi_tile_rows(caps);
    if (tile_rows <= 0 || caps->num_kv_heads <= 0 || caps->num_qo_heads <= 0 ||
        caps->max_q_tokens <= 0 || caps->max_batch <= 0 || caps->num_ctas < 0)
        return INT64_MAX;
    const int64_t group = caps->num_qo_heads / caps->num_kv_heads;
    if (group <= 0)
        return INT64_MAX;
    /* int32 inputs: H_kv * max_q_tokens < 2^62 and its product with the per-token tile
     * count is checked; per_head < 2^32, so H_kv * per_head < 2^63. */
    int64_t tiles;
    if (group >= tile_rows) {
        const int64_t per_token = ceil_div64(group, tile_rows);   /* <= 2^31 */
        const int64_t a = (int64_t)caps->num_kv_heads * caps->max_q_tokens; /* < 2^62 */
        if (a > INT64_MAX / per_token)
            return INT64_MAX;
        tiles = a * per_token;
    } else {
        /* a tile holds tile_rows / group whole query rows (integer division: group 3 of 64
         * gives 21 rows), so count q-row tiles per KV head with that step */
        const int64_t per_head =
            ceil_div64((int64_t)caps->max_q_tokens, tile_rows / group) +
            fi_layout_max_requests(caps);
        tiles = (int64_t)caps->num_kv_heads * per_head;   /* < 2^31 * 2^32 */
    }
    const int64_t cuts = caps->num_ctas > 0 ? (int64_t)caps->num_ctas - 1 : 0;
    return tiles > INT64_MAX - cuts ? INT64_MAX : tiles + cuts;
}

fi_status fi_layout_compute(const fi_caps *caps, fi_layout *layout) {
    fi_layout l = {0};
    l.num_ctas = caps->num_ctas;
    l.tile_rows = fi_tile_rows(caps);
    if (l.tile_rows <= 0)
        return FI_ERR_UNSUPPORTED_VARIANT;
    if (caps->num_ctas <= 0 || caps->max_batch <= 0)
        return FI_ERR_INVALID_CAPS;
    if (caps->num_ctas > FI_LIMIT_NUM_CTAS)
        return FI_ERR_NUM_CTAS_OVER_LIMIT;
    l.head_dim_vo = caps->head_dim_vo;
    l.max_batch = fi_layout_max_requests(caps); /* the request table's entries */

    const int64_t items = fi_layout_item_bound(caps);
    if (items > FI_LIMIT_PLAN_ITEMS)
        return FI_ERR_PLAN_OVER_LIMIT;
    const int64_t cuts = (int64_t)caps->num_ctas - 1;
    l.max_tiles = (int32_t)(items - cuts);
    l.max_items = (int32_t)items;
    l.max_groups = (int32_t)(cuts > 0 ? cuts : 1);
    l.max_slots = (int32_t)(2 * cuts > 0 ? 2 * cuts : 1);

    /* Every size below is checked: a wrap of size_t is FI_ERR_PLAN_OVER_LIMIT, never a
     * small total (fi_workspace_size can not overflow). */
    const uint64_t slot_rows = (uint64_t)l.max_slots * (uint64_t)l.tile_rows;
    size_t off = 0;
    int ok = 1;
    l.off_header = off;
    ok = ok && region(&off, sizeof(fi_plan_header), 1);
    l.off_work_indptr = off;
    ok = ok && region(&off, sizeof(int32_t), (uint64_t)l.num_ctas + 1);
    l.off_cta_starts = off;
    ok = ok && region(&off, sizeof(fi_cta_start), (uint64_t)l.num_ctas);
    l.off_requests = off;
    ok = ok && region(&off, sizeof(fi_request_info), (uint64_t)l.max_batch);
    l.off_groups = off;
    ok = ok && region(&off, sizeof(fi_merge_group), (uint64_t)l.max_groups);
    l.off_items = off;
    ok = ok && region(&off, sizeof(fi_work_item), (uint64_t)l.max_items);
    l.plan_bytes = off;
    l.off_partial_o = off;
    ok = ok && region(&off, sizeof(float) * (size_t)l.head_dim_vo, slot_rows);
    l.off_partial_lse = off;
    ok = ok && region(&off, sizeof(float), slot_rows);
    l.off_semaphores = off;
    ok = ok && region(&off, sizeof(uint32_t), (uint64_t)l.max_groups);
    l.off_device_status = off;
    ok = ok && region(&off, sizeof(fi_device_status), 1);
    l.off_page_verdict = off;
    ok = ok && region(&off, sizeof(int64_t), (uint64_t)l.max_batch);
    l.off_planner_scratch = off;
    ok = ok && region(&off, fi_planner_scratch_bytes(&l), 1);
    l.total_bytes = off;
    if (!ok)
        return FI_ERR_PLAN_OVER_LIMIT;
    *layout = l;
    return FI_OK;
}
