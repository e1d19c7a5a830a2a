/*
 * executor/cpu/ref_run.c - fi_ref_run: the CPU reference executor.
 *
 * Runs the plan's host view exactly as the persistent GPU executor does, in fp32:
 *   for CTA c = 0 .. num_ctas-1, for item in work_indptr[c] .. work_indptr[c+1]-1:
 *     load the tile's Q rows (q-major local rows, fiattn_work.h), then walk its keys
 *     [kv_begin, kv_end) in blocks of FI_REF_KV_BLOCK tokens with the online softmax of
 *     FlashAttention-2 (Dao 2023): per row a running max m, denominator l and unnormalised
 *     accumulator acc, rescaled by exp(m_old - m_new) when the max grows; each row is
 *     masked to its own causal / window range (plan/mask.h fi_row_kv_range).
 *     Unsplit item: out = bmm2_scale * acc / (l + exp(sink - m)), lse = log of that
 *       denominator (unshifted).
 *     Split item: partial O = acc / l, partial lse = m + log(l) (keys only) -> its slot.
 *   then every merge group, partials combined in split order (fiattn_run.h formula).
 * Sparse plans (caps.sparse_top_k > 0): a request is one query token and its keys
 * [0, K) are the slots of its table row (page_table[page_row_offset + t]: page = slot /
 * page_size, offset = slot % page_size); a negative slot is no key: nothing is loaded and
 * its logit is -inf before the softmax sees it (weight exactly 0, V never read).
 * Agreement with fi_naive_attention proves the partition, the per-row masking and the
 * merge without a GPU.
 */
#include <math.h>
#include <string.h>

#include "executor/core/args.h"
#include "executor/cpu/ref_common.h"
#include "fiattn_ref.h"
#include "plan/host_alloc.h"
#include "plan/plan.h"

/* Keys per inner block: the executor's KV tile. */
#define FI_REF_KV_BLOCK 64

typedef struct ref_ctx {
    const fi_plan_view *view;
    const fi_cpu_geom *g;
    const fi_attn_args *a;
    const int32_t *page_table;
    int32_t v_row_offset;   /* header.pages_per_row for a [B, 2, P] table, else 0 */
    int32_t sparse;         /* 1: caps.sparse_top_k > 0, key t = slot page_table[row + t] */
    unsigned char present[FI_REF_KV_BLOCK]; /* sparse: key j of the block has a slot */
    float bmm1, bmm2;
    int32_t tile_rows, d_qk;
    /* scratch, carved from one allocation */
    float *partial_o;       /* [num_slots][tile_rows][d_vo] */
    float *partial_lse;     /* [num_slots][tile_rows] */
    float *q_tile;          /* [tile_rows][d_qk]  (MLA: nope 512 ++ rope 64) */
    float *k_blk;           /* [FI_REF_KV_BLOCK][d_qk] */
    float *v_blk;           /* [FI_REF_KV_BLOCK][d_vo] (MLA: unused, V = first 512 of k_blk) */
    float *acc;             /* [tile_rows][d_vo] */
    float *m, *l;           /* [tile_rows] running max / denominator */
    int32_t *lo, *hi;       /* [tile_rows] row's key range within the item */
} ref_ctx;

/* Every index the executor would trust, checked before anything is written: a planner
 * bug must fail loudly here, not read out of bounds. */
static fi_status check_plan(const fi_plan_view *v, int32_t d_tile_rows, int32_t num_heads) {
    const fi_plan_header *hd = v->header;
    if (v->work_indptr[0] != 0 || v->work_indptr[v->num_ctas] != hd->num_items)
        return FI_ERR_PLAN_OVER_CAPS;
    for (int32_t c = 0; c < v->num_ctas; ++c)
        if (v->work_indptr[c + 1] < v->work_indptr[c]) return FI_ERR_PLAN_OVER_CAPS;
    for (int32_t i = 0; i < hd->num_items; ++i) {
        const fi_work_item *it = &v->items[i];
        if (it->request < 0 || it->request >= hd->batch_size) return FI_ERR_PLAN_OVER_CAPS;
        const fi_request_info *r = &v->requests[it->request];
        const int64_t rows = (int64_t)(it->q_end - it->q_begin) * (it->head_end - it->head_begin);
        if (it->q_begin < 0 || it->q_end > r->q_len || it->q_end <= it->q_begin ||
            it->head_begin < 0 || it->head_end <= it->head_begin || it->head_end > num_heads ||
            rows > d_tile_rows ||
            it->kv_begin < 0 || it->kv_end > r->kv_len || it->kv_end < it->kv_begin ||
            it->out_slot >= hd->num_slots || (it->out_slot >= 0) != (it->merge_group >= 0) ||
            it->merge_group >= hd->num_groups)
            return FI_ERR_PLAN_OVER_CAPS;
    }
    for (int32_t gi = 0; gi < hd->num_groups; ++gi) {
        const fi_merge_group *gr = &v->groups[gi];
        if (gr->request < 0 || gr->request >= hd->batch_size || gr->num_splits < 1 ||
            gr->head_begin < 0 || gr->head_end > num_heads || gr->q_begin < 0 ||
            gr->q_end > v->requests[gr->request].q_len ||
            gr->first_slot < 0 || gr->first_slot + gr->num_splits > hd->num_slots ||
            (int64_t)(gr->q_end - gr->q_begin) * (gr->head_end - gr->head_begin) > d_tile_rows)
            return FI_ERR_PLAN_OVER_CAPS;
    }
    return FI_OK;
}

/* Page and in-page slot of key t of request r; 0 when a sparse row lists no key there. */
static int key_location(const ref_ctx *x, const fi_request_info *r, int32_t t, int32_t *page,
                        int32_t *slot) {
    const int32_t ps = x->g->page_size;
    if (x->sparse) {
        const int32_t e = x->page_table[r->page_row_offset + t];
        *page = e / ps;
        *slot = e % ps;
        return e >= 0;
    }
    *page = fi_kv_page(x->page_table, r->page_row_offset, ps, t);
    *slot = t % ps;
    return 1;
}

/* Load KV tokens [t0, t0 + n) of request r, KV head kvh, into k_blk / v_blk (fp32); an
 * absent sparse key gets zeros and present[j] = 0. */
static void load_kv_block(ref_ctx *x, const fi_request_info *r, int32_t kvh, int32_t t0,
                          int32_t n) {
    const fi_cpu_geom *g = x->g;
    const fi_attn_args *a = x->a;
    for (int32_t j = 0; j < n; ++j) {
        const int32_t t = t0 + j;
        int32_t kp, slot;
        float *kr = x->k_blk + (size_t)j * x->d_qk;
        x->present[j] = (unsigned char)key_location(x, r, t, &kp, &slot);
        if (!x->present[j]) { /* sparse only, so MLA: V is this row */
            memset(kr, 0, sizeof(float) * (size_t)x->d_qk);
            continue;
        }
        fi_row_load(&a->k, fi_off4(&a->k, kp, slot, kvh, 0), g->d_main, kr);
        if (g->mla) {
            fi_row_load(&a->k_rope, fi_off4(&a->k_rope, kp, slot, 0, 0), g->d_rope, kr + g->d_main);
        } else {
            const int32_t vp = fi_kv_page(x->page_table, r->page_row_offset + x->v_row_offset,
                                          g->page_size, t);
            fi_row_load(&a->v, fi_off4(&a->v, vp, slot, kvh, 0), g->d_vo,
                        x->v_blk + (size_t)j * g->d_vo);
        }
    }
}

/* s[j - t0] = bmm1 * (q . k_j) for keys j in [jlo, jhi); four keys at a time so the
 * partial sums stay in registers, each dot still summed in d order. */
static void row_logits(const ref_ctx *x, const float *q, int32_t t0, int32_t jlo, int32_t jhi,
                       float *s) {
    const size_t ld = (size_t)x->d_qk;
    int32_t j = jlo;
    for (; j + 4 <= jhi; j += 4) {
        const float *k0 = x->k_blk + (size_t)(j - t0) * ld;
        const float *k1 = k0 + ld, *k2 = k1 + ld, *k3 = k2 + ld;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        for (int32_t d = 0; d < x->d_qk; ++d) {
            a0 += q[d] * k0[d];
            a1 += q[d] * k1[d];
            a2 += q[d] * k2[d];
            a3 += q[d] * k3[d];
        }
        s[j - t0] = x->bmm1 * a0;
        s[j + 1 - t0] = x->bmm1 * a1;
        s[j + 2 - t0] = x->bmm1 * a2;
        s[j + 3 - t0] = x->bmm1 * a3;
    }
    for (; j < jhi; ++j) {
        const float *k = x->k_blk + (size_t)(j - t0) * ld;
        float a = 0.0f;
        for (int32_t d = 0; d < x->d_qk; ++d) a += q[d] * k[d];
        s[j - t0] = x->bmm1 * a;
    }
}

/* Online-softmax update of local row lr with block keys [t0, t0 + n), masked to the row:
 *   m_new = max(m, max_j s_j);  l = l e^(m - m_new) + sum_j e^(s_j - m_new);
 *   acc = acc e^(m - m_new) + sum_j e^(s_j - m_new) v_j   (keys in order per dim).
 * Non-finite values (fiattn_run.h): the max keeps a NaN logit, so l and acc turn NaN; a
 * +inf logit gives e^(inf - inf) = NaN; while every logit so far is -inf (m_new = -inf)
 * the weights are exactly 0 and acc is kept as it is (rescale 1), not e^(-inf + inf). */
static void update_row(ref_ctx *x, int32_t lr, int32_t t0, int32_t n) {
    const int32_t jlo = x->lo[lr] > t0 ? x->lo[lr] : t0;
    const int32_t jhi = x->hi[lr] < t0 + n ? x->hi[lr] : t0 + n;
    if (jlo >= jhi) return;
    const int32_t d_vo = x->g->d_vo;
    const float *vb = x->g->mla ? x->k_blk : x->v_blk;
    const size_t v_ld = x->g->mla ? (size_t)x->d_qk : (size_t)d_vo;
    float s[FI_REF_KV_BLOCK] = {0};
    row_logits(x, x->q_tile + (size_t)lr * x->d_qk, t0, jlo, jhi, s);
    for (int32_t j = jlo; x->sparse && j < jhi; ++j) /* no key: weight 0, even for NaN q */
        if (!x->present[j - t0]) s[j - t0] = -INFINITY;
    float bm = -INFINITY;
    for (int32_t j = jlo; j < jhi; ++j) bm = fi_max_nan_f(s[j - t0], bm);
    const float m_new = fi_max_nan_f(bm, x->m[lr]);
    const int none = m_new == -INFINITY;   /* every logit so far -inf: weights 0 */
    const float shift = none ? 0.0f : m_new;
    const float rescale = none ? 1.0f : expf(x->m[lr] - m_new); /* 0 on the first block */
    float l = x->l[lr] * rescale;
    for (int32_t j = jlo; j < jhi; ++j) {
        s[j - t0] = expf(s[j - t0] - shift);
        l += s[j - t0];
    }
    float *acc = x->acc + (size_t)lr * d_vo;
    for (int32_t d0 = 0; d0 < d_vo; d0 += 4) {   /* d_vo % 64 == 0; 4 dims in registers */
        float a0 = acc[d0] * rescale, a1 = acc[d0 + 1] * rescale;
        float a2 = acc[d0 + 2] * rescale, a3 = acc[d0 + 3] * rescale;
        for (int32_t j = jlo; j < jhi; ++j) {
            const float p = s[j - t0];
            const float *v = vb + (size_t)(j - t0) * v_ld + d0;
            a0 += p * v[0];
            a1 += p * v[1];
            a2 += p * v[2];
            a3 += p * v[3];
        }
        acc[d0] = a0;
        acc[d0 + 1] = a1;
        acc[d0 + 2] = a2;
        acc[d0 + 3] = a3;
    }
    x->m[lr] = m_new;
    x->l[lr] = l;
}

/* Final output row: out = scale * o_row, lse; o_row NULL writes zeros. */
static void store_final(const ref_ctx *x, int32_t tok, int32_t h, const float *o_row,
                        float scale, float lse) {
    const fi_tensor *o = &x->a->out;
    for (int32_t d = 0; d < x->g->d_vo; ++d)
        fi_elem_store(o, fi_off3(o, tok, h, d), o_row ? o_row[d] * scale : 0.0f);
    if (x->a->lse.data) ((float *)x->a->lse.data)[fi_off2(&x->a->lse, tok, h)] = lse;
}

/* Finish local row lr of an item: final output (unsplit) or partial slot (split).
 * m = -inf means no key of weight > 0 (none in range, or all logits -inf): l = 0 then.
 * A NaN m / l (NaN or +inf logit) flows into out and lse (fiattn_run.h). */
static void finish_row(ref_ctx *x, const fi_work_item *it, int32_t lr, int32_t tok, int32_t h) {
    const float m = x->m[lr], l = x->l[lr];
    const float *acc = x->acc + (size_t)lr * x->g->d_vo;
    if (it->out_slot >= 0) {   /* keys-only partial: O / l and m + log(l); -inf if none */
        const size_t row = (size_t)it->out_slot * x->tile_rows + lr;
        float *po = x->partial_o + row * x->g->d_vo;
        const float inv = m == -INFINITY ? 0.0f : 1.0f / l;
        for (int32_t d = 0; d < x->g->d_vo; ++d) po[d] = acc[d] * inv;
        x->partial_lse[row] = m == -INFINITY ? -INFINITY : m + logf(l);
        return;
    }
    /* den = l e^m + e^sink, shifted by M = max(m, sink) */
    const float sk = x->a->sinks ? x->a->sinks[h] : -INFINITY;
    const float mm = fi_max_nan_f(m, sk);
    if (mm == -INFINITY) {   /* an empty row: no key of weight > 0, no sink */
        store_final(x, tok, h, NULL, 0.0f, -INFINITY);
        return;
    }
    const float wk = m == -INFINITY ? 0.0f : expf(m - mm);   /* e^(m - M) */
    const float den = l * wk + (x->a->sinks ? expf(sk - mm) : 0.0f);
    store_final(x, tok, h, acc, x->bmm2 * wk / den, mm + logf(den));
}

static void run_item(ref_ctx *x, const fi_work_item *it) {
    const fi_plan_header *hd = x->view->header;
    const fi_request_info *r = &x->view->requests[it->request];
    const fi_cpu_geom *g = x->g;
    const int32_t nh = it->head_end - it->head_begin;
    const int32_t rows = (it->q_end - it->q_begin) * nh;
    const int32_t kvh = it->head_begin / g->group;
    for (int32_t lr = 0; lr < rows; ++lr) {
        const int32_t i = it->q_begin + lr / nh, h = it->head_begin + lr % nh;
        const int32_t tok = r->q_offset + i;
        float *q = x->q_tile + (size_t)lr * x->d_qk;
        fi_row_load(&x->a->q, fi_off3(&x->a->q, tok, h, 0), g->d_main, q);
        if (g->mla) fi_row_load(&x->a->q_rope, fi_off3(&x->a->q_rope, tok, h, 0), g->d_rope,
                                q + g->d_main);
        int32_t lo, hi;
        fi_row_kv_range(hd->causal, hd->window_left, r->q_len, r->kv_len, i, &lo, &hi);
        x->lo[lr] = lo > it->kv_begin ? lo : it->kv_begin;
        x->hi[lr] = hi < it->kv_end ? hi : it->kv_end;
        x->m[lr] = -INFINITY;
        x->l[lr] = 0.0f;
        memset(x->acc + (size_t)lr * g->d_vo, 0, sizeof(float) * (size_t)g->d_vo);
    }
    for (int32_t t0 = it->kv_begin; t0 < it->kv_end; t0 += FI_REF_KV_BLOCK) {
        const int32_t n = it->kv_end - t0 < FI_REF_KV_BLOCK ? it->kv_end - t0 : FI_REF_KV_BLOCK;
        load_kv_block(x, r, kvh, t0, n);
        for (int32_t lr = 0; lr < rows; ++lr) update_row(x, lr, t0, n);
    }
    for (int32_t lr = 0; lr < rows; ++lr)
        finish_row(x, it, lr, r->q_offset + it->q_begin + lr / nh, it->head_begin + lr % nh);
}

/* Merge one group's partials in split order:
 *   den = sum_i exp(lse_i) + exp(sink);  out = bmm2 * sum_i exp(lse_i) O_i / den;
 *   lse = log(den), everything shifted by M = max(max_i lse_i, sink). */
static void merge_group(ref_ctx *x, const fi_merge_group *gr) {
    const fi_request_info *r = &x->view->requests[gr->request];
    const int32_t nh = gr->head_end - gr->head_begin;
    const int32_t rows = (gr->q_end - gr->q_begin) * nh;
    const int32_t d_vo = x->g->d_vo;
    float *out_row = x->acc;   /* reuse: [d_vo] */
    for (int32_t lr = 0; lr < rows; ++lr) {
        const int32_t tok = r->q_offset + gr->q_begin + lr / nh, h = gr->head_begin + lr % nh;
        float mm = x->a->sinks ? x->a->sinks[h] : -INFINITY;
        for (int32_t s = 0; s < gr->num_splits; ++s) {   /* a NaN lse / sink is kept */
            const float ls = x->partial_lse[(size_t)(gr->first_slot + s) * x->tile_rows + lr];
            mm = fi_max_nan_f(ls, mm);
        }
        if (mm == -INFINITY) {   /* no key of weight > 0 in any split, no sink */
            store_final(x, tok, h, NULL, 0.0f, -INFINITY);
            continue;
        }
        float den = x->a->sinks ? expf(x->a->sinks[h] - mm) : 0.0f;
        memset(out_row, 0, sizeof(float) * (size_t)d_vo);
        for (int32_t s = 0; s < gr->num_splits; ++s) {
            const size_t row = (size_t)(gr->first_slot + s) * x->tile_rows + lr;
            /* 0 for a split without weight (its O is 0, or NaN from a NaN V: kept) */
            const float w = expf(x->partial_lse[row] - mm);
            const float *po = x->partial_o + row * d_vo;
            den += w;
            for (int32_t d = 0; d < d_vo; ++d) out_row[d] += w * po[d];
        }
        store_final(x, tok, h, out_row, x->bmm2 / den, mm + logf(den));
    }
}

fi_status fi_ref_run(const fi_plan *plan, const fi_attn_args *args) {
    if (!plan || !args) return FI_ERR_NULL_ARGUMENT;
    fi_plan_view view;
    fi_status st = fi_plan_get_view(plan, &view);
    if (st != FI_OK) return st;
    const fi_plan_header *hd = view.header;
    fi_cpu_geom g;
    st = fi_cpu_check_args(&plan->caps, args, hd->total_q_tokens, &g);
    if (st == FI_OK) st = fi_check_page_table(plan, &args->page_table);
    if (st != FI_OK) return st;
    st = check_plan(&view, hd->tile_rows, g.num_qo_heads);
    if (st != FI_OK) return st;

    ref_ctx x = {
        .view = &view,
        .g = &g,
        .a = args,
        .page_table = (const int32_t *)args->page_table.data,
        .v_row_offset = hd->kv_split_pages ? hd->pages_per_row : 0,
        .sparse = plan->caps.sparse_top_k > 0,
        .bmm1 = fi_cpu_bmm1_scale(args),
        .bmm2 = fi_cpu_bmm2_scale(args),
        .tile_rows = hd->tile_rows,
        .d_qk = g.d_main + g.d_rope,
    };
    const size_t tr = (size_t)hd->tile_rows, slots = (size_t)hd->num_slots;
    const size_t n_f = slots * tr * g.d_vo + slots * tr + tr * x.d_qk +
                       (size_t)FI_REF_KV_BLOCK * (x.d_qk + g.d_vo) + tr * g.d_vo + 2 * tr;
    const size_t bytes = sizeof(float) * n_f + sizeof(int32_t) * 2 * tr;
    void *base = fi_host_alloc(&plan->alloc, bytes, 64);
    if (!base) return FI_ERR_OUT_OF_MEMORY;
    float *p = base;
    x.partial_o = p;   p += slots * tr * g.d_vo;
    x.partial_lse = p; p += slots * tr;
    x.q_tile = p;      p += tr * x.d_qk;
    x.k_blk = p;       p += (size_t)FI_REF_KV_BLOCK * x.d_qk;
    x.v_blk = p;       p += (size_t)FI_REF_KV_BLOCK * g.d_vo;
    x.acc = p;         p += tr * g.d_vo;
    x.m = p;           p += tr;
    x.l = p;           p += tr;
    x.lo = (int32_t *)((unsigned char *)base + sizeof(float) * n_f);
    x.hi = x.lo + tr;

    for (int32_t c = 0; c < view.num_ctas; ++c)
        for (int32_t i = view.work_indptr[c]; i < view.work_indptr[c + 1]; ++i)
            run_item(&x, &view.items[i]);
    for (int32_t gi = 0; gi < hd->num_groups; ++gi) merge_group(&x, &view.groups[gi]);

    fi_host_free(&plan->alloc, base);
    return FI_OK;
}
