/*
 * executor/gqa/gqa_host.c - the GQA decode family on the host: its tensor checks, its
 * parameter block, and its fi_family record (registered in executor/core/registry.c).
 * Shapes: fiattn_run.h (q [q_tokens, H_q, D]; k and v [num_pages, page_size, H_kv, D] views
 * whose strides carry NHD / HND and the one-tensor / (K, V)-pair forms of
 * xqa_batch_decode_with_kv_cache).
 */
#include <stdint.h>
#include <string.h>

#include "executor/core/args.h"
#include "executor/core/family.h"
#include "executor/gqa/gqa_host.h"
#include "executor/gqa/gqa_launch.h"
#include "executor/gqa/gqa_params.h"
#include "plan/plan.h"

/* What the tile body runs: D 64 / 128 / 256 (qk == vo), q in bf16 or fp16, KV the q dtype,
 * fp8 e4m3 or NVFP4 (fp16 matmuls for both: Hopper has no fp4 tensor cores, so NVFP4 is
 * dequantised in the kernel), out the q dtype or fp8 e4m3. */
static fi_status gqa_check_caps(const fi_caps *caps, const fi_variant *v) {
    const int32_t d = caps->head_dim_qk;
    if (d != caps->head_dim_vo || (d != 64 && d != 128 && d != 256))
        return FI_ERR_UNSUPPORTED_HEAD_DIM;
    const fi_dtype dt = caps->q_dtype;
    if ((dt != FI_DTYPE_BF16 && dt != FI_DTYPE_F16) ||
        (caps->kv_dtype != dt && caps->kv_dtype != FI_DTYPE_E4M3 && caps->kv_dtype != FI_DTYPE_E2M1))
        return FI_ERR_UNSUPPORTED_DTYPE;
    if (caps->o_dtype != dt && caps->o_dtype != FI_DTYPE_E4M3)
        return FI_ERR_UNSUPPORTED_DTYPE;
    if (v->tile_rows > FI_GQA_MAX_TILE_ROWS)
        return FI_ERR_UNSUPPORTED_VARIANT; /* a registry row this tile body cannot run */
    return FI_OK;
}

/* k or v: the plan's KV dtype, [>= num_pages, page_size, H_kv, D] (NVFP4: D / 2 bytes),
 * 16-byte rows. */
static fi_status gqa_check_kv(const fi_caps *caps, const fi_tensor *t) {
    if (t->data && t->dtype != caps->kv_dtype)
        return FI_ERR_UNSUPPORTED_DTYPE;
    const int64_t w = caps->kv_dtype == FI_DTYPE_E2M1 ? caps->head_dim_qk / 2 : caps->head_dim_qk;
    return fi_check_cache(t, caps->num_pages, caps->page_size, caps->num_kv_heads, w, 0,
                          FI_LAYOUT_DEVICE);
}

/* An NVFP4 block-scale tensor (k_sf / v_sf): e4m3 bytes [>= num_pages, page_size, H_kv,
 * D / 16], any order of the first three axes; the kernel copies a row (D / 16 = 4, 8 or 16
 * bytes) at once, so the base and every outer stride are multiples of the row.
 * @return FI_OK; FI_ERR_NULL_ARGUMENT (absent); FI_ERR_UNSUPPORTED_DTYPE (not E4M3);
 *   FI_ERR_SHAPE_MISMATCH; FI_ERR_MISALIGNED_POINTER; FI_ERR_BAD_STRIDE. */
static fi_status gqa_check_sf(const fi_caps *caps, const fi_tensor *t) {
    const int64_t row = caps->head_dim_qk / 16;
    if (!t->data)
        return FI_ERR_NULL_ARGUMENT;
    if (t->dtype != FI_DTYPE_E4M3)
        return FI_ERR_UNSUPPORTED_DTYPE;
    if (t->ndim != 4 || t->shape[0] < caps->num_pages || t->shape[1] != caps->page_size ||
        t->shape[2] != caps->num_kv_heads || t->shape[3] != row)
        return FI_ERR_SHAPE_MISMATCH;
    if ((uintptr_t)t->data % (uintptr_t)row != 0)
        return FI_ERR_MISALIGNED_POINTER;
    if (t->stride[3] != 1)
        return FI_ERR_BAD_STRIDE;
    for (int i = 0; i < 3; i++)
        if (t->stride[i] < 0 || t->stride[i] % row != 0)
            return FI_ERR_BAD_STRIDE;
    return FI_OK;
}

static fi_gqa_paged gqa_paged(const fi_tensor *t) {
    const fi_gqa_paged v = {t->data, t->stride[0], t->stride[1], t->stride[2]};
    return v;
}

fi_status fi_gqa_fill_params(const fi_plan *plan, const fi_attn_args *a,
                             const fi_exec_common *common, void *params) {
    const fi_caps *caps = &plan->caps;
    fi_status st;
    const int nvfp4 = caps->kv_dtype == FI_DTYPE_E2M1;
    /* Block scales belong to NVFP4 KV only; NVFP4 needs both. */
    if (!nvfp4 && (a->k_sf.data || a->v_sf.data))
        return FI_ERR_INVALID_ARGUMENT;
    if (a->q.data && a->q.dtype != caps->q_dtype)
        return FI_ERR_UNSUPPORTED_DTYPE;
    if ((st = fi_check_rows(&a->q, plan->run_q_tokens, caps->num_qo_heads, caps->head_dim_qk,
                            FI_LAYOUT_DEVICE)) != FI_OK)
        return st;
    if ((st = gqa_check_kv(caps, &a->k)) != FI_OK || (st = gqa_check_kv(caps, &a->v)) != FI_OK)
        return st;
    if (nvfp4 && ((st = gqa_check_sf(caps, &a->k_sf)) != FI_OK ||
                  (st = gqa_check_sf(caps, &a->v_sf)) != FI_OK))
        return st;
    fi_gqa_params p;
    memset(&p, 0, sizeof p);
    p.c = *common;
    p.g.q = a->q.data;
    p.g.q_stride_tok = a->q.stride[0];
    p.g.q_stride_head = a->q.stride[1];
    p.g.k = gqa_paged(&a->k);
    p.g.v = gqa_paged(&a->v);
    p.g.group = caps->num_qo_heads / caps->num_kv_heads;
    p.g.head_dim = caps->head_dim_qk;
    p.g.kv_kind = caps->kv_dtype == FI_DTYPE_E4M3 ? 1 : nvfp4 ? 2 : 0;
    if (nvfp4) {
        p.g.k_sf = gqa_paged(&a->k_sf);
        p.g.v_sf = gqa_paged(&a->v_sf);
    }
    memcpy(params, &p, sizeof p);
    return FI_OK;
}

static fi_status gqa_prepare(const fi_plan *plan, const fi_attn_args *a,
                             const fi_exec_common *common, void *params) {
    const fi_status st = gqa_check_caps(&plan->caps, plan->variant);
    return st != FI_OK ? st : fi_gqa_fill_params(plan, a, common, params);
}

const fi_family fi_family_gqa = {
    .name = "gqa_decode_sm90",
    .params_bytes = sizeof(fi_gqa_params),
    .prepare = gqa_prepare,
    .launch = fi_gqa_launch,
};
