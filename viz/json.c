/*
 * viz/json.c - fiplan --json: caps, the tile-table row and its cost-model charges, batch
 * lengths, statistics, the whole plan (CTA ranges, work items, merge groups) and the
 * execution check, as one JSON object.
 *
 * Hand-written emitter: only numbers, fixed ASCII keys and a few fixed strings (the tile
 * table's row names among them) are written, so no escaping is needed; non-finite doubles
 * become null.  Items and groups are arrays of integers whose field order is given once in
 * "item_fields" / "group_fields", which keeps a 10k-item plan readable by tools and small.
 */
#include <math.h>
#include <stdio.h>

#include "plan/variant.h"
#include "viz/fiplan.h"

static void num(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.9g", x);
    else fputs("null", f);
}

static void int_array(FILE *f, const int32_t *v, int32_t n) {
    fputc('[', f);
    for (int32_t i = 0; i < n; i++) fprintf(f, i ? ",%d" : "%d", v[i]);
    fputc(']', f);
}

int fiplan_write_json(FILE *f, const fi_plan *plan, const fi_caps *caps, const fibatch *b,
                      const fiplan_stats *st, const fiplan_exec_result *ex) {
    fi_plan_view v;
    if (fi_plan_get_view(plan, &v) != FI_OK) return -1;
    const fi_plan_header *h = v.header;
    fprintf(f, "{\n  \"caps\": {\"kind\": \"%s\", \"max_batch\": %d, \"max_q_tokens\": %d, "
               "\"num_pages\": %d, \"page_size\": %d, \"num_qo_heads\": %d, "
               "\"num_kv_heads\": %d, \"head_dim_qk\": %d, \"head_dim_vo\": %d, "
               "\"num_ctas\": %d},\n",
            fiplan_kind_name(caps->kind), caps->max_batch, caps->max_q_tokens, caps->num_pages,
            caps->page_size, caps->num_qo_heads, caps->num_kv_heads, caps->head_dim_qk,
            caps->head_dim_vo, v.num_ctas);
    /* The tile-table row that planned it, with the charges its cost model used (they differ
     * from row to row: plan/cost_model.h), so tools score the plan with its own charges. */
    const fi_variant *row = fi_variant_of(caps);
    if (row)
        fprintf(f, "  \"row\": {\"variant\": %d, \"name\": \"%s\", \"cost_alpha\": %d, "
                   "\"cost_beta\": %d, \"cost_merge\": %d, \"cost_arrive\": %d},\n",
                row->variant, row->name, row->cost_alpha, row->cost_beta, row->cost_merge,
                row->cost_arrive);
    fprintf(f, "  \"batch\": {\"form\": \"%s\", \"batch_size\": %d, \"causal\": %d, "
               "\"window_left\": %d, \"total_q_tokens\": %d, \"q_len\": ",
            fiplan_form_name(b->batch.form), b->batch.batch_size, b->batch.causal,
            b->batch.window_left, b->total_q_tokens);
    int_array(f, b->q_lens, b->batch.batch_size);
    fputs(", \"kv_len\": ", f);
    int_array(f, b->kv_lens, b->batch.batch_size);
    fputs("},\n", f);

    fprintf(f, "  \"summary\": {\"num_items\": %d, \"num_groups\": %d, \"num_slots\": %d, "
               "\"split_items\": %d, \"busy_ctas\": %d, \"tile_rows\": %d, \"kv_chunk\": %d, "
               "\"total_kv_tokens\": %lld, \"max_cta_cost\": %lld, \"mean_cta_cost\": ",
            st->num_items, st->num_groups, st->num_slots, st->split_items, st->busy_ctas,
            st->tile_rows, st->kv_chunk, (long long)st->total_kv_tokens,
            (long long)st->max_cta_cost);
    num(f, st->mean_cta_cost);
    fputs(", \"balance\": ", f);
    num(f, st->balance);
    fprintf(f, ", \"workspace_bytes\": %zu, \"plan_bytes_used\": %zu, \"update_us_median\": ",
            st->workspace_bytes, st->plan_bytes_used);
    if (st->update_us_median >= 0) num(f, st->update_us_median);
    else fputs("null", f);
    fprintf(f, ", \"update_repeats\": %d},\n", st->update_repeats);

    fprintf(f, "  \"plan\": {\"total_cost\": %lld, \"work_indptr\": ", (long long)h->total_cost);
    int_array(f, v.work_indptr, v.num_ctas + 1);
    fputs(",\n    \"item_fields\": [\"request\", \"head_begin\", \"head_end\", \"q_begin\", "
          "\"q_end\", \"kv_begin\", \"kv_end\", \"out_slot\", \"merge_group\"],\n    \"items\": [",
          f);
    for (int32_t i = 0; i < h->num_items; i++) {
        const fi_work_item *it = &v.items[i];
        fprintf(f, "%s[%d,%d,%d,%d,%d,%d,%d,%d,%d]", i ? ",\n      " : "\n      ", it->request,
                it->head_begin, it->head_end, it->q_begin, it->q_end, it->kv_begin, it->kv_end,
                it->out_slot, it->merge_group);
    }
    fputs("],\n    \"group_fields\": [\"request\", \"head_begin\", \"head_end\", \"q_begin\", "
          "\"q_end\", \"first_slot\", \"num_splits\", \"first_item\"],\n    \"groups\": [",
          f);
    for (int32_t i = 0; i < h->num_groups; i++) {
        const fi_merge_group *g = &v.groups[i];
        fprintf(f, "%s[%d,%d,%d,%d,%d,%d,%d,%d]", i ? ",\n      " : "\n      ", g->request,
                g->head_begin, g->head_end, g->q_begin, g->q_end, g->first_slot, g->num_splits,
                g->first_item);
    }
    fputs("]}", f);
    if (ex && ex->ran) {
        fprintf(f, ",\n  \"execute\": {\"device\": \"%s\", \"rel_err\": ", ex->on_gpu ? "gpu" : "cpu");
        num(f, ex->rel_err);
        fputs(", \"lse_rel_err\": ", f);
        num(f, ex->lse_rel_err);
        fprintf(f, ", \"nonfinite_mismatches\": %lld, \"tolerance\": ", (long long)ex->nonfinite);
        num(f, ex->tolerance);
        fputs(", \"exec_ms\": ", f);
        num(f, ex->exec_ms);
        fprintf(f, ", \"pass\": %s}", ex->nonfinite == 0 && ex->rel_err <= ex->tolerance ? "true" : "false");
    }
    fputs("\n}\n", f);
    return ferror(f) ? -1 : 0;
}
