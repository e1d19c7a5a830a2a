/*
 * planner/model.h - the executor's time model of a written plan, used to choose between
 * partitions (planner/partition.h) and by the tests that check that choice.
 *
 * A CTA runs its items in order; item i costs fi_variant_item_cost (plan/variant.h) and
 * ends at the CTA's running sum.  Of each merge group, the piece that ends last (ties: the
 * lower item index) is where the group is merged (the row's cost_merge is added to its
 * CTA); the other pieces publish their partials (cost_arrive each).  The merge's own delay
 * of the CTA's later items is not modelled.  Calibration: plan/cost_model.h.
 */
#ifndef FIATTN_PLANNER_MODEL_H
#define FIATTN_PLANNER_MODEL_H

#include <stdint.h>

#include "fiattn_work.h"
#include "plan/variant.h"

/* Largest CTA cost, KV-token units, of the plan work_indptr [n + 1] / items (a plan view or
 * staging) under the cost model of row v.  finish: scratch [work_indptr[n]]; last: scratch
 * [num_groups] (item index of the latest piece).  O(items + groups). */
FI_PD int64_t fi_model_max(const fi_variant *v, const int32_t *work_indptr, int32_t n,
                     const fi_work_item *items, int32_t num_groups, int64_t *finish,
                     int32_t *last);

#ifndef FI_PLANNER_DEVICE_TU
/* Host only (fiplan, tests): the KV heads the CTAs work on at once, in the model's timeline
 * (items in CTA order, each lasting its fi_variant_item_cost; no merges): at the start of
 * every item, the distinct (request, KV head) pairs among the items running then (each
 * CTA's item whose [start, end) holds that time).  group: query heads per KV head.
 * *max_out: the most at any item start, *mean_out: the mean over item starts (0 without
 * items).  finish: scratch [items]; keys: scratch [n].  O(items n log n). */
void fi_model_heads_in_flight(const fi_variant *v, const int32_t *work_indptr, int32_t n,
                              const fi_work_item *items, int32_t group, int64_t *finish,
                              int64_t *keys, int32_t *max_out, double *mean_out);
#endif

#endif
