/* plan/page_table.c - the page-table geometry of a batch (plan/page_table.h). */
#include "plan/page_table.h"

fi_page_table_geom fi_page_table_geom_of(const fi_caps *caps, const fi_batch *batch,
                                         const fi_request_info *requests) {
    if (caps->sparse_top_k > 0)
        return fi_page_table_geom_sparse(batch);
    const int32_t page_size = caps->page_size;
    fi_page_table_geom g = fi_page_table_geom_begin(batch);
    for (int32_t b = 0; b < batch->batch_size; b++)
        fi_page_table_geom_add(&g, requests[b].page_row_offset,
                               ((int64_t)requests[b].kv_len + page_size - 1) / page_size);
    return g;
}
