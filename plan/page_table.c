/* plan/page_table.c - the page-table geometry of a batch (plan/page_table.h). */
#include "plan/page_table.h"

fi_page_table_geom fi_page_table_geom_begin(const fi_batch *batch) {
    fi_page_table_geom g = {0};
    g.form = batch->form;
    if (batch->form == FI_FORM_INDPTR)
        return g;
    g.kv_split_pages = batch->kv_split_pages;
    g.rows = batch->batch_size;
    g.pages_per_row = batch->max_pages_per_seq;
    g.row_stride = (int64_t)batch->max_pages_per_seq * (batch->kv_split_pages ? 2 : 1);
    return g;
}

fi_page_table_geom fi_page_table_geom_of(const fi_batch *batch, const fi_request_info *requests,
                                         int32_t page_size) {
    fi_page_table_geom g = fi_page_table_geom_begin(batch);
    for (int32_t b = 0; b < batch->batch_size; b++)
        fi_page_table_geom_add(&g, requests[b].page_row_offset,
                               ((int64_t)requests[b].kv_len + page_size - 1) / page_size);
    return g;
}
