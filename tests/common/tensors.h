/*
 * tests/common/tensors.h - host tensors and attention arguments for tests and benches.
 *
 * A test tensor is an fi_tensor (fiattn_run.h) whose data the helpers below allocate:
 * logical shape as the API states it, element strides chosen by a memory order (so an
 * HND KV cache is the logical [pages, page_size, H_kv, D] view of [pages, H_kv,
 * page_size, D] memory).  Values are F32, F16 or BF16 (I32 for page tables).
 * Test-side helpers carry the tt_ prefix, so they are never mistaken for the library's
 * fi_ API.
 *
 * Typical use:
 *   tt_rng rng = {tt_test_seed()};          print the seed
 *   tt_test_attn ta;  tt_test_attn_make(&ta, &caps, &batch, &opts, &rng);
 *   tt_tensor_poison(&ta.args.out); ...run...;  tt_tensor_count_nan(&ta.args.out, rows) == 0
 *   tt_test_attn_free(&ta);
 * Every function returning int returns 0 on success, -1 on allocation failure or a bad
 * argument.  Nothing here prints or exits.
 */
#ifndef FI_TEST_TENSORS_H
#define FI_TEST_TENSORS_H

#include <stdint.h>

#include "rng.h"
#include "executor/cpu/dtype_convert.h" /* fi_f32_to_bf16_rne, fi_bf16_to_f32, fi_f16_... */
#include "fiattn_run.h"

/* ---- tensors ------------------------------------------------------------------------- */

/* Bytes per element of a dtype (the library's fi_dtype_size: E4M3/E5M2 1, F16/BF16 2,
 * F32/I32 4; 0 if unknown). */
size_t tt_dtype_size(fi_dtype dtype);

/* Allocate a tensor of logical `shape` (ndim <= FI_MAX_DIMS) and `dtype`, zero-filled.
 * mem_order: logical dims from the outermost to the innermost in memory (a permutation
 * of 0..ndim-1); NULL = row-major in logical order.  The buffer is 64-byte aligned and
 * dense (the innermost memory dim has stride 1). */
int tt_tensor_alloc(fi_tensor *t, fi_dtype dtype, int32_t ndim, const int64_t *shape,
                    const int32_t *mem_order);

/* Same dtype and logical shape as src, row-major. */
int tt_tensor_alloc_like(fi_tensor *t, const fi_tensor *src);

/* Free what tt_tensor_alloc allocated and zero *t (NULL data is fine).  Do not call it
 * on views (fi_tensor_view) or on tensors over caller memory. */
void tt_tensor_free(fi_tensor *t);

/* A view of src with its last dim narrowed to [begin, begin + width): the 512-wide and
 * 64-wide halves of a concatenated MLA [.., 576] tensor.  Shares src's memory. */
fi_tensor tt_tensor_view_last(const fi_tensor *src, int64_t begin, int64_t width);

/* Elements of the logical shape (product of shape[]). */
int64_t tt_tensor_numel(const fi_tensor *t);

/* Element offset of a logical index (idx[ndim]). */
int64_t tt_tensor_offset(const fi_tensor *t, const int64_t *idx);

/* Element at logical index, widened to double (F32/F16/BF16/I32). */
double tt_tensor_get(const fi_tensor *t, const int64_t *idx);

/* Store v at a logical index (rounded to nearest even for F16/BF16). */
void tt_tensor_set(fi_tensor *t, const int64_t *idx, double v);

/* Fresh uniform values in [-amplitude, amplitude) at every logical element. */
void tt_tensor_fill_random(fi_tensor *t, tt_rng *rng, float amplitude);

/* NaN at every logical element (quiet NaN for F16/BF16, 0x7fffffff for I32). */
void tt_tensor_poison(fi_tensor *t);

/* Convert every logical element of src into dst (same logical shape, any float dtypes). */
int tt_tensor_convert(fi_tensor *dst, const fi_tensor *src);

/* ---- checks over the written rows (dim 0 indices [0, rows)) --------------------------- */

/* NaN elements in rows [0, rows) (infinities are not counted: lse may be -inf). */
int64_t tt_tensor_count_nan(const fi_tensor *t, int64_t rows);

/* NaN or +-inf elements in rows [0, rows): "every element written and finite" is 0. */
int64_t tt_tensor_count_nonfinite(const fi_tensor *t, int64_t rows);

/* Compare a (result) with b (reference) over rows [0, rows) of the same logical shape.
 * Positions where either is not finite must hold the same value in both (e.g. -inf lse
 * of an empty row); each position where they differ counts in the return value.
 * *rel_err = ||a - b|| / ||b|| (2-norms) over the positions where both are finite
 * (0 if ||b|| = 0 and a = b there; +inf if ||b|| = 0 and a != b).
 * @return number of non-finite mismatches (0 when they agree). */
int64_t tt_tensor_compare(const fi_tensor *a, const fi_tensor *b, int64_t rows,
                          double *rel_err);

/* ---- caps ------------------------------------------------------------------------------ */

/* Caps of `kind` with fp32 q / KV / out (the CPU references' exact path), every other
 * member 0 (num_ctas, variant, sparse_top_k: set them after).  MLA takes its own dims
 * (576 / 512) whatever D says. */
fi_caps tt_test_caps(fi_kind kind, int32_t H_q, int32_t H_kv, int32_t D, int32_t page_size,
                     int32_t num_pages, int32_t max_batch, int32_t max_q_tokens);

/* ---- attention arguments --------------------------------------------------------------- */

/* Options of tt_test_attn_make.  Zero-initialised = NHD, no sinks, lse, default scales. */
typedef struct fi_test_attn_opts {
    int32_t hnd;          /* 1: KV pages laid out [page, H_kv, page_size, D] (HND) */
    int32_t sinks;        /* 1: random sinks[H_q] in [-2, 2) */
    int32_t no_lse;       /* 1: leave args.lse absent */
    int32_t scale_ptrs;   /* 1: pass bmm1/bmm2 through the pointers (values set to a
                             wrong 0 so a reader of the value instead of the pointer fails) */
    float bmm1_scale;     /* 0: 1 / sqrt(head_dim_qk) */
    float bmm2_scale;     /* 0: 1 */
    float amplitude;      /* q/k/v values uniform in [-amplitude, amplitude); 0: 1 */
} fi_test_attn_opts;

/* Everything one run needs, owned here.  args points into the members below and into
 * the batch's page table (which the caller keeps alive). */
typedef struct tt_test_attn {
    fi_caps caps;
    fi_attn_args args;
    int32_t q_tokens;     /* rows of q / out / lse: sum of q_len of the batch */
    fi_tensor q_buf;      /* [q_tokens, H_q, D_qk]  (MLA: q_nope ++ q_pe, 576) */
    fi_tensor k_buf;      /* [num_pages, page_size, H_kv, D_qk]  (MLA: ckv ++ kpe) */
    fi_tensor v_buf;      /* [num_pages, page_size, H_kv, D_vo]  (MLA: absent) */
    float *sinks;         /* [H_q] or NULL */
    float bmm1_scale, bmm2_scale;  /* targets of the scale pointers */
} tt_test_attn;

/* Query tokens of a batch (BLOCK_TABLES: B * q_len_per_request; INDPTR: qo_indptr[B];
 * CUM_SEQ_LENS: cum_seq_lens_q[B]); -1 if the arrays are missing. */
int32_t tt_test_batch_q_tokens(const fi_batch *batch);

/* Build fi_attn_args for `batch` under `caps` (MLA / GQA decode / context): random q and
 * a random KV cache of caps->num_pages pages (caps dtypes, NHD or HND), out of
 * caps->o_dtype [q_tokens, H_q, D_vo] and F32 lse [q_tokens, H_q] (both zero; poison
 * them before a run), page_table = the batch's block_tables ([B, P] or [B, 2, P]) or
 * kv_indices as an I32 view (not copied).  MLA q / k are 576-wide buffers passed as the
 * 512 + 64 views.  opts may be NULL. */
int tt_test_attn_make(tt_test_attn *ta, const fi_caps *caps, const fi_batch *batch,
                      const fi_test_attn_opts *opts, tt_rng *rng);

/* A second out / lse pair shaped like ta's (to run two executors on the same inputs). */
int tt_test_attn_alloc_outputs(const tt_test_attn *ta, fi_tensor *out, fi_tensor *lse);

/* *args = ta's arguments with out / lse of their own (tt_test_attn_alloc_outputs), both
 * poisoned (NaN): a second executor's run on the same inputs, proven to write every row.
 * Free its out / lse with tt_test_attn_args_free. */
int tt_test_attn_args_fork(const tt_test_attn *ta, fi_attn_args *args);
void tt_test_attn_args_free(fi_attn_args *args);

void tt_test_attn_free(tt_test_attn *ta);

#endif /* FI_TEST_TENSORS_H */
