/*
 * executor/cpu/naive.c - fi_naive_attention: the definition of the right answer.
 *
 * Straight from the batch description, no plan: for every request b, query row i and
 * query head h (KV head h / group), over the row's keys j in [lo, hi) (ref_common.h
 * fi_row_kv_range):
 *   s_j = bmm1_scale * (q . k_j)             MLA: q_nope . ckv_j + q_pe . kpe_j
 *   m   = max(max_j s_j, sink_h)             (shift for exp; cancels out)
 *   den = sum_j exp(s_j - m) + exp(sink_h - m)
 *   out = bmm2_scale * sum_j exp(s_j - m) v_j / den      MLA: v_j = ckv_j
 *   lse = m + log(den)                       natural log of the unshifted denominator
 * all in fp64.  A row with no key and no sink gets out 0 and lse -inf.
 */
#include <math.h>
#include <stdlib.h>

#include "executor/cpu/ref_common.h"
#include "fiattn_ref.h"
#include "planner/validate.h"

/* Per-call fp64 scratch. */
typedef struct naive_scratch {
    double *q;      /* [d_main + d_rope]  one query row */
    double *s;      /* [max kv_len]        logits of the row's keys */
    double *acc;    /* [d_vo]              sum_j exp(s_j - m) v_j */
} naive_scratch;

typedef struct naive_run {
    const fi_cpu_geom *g;
    const fi_attn_args *a;
    const int32_t *page_table;
    int32_t v_row_offset;   /* + P for the V row of a [B, 2, P] table, else 0 */
    double bmm1, bmm2;
} naive_run;

static void store_row(const naive_run *n, int32_t tok, int32_t h, const double *acc,
                      double scale, double lse) {
    const fi_tensor *o = &n->a->out;
    for (int32_t d = 0; d < n->g->d_vo; ++d)
        fi_elem_store(o, fi_off3(o, tok, h, d), (float)(acc ? acc[d] * scale : 0.0));
    if (n->a->lse.data)
        ((float *)n->a->lse.data)[fi_off2(&n->a->lse, tok, h)] = (float)lse;
}

/* One (query token, head) row over keys [lo, hi) of request r. */
static void naive_row(const naive_run *n, const fi_request_info *r, int32_t tok, int32_t h,
                      int32_t lo, int32_t hi, naive_scratch *w) {
    const fi_cpu_geom *g = n->g;
    const fi_attn_args *a = n->a;
    const int32_t kvh = h / g->group;
    const int has_sink = a->sinks != NULL;
    if (lo >= hi && !has_sink) {
        store_row(n, tok, h, NULL, 0.0, -INFINITY);
        return;
    }
    for (int32_t d = 0; d < g->d_main; ++d)
        w->q[d] = fi_elem_load(&a->q, fi_off3(&a->q, tok, h, d));
    for (int32_t d = 0; d < g->d_rope; ++d)
        w->q[g->d_main + d] = fi_elem_load(&a->q_rope, fi_off3(&a->q_rope, tok, h, d));

    double m = has_sink ? (double)a->sinks[h] : -INFINITY;
    for (int32_t j = lo; j < hi; ++j) {
        const int32_t page = fi_kv_page(n->page_table, r->page_row_offset, g->page_size, j);
        const int32_t slot = j % g->page_size;
        double dot = 0.0;
        for (int32_t d = 0; d < g->d_main; ++d)
            dot += w->q[d] * fi_elem_load(&a->k, fi_off4(&a->k, page, slot, kvh, d));
        for (int32_t d = 0; d < g->d_rope; ++d)
            dot += w->q[g->d_main + d] *
                   fi_elem_load(&a->k_rope, fi_off4(&a->k_rope, page, slot, 0, d));
        w->s[j - lo] = n->bmm1 * dot;
        if (w->s[j - lo] > m) m = w->s[j - lo];
    }

    double den = has_sink ? exp((double)a->sinks[h] - m) : 0.0;
    for (int32_t d = 0; d < g->d_vo; ++d) w->acc[d] = 0.0;
    for (int32_t j = lo; j < hi; ++j) {
        const double p = exp(w->s[j - lo] - m);
        den += p;
        const int32_t slot = j % g->page_size;
        if (g->mla) {  /* V is ckv: the K page */
            const int32_t page = fi_kv_page(n->page_table, r->page_row_offset, g->page_size, j);
            for (int32_t d = 0; d < g->d_vo; ++d)
                w->acc[d] += p * fi_elem_load(&a->k, fi_off4(&a->k, page, slot, 0, d));
        } else {
            const int32_t page = fi_kv_page(n->page_table, r->page_row_offset + n->v_row_offset,
                                            g->page_size, j);
            for (int32_t d = 0; d < g->d_vo; ++d)
                w->acc[d] += p * fi_elem_load(&a->v, fi_off4(&a->v, page, slot, kvh, d));
        }
    }
    store_row(n, tok, h, w->acc, n->bmm2 / den, m + log(den));
}

fi_status fi_naive_attention(const fi_caps *caps, const fi_batch *batch,
                             const fi_attn_args *args) {
    if (!caps || !batch || !args) return FI_ERR_NULL_ARGUMENT;
    fi_status st = fi_caps_validate(caps);
    if (st != FI_OK) return st;

    /* Validation needs room for up to max_batch requests (it rejects more). */
    fi_request_info *req = malloc(sizeof(*req) * (size_t)caps->max_batch);
    if (!req) return FI_ERR_OUT_OF_MEMORY;
    int32_t q_tokens = 0;
    fi_error_detail err;
    fi_cpu_geom g;
    st = fi_batch_validate(caps, batch, req, &q_tokens, &err);
    if (st == FI_OK) st = fi_cpu_check_args(caps, args, q_tokens, &g);
    if (st != FI_OK) {
        free(req);
        return st;
    }

    int32_t max_kv = 1;
    for (int32_t b = 0; b < batch->batch_size; ++b)
        if (req[b].kv_len > max_kv) max_kv = req[b].kv_len;
    naive_scratch w;
    w.q = malloc(sizeof(double) * (size_t)(g.d_main + g.d_rope));
    w.s = malloc(sizeof(double) * (size_t)max_kv);
    w.acc = malloc(sizeof(double) * (size_t)g.d_vo);
    if (!w.q || !w.s || !w.acc) {
        st = FI_ERR_OUT_OF_MEMORY;
        goto done;
    }

    naive_run n = {
        .g = &g,
        .a = args,
        .page_table = (const int32_t *)args->page_table.data,
        .v_row_offset = (batch->form != FI_FORM_INDPTR && batch->kv_split_pages)
                            ? batch->max_pages_per_seq : 0,
        .bmm1 = fi_cpu_bmm1_scale(args),
        .bmm2 = fi_cpu_bmm2_scale(args),
    };
    for (int32_t b = 0; b < batch->batch_size; ++b) {
        const fi_request_info *r = &req[b];
        for (int32_t i = 0; i < r->q_len; ++i) {
            int32_t lo, hi;
            fi_row_kv_range(batch->causal, batch->window_left, r->q_len, r->kv_len, i, &lo, &hi);
            for (int32_t h = 0; h < g.num_qo_heads; ++h)
                naive_row(&n, r, r->q_offset + i, h, lo, hi, &w);
        }
    }
done:
    free(w.q);
    free(w.s);
    free(w.acc);
    free(req);
    return st;
}
