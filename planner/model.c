/*
 * planner/model.c - the executor's time model of a written plan (planner/model.h).
 */
#include "planner/model.h"

/* finish[i]: when item i ends, its CTA's running cost; last[g] (unless last is NULL;
 * set to -1 first): the item of group g that ends last, ties the lower index.  row: a
 * local copy (the stores to finish / last could alias the table row). */
FI_PD_STATIC void model_finish(const fi_variant *row, const int32_t *work_indptr, int32_t n,
                               const fi_work_item *items, int32_t num_groups, int64_t *finish,
                               int32_t *last) {
    for (int32_t g = 0; last && g < num_groups; g++)
        last[g] = -1;
    for (int32_t c = 0; c < n; c++) {
        int64_t t = 0;
        for (int32_t i = work_indptr[c]; i < work_indptr[c + 1]; i++) {
            const fi_work_item *it = &items[i];
            const int64_t rows =
                (int64_t)(it->q_end - it->q_begin) * (it->head_end - it->head_begin);
            t += fi_variant_item_cost(row, it->kv_end - it->kv_begin, rows);
            finish[i] = t;
            const int32_t g = it->merge_group;
            if (last && g >= 0 && (last[g] < 0 || t > finish[last[g]]))
                last[g] = i;
        }
    }
}

FI_PD int64_t fi_model_max(const fi_variant *v, const int32_t *work_indptr, int32_t n,
                     const fi_work_item *items, int32_t num_groups, int64_t *finish,
                     int32_t *last) {
    const fi_variant row = *v; /* the stores to finish / last could alias *v */
    model_finish(&row, work_indptr, n, items, num_groups, finish, last);
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

#ifndef FI_PLANNER_DEVICE_TU
#include <stdlib.h>

static int cmp_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

void fi_model_heads_in_flight(const fi_variant *v, const int32_t *work_indptr, int32_t n,
                              const fi_work_item *items, int32_t group, int64_t *finish,
                              int64_t *keys, int32_t *max_out, double *mean_out) {
    const fi_variant row = *v;
    model_finish(&row, work_indptr, n, items, 0, finish, NULL);
    int32_t max = 0;
    double sum = 0;
    const int32_t ni = work_indptr[n];
    for (int32_t c0 = 0; c0 < n; c0++) {
        for (int32_t e = work_indptr[c0]; e < work_indptr[c0 + 1]; e++) {
            const int64_t t = e > work_indptr[c0] ? finish[e - 1] : 0; /* item e starts */
            int32_t k = 0;
            for (int32_t c = 0; c < n; c++) { /* CTA c's item running at t: first finish > t */
                int32_t lo = work_indptr[c], hi = work_indptr[c + 1];
                while (lo < hi) {
                    const int32_t mid = lo + (hi - lo) / 2;
                    if (finish[mid] > t)
                        hi = mid;
                    else
                        lo = mid + 1;
                }
                if (lo < work_indptr[c + 1])
                    keys[k++] = (int64_t)items[lo].request * 65536 + items[lo].head_begin / group;
            }
            qsort(keys, (size_t)k, sizeof keys[0], cmp_i64);
            int32_t d = 0;
            for (int32_t i = 0; i < k; i++)
                d += i == 0 || keys[i] != keys[i - 1];
            max = d > max ? d : max;
            sum += d;
        }
    }
    *max_out = max;
    *mean_out = ni > 0 ? sum / ni : 0.0;
}
#endif
