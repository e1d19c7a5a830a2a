/*
 * executor/core/run.c - fi_run: find the plan's GPU family in the registration table,
 * check and fill the common execution block (plan region, partials, semaphores, page
 * table, out / lse, scales, sinks), let the family check its own tensors and fill its
 * parameter struct, launch.
 *
 * Nothing is launched unless every check passes; the checks read only the host view of
 * the plan and the fi_tensor descriptors (never device memory), so fi_run is capturable.
 * The row count checked is the current plan's total_q_tokens (a device plan's: the declared
 * max_q_tokens): a graph captured with larger tensors stays valid for later, smaller plans.
 */
#include <cuda_runtime.h>
#include <stdalign.h>
#include <stdint.h>

#include "executor/core/args.h"
#include "executor/core/family.h"
#include "fiattn_run.h"
#include "plan/variant.h"
#include "plan/plan.h"
#include "plan/device_guard.h"

/* Device address of a workspace region (pointer arithmetic only, never dereferenced). */
static void *ws_at(void *workspace, size_t offset) {
    return (unsigned char *)workspace + offset;
}

/* NVFP4 out (caps.o_dtype E2M1; fiattn_run.h, o_sf): the block-size, global-scale and
 * scale-tensor rules, in the order fi_run documents them.  The scale bytes are written one
 * at a time, so any base and non-negative strides serve. */
static fi_status check_nvfp4_out(const fi_attn_args *a, int64_t rows, int64_t H, int64_t d) {
    if (a->o_sf_vec_size != 0 && a->o_sf_vec_size != 16)
        return FI_ERR_UNSUPPORTED_SF_VEC_SIZE;
    if (!(a->o_sf_scale > 0.f) || a->o_sf_scale > 3.4e38f) /* 0, negative, NaN or inf */
        return FI_ERR_INVALID_ARGUMENT;
    const fi_tensor *t = &a->o_sf;
    if (!t->data)
        return FI_ERR_NULL_ARGUMENT;
    if (t->dtype != FI_DTYPE_E4M3)
        return FI_ERR_UNSUPPORTED_DTYPE;
    if (t->ndim != 3 || t->shape[0] < rows || t->shape[1] != H || t->shape[2] != d / 16)
        return FI_ERR_SHAPE_MISMATCH;
    if (t->stride[2] != 1 || t->stride[0] < 0 || t->stride[1] < 0)
        return FI_ERR_BAD_STRIDE;
    return FI_OK;
}

/* Short KV streams go to the L2 evict-first (kv_l2_fraction in run_ctx.cuh, which also
 * sends the items that alone read their keys): the largest CTA cost, in cost units
 * (decode: KV tokens of one tile), up to which a CTA streams at most
 * FI_KV_EVICT_FIRST_BYTES; -1 (never) for context attention (a request's keys are read
 * once per query tile) and sparse plans (requests share keys).  The bytes a decode cost
 * unit streams: one token's K and V rows of a KV head (GQA; NVFP4 with its scale bytes),
 * or its ckv ++ kpe row (MLA).  A -D override is for experiments
 * (scripts/sweep_charges.sh; docs/perf-log.md thirty-fourth session). */
#ifndef FI_KV_EVICT_FIRST_BYTES
#define FI_KV_EVICT_FIRST_BYTES (2 << 20)
#endif
static int32_t kv_evict_first_cost(const fi_caps *caps) {
    const int64_t e = (int64_t)fi_dtype_size(caps->kv_dtype), d = caps->head_dim_qk;
    int64_t row = 0;
    if (caps->kind == FI_KIND_MLA_DECODE && caps->sparse_top_k == 0)
        row = d * e;
    else if (caps->kind == FI_KIND_GQA_DECODE)
        row = caps->kv_dtype == FI_DTYPE_E2M1 ? 2 * (d / 2 + d / 16) : 2 * d * e;
    return row > 0 ? (int32_t)(FI_KV_EVICT_FIRST_BYTES / row) : -1;
}

/* Check what every family shares and fill the common block. */
static fi_status common_fill(const fi_plan *plan, const fi_attn_args *a, fi_exec_common *c) {
    const fi_caps *caps = &plan->caps;
    const fi_layout *L = &plan->layout;
    const int64_t rows = plan->run_q_tokens, H = caps->num_qo_heads;
    fi_status st;
    const int shift = fi_page_shift(caps->page_size);
    if (shift < 0)
        return FI_ERR_UNSUPPORTED_PAGE_SIZE;
    if (a->out.data && a->out.dtype != caps->o_dtype)
        return FI_ERR_UNSUPPORTED_DTYPE;
    const int fp4 = caps->o_dtype == FI_DTYPE_E2M1; /* out in bytes: D / 2 a row */
    if ((st = fi_check_rows(&a->out, rows, H, fp4 ? caps->head_dim_vo / 2 : caps->head_dim_vo,
                            FI_LAYOUT_DEVICE)) != FI_OK)
        return st;
    if (fp4 && (st = check_nvfp4_out(a, rows, H, caps->head_dim_vo)) != FI_OK)
        return st;
    if (!fp4 && a->o_sf.data) /* block scales belong to NVFP4 out only */
        return FI_ERR_INVALID_ARGUMENT;
    if ((st = fi_check_page_table(plan, &a->page_table)) != FI_OK)
        return st;
    if (plan->on_device && a->page_table.data != plan->device_page_table)
        return FI_ERR_INVALID_ARGUMENT; /* not the table the device planner validated */
    if ((st = fi_check_lse(&a->lse, rows, H, FI_LAYOUT_DEVICE)) != FI_OK)
        return st;
    if (!(a->o_scale >= 0.f) || a->o_scale > 3.4e38f) /* negative, NaN or inf */
        return FI_ERR_INVALID_ARGUMENT;
    const float skip = a->skip_softmax_threshold_scale_factor;
    if (!(skip >= 0.f) || skip > 3.4e38f) /* negative, NaN or inf */
        return FI_ERR_INVALID_ARGUMENT;
    if (skip > 0.f && caps->kind != FI_KIND_CONTEXT)
        return FI_ERR_SKIP_SOFTMAX_UNSUPPORTED;
    if ((uintptr_t)a->skip_softmax_stats % 8 != 0)
        return FI_ERR_MISALIGNED_POINTER;
    if ((st = fi_check_f32_pointer(a->sinks)) != FI_OK ||
        (st = fi_check_f32_pointer(a->bmm1_scale_ptr)) != FI_OK ||
        (st = fi_check_f32_pointer(a->bmm2_scale_ptr)) != FI_OK)
        return st;

    void *ws = plan->workspace;
    fi_exec_common x = {0};
    x.header = ws_at(ws, L->off_header);
    x.cta_starts = ws_at(ws, L->off_cta_starts);
    x.requests = ws_at(ws, L->off_requests);
    x.groups = ws_at(ws, L->off_groups);
    x.items = ws_at(ws, L->off_items);
    x.partial_o = ws_at(ws, L->off_partial_o);
    x.partial_lse = ws_at(ws, L->off_partial_lse);
    x.semaphores = ws_at(ws, L->off_semaphores);
    x.page_table = (const int32_t *)a->page_table.data;
    x.page_size = caps->page_size;
    x.page_shift = shift;
    x.out = a->out.data;
    /* NVFP4: strides in e2m1 elements, so a column offset adds to them (exec_params.h) */
    x.out_stride_tok = a->out.stride[0] * (fp4 ? 2 : 1);
    x.out_stride_head = a->out.stride[1] * (fp4 ? 2 : 1);
    x.lse = (float *)a->lse.data;
    x.lse_stride_tok = a->lse.data ? a->lse.stride[0] : 0;
    x.lse_stride_head = a->lse.data ? a->lse.stride[1] : 0;
    x.bmm1_scale = a->bmm1_scale;
    x.bmm2_scale = a->bmm2_scale;
    x.bmm1_scale_ptr = a->bmm1_scale_ptr;
    x.bmm2_scale_ptr = a->bmm2_scale_ptr;
    x.sinks = a->sinks;
    x.o_scale = a->o_scale != 0.f ? 1.0f / a->o_scale : 1.0f; /* the kernels multiply */
    x.o_fp8 = caps->o_dtype == FI_DTYPE_E4M3;
    x.o_fp4 = fp4;
    if (fp4) {
        x.o_sf = (uint8_t *)a->o_sf.data;
        x.o_sf_stride_tok = a->o_sf.stride[0];
        x.o_sf_stride_head = a->o_sf.stride[1];
        x.o_sf_scale = a->o_sf_scale;
    }
    x.num_ctas = L->num_ctas;
    x.tile_rows = L->tile_rows;
    x.kv_evict_first_cost = kv_evict_first_cost(caps);
    x.kv_group = caps->num_qo_heads / caps->num_kv_heads;
    x.skip_softmax_factor = skip;
    x.skip_softmax_stats = a->skip_softmax_stats;
    *c = x;
    return FI_OK;
}

/* (plan and args non-NULL: the entry point checks them.) */
static fi_status run_here(const fi_plan *plan, const fi_attn_args *args, void *stream) {
    if (!plan->workspace)
        return FI_ERR_HOST_PLAN;
    if (!plan->planned)
        return FI_ERR_NOT_PLANNED;
    const fi_variant *v = plan->variant;
    if (!v || !v->family)
        return FI_ERR_UNSUPPORTED_KIND; /* no GPU family for this kind / variant yet */
    fi_exec_common common;
    fi_status st = common_fill(plan, args, &common);
    if (st != FI_OK)
        return st;
    alignas(64) unsigned char params[FI_FAMILY_MAX_PARAMS]; /* tensor maps (ctx_params.h) */
    if (v->family->params_bytes > sizeof params)
        return FI_ERR_UNSUPPORTED_VARIANT; /* a registration bug, refused rather than overrun */
    if ((st = v->family->prepare(plan, args, &common, params)) != FI_OK)
        return st;
    const int e = v->family->launch(params, plan->caps.q_dtype, args->enable_pdl != 0, stream);
    /* The in-kernel merge waits on other CTAs: a grid larger than what can be resident at
     * once (caps.num_ctas > SMs x CTAs per SM) is refused before launch. */
    if (e == (int)cudaErrorCooperativeLaunchTooLarge)
        return FI_ERR_GRID_NOT_RESIDENT;
    return e == 0 ? FI_OK : FI_ERR_CUDA;
}

/* The entry point: the plan's device current for the call (plan/device_guard.h). */
fi_status fi_run(const fi_plan *plan, const fi_attn_args *args, void *stream) {
    if (!plan || !args)
        return FI_ERR_NULL_ARGUMENT;
    int prev;
    if (fi_device_enter(plan->device, &prev) != cudaSuccess)
        return FI_ERR_CUDA;
    const fi_status st = run_here(plan, args, stream);
    fi_device_leave(prev);
    return st;
}

fi_status fi_copy_to_device(void *dst, const void *src, size_t bytes, void *stream) {
    if (bytes == 0)
        return FI_OK;
    if (!dst || !src)
        return FI_ERR_NULL_ARGUMENT;
    const cudaError_t e =
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream);
    if (e == cudaSuccess)
        return FI_OK;
    (void)cudaGetLastError(); /* leave no sticky error for the caller's next CUDA call */
    return FI_ERR_CUDA;
}
