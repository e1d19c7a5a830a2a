/*
 * executor/context/ctx_params.h - the context family's parameter struct: the GQA family's
 * common block and tensors (executor/gqa/gqa_params.h: q, paged k / v views) and the TMA
 * tensor maps of the k and v views, which the host encodes for each fi_run (ctx_host.c).
 * Plain C, passed by value to the kernel as a __grid_constant__ parameter: the kernel's
 * TMA copies read the maps from there (64-byte aligned, as CUtensorMap is declared).
 */
#ifndef FIATTN_EXECUTOR_CTX_PARAMS_H
#define FIATTN_EXECUTOR_CTX_PARAMS_H

#include <cuda.h>
#include <stdint.h>

#include "executor/gqa/gqa_params.h"

typedef struct fi_ctx_params {
    fi_exec_common c; /* first, as in every family's parameters (kernel.cuh reads p.c) */
    fi_gqa_block g;
    /* k / v as 4-D tensor maps, innermost first [D, page_size, H_kv, num_pages] with the
     * views' strides, boxes of 64 elements x tma_box tokens x 1 x 1 in the 128-byte swizzle
     * (the panels ctx_tile.cuh's wgmma read). */
    CUtensorMap tma_k, tma_v;
    int32_t tma_box; /* tokens a box: min(page_size, the kernel's KV block); 0: no maps (KV
                        not in the q dtype, page_size < 8, strides TMA cannot take, or no
                        driver entry point), every block by cp.async */
    int32_t reserved;
} fi_ctx_params;

#endif /* FIATTN_EXECUTOR_CTX_PARAMS_H */
