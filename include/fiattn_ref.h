/*
 * fiattn_ref.h - the two CPU references (no GPU needed).
 *
 * fi_ref_run: the CPU reference executor.  Runs *the plan* exactly as the GPU executor
 *   does (every work item over its KV range, fp32 partial O / LSE per split slot, merge in
 *   split order), on host fp32 tensors.  Agreement with fi_naive_attention proves the
 *   partition and the merge without a GPU.
 * fi_naive_attention: fp64 attention with no plan at all; defines the right answer.
 *
 * Both take the fi_attn_args of fiattn_run.h with host pointers: q/q_rope/k/k_rope/v
 * FI_DTYPE_F32, F16, BF16, E4M3 or E5M2 (fp8 values widened exactly, no scale of their
 * own: fold dequantisation into bmm1_scale / bmm2_scale; any element strides), out
 * F32/F16/BF16 (rounded to nearest even at the end), lse F32, page_table FI_DTYPE_I32,
 * scale pointers and sinks host fp32.  NVFP4 (FI_DTYPE_E2M1) tensors, which caps accept
 * for GQA decode KV, are not read by the CPU references: FI_ERR_UNSUPPORTED_DTYPE.
 * Semantics, including non-finite inputs (NaN / Inf): fiattn_run.h.  Neither writes
 * anything when it returns an error.
 *
 * Sparse top-k plans and batches (fi_caps.sparse_top_k = K > 0, MLA decode): query token
 * (b, i) is row r = b * q_len + i of q, out and lse, and it attends to exactly the keys at
 * the non-negative slots of row r of the [B * q_len, K] table (page_table given as
 * [B, q_len, K] or [B * q_len, K] int32): slot s is offset s % page_size of page
 * s / page_size of the ckv / kpe caches.  A negative entry is no key (nothing read); a slot
 * listed twice is two keys; a row without a valid slot is empty (out 0, lse -inf; with a
 * sink, lse = the sink and out 0).  No causal rule, no window; seq_lens select nothing.
 * bmm1 / bmm2 / sinks as for dense batches.  fi_naive_attention reads the slots from
 * batch.block_tables (the array it validated) in a loop of its own, written for reading.
 */
#ifndef FIATTN_REF_H
#define FIATTN_REF_H

#include "fiattn_run.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Execute a host or device plan's current host view on the CPU, keys in 64-token blocks
 * with FlashAttention-2's fp32 online softmax (Dao 2023), split partials merged in split
 * order with the flash-decoding LSE weights.
 * Scratch (partials) is allocated with the plan's allocator for the call and freed.
 * @return FI_OK; FI_ERR_NOT_PLANNED; FI_ERR_NULL_ARGUMENT; FI_ERR_SHAPE_MISMATCH (also a
 *   page table shorter than the plan reads: fewer rows or columns, or an indptr
 *   kv_indices shorter than its last used index); FI_ERR_BAD_STRIDE (a page-table stride
 *   other than the plan assumed); FI_ERR_MISALIGNED_POINTER (a base not aligned to its
 *   element size); FI_ERR_UNSUPPORTED_DTYPE; FI_ERR_OUT_OF_MEMORY; FI_ERR_PLAN_OVER_CAPS (an item or
 *   group indexes outside the plan's requests / rows / slots: a planner bug).
 *   Writes out (and lse) rows of the plan. */
fi_status fi_ref_run(const fi_plan *plan, const fi_attn_args *args);

/* Naive fp64 attention straight from a batch description (no plan).
 * caps: kind, heads, dims, page_size as for the plan.  Scratch from libc malloc.
 * @return FI_OK, the same validation statuses as fi_plan_update, the argument statuses of
 *   fi_ref_run, or FI_ERR_OUT_OF_MEMORY. */
fi_status fi_naive_attention(const fi_caps *caps, const fi_batch *batch,
                             const fi_attn_args *args);

#ifdef __cplusplus
}
#endif
#endif /* FIATTN_REF_H */
