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

/* The tile body's shape (executor/gqa/gqa_family.cuh), which a registry row of this family
 * must match: tiles of at most 64 rows (query heads of one KV head x query tokens). */
#define FI_GQA_MAX_TILE_ROWS 64
/* Items of at most this many rows run on the transposed consumers (gqa_swap.cuh); plans of
 * a registry row whose tile_rows is at most this run on the kernel that holds those
 * consumers alone (GqaRows8Family, gqa_family.cuh). */
#define FI_GQA_SWAP_ROWS 8

/* A paged view [num_pages, page_size, H_kv, W]: any order of the first three axes (NHD,
 * HND, one tensor or a (K, V) pair), W contiguous. */
typedef struct fi_gqa_paged {
    const void *data;
    int64_t stride_page, stride_tok, stride_head;
} fi_gqa_paged;

typedef struct fi_gqa_block {
    const void *q;               /* [q_tokens, H_q, D] */
    int64_t q_stride_tok, q_stride_head;
    fi_gqa_paged k, v;           /* W = D (NVFP4: D / 2 bytes) */
    int32_t group;               /* H_q / H_kv: query head h reads KV head h / group */
    int32_t head_dim;            /* D: picks the instantiation (64, 128, 256) */
    int32_t kv_kind;             /* 0: k / v in the q dtype; 1: fp8 e4m3; 2: NVFP4 (e2m1 bytes
                                    + k_sf / v_sf); the quantisation's global scale is folded
                                    into the bmm scales by the caller */
    int32_t reserved;
    fi_gqa_paged k_sf, v_sf;     /* NVFP4 only: e4m3 bytes, W = D / 16 */
} fi_gqa_block;

typedef struct fi_gqa_params {
    fi_exec_common c;
    fi_gqa_block g;
} fi_gqa_params;

#endif /* FIATTN_EXECUTOR_GQA_PARAMS_H */
