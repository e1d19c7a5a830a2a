/*
 * fiattn_work.h - the plan's shared structures, defined once for the C planner, the CUDA
 * executor, the CPU reference executor and viz/.  Plain C (also compiled by nvcc), fixed
 * sizes checked by static asserts, int32 fields, no pointers: the bytes are copied as they
 * are from pinned staging to the device workspace.
 *
 * Vocabulary (docs/DESIGN.md): a request b has q_len query rows and kv_len keys.  A "row"
 * of the attention problem is one (query token, query head) pair.  A *tile* is the set of
 * rows one CTA computes at once: rows [q_begin, q_end) x heads [head_begin, head_end) of
 * one request (all heads of a tile share one KV head).  A tile whose KV range is cut
 * between CTAs becomes several *split items*, one merge group.
 */
#ifndef FIATTN_WORK_H
#define FIATTN_WORK_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
#define FI_STATIC_ASSERT static_assert
#else
#define FI_STATIC_ASSERT _Static_assert
#endif
/* Inline helpers here are callable from device code too (the device planner). */
#ifdef __CUDACC__
#define FI_WORK_INLINE __host__ __device__ inline
#else
#define FI_WORK_INLINE static inline
#endif

/* One CTA-sized task.  32 bytes, 16-byte aligned (two 16-byte loads on the device). */
typedef struct fi_work_item {
    int32_t request;     /* b */
    int16_t head_begin;  /* first query head of the tile */
    int16_t head_end;    /* one past the last query head; kv head = head_begin / group */
    int32_t q_begin;     /* first query row within the request, 0 <= q_begin < q_len */
    int32_t q_end;       /* one past the last query row */
    int32_t kv_begin;    /* first key token (request-local) this item reads */
    int32_t kv_end;      /* one past the last key token; kv_begin == kv_end: empty (zeros) */
    int32_t out_slot;    /* < 0: write the final output; else partial slot index (fp32 O/LSE) */
    int32_t merge_group; /* < 0 if unsplit; else index into the merge table */
} fi_work_item;
FI_STATIC_ASSERT(sizeof(fi_work_item) == 32, "fi_work_item must stay 32 bytes");

/* One split tile: its partials sit in consecutive slots first_slot .. first_slot +
 * num_splits - 1, in split (KV) order, and are merged in that order in the same launch
 * (by the last CTA to arrive, or by all the group's CTAs for large groups: docs/DESIGN.md).
 * The semaphore of group g is semaphores[g] (u32, self-resetting).  32 bytes. */
typedef struct fi_merge_group {
    int32_t request;
    int16_t head_begin;
    int16_t head_end;
    int32_t q_begin;
    int32_t q_end;
    int32_t first_slot;
    int32_t num_splits;  /* >= 2 */
    int32_t first_item;  /* index of its first piece in KV order (the pieces may lie in any
                            CTAs and in any order in the item list: find them by merge_group
                            or out_slot) */
    int32_t reserved;
} fi_merge_group;
FI_STATIC_ASSERT(sizeof(fi_merge_group) == 32, "fi_merge_group must stay 32 bytes");

/* Per-request table the executor reads instead of the caller's host arrays.  16 bytes. */
typedef struct fi_request_info {
    int32_t q_offset;        /* first query token of the request in q / out ([tokens, H, D]) */
    int32_t q_len;
    int32_t kv_len;
    int32_t page_row_offset; /* element offset of the request's first page index in the page
                                table tensor: b * row stride (block_tables) or kv_indptr[b];
                                for a 3-D [B,2,P] table the V row follows at + P; sparse
                                plans: r * K, the first of its K flat slots (key t = slot
                                table[page_row_offset + t], < 0: no key) */
} fi_request_info;
FI_STATIC_ASSERT(sizeof(fi_request_info) == 16, "fi_request_info must stay 16 bytes");

/* Where CTA c starts: its item range and its first item with that item's request row, so
 * the executor's first read is one 64-byte record instead of the dependent chain
 * work_indptr -> items -> requests (~1 us a link at launch, measured: BENCHMARKS.md).
 * A CTA without items has item_begin == item_end and zeroed first / request. */
typedef struct fi_cta_start {
    fi_work_item first;       /* items[item_begin] */
    fi_request_info request;  /* requests[first.request] */
    int32_t item_begin;       /* work_indptr[c] */
    int32_t item_end;         /* work_indptr[c + 1] */
    int32_t reserved[2];      /* zero */
} fi_cta_start;
FI_STATIC_ASSERT(sizeof(fi_cta_start) == 64, "fi_cta_start must stay 64 bytes");

/* CTA c's start record from the CSR ranges (work_indptr [num_ctas + 1]), the items and the
 * request table: what the planner writes, and what hand-built plans (scripts/mla_check.cu)
 * must write too.  Pure; reads items / requests only when the CTA has an item. */
FI_WORK_INLINE fi_cta_start fi_cta_start_make(const int32_t *work_indptr, const fi_work_item *items,
                                             const fi_request_info *requests, int32_t c) {
    /* Built in registers from whole-record loads: assembled field by field on the stack,
     * the copy-out missed store forwarding (~40% of a 32-request plan update, measured). */
    const int32_t begin = work_indptr[c], end = work_indptr[c + 1];
    fi_cta_start s;
    memset(&s, 0, sizeof s);
    if (begin < end) {
        const fi_work_item first = items[begin];
        const fi_request_info request = requests[first.request];
        s.first = first;
        s.request = request;
    }
    s.item_begin = begin;
    s.item_end = end;
    return s;
}

/* Counts and shapes of the current plan, first in the plan region so a captured graph
 * picks up a new plan at replay.  64 bytes. */
typedef struct fi_plan_header {
    int32_t num_items;
    int32_t num_groups;
    int32_t num_slots;       /* partial slots in use */
    int32_t batch_size;      /* requests in the table: B (a sparse plan, caps.sparse_top_k
                                > 0: B x q_len, one per query token) */
    int32_t total_q_tokens;  /* rows of out / lse that the plan writes: sum of q_len */
    int32_t tile_rows;       /* rows per tile (q rows x heads), the partial slot height */
    int32_t kv_chunk;        /* the cost a CTA was planned for, KV-token units (items' fixed
                                costs included): the walk's cap, the equal share, or pair
                                packing's cap (planner/ppair.c); capped at INT32_MAX */
    int32_t pages_per_row;   /* P of a 3-D table (V row offset), else 0 */
    int32_t kv_split_pages;  /* 1 if the page table is [B, 2, P] */
    int32_t causal;
    int32_t window_left;
    int32_t form;            /* fi_batch_form */
    int64_t total_cost;      /* sum of item costs (cost model units) */
    int64_t max_cta_cost;
} fi_plan_header;
FI_STATIC_ASSERT(sizeof(fi_plan_header) == 64, "fi_plan_header must stay 64 bytes");

#endif /* FIATTN_WORK_H */
