/*
 * viz/summary.c - plan statistics, plan-update timing and fiplan's text summary.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plan/variant.h"
#include "planner/model.h" /* fi_model_heads_in_flight */
#include "viz/fiplan.h"
#include "workspace/layout.h" /* fi_layout_used_bytes: what an update copies */

const char *fiplan_dtype_name(fi_dtype d) {
    switch (d) {
    case FI_DTYPE_F32: return "f32";
    case FI_DTYPE_BF16: return "bf16";
    case FI_DTYPE_F16: return "f16";
    case FI_DTYPE_E4M3: return "e4m3";
    default: return "other";
    }
}

const char *fiplan_kind_name(fi_kind kind) {
    switch (kind) {
    case FI_KIND_MLA_DECODE: return "mla";
    case FI_KIND_GQA_DECODE: return "gqa";
    case FI_KIND_CONTEXT: return "context";
    }
    return "?";
}

const char *fiplan_form_name(fi_batch_form form) {
    switch (form) {
    case FI_FORM_BLOCK_TABLES: return "block_tables";
    case FI_FORM_INDPTR: return "indptr";
    case FI_FORM_CUM_SEQ_LENS: return "cum_seq_lens";
    }
    return "?";
}

int fiplan_stats_of(const fi_plan *plan, fiplan_stats *st) {
    fi_plan_view v;
    memset(st, 0, sizeof *st);
    st->update_us_median = -1.0;
    if (fi_plan_get_view(plan, &v) != FI_OK) return -1;
    const fi_plan_header *h = v.header;
    st->num_items = h->num_items;
    st->num_groups = h->num_groups;
    st->num_slots = h->num_slots;
    st->num_ctas = v.num_ctas;
    st->batch_size = h->batch_size;
    st->total_q_tokens = h->total_q_tokens;
    st->tile_rows = h->tile_rows;
    st->kv_chunk = h->kv_chunk;
    st->max_cta_cost = h->max_cta_cost;
    st->mean_cta_cost = v.num_ctas > 0 ? (double)h->total_cost / v.num_ctas : 0.0;
    st->balance = fi_plan_balance(plan);
    for (int32_t c = 0; c < v.num_ctas; c++)
        st->busy_ctas += v.work_indptr[c + 1] > v.work_indptr[c];
    for (int32_t i = 0; i < h->num_items; i++) {
        st->split_items += v.items[i].out_slot >= 0;
        st->total_kv_tokens += v.items[i].kv_end - v.items[i].kv_begin;
    }
    const fi_caps *caps = fi_plan_caps(plan);
    const fi_variant *row = fi_variant_of(caps);
    int64_t *finish = fiplan_alloc(sizeof(int64_t) * ((size_t)h->num_items + 1));
    int64_t *keys = fiplan_alloc(sizeof(int64_t) * ((size_t)v.num_ctas + 1));
    if (row && finish && keys)
        fi_model_heads_in_flight(row, v.work_indptr, v.num_ctas, v.items,
                                 caps->num_qo_heads / caps->num_kv_heads, finish, keys,
                                 &st->heads_in_flight_max, &st->heads_in_flight_mean);
    fiplan_free(finish);
    fiplan_free(keys);
    fi_layout l;
    if (fi_workspace_size(caps, &st->workspace_bytes) != FI_OK) st->workspace_bytes = 0;
    if (fi_layout_compute(caps, &l) == FI_OK)
        st->plan_bytes_used = fi_layout_used_bytes(&l, h->num_items);
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double fiplan_median(double *v, int32_t n) {
    if (n <= 0) return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

fi_status fiplan_time_updates(fi_plan *plan, const fi_batch *batch, void *stream,
                              int32_t repeats, fiplan_stats *st) {
    if (repeats < 1) repeats = 1;
    double *t = fiplan_alloc((size_t)repeats * sizeof(double));
    if (!t) return FI_ERR_OUT_OF_MEMORY;
    fi_status s = FI_OK;
    for (int i = 0; i < 3 && s == FI_OK; i++) s = fi_plan_update(plan, batch, stream);
    for (int32_t i = 0; i < repeats && s == FI_OK; i++) {
        double t0 = now_us();
        s = fi_plan_update(plan, batch, stream);
        t[i] = now_us() - t0;
    }
    if (s == FI_OK) {
        st->update_repeats = repeats;
        st->update_us_median = fiplan_median(t, repeats);
        st->update_us_min = t[0];
        st->update_us_max = t[repeats - 1];
    }
    fiplan_free(t);
    return s;
}

/* The explanation line under a figure (--explain). */
static void why(FILE *f, int explain, const char *text) {
    if (explain) fprintf(f, "               = %s\n", text);
}

void fiplan_print_summary(FILE *f, const fi_caps *caps, const fibatch *b,
                          const fiplan_stats *st, int explain) {
    double mean_kv = 0.0;
    for (int32_t i = 0; i < b->batch.batch_size; i++) mean_kv += b->kv_lens[i];
    mean_kv /= b->batch.batch_size;
    fprintf(f, "kind           %s  H_q %d  H_kv %d  head_dim %d/%d  page_size %d  ctas %d\n",
            fiplan_kind_name(caps->kind), caps->num_qo_heads, caps->num_kv_heads,
            caps->head_dim_qk, caps->head_dim_vo, caps->page_size, st->num_ctas);
    why(f, explain, "attention kind, query / KV heads, head dims (qk/vo), tokens per KV page, "
                    "and the persistent grid (one CTA per SM)");
    const fi_variant *row = fi_variant_of(caps);
    if (row) {
        fprintf(f, "row            %s (tile table row %d) for q / KV %s: beta %d, merge %d, "
                   "arrive %d\n",
                row->name, row->variant, fiplan_dtype_name(caps->kv_dtype), row->cost_beta,
                row->cost_merge, row->cost_arrive);
        why(f, explain, "the tile-table row that planned the batch (plan/variant.h: the "
                        "kernel body and its tiles) and its cost-model charges in KV tokens "
                        "(plan/cost_model.h: an item, a merging piece, an arriving one)");
    }
    fprintf(f, "batch          %d requests (%s), %d query tokens, kv_len mean %.0f max %d, "
               "causal %d, window_left %d\n",
            b->batch.batch_size, fiplan_form_name(b->batch.form), b->total_q_tokens, mean_kv,
            b->max_kv_len, b->batch.causal, b->batch.window_left);
    why(f, explain, "the decode step planned: each request adds one query token and reads its "
                    "whole KV cache (kv_len tokens)");
    fprintf(f, "work items     %d on %d busy CTAs (tile_rows %d, kv_chunk %d, %lld KV tokens)\n",
            st->num_items, st->busy_ctas, st->tile_rows, st->kv_chunk,
            (long long)st->total_kv_tokens);
    why(f, explain, "the plan: (request, heads, KV range) pieces spread over the CTAs; a "
                    "tile_rows-row tile is cut at most where a CTA's share ends");
    fprintf(f, "split groups   %d (%d split items, %d partial slots)\n", st->num_groups,
            st->split_items, st->num_slots);
    why(f, explain, "requests cut across CTAs: their pieces write fp32 partials that the last "
                    "CTA of the group merges in the same launch");
    fprintf(f, "CTA cost       max %lld  mean %.1f  balance %.3f (max/mean, 1 = perfect)\n",
            (long long)st->max_cta_cost, st->mean_cta_cost, st->balance);
    why(f, explain, "modelled work per CTA (KV tokens + per-item overhead); the step lasts as "
                    "long as the busiest CTA, so balance near 1 is the goal (a few tiles per CTA "
                    "cannot reach it; at <= 16 heads fewer cut pieces may win over balance)");
    fprintf(f, "KV heads       %d in flight at most, %.1f on average (modelled timeline)\n",
            st->heads_in_flight_max, st->heads_in_flight_mean);
    why(f, explain, "distinct (request, KV head) pairs the CTAs work on at once, at each item's "
                    "start with every item lasting its modelled cost: few means K / V blocks "
                    "are shared through L2; context plans take the list schedule (queue "
                    "head-major, each tile to the CTA free first) for this when the model "
                    "rates it within a few % of the contiguous walk");
    fprintf(f, "workspace      %zu bytes (plan copy per update: %zu bytes)\n",
            st->workspace_bytes, st->plan_bytes_used);
    why(f, explain, "device memory the plan needs for these caps (fixed, so a captured CUDA "
                    "graph keeps working), and the bytes copied host to device per step");
    if (st->update_us_median >= 0)
        fprintf(f, "plan update    %.2f us median of %d (min %.2f, max %.2f), host plan\n",
                st->update_us_median, st->update_repeats, st->update_us_min, st->update_us_max);
    if (st->update_us_median >= 0)
        why(f, explain, "host time of fi_plan_update for this batch (validate, tile, partition, "
                        "lay out), repeated on warm caches: once per decode step, for all layers");
}
