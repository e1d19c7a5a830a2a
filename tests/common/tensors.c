/* tests/common/tensors.c - host tensors and attention arguments for tests (tensors.h). */
#include "tensors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "executor/core/args.h" /* fi_dtype_size */

size_t tt_dtype_size(fi_dtype dtype) { return fi_dtype_size(dtype); }

int tt_tensor_alloc(fi_tensor *t, fi_dtype dtype, int32_t ndim, const int64_t *shape,
                    const int32_t *mem_order) {
    const size_t es = tt_dtype_size(dtype);
    if (!t || !shape || ndim < 1 || ndim > FI_MAX_DIMS || es == 0) return -1;
    fi_tensor r;
    memset(&r, 0, sizeof r);
    r.dtype = dtype;
    r.ndim = ndim;
    int64_t n = 1;
    for (int32_t i = ndim - 1; i >= 0; --i) {   /* innermost memory dim first */
        const int32_t d = mem_order ? mem_order[i] : i;
        if (d < 0 || d >= ndim || shape[d] < 0) return -1;
        r.shape[d] = shape[d];
        r.stride[d] = n;
        n *= shape[d];
    }
    const size_t bytes = ((size_t)(n > 0 ? n : 1) * es + 63) / 64 * 64;
    r.data = aligned_alloc(64, bytes);
    if (!r.data) return -1;
    memset(r.data, 0, bytes);
    *t = r;
    return 0;
}

int tt_tensor_alloc_like(fi_tensor *t, const fi_tensor *src) {
    return tt_tensor_alloc(t, src->dtype, src->ndim, src->shape, NULL);
}

void tt_tensor_free(fi_tensor *t) {
    if (!t) return;
    free(t->data);
    memset(t, 0, sizeof *t);
}

fi_tensor tt_tensor_view_last(const fi_tensor *src, int64_t begin, int64_t width) {
    fi_tensor v = *src;
    const int32_t last = src->ndim - 1;
    v.data = (char *)src->data + (size_t)(begin * src->stride[last]) * tt_dtype_size(src->dtype);
    v.shape[last] = width;
    return v;
}

int64_t tt_tensor_numel(const fi_tensor *t) {
    int64_t n = 1;
    for (int32_t i = 0; i < t->ndim; ++i) n *= t->shape[i];
    return n;
}

int64_t tt_tensor_offset(const fi_tensor *t, const int64_t *idx) {
    int64_t off = 0;
    for (int32_t i = 0; i < t->ndim; ++i) off += idx[i] * t->stride[i];
    return off;
}

static double load_at(const fi_tensor *t, int64_t off) {
    switch (t->dtype) {
    case FI_DTYPE_F32: return ((const float *)t->data)[off];
    case FI_DTYPE_F16: return fi_f16_to_f32(((const uint16_t *)t->data)[off]);
    case FI_DTYPE_BF16: return fi_bf16_to_f32(((const uint16_t *)t->data)[off]);
    case FI_DTYPE_I32: return ((const int32_t *)t->data)[off];
    default: return NAN;
    }
}

static void store_at(fi_tensor *t, int64_t off, double v) {
    switch (t->dtype) {
    case FI_DTYPE_F32: ((float *)t->data)[off] = (float)v; break;
    case FI_DTYPE_F16: ((uint16_t *)t->data)[off] = fi_f32_to_f16_rne((float)v); break;
    case FI_DTYPE_BF16: ((uint16_t *)t->data)[off] = fi_f32_to_bf16_rne((float)v); break;
    case FI_DTYPE_I32: ((int32_t *)t->data)[off] = isnan(v) ? 0x7fffffff : (int32_t)v; break;
    default: break;
    }
}

double tt_tensor_get(const fi_tensor *t, const int64_t *idx) {
    return load_at(t, tt_tensor_offset(t, idx));
}

void tt_tensor_set(fi_tensor *t, const int64_t *idx, double v) {
    store_at(t, tt_tensor_offset(t, idx), v);
}

/* Visit the element offsets of rows [0, rows) of t (all logical elements: rows = shape[0])
 * in logical row-major order.  Returns 0 when done. */
typedef struct nd_iter {
    int64_t idx[FI_MAX_DIMS];
    int64_t rows;
    int32_t done;
} nd_iter;

static nd_iter iter_begin(const fi_tensor *t, int64_t rows) {
    nd_iter it;
    memset(&it, 0, sizeof it);
    it.rows = rows < t->shape[0] ? rows : t->shape[0];
    it.done = it.rows <= 0;
    for (int32_t i = 1; i < t->ndim; ++i)
        if (t->shape[i] <= 0) it.done = 1;
    return it;
}

static void iter_next(const fi_tensor *t, nd_iter *it) {
    for (int32_t i = t->ndim - 1; i >= 0; --i) {
        const int64_t lim = i == 0 ? it->rows : t->shape[i];
        if (++it->idx[i] < lim) return;
        it->idx[i] = 0;
    }
    it->done = 1;
}

void tt_tensor_fill_random(fi_tensor *t, tt_rng *rng, float amplitude) {
    for (nd_iter it = iter_begin(t, t->shape[0]); !it.done; iter_next(t, &it))
        store_at(t, tt_tensor_offset(t, it.idx), (double)(tt_rng_float(rng) * amplitude));
}

void tt_tensor_poison(fi_tensor *t) {
    for (nd_iter it = iter_begin(t, t->shape[0]); !it.done; iter_next(t, &it))
        store_at(t, tt_tensor_offset(t, it.idx), NAN);
}

int tt_tensor_convert(fi_tensor *dst, const fi_tensor *src) {
    if (dst->ndim != src->ndim) return -1;
    for (int32_t i = 0; i < src->ndim; ++i)
        if (dst->shape[i] != src->shape[i]) return -1;
    for (nd_iter it = iter_begin(src, src->shape[0]); !it.done; iter_next(src, &it))
        tt_tensor_set(dst, it.idx, tt_tensor_get(src, it.idx));
    return 0;
}

int64_t tt_tensor_count_nan(const fi_tensor *t, int64_t rows) {
    int64_t n = 0;
    for (nd_iter it = iter_begin(t, rows); !it.done; iter_next(t, &it))
        n += isnan(tt_tensor_get(t, it.idx)) ? 1 : 0;
    return n;
}

int64_t tt_tensor_count_nonfinite(const fi_tensor *t, int64_t rows) {
    int64_t n = 0;
    for (nd_iter it = iter_begin(t, rows); !it.done; iter_next(t, &it))
        n += isfinite(tt_tensor_get(t, it.idx)) ? 0 : 1;
    return n;
}

int64_t tt_tensor_compare(const fi_tensor *a, const fi_tensor *b, int64_t rows,
                          double *rel_err) {
    double num = 0.0, den = 0.0;
    int64_t mismatches = 0;
    for (nd_iter it = iter_begin(b, rows); !it.done; iter_next(b, &it)) {
        const double x = tt_tensor_get(a, it.idx), y = tt_tensor_get(b, it.idx);
        if (!isfinite(x) || !isfinite(y)) {
            /* same non-finite value in both (NaN never equals: always a mismatch) */
            mismatches += (x == y) ? 0 : 1;
            continue;
        }
        num += (x - y) * (x - y);
        den += y * y;
    }
    if (rel_err)
        *rel_err = den > 0.0 ? sqrt(num / den) : (num > 0.0 ? INFINITY : 0.0);
    return mismatches;
}

/* ---- attention arguments --------------------------------------------------------------- */

int32_t tt_test_batch_q_tokens(const fi_batch *batch) {
    const int32_t B = batch->batch_size;
    switch (batch->form) {
    case FI_FORM_BLOCK_TABLES: return B * batch->q_len_per_request;
    case FI_FORM_INDPTR: return batch->qo_indptr ? batch->qo_indptr[B] : -1;
    case FI_FORM_CUM_SEQ_LENS: return batch->cum_seq_lens_q ? batch->cum_seq_lens_q[B] : -1;
    default: return -1;
    }
}

/* The batch's page table as an I32 tensor view (no copy). */
static fi_tensor page_table_view(const fi_batch *batch) {
    fi_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = FI_DTYPE_I32;
    if (batch->form == FI_FORM_INDPTR) {
        t.data = (void *)batch->kv_indices;
        t.ndim = 1;
        t.shape[0] = batch->kv_indptr ? batch->kv_indptr[batch->batch_size] : 0;
        t.stride[0] = 1;
    } else if (batch->kv_split_pages) {   /* [B, 2, P] */
        t.data = (void *)batch->block_tables;
        t.ndim = 3;
        t.shape[0] = batch->batch_size;
        t.shape[1] = 2;
        t.shape[2] = batch->max_pages_per_seq;
        t.stride[0] = 2 * (int64_t)batch->max_pages_per_seq;
        t.stride[1] = batch->max_pages_per_seq;
        t.stride[2] = 1;
    } else {                               /* [B, P] */
        t.data = (void *)batch->block_tables;
        t.ndim = 2;
        t.shape[0] = batch->batch_size;
        t.shape[1] = batch->max_pages_per_seq;
        t.stride[0] = batch->max_pages_per_seq;
        t.stride[1] = 1;
    }
    return t;
}

fi_caps tt_test_caps(fi_kind kind, int32_t H_q, int32_t H_kv, int32_t D, int32_t page_size,
                     int32_t num_pages, int32_t max_batch, int32_t max_q_tokens) {
    fi_caps c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.max_batch = max_batch;
    c.max_q_tokens = max_q_tokens;
    c.num_pages = num_pages;
    c.page_size = page_size;
    c.num_qo_heads = H_q;
    c.num_kv_heads = H_kv;
    c.head_dim_qk = kind == FI_KIND_MLA_DECODE ? 576 : D;
    c.head_dim_vo = kind == FI_KIND_MLA_DECODE ? 512 : D;
    c.q_dtype = c.kv_dtype = c.o_dtype = FI_DTYPE_F32;
    return c;
}

int tt_test_attn_make(tt_test_attn *ta, const fi_caps *caps, const fi_batch *batch,
                      const fi_test_attn_opts *opts, tt_rng *rng) {
    static const fi_test_attn_opts defaults;
    if (!ta || !caps || !batch || !rng) return -1;
    if (!opts) opts = &defaults;
    memset(ta, 0, sizeof *ta);
    ta->caps = *caps;
    ta->q_tokens = tt_test_batch_q_tokens(batch);
    if (ta->q_tokens < 0) return -1;

    const int mla = caps->kind == FI_KIND_MLA_DECODE;
    const int64_t T = ta->q_tokens, H = caps->num_qo_heads, Hkv = caps->num_kv_heads;
    const int64_t Dqk = caps->head_dim_qk, Dvo = caps->head_dim_vo;
    const float amp = opts->amplitude > 0.0f ? opts->amplitude : 1.0f;
    /* KV memory order: NHD = logical order; HND puts the head dim before the slot dim. */
    static const int32_t hnd_order[4] = {0, 2, 1, 3};
    const int32_t *kv_order = opts->hnd ? hnd_order : NULL;

    const int64_t q_shape[3] = {T, H, Dqk};
    const int64_t k_shape[4] = {caps->num_pages, caps->page_size, Hkv, Dqk};
    const int64_t v_shape[4] = {caps->num_pages, caps->page_size, Hkv, Dvo};
    const int64_t o_shape[3] = {T, H, Dvo};
    const int64_t lse_shape[2] = {T, H};
    fi_attn_args *a = &ta->args;
    if (tt_tensor_alloc(&ta->q_buf, caps->q_dtype, 3, q_shape, NULL) ||
        tt_tensor_alloc(&ta->k_buf, caps->kv_dtype, 4, k_shape, kv_order) ||
        (!mla && tt_tensor_alloc(&ta->v_buf, caps->kv_dtype, 4, v_shape, kv_order)) ||
        tt_tensor_alloc(&a->out, caps->o_dtype, 3, o_shape, NULL) ||
        (!opts->no_lse && tt_tensor_alloc(&a->lse, FI_DTYPE_F32, 2, lse_shape, NULL)))
        goto fail;
    tt_tensor_fill_random(&ta->q_buf, rng, amp);
    tt_tensor_fill_random(&ta->k_buf, rng, amp);
    if (!mla) tt_tensor_fill_random(&ta->v_buf, rng, amp);

    if (mla) {   /* concatenated 576 = 512 (nope / ckv) ++ 64 (pe / kpe) */
        a->q = tt_tensor_view_last(&ta->q_buf, 0, Dvo);
        a->q_rope = tt_tensor_view_last(&ta->q_buf, Dvo, Dqk - Dvo);
        a->k = tt_tensor_view_last(&ta->k_buf, 0, Dvo);
        a->k_rope = tt_tensor_view_last(&ta->k_buf, Dvo, Dqk - Dvo);
    } else {
        a->q = ta->q_buf;
        a->k = ta->k_buf;
        a->v = ta->v_buf;
    }
    a->page_table = page_table_view(batch);

    if (opts->sinks) {
        ta->sinks = malloc(sizeof(float) * (size_t)H);
        if (!ta->sinks) goto fail;
        for (int64_t h = 0; h < H; ++h) ta->sinks[h] = 2.0f * tt_rng_float(rng);
        a->sinks = ta->sinks;
    }
    ta->bmm1_scale = opts->bmm1_scale != 0.0f ? opts->bmm1_scale : (float)(1.0 / sqrt((double)Dqk));
    ta->bmm2_scale = opts->bmm2_scale != 0.0f ? opts->bmm2_scale : 1.0f;
    if (opts->scale_ptrs) {
        a->bmm1_scale_ptr = &ta->bmm1_scale;
        a->bmm2_scale_ptr = &ta->bmm2_scale;
    } else {
        a->bmm1_scale = ta->bmm1_scale;
        a->bmm2_scale = ta->bmm2_scale;
    }
    return 0;
fail:
    tt_test_attn_free(ta);
    return -1;
}

int tt_test_attn_alloc_outputs(const tt_test_attn *ta, fi_tensor *out, fi_tensor *lse) {
    memset(lse, 0, sizeof *lse);
    if (tt_tensor_alloc_like(out, &ta->args.out)) return -1;
    if (ta->args.lse.data && tt_tensor_alloc_like(lse, &ta->args.lse)) {
        tt_tensor_free(out);
        return -1;
    }
    return 0;
}

int tt_test_attn_args_fork(const tt_test_attn *ta, fi_attn_args *args) {
    fi_tensor out, lse;
    if (tt_test_attn_alloc_outputs(ta, &out, &lse)) return -1;
    tt_tensor_poison(&out);
    if (lse.data) tt_tensor_poison(&lse);
    *args = ta->args;
    args->out = out;
    args->lse = lse;
    return 0;
}

void tt_test_attn_args_free(fi_attn_args *args) {
    tt_tensor_free(&args->out);
    tt_tensor_free(&args->lse);
}

void tt_test_attn_free(tt_test_attn *ta) {
    if (!ta) return;
    tt_tensor_free(&ta->q_buf);
    tt_tensor_free(&ta->k_buf);
    tt_tensor_free(&ta->v_buf);
    tt_tensor_free(&ta->args.out);
    tt_tensor_free(&ta->args.lse);
    free(ta->sinks);
    memset(ta, 0, sizeof *ta);
}
