/*
 * executor/mla/mla_params.h - the MLA decode family's parameter struct: the common block
 * (executor/core/exec_params.h: plan region, partials, semaphores, page table, out / lse,
 * scales, sinks) and the family's own tensors.  Plain C, passed by value to the kernel as
 * a __grid_constant__ parameter.  Strides are in elements; the last dimension is contiguous.
 */
#ifndef FIATTN_EXECUTOR_MLA_PARAMS_H
#define FIATTN_EXECUTOR_MLA_PARAMS_H

#include <cuda.h>
#include <stdint.h>

#include "executor/core/exec_params.h"

/* The tile body's shape (executor/mla/mla_tile.cuh), which a registry row of this family
 * must match: tiles of at most 64 rows, KV blocks of 32 tokens. */
#define FI_MLA_MAX_TILE_ROWS 64
#define FI_MLA_KV_BLOCK 32
/* The wgmma tile body (executor/mla/mla_wg_tile.cuh): tiles of 64 rows' height (fewer rows
 * are zero-filled), KV blocks of 32 tokens. */
#define FI_MLA_WG_TILE_ROWS 64
#define FI_MLA_WG_KV_BLOCK 32
/* The 64-token wgmma body (executor/mla/mla_wg64_tile.cuh): 64-row tiles, 64-token blocks. */
#define FI_MLA_WG64_KV_BLOCK 64
/* The transposed fp8 body (executor/mla/mla_wgt_tile.cuh): tiles of at most 16 rows (wgmma's
 * N), KV blocks of 64 tokens (its M). */
#define FI_MLA_WGT_TILE_ROWS 16
#define FI_MLA_WGT_KV_BLOCK 64

typedef struct fi_mla_block {
    const void *q_nope;          /* [q_tokens, H_q, 512] */
    int64_t q_nope_stride_tok, q_nope_stride_head;
    const void *q_pe;            /* [q_tokens, H_q, 64] */
    int64_t q_pe_stride_tok, q_pe_stride_head;
    const void *ckv;             /* [num_pages, page_size, 512] (K and V) */
    int64_t ckv_stride_page, ckv_stride_tok;
    const void *kpe;             /* [num_pages, page_size, 64] */
    int64_t kpe_stride_page, kpe_stride_tok;
    /* fp8 e4m3 KV (wgmma body, fp16 matmuls): q's storage type, converted to fp16 as Q
     * is loaded. */
    int32_t kv_e4m3;             /* 1: the cache is fp8 e4m3 (the e4m3 instantiation) */
    int32_t q_kind;              /* FI_MLA_Q_*: 0 for the 16-bit instantiations */
    /* Sparse top-k plans (fi_caps.sparse_top_k): the page table's entries are flat KV
     * slots (page * page_size + offset), one per key; a negative entry or one >= kv_slots
     * is no key (zero-filled, its score -inf). */
    int32_t sparse;              /* 1: sparse plan; 0: page indices */
    int64_t kv_slots;            /* num_pages * page_size */
} fi_mla_block;

/* fi_mla_block.q_kind */
#define FI_MLA_Q_F16 0
#define FI_MLA_Q_E4M3 1
#define FI_MLA_Q_BF16 2

typedef struct fi_mla_params {
    fi_exec_common c;
    fi_mla_block m;
    /* The wgmma bodies' caches by TMA (mla_host.c): ckv and kpe as 3-D tensor maps,
     * innermost first [512 or 64, page_size, num_pages] with the views' strides, boxes of
     * 128 bytes (64 bytes for an fp8 kpe) x 8 tokens x 1 page in the 128-byte (64-byte)
     * swizzle: one panel's rows of one producer warp's 8 tokens.  The kernel reads them
     * from the __grid_constant__ parameter (64-byte aligned, as CUtensorMap is declared). */
    CUtensorMap tma_ckv, tma_kpe;
    int32_t tma_on; /* 1: maps encoded; 0: every block by cp.async (sparse cache, an fp8
                       cache under a 16-bit q, page_size < 8, strides TMA cannot take, no
                       driver entry point, the mma.sync body) */
    int32_t tma_box_rows; /* tokens a box: 8 (the 32-token body: a producer warp's tokens),
                             64 (the 64-token body: a whole block, page_size >= 64) or
                             min(64, page_size) (the transposed fp8 body: a page of a block) */
} fi_mla_params;

#endif /* FIATTN_EXECUTOR_MLA_PARAMS_H */
