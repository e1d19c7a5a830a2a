/* tests/common/batchgen.c - random valid caps + batches of every form (batchgen.h). */
#include "batchgen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int32_t k_page_sizes[] = {1, 16, 32, 64, 128};

void batchgen_caps(tt_rng *rng, fi_kind kind, fi_caps *caps) {
    memset(caps, 0, sizeof *caps);
    if (kind == 0)
        kind = (fi_kind)tt_rng_int(rng, 1, 3);
    caps->kind = kind;
    if (kind == FI_KIND_MLA_DECODE) {
        static const int32_t hq[] = {16, 32, 64, 128};
        caps->num_qo_heads = hq[tt_rng_int(rng, 0, 3)];
        caps->num_kv_heads = 1;
        caps->head_dim_qk = 576;
        caps->head_dim_vo = 512;
    } else {
        static const int32_t hkv[] = {1, 2, 4, 8};
        static const int32_t dims[] = {64, 128, 256};
        caps->num_kv_heads = hkv[tt_rng_int(rng, 0, 3)];
        caps->num_qo_heads = caps->num_kv_heads * tt_rng_int(rng, 1, 16);
        caps->head_dim_qk = caps->head_dim_vo = dims[tt_rng_int(rng, 0, 2)];
    }
    caps->page_size = k_page_sizes[tt_rng_int(rng, 0, 4)];
    caps->q_dtype = caps->kv_dtype = caps->o_dtype = FI_DTYPE_F32;
    caps->max_batch = 1;
    caps->max_q_tokens = 1;
    caps->num_pages = 1;
    caps->num_ctas = 1;
}

void batchgen_free(batchgen_batch *b) {
    if (!b)
        return;
    free(b->q_len);
    free(b->kv_len);
    free(b->q_offset);
    free(b->page_row);
    free(b->page_table);
    free(b->q_indptr);
    free(b->kv_indptr);
    free(b->seq_lens);
    memset(b, 0, sizeof *b);
}

int batchgen_from_lens(tt_rng *rng, const fi_caps *caps, fi_batch_form form,
                       const int32_t *q_len, const int32_t *kv_len, int32_t n, int kv_split,
                       int shuffle, int32_t causal, int32_t window_left, batchgen_batch *out) {
    memset(out, 0, sizeof *out);
    if (n < 0 || !caps || (n > 0 && (!q_len || !kv_len)))
        return -1;
    const int32_t ps = caps->page_size;
    const size_t nn = (size_t)n + 1;
    out->q_len = calloc(nn, sizeof(int32_t));
    out->kv_len = calloc(nn, sizeof(int32_t));
    out->q_offset = calloc(nn, sizeof(int32_t));
    out->page_row = calloc(nn, sizeof(int32_t));
    out->q_indptr = calloc(nn, sizeof(int32_t));
    out->kv_indptr = calloc(nn, sizeof(int32_t));
    out->seq_lens = calloc(nn, sizeof(int32_t));
    int32_t *pages = calloc(nn, sizeof(int32_t));
    int32_t *row_len = calloc(nn, sizeof(int32_t));
    if (!out->q_len || !out->kv_len || !out->q_offset || !out->page_row || !out->q_indptr ||
        !out->kv_indptr || !out->seq_lens || !pages || !row_len)
        goto oom;
    if (form == FI_FORM_INDPTR)
        kv_split = 0;
    int64_t total_pages = 0, max_row = 0, nnz = 0;
    for (int32_t b = 0; b < n; b++) {
        out->q_len[b] = q_len[b];
        out->kv_len[b] = out->seq_lens[b] = kv_len[b];
        out->q_indptr[b + 1] = out->q_indptr[b] + q_len[b];
        pages[b] = (kv_len[b] + ps - 1) / ps;
        row_len[b] = pages[b] + (tt_rng_int(rng, 0, 3) == 0 ? tt_rng_int(rng, 1, 3) : 0);
        total_pages += (int64_t)pages[b] * (kv_split ? 2 : 1);
        if (row_len[b] > max_row)
            max_row = row_len[b];
        nnz += row_len[b];
    }
    out->total_q_tokens = out->q_indptr[n];
    /* Page ids 0 .. total_pages - 1, optionally permuted (Fisher-Yates). */
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(total_pages + 1));
    if (!ids)
        goto oom;
    for (int64_t i = 0; i < total_pages; i++)
        ids[i] = (int32_t)i;
    if (shuffle)
        for (int64_t i = total_pages - 1; i > 0; i--) {
            const int64_t j = (int64_t)(tt_rng_next(rng) % (uint64_t)(i + 1));
            const int32_t t = ids[i];
            ids[i] = ids[j];
            ids[j] = t;
        }
    int64_t next_id = 0;
    if (form == FI_FORM_INDPTR) {
        out->page_table_len = nnz;
        out->page_table = malloc(sizeof(int32_t) * (size_t)(nnz + 1));
        if (!out->page_table) {
            free(ids);
            goto oom;
        }
        for (int32_t b = 0; b < n; b++) {
            out->kv_indptr[b + 1] = out->kv_indptr[b] + row_len[b];
            out->page_row[b] = out->kv_indptr[b];
            out->q_offset[b] = out->q_indptr[b];
            for (int32_t i = 0; i < row_len[b]; i++)
                out->page_table[out->kv_indptr[b] + i] = i < pages[b] ? ids[next_id++] : -1;
        }
    } else {
        const int64_t stride = max_row * (kv_split ? 2 : 1);
        out->page_table_len = (int64_t)n * stride;
        out->page_table = malloc(sizeof(int32_t) * (size_t)(out->page_table_len + 1));
        if (!out->page_table) {
            free(ids);
            goto oom;
        }
        for (int64_t i = 0; i < out->page_table_len; i++)
            out->page_table[i] = -1;
        for (int32_t b = 0; b < n; b++) {
            out->page_row[b] = (int32_t)(b * stride);
            out->q_offset[b] = out->q_indptr[b];
            out->kv_indptr[b + 1] = out->kv_indptr[b] + kv_len[b]; /* cum_seq_lens_kv */
            for (int s = 0; s < (kv_split ? 2 : 1); s++)
                for (int32_t i = 0; i < pages[b]; i++)
                    out->page_table[b * stride + s * max_row + i] = ids[next_id++];
        }
    }
    free(ids);
    free(pages);
    free(row_len);

    fi_batch *bt = &out->batch;
    memset(bt, 0, sizeof *bt);
    bt->form = form;
    bt->batch_size = n;
    bt->causal = causal;
    bt->window_left = window_left;
    bt->max_pages_per_seq = (int32_t)max_row;
    bt->kv_split_pages = kv_split;
    bt->q_len_per_request = n > 0 ? q_len[0] : 1;
    switch (form) {
    case FI_FORM_BLOCK_TABLES:
        bt->block_tables = out->page_table;
        bt->seq_lens = out->seq_lens;
        break;
    case FI_FORM_INDPTR:
        bt->qo_indptr = out->q_indptr;
        bt->kv_indptr = out->kv_indptr;
        bt->kv_indices = out->page_table;
        bt->kv_len = out->kv_len;
        break;
    default:
        bt->block_tables = out->page_table;
        bt->cum_seq_lens_q = out->q_indptr;
        bt->cum_seq_lens_kv = out->kv_indptr;
        bt->seq_lens = tt_rng_int(rng, 0, 1) ? out->seq_lens : NULL;
        break;
    }
    out->caps = *caps;
    out->caps.num_pages = (int32_t)total_pages + tt_rng_int(rng, 1, 4);
    if (out->caps.max_batch < n)
        out->caps.max_batch = n > 0 ? n : 1;
    if (out->caps.max_q_tokens < out->total_q_tokens)
        out->caps.max_q_tokens = out->total_q_tokens;
    if (out->caps.max_q_tokens < 1)
        out->caps.max_q_tokens = 1;
    return 0;
oom:
    free(pages);
    free(row_len);
    batchgen_free(out);
    return -1;
}

static batchgen_shape pick_shape(tt_rng *rng) {
    const int32_t r = tt_rng_int(rng, 0, 99);
    if (r < 60) return BATCHGEN_RANDOM;
    if (r < 70) return BATCHGEN_BATCH1;
    if (r < 85) return BATCHGEN_KV_EDGES;
    if (r < 90) return BATCHGEN_LONG_TAIL;
    return BATCHGEN_MAX_BATCH;
}

static int32_t random_kv(tt_rng *rng, int32_t max_kv) {
    if (tt_rng_int(rng, 0, 32) == 0)
        return 0;
    int32_t e = 0;
    while ((1 << (e + 1)) <= max_kv && e < 30)
        e++;
    const int32_t top = 1 << tt_rng_int(rng, 0, e);
    return tt_rng_int(rng, 0, top < max_kv ? top : max_kv);
}

int batchgen_make(tt_rng *rng, const batchgen_opts *opts, batchgen_batch *out) {
    batchgen_opts o = {0};
    if (opts)
        o = *opts;
    if (o.max_batch <= 0)
        o.max_batch = 64;
    if (o.max_kv_len <= 0)
        o.max_kv_len = 4096;
    fi_caps caps;
    batchgen_caps(rng, o.kind, &caps);
    if (o.page_size > 0)
        caps.page_size = o.page_size;
    const batchgen_shape shape = o.shape ? o.shape : pick_shape(rng);
    if (shape == BATCHGEN_LONG_TAIL && caps.page_size < 16)
        caps.page_size = k_page_sizes[tt_rng_int(rng, 1, 4)];
    const int32_t ps = caps.page_size;
    int32_t n;
    switch (shape) {
    case BATCHGEN_BATCH1: n = 1; break;
    case BATCHGEN_LONG_TAIL: n = o.max_batch < 128 ? o.max_batch : 128; break;
    case BATCHGEN_MAX_BATCH: n = o.max_batch; break;
    default: n = tt_rng_int(rng, 1, o.max_batch); break;
    }
    /* a random form the kind takes (fiattn.h: CUM_SEQ_LENS is the context kind's) */
    const fi_batch_form form =
        o.form ? o.form
               : (fi_batch_form)tt_rng_int(rng, 1, caps.kind == FI_KIND_CONTEXT ? 3 : 2);
    const int32_t causal = o.fixed_causal ? o.causal : (tt_rng_int(rng, 0, 9) != 0);
    int32_t window = -1;
    if (o.fixed_window)
        window = o.window_left;
    else if (tt_rng_int(rng, 0, 4) == 0)
        window = tt_rng_int(rng, 0, 1) ? tt_rng_int(rng, 0, 4) : tt_rng_int(rng, 0, 1024);
    const int decode = caps.kind != FI_KIND_CONTEXT;
    const int32_t uniform_q = tt_rng_int(rng, 0, 1) ? 1 : tt_rng_int(rng, 1, 8);
    const int32_t long_one = tt_rng_int(rng, 0, n - 1);

    int32_t *q = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *kv = malloc(sizeof(int32_t) * (size_t)n);
    if (!q || !kv) {
        free(q);
        free(kv);
        memset(out, 0, sizeof *out);
        return -1;
    }
    for (int32_t b = 0; b < n; b++) {
        switch (shape) {
        case BATCHGEN_KV_EDGES: {
            const int32_t k = tt_rng_int(rng, 1, 8);
            const int32_t c = tt_rng_int(rng, 0, 4);
            kv[b] = c == 0 ? 0 : c == 1 ? 1 : c == 2 ? ps * k : c == 3 ? ps * k + 1 : ps * k - 1;
            break;
        }
        case BATCHGEN_LONG_TAIL:
            kv[b] = b == long_one ? 131072 : tt_rng_int(rng, 1, 2048);
            break;
        default:
            kv[b] = random_kv(rng, o.max_kv_len);
            break;
        }
        if (decode) {
            q[b] = form == FI_FORM_BLOCK_TABLES ? uniform_q : tt_rng_int(rng, 1, 8);
            if (causal && kv[b] > 0 && kv[b] < q[b])
                kv[b] = q[b];
        } else if (kv[b] == 0) {
            q[b] = tt_rng_int(rng, 0, 4);
        } else {
            const int32_t cap = kv[b] < 96 ? kv[b] : 96;
            q[b] = tt_rng_int(rng, 0, 3) == 0 ? tt_rng_int(rng, 0, cap) : tt_rng_int(rng, 0, cap < 8 ? cap : 8);
        }
    }
    if (!decode && form == FI_FORM_BLOCK_TABLES) {
        /* uniform q_len: the smallest non-zero kv bounds it under causal masking */
        int32_t qq = tt_rng_int(rng, 0, 8);
        for (int32_t b = 0; b < n; b++)
            if (causal && kv[b] > 0 && kv[b] < qq)
                qq = kv[b];
        for (int32_t b = 0; b < n; b++)
            q[b] = qq;
    }
    caps.max_batch = o.max_batch;
    caps.num_ctas = o.num_ctas > 0 ? o.num_ctas : tt_rng_int(rng, 1, 160);
    const int kv_split = form != FI_FORM_INDPTR && tt_rng_int(rng, 0, 3) == 0;
    const int shuffle = tt_rng_int(rng, 0, 1);
    int rc = batchgen_from_lens(rng, &caps, form, q, kv, n, kv_split, shuffle, causal, window,
                                out);
    free(q);
    free(kv);
    if (rc == 0) {
        out->shape = shape;
        out->caps.max_q_tokens += tt_rng_int(rng, 0, 8);
    }
    return rc;
}

const char *batchgen_describe(const batchgen_batch *b) {
    static char buf[256];
    snprintf(buf, sizeof buf,
             "kind %d form %d shape %d B %d Hq %d Hkv %d page_size %d ctas %d causal %d "
             "window %d split %d q_tokens %d",
             (int)b->caps.kind, (int)b->batch.form, (int)b->shape, b->batch.batch_size,
             b->caps.num_qo_heads, b->caps.num_kv_heads, b->caps.page_size, b->caps.num_ctas,
             b->batch.causal, b->batch.window_left, b->batch.kv_split_pages,
             b->total_q_tokens);
    return buf;
}

tt_plan_expect batchgen_expect(const batchgen_batch *b) {
    const tt_plan_expect e = {b->batch.batch_size, b->total_q_tokens, b->q_len,
                              b->kv_len, b->q_offset, b->page_row};
    return e;
}
