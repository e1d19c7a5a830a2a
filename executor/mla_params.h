/*
 * executor/mla_params.h - the one parameter block of the MLA decode executor.
 *
 * Plain C (read by executor/run.c and by the CUDA kernels), passed by value to the kernel
 * as a __grid_constant__ parameter.  Everything that changes from one batch to the next
 * (counts, items, requests, merge groups) is NOT here: the kernel reads it from the plan
 * region of the workspace, so a captured CUDA graph follows fi_plan_update.  What is here
 * is fixed for a captured run: tensor pointers, strides, the scales (or pointers to them),
 * and the workspace addresses.
 *
 * Strides are in elements of the tensor's dtype; the last dimension is contiguous.
 */
#ifndef FIATTN_EXECUTOR_MLA_PARAMS_H
#define FIATTN_EXECUTOR_MLA_PARAMS_H

#include <stdint.h>

#include "fiattn_work.h"

typedef struct fi_mla_params {
    /* Inputs (dtype of the instantiation: bf16 or fp16). */
    const void *q_nope;          /* [q_tokens, H_q, 512] */
    int64_t q_nope_stride_tok, q_nope_stride_head;
    const void *q_pe;            /* [q_tokens, H_q, 64] */
    int64_t q_pe_stride_tok, q_pe_stride_head;
    const void *ckv;             /* [num_pages, page_size, 512] (K and V) */
    int64_t ckv_stride_page, ckv_stride_tok;
    const void *kpe;             /* [num_pages, page_size, 64] */
    int64_t kpe_stride_page, kpe_stride_tok;
    const int32_t *page_table;   /* block_tables or kv_indices; row start = request.page_row_offset */
    /* Outputs. */
    void *out;                   /* [q_tokens, H_q, 512], dtype of the instantiation */
    int64_t out_stride_tok, out_stride_head;
    float *lse;                  /* optional [q_tokens, H_q] fp32 natural log, NULL = not written */
    int64_t lse_stride_tok, lse_stride_head;
    /* Scalars. */
    float bmm1_scale, bmm2_scale;      /* used when the pointer is NULL */
    const float *bmm1_scale_ptr;       /* optional device fp32 scalar, read at run time */
    const float *bmm2_scale_ptr;
    const float *sinks;                /* optional [H_q] fp32 (natural-log logits) */
    /* Plan region of the workspace (device addresses at fixed layout offsets). */
    const fi_plan_header *header;
    const fi_cta_start *cta_starts;    /* [num_ctas]: a CTA's item range, first item, request */
    const fi_request_info *requests;   /* [max_batch] */
    const fi_merge_group *groups;      /* [max_groups] */
    const fi_work_item *items;         /* [max_items] */
    /* Device-only region. */
    float *partial_o;                  /* [max_slots, tile_rows, 512] fp32 */
    float *partial_lse;                /* [max_slots, tile_rows] fp32 */
    uint32_t *semaphores;              /* [max_groups], zero at rest */
    /* Fixed shapes. */
    int32_t num_ctas;                  /* grid size */
    int32_t page_size;                 /* power of two */
    int32_t page_shift;                /* log2(page_size) */
    int32_t num_heads;                 /* H_q */
    int32_t tile_rows;                 /* 64: partial slot height */
} fi_mla_params;

#endif /* FIATTN_EXECUTOR_MLA_PARAMS_H */
