/*
 * fiattn.h - public C11 API of fiattn: plan-once, run-many paged attention.
 *
 * A host planner turns a batch description (page tables + lengths) into a balanced
 * split-k work list laid out in a fixed workspace; a persistent CUDA executor (or the CPU
 * reference executor, include/fiattn_ref.h) consumes it.
 *
 *   size_t n;   fi_workspace_size(&caps, &n);          // once, from the caps
 *   cudaMalloc(&ws, n);  fi_plan_create(&caps, ws, n, NULL, &plan);
 *   every step: fi_plan_update(plan, &batch, stream);  // host only, no device sync
 *               fi_run(plan, &args, stream);           // graph-capturable (fiattn_run.h)
 *   fi_plan_destroy(plan);
 *
 * Conventions for every function here:
 *  - Lengths are in tokens, sizes in bytes, head dims in elements; indices are int32.
 *  - Host arrays passed in are only read, and only during the call (the library keeps no
 *    pointer to them).  Device memory passed in stays owned by the caller and must outlive
 *    the plan.
 *  - Every function returns an fi_status; on any error nothing the caller owns is written
 *    and a plan keeps its previous contents.  The library never exits, aborts or prints.
 *
 * The shared structures the plan is made of (work items, merge groups, request table) are
 * defined once, in fiattn_work.h.
 */
#ifndef FIATTN_H
#define FIATTN_H

#include <stddef.h>
#include <stdint.h>

#include "fiattn_work.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FIATTN_VERSION_MAJOR 0
#define FIATTN_VERSION_MINOR 1
#define FIATTN_VERSION_PATCH 0

/* Status codes.  Values are fixed forever (they cross language bindings); new codes are
 * only ever appended. */
typedef enum fi_status {
    FI_OK = 0,
    FI_ERR_NULL_ARGUMENT = 1,          /* a required pointer was NULL */
    FI_ERR_INVALID_CAPS = 2,           /* a cap is <= 0 or inconsistent (e.g. H_q % H_kv) */
    FI_ERR_UNSUPPORTED_KIND = 3,
    FI_ERR_UNSUPPORTED_HEAD_DIM = 4,
    FI_ERR_UNSUPPORTED_PAGE_SIZE = 5,
    FI_ERR_UNSUPPORTED_DTYPE = 6,
    FI_ERR_UNSUPPORTED_HEADS = 7,      /* head count / group size outside the kind's range */
    FI_ERR_BATCH_OVER_CAPS = 8,        /* batch_size > caps.max_batch */
    FI_ERR_Q_TOKENS_OVER_CAPS = 9,     /* sum of q_len > caps.max_q_tokens */
    FI_ERR_Q_LEN_UNSUPPORTED = 10,     /* q_len outside the kind's range (decode: 1..8; MLA
                                          decode in the INDPTR form: >= 1) */
    FI_ERR_NEGATIVE_LENGTH = 11,       /* a q_len or kv_len < 0 */
    FI_ERR_INDPTR_NOT_MONOTONE = 12,   /* an indptr / cum_seq_lens array decreases or !starts at 0 */
    FI_ERR_INCONSISTENT_LENGTHS = 13,  /* e.g. seq_lens != cum_seq_lens_kv diff, q_len > kv_len */
    FI_ERR_SEQ_LEN_EXCEEDS_PAGES = 14, /* kv_len needs more pages than the request's row holds */
    FI_ERR_PAGE_INDEX_OUT_OF_RANGE = 15, /* a used page index < 0 or >= caps.num_pages */
    FI_ERR_INVALID_WINDOW = 16,        /* window_left < -1 */
    FI_ERR_WORKSPACE_TOO_SMALL = 17,   /* see fi_workspace_size(); detail.needed has the bytes */
    FI_ERR_WORKSPACE_MISALIGNED = 18,  /* workspace not 256-byte aligned */
    FI_ERR_STREAM_CAPTURING = 19,      /* fi_plan_update called while its stream is captured */
    FI_ERR_CUDA = 20,                  /* a CUDA runtime call failed; detail.cuda_error has it */
    FI_ERR_NO_DEVICE = 21,             /* a device-backed call without a usable CUDA device */
    FI_ERR_OUT_OF_MEMORY = 22,         /* host allocation (at create only) failed */
    FI_ERR_PLAN_OVER_CAPS = 23,        /* derived bound exceeded (items/groups/slots): a bug */
    FI_ERR_NOT_PLANNED = 24,           /* run before the first successful fi_plan_update */
    FI_ERR_SHAPE_MISMATCH = 25,        /* a tensor's shape disagrees with caps / plan */
    FI_ERR_BAD_STRIDE = 26,            /* a stride the executor cannot take (last dim must be 1) */
    FI_ERR_MISALIGNED_POINTER = 27,    /* a tensor base not 16-byte aligned */
    FI_ERR_INVALID_FORM = 28,          /* batch form not valid for the caps' kind */
    FI_ERR_INVALID_ARGUMENT = 29,      /* any other out-of-range scalar argument */
    FI_ERR_HOST_PLAN = 30,             /* a device operation on a plan created without workspace */
    FI_ERR_UNSUPPORTED_VARIANT = 31,   /* caps.variant names no row of the kind's tile table */
    /* Caps over the documented limits (FI_LIMIT_* below): */
    FI_ERR_MAX_BATCH_OVER_LIMIT = 32,     /* caps.max_batch > FI_LIMIT_MAX_BATCH */
    FI_ERR_MAX_Q_TOKENS_OVER_LIMIT = 33,  /* caps.max_q_tokens > FI_LIMIT_MAX_Q_TOKENS */
    FI_ERR_NUM_PAGES_OVER_LIMIT = 34,     /* caps.num_pages > FI_LIMIT_NUM_PAGES */
    FI_ERR_NUM_CTAS_OVER_LIMIT = 35,      /* caps.num_ctas (resolved) > FI_LIMIT_NUM_CTAS */
    FI_ERR_PLAN_OVER_LIMIT = 36,          /* the caps' plan bound (tiles + cuts, workspace/
                                             layout.h) > FI_LIMIT_PLAN_ITEMS */
    /* Batch scalars (fi_batch_validate): */
    FI_ERR_NEGATIVE_BATCH_SIZE = 37,      /* batch.batch_size < 0 */
    FI_ERR_INVALID_CAUSAL = 38,           /* batch.causal not 0 / 1 */
    FI_ERR_NEGATIVE_PAGES_PER_SEQ = 39,   /* batch.max_pages_per_seq < 0 */
    FI_ERR_INVALID_KV_SPLIT = 40,         /* batch.kv_split_pages not 0 / 1 */
    FI_ERR_PAGE_TABLE_TOO_LARGE = 41,     /* B x max_pages_per_seq (x 2 with kv_split_pages)
                                             > INT32_MAX: row offsets would overflow int32 */
    FI_ERR_GRID_NOT_RESIDENT = 42,        /* fi_run: caps.num_ctas > the CTAs the device holds
                                             resident at once (SMs x occupancy); the in-kernel
                                             merge needs the whole grid resident */
    /* Device planning (fi_plan_update_device): */
    FI_ERR_DEVICE_BATCH_OVER_DECLARED = 43, /* the step's batch on the device is larger than
                                             its fi_device_batch declared: batch size,
                                             query tokens or kv_indices entries */
    FI_ERR_PLAN_ON_DEVICE = 44,           /* the current plan was made on the device: its
                                             bytes exist only in the workspace (no host
                                             view, no balance) */
    FI_ERR_SPARSE_UNSUPPORTED = 45,       /* caps.sparse_top_k > 0 where sparse top-k is not
                                             defined: a kind other than FI_KIND_MLA_DECODE,
                                             a form other than FI_FORM_BLOCK_TABLES, a 3-D
                                             table, window_left != -1, device planning */
    FI_ERR_SPARSE_TOP_K_MISMATCH = 46,    /* sparse plan: batch.max_pages_per_seq (the row
                                             length of the top-k table) != caps.sparse_top_k */
    FI_ERR_SKIP_SOFTMAX_UNSUPPORTED = 47, /* fi_run: skip_softmax_threshold_scale_factor > 0
                                             for a kind other than FI_KIND_CONTEXT */
    FI_ERR_UNSUPPORTED_SF_VEC_SIZE = 48,  /* fi_run, NVFP4 out: fi_attn_args.o_sf_vec_size
                                             neither 0 nor 16 (one scale a 16-element block
                                             is the only NVFP4 block size) */
} fi_status;

/* Documented limits of fi_caps (each violation has its own status above).  They keep every
 * count and offset of a plan in int32 and the host memory of fi_plan_create bounded (two
 * staging copies of the plan region plus the planner's scratch: at most a few hundred MiB,
 * whatever the caps). */
#define FI_LIMIT_MAX_BATCH (1 << 16)      /* requests per batch */
#define FI_LIMIT_MAX_Q_TOKENS (1 << 20)   /* query tokens per batch */
#define FI_LIMIT_NUM_PAGES (1 << 30)      /* pages in the KV cache */
#define FI_LIMIT_NUM_CTAS (1 << 14)       /* persistent CTAs */
#define FI_LIMIT_SPARSE_TOP_K (1 << 17)   /* caps.sparse_top_k: keys per query token */
#define FI_LIMIT_PLAN_ITEMS (1 << 20)     /* work items a plan may need: tiles + num_ctas - 1 */
#define FI_LIMIT_QO_HEADS 32767           /* num_qo_heads (FI_ERR_UNSUPPORTED_HEADS) */

/* Name of a status ("FI_ERR_BATCH_OVER_CAPS"); never NULL ("FI_STATUS_UNKNOWN"). */
const char *fi_status_name(fi_status status);

/* Context for the last error on a plan, enough to act on without a debugger. */
typedef struct fi_error_detail {
    fi_status status;   /* same as the last non-OK return on this plan (FI_OK if none) */
    int64_t needed;     /* bytes / count the call needed (over-caps, too-small errors), else -1 */
    int64_t limit;      /* the cap or size it was checked against, else -1 */
    int32_t request;    /* the offending request index b, else -1 */
    int32_t cuda_error; /* cudaError_t value for FI_ERR_CUDA, else 0 */
} fi_error_detail;

/* Attention families, one per reference API group. */
typedef enum fi_kind {
    FI_KIND_MLA_DECODE = 1,  /* trtllm_batch_decode_with_kv_cache_mla, xqa_mla,
                                BatchMLAPagedAttentionWrapper (decode + incremental prefill) */
    FI_KIND_GQA_DECODE = 2,  /* xqa_batch_decode_with_kv_cache */
    FI_KIND_CONTEXT = 3,     /* trtllm_batch_context_with_kv_cache */
} fi_kind;

typedef enum fi_dtype {
    FI_DTYPE_F32 = 1,
    FI_DTYPE_F16 = 2,
    FI_DTYPE_BF16 = 3,
    FI_DTYPE_E4M3 = 4,  /* fp8 e4m3 (xqa_mla) */
    FI_DTYPE_I32 = 5,   /* page tables */
    FI_DTYPE_E5M2 = 6,  /* fp8 e5m2 */
    FI_DTYPE_E2M1 = 7,  /* NVFP4 values (fp4 e2m1), two per byte, low nibble first; a tensor
                           of them is described in bytes (last dim head_dim / 2, strides in
                           bytes); its block scales travel in fi_attn_args.k_sf / v_sf (KV)
                           or o_sf (out, FI_KIND_CONTEXT) */
} fi_dtype;

/* Capacity of a plan: fixes the workspace layout, the persistent grid and every bound.
 * Supported (checked by fi_workspace_size / fi_plan_create):
 *   MLA_DECODE: H_kv 1, H_q in {16,32,64,128}, head_dim_qk 576, head_dim_vo 512,
 *               page_size in {1,16,32,64,128}, q_len 1..8 per request (INDPTR
 *               form: any q_len >= 1, the wrapper's incremental prefill).
 *   GQA_DECODE: H_q % H_kv == 0, group 1..16, head_dim 64/128/256 (qk == vo),
 *               page_size in {1,16,32,64,128}, q_len 1..8.
 *   CONTEXT:    H_q % H_kv == 0, group 1..16, head_dim 64/128/256, any page_size above.
 */
typedef struct fi_caps {
    fi_kind kind;
    int32_t max_batch;      /* requests per batch */
    int32_t max_q_tokens;   /* sum of q_len over a batch (decode: batch * MTP depth) */
    int32_t num_pages;      /* pages in the KV cache: every page index must be < this */
    int32_t page_size;      /* tokens per page */
    int32_t num_qo_heads;   /* H_q */
    int32_t num_kv_heads;   /* H_kv (1 for MLA) */
    int32_t head_dim_qk;    /* 576 for MLA (512 ckv + 64 kpe) */
    int32_t head_dim_vo;    /* 512 for MLA */
    fi_dtype q_dtype, kv_dtype, o_dtype;
    int32_t num_ctas;       /* persistent grid size; 0 = ask the current CUDA device */
    int32_t variant;        /* executor variant of the kind (tile shape and kernel; 0 = the
                               kind's default, which for FI_KIND_MLA_DECODE is the wgmma
                               body (variant 3) from 32 heads on, the 64-token wgmma body
                               (variant 6) from 128 heads on a bf16 / fp16 cache of
                               page_size >= 64, the transposed fp8 body (variant 7) when
                               q and cache are fp8 e4m3 and group x ceil(max_q_tokens /
                               max_batch) <= 16, and the mma.sync body below 32 heads;
                               for FI_KIND_GQA_DECODE tiles of at most 8 rows on the kernel
                               that holds only the transposed consumers (row 2) when
                               group x ceil(max_q_tokens / max_batch) <= 8, else 64-row
                               tiles (row 0, also by number as 3); a request of more rows
                               than that bound still runs, in more tiles); rows:
                               docs/DESIGN.md, the tile table */
    /* Appended in 0.3 (zero keeps the dense behaviour): */
    int32_t sparse_top_k;   /* MLA_DECODE, BLOCK_TABLES form only: K > 0 makes the plan
                               sparse (DeepSeek sparse attention, the reference's
                               sparse_mla_top_k): batch.block_tables is [B, q_len, K] int32
                               (batch.max_pages_per_seq = K), entry = the flat KV slot
                               page * page_size + offset of a key that query token attends to,
                               -1 (any negative) = no key; query token (b, i) attends to
                               exactly its listed slots (no causal rule; seq_lens validated
                               >= 0, not used to select keys).  Planned as B x q_len
                               requests of q_len 1 and kv_len K (the request table holds
                               max(max_batch, max_q_tokens) entries); host planning
                               only (fi_plan_update_device: FI_ERR_SPARSE_UNSUPPORTED).  0 <= K <= FI_LIMIT_SPARSE_TOP_K
                               (else FI_ERR_INVALID_CAPS). */
} fi_caps;

/* Check caps against the supported sets above: kind; a tile table row for (kind, variant);
 * positive max_batch, max_q_tokens, num_pages, num_qo_heads, num_kv_heads, page_size and
 * num_ctas >= 0 (0 is resolved later, against the device); the FI_LIMIT_* limits; heads
 * (H_q <= FI_LIMIT_QO_HEADS), head dims, page size and dtypes (q, kv: F32 (CPU reference),
 * F16, BF16, E4M3, E5M2; kv also E2M1 (NVFP4) for FI_KIND_GQA_DECODE and FI_KIND_CONTEXT;
 * out: F32, F16, BF16, E4M3 (fp8 output of the GQA decode family, with fi_attn_args.o_scale; the CPU
 * references return FI_ERR_UNSUPPORTED_DTYPE for an E4M3 out tensor), and E2M1 (NVFP4, with
 * fi_attn_args.o_sf) for FI_KIND_CONTEXT only (GPU only)); the plan bound the
 * caps imply (workspace/layout.h: tiles + num_ctas - 1 items) <= FI_LIMIT_PLAN_ITEMS.
 * Which executor runs which dtypes: fiattn_run.h (fi_run) and fiattn_ref.h (CPU
 * references: F32 / F16 / BF16 / E4M3 / E5M2 inputs, not E2M1).
 * Pure: no CUDA call, nothing written.  fi_workspace_size, fi_plan_create and
 * fi_naive_attention call it.
 * @return, for the first rule broken in this order: FI_OK; FI_ERR_NULL_ARGUMENT;
 *   FI_ERR_UNSUPPORTED_KIND; FI_ERR_UNSUPPORTED_VARIANT (no tile table row for kind and
 *   caps.variant); FI_ERR_INVALID_CAPS (a maximum <= 0, num_ctas < 0, H_q % H_kv != 0,
 *   sparse_top_k < 0 or > FI_LIMIT_SPARSE_TOP_K);
 *   FI_ERR_MAX_BATCH_OVER_LIMIT; FI_ERR_MAX_Q_TOKENS_OVER_LIMIT; FI_ERR_NUM_PAGES_OVER_LIMIT;
 *   FI_ERR_NUM_CTAS_OVER_LIMIT; FI_ERR_UNSUPPORTED_HEADS; FI_ERR_UNSUPPORTED_HEAD_DIM;
 *   FI_ERR_UNSUPPORTED_PAGE_SIZE; FI_ERR_UNSUPPORTED_DTYPE; FI_ERR_SPARSE_UNSUPPORTED
 *   (sparse_top_k > 0 for a kind other than FI_KIND_MLA_DECODE); FI_ERR_PLAN_OVER_LIMIT
 *   (a sparse plan's bound counts max(max_batch, max_q_tokens) requests). */
fi_status fi_caps_validate(const fi_caps *caps);

/* Bytes of device workspace a plan with these caps needs (256-byte aligned regions: work
 * items, CTA ranges, request table (max_batch entries; a sparse plan's
 * max(max_batch, max_q_tokens): one per query token), merge table, counts, fp32 partial O
 * and LSE, semaphores).  Depends only on *caps (num_ctas 0 is resolved against the current device).
 * Computed with checked arithmetic: never a wrapped, too-small size.
 * @return FI_OK and *bytes, or the caps' validation status, FI_ERR_NO_DEVICE (num_ctas 0
 *   without a device), FI_ERR_PLAN_OVER_LIMIT (the resolved num_ctas takes the plan bound
 *   over FI_LIMIT_PLAN_ITEMS); *bytes untouched on error. */
fi_status fi_workspace_size(const fi_caps *caps, size_t *bytes);

/* Host memory hooks for the library's own small allocations (done at create only).
 * NULL, or NULL members, mean libc malloc/free.  The hooks must outlive the plan. */
typedef struct fi_allocator {
    void *(*alloc)(void *ctx, size_t bytes, size_t alignment);
    void (*free)(void *ctx, void *ptr);
    void *ctx;
} fi_allocator;

typedef struct fi_plan fi_plan;

/* Create a plan over caller-provided device memory.
 * workspace: device pointer, 256-byte aligned, >= fi_workspace_size() bytes, owned by the
 *   caller, must outlive the plan.  NULL with bytes 0 creates a host-only plan (no CUDA
 *   calls at all: for the CPU reference executor, tests and fiplan).
 * Device plans: allocate two pinned staging buffers, an event, and zero the semaphore
 *   region once (synchronously): the only sync fiattn ever does.
 * Several GPUs: a device plan belongs to the GPU that holds `workspace`
 *   (cudaPointerGetAttributes); fi_plan_create, fi_plan_update, fi_plan_update_device,
 *   fi_run and fi_plan_destroy make that GPU current for the call and give the caller's
 *   current device back, so plans of different GPUs can be used from one thread in any order
 *   or from several threads (one plan per thread at a time).  `stream` must belong to the
 *   plan's GPU.  Host memory: two copies
 *   of the plan region and the planner's scratch, both bounded by the FI_LIMIT_* caps
 *   limits; caps over a limit are refused before anything is allocated.
 * @return FI_OK and *plan; FI_ERR_WORKSPACE_TOO_SMALL (fi_workspace_size() gives the bytes),
 *   FI_ERR_WORKSPACE_MISALIGNED, a caps status, FI_ERR_NO_DEVICE, FI_ERR_CUDA,
 *   FI_ERR_OUT_OF_MEMORY.  On error *plan is left untouched. */
fi_status fi_plan_create(const fi_caps *caps, void *workspace, size_t workspace_bytes,
                         const fi_allocator *allocator, fi_plan **plan);

/* Convenience: fi_plan_create over a workspace the plan allocates (cudaMalloc) and frees. */
fi_status fi_plan_create_owned(const fi_caps *caps, const fi_allocator *allocator,
                               fi_plan **plan);

/* Destroy a plan (NULL is fine).  Waits for the plan's last staging copy (event sync) so
 * pinned memory is never freed under an in-flight copy. */
void fi_plan_destroy(fi_plan *plan);

/* How a batch is described: the three forms of the reference APIs. */
typedef enum fi_batch_form {
    /* trtllm_batch_decode_with_kv_cache_mla / xqa: block_tables + seq_lens, uniform q_len. */
    FI_FORM_BLOCK_TABLES = 1,
    /* BatchMLAPagedAttentionWrapper: qo_indptr + kv_indptr + kv_indices + kv_len. */
    FI_FORM_INDPTR = 2,
    /* trtllm_batch_context_with_kv_cache: cum_seq_lens_q / cum_seq_lens_kv + block_tables
     * (+ seq_lens, checked against cum_seq_lens_kv when given).  FI_KIND_CONTEXT only. */
    FI_FORM_CUM_SEQ_LENS = 3,
} fi_batch_form;

/* One step's batch, all arrays on the host, int32.  Only the members of `form` are read. */
typedef struct fi_batch {
    fi_batch_form form;
    int32_t batch_size;         /* B */
    /* FI_FORM_BLOCK_TABLES and FI_FORM_CUM_SEQ_LENS: */
    const int32_t *block_tables; /* [B, max_pages_per_seq] or, kv_split_pages, [B, 2, max_pages_per_seq] */
    int32_t max_pages_per_seq;   /* row length of block_tables (its stride in elements) */
    int32_t kv_split_pages;      /* 1: 3-D table, [b][0] K pages, [b][1] V pages (TRT-LLM) */
    const int32_t *seq_lens;     /* [B] kv_len (BLOCK_TABLES: required; CUM_SEQ_LENS: optional) */
    int32_t q_len_per_request;   /* BLOCK_TABLES: uniform q_len (MTP depth), 1..8 */
    /* FI_FORM_INDPTR: */
    const int32_t *qo_indptr;    /* [B+1] query token offsets */
    const int32_t *kv_indptr;    /* [B+1] offsets into kv_indices (pages) */
    const int32_t *kv_indices;   /* [kv_indptr[B]] page indices */
    const int32_t *kv_len;       /* [B] kv_len in tokens */
    /* FI_FORM_CUM_SEQ_LENS: */
    const int32_t *cum_seq_lens_q;  /* [B+1] */
    const int32_t *cum_seq_lens_kv; /* [B+1] */
    /* All forms: */
    int32_t causal;       /* 1: query row i of a request with q_len rows sees keys
                             [0, kv_len - q_len + i] (query block aligned to the end of the
                             KV range); 0: every row sees all kv_len keys.  Decode MTP and
                             context attention use 1. */
    int32_t window_left;  /* -1 unlimited; else the query at position p sees [p - window_left, p] */
} fi_batch;

/* Validate a batch against caps and normalise it into the per-request table the executors
 * read (fiattn_work.h fi_request_info), whatever its form:
 *   BLOCK_TABLES  q_offset = b * q_len_per_request, q_len = q_len_per_request,
 *                 kv_len = seq_lens[b], page_row_offset = b * P * (kv_split_pages ? 2 : 1)
 *   INDPTR        q from qo_indptr, kv_len[b], page_row_offset = kv_indptr[b]
 *   CUM_SEQ_LENS  q from cum_seq_lens_q, kv_len = cum_seq_lens_kv difference (seq_lens, if
 *                 given, must equal it), page_row_offset as BLOCK_TABLES
 *   sparse (caps.sparse_top_k = K > 0, BLOCK_TABLES only): B x q_len requests, one per
 *                 query token: request r = b * q_len + i has q_offset r, q_len 1, kv_len K,
 *                 page_row_offset r * K (block_tables read as [B * q_len, K] slots)
 * (P = max_pages_per_seq.)  fi_plan_update applies the same rules; fi_naive_attention
 * validates through it.
 * Rules, in the order checked, and their status:
 *   NULL caps / batch / requests / total_q_tokens             FI_ERR_NULL_ARGUMENT
 *   form not one of the three, or FI_FORM_CUM_SEQ_LENS for a kind other than
 *     FI_KIND_CONTEXT (the decode kinds take BLOCK_TABLES and INDPTR; context all three)
 *                                                             FI_ERR_INVALID_FORM
 *   sparse: form not BLOCK_TABLES (so INDPTR; the two rules above come first)
 *                                                             FI_ERR_SPARSE_UNSUPPORTED
 *   batch_size < 0                                            FI_ERR_NEGATIVE_BATCH_SIZE
 *   batch_size > caps.max_batch                               FI_ERR_BATCH_OVER_CAPS
 *   window_left < -1                                          FI_ERR_INVALID_WINDOW
 *   causal not 0 / 1                                          FI_ERR_INVALID_CAUSAL
 *   sparse: window_left != -1                                 FI_ERR_SPARSE_UNSUPPORTED
 *   a required array of the form NULL                         FI_ERR_NULL_ARGUMENT
 *   BLOCK_TABLES / CUM_SEQ_LENS: max_pages_per_seq < 0        FI_ERR_NEGATIVE_PAGES_PER_SEQ
 *     kv_split_pages not 0 / 1                                FI_ERR_INVALID_KV_SPLIT
 *     sparse: kv_split_pages 1 (a 3-D table)                  FI_ERR_SPARSE_UNSUPPORTED
 *     sparse: max_pages_per_seq != caps.sparse_top_k          FI_ERR_SPARSE_TOP_K_MISMATCH
 *     B x max_pages_per_seq (x 2 with kv_split_pages; sparse: x q_len_per_request, taken
 *       in 0..8) > INT32_MAX                                  FI_ERR_PAGE_TABLE_TOO_LARGE
 *   BLOCK_TABLES: q_len_per_request < 0                       FI_ERR_NEGATIVE_LENGTH
 *   INDPTR / CUM_SEQ_LENS: the q, then the kv array's first entry not 0
 *                                                             FI_ERR_INDPTR_NOT_MONOTONE
 *     (request 0, or -1 in an empty batch; needed = the entry, limit 0)
 *   INDPTR: kv_indptr decreasing anywhere (checked before any page is read)
 *                                                             FI_ERR_INDPTR_NOT_MONOTONE
 *   then per request b, in order:
 *     qo_indptr / cum_seq_lens_q / cum_seq_lens_kv decreasing at b
 *                                                             FI_ERR_INDPTR_NOT_MONOTONE
 *     CUM_SEQ_LENS with seq_lens: seq_lens[b] < 0             FI_ERR_NEGATIVE_LENGTH
 *       seq_lens[b] != the cum_seq_lens_kv difference         FI_ERR_INCONSISTENT_LENGTHS
 *     kv_len / seq_lens[b] < 0                                FI_ERR_NEGATIVE_LENGTH
 *     q_len outside the kind's range (decode kinds 1..8, MLA INDPTR >= 1, context >= 0)
 *                                                             FI_ERR_Q_LEN_UNSUPPORTED
 *     causal with 0 < kv_len < q_len                          FI_ERR_INCONSISTENT_LENGTHS
 *       (kv_len 0 is always valid: an empty request, its rows get zeros and lse -inf)
 *     sum of q_len so far > caps.max_q_tokens                 FI_ERR_Q_TOKENS_OVER_CAPS
 *     ceil(kv_len / page_size) > the pages of the request's row
 *                                                             FI_ERR_SEQ_LEN_EXCEEDS_PAGES
 *     a used page index (K and, for 3-D tables, V row) outside [0, caps.num_pages)
 *                                                             FI_ERR_PAGE_INDEX_OUT_OF_RANGE
 *   sparse, instead of the per-request rules above, per request b in order:
 *     seq_lens[b] < 0 (seq_lens select no key: only their sign is checked)
 *                                                             FI_ERR_NEGATIVE_LENGTH
 *     q_len_per_request outside 1..8                          FI_ERR_Q_LEN_UNSUPPORTED
 *     (b + 1) x q_len > caps.max_q_tokens                     FI_ERR_Q_TOKENS_OVER_CAPS
 *     a slot of its q_len table rows >= caps.num_pages x caps.page_size (any negative
 *       entry is padding: no key; needed = the slot, limit = num_pages x page_size)
 *                                                             FI_ERR_PAGE_INDEX_OUT_OF_RANGE
 *     (no causal rule: a one-token request sees all its K slots)
 * Row and token offsets then fit int32 by construction (row offsets <= the page-table
 * size, token offsets <= caps.max_q_tokens).  Only the pages a request uses are read
 * (sparse: every slot of the table).
 * caps: caps that pass fi_caps_validate.  requests: [batch->batch_size] (sparse:
 * [batch_size x q_len_per_request], at most max(caps.max_batch, caps.max_q_tokens)) out and
 * *total_q_tokens (the sum of q_len): written on success only.
 * err: may be NULL; on failure its status, request (b or -1), needed and limit say which
 *   rule broke; on success status FI_OK and the other fields -1 / 0.
 * Reads the host arrays only; no allocation.  O(B + used pages).
 * @return FI_OK or the status of the first broken rule above. */
fi_status fi_batch_validate(const fi_caps *caps, const fi_batch *batch,
                            fi_request_info *requests, int32_t *total_q_tokens,
                            fi_error_detail *err);

/* Re-plan for a new batch: validate, partition (balanced split-k), lay out, and (device
 * plans) issue ONE cudaMemcpyAsync of the used plan bytes from pinned staging to the
 * workspace on `stream` (a cudaStream_t, NULL = legacy default).  Allocates nothing, never
 * synchronises the device; staging is double-buffered and each buffer guarded by an event,
 * so an update never overwrites a copy still in flight (it waits on that event only if the
 * copy issued two updates ago is still pending).
 * Not capturable: called while `stream` is being captured it returns
 * FI_ERR_STREAM_CAPTURING.  Deterministic: the same batch gives a byte-identical plan.
 * Algorithm: contiguous cost walk of FlashMLA's decode scheduler / flash-decoding split-KV
 * (Dao et al. 2023), see planner/partition.c.
 * @return FI_OK, or a validation status (fi_plan_error() gives the request and numbers);
 *   on error the previous plan (host view and device copy) is unchanged. */
fi_status fi_plan_update(fi_plan *plan, const fi_batch *batch, void *stream);

/* One step's batch for the device planner: a fi_batch whose arrays are in device memory
 * and are read when the planning kernel runs (so a captured graph follows whatever the
 * engine's own kernels wrote there), plus what the host must know to check fi_run's
 * tensors before any length is known.
 *   batch.batch_size    the capacity B_max of the arrays (<= caps.max_batch): seq_lens
 *                       [B_max], block_tables [B_max, (2,) max_pages_per_seq], indptr arrays
 *                       [B_max + 1]; the step's own B is read from `batch_size` below.
 *   batch's pointers    device pointers, int32, 4-byte aligned, owned by the caller; they
 *                       must stay valid while any launch (or graph) that uses them runs.
 *   batch's scalars     form, max_pages_per_seq, kv_split_pages, q_len_per_request, causal,
 *                       window_left: fixed for every step planned with this description.
 * Device arrays read per step: batch_size[0], then the form's arrays of fi_batch for the
 * step's B requests, and the pages they use (fi_batch_validate's rules, applied on the
 * device in the same order, plus the three capacity rules below). */
typedef struct fi_device_batch {
    fi_batch batch;
    const int32_t *batch_size;  /* device [1]: the step's B, 0 <= B <= batch.batch_size;
                                   NULL: B = batch.batch_size every step */
    int32_t max_q_tokens;       /* rows of q / out / lse every fi_run of these steps passes;
                                   the step's sum of q_len must be <= it (<= caps.max_q_tokens) */
    int32_t kv_indices_len;     /* FI_FORM_INDPTR: elements of batch.kv_indices; the step's
                                   kv_indptr[B] must be <= it.  Ignored for the other forms. */
} fi_device_batch;

/* Plan on the device: launch fiattn's planning kernel (one CTA; for the data-parallel rows a
 * cluster of two, the second scanning the page table and checking the rules) on `stream`.  It reads the step's batch
 * from device memory, validates it (fi_batch_validate's rules and order; then
 * B, the q tokens and kv_indptr[B] against what `dbatch` declared:
 * FI_ERR_NEGATIVE_BATCH_SIZE / FI_ERR_DEVICE_BATCH_OVER_DECLARED), and writes the plan into
 * the workspace: the same bytes fi_plan_update writes for the same batch (one planner
 * source, compiled for host and device; docs/DESIGN.md section 6a).  A later fi_run on the
 * same stream executes it.  enable_pdl launches the planner with programmatic dependent
 * launch: it may start while the stream's previous kernel ends and waits for that kernel
 * before reading the batch.  It triggers its dependents once the plan is built, before it
 * copies the plan out, so an fi_run with PDL after it launches while the planner finishes
 * and reads nothing before the planner has completed (not earlier: its persistent grid
 * needs every SM).
 * Capturable: no host work depends on the lengths, nothing is copied or synchronised, so
 * the pair (fi_plan_update_device, fi_run) can be captured once and replayed for any
 * lengths the engine writes into the arrays.
 * Errors found on the device are not returned here: the kernel writes a status word into
 * the workspace (fi_plan_device_error reads it) and an empty plan (no items), so the next
 * fi_run writes nothing: out and lse keep what they held before that step.
 * Sparse plans (caps.sparse_top_k > 0) are planned on the host only: refused with
 * FI_ERR_SPARSE_UNSUPPORTED right after a NULL dbatch, before any other check or launch
 * (a host-only sparse plan gets it too); the previous plan stands.
 * Host checks, done now and returned: dbatch's scalars as fi_batch_validate checks them
 * (form, causal, window_left, max_pages_per_seq, kv_split_pages, NULL arrays, page-table
 * size with B = batch.batch_size), B_max > caps.max_batch (FI_ERR_BATCH_OVER_CAPS),
 * max_q_tokens outside [0, caps.max_q_tokens] (FI_ERR_Q_TOKENS_OVER_CAPS), kv_indices_len < 0
 * (FI_ERR_INVALID_ARGUMENT), a host-only plan (FI_ERR_HOST_PLAN), a launch error
 * (FI_ERR_CUDA).  On a host error nothing is launched and the previous plan stands.
 * After success the plan is "on the device": fi_run checks its tensors against dbatch's
 * capacities (max_q_tokens rows; B_max block-table rows of max_pages_per_seq pages, or
 * kv_indices_len entries) and requires its page table to be the very array the planner
 * validated (batch.block_tables, or batch.kv_indices: else FI_ERR_INVALID_ARGUMENT),
 * fi_plan_get_view returns FI_ERR_PLAN_ON_DEVICE and fi_plan_balance 0, and the next
 * fi_plan_update makes it a host plan again.
 * Speed: the caps' tile table row decides.  Rows with the data-parallel partition
 * (caps.variant 2 for FI_KIND_MLA_DECODE, 5 from 32 heads on (the wgmma body), 8 for q and
 * cache fp8 e4m3 at requests of at most 16 rows (the transposed fp8 body); 1 for
 * FI_KIND_GQA_DECODE, 4 for requests of at most 8 rows (the rows-8 kernel); planner/ppart.c;
 * fi_caps_parallel_variant gives the caps' own) plan
 * with the whole CTA in tens of microseconds; the default rows run the capped walk and
 * packing on one thread (milliseconds: correct, for tests and tools).
 * Allocates nothing.  Algorithm: as fi_plan_update for the default rows; flash-decoding's
 * split-KV with equal-share cuts of the cumulative cost (Dao et al. 2023) for the parallel
 * ones (docs/DESIGN.md section 6a). */
fi_status fi_plan_update_device(fi_plan *plan, const fi_device_batch *dbatch, int enable_pdl,
                                void *stream);

/* The tile-table row with the data-parallel partition that plans on the device what the
 * caps' own row runs (the row caps.variant names, or for 0 the kind's default for these
 * caps: fi_caps.variant): give its number as caps.variant to the plan fi_plan_update_device
 * updates.  MLA decode: 2 for the mma.sync body, 5 for the wgmma bodies, 8 for the
 * transposed fp8 body; GQA decode: 1, or 4 for the rows-8 row; a parallel row answers its
 * own number.  Pure (reads the static tile table); *variant written only on FI_OK.
 * @return FI_OK; FI_ERR_NULL_ARGUMENT; the status fi_caps_validate gives for invalid caps;
 *   FI_ERR_UNSUPPORTED_VARIANT when the row has no parallel counterpart (context
 *   attention, mla_decode_rows32). */
fi_status fi_caps_parallel_variant(const fi_caps *caps, int32_t *variant);

/* The device planner's verdict on the last planned step: copies the workspace status word
 * to the host on `stream` and waits for it (a stream synchronisation: call it off the hot
 * path, e.g. when an engine checks a step's health).  *detail: status (FI_OK, or the rule
 * broken, as fi_batch_validate names it), request, needed and limit as fi_plan_error gives
 * them.  @return FI_OK and *detail; FI_ERR_NULL_ARGUMENT, FI_ERR_HOST_PLAN, FI_ERR_CUDA. */
fi_status fi_plan_device_error(const fi_plan *plan, fi_error_detail *detail, void *stream);

/* Detail of the last error returned for this plan (all fields zero/-1 after success). */
fi_error_detail fi_plan_error(const fi_plan *plan);

/* The caps the plan was created with, num_ctas resolved. */
const fi_caps *fi_plan_caps(const fi_plan *plan);

/* Read-only view of the current plan (host copy, identical bytes to what was copied to the
 * device).  Valid until the next fi_plan_update / fi_plan_destroy. */
typedef struct fi_plan_view {
    const fi_plan_header *header;      /* counts, tile shape, totals */
    const int32_t *work_indptr;        /* [num_ctas + 1] CSR: CTA c runs items [c] .. [c+1]-1 */
    const fi_cta_start *cta_starts;    /* [num_ctas]: CTA c's range, first item, its request */
    const fi_work_item *items;         /* [header->num_items] */
    const fi_merge_group *groups;      /* [header->num_groups] */
    const fi_request_info *requests;   /* [header->batch_size] (sparse: one per query token) */
    int32_t num_ctas;
} fi_plan_view;

/* @return FI_OK and *view, FI_ERR_NOT_PLANNED before the first successful update,
 *   FI_ERR_PLAN_ON_DEVICE after a device update (fi_plan_update_device). */
fi_status fi_plan_get_view(const fi_plan *plan, fi_plan_view *view);

/* Balance of the current plan: max CTA cost / mean CTA cost (cost model of
 * plan/cost_model.h); 1.0 is perfect.  0 before the first update. */
double fi_plan_balance(const fi_plan *plan);

#ifdef __cplusplus
}
#endif
#endif /* FIATTN_H */
