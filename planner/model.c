/*
 * planner/model.c - the executor's time model of a written plan (planner/model.h).
 */
#include "planner/model.h"

FI_PD int64_t fi_model_max(const fi_variant *v, const int32_t *work_indptr, int32_t n,
                     const fi_work_item *items, int32_t num_groups, int64_t *finish,
                     int32_t *last) {
    const fi_variant row = *v; /* the stores to finish / last could alias *v */
    for (int32_t g = 0; g < num_groups; g++)
        last[g] = -1;
    for (int32_t c = 0; c < n; c++) {
        int64_t t = 0;
        for (int32_t i = work_indptr[c]; i < work_indptr[c + 1]; i++) {
            const fi_work_item *it = &items[i];
            const int64_t rows =
                (int64_t)(it->q_end - it->q_begin) * (it->head_end - it->head_begin);
            t += fi_variant_item_cost(&row, it->kv_end - it->kv_begin, rows);
            finish[i] = t;
            const int32_t g = it->merge_group;
            if (g >= 0 && (last[g] < 0 || t > finish[last[g]]))
                last[g] = i;
        }
    }
    int64_t max = 0;
    for (int32_t c = 0; c < n; c++) {
        const int32_t e = work_indptr[c + 1];
        int64_t t = e > work_indptr[c] ? finish[e - 1] : 0;
        for (int32_t i = work_indptr[c]; i < e; i++)
            if (items[i].merge_group >= 0)
                t += last[items[i].merge_group] == i ? row.cost_merge : row.cost_arrive;
        max = t > max ? t : max;
    }
    return max;
}
