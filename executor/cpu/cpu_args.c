/* executor/cpu/cpu_args.c - argument checks shared by the CPU references (ref_common.h). */
#include "executor/cpu/ref_common.h"

static int is_float_dtype(fi_dtype d) {
    return d == FI_DTYPE_F32 || d == FI_DTYPE_F16 || d == FI_DTYPE_BF16;
}

/* shape[0] >= rows (a caller may pass a larger buffer) and shape[1..] == dims exactly. */
static int shape_ok(const fi_tensor *t, int32_t ndim, int64_t rows, const int64_t *dims) {
    if (t->ndim != ndim || t->shape[0] < rows) return 0;
    for (int32_t i = 1; i < ndim; ++i)
        if (t->shape[i] != dims[i - 1]) return 0;
    return 1;
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

    if (!a->q.data || !a->k.data || !a->out.data || !a->page_table.data)
        return FI_ERR_NULL_ARGUMENT;
    if (g.mla ? (!a->q_rope.data || !a->k_rope.data) : !a->v.data) return FI_ERR_NULL_ARGUMENT;

    if (!is_float_dtype(a->q.dtype) || !is_float_dtype(a->k.dtype) ||
        !is_float_dtype(a->out.dtype) || a->page_table.dtype != FI_DTYPE_I32 ||
        (a->lse.data && a->lse.dtype != FI_DTYPE_F32))
        return FI_ERR_UNSUPPORTED_DTYPE;
    if (g.mla ? (!is_float_dtype(a->q_rope.dtype) || !is_float_dtype(a->k_rope.dtype))
              : !is_float_dtype(a->v.dtype))
        return FI_ERR_UNSUPPORTED_DTYPE;

    const int64_t q_dims[2] = {g.num_qo_heads, g.d_main};
    const int64_t k_dims[3] = {g.page_size, g.num_kv_heads, g.d_main};
    const int64_t o_dims[2] = {g.num_qo_heads, g.d_vo};
    const int64_t lse_dims[1] = {g.num_qo_heads};
    if (!shape_ok(&a->q, 3, q_tokens, q_dims) || !shape_ok(&a->k, 4, caps->num_pages, k_dims) ||
        !shape_ok(&a->out, 3, q_tokens, o_dims) ||
        (a->lse.data && !shape_ok(&a->lse, 2, q_tokens, lse_dims)) || a->page_table.ndim < 1)
        return FI_ERR_SHAPE_MISMATCH;
    if (g.mla) {
        const int64_t qr_dims[2] = {g.num_qo_heads, g.d_rope};
        const int64_t kr_dims[3] = {g.page_size, 1, g.d_rope};
        if (!shape_ok(&a->q_rope, 3, q_tokens, qr_dims) ||
            !shape_ok(&a->k_rope, 4, caps->num_pages, kr_dims))
            return FI_ERR_SHAPE_MISMATCH;
    } else {
        const int64_t v_dims[3] = {g.page_size, g.num_kv_heads, g.d_vo};
        if (!shape_ok(&a->v, 4, caps->num_pages, v_dims)) return FI_ERR_SHAPE_MISMATCH;
    }
    *geom = g;
    return FI_OK;
}
