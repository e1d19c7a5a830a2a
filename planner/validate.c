/*
 * planner/validate.c - fi_batch_validate: check any fi_batch form against the caps and
 * normalise it into the per-request table (fi_request_info) the executor reads.
 *
 * One pass over the requests, O(B + used pages).  Only the pages a request actually uses
 * (ceil(kv_len / page_size)) are checked, both K and V rows for a 3-D [B, 2, P] table;
 * unused tail entries of a block-table row may hold anything (often -1).
 * Rules and the status each one returns: fiattn.h (fi_batch_validate).
 */
#include "planner/validate.h"

#include "planner/parallel.h"

/* The SSE2 page scan is host C only (the device planner scans pages with a whole CTA). */
#if defined(__SSE2__) && !defined(__CUDACC__)
#define FI_VALIDATE_SSE2 1
#include <emmintrin.h>
#endif

FI_PD_STATIC fi_status fail(fi_error_detail *err, fi_status st, int32_t request, int64_t needed,
                      int64_t limit) {
    err->status = st;
    err->request = request;
    err->needed = needed;
    err->limit = limit;
    err->cuda_error = 0;
    return st;
}

/* An indptr / cum_seq_lens array's first entry must be 0: request 0's range starts
 * wrong, so it is named (-1 in an empty batch, where no request is at fault). */
FI_PD_STATIC fi_status check_first(const fi_batch *b, const int32_t *a, const int32_t *c,
                             fi_error_detail *err) {
    const int32_t req = b->batch_size > 0 ? 0 : -1;
    if (a[0] != 0)
        return fail(err, FI_ERR_INDPTR_NOT_MONOTONE, req, a[0], 0);
    if (c[0] != 0)
        return fail(err, FI_ERR_INDPTR_NOT_MONOTONE, req, c[0], 0);
    return FI_OK;
}

/* Table rows a request of a sparse batch (caps.sparse_top_k > 0) has: its q_len, clamped
 * to 0..8 (a q_len outside 1..8 is refused later by its own rule); 1 for a dense batch.
 * Makes the page-table size rule cover the [B, q_len, K] table. */
FI_PD_STATIC int64_t sparse_rows_per_request(const fi_caps *caps, const fi_batch *b) {
    if (caps->sparse_top_k <= 0)
        return 1;
    const int32_t q = b->q_len_per_request;
    return q < 0 ? 0 : q > 8 ? 8 : q;
}

/* Scalar checks of the batch that do not depend on a request (fiattn.h's rules, in their
 * order); no array is read.  A sparse plan's rules (caps.sparse_top_k > 0) each follow
 * the dense rule on the same field, so a batch broken for any plan gets the dense status. */
FI_PD fi_status fi_batch_check_scalars(const fi_caps *caps, const fi_batch *b,
                                       fi_error_detail *err) {
    const int32_t K = caps->sparse_top_k;
    if (b->form != FI_FORM_BLOCK_TABLES && b->form != FI_FORM_INDPTR &&
        b->form != FI_FORM_CUM_SEQ_LENS)
        return fail(err, FI_ERR_INVALID_FORM, -1, b->form, -1);
    /* cum_seq_lens is the context API's form; the decode kinds take the other two */
    if (b->form == FI_FORM_CUM_SEQ_LENS && caps->kind != FI_KIND_CONTEXT)
        return fail(err, FI_ERR_INVALID_FORM, -1, b->form, -1);
    /* the top-k table is a block table of slots (the reference's [B, q_len, K]) */
    if (K > 0 && b->form != FI_FORM_BLOCK_TABLES)
        return fail(err, FI_ERR_SPARSE_UNSUPPORTED, -1, b->form, FI_FORM_BLOCK_TABLES);
    if (b->batch_size < 0)
        return fail(err, FI_ERR_NEGATIVE_BATCH_SIZE, -1, b->batch_size, 0);
    if (b->batch_size > caps->max_batch)
        return fail(err, FI_ERR_BATCH_OVER_CAPS, -1, b->batch_size, caps->max_batch);
    if (b->window_left < -1)
        return fail(err, FI_ERR_INVALID_WINDOW, -1, b->window_left, -1);
    if (b->causal != 0 && b->causal != 1)
        return fail(err, FI_ERR_INVALID_CAUSAL, -1, b->causal, 1);
    /* the listed slots are the keys: no window over them */
    if (K > 0 && b->window_left != -1)
        return fail(err, FI_ERR_SPARSE_UNSUPPORTED, -1, b->window_left, -1);
    switch (b->form) {
    case FI_FORM_BLOCK_TABLES:
        if (!b->block_tables || !b->seq_lens)
            return fail(err, FI_ERR_NULL_ARGUMENT, -1, -1, -1);
        break;
    case FI_FORM_INDPTR:
        if (!b->qo_indptr || !b->kv_indptr || !b->kv_indices || !b->kv_len)
            return fail(err, FI_ERR_NULL_ARGUMENT, -1, -1, -1);
        break;
    case FI_FORM_CUM_SEQ_LENS:
        if (!b->block_tables || !b->cum_seq_lens_q || !b->cum_seq_lens_kv)
            return fail(err, FI_ERR_NULL_ARGUMENT, -1, -1, -1);
        break;
    }
    if (b->form != FI_FORM_INDPTR) {
        if (b->max_pages_per_seq < 0)
            return fail(err, FI_ERR_NEGATIVE_PAGES_PER_SEQ, -1, b->max_pages_per_seq, 0);
        if (b->kv_split_pages != 0 && b->kv_split_pages != 1)
            return fail(err, FI_ERR_INVALID_KV_SPLIT, -1, b->kv_split_pages, 1);
        if (K > 0 && b->kv_split_pages) /* MLA's V is its K: no [B, 2, P] table */
            return fail(err, FI_ERR_SPARSE_UNSUPPORTED, -1, b->kv_split_pages, 0);
        if (K > 0 && b->max_pages_per_seq != K)
            return fail(err, FI_ERR_SPARSE_TOP_K_MISMATCH, -1, b->max_pages_per_seq, K);
        const int64_t entries = (int64_t)b->batch_size * b->max_pages_per_seq *
                                (b->kv_split_pages ? 2 : 1) * sparse_rows_per_request(caps, b);
        if (entries > INT32_MAX)
            return fail(err, FI_ERR_PAGE_TABLE_TOO_LARGE, -1, entries, INT32_MAX);
    }
    if (b->form == FI_FORM_BLOCK_TABLES && b->q_len_per_request < 0)
        return fail(err, FI_ERR_NEGATIVE_LENGTH, -1, b->q_len_per_request, 0);
    return FI_OK;
}

/* Context: any q_len >= 0.  MLA decode in the INDPTR form (BatchMLAPagedAttentionWrapper,
 * also incremental prefill of absorbed-weight MLA): any q_len >= 1, bounded by the caps'
 * max_q_tokens.  Otherwise (decode, MTP): 1..8. */
FI_PD_STATIC int q_len_ok(const fi_caps *caps, fi_batch_form form, int64_t q_len) {
    if (caps->kind == FI_KIND_CONTEXT)
        return q_len >= 0;
    if (caps->kind == FI_KIND_MLA_DECODE && form == FI_FORM_INDPTR)
        return q_len >= 1;
    return q_len >= 1 && q_len <= 8;
}

/* Every used page index of a row in [0, num_pages): a branch-free scan (SSE2, 8 indices
 * per step: unsigned compare via the sign-flip trick, negatives wrap to >= limit), then a
 * second look only when something is out of range, to report which. */
FI_PD_STATIC FI_PD_OUTLINE fi_status check_pages(const fi_caps *caps, const int32_t *row, int64_t used, int32_t b,
                             fi_error_detail *err) {
    const uint32_t limit = (uint32_t)caps->num_pages;
    uint32_t bad = 0;
    int64_t i = 0;
#ifdef FI_VALIDATE_SSE2
    const __m128i flip = _mm_set1_epi32(INT32_MIN);
    const __m128i top = _mm_set1_epi32((int32_t)((limit - 1u) ^ 0x80000000u)); /* limit >= 1 */
    __m128i acc = _mm_setzero_si128();
    if (limit > 0) {
        for (; i + 8 <= used; i += 8) {
            const __m128i a = _mm_loadu_si128((const __m128i *)(row + i));
            const __m128i c = _mm_loadu_si128((const __m128i *)(row + i + 4));
            acc = _mm_or_si128(acc, _mm_cmpgt_epi32(_mm_xor_si128(a, flip), top));
            acc = _mm_or_si128(acc, _mm_cmpgt_epi32(_mm_xor_si128(c, flip), top));
        }
        if (i < used && used >= 8) { /* the tail: the last 8 again (overlap is harmless) */
            const __m128i a = _mm_loadu_si128((const __m128i *)(row + used - 8));
            const __m128i c = _mm_loadu_si128((const __m128i *)(row + used - 4));
            acc = _mm_or_si128(acc, _mm_cmpgt_epi32(_mm_xor_si128(a, flip), top));
            acc = _mm_or_si128(acc, _mm_cmpgt_epi32(_mm_xor_si128(c, flip), top));
            i = used;
        }
        bad = (uint32_t)_mm_movemask_epi8(acc);
    }
#endif
    for (; i < used; i++)
        bad |= (uint32_t)row[i] >= limit;
    if (!bad)
        return FI_OK;
    for (i = 0; i < used; i++) {
        const int32_t p = row[i];
        if (p < 0 || p >= caps->num_pages)
            return fail(err, FI_ERR_PAGE_INDEX_OUT_OF_RANGE, b, p, caps->num_pages);
    }
    return FI_OK;
}

/* Where request rows live in the page table, per batch (read once). */
typedef struct table_geo {
    int64_t P;          /* block-table row length (0: INDPTR) */
    int64_t row_stride; /* P, or 2P for [B, 2, P] */
    const int32_t *table;
    int64_t page_size;
    int page_shift;
} table_geo;

FI_PD_STATIC table_geo table_geo_of(const fi_caps *caps, const fi_batch *bt) {
    table_geo t;
    t.P = bt->form == FI_FORM_INDPTR ? 0 : bt->max_pages_per_seq;
    t.row_stride = t.P * (bt->form != FI_FORM_INDPTR && bt->kv_split_pages ? 2 : 1);
    t.table = bt->form == FI_FORM_INDPTR ? bt->kv_indices : bt->block_tables;
    /* Pages used = ceil(kv_len / page_size): a shift for the power-of-two page sizes caps
     * allow (a 64-bit division per request costs tens of cycles). */
    t.page_size = caps->page_size;
    t.page_shift = fi_page_shift(caps->page_size);
    return t;
}

/* Pages a request of kv_len >= 0 keys uses: ceil(kv_len / page_size). */
FI_PD_STATIC inline int64_t table_pages_used(const table_geo *t, int64_t kv_len) {
    return t->page_shift >= 0 ? (kv_len + t->page_size - 1) >> t->page_shift
                              : (kv_len + t->page_size - 1) / t->page_size;
}

/* kv_indices holds kv_indptr[B] entries: the whole kv_indptr must be monotone before any
 * request's pages are read, or an entry past kv_indptr[B] followed by a decrease would make
 * request b read beyond the caller's array (fuzzer: crash-kv-indptr-decreases).  Then the
 * form's first entries.  The checks that precede the per-request rules. */
FI_PD_STATIC fi_status check_arrays(const fi_batch *bt, fi_error_detail *err) {
    fi_status st = FI_OK;
    if (bt->form == FI_FORM_INDPTR)
        st = check_first(bt, bt->qo_indptr, bt->kv_indptr, err);
    if (bt->form == FI_FORM_CUM_SEQ_LENS)
        st = check_first(bt, bt->cum_seq_lens_q, bt->cum_seq_lens_kv, err);
    return st;
}

/* Request b's rules in fiattn.h's order, f its fields (fi_request_read), q_before = the q
 * tokens of requests 0 .. b - 1 (the running-total rule).  t and f by value, nothing
 * returned through pointers but err: in the device planner, where this is a call, a local
 * whose address a call takes lives in local memory. */
FI_PD_STATIC FI_PD_OUTLINE fi_status request_rules(const fi_caps *caps, const fi_batch *bt,
                                                   table_geo t, int32_t b, int64_t q_before,
                                                   const int64_t *page_verdict,
                                                   fi_request_fields f, fi_error_detail *err) {
    const int64_t q_len = f.q_len, kv_len = f.kv_len, row = f.row;
    switch (bt->form) {
    case FI_FORM_BLOCK_TABLES:
        break;
    case FI_FORM_INDPTR:
        if (q_len < 0)
            return fail(err, FI_ERR_INDPTR_NOT_MONOTONE, b, bt->qo_indptr[b + 1],
                        bt->qo_indptr[b]);
        break;
    default: /* FI_FORM_CUM_SEQ_LENS */
        if (q_len < 0)
            return fail(err, FI_ERR_INDPTR_NOT_MONOTONE, b, bt->cum_seq_lens_q[b + 1],
                        bt->cum_seq_lens_q[b]);
        if (kv_len < 0)
            return fail(err, FI_ERR_INDPTR_NOT_MONOTONE, b, bt->cum_seq_lens_kv[b + 1],
                        bt->cum_seq_lens_kv[b]);
        if (bt->seq_lens) {
            if (bt->seq_lens[b] < 0)
                return fail(err, FI_ERR_NEGATIVE_LENGTH, b, bt->seq_lens[b], 0);
            if (bt->seq_lens[b] != kv_len)
                return fail(err, FI_ERR_INCONSISTENT_LENGTHS, b, bt->seq_lens[b], kv_len);
        }
        break;
    }
    if (kv_len < 0)
        return fail(err, FI_ERR_NEGATIVE_LENGTH, b, kv_len, 0);
    if (!q_len_ok(caps, bt->form, q_len))
        return fail(err, FI_ERR_Q_LEN_UNSUPPORTED, b, q_len,
                    caps->kind == FI_KIND_CONTEXT ||
                            (caps->kind == FI_KIND_MLA_DECODE && bt->form == FI_FORM_INDPTR)
                        ? -1 /* no upper limit: the lower one (1) was broken */
                        : 8);
    if (bt->causal && kv_len > 0 && q_len > kv_len)
        return fail(err, FI_ERR_INCONSISTENT_LENGTHS, b, q_len, kv_len);
    const int64_t q_incl = q_before + q_len;
    if (q_incl > caps->max_q_tokens)
        return fail(err, FI_ERR_Q_TOKENS_OVER_CAPS, b, q_incl, caps->max_q_tokens);
    const int64_t used = table_pages_used(&t, kv_len);
    if (used > f.avail) /* INDPTR: avail >= 0, kv_indptr checked before */
        return fail(err, FI_ERR_SEQ_LEN_EXCEEDS_PAGES, b, used, f.avail);
    /* Offsets fit int32 by the rules above: row + row_stride <= B * row_stride (the
     * page-table size check; INDPTR rows are kv_indptr values), and q_off + q_len <= the q
     * tokens so far (<= caps.max_q_tokens) in every form. */
    if (page_verdict) { /* scanned already (the device planner's CTA) */
        if (page_verdict[b] != FI_PAGES_OK)
            return fail(err, FI_ERR_PAGE_INDEX_OUT_OF_RANGE, b, page_verdict[b],
                        caps->num_pages);
        return FI_OK;
    }
#ifndef __CUDA_ARCH__
    /* A later request's row (block-table forms): its first lines are fetched while this
     * row is scanned (the loop's case: the table is cold after a replay).  Rows are short
     * (a few lines) and strided, so no hardware stream covers them: the fetch runs
     * kRowsAhead rows ahead, about a memory latency at the scan's pace. */
    enum { kRowsAhead = 8 };
    if (bt->form != FI_FORM_INDPTR && b + kRowsAhead < bt->batch_size)
        for (int64_t k = 0; k < t.P && k < 64; k += 16)
            __builtin_prefetch(t.table + row + kRowsAhead * t.row_stride + k);
#endif
    fi_status st = check_pages(caps, t.table + row, used, b, err);
    if (st == FI_OK && bt->form != FI_FORM_INDPTR && bt->kv_split_pages)
        st = check_pages(caps, t.table + row + t.P, used, b, err);
    return st;
}

FI_PD_STATIC void request_write(fi_request_info *r, const fi_request_fields *f) {
    r->q_offset = (int32_t)f->q_offset;
    r->q_len = (int32_t)f->q_len;
    r->kv_len = (int32_t)f->kv_len;
    r->page_row_offset = (int32_t)f->row;
}

FI_PD_STATIC fi_status ok(fi_error_detail *err) {
    err->status = FI_OK;
    err->request = -1;
    err->needed = -1;
    err->limit = -1;
    err->cuda_error = 0;
    return FI_OK;
}

/* ---- sparse top-k (caps.sparse_top_k = K > 0) -------------------------------------------
 * The batch is B requests of q_len query tokens; block_tables is [B, q_len, K] (= [B *
 * q_len, K]): row r = b * q_len + i lists the flat KV slots (page * page_size + offset)
 * query token (b, i) attends to, a negative entry = no key.  Normalised to B * q_len
 * requests of one query token over K "keys" (the row's slots, in order):
 *   request r: q_offset r, q_len 1, kv_len K, page_row_offset r * K
 * so tiles, partition, packing and merge run unchanged (each request's KV range is
 * [0, K), whatever causal says: a one-row request sees all its keys). */

/* Every slot of rows [0, n) of a request's table: negative (no key) or < num_pages x
 * page_size; the first one past it is reported (request b, needed = the slot). */
FI_PD_STATIC fi_status check_slots(const fi_caps *caps, const int32_t *slots, int64_t n,
                                   int32_t b, fi_error_detail *err) {
    const int64_t limit = (int64_t)caps->num_pages * caps->page_size;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) /* branch-free first pass: vectorises */
        bad |= slots[i] >= limit;
    if (!bad)
        return FI_OK;
    for (int64_t i = 0; i < n; i++)
        if (slots[i] >= limit)
            return fail(err, FI_ERR_PAGE_INDEX_OUT_OF_RANGE, b, slots[i], limit);
    return FI_OK;
}

/* Batch request b's rules in fiattn.h's order: seq_lens[b] >= 0 (it selects no key), q_len
 * 1..8, the q tokens through b within the caps, then its q_len x K slots. */
FI_PD_STATIC fi_status sparse_request_rules(const fi_caps *caps, const fi_batch *bt, int32_t b,
                                            fi_error_detail *err) {
    const int64_t q_len = bt->q_len_per_request, K = caps->sparse_top_k;
    if (bt->seq_lens[b] < 0)
        return fail(err, FI_ERR_NEGATIVE_LENGTH, b, bt->seq_lens[b], 0);
    if (!q_len_ok(caps, bt->form, q_len))
        return fail(err, FI_ERR_Q_LEN_UNSUPPORTED, b, q_len, 8);
    const int64_t q_incl = ((int64_t)b + 1) * q_len;
    if (q_incl > caps->max_q_tokens)
        return fail(err, FI_ERR_Q_TOKENS_OVER_CAPS, b, q_incl, caps->max_q_tokens);
    return check_slots(caps, bt->block_tables + (int64_t)b * q_len * K, q_len * K, b, err);
}

/* fi_batch_check_pages for a sparse batch (scalars and form already checked).  Also the
 * data-parallel planner's: sparse plans are never planned on the device
 * (fi_plan_update_device refuses them), and on the host that planner is one thread.
 * Offsets fit int32: r * K < B x q_len x K, the table size rule. */
FI_PD_STATIC fi_status sparse_check(const fi_caps *caps, const fi_batch *bt,
                                    fi_request_info *requests, int32_t *total_q_tokens,
                                    fi_page_table_geom *geom, fi_error_detail *err) {
    const int32_t q_len = bt->q_len_per_request, K = caps->sparse_top_k;
    for (int32_t b = 0; b < bt->batch_size; b++) {
        const fi_status st = sparse_request_rules(caps, bt, b, err);
        if (st != FI_OK)
            return st;
        for (int32_t i = 0; requests && i < q_len; i++) {
            const int32_t r = b * q_len + i;
            const fi_request_info info = {r, 1, K, r * K};
            requests[r] = info;
        }
    }
    *total_q_tokens = bt->batch_size * q_len; /* <= caps.max_q_tokens, checked per request */
    if (geom)
        *geom = fi_page_table_geom_sparse(bt);
    return ok(err);
}

FI_PD fi_status fi_batch_check_pages(const fi_caps *caps, const fi_batch *batch,
                                     const int64_t *page_verdict, fi_request_info *requests,
                                     int32_t *total_q_tokens, fi_page_table_geom *geom,
                                     fi_error_detail *err) {
    fi_error_detail local;
    if (!err)
        err = &local;
    if (!caps || !batch || !total_q_tokens)
        return fail(err, FI_ERR_NULL_ARGUMENT, -1, -1, -1);
    fi_status st = fi_batch_check_scalars(caps, batch, err);
    if (st == FI_OK)
        st = check_arrays(batch, err);
    if (st != FI_OK)
        return st;
    if (caps->sparse_top_k > 0) /* page_verdict unused: never planned on the device */
        return sparse_check(caps, batch, requests, total_q_tokens, geom, err);
    const fi_batch *bt = batch;
    if (bt->form == FI_FORM_INDPTR)
        for (int32_t b = 0; b < bt->batch_size; b++)
            if (bt->kv_indptr[b + 1] < bt->kv_indptr[b])
                return fail(err, FI_ERR_INDPTR_NOT_MONOTONE, b, bt->kv_indptr[b + 1],
                            bt->kv_indptr[b]);
    const table_geo t = table_geo_of(caps, bt);
    fi_page_table_geom g = fi_page_table_geom_begin(bt);
    int64_t total_q = 0;
    for (int32_t b = 0; b < bt->batch_size; b++) {
        const fi_request_fields f = fi_request_read(bt, b, t.row_stride);
        st = request_rules(caps, bt, t, b, total_q, page_verdict, f, err);
        if (st != FI_OK)
            return st;
        total_q += f.q_len;
        fi_page_table_geom_add(&g, f.row, table_pages_used(&t, f.kv_len));
        if (requests)
            request_write(&requests[b], &f);
    }
    *total_q_tokens = (int32_t)total_q;
    if (geom)
        *geom = g;
    return ok(err);
}

FI_PD fi_status fi_batch_check_parallel(const fi_caps *caps, const fi_batch *bt,
                                        const int64_t *page_verdict, int64_t *q_scan,
                                        fi_request_info *requests, int32_t *total_q_tokens,
                                        fi_page_table_geom *geom, fi_error_detail *err) {
    /* The scalar rules and the first entries: every thread (same reads, same verdict). */
    fi_status st = fi_batch_check_scalars(caps, bt, err);
    if (st == FI_OK)
        st = check_arrays(bt, err);
    if (st != FI_OK)
        return st;
    if (caps->sparse_top_k > 0) /* host only (sparse_check) */
        return sparse_check(caps, bt, requests, total_q_tokens, geom, err);
    const int32_t B = bt->batch_size;
    if (bt->form == FI_FORM_INDPTR) {
        int64_t first = B;
        FI_PP_FOR(b, B)
        if (b < first && bt->kv_indptr[b + 1] < bt->kv_indptr[b])
            first = b;
        first = fi_pp_min(first);
        if (first < B) {
            const int32_t b = (int32_t)first;
            return fail(err, FI_ERR_INDPTR_NOT_MONOTONE, b, bt->kv_indptr[b + 1],
                        bt->kv_indptr[b]);
        }
    }
    const table_geo t = table_geo_of(caps, bt);
    FI_PP_FOR_CHUNK(b, B)
    q_scan[b] = fi_request_read(bt, b, t.row_stride).q_len;
    const int64_t total_q = fi_pp_scan(q_scan, B);
    /* Every request's rules; the lowest failing request is the one reported (the rules of
     * one request run in order, so its first broken rule is the sequential check's). */
    int64_t first = B;
    FI_PP_FOR(b, B) {
        const fi_request_fields f = fi_request_read(bt, b, t.row_stride);
        fi_error_detail e;
        if (request_rules(caps, bt, t, b, q_scan[b], page_verdict, f, &e) != FI_OK) {
            if (b < first)
                first = b;
        } else {
            request_write(&requests[b], &f);
        }
    }
    first = fi_pp_min(first);
    if (first < B) { /* through a copy: err itself is never passed to a call (request_rules) */
        const int32_t b = (int32_t)first;
        fi_error_detail e;
        st = request_rules(caps, bt, t, b, q_scan[b], page_verdict,
                           fi_request_read(bt, b, t.row_stride), &e);
        *err = e;
        return st;
    }
    if (geom) { /* host only (the device planner passes NULL) */
        fi_page_table_geom g = fi_page_table_geom_begin(bt);
        for (int32_t b = 0; b < B; b++)
            fi_page_table_geom_add(&g, requests[b].page_row_offset,
                                   table_pages_used(&t, requests[b].kv_len));
        *geom = g;
    }
    *total_q_tokens = (int32_t)total_q;
    return ok(err);
}

FI_PD int32_t fi_batch_read_parallel(const fi_caps *caps, const fi_batch *bt,
                                     int64_t *q_scan, fi_request_info *requests) {
    const table_geo t = table_geo_of(caps, bt);
    FI_PP_FOR_CHUNK(b, bt->batch_size) {
        fi_request_fields f = fi_request_read(bt, b, t.row_stride);
        f.kv_len = f.kv_len < 0 ? 0 : f.kv_len > INT32_MAX ? INT32_MAX : f.kv_len;
        int64_t q_max = caps->max_q_tokens;
        if (bt->causal && f.kv_len > 0 && f.kv_len < q_max)
            q_max = f.kv_len;
        f.q_len = f.q_len < 0 ? 0 : f.q_len > q_max ? q_max : f.q_len;
        request_write(&requests[b], &f);
        q_scan[b] = f.q_len;
    }
    const int64_t total_q = fi_pp_scan(q_scan, bt->batch_size);
    return total_q > INT32_MAX ? INT32_MAX : (int32_t)total_q;
}

FI_PD fi_status fi_batch_check(const fi_caps *caps, const fi_batch *batch,
                               fi_request_info *requests, int32_t *total_q_tokens,
                               fi_page_table_geom *geom, fi_error_detail *err) {
    return fi_batch_check_pages(caps, batch, NULL, requests, total_q_tokens, geom, err);
}

#ifndef FI_PLANNER_DEVICE_TU
fi_status fi_batch_validate(const fi_caps *caps, const fi_batch *batch,
                            fi_request_info *requests, int32_t *total_q_tokens,
                            fi_error_detail *err) {
    if (!requests) {
        fi_error_detail local;
        return fail(err ? err : &local, FI_ERR_NULL_ARGUMENT, -1, -1, -1);
    }
    /* Check first, then write: a bad batch leaves the caller's table untouched. */
    int32_t total = 0;
    fi_status st = fi_batch_check(caps, batch, NULL, &total, NULL, err);
    if (st != FI_OK)
        return st;
    st = fi_batch_check(caps, batch, requests, &total, NULL, err);
    if (st == FI_OK)
        *total_q_tokens = total;
    return st;
}
#endif /* FI_PLANNER_DEVICE_TU */
