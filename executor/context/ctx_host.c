/*
 * executor/context/ctx_host.c - the context (prefill) family on the host: what its kernels
 * run, and its fi_family record (registered in executor/core/registry.c).  Its tensors
 * and parameter block are the GQA family's (executor/gqa/gqa_host.h): q [q_tokens, H_q,
 * D], k / v [num_pages, page_size, H_kv, D] views (NVFP4: D / 2 bytes, with k_sf / v_sf
 * [num_pages, page_size, H_kv, D / 16] e4m3 scale views) in any NHD / HND / one-tensor /
 * (K, V) pair strides, block_tables [B, P] or [B, 2, P].
 */
#include "executor/context/ctx_launch.h"
#include "executor/core/family.h"
#include "executor/gqa/gqa_host.h"
#include "plan/plan.h"

/* What the tile body runs: D 64 / 128 / 256 (qk == vo), q bf16 or fp16, KV the q dtype,
 * fp8 e4m3 or NVFP4 (e2m1 bytes with k_sf / v_sf block scales, checked by
 * fi_gqa_fill_params; a per-tensor dequantisation scale is folded into bmm1 / bmm2 by the
 * caller), out the q dtype or fp8 e4m3, 128-row tiles. */
static fi_status ctx_check_caps(const fi_caps *caps, const fi_variant *v) {
    const int32_t d = caps->head_dim_qk;
    if (d != caps->head_dim_vo || (d != 64 && d != 128 && d != 256))
        return FI_ERR_UNSUPPORTED_HEAD_DIM;
    const fi_dtype dt = caps->q_dtype;
    const fi_dtype kv = caps->kv_dtype;
    if ((dt != FI_DTYPE_BF16 && dt != FI_DTYPE_F16) ||
        (kv != dt && kv != FI_DTYPE_E4M3 && kv != FI_DTYPE_E2M1))
        return FI_ERR_UNSUPPORTED_DTYPE;
    if (caps->o_dtype != dt && caps->o_dtype != FI_DTYPE_E4M3)
        return FI_ERR_UNSUPPORTED_DTYPE;
    if (v->tile_rows != FI_CTX_TILE_ROWS)
        return FI_ERR_UNSUPPORTED_VARIANT; /* a registry row this tile body cannot run */
    return FI_OK;
}

static fi_status ctx_prepare(const fi_plan *plan, const fi_attn_args *a,
                             const fi_exec_common *common, void *params) {
    const fi_status st = ctx_check_caps(&plan->caps, plan->variant);
    return st != FI_OK ? st : fi_gqa_fill_params(plan, a, common, params);
}

const fi_family fi_family_context = {
    .name = "context_wgmma_sm90",
    .params_bytes = sizeof(fi_gqa_params),
    .prepare = ctx_prepare,
    .launch = fi_ctx_launch,
};
