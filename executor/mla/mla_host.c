/*
 * executor/mla/mla_host.c - the MLA decode family on the host: its tensor checks, its
 * parameter block, and its fi_family record (registered in executor/core/registry.c).
 * Shapes: fiattn_run.h (q_nope / q_pe / ckv / kpe views; a concatenated [.., 576] tensor is
 * passed as a 512-wide view and a 64-wide view at +512 elements).
 */
#include <string.h>

#include "executor/core/args.h"
#include "executor/core/family.h"
#include "executor/core/tensor_map.h"
#include "executor/mla/mla_launch.h"
#include "executor/mla/mla_params.h"
#include "plan/plan.h"

/* The dtypes both tile bodies run: q, KV and out all bf16 or all fp16, or an fp8 e4m3
 * cache with q fp8 e4m3 / bf16 / fp16 and out bf16 (fp16 matmuls).  Sets p->m.kv_e4m3 /
 * q_kind. */
static fi_status mla_dtypes(const fi_caps *caps, fi_mla_params *p) {
    const fi_dtype q = caps->q_dtype;
    if ((q == FI_DTYPE_BF16 || q == FI_DTYPE_F16) && caps->kv_dtype == q && caps->o_dtype == q)
        return FI_OK;
    if (caps->kv_dtype != FI_DTYPE_E4M3 || caps->o_dtype != FI_DTYPE_BF16)
        return FI_ERR_UNSUPPORTED_DTYPE;
    p->m.kv_e4m3 = 1;
    switch (q) {
    case FI_DTYPE_E4M3: p->m.q_kind = FI_MLA_Q_E4M3; return FI_OK;
    case FI_DTYPE_BF16: p->m.q_kind = FI_MLA_Q_BF16; return FI_OK;
    case FI_DTYPE_F16: p->m.q_kind = FI_MLA_Q_F16; return FI_OK;
    default: return FI_ERR_UNSUPPORTED_DTYPE;
    }
}

/* L2 promotion of the KV boxes (fi_tensor_map): a box row is 128 bytes of a token's
 * 1,152 (16-bit) or 576 (fp8), the rest of the row arriving by the page's other boxes.
 * 256 bytes (what every map had before) fetches each row's neighbouring piece with it,
 * and at B128 x 4096 heads 16 the transposed bodies ran 4-5% slower with it than with
 * 128 or none (H200, b2b us: row 9 155.0-155.1 against 147.7-147.8, row 7 81.4-82.1
 * against 78.2-78.6; heads 128 level; docs/perf-log.md, fortieth session).
 * -DFI_MLA_L2_PROMOTION=... overrides it (probe builds). */
#ifndef FI_MLA_L2_PROMOTION
#define FI_MLA_L2_PROMOTION 128
#endif

/* The wgmma body's ckv / kpe tensor maps (mla_params.h): 1 when TMA takes both views.
 * An 8-token box lies inside one page (page_size >= 8, a power of two; the kernel copies
 * by map only blocks of an item that starts on a multiple of 8 tokens: map_blocks).
 * 16-bit caches: boxes of 64 elements (128 bytes) in the 128-byte swizzle for both views;
 * fp8 e4m3 (the fp8 wgmma body's K panels, mla_wg8_tile.cuh): ckv boxes of 128 bytes in
 * the 128-byte swizzle, kpe boxes of 64 bytes in the 64-byte swizzle.  L2 promotion
 * FI_MLA_L2_PROMOTION bytes a box row. */
static int32_t mla_tensor_maps(fi_mla_params *p, const fi_attn_args *a, fi_dtype dt) {
    const fi_tensor *t[2] = {&a->k, &a->k_rope};
    CUtensorMap *m[2] = {&p->tma_ckv, &p->tma_kpe};
    const uint64_t esize = dt == FI_DTYPE_E4M3 ? 1 : 2;
    for (int i = 0; i < 2; ++i) {
        const uint64_t dims[3] = {(uint64_t)t[i]->shape[t[i]->ndim - 1], (uint64_t)t[i]->shape[1],
                                  (uint64_t)t[i]->shape[0]};
        const uint64_t strides[2] = {(uint64_t)t[i]->stride[1] * esize, (uint64_t)t[i]->stride[0] * esize};
        const uint32_t swizzle = esize == 1 && i == 1 ? 64 : 128;
        const uint32_t box[3] = {swizzle / (uint32_t)esize, (uint32_t)p->tma_box_rows, 1};
        if (fi_tensor_map(m[i], dt, t[i]->data, 3, dims, strides, box, swizzle, FI_MLA_L2_PROMOTION) != 0)
            return 0;
    }
    return 1;
}

/* The family's tile bodies, as mla_fill tells them apart. */
typedef enum mla_body {
    MLA_BODY_MMA,  /* mla_tile.cuh: mma.sync */
    MLA_BODY_WG32, /* mla_wg_tile.cuh: wgmma on 32-token blocks, the one with sparse plans */
    MLA_BODY_WG64, /* mla_wg64_tile.cuh: wgmma on 64-token blocks, 16-bit dense caches */
    MLA_BODY_WGT,  /* mla_wgt_tile.cuh: transposed fp8 wgmma, q and cache fp8, <= 16 rows */
    MLA_BODY_WGT16 /* mla_wgt16_tile.cuh: transposed 16-bit wgmma, <= 16 rows */
} mla_body;

/* Checks and parameter block shared by the tile bodies; max_rows / kv_block: the shape
 * the body runs (a registry row of another shape gets FI_ERR_UNSUPPORTED_VARIANT). */
static fi_status mla_fill(const fi_plan *plan, const fi_attn_args *a, const fi_exec_common *common,
                          void *params, int32_t max_rows, int32_t kv_block, mla_body body) {
    const fi_caps *caps = &plan->caps;
    const int64_t rows = plan->run_q_tokens, H = caps->num_qo_heads;
    fi_status st;
    fi_mla_params p;
    memset(&p, 0, sizeof p);
    if (caps->head_dim_qk != 576 || caps->head_dim_vo != 512 || caps->num_kv_heads != 1)
        return FI_ERR_UNSUPPORTED_HEAD_DIM;
    if ((st = mla_dtypes(caps, &p)) != FI_OK)
        return st;
    if (caps->sparse_top_k > 0 && body != MLA_BODY_WG32)
        return FI_ERR_SPARSE_UNSUPPORTED; /* only the 32-token wgmma body has a sparse path */
    if (body == MLA_BODY_WG64 && caps->kv_dtype == FI_DTYPE_E4M3)
        return FI_ERR_UNSUPPORTED_DTYPE; /* the 64-token body runs 16-bit caches only */
    if (body == MLA_BODY_WGT && (p.m.kv_e4m3 == 0 || p.m.q_kind != FI_MLA_Q_E4M3))
        return FI_ERR_UNSUPPORTED_DTYPE; /* the transposed body: q and cache fp8 e4m3 only */
    if (body == MLA_BODY_WGT16 && p.m.kv_e4m3)
        return FI_ERR_UNSUPPORTED_DTYPE; /* its 16-bit twin: q, cache and out 16-bit only */
    if (plan->variant->tile_rows > max_rows || plan->variant->kv_block != kv_block)
        return FI_ERR_UNSUPPORTED_VARIANT; /* a registry row this tile body cannot run */
    const fi_tensor *in[4] = {&a->q, &a->q_rope, &a->k, &a->k_rope};
    for (int i = 0; i < 4; ++i)
        if (in[i]->data && in[i]->dtype != (i < 2 ? caps->q_dtype : caps->kv_dtype))
            return FI_ERR_UNSUPPORTED_DTYPE;
    if ((st = fi_check_rows(&a->q, rows, H, 512, FI_LAYOUT_DEVICE)) != FI_OK)
        return st;
    if ((st = fi_check_rows(&a->q_rope, rows, H, 64, FI_LAYOUT_DEVICE)) != FI_OK)
        return st;
    p.c = *common;
    p.m.sparse = caps->sparse_top_k > 0;
    p.m.kv_slots = (int64_t)caps->num_pages * caps->page_size;
    if ((st = fi_check_cache(&a->k, caps->num_pages, caps->page_size, 1, 512, 1, FI_LAYOUT_DEVICE)) != FI_OK)
        return st;
    if ((st = fi_check_cache(&a->k_rope, caps->num_pages, caps->page_size, 1, 64, 1, FI_LAYOUT_DEVICE)) != FI_OK)
        return st;
    p.m.ckv_stride_page = a->k.stride[0];
    p.m.ckv_stride_tok = a->k.stride[1];
    p.m.kpe_stride_page = a->k_rope.stride[0];
    p.m.kpe_stride_tok = a->k_rope.stride[1];
    p.m.q_nope = a->q.data;
    p.m.q_nope_stride_tok = a->q.stride[0];
    p.m.q_nope_stride_head = a->q.stride[1];
    p.m.q_pe = a->q_rope.data;
    p.m.q_pe_stride_tok = a->q_rope.stride[0];
    p.m.q_pe_stride_head = a->q_rope.stride[1];
    p.m.ckv = a->k.data;
    p.m.kpe = a->k_rope.data;
    /* 16-bit caches, and fp8 ones with an fp8 q (the fp8 wgmma body; with a 16-bit q the
     * converting body loads fp8 rows into registers and has no use for maps) */
    /* a whole block, a page of a block (the transposed body), or a warp's 8 tokens */
    p.tma_box_rows = body == MLA_BODY_WG64 ? kv_block
                   : body == MLA_BODY_WGT || body == MLA_BODY_WGT16
                         ? (caps->page_size < kv_block ? caps->page_size : kv_block)
                                          : 8;
    if (body != MLA_BODY_MMA && (!p.m.kv_e4m3 || p.m.q_kind == FI_MLA_Q_E4M3) && !p.m.sparse &&
        caps->page_size >= p.tma_box_rows && caps->page_size >= 8)
        p.tma_on = mla_tensor_maps(&p, a, caps->kv_dtype);
    memcpy(params, &p, sizeof p);
    return FI_OK;
}

static fi_status mla_prepare(const fi_plan *plan, const fi_attn_args *a,
                             const fi_exec_common *common, void *params) {
    return mla_fill(plan, a, common, params, FI_MLA_MAX_TILE_ROWS, FI_MLA_KV_BLOCK, MLA_BODY_MMA);
}

static fi_status mla_wg_prepare(const fi_plan *plan, const fi_attn_args *a,
                                const fi_exec_common *common, void *params) {
    return mla_fill(plan, a, common, params, FI_MLA_WG_TILE_ROWS, FI_MLA_WG_KV_BLOCK, MLA_BODY_WG32);
}

const fi_family fi_family_mla = {
    .name = "mla_decode_sm90",
    .params_bytes = sizeof(fi_mla_params),
    .prepare = mla_prepare,
    .launch = fi_mla_launch,
};

static fi_status mla_wg64_prepare(const fi_plan *plan, const fi_attn_args *a,
                                  const fi_exec_common *common, void *params) {
    return mla_fill(plan, a, common, params, FI_MLA_WG_TILE_ROWS, FI_MLA_WG64_KV_BLOCK, MLA_BODY_WG64);
}

/* The 64-token wgmma body (mla_wg64_tile.cuh): 16-bit dense caches. */
const fi_family fi_family_mla_wg64 = {
    .name = "mla_decode_wgmma64_sm90",
    .params_bytes = sizeof(fi_mla_params),
    .prepare = mla_wg64_prepare,
    .launch = fi_mla_wg64_launch,
};

static fi_status mla_wgt_prepare(const fi_plan *plan, const fi_attn_args *a,
                                 const fi_exec_common *common, void *params) {
    return mla_fill(plan, a, common, params, FI_MLA_WGT_TILE_ROWS, FI_MLA_WGT_KV_BLOCK, MLA_BODY_WGT);
}

/* The transposed fp8 body (mla_wgt_tile.cuh): q and cache fp8 e4m3, out bf16, tiles of at
 * most 16 rows, dense plans. */
const fi_family fi_family_mla_wgt = {
    .name = "mla_decode_fp8_rows16_sm90",
    .params_bytes = sizeof(fi_mla_params),
    .prepare = mla_wgt_prepare,
    .launch = fi_mla_wgt_launch,
};

static fi_status mla_wgt16_prepare(const fi_plan *plan, const fi_attn_args *a,
                                   const fi_exec_common *common, void *params) {
    return mla_fill(plan, a, common, params, FI_MLA_WGT_TILE_ROWS, FI_MLA_WGT_KV_BLOCK, MLA_BODY_WGT16);
}

/* The transposed 16-bit body (mla_wgt16_tile.cuh): q, cache and out bf16 or fp16, tiles
 * of at most 16 rows, dense plans. */
const fi_family fi_family_mla_wgt16 = {
    .name = "mla_decode_rows16_sm90",
    .params_bytes = sizeof(fi_mla_params),
    .prepare = mla_wgt16_prepare,
    .launch = fi_mla_wgt16_launch,
};

/* The wgmma tile body (mla_wg_tile.cuh): the same tensors and checks, plus sparse plans. */
const fi_family fi_family_mla_wg = {
    .name = "mla_decode_wgmma_sm90",
    .params_bytes = sizeof(fi_mla_params),
    .prepare = mla_wg_prepare,
    .launch = fi_mla_wg_launch,
};
