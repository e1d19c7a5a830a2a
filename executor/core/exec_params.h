/*
 * executor/core/exec_params.h - the common execution block every GPU kernel family
 * carries as the first member of its parameter struct (passed by value as a
 * __grid_constant__ kernel parameter).  Plain C: filled by executor/core/run.c, read by
 * the shared device machinery (executor/cuda/persistent, executor/cuda/merge).
 *
 * Nothing here changes from one batch to the next: counts, items, requests and merge
 * groups are read from the plan region of the workspace, so a captured CUDA graph follows
 * fi_plan_update.  Strides are in elements of the tensor's dtype; last dimension contiguous.
 */
#ifndef FIATTN_EXECUTOR_EXEC_PARAMS_H
#define FIATTN_EXECUTOR_EXEC_PARAMS_H

#include <stdint.h>

#include "fiattn_work.h"

typedef struct fi_exec_common {
    /* Plan region of the workspace (device addresses at fixed layout offsets). */
    const fi_plan_header *header;
    const fi_cta_start *cta_starts;    /* [num_ctas]: a CTA's item range, first item, request */
    const fi_request_info *requests;   /* [max_batch] */
    const fi_merge_group *groups;      /* [max_groups] */
    const fi_work_item *items;         /* [max_items] */
    /* Device-only region. */
    float *partial_o;                  /* [max_slots, tile_rows, head_dim_vo] fp32 */
    float *partial_lse;                /* [max_slots, tile_rows] fp32 */
    uint32_t *semaphores;              /* [max_groups], zero at rest */
    /* Paged KV cache addressing. */
    const int32_t *page_table;         /* block_tables or kv_indices; row start = request.page_row_offset */
    int32_t page_size;                 /* power of two */
    int32_t page_shift;                /* log2(page_size) */
    /* Outputs. */
    void *out;                         /* [q_tokens, H_q, head_dim_vo], dtype o_dtype */
    int64_t out_stride_tok, out_stride_head;
    float *lse;                        /* optional [q_tokens, H_q] fp32 natural log; NULL: not written */
    int64_t lse_stride_tok, lse_stride_head;
    /* Scalars. */
    float bmm1_scale, bmm2_scale;      /* used when the pointer is NULL */
    const float *bmm1_scale_ptr;       /* optional device fp32 scalar, read at run time */
    const float *bmm2_scale_ptr;
    const float *sinks;                /* optional [H_q] fp32 (natural-log logits) */
    float o_scale;                     /* fp8 outputs only: stored = fp8(out * o_scale); else 1 */
    int32_t o_fp8;                     /* 1: out is fp8 e4m3 (families whose output type is
                                          chosen at run time: fi::OutDyn); else 0 */
    int32_t o_fp4;                     /* 1: out is NVFP4 (the context family, fi::OutDynFp4):
                                          e2m1 codes at out, strides above in e2m1 elements
                                          (twice the byte strides), scales at o_sf; else 0 */
    float o_sf_scale;                  /* NVFP4 out: the global scale g (fiattn_run.h) */
    uint8_t *o_sf;                     /* NVFP4 out: e4m3 block scales [q_tokens, H_q, D / 16] */
    int64_t o_sf_stride_tok, o_sf_stride_head; /* in bytes */
    /* Fixed shapes. */
    int32_t num_ctas;                  /* grid size */
    int32_t tile_rows;                 /* partial slot height (the output width is the
                                          family's SplitMerge parameter) */
    /* Skip-softmax (context family only; fi_attn_args' fields of the same names). */
    float skip_softmax_factor;         /* 0: exact */
    /* The KV stream's L2 policy (kv_l2_fraction): plans whose largest CTA cost is at most
     * kv_evict_first_cost stream every item's KV evict-first; -1: no item does (context
     * attention, sparse top-k plans: several tiles or requests read the same keys). */
    int32_t kv_evict_first_cost;
    int32_t kv_group;                  /* query heads a KV head, H_q / H_kv (MLA: H_q) */
    unsigned long long *skip_softmax_stats; /* optional [2]: blocks decided, skipped */
} fi_exec_common;

#endif /* FIATTN_EXECUTOR_EXEC_PARAMS_H */
