/*
 * fiattn_run.h - the run side: tensors and arguments the executors take.
 *
 * The same fi_attn_args drive the CUDA executor (fi_run, device pointers) and the CPU
 * reference executor (fi_ref_run in fiattn_ref.h, host pointers, FI_DTYPE_F32 data), so
 * both implement one set of semantics:
 *
 *   s_j   = bmm1_scale * (q . k_j)                       (MLA: q_nope.ckv_j + q_pe.kpe_j)
 *   keys  = j in [lo, hi] of the row's causal / window_left range (fiattn.h fi_batch);
 *           sparse plans: the valid slots of the token's top-k row (fiattn_ref.h)
 *   den   = sum_j exp(s_j) + (sinks ? exp(sinks[h]) : 0)
 *   out   = bmm2_scale * sum_j exp(s_j) v_j / den         (MLA: v_j = ckv_j, 512 dims)
 *   lse   = log(den)  (natural log; -inf when the row has no key and no sink; out = 0 then)
 *
 * Non-finite inputs (the same in fi_run's kernels, fi_ref_run and fi_naive_attention; a
 * row is one (query token, query head); only the keys the row sees, its causal / window
 * range, and their K / V pages are read for it):
 *   - NaN is never hidden: a NaN in the row's q, in K of a key it sees, in its sink or in
 *     bmm1_scale gives a NaN logit / denominator, and the row's whole out and its lse are
 *     NaN (a NaN bmm2_scale: out only).  A NaN at dim d of V of a key the row sees makes
 *     out[d] of the row NaN (IEEE: a zero weight times NaN is NaN); its lse and other
 *     dims are unaffected.  Rows that do not see the key (masked by causal / window_left,
 *     other requests, other KV heads) get exactly what they get without the NaN, with one
 *     GPU exception: the rows of a request's KV head share fi_run's P . V matmul, so a
 *     NaN / inf in V at a key masked for one of them but seen by another (causal
 *     spec-decoding rows, window edges) also reaches the masked row's out in that dim
 *     (its zero weight times NaN); the CPU executors skip the key.  A NaN in K of a
 *     masked key never reaches the row (its logit is replaced before use).
 *   - A logit of +inf (an inf in q or K, or an overflowing dot product; an inf that meets
 *     a zero or an opposite inf gives NaN instead) makes the row's out and lse NaN, as
 *     softmax does (inf - inf).  A sink of +inf likewise.
 *   - A logit of -inf is a key of weight exactly 0; a row whose logits are all -inf (and
 *     whose sink is absent or -inf) is an empty row: out = 0, lse = -inf, V not used.
 *     Otherwise V of a -inf key is still multiplied by its zero weight (NaN / inf there
 *     gives NaN in that dim, as above).
 *   - +-inf in V of a key with a positive weight gives +-inf (or NaN) in that dim of out.
 * Never silently zeroed: a row is 0 only when it is empty as defined above.
 */
#ifndef FIATTN_RUN_H
#define FIATTN_RUN_H

#include "fiattn.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FI_MAX_DIMS 5

/* A strided view: element strides (not bytes), last stride must be 1 for the executor. */
typedef struct fi_tensor {
    void *data;                   /* NULL = absent (optional tensors) */
    fi_dtype dtype;
    int32_t ndim;
    int64_t shape[FI_MAX_DIMS];
    int64_t stride[FI_MAX_DIMS];  /* in elements */
} fi_tensor;

/* A tensor descriptor from its parts: data (borrowed, not copied), dtype, ndim, shape and
 * stride ([ndim] each, strides in elements).  At most FI_MAX_DIMS entries are copied; a
 * larger ndim is kept as given, so fi_run / fi_ref_run reject it with their shape status.
 * Unused trailing entries are 0. */
static inline fi_tensor fi_tensor_make(void *data, fi_dtype dtype, int32_t ndim,
                                       const int64_t *shape, const int64_t *stride) {
    fi_tensor t = {0};
    t.data = data;
    t.dtype = dtype;
    t.ndim = ndim;
    for (int32_t i = 0; i < ndim && i < FI_MAX_DIMS; i++) {
        t.shape[i] = shape[i];
        t.stride[i] = stride[i];
    }
    return t;
}

/* Arguments of one attention run.  Logical shapes (strides carry NHD vs HND and the
 * concatenated vs split MLA forms: a concatenated [.., 576] tensor is passed as a
 * 512-wide view and a 64-wide view at +512 elements):
 *   q          [q_tokens, H_q, D_qk]         MLA: q_nope [q_tokens, H_q, 512]
 *   q_rope     MLA only: [q_tokens, H_q, 64]  (others: data NULL)
 *   k          [num_pages, page_size, H_kv, D_qk]  MLA: ckv [num_pages, page_size, 1, 512]
 *   k_rope     MLA only: kpe [num_pages, page_size, 1, 64]
 *   v          [num_pages, page_size, H_kv, D_vo]  MLA: ignored (V is ckv)
 *   page_table int32: block_tables [B, P] / [B, 2, P], or kv_indices [nnz] (form of the plan);
 *              sparse plans: the top-k slots [B, q_len, K] or [B * q_len, K]
 *   out        [q_tokens, H_q, D_vo]  (q_tokens = header.total_q_tokens rows are written)
 *   lse        optional [q_tokens, H_q] fp32
 * q_tokens of the BLOCK_TABLES form is b * q_len_per_request + i (query [B, q_len, H, D]). */
typedef struct fi_attn_args {
    fi_tensor q, q_rope, k, k_rope, v, page_table, out, lse;
    float bmm1_scale;              /* used when bmm1_scale_ptr is NULL */
    float bmm2_scale;              /* used when bmm2_scale_ptr is NULL */
    const float *bmm1_scale_ptr;   /* optional device (host for fi_ref_run) fp32 scalar, read at run */
    const float *bmm2_scale_ptr;
    const float *sinks;            /* optional [H_q] fp32 logits added to the denominator only */
    int32_t enable_pdl;            /* 1: launch with programmatic dependent launch */
    /* Appended in 0.2 (zero-initialised args keep the 0.1 behaviour): */
    float o_scale;                 /* fp8 e4m3 out only: stored = fp8(out / o_scale), the
                                      reference APIs' o_scale; 0 is read as 1 */
    fi_tensor k_sf, v_sf;          /* NVFP4 (FI_DTYPE_E2M1) KV only: the per-16-element block
                                      scales, fp8 e4m3 bytes [num_pages, page_size, H_kv,
                                      D / 16] (any permutation of the first three axes, as
                                      k / v); absent (data NULL) otherwise */
    /* Appended in 0.3 (zero-initialised: exact attention, no statistics): */
    float skip_softmax_threshold_scale_factor; /* FI_KIND_CONTEXT only; 0: exact.  > 0: skip-
                                      softmax sparsity (BLASST, arXiv 2512.12087; TensorRT-
                                      LLM's skip softmax): a KV block of 128 keys (64 at
                                      head_dim 256) is skipped for a 64-row half tile when
                                      every row r has exp(m_block(r) - m_run(r)) < factor /
                                      kv_len (logits scaled by bmm1_scale; m_block the
                                      block's max, m_run the row's running max before it,
                                      kv_len the request's; a row with no key in the block
                                      counts as below): its exponentials and P V are not
                                      computed.  The rows' dropped probability mass is at
                                      most factor each (at most kv_len keys below factor /
                                      kv_len times the row's max term).  Which blocks exist
                                      depends on the plan's tiles and splits.  NaN scores in
                                      a skipped block are not propagated.  Negative, NaN or
                                      inf: FI_ERR_INVALID_ARGUMENT; > 0 for another kind:
                                      FI_ERR_SKIP_SOFTMAX_UNSUPPORTED.  The CPU references
                                      (fi_ref_run, fi_naive_attention) ignore it: exact. */
    unsigned long long *skip_softmax_stats; /* optional device uint64 [2], 8-byte aligned
                                      (else FI_ERR_MISALIGNED_POINTER): fi_run adds (half
                                      tiles x blocks decided, of them skipped) with atomics
                                      while the factor is > 0; the caller zeroes and reads
                                      it (borrowed). */
    /* Appended in 0.3 too (zero-initialised args keep the behaviour above): NVFP4 out, caps.o_dtype
     * FI_DTYPE_E2M1, FI_KIND_CONTEXT on the GPU only.  out is then e2m1 codes, bytes
     * [q_tokens, H_q, D / 2] (two a byte, low nibble first: element 2 k in bits 0..3 of byte
     * k); each block of 16 consecutive elements of a row (token, head) has one fp8 e4m3
     * scale s, and with the global scale g = o_sf_scale (TensorRT-LLM's NVFP4 recipe, the
     * trtllm-gen kernels' o_sf_scale, with its approximate reciprocals rcp = rcp.approx.ftz):
     *   amax = max |x_i| over the block's 16 outputs x_i (fp32, NaN if any x_i is NaN)
     *   s    = e4m3(g * (amax * rcp(6)))     round to nearest even, saturated to 448
     *   q_i  = e2m1(x_i * rcp(s * rcp(g)))   nearest even; |.| > 6 saturates to 6; 0 when s = 0
     *   so x_i ~ q_i * s / g             (dequantise: code value x scale / o_sf_scale)
     * each step one fp32 operation in this order (rcp within an ulp: a value on a rounding
     * boundary may round either way).  Error, while 2^-6 <= (amax / 6) g
     * <= 448 (s normal, not saturated): |q_i s / g - x_i| <= max(s / g, |x_i|) / 4 (half an
     * e2m1 step; s / g <= (amax / 6)(1 + 2^-4), fp32 roundings aside).  Non-
     * finite outputs: a NaN in a block makes its scale NaN (e4m3 0x7f: the whole block reads
     * back NaN); +-inf saturates (its block's scale 448, the inf element +-6). */
    fi_tensor o_sf;                /* NVFP4 out: the block scales, fp8 e4m3 bytes [>= q_tokens,
                                      H_q, D / 16], plain row-major (strides in bytes, last 1)
                                      -- the linear layout, not the 128 x 4 swizzled one of
                                      FlashInfer's trtllm-gen output; absent otherwise */
    float o_sf_scale;              /* NVFP4 out: the global scale g, finite and > 0 */
    int32_t o_sf_vec_size;         /* NVFP4 out: elements a block scale; 0 is read as 16, the
                                      only size (else FI_ERR_UNSUPPORTED_SF_VEC_SIZE) */
} fi_attn_args;

/* Run the plan's attention on the GPU (persistent executor, in-kernel split-k merge).
 * Kinds on the GPU today (sm_90a): FI_KIND_MLA_DECODE (bf16 / fp16 q, KV and out; or an
 * fp8 e4m3 cache (one byte an element, no scales inside the rows: the quantisation scales
 * go into bmm1 / bmm2) with q fp8 e4m3 / bf16 / fp16 and out bf16, on either body with
 * fp16 matmuls (another out dtype: FI_ERR_UNSUPPORTED_DTYPE); and
 * sparse top-k plans (fi_caps.sparse_top_k: page_table [B, q_len, K] or [B * q_len, K]
 * int32 flat slots, -1 = no key; the mma.sync rows: FI_ERR_SPARSE_UNSUPPORTED);
 * docs/DESIGN.md section 9b);
 * FI_KIND_GQA_DECODE (head_dim 64 / 128 / 256, q bf16 / fp16, KV the q dtype or fp8 e4m3
 * (its scale folded into bmm1 / bmm2 by the caller; fp16 matmuls), out the q dtype or fp8
 * e4m3 stored as fp8(out / o_scale); k / v any NHD / HND / one-tensor / pair strides;
 * or NVFP4: E2M1 k / v (two values a byte, low nibble first) with k_sf / v_sf, e4m3 scale
 * bytes [>= num_pages, page_size, H_kv, D / 16] views, dequantised in the kernel into fp16
 * matmuls (Hopper has no fp4 tensor cores); k_sf / v_sf absent: FI_ERR_NULL_ARGUMENT, not
 * E4M3: FI_ERR_UNSUPPORTED_DTYPE, wrong shape: FI_ERR_SHAPE_MISMATCH; k_sf / v_sf given
 * for another KV dtype: FI_ERR_INVALID_ARGUMENT); FI_KIND_CONTEXT (prefill, chunked prefill and
 * mixed prefill + decode batches: head_dim 64 / 128 / 256, q bf16 / fp16, KV the q dtype,
 * fp8 e4m3 or NVFP4 (the GQA family's k / v views, k_sf / v_sf and their statuses;
 * converted exactly to the q dtype before the matmuls), out the q dtype, fp8 e4m3 or NVFP4
 * (E2M1 out [q_tokens, H_q, D / 2] bytes with o_sf / o_sf_scale, the format above; checked
 * in this order: o_sf_vec_size not 0 / 16: FI_ERR_UNSUPPORTED_SF_VEC_SIZE; o_sf_scale not
 * finite > 0: FI_ERR_INVALID_ARGUMENT; o_sf absent: FI_ERR_NULL_ARGUMENT; not E4M3:
 * FI_ERR_UNSUPPORTED_DTYPE; not [>= q_tokens, H_q, D / 16]: FI_ERR_SHAPE_MISMATCH; last
 * stride not 1 or a negative stride: FI_ERR_BAD_STRIDE; o_sf given for another out dtype:
 * FI_ERR_INVALID_ARGUMENT), the GQA family's page tables; wgmma tiles of 128 rows,
 * executor/context/).
 * Algorithms: FlashAttention-2 online softmax and warp tiling (Dao 2023), flash-decoding
 * split-KV with an LSE-weighted merge (Dao et al. 2023), FlashMLA-style persistent decode;
 * GQA: the producer / consumer mbarrier pipeline of FlashAttention-3 (Shah et al. 2024)
 * with cp.async loads and mma.sync, tokens as the mma's M side for tiles of <= 8 rows
 * (executor/gqa/gqa_family.cuh, gqa_rows16.cuh, gqa_swap.cuh); context: FlashAttention-3's
 * warpgroup pipeline (wgmma, P in registers, softmax overlapped with the previous block's
 * P V; executor/context/ctx_tile.cuh).
 * Arguments are read during the call; device tensors stay the caller's and must stay
 * valid until the launched work completes on `stream`.
 * stream: cudaStream_t.  Graph-capturable: fixed grid, reads the plan from the workspace.
 * @return FI_OK; FI_ERR_NOT_PLANNED, FI_ERR_SHAPE_MISMATCH, FI_ERR_UNSUPPORTED_DTYPE,
 *   FI_ERR_BAD_STRIDE, FI_ERR_MISALIGNED_POINTER, FI_ERR_NULL_ARGUMENT (checked before any
 *   launch), FI_ERR_UNSUPPORTED_VARIANT (a tile shape the kind's GPU family cannot run),
 *   FI_ERR_HOST_PLAN, FI_ERR_GRID_NOT_RESIDENT (caps.num_ctas exceeds the CTAs the
 *   device can hold resident at once: SMs x occupancy of the kernel; nothing launched;
 *   plan with num_ctas 0 = the SM count, or fewer), FI_ERR_CUDA (launch failure). */
fi_status fi_run(const fi_plan *plan, const fi_attn_args *args, void *stream);

/* May fi_run execute plans of these caps on the GPU?  Pure: reads the caps and the
 * registration table of (kind, variant) rows, makes no CUDA call, writes nothing; callable
 * on a machine without a GPU and while a stream is being captured.  It answers for the
 * kind and variant only: the dtype combinations a GPU family instantiates are checked by
 * fi_run itself before any launch (FI_ERR_UNSUPPORTED_DTYPE), e.g. MLA decode runs bf16 /
 * fp16 q, KV and out today.
 * caps: as for fi_workspace_size (num_ctas may be 0).
 * @return FI_OK (a GPU family runs this kind / variant); FI_ERR_UNSUPPORTED_KIND (the kind
 *   is planned and runs on the CPU reference, fi_ref_run, but has no GPU executor yet);
 *   FI_ERR_NULL_ARGUMENT; or the status fi_caps_validate gives for invalid caps. */
fi_status fi_run_supported(const fi_caps *caps);

/* Copy `bytes` bytes of host memory at src to device memory at dst, in stream order: one
 * cudaMemcpyAsync (host to device) on `stream`.  What a caller whose page table or index
 * arrays live in host memory uses to stage them for fi_run (the Python layer's plan() with
 * CPU arrays) without a framework's tensor copy around it.
 * src: pageable or pinned host memory, `bytes` long.  From pageable memory CUDA copies src
 * into its own staging buffer before returning, without waiting for work queued earlier on
 * the stream, so src may be reused at once; from pinned memory the copy reads src when the
 * stream reaches it, so src must stay unchanged until then.  dst: memory of the current
 * device, `bytes` long, written when the stream reaches the copy (work queued earlier on the
 * stream still sees its old contents).  stream: cudaStream_t.  Not capturable from pageable
 * memory (CUDA refuses it under stream capture: FI_ERR_CUDA).  bytes 0: nothing done, FI_OK.
 * @return FI_OK; FI_ERR_NULL_ARGUMENT (dst or src NULL with bytes > 0); FI_ERR_CUDA
 *   (the copy was refused: no device, an invalid pointer or stream, capture). */
fi_status fi_copy_to_device(void *dst, const void *src, size_t bytes, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* FIATTN_RUN_H */
