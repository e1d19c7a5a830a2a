/*
 * executor/context/ctx_host.c - the context (prefill) family on the host: what its kernels
 * run, and its fi_family record (registered in executor/core/registry.c).  Its tensors
 * and parameter block are the GQA family's (executor/gqa/gqa_host.h): q [q_tokens, H_q,
 * D], k / v [num_pages, page_size, H_kv, D] views (NVFP4: D / 2 bytes, with k_sf / v_sf
 * [num_pages, page_size, H_kv, D / 16] e4m3 scale views) in any NHD / HND / one-tensor /
 * (K, V) pair strides, block_tables [B, P] or [B, 2, P]; its parameter block adds the
 * views' TMA tensor maps (executor/context/ctx_params.h).
 */
#include <string.h>

#include "executor/context/ctx_launch.h"
#include "executor/core/family.h"
#include "executor/core/tensor_map.h"
#include "executor/gqa/gqa_host.h"
#include "plan/plan.h"

/* What the tile body runs: D 64 / 128 / 256 (qk == vo), q bf16 or fp16, KV the q dtype,
 * fp8 e4m3 or NVFP4 (e2m1 bytes with k_sf / v_sf block scales, checked by
 * fi_gqa_fill_params; a per-tensor dequantisation scale is folded into bmm1 / bmm2 by the
 * caller), out the q dtype, fp8 e4m3 or NVFP4 (E2M1 with o_sf, checked by fi_run's common
 * block), 128-row tiles. */
static fi_status ctx_check_caps(const fi_caps *caps, const fi_variant *v) {
    const int32_t d = caps->head_dim_qk;
    if (d != caps->head_dim_vo || (d != 64 && d != 128 && d != 256))
        return FI_ERR_UNSUPPORTED_HEAD_DIM;
    const fi_dtype dt = caps->q_dtype;
    const fi_dtype kv = caps->kv_dtype;
    if ((dt != FI_DTYPE_BF16 && dt != FI_DTYPE_F16) ||
        (kv != dt && kv != FI_DTYPE_E4M3 && kv != FI_DTYPE_E2M1))
        return FI_ERR_UNSUPPORTED_DTYPE;
    if (caps->o_dtype != dt && caps->o_dtype != FI_DTYPE_E4M3 && caps->o_dtype != FI_DTYPE_E2M1)
        return FI_ERR_UNSUPPORTED_DTYPE;
    if (v->tile_rows != FI_CTX_TILE_ROWS)
        return FI_ERR_UNSUPPORTED_VARIANT; /* a registry row this tile body cannot run */
    return FI_OK;
}

/* L2 promotion of the context family's KV boxes (fi_tensor_map): 256 bytes, a box row
 * and its neighbour (a head's 256 bytes at D 128).  -DFI_CTX_L2_PROMOTION=... overrides
 * it (probe builds). */
#ifndef FI_CTX_L2_PROMOTION
#define FI_CTX_L2_PROMOTION 256
#endif

/* The tensor map of a paged view v (16-bit dtype dt, [>= num_pages, page_size, H_kv, D]
 * in elements, any order of the outer axes): dims innermost first [D, page_size, H_kv,
 * pages], boxes of 64 x box x 1 x 1, 128-byte swizzle, FI_CTX_L2_PROMOTION bytes of L2
 * promotion.  Host work only.  0 on success; -1 when TMA cannot take the view (strides
 * not 16-byte multiples, base misaligned). */
static int encode_view(CUtensorMap *m, const fi_tensor *t, const fi_gqa_paged *v, fi_dtype dt,
                       const fi_caps *caps, int32_t box) {
    const uint64_t dims[4] = {(uint64_t)caps->head_dim_qk, (uint64_t)caps->page_size,
                              (uint64_t)caps->num_kv_heads, (uint64_t)t->shape[0]};
    const uint64_t strides[3] = {(uint64_t)v->stride_tok * 2, (uint64_t)v->stride_head * 2,
                                 (uint64_t)v->stride_page * 2};
    const uint32_t boxdim[4] = {64, (uint32_t)box, 1, 1};
    return fi_tensor_map(m, dt, v->data, 4, dims, strides, boxdim, 128, FI_CTX_L2_PROMOTION);
}

/* The GQA family's parameters, then the k / v tensor maps where TMA can take them: KV in
 * the q dtype, page_size >= 8 (a box starts on a 1024-byte swizzle atom: 8 rows of 128
 * bytes), boxes of min(page_size, the kernel's block: 128 tokens, 64 at head_dim 256). */
static fi_status ctx_prepare(const fi_plan *plan, const fi_attn_args *a,
                             const fi_exec_common *common, void *params) {
    const fi_caps *caps = &plan->caps;
    fi_status st = ctx_check_caps(caps, plan->variant);
    fi_gqa_params g;
    if (st != FI_OK || (st = fi_gqa_fill_params(plan, a, common, &g)) != FI_OK)
        return st;
    fi_ctx_params p;
    memset(&p, 0, sizeof p);
    p.c = g.c;
    p.g = g.g;
    const int32_t block = caps->head_dim_qk <= 128 ? 128 : 64;
    const int32_t box = caps->page_size < block ? caps->page_size : block;
    if (caps->kv_dtype == caps->q_dtype && box >= 8 &&
        encode_view(&p.tma_k, &a->k, &p.g.k, caps->kv_dtype, caps, box) == 0 &&
        encode_view(&p.tma_v, &a->v, &p.g.v, caps->kv_dtype, caps, box) == 0)
        p.tma_box = box;
    memcpy(params, &p, sizeof p);
    return FI_OK;
}

_Static_assert(sizeof(fi_ctx_params) <= FI_FAMILY_MAX_PARAMS, "context parameters");

const fi_family fi_family_context = {
    .name = "context_wgmma_sm90",
    .params_bytes = sizeof(fi_ctx_params),
    .prepare = ctx_prepare,
    .launch = fi_ctx_launch,
};
