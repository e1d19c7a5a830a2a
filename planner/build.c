/*
 * planner/build.c - the plan region of one batch (planner/build.h): validate, tile,
 * partition, then the start records and the header.  Host C and device code (plan/hd.h).
 */
#include "planner/build.h"

#include <string.h>

#include "plan/plan.h"
#include "planner/parallel.h"
#include "planner/partition.h"
#include "planner/tiles.h"
#include "planner/validate.h"

/* CTA c's start record (fi_cta_start_make) into *dst.  On the device as whole-record
 * 16-byte loads and stores: the record assembled as a struct (memset, then field copies)
 * and stored through a generic pointer took one thread ~1.7k cycles at every batch size
 * (clock stamps, H200, docs/perf-log.md twenty-eighth session). */
FI_PD_STATIC inline void cta_start_store(fi_cta_start *dst, const int32_t *indptr,
                                         const fi_work_item *items,
                                         const fi_request_info *requests, int32_t c) {
#ifdef __CUDA_ARCH__
    FI_STATIC_ASSERT(offsetof(fi_cta_start, first) == 0 &&
                         offsetof(fi_cta_start, request) == sizeof(fi_work_item) &&
                         offsetof(fi_cta_start, item_begin) == 48 &&
                         offsetof(fi_cta_start, item_end) == 52 &&
                         offsetof(fi_work_item, request) == 0,
                     "cta_start_store: fi_cta_start is the item, the request, then the range");
    const int32_t begin = indptr[c], end = indptr[c + 1];
    uint4 item0 = make_uint4(0, 0, 0, 0), item1 = item0, request = item0;
    if (begin < end) {
        item0 = ((const uint4 *)&items[begin])[0];
        item1 = ((const uint4 *)&items[begin])[1];
        request = *(const uint4 *)&requests[(int32_t)item0.x];
    }
    uint4 *d = (uint4 *)dst;
    d[0] = item0;
    d[1] = item1;
    d[2] = request;
    d[3] = make_uint4((uint32_t)begin, (uint32_t)end, 0, 0);
#else
    *dst = fi_cta_start_make(indptr, items, requests, c);
#endif
}

/* Start records and header, shared by both builds: thread tid of nt writes every nt-th
 * record, thread 0 the header (the sequential build: 0 of 1). */
FI_PD_STATIC void finish_plan(const fi_layout *l, const fi_batch *batch, int32_t num_requests,
                              int32_t total_q, const fi_partition_result *r,
                              unsigned char *base, int32_t tid, int32_t nt) {
    const int32_t *indptr = fi_stage_work_indptr(base, l);
    const fi_work_item *items = fi_stage_items(base, l);
    const fi_request_info *requests = fi_stage_requests(base, l);
    fi_cta_start *starts = fi_stage_cta_starts(base, l);
    for (int32_t c = tid; c < l->num_ctas; c += nt)
        cta_start_store(&starts[c], indptr, items, requests, c);
    if (tid != 0)
        return;
    fi_plan_header *h = fi_stage_header(base, l);
    const int split = batch->form != FI_FORM_INDPTR && batch->kv_split_pages;
    h->num_items = r->num_items;
    h->num_groups = r->num_groups;
    h->num_slots = r->num_slots;
    h->batch_size = num_requests; /* the request table's rows (sparse: B x q_len) */
    h->total_q_tokens = total_q;
    h->tile_rows = l->tile_rows;
    h->kv_chunk = r->budget > INT32_MAX ? INT32_MAX : (int32_t)r->budget;
    h->pages_per_row = split ? batch->max_pages_per_seq : 0;
    h->kv_split_pages = split;
    h->causal = batch->causal;
    h->window_left = batch->window_left;
    h->form = batch->form;
    h->total_cost = r->total_cost;
    h->max_cta_cost = r->max_cta_cost;
}

FI_PD fi_status fi_plan_build(const fi_caps *caps, const fi_variant *v, const fi_layout *l,
                              fi_planner_scratch *s, const fi_batch *batch,
                              const int64_t *page_verdict, unsigned char *base,
                              fi_page_table_geom *geom, fi_error_detail *err) {
    fi_request_info *requests = fi_stage_requests(base, l);
    int32_t total_q = 0;
    fi_status st =
        fi_batch_check_pages(caps, batch, page_verdict, requests, &total_q, geom, err);
    FI_PD_STAMP(1);
    if (st != FI_OK)
        return st;
    const int32_t nreq = fi_batch_num_requests(caps, batch, total_q);
    int32_t num_tiles = 0;
    int64_t tile_cost = 0;
    st = fi_tiles_build(v, caps, requests, nreq, batch->causal, batch->window_left, s->tiles,
                        l->max_tiles, &num_tiles, &tile_cost, err);
    FI_PD_STAMP(2);
    if (st != FI_OK)
        return st;
    fi_merge_group *groups = fi_stage_groups(base, l);
    fi_partition_result r;
    st = fi_partition(v, s->tiles, num_tiles, tile_cost, s->tile_prefix, &s->pack, l,
                      fi_stage_work_indptr(base, l), fi_stage_items(base, l), groups,
                      s->cta_cost, &r, err);
    FI_PD_STAMP(5);
    if (st != FI_OK)
        return st;
    /* Unused tails of the copied regions are zeroed so the copied bytes depend only on the
     * batch (byte-identical plans, no stale entries from an older plan on the device). */
    fi_zero_bytes(requests + nreq, sizeof(fi_request_info) * (size_t)(l->max_batch - nreq));
    fi_zero_bytes(groups + r.num_groups,
                  sizeof(fi_merge_group) * (size_t)(l->max_groups - r.num_groups));
    FI_PD_STAMP(6);
    finish_plan(l, batch, nreq, total_q, &r, base, 0, 1);
    FI_PD_STAMP(7);
    return FI_OK;
}

/* fi_plan_build_parallel after the requests are in place (requests[] in the plan region,
 * total_q their q tokens): tiles, partition, tails, start records, header. */
FI_PD_STATIC fi_status build_parallel_from(const fi_caps *caps, const fi_variant *v,
                                           const fi_layout *l, fi_planner_scratch *s,
                                           const fi_batch *batch, int32_t total_q,
                                           unsigned char *base, fi_error_detail *err) {
    fi_request_info *requests = fi_stage_requests(base, l);
    fi_tile_set ts;
    /* No barrier before each next step: the check and the tiles each end with one after
     * their last writes. */
    const int32_t nreq = fi_batch_num_requests(caps, batch, total_q);
    fi_status st = fi_tiles_build_parallel(v, caps, requests, nreq, batch->causal,
                                           batch->window_left, s->pp.batch_scan, s->tiles,
                                           l->max_tiles, &ts, err);
    FI_PD_STAMP(2);
    if (st != FI_OK)
        return st;
    fi_merge_group *groups = fi_stage_groups(base, l);
    fi_partition_result r;
    st = fi_partition_parallel(v, &ts, s, l, fi_stage_work_indptr(base, l),
                               fi_stage_items(base, l), groups, &r, err);
    FI_PD_STAMP(5);
    if (st != FI_OK)
        return st;
    /* Tails zeroed (byte-identical plans); no barrier before the start records, which read
     * the items and the requests in use, none of the tails. */
    fi_request_info zr = {0, 0, 0, 0};
    FI_PP_FOR(b, l->max_batch - nreq)
    requests[nreq + b] = zr;
    fi_merge_group zg = {0, 0, 0, 0, 0, 0, 0, 0, 0};
    FI_PP_FOR(g, l->max_groups - r.num_groups)
    groups[r.num_groups + g] = zg;
    finish_plan(l, batch, nreq, total_q, &r, base, FI_PP_TID, FI_PP_NT);
    FI_PD_STAMP(7);
    return FI_OK;
}

FI_PD fi_status fi_plan_build_parallel(const fi_caps *caps, const fi_variant *v,
                                       const fi_layout *l, fi_planner_scratch *s,
                                       const fi_batch *batch, const int64_t *page_verdict,
                                       unsigned char *base, fi_page_table_geom *geom,
                                       fi_error_detail *err) {
    int32_t total_q = 0;
    fi_status st = fi_batch_check_parallel(caps, batch, page_verdict, s->pp.batch_scan,
                                           fi_stage_requests(base, l), &total_q, geom, err);
    FI_PD_STAMP(1);
    if (st != FI_OK)
        return st;
    return build_parallel_from(caps, v, l, s, batch, total_q, base, err);
}

FI_PD fi_status fi_plan_build_parallel_unchecked(const fi_caps *caps, const fi_variant *v,
                                                 const fi_layout *l, fi_planner_scratch *s,
                                                 const fi_batch *batch, unsigned char *base,
                                                 fi_error_detail *err) {
    const int32_t total_q =
        fi_batch_read_parallel(caps, batch, s->pp.batch_scan, fi_stage_requests(base, l));
    FI_PD_STAMP(1);
    return build_parallel_from(caps, v, l, s, batch, total_q, base, err);
}

FI_PD void fi_plan_build_empty(const fi_layout *l, unsigned char *base) {
    fi_plan_header *h = fi_stage_header(base, l);
    fi_zero_bytes(h, sizeof *h);
    h->tile_rows = l->tile_rows;
    int32_t *indptr = fi_stage_work_indptr(base, l);
    fi_cta_start *starts = fi_stage_cta_starts(base, l);
    for (int32_t c = 0; c <= l->num_ctas; c++)
        indptr[c] = 0;
    for (int32_t c = 0; c < l->num_ctas; c++)
        fi_zero_bytes(&starts[c], sizeof starts[c]);
    fi_zero_bytes(fi_stage_requests(base, l),
                  sizeof(fi_request_info) * (size_t)l->max_batch);
    fi_zero_bytes(fi_stage_groups(base, l), sizeof(fi_merge_group) * (size_t)l->max_groups);
}
