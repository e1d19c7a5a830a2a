/*
 * executor/gqa/gqa_params.h - the GQA decode family's parameter struct: the common block
 * (executor/core/exec_params.h: plan region, partials, semaphores, page table, out / lse,
 * scales, sinks) and the family's own tensors.  Plain C, passed by value to the kernel as
 * a __grid_constant__ parameter.  Strides are in elements of the tensor's dtype; the last
 * dimension is contiguous.
 */
#ifndef FIATTN_EXECUTOR_GQA_PARAMS_H
#define FIATTN_EXECUTOR_GQA_PARAMS_H

#include <stdint.h>

#include "executor/core/exec_params.h"

/* The tile body's shape (executor/gqa/gqa_tile.cuh), which a registry row of this family
 * must match: tiles of at most 64 rows (query heads of one KV head x query tokens). */
#define FI_GQA_MAX_TILE_ROWS 64

typedef struct fi_gqa_block {
    const void *q;               /* [q_tokens, H_q, D] */
    int64_t q_stride_tok, q_stride_head;
    const void *k;               /* [num_pages, page_size, H_kv, D]: any order of the first
                                    three axes (NHD, HND, one tensor or a (K, V) pair) */
    int64_t k_stride_page, k_stride_tok, k_stride_head;
    const void *v;               /* as k */
    int64_t v_stride_page, v_stride_tok, v_stride_head;
    int32_t group;               /* H_q / H_kv: query head h reads KV head h / group */
    int32_t head_dim;            /* D: picks the instantiation (64, 128, 256) */
    int32_t kv_kind;             /* 0: k / v in the q dtype; 1: fp8 e4m3; 2: NVFP4 (e2m1 bytes
                                    + k_sf / v_sf); the quantisation's global scale is folded
                                    into the bmm scales by the caller */
    int32_t reserved;
    const void *k_sf;            /* NVFP4: e4m3 bytes [num_pages, page_size, H_kv, D / 16] */
    int64_t k_sf_stride_page, k_sf_stride_tok, k_sf_stride_head;
    const void *v_sf;
    int64_t v_sf_stride_page, v_sf_stride_tok, v_sf_stride_head;
} fi_gqa_block;

typedef struct fi_gqa_params {
    fi_exec_common c;
    fi_gqa_block g;
} fi_gqa_params;

#endif /* FIATTN_EXECUTOR_GQA_PARAMS_H */
