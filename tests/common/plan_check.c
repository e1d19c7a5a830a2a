/*
 * tests/common/plan_check.c - the plan checks of plan_check.h (coverage, bookkeeping,
 * bounds; snapshots of the view).  The expected KV range of a row is computed here from
 * fiattn.h's definition, not from the planner's code.
 */
#include "plan_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/mask.h" /* the row rule; tests/test_mask.c checks it by brute force */
#include "plan/variant.h"
#include "workspace/layout.h"

typedef struct span { int64_t row; int32_t lo, hi; } span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->row != y->row) return x->row < y->row ? -1 : 1;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            snprintf(msg, msz, __VA_ARGS__);                                              \
            goto out;                                                                     \
        }                                                                                 \
    } while (0)

int tt_plan_check(const fi_plan *plan, const fi_batch *bt, const tt_plan_expect *want, char *msg,
                  size_t msz) {
    int rc = -1;
    span *spans = NULL;
    int32_t *writers = NULL, *slot_used = NULL, *group_items = NULL, *slot_item = NULL;
    fi_plan_view v;
    CHECK(fi_plan_get_view(plan, &v) == FI_OK, "no view");
    const fi_caps *caps = fi_plan_caps(plan);
    fi_layout l;
    CHECK(fi_layout_compute(caps, &l) == FI_OK, "layout");
    const fi_plan_header *h = v.header;
    const int32_t B = bt->batch_size, Hq = caps->num_qo_heads;
    const int32_t group = Hq / caps->num_kv_heads;
    CHECK(v.num_ctas == caps->num_ctas, "num_ctas");
    CHECK(B == want->batch_size && h->batch_size == B &&
              h->total_q_tokens == want->total_q_tokens,
          "header sizes");
    const fi_variant *var = fi_variant_of(caps);
    CHECK(var != NULL, "no tile table row");
    CHECK(h->tile_rows == var->tile_rows && h->tile_rows == fi_tile_rows(caps), "tile_rows");
    CHECK(h->causal == bt->causal && h->window_left == bt->window_left && h->form == (int32_t)bt->form,
          "header batch fields");
    CHECK(h->num_items >= 0 && h->num_items <= l.max_items, "items %d > bound %d", h->num_items,
          l.max_items);
    CHECK(h->num_groups >= 0 && h->num_groups <= l.max_groups, "groups %d > %d", h->num_groups,
          l.max_groups);
    CHECK(h->num_slots >= 0 && h->num_slots <= l.max_slots, "slots %d > %d", h->num_slots,
          l.max_slots);
    CHECK(h->num_groups <= caps->num_ctas - 1 || h->num_groups == 0, "groups > cuts");
    CHECK(l.plan_bytes <= l.total_bytes &&
              fi_layout_used_bytes(&l, h->num_items) <= l.plan_bytes,
          "used plan bytes %zu past the plan region %zu", fi_layout_used_bytes(&l, h->num_items),
          l.plan_bytes);
    CHECK(h->max_cta_cost <= h->total_cost || h->total_cost == 0, "max cost > total");
    for (int32_t b = 0; b < B; b++) {
        const fi_request_info *r = &v.requests[b];
        CHECK(r->q_offset == want->q_offset[b] && r->q_len == want->q_len[b] &&
                  r->kv_len == want->kv_len[b] && r->page_row_offset == want->page_row[b],
              "request %d table (%d %d %d %d)", b, r->q_offset, r->q_len, r->kv_len,
              r->page_row_offset);
    }
    CHECK(v.work_indptr[0] == 0 && v.work_indptr[v.num_ctas] == h->num_items, "indptr ends");
    for (int32_t c = 0; c < v.num_ctas; c++)
        CHECK(v.work_indptr[c] <= v.work_indptr[c + 1], "indptr not monotone at %d", c);
    /* The executor's first read: CTA c's start record repeats its range, its first item and
     * that item's request row, byte for byte; an empty CTA's record is zero past its range. */
    for (int32_t c = 0; c < v.num_ctas; c++) {
        const fi_cta_start *cs = &v.cta_starts[c];
        fi_cta_start rec;
        memset(&rec, 0, sizeof rec);
        rec.item_begin = v.work_indptr[c];
        rec.item_end = v.work_indptr[c + 1];
        if (rec.item_begin < rec.item_end) {
            rec.first = v.items[rec.item_begin];
            rec.request = v.requests[rec.first.request];
        }
        CHECK(memcmp(cs, &rec, sizeof rec) == 0, "cta %d start record (range %d..%d)", c,
              cs->item_begin, cs->item_end);
    }

    const int64_t rows = (int64_t)want->total_q_tokens * Hq;
    writers = calloc((size_t)rows + 1, sizeof(int32_t));
    slot_used = calloc((size_t)h->num_slots + 1, sizeof(int32_t));
    group_items = calloc((size_t)h->num_groups + 1, sizeof(int32_t));
    slot_item = calloc((size_t)h->num_slots + 1, sizeof(int32_t));
    int64_t nspans = 0, cap_spans = 1024;
    spans = malloc(sizeof(span) * (size_t)cap_spans);
    CHECK(writers && slot_used && group_items && slot_item && spans, "oom");
    for (int32_t k = 0; k < h->num_items; k++) {
        const fi_work_item *it = &v.items[k];
        CHECK(it->request >= 0 && it->request < B, "item %d request %d", k, it->request);
        const fi_request_info *r = &v.requests[it->request];
        CHECK(it->head_begin >= 0 && it->head_begin < it->head_end && it->head_end <= Hq &&
                  it->head_begin / group == (it->head_end - 1) / group,
              "item %d heads [%d,%d)", k, it->head_begin, it->head_end);
        CHECK(it->q_begin >= 0 && it->q_begin < it->q_end && it->q_end <= r->q_len,
              "item %d q [%d,%d) of %d", k, it->q_begin, it->q_end, r->q_len);
        CHECK((it->q_end - it->q_begin) * (it->head_end - it->head_begin) <= h->tile_rows,
              "item %d taller than a tile", k);
        CHECK(it->kv_begin >= 0 && it->kv_begin <= it->kv_end && it->kv_end <= r->kv_len,
              "item %d kv [%d,%d) of %d", k, it->kv_begin, it->kv_end, r->kv_len);
        CHECK((it->out_slot < 0) == (it->merge_group < 0), "item %d slot/group", k);
        if (it->merge_group >= 0) {
            CHECK(it->merge_group < h->num_groups && it->out_slot < h->num_slots,
                  "item %d group/slot out of range", k);
            slot_used[it->out_slot]++;
            slot_item[it->out_slot] = k;
            group_items[it->merge_group]++;
        }
        for (int32_t i = it->q_begin; i < it->q_end; i++) {
            int32_t lo, hi;
            fi_row_kv_range(bt->causal, bt->window_left, r->q_len, r->kv_len, i, &lo, &hi);
            for (int32_t hh = it->head_begin; hh < it->head_end; hh++) {
                const int64_t row = (int64_t)(r->q_offset + i) * Hq + hh;
                if (it->merge_group < 0)
                    writers[row]++;
                const int32_t a = it->kv_begin > lo ? it->kv_begin : lo;
                const int32_t z = it->kv_end < hi ? it->kv_end : hi;
                if (a >= z)
                    continue;
                if (nspans == cap_spans) {
                    cap_spans *= 2;
                    span *ns = realloc(spans, sizeof(span) * (size_t)cap_spans);
                    CHECK(ns, "oom");
                    spans = ns;
                }
                spans[nspans++] = (span){row, a, z};
            }
        }
    }
    int32_t next_slot = 0;
    for (int32_t gi = 0; gi < h->num_groups; gi++) {
        const fi_merge_group *mg = &v.groups[gi];
        CHECK(mg->num_splits >= 2 && group_items[gi] == mg->num_splits,
              "group %d splits %d items %d", gi, mg->num_splits, group_items[gi]);
        CHECK(mg->first_slot == next_slot, "group %d slots not consecutive", gi);
        next_slot += mg->num_splits;
        CHECK(mg->first_item >= 0 && mg->first_item < h->num_items &&
                  slot_used[mg->first_slot] == 1 && slot_item[mg->first_slot] == mg->first_item,
              "group %d first item", gi);
        for (int32_t s = 0; s < mg->num_splits; s++) {
            CHECK(slot_used[mg->first_slot + s] == 1, "group %d slot %d", gi, s);
            const fi_work_item *it = &v.items[slot_item[mg->first_slot + s]];
            CHECK(it->merge_group == gi && it->out_slot == mg->first_slot + s,
                  "group %d piece %d bookkeeping", gi, s);
            CHECK(it->request == mg->request && it->head_begin == mg->head_begin &&
                      it->head_end == mg->head_end && it->q_begin == mg->q_begin &&
                      it->q_end == mg->q_end,
                  "group %d piece %d rectangle", gi, s);
            CHECK(it->kv_end - it->kv_begin >= var->min_chunk_tokens, "group %d piece %d below floor",
                  gi, s);
            if (s > 0) {
                CHECK(v.items[slot_item[mg->first_slot + s - 1]].kv_end == it->kv_begin,
                      "group %d pieces not contiguous", gi);
                CHECK(it->kv_begin % var->kv_tile_tokens == 0, "group %d cut off the KV tile", gi);
            }
        }
        const fi_request_info *r = &v.requests[mg->request];
        for (int32_t i = mg->q_begin; i < mg->q_end; i++)
            for (int32_t hh = mg->head_begin; hh < mg->head_end; hh++)
                writers[(int64_t)(r->q_offset + i) * Hq + hh]++;
    }
    CHECK(next_slot == h->num_slots, "slots used %d != %d", next_slot, h->num_slots);
    for (int32_t s = 0; s < h->num_slots; s++)
        CHECK(slot_used[s] == 1, "slot %d used %d times", s, slot_used[s]);
    for (int64_t row = 0; row < rows; row++)
        CHECK(writers[row] == 1, "row %lld (token %lld head %lld) written %d times",
              (long long)row, (long long)(row / Hq), (long long)(row % Hq), writers[row]);
    qsort(spans, (size_t)nspans, sizeof(span), span_cmp);
    /* Walk rows in order: each row's spans must tile its visible range exactly. */
    int64_t s = 0;
    for (int32_t b = 0; b < B; b++) {
        const fi_request_info *r = &v.requests[b];
        for (int32_t i = 0; i < r->q_len; i++) {
            int32_t lo, hi;
            fi_row_kv_range(bt->causal, bt->window_left, r->q_len, r->kv_len, i, &lo, &hi);
            for (int32_t hh = 0; hh < Hq; hh++) {
                const int64_t row = (int64_t)(r->q_offset + i) * Hq + hh;
                int32_t at = lo;
                while (s < nspans && spans[s].row == row) {
                    CHECK(spans[s].lo == at, "request %d row %d head %d: key %d seen %s", b, i,
                          hh, spans[s].lo < at ? spans[s].lo : at,
                          spans[s].lo < at ? "twice" : "never");
                    at = spans[s].hi;
                    s++;
                }
                CHECK(at == hi, "request %d row %d head %d: keys [%d,%d) never seen", b, i, hh,
                      at, hi);
            }
        }
    }
    CHECK(s == nspans, "spans outside the batch rows");
    CHECK(fi_plan_balance(plan) >= 1.0 - 1e-9, "balance %f < 1", fi_plan_balance(plan));
    rc = 0;
out:
    free(spans);
    free(writers);
    free(slot_used);
    free(slot_item);
    free(group_items);
    return rc;
}


int tt_plan_expect_from_batch(const fi_batch *bt, tt_plan_expect_buf *out) {
    memset(out, 0, sizeof *out);
    const int32_t B = bt->batch_size > 0 ? bt->batch_size : 0;
    out->mem = malloc(sizeof(int32_t) * 4 * ((size_t)B + 1));
    if (!out->mem)
        return -1;
    int32_t *q_len = out->mem, *kv_len = q_len + B + 1, *q_off = kv_len + B + 1,
            *row = q_off + B + 1;
    const int64_t stride = (int64_t)bt->max_pages_per_seq * (bt->kv_split_pages ? 2 : 1);
    int64_t total = 0;
    for (int32_t b = 0; b < B; b++) {
        switch (bt->form) {
        case FI_FORM_BLOCK_TABLES:
            q_len[b] = bt->q_len_per_request;
            q_off[b] = (int32_t)total;
            kv_len[b] = bt->seq_lens[b];
            row[b] = (int32_t)(b * stride);
            break;
        case FI_FORM_INDPTR:
            q_len[b] = bt->qo_indptr[b + 1] - bt->qo_indptr[b];
            q_off[b] = bt->qo_indptr[b];
            kv_len[b] = bt->kv_len[b];
            row[b] = bt->kv_indptr[b];
            break;
        default:
            q_len[b] = bt->cum_seq_lens_q[b + 1] - bt->cum_seq_lens_q[b];
            q_off[b] = bt->cum_seq_lens_q[b];
            kv_len[b] = bt->cum_seq_lens_kv[b + 1] - bt->cum_seq_lens_kv[b];
            row[b] = (int32_t)(b * stride);
            break;
        }
        total += q_len[b];
    }
    out->e = (tt_plan_expect){B, (int32_t)total, q_len, kv_len, q_off, row};
    return 0;
}

int tt_plan_expect_sparse(const fi_batch *bt, tt_plan_expect_buf *out, fi_batch *as_dense) {
    memset(out, 0, sizeof *out);
    const int32_t B = bt->batch_size > 0 ? bt->batch_size : 0;
    const int32_t R = B * (bt->q_len_per_request > 0 ? bt->q_len_per_request : 0);
    const int32_t K = bt->max_pages_per_seq;
    out->mem = malloc(sizeof(int32_t) * 4 * ((size_t)R + 1));
    if (!out->mem)
        return -1;
    int32_t *q_len = out->mem, *kv = q_len + R + 1, *q_off = kv + R + 1, *row = q_off + R + 1;
    for (int32_t r = 0; r < R; r++) {
        q_len[r] = 1;
        kv[r] = K;
        q_off[r] = r;
        row[r] = r * K;
    }
    out->e = (tt_plan_expect){R, R, q_len, kv, q_off, row};
    *as_dense = *bt;
    as_dense->batch_size = R;
    as_dense->q_len_per_request = 1;
    return 0;
}

void tt_plan_expect_free(tt_plan_expect_buf *b) {
    free(b->mem);
    memset(b, 0, sizeof *b);
}

static unsigned char *snap_put(unsigned char *at, const void *p, size_t n) {
    memcpy(at, p, n);
    return at + n;
}

int tt_plan_snapshot_take(const fi_plan *plan, tt_plan_snapshot *s) {
    memset(s, 0, sizeof *s);
    fi_plan_view v;
    memset(&v, 0, sizeof v); /* padding after num_ctas */
    const fi_status st = fi_plan_get_view(plan, &v);
    const double bal = fi_plan_balance(plan);
    const fi_plan_header *h = v.header;
    const size_t n_indptr = st == FI_OK ? sizeof(int32_t) * (size_t)(v.num_ctas + 1) : 0,
                 n_starts = st == FI_OK ? sizeof(fi_cta_start) * (size_t)v.num_ctas : 0,
                 n_items = st == FI_OK ? sizeof(fi_work_item) * (size_t)h->num_items : 0,
                 n_groups = st == FI_OK ? sizeof(fi_merge_group) * (size_t)h->num_groups : 0,
                 n_req = st == FI_OK ? sizeof(fi_request_info) * (size_t)h->batch_size : 0;
    const size_t n_view = st == FI_OK ? sizeof v + sizeof *h : 0;
    s->len = sizeof st + n_view + n_indptr + n_starts + n_items + n_groups + n_req + sizeof bal;
    s->bytes = malloc(s->len);
    if (!s->bytes) {
        s->len = 0;
        return -1;
    }
    unsigned char *at = snap_put(s->bytes, &st, sizeof st);
    if (st == FI_OK) {
        at = snap_put(at, &v, sizeof v); /* the pointers themselves */
        at = snap_put(at, h, sizeof *h);
        at = snap_put(at, v.work_indptr, n_indptr);
        at = snap_put(at, v.cta_starts, n_starts);
        at = snap_put(at, v.items, n_items);
        at = snap_put(at, v.groups, n_groups);
        at = snap_put(at, v.requests, n_req);
    }
    snap_put(at, &bal, sizeof bal);
    return 0;
}

long tt_plan_snapshot_diff(const tt_plan_snapshot *a, const tt_plan_snapshot *b) {
    const size_t n = a->len < b->len ? a->len : b->len;
    for (size_t i = 0; i < n; i++)
        if (a->bytes[i] != b->bytes[i])
            return (long)i;
    return a->len == b->len ? -1 : (long)n;
}

void tt_plan_snapshot_free(tt_plan_snapshot *s) {
    free(s->bytes);
    memset(s, 0, sizeof *s);
}
