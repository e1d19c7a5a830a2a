/*
 * executor/cpu/naive.c - fi_naive_attention: the definition of the right answer.
 *
 * Straight from the batch description, no plan: for every request b, query row i and
 * query head h (KV head h / group), over the row's keys j in [lo, hi) (plan/mask.h
 * fi_row_kv_range):
 *   s_j = bmm1_scale * (q . k_j)             MLA: q_nope . ckv_j + q_pe . kpe_j
 *   m   = max(max_j s_j, sink_h)             (shift for exp; cancels out)
 *   den = sum_j exp(s_j - m) + exp(sink_h - m)
 *   out = bmm2_scale * sum_j exp(s_j - m) v_j / den      MLA: v_j = ckv_j
 *   lse = m + log(den)                       natural log of the unshifted denominator
 * all in fp64.  A row with no key and no sink gets out 0 and lse -inf.
 * Non-finite inputs as fiattn_run.h states: the max keeps a NaN logit or sink (then every
 * p_j, den, out and lse are NaN), a +inf logit gives exp(inf - inf) = NaN, and a row whose
 * m is -inf (no key, or every logit and the sink -inf) is an empty row.
 * Sparse top-k batches (caps.sparse_top_k = K > 0) take their own, plainer loop
 * (naive_sparse): the keys of query token (b, i) are the listed slots of its table row.
 */
#include <math.h>
#include <stdlib.h>

#include "executor/core/args.h"
#include "executor/cpu/ref_common.h"
#include "fiattn_ref.h"
#include "workspace/layout.h" /* fi_layout_max_requests */

/* Speed (the GPU tests check whole batches against this): rows are done in blocks of up
 * to NAIVE_ROWS (query row, head) pairs of one request and KV head, keys converted to fp64
 * NAIVE_KEYS at a time once per row block, and the inner loops register-blocked (8 rows
 * per key, 8 output dims per row).  Each row's softmax is still the exact two-pass one
 * above, every sum taken in order (over d for a logit, over keys for den and out). */
#define NAIVE_ROWS 64
#define NAIVE_KEYS 128

/* Per-call fp64 scratch. */
typedef struct naive_scratch {
    double *qt;     /* [d_qk][NAIVE_ROWS]     query rows, transposed (MLA: nope ++ rope) */
    double *dot;    /* [NAIVE_ROWS]           q_i . k_j of the current key */
    double *s;      /* [NAIVE_ROWS][max_kv]   logits of each row's keys [lo, hi) */
    double *kv;     /* [NAIVE_KEYS][d_qk + d_vo] converted K (++ V) rows of a key chunk */
    double *acc;    /* [NAIVE_ROWS][d_vo]     sum_j exp(s_j - m) v_j */
    double *m;      /* [NAIVE_ROWS]           max logit (incl. sink) */
    int32_t *row_q, *row_h, *lo, *hi;  /* [NAIVE_ROWS] */
} naive_scratch;

typedef struct naive_run {
    const fi_cpu_geom *g;
    const fi_attn_args *a;
    const int32_t *page_table;
    int32_t v_row_offset;   /* + P for the V row of a [B, 2, P] table, else 0 */
    int32_t d_qk;           /* d_main + d_rope */
    int32_t max_kv;         /* row stride of scratch.s */
    double bmm1, bmm2;
} naive_run;

/* Convert keys [t0, t0 + n) of request r, KV head kvh into w->kv: row j holds k (d_qk:
 * main ++ rope) then v (d_vo; MLA: ckv again, V is the K page). */
static void load_keys(const naive_run *x, const fi_request_info *r, int32_t kvh, int32_t t0,
                      int32_t n, naive_scratch *w) {
    const fi_cpu_geom *g = x->g;
    const fi_attn_args *a = x->a;
    const int32_t ld = x->d_qk + g->d_vo;
    for (int32_t j = 0; j < n; ++j) {
        const int32_t t = t0 + j, slot = t % g->page_size;
        const int32_t kp = fi_kv_page(x->page_table, r->page_row_offset, g->page_size, t);
        double *row = w->kv + (size_t)j * ld;
        for (int32_t d = 0; d < g->d_main; ++d)
            row[d] = fi_elem_load(&a->k, fi_off4(&a->k, kp, slot, kvh, d));
        for (int32_t d = 0; d < g->d_rope; ++d)
            row[g->d_main + d] = fi_elem_load(&a->k_rope, fi_off4(&a->k_rope, kp, slot, 0, d));
        if (g->mla) {
            for (int32_t d = 0; d < g->d_vo; ++d) row[x->d_qk + d] = row[d];
        } else {
            const int32_t vp = fi_kv_page(x->page_table, r->page_row_offset + x->v_row_offset,
                                          g->page_size, t);
            for (int32_t d = 0; d < g->d_vo; ++d)
                row[x->d_qk + d] = fi_elem_load(&a->v, fi_off4(&a->v, vp, slot, kvh, d));
        }
    }
}

static void store_row(const naive_run *x, int32_t tok, int32_t h, const double *acc,
                      double scale, double lse) {
    const fi_tensor *o = &x->a->out;
    for (int32_t d = 0; d < x->g->d_vo; ++d)
        fi_elem_store(o, fi_off3(o, tok, h, d), (float)(acc ? acc[d] * scale : 0.0));
    if (x->a->lse.data)
        ((float *)x->a->lse.data)[fi_off2(&x->a->lse, tok, h)] = (float)lse;
}

/* Rows w->row_q/row_h [0, n) of request r (all under KV head kvh): logits of every key of
 * each row's range, then m, den and the weighted sum of v, then the output. */
static void naive_rows(const naive_run *x, const fi_request_info *r, int32_t kvh, int32_t n,
                       naive_scratch *w) {
    const fi_cpu_geom *g = x->g;
    const fi_attn_args *a = x->a;
    const int32_t ld = x->d_qk + g->d_vo;
    int32_t lo = INT32_MAX, hi = 0;   /* union of the rows' ranges */
    for (int32_t d = 0; d < x->d_qk; ++d)   /* unused rows of a short block: zeros */
        for (int32_t i = n; i < NAIVE_ROWS; ++i) w->qt[(size_t)d * NAIVE_ROWS + i] = 0.0;
    for (int32_t i = 0; i < n; ++i) {
        const int32_t tok = r->q_offset + w->row_q[i], h = w->row_h[i];
        for (int32_t d = 0; d < g->d_main; ++d)
            w->qt[(size_t)d * NAIVE_ROWS + i] = fi_elem_load(&a->q, fi_off3(&a->q, tok, h, d));
        for (int32_t d = 0; d < g->d_rope; ++d)
            w->qt[(size_t)(g->d_main + d) * NAIVE_ROWS + i] =
                fi_elem_load(&a->q_rope, fi_off3(&a->q_rope, tok, h, d));
        w->m[i] = a->sinks ? (double)a->sinks[h] : -INFINITY;
        for (int32_t d = 0; d < g->d_vo; ++d) w->acc[(size_t)i * g->d_vo + d] = 0.0;
        if (w->lo[i] < w->hi[i]) {
            if (w->lo[i] < lo) lo = w->lo[i];
            if (w->hi[i] > hi) hi = w->hi[i];
        }
    }
    /* pass 1: logits and max.  dot_i = sum_d q_i[d] k_j[d] for 8 rows at once (padding
     * rows are zero), kept for the rows whose range holds key j. */
    for (int32_t t0 = lo; t0 < hi; t0 += NAIVE_KEYS) {
        const int32_t nk = hi - t0 < NAIVE_KEYS ? hi - t0 : NAIVE_KEYS;
        load_keys(x, r, kvh, t0, nk, w);
        for (int32_t j = t0; j < t0 + nk; ++j) {
            const double *k = w->kv + (size_t)(j - t0) * ld;
            double *dot = w->dot;
            for (int32_t i0 = 0; i0 < n; i0 += 8) {   /* 8 rows at a time, in registers */
                double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
                for (int32_t d = 0; d < x->d_qk; ++d) {
                    const double kd = k[d];
                    const double *qd = w->qt + (size_t)d * NAIVE_ROWS + i0;
                    a0 += qd[0] * kd; a1 += qd[1] * kd; a2 += qd[2] * kd; a3 += qd[3] * kd;
                    a4 += qd[4] * kd; a5 += qd[5] * kd; a6 += qd[6] * kd; a7 += qd[7] * kd;
                }
                dot[i0] = a0; dot[i0 + 1] = a1; dot[i0 + 2] = a2; dot[i0 + 3] = a3;
                dot[i0 + 4] = a4; dot[i0 + 5] = a5; dot[i0 + 6] = a6; dot[i0 + 7] = a7;
            }
            for (int32_t i = 0; i < n; ++i) {
                if (j < w->lo[i] || j >= w->hi[i]) continue;
                double *s = w->s + (size_t)i * x->max_kv;
                s[j] = x->bmm1 * dot[i];
                w->m[i] = fi_max_nan_d(s[j], w->m[i]);
            }
        }
    }
    /* pass 2: p_j = exp(s_j - m) (stored over s_j), acc += p_j v_j (keys converted again:
     * no kv_len-sized fp64 copy of the cache) */
    for (int32_t t0 = lo; t0 < hi; t0 += NAIVE_KEYS) {
        const int32_t nk = hi - t0 < NAIVE_KEYS ? hi - t0 : NAIVE_KEYS;
        load_keys(x, r, kvh, t0, nk, w);
        for (int32_t i = 0; i < n; ++i) {
            if (w->m[i] == -INFINITY) continue;   /* an empty row: V not used */
            const int32_t j0 = w->lo[i] > t0 ? w->lo[i] : t0;
            const int32_t j1 = w->hi[i] < t0 + nk ? w->hi[i] : t0 + nk;
            double *s = w->s + (size_t)i * x->max_kv;
            double *acc = w->acc + (size_t)i * g->d_vo;
            for (int32_t j = j0; j < j1; ++j) s[j] = exp(s[j] - w->m[i]);
            for (int32_t d0 = 0; d0 < g->d_vo; d0 += 8) {   /* d_vo % 64 == 0 */
                double a0 = acc[d0], a1 = acc[d0 + 1], a2 = acc[d0 + 2], a3 = acc[d0 + 3];
                double a4 = acc[d0 + 4], a5 = acc[d0 + 5], a6 = acc[d0 + 6], a7 = acc[d0 + 7];
                for (int32_t j = j0; j < j1; ++j) {   /* keys in order, per output dim */
                    const double p = s[j];
                    const double *v = w->kv + (size_t)(j - t0) * ld + x->d_qk + d0;
                    a0 += p * v[0]; a1 += p * v[1]; a2 += p * v[2]; a3 += p * v[3];
                    a4 += p * v[4]; a5 += p * v[5]; a6 += p * v[6]; a7 += p * v[7];
                }
                acc[d0] = a0; acc[d0 + 1] = a1; acc[d0 + 2] = a2; acc[d0 + 3] = a3;
                acc[d0 + 4] = a4; acc[d0 + 5] = a5; acc[d0 + 6] = a6; acc[d0 + 7] = a7;
            }
        }
    }
    for (int32_t i = 0; i < n; ++i) {
        const int32_t tok = r->q_offset + w->row_q[i], h = w->row_h[i];
        if (w->m[i] == -INFINITY) {   /* no key of weight > 0 and no sink (or a -inf one) */
            store_row(x, tok, h, NULL, 0.0, -INFINITY);
            continue;
        }
        /* den summed in key order over the stored p_j */
        double den = a->sinks ? exp((double)a->sinks[h] - w->m[i]) : 0.0;
        const double *s = w->s + (size_t)i * x->max_kv;
        for (int32_t j = w->lo[i]; j < w->hi[i]; ++j) den += s[j];
        store_row(x, tok, h, w->acc + (size_t)i * g->d_vo, x->bmm2 / den, w->m[i] + log(den));
    }
}

/* Key `slot` (a flat KV slot: page slot / page_size, offset slot % page_size) as fp64:
 * ckv (512) ++ kpe (64). */
static void load_slot(const naive_run *x, int32_t slot, double *row) {
    const fi_cpu_geom *g = x->g;
    const fi_attn_args *a = x->a;
    const int32_t page = slot / g->page_size, off = slot % g->page_size;
    for (int32_t d = 0; d < g->d_main; ++d)
        row[d] = fi_elem_load(&a->k, fi_off4(&a->k, page, off, 0, d));
    for (int32_t d = 0; d < g->d_rope; ++d)
        row[g->d_main + d] = fi_elem_load(&a->k_rope, fi_off4(&a->k_rope, page, off, 0, d));
}

/* One head h of query token `tok` over its n keys kv [n][d_qk] (MLA: v_j = the first d_vo
 * dims of k_j): the two-pass softmax of the header, sums in key order.  p, q, acc:
 * scratch [n], [d_qk], [d_vo]. */
static void sparse_row(const naive_run *x, int32_t tok, int32_t h, const double *kv, int32_t n,
                       double *p, double *q, double *acc) {
    const fi_cpu_geom *g = x->g;
    const fi_attn_args *a = x->a;
    for (int32_t d = 0; d < g->d_main; ++d)
        q[d] = fi_elem_load(&a->q, fi_off3(&a->q, tok, h, d));
    for (int32_t d = 0; d < g->d_rope; ++d)
        q[g->d_main + d] = fi_elem_load(&a->q_rope, fi_off3(&a->q_rope, tok, h, d));
    double m = a->sinks ? (double)a->sinks[h] : -INFINITY;
    for (int32_t j = 0; j < n; ++j) {
        double dot = 0.0;
        for (int32_t d = 0; d < x->d_qk; ++d) dot += q[d] * kv[(size_t)j * x->d_qk + d];
        p[j] = x->bmm1 * dot;
        m = fi_max_nan_d(p[j], m);
    }
    if (m == -INFINITY) {   /* no key of weight > 0 and no sink (or a -inf one) */
        store_row(x, tok, h, NULL, 0.0, -INFINITY);
        return;
    }
    double den = a->sinks ? exp((double)a->sinks[h] - m) : 0.0;
    for (int32_t j = 0; j < n; ++j) {
        p[j] = exp(p[j] - m);
        den += p[j];
    }
    for (int32_t d = 0; d < g->d_vo; ++d) {
        double s = 0.0;
        for (int32_t j = 0; j < n; ++j) s += p[j] * kv[(size_t)j * x->d_qk + d];
        acc[d] = s;
    }
    store_row(x, tok, h, acc, x->bmm2 / den, m + log(den));
}

/* A sparse top-k batch (caps.sparse_top_k = K > 0, validated), straight from its arrays:
 * query token (b, i) is row r = b * q_len + i of q / out / lse and of the [B * q_len, K]
 * table, and its keys are exactly the table row's non-negative slots, in order (a slot
 * listed twice is two keys; -1 is none): no causal rule, no window, seq_lens unused. */
static fi_status naive_sparse(const naive_run *x, const fi_batch *batch, int32_t K) {
    const fi_cpu_geom *g = x->g;
    double *kv = malloc(sizeof(double) * (size_t)K * (size_t)x->d_qk);
    double *p = malloc(sizeof(double) * (size_t)K);
    double *q = malloc(sizeof(double) * (size_t)x->d_qk);
    double *acc = malloc(sizeof(double) * (size_t)g->d_vo);
    const fi_status st = kv && p && q && acc ? FI_OK : FI_ERR_OUT_OF_MEMORY;
    const int32_t tokens = st == FI_OK ? batch->batch_size * batch->q_len_per_request : 0;
    for (int32_t r = 0; r < tokens; ++r) {
        const int32_t *slots = batch->block_tables + (int64_t)r * K;
        int32_t n = 0;
        for (int32_t t = 0; t < K; ++t)
            if (slots[t] >= 0) load_slot(x, slots[t], kv + (size_t)n++ * x->d_qk);
        for (int32_t h = 0; h < g->num_qo_heads; ++h) sparse_row(x, r, h, kv, n, p, q, acc);
    }
    free(kv);
    free(p);
    free(q);
    free(acc);
    return st;
}

fi_status fi_naive_attention(const fi_caps *caps, const fi_batch *batch,
                             const fi_attn_args *args) {
    if (!caps || !batch || !args) return FI_ERR_NULL_ARGUMENT;
    fi_status st = fi_caps_validate(caps);
    if (st != FI_OK) return st;

    /* Validation needs room for every request a batch of these caps may have (it rejects
     * more): max_batch, or one per query token for a sparse plan. */
    fi_request_info *req = malloc(sizeof(*req) * (size_t)fi_layout_max_requests(caps));
    if (!req) return FI_ERR_OUT_OF_MEMORY;
    int32_t q_tokens = 0;
    fi_error_detail err;
    fi_cpu_geom g;
    st = fi_batch_validate(caps, batch, req, &q_tokens, &err);
    if (st == FI_OK) st = fi_cpu_check_args(caps, args, q_tokens, &g);
    if (st == FI_OK) {
        const fi_page_table_geom pt = fi_page_table_geom_of(caps, batch, req);
        st = fi_check_page_table_geom(&pt, &args->page_table);
    }
    if (st != FI_OK) {
        free(req);
        return st;
    }

    const size_t d_qk = (size_t)(g.d_main + g.d_rope);
    naive_run x = {
        .g = &g,
        .a = args,
        .page_table = (const int32_t *)args->page_table.data,
        .v_row_offset = (batch->form != FI_FORM_INDPTR && batch->kv_split_pages)
                            ? batch->max_pages_per_seq : 0,
        .d_qk = (int32_t)d_qk,
        .max_kv = 1,
        .bmm1 = fi_cpu_bmm1_scale(args),
        .bmm2 = fi_cpu_bmm2_scale(args),
    };
    if (caps->sparse_top_k > 0) {
        free(req);
        return naive_sparse(&x, batch, caps->sparse_top_k);
    }
    for (int32_t b = 0; b < batch->batch_size; ++b)
        if (req[b].kv_len > x.max_kv) x.max_kv = req[b].kv_len;
    naive_scratch w = {0};
    w.qt = malloc(sizeof(double) * NAIVE_ROWS * d_qk);
    w.dot = malloc(sizeof(double) * NAIVE_ROWS);
    w.s = malloc(sizeof(double) * NAIVE_ROWS * (size_t)x.max_kv);
    w.kv = malloc(sizeof(double) * NAIVE_KEYS * (d_qk + (size_t)g.d_vo));
    w.acc = malloc(sizeof(double) * NAIVE_ROWS * (size_t)g.d_vo);
    w.m = malloc(sizeof(double) * NAIVE_ROWS);
    w.row_q = malloc(sizeof(int32_t) * 4 * NAIVE_ROWS);
    if (!w.qt || !w.dot || !w.s || !w.kv || !w.acc || !w.m || !w.row_q) {
        st = FI_ERR_OUT_OF_MEMORY;
        goto done;
    }
    w.row_h = w.row_q + NAIVE_ROWS;
    w.lo = w.row_h + NAIVE_ROWS;
    w.hi = w.lo + NAIVE_ROWS;

    /* rows (i, h) of each request and KV head, in blocks of NAIVE_ROWS */
    for (int32_t b = 0; b < batch->batch_size; ++b) {
        const fi_request_info *r = &req[b];
        for (int32_t kvh = 0; kvh < g.num_kv_heads; ++kvh) {
            int32_t n = 0;
            for (int32_t i = 0; i < r->q_len; ++i) {
                for (int32_t h = kvh * g.group; h < (kvh + 1) * g.group; ++h) {
                    w.row_q[n] = i;
                    w.row_h[n] = h;
                    fi_row_kv_range(batch->causal, batch->window_left, r->q_len, r->kv_len, i,
                                    &w.lo[n], &w.hi[n]);
                    if (++n == NAIVE_ROWS) {
                        naive_rows(&x, r, kvh, n, &w);
                        n = 0;
                    }
                }
            }
            if (n > 0) naive_rows(&x, r, kvh, n, &w);
        }
    }
done:
    free(w.qt);
    free(w.dot);
    free(w.s);
    free(w.kv);
    free(w.acc);
    free(w.m);
    free(w.row_q);
    free(req);
    return st;
}
