/* executor/cpu/cpu_args.c - argument checks shared by the CPU references (ref_common.h),
 * on top of the executors' common tensor checks (executor/core/args.h). */
#include "executor/core/args.h"
#include "executor/cpu/ref_common.h"

static int is_float_dtype(fi_dtype d) {
    return d == FI_DTYPE_F32 || d == FI_DTYPE_F16 || d == FI_DTYPE_BF16;
}

/* Inputs also in fp8 (widened exactly, fi_elem_load); NVFP4 (E2M1) is not read here. */
static int is_input_dtype(fi_dtype d) {
    return is_float_dtype(d) || d == FI_DTYPE_E4M3 || d == FI_DTYPE_E5M2;
}

/* The first non-OK status of a list of checks, in order. */
static fi_status first_error(const fi_status *st, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (st[i] != FI_OK)
            return st[i];
    return FI_OK;
}

fi_status fi_cpu_check_args(const fi_caps *caps, const fi_attn_args *a, int32_t q_tokens,
                            fi_cpu_geom *geom) {
    if (!caps || !a || !geom) return FI_ERR_NULL_ARGUMENT;
    fi_cpu_geom g = {0};
    g.mla = caps->kind == FI_KIND_MLA_DECODE;
    g.num_qo_heads = caps->num_qo_heads;
    g.num_kv_heads = caps->num_kv_heads;
    g.group = caps->num_qo_heads / caps->num_kv_heads;
    g.page_size = caps->page_size;
    g.d_vo = caps->head_dim_vo;
    g.d_main = g.mla ? caps->head_dim_vo : caps->head_dim_qk;
    g.d_rope = g.mla ? caps->head_dim_qk - caps->head_dim_vo : 0;

    if (!a->q.data || !a->k.data || !a->out.data)
        return FI_ERR_NULL_ARGUMENT;
    if (g.mla ? (!a->q_rope.data || !a->k_rope.data) : !a->v.data) return FI_ERR_NULL_ARGUMENT;

    if (!is_input_dtype(a->q.dtype) || !is_input_dtype(a->k.dtype) ||
        !is_float_dtype(a->out.dtype) || (a->lse.data && a->lse.dtype != FI_DTYPE_F32))
        return FI_ERR_UNSUPPORTED_DTYPE;
    if (g.mla ? (!is_input_dtype(a->q_rope.dtype) || !is_input_dtype(a->k_rope.dtype))
              : !is_input_dtype(a->v.dtype))
        return FI_ERR_UNSUPPORTED_DTYPE;

    const fi_layout_rule host = FI_LAYOUT_HOST;
    const int64_t pages = caps->num_pages;
    const fi_status st[] = {
        fi_check_rows(&a->q, q_tokens, g.num_qo_heads, g.d_main, host),
        fi_check_cache(&a->k, pages, g.page_size, g.num_kv_heads, g.d_main, 0, host),
        fi_check_rows(&a->out, q_tokens, g.num_qo_heads, g.d_vo, host),
        g.mla ? fi_check_rows(&a->q_rope, q_tokens, g.num_qo_heads, g.d_rope, host)
              : fi_check_cache(&a->v, pages, g.page_size, g.num_kv_heads, g.d_vo, 0, host),
        g.mla ? fi_check_cache(&a->k_rope, pages, g.page_size, 1, g.d_rope, 0, host) : FI_OK,
        fi_check_lse(&a->lse, q_tokens, g.num_qo_heads, host),
        fi_check_f32_pointer(a->bmm1_scale_ptr),
        fi_check_f32_pointer(a->bmm2_scale_ptr),
        fi_check_f32_pointer(a->sinks),
    };
    const fi_status s = first_error(st, sizeof st / sizeof st[0]);
    if (s != FI_OK) return s;
    *geom = g;
    return FI_OK;
}
