/*
 * planner/caps.c - fi_caps_validate and fi_workspace_size (fiattn.h).
 *
 * Supported sets (fiattn.h fi_caps comment):
 *   MLA_DECODE  H_kv 1, H_q in {16,32,64,128}, head_dim_qk 576, head_dim_vo 512
 *   GQA_DECODE  H_q % H_kv == 0, group 1..16, head_dim 64/128/256 (qk == vo)
 *   CONTEXT     as GQA_DECODE
 *   page_size   {1,16,32,64,128} for every kind
 *   dtypes      q, kv: F32 (CPU reference), F16, BF16, E4M3 (xqa_mla), E5M2; kv also E2M1
 *               (NVFP4) for GQA_DECODE and CONTEXT (the GPU families; no MLA body
 *               dequantises it); o: F32, F16, BF16, E4M3 (fp8 out with o_scale), and E2M1 (NVFP4
 *               out) for CONTEXT
 *   variant     a row of the tile table (plan/variant.h) for (kind, variant)
 *   limits      FI_LIMIT_* of fiattn.h: max_batch, max_q_tokens, num_pages, num_ctas, H_q,
 *               sparse_top_k, and the plan bound derived from them (workspace/layout.h)
 *   sparse      sparse_top_k > 0: MLA_DECODE only
 */
#include <cuda_runtime_api.h>

#include "plan/variant.h"
#include "planner/caps_internal.h"
#include "workspace/layout.h"

static int page_size_ok(int32_t p) {
    return p == 1 || p == 16 || p == 32 || p == 64 || p == 128;
}

static int in_dtype_ok(fi_dtype d) {
    return d == FI_DTYPE_F32 || d == FI_DTYPE_F16 || d == FI_DTYPE_BF16 || d == FI_DTYPE_E4M3 ||
           d == FI_DTYPE_E5M2;
}

static int out_dtype_ok(fi_dtype d, fi_kind kind) {
    /* E4M3: fp8 output with fi_attn_args.o_scale (the GQA decode family stores it); E2M1:
     * NVFP4 output with fi_attn_args.o_sf, context attention only. */
    return d == FI_DTYPE_F32 || d == FI_DTYPE_F16 || d == FI_DTYPE_BF16 || d == FI_DTYPE_E4M3 ||
           (d == FI_DTYPE_E2M1 && kind == FI_KIND_CONTEXT);
}

fi_status fi_caps_validate(const fi_caps *caps) {
    if (!caps)
        return FI_ERR_NULL_ARGUMENT;
    if (caps->kind != FI_KIND_MLA_DECODE && caps->kind != FI_KIND_GQA_DECODE &&
        caps->kind != FI_KIND_CONTEXT)
        return FI_ERR_UNSUPPORTED_KIND;
    if (!fi_variant_of(caps))
        return FI_ERR_UNSUPPORTED_VARIANT;
    if (caps->max_batch <= 0 || caps->max_q_tokens <= 0 || caps->num_pages <= 0 ||
        caps->num_ctas < 0 || caps->num_qo_heads <= 0 || caps->num_kv_heads <= 0 ||
        caps->page_size <= 0)
        return FI_ERR_INVALID_CAPS;
    if (caps->num_qo_heads % caps->num_kv_heads != 0)
        return FI_ERR_INVALID_CAPS;
    if (caps->sparse_top_k < 0 || caps->sparse_top_k > FI_LIMIT_SPARSE_TOP_K)
        return FI_ERR_INVALID_CAPS;
    if (caps->max_batch > FI_LIMIT_MAX_BATCH)
        return FI_ERR_MAX_BATCH_OVER_LIMIT;
    if (caps->max_q_tokens > FI_LIMIT_MAX_Q_TOKENS)
        return FI_ERR_MAX_Q_TOKENS_OVER_LIMIT;
    if (caps->num_pages > FI_LIMIT_NUM_PAGES)
        return FI_ERR_NUM_PAGES_OVER_LIMIT;
    if (caps->num_ctas > FI_LIMIT_NUM_CTAS)
        return FI_ERR_NUM_CTAS_OVER_LIMIT;
    const int32_t group = caps->num_qo_heads / caps->num_kv_heads;
    if (caps->kind == FI_KIND_MLA_DECODE) {
        const int32_t h = caps->num_qo_heads;
        if (caps->num_kv_heads != 1 || (h != 16 && h != 32 && h != 64 && h != 128))
            return FI_ERR_UNSUPPORTED_HEADS;
        if (caps->head_dim_qk != 576 || caps->head_dim_vo != 512)
            return FI_ERR_UNSUPPORTED_HEAD_DIM;
    } else {
        if (group < 1 || group > 16 || caps->num_qo_heads > FI_LIMIT_QO_HEADS)
            return FI_ERR_UNSUPPORTED_HEADS;
        const int32_t d = caps->head_dim_qk;
        if ((d != 64 && d != 128 && d != 256) || caps->head_dim_vo != d)
            return FI_ERR_UNSUPPORTED_HEAD_DIM;
    }
    if (!page_size_ok(caps->page_size))
        return FI_ERR_UNSUPPORTED_PAGE_SIZE;
    if (!in_dtype_ok(caps->q_dtype) ||
        !(in_dtype_ok(caps->kv_dtype) ||
          (caps->kv_dtype == FI_DTYPE_E2M1 && caps->kind != FI_KIND_MLA_DECODE)) ||
        !out_dtype_ok(caps->o_dtype, caps->kind))
        return FI_ERR_UNSUPPORTED_DTYPE;
    /* Sparse top-k (DeepSeek sparse attention) is defined for MLA decode only. */
    if (caps->sparse_top_k > 0 && caps->kind != FI_KIND_MLA_DECODE)
        return FI_ERR_SPARSE_UNSUPPORTED;
    /* The plan bound (tiles + cuts) with num_ctas as given (0: resolved later, and checked
     * again by fi_layout_compute then). */
    if (fi_layout_item_bound(caps) > FI_LIMIT_PLAN_ITEMS)
        return FI_ERR_PLAN_OVER_LIMIT;
    return FI_OK;
}

fi_status fi_caps_resolve(const fi_caps *caps, fi_caps *resolved, int *cuda_error) {
    *cuda_error = 0;
    fi_status st = fi_caps_validate(caps);
    if (st != FI_OK)
        return st;
    fi_caps c = *caps;
    if (c.num_ctas == 0) {
        /* One CTA per SM for now; the executor's occupancy query may raise this later. */
        int dev = 0, sms = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            sms <= 0) {
            (void)cudaGetLastError(); /* clear the sticky-free error so later calls work */
            return FI_ERR_NO_DEVICE;
        }
        c.num_ctas = sms;
    }
    *resolved = c;
    return FI_OK;
}

fi_status fi_caps_resolve_layout(const fi_caps *caps, fi_caps *resolved, fi_layout *layout) {
    int cuda_error;
    fi_status st = fi_caps_resolve(caps, resolved, &cuda_error);
    if (st != FI_OK)
        return st;
    return fi_layout_compute(resolved, layout);
}

fi_status fi_workspace_size(const fi_caps *caps, size_t *bytes) {
    if (!caps || !bytes)
        return FI_ERR_NULL_ARGUMENT;
    fi_caps c;
    fi_layout l;
    const fi_status st = fi_caps_resolve_layout(caps, &c, &l);
    if (st != FI_OK)
        return st;
    *bytes = l.total_bytes;
    return FI_OK;
}
