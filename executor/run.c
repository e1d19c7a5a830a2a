/*
 * executor/run.c - fi_run: check every tensor against the plan's caps, fill the kernel's
 * parameter block (executor/mla_params.h) and launch the persistent executor.
 *
 * Nothing is launched unless every check passes; the checks read only the host view of
 * the plan and the fi_tensor descriptors (never device memory), so fi_run is capturable.
 * Shapes: see fiattn_run.h.  The row count checked is the current plan's total_q_tokens;
 * a graph captured with larger tensors stays valid for later, smaller plans.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "executor/core/args.h"
#include "executor/launch.h"
#include "executor/mla_params.h"
#include "fiattn_run.h"
#include "plan/plan.h"

/* A tensor's base must be 16-byte aligned and every outer stride a multiple of 16 bytes,
 * so each row can be moved with 16-byte copies. */
static fi_status check_layout(const fi_tensor *t, int64_t elem_bytes, int check_row_align) {
    if (((uintptr_t)t->data & 15u) != 0)
        return FI_ERR_MISALIGNED_POINTER;
    if (t->stride[t->ndim - 1] != 1)
        return FI_ERR_BAD_STRIDE;
    for (int i = 0; i < t->ndim - 1; ++i) {
        if (t->stride[i] < 0)
            return FI_ERR_BAD_STRIDE;
        if (check_row_align && (t->stride[i] * elem_bytes) % 16 != 0)
            return FI_ERR_BAD_STRIDE;
    }
    return FI_OK;
}

/* q-like tensor [>= rows, heads, dim] of `dtype`. */
static fi_status check_rows(const fi_tensor *t, fi_dtype dtype, int64_t rows, int64_t heads,
                            int64_t dim, int64_t elem_bytes) {
    if (!t->data)
        return FI_ERR_NULL_ARGUMENT;
    if (t->dtype != dtype)
        return FI_ERR_UNSUPPORTED_DTYPE;
    if (t->ndim != 3 || t->shape[0] < rows || t->shape[1] != heads || t->shape[2] != dim)
        return FI_ERR_SHAPE_MISMATCH;
    return check_layout(t, elem_bytes, 1);
}

/* Paged cache [num_pages, page_size, (1,) dim]; a 3-D view without the head axis is also
 * taken.  Returns the page and token strides. */
static fi_status check_cache(const fi_tensor *t, fi_dtype dtype, const fi_caps *caps,
                             int64_t dim, int64_t *stride_page, int64_t *stride_tok) {
    if (!t->data)
        return FI_ERR_NULL_ARGUMENT;
    if (t->dtype != dtype)
        return FI_ERR_UNSUPPORTED_DTYPE;
    if (t->ndim == 4) {
        if (t->shape[2] != 1)
            return FI_ERR_SHAPE_MISMATCH;
    } else if (t->ndim != 3) {
        return FI_ERR_SHAPE_MISMATCH;
    }
    if (t->shape[0] < caps->num_pages || t->shape[1] != caps->page_size ||
        t->shape[t->ndim - 1] != dim)
        return FI_ERR_SHAPE_MISMATCH;
    fi_status st = check_layout(t, 2, 1);
    if (st != FI_OK)
        return st;
    *stride_page = t->stride[0];
    *stride_tok = t->stride[1];
    return FI_OK;
}

/* Device address of a workspace region (pointer arithmetic only, never dereferenced here). */
static void *ws_at(void *workspace, size_t offset) {
    return (unsigned char *)workspace + offset;
}

static int log2_exact(int32_t v) {
    int s = 0;
    while ((1 << s) < v)
        ++s;
    return (1 << s) == v ? s : -1;
}

static fi_status check_mla_args(const fi_plan *plan, const fi_attn_args *a, fi_mla_params *p) {
    const fi_caps *caps = &plan->caps;
    const fi_plan_header *hdr = fi_stage_header(plan->staging[plan->cur], &plan->layout);
    const int64_t rows = hdr->total_q_tokens;
    const int64_t H = caps->num_qo_heads;
    const fi_dtype dt = caps->q_dtype;
    fi_status st;

    if (caps->head_dim_qk != 576 || caps->head_dim_vo != 512 || caps->num_kv_heads != 1)
        return FI_ERR_UNSUPPORTED_HEAD_DIM;
    if (dt != FI_DTYPE_BF16 && dt != FI_DTYPE_F16)
        return FI_ERR_UNSUPPORTED_DTYPE;
    if (caps->kv_dtype != dt || caps->o_dtype != dt)
        return FI_ERR_UNSUPPORTED_DTYPE;
    if (plan->layout.tile_rows != 64)
        return FI_ERR_UNSUPPORTED_KIND;
    const int shift = log2_exact(caps->page_size);
    if (shift < 0)
        return FI_ERR_UNSUPPORTED_PAGE_SIZE;

    if ((st = check_rows(&a->q, dt, rows, H, 512, 2)) != FI_OK)
        return st;
    if ((st = check_rows(&a->q_rope, dt, rows, H, 64, 2)) != FI_OK)
        return st;
    if ((st = check_rows(&a->out, caps->o_dtype, rows, H, 512, 2)) != FI_OK)
        return st;
    int64_t ckv_sp, ckv_st, kpe_sp, kpe_st;
    if ((st = check_cache(&a->k, caps->kv_dtype, caps, 512, &ckv_sp, &ckv_st)) != FI_OK)
        return st;
    if ((st = check_cache(&a->k_rope, caps->kv_dtype, caps, 64, &kpe_sp, &kpe_st)) != FI_OK)
        return st;

    const fi_tensor *pt = &a->page_table;
    if ((st = fi_check_page_table(plan, pt)) != FI_OK)
        return st;

    int64_t lse_st = 0, lse_sh = 0;
    if (a->lse.data) {
        const fi_tensor *l = &a->lse;
        if (l->dtype != FI_DTYPE_F32)
            return FI_ERR_UNSUPPORTED_DTYPE;
        if (l->ndim != 2 || l->shape[0] < rows || l->shape[1] != H)
            return FI_ERR_SHAPE_MISMATCH;
        if ((st = check_layout(l, 4, 0)) != FI_OK)
            return st;
        lse_st = l->stride[0];
        lse_sh = l->stride[1];
    }
    if (((uintptr_t)a->sinks & 3u) != 0 || ((uintptr_t)a->bmm1_scale_ptr & 3u) != 0 ||
        ((uintptr_t)a->bmm2_scale_ptr & 3u) != 0)
        return FI_ERR_MISALIGNED_POINTER;

    void *ws = plan->workspace;
    const fi_layout *L = &plan->layout;
    fi_mla_params q = {0};
    q.q_nope = a->q.data;
    q.q_nope_stride_tok = a->q.stride[0];
    q.q_nope_stride_head = a->q.stride[1];
    q.q_pe = a->q_rope.data;
    q.q_pe_stride_tok = a->q_rope.stride[0];
    q.q_pe_stride_head = a->q_rope.stride[1];
    q.ckv = a->k.data;
    q.ckv_stride_page = ckv_sp;
    q.ckv_stride_tok = ckv_st;
    q.kpe = a->k_rope.data;
    q.kpe_stride_page = kpe_sp;
    q.kpe_stride_tok = kpe_st;
    q.page_table = (const int32_t *)pt->data;
    q.out = a->out.data;
    q.out_stride_tok = a->out.stride[0];
    q.out_stride_head = a->out.stride[1];
    q.lse = (float *)a->lse.data;
    q.lse_stride_tok = lse_st;
    q.lse_stride_head = lse_sh;
    q.bmm1_scale = a->bmm1_scale;
    q.bmm2_scale = a->bmm2_scale;
    q.bmm1_scale_ptr = a->bmm1_scale_ptr;
    q.bmm2_scale_ptr = a->bmm2_scale_ptr;
    q.sinks = a->sinks;
    q.header = ws_at(ws, L->off_header);
    q.cta_starts = ws_at(ws, L->off_cta_starts);
    q.requests = ws_at(ws, L->off_requests);
    q.groups = ws_at(ws, L->off_groups);
    q.items = ws_at(ws, L->off_items);
    q.partial_o = ws_at(ws, L->off_partial_o);
    q.partial_lse = ws_at(ws, L->off_partial_lse);
    q.semaphores = ws_at(ws, L->off_semaphores);
    q.num_ctas = L->num_ctas;
    q.page_size = caps->page_size;
    q.page_shift = shift;
    q.num_heads = (int32_t)H;
    q.tile_rows = L->tile_rows;
    *p = q;
    return FI_OK;
}

fi_status fi_run(const fi_plan *plan, const fi_attn_args *args, void *stream) {
    if (!plan || !args)
        return FI_ERR_NULL_ARGUMENT;
    if (!plan->workspace)
        return FI_ERR_HOST_PLAN;
    if (!plan->planned)
        return FI_ERR_NOT_PLANNED;
    if (plan->caps.kind != FI_KIND_MLA_DECODE)
        return FI_ERR_UNSUPPORTED_KIND;
    fi_mla_params p;
    fi_status st = check_mla_args(plan, args, &p);
    if (st != FI_OK)
        return st;
    const int e = fi_launch_mla_decode(&p, plan->caps.q_dtype, args->enable_pdl != 0, stream);
    /* The in-kernel merge waits on other CTAs: a grid larger than what can be resident at
     * once (caps.num_ctas > SMs x CTAs per SM) is refused before launch. */
    if (e == (int)cudaErrorCooperativeLaunchTooLarge)
        return FI_ERR_INVALID_ARGUMENT;
    return e == 0 ? FI_OK : FI_ERR_CUDA;
}
