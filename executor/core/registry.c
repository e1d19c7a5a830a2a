/*
 * executor/core/registry.c - the registration table: every (kind, variant) fiattn plans,
 * its tile shape, its cost-model constants (plan/cost_model.h) and the GPU family that
 * runs it.  Adding a kernel family = its folder under executor/ + one row here.
 */
#include <stddef.h>

#include "executor/core/family.h"
#include "plan/cost_model.h"
#include "plan/variant.h"

/* The GPU families (each defined in its folder's *_host.c). */
extern const fi_family fi_family_mla;
extern const fi_family fi_family_mla_wg;
extern const fi_family fi_family_mla_wg64;
extern const fi_family fi_family_mla_wgt;
extern const fi_family fi_family_mla_wgt16;
extern const fi_family fi_family_gqa;
extern const fi_family fi_family_context;

/* A row's cost-model constants (plan/cost_model.h): the split grain, the per tile-row charge, and
 * the item / merging-piece / arriving-piece charges, which some rows set for themselves. */
#define FI_COSTS(beta, merge, arrive)                                                      \
    .kv_tile_tokens = FI_KV_TILE_TOKENS, .min_chunk_tokens = FI_MIN_CHUNK_TOKENS,           \
    .cost_alpha = FI_COST_ALPHA, .cost_beta = (beta), .cost_merge = (merge),                \
    .cost_arrive = (arrive)
/* The shared split charges with an item charge of `beta` (a row's own, or the shared one). */
#define FI_BETA_COSTS(beta) FI_COSTS(beta, FI_COST_MERGE, FI_COST_ARRIVE)
/* The charges shared by the rows calibrated together. */
#define FI_DECODE_COSTS FI_BETA_COSTS(FI_COST_BETA)
/* Row 7's own. */
#define FI_FP8_ROWS16_COSTS                                                                \
    FI_COSTS(FI_COST_BETA_FP8_ROWS16, FI_COST_MERGE_FP8_ROWS16, FI_COST_ARRIVE_FP8_ROWS16)
/* Row 9's own (and row 10's). */
#define FI_ROWS16_COSTS FI_COSTS(FI_COST_BETA_ROWS16, FI_COST_MERGE_ROWS16, FI_COST_ARRIVE_ROWS16)

static const fi_variant k_variants[] = {
    {.kind = FI_KIND_MLA_DECODE, .variant = 0, .name = "mla_decode", .tile_rows = 64,
     .kv_block = 32, FI_DECODE_COSTS, .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = FI_PACK_MAX_TILES_PER_CTA, .parallel_variant = 2,
     .family = &fi_family_mla},
    /* The same MLA tile body on 32-row tiles (heads 16 x q_len 2 in one tile, heads 128 in
     * four per query row): proves tile shape is data; not chosen by default. */
    {.kind = FI_KIND_MLA_DECODE, .variant = 1, .name = "mla_decode_rows32", .tile_rows = 32,
     .kv_block = 32, FI_DECODE_COSTS, .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = FI_PACK_MAX_TILES_PER_CTA, .family = &fi_family_mla},
    /* The default MLA tile with the data-parallel partition (planner/ppart.c; batches of
     * at most two tiles a CTA packed in pairs, planner/ppair.c): the row to give
     * fi_plan_update_device, whose planning kernel then runs in microseconds with a whole
     * CTA instead of one thread (docs/DESIGN.md section 6a). */
    {.kind = FI_KIND_MLA_DECODE, .variant = 2, .name = "mla_decode_parallel_plan",
     .tile_rows = 64, .kv_block = 32, FI_DECODE_COSTS,
     .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = 0, .partition = FI_PARTITION_PARALLEL, .family = &fi_family_mla},
    /* The wgmma tile body (executor/mla/mla_wg_tile.cuh): 64-row tiles on two consumer
     * warpgroups, 32-token KV blocks.  The default from 32 heads on (from 128 heads on a
     * 16-bit cache of 64-token pages or more: row 6; H200, trace snapshot
     * of 128 requests: heads 32 78.0 vs 105.8 us, heads 64 101.1 vs 146.6, heads 128 B128
     * x 4096 336 vs 892; heads 16 stays on mma.sync: 171 vs 152 us at B128 x 4096).  Also
     * the default at any head count for a sparse plan (its path only). */
    {.kind = FI_KIND_MLA_DECODE, .variant = 3, .name = "mla_decode_wgmma", .tile_rows = 64,
     .kv_block = 32, FI_DECODE_COSTS, .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = FI_PACK_MAX_TILES_PER_CTA, .default_min_heads = 32,
     .default_special = 1, .parallel_variant = 5, .family = &fi_family_mla_wg},
    /* The mma.sync body of row 0 by its own number, whatever the heads (row 0 itself is
     * what variant 0 means below 32 heads). */
    {.kind = FI_KIND_MLA_DECODE, .variant = 4, .name = "mla_decode_mma", .tile_rows = 64,
     .kv_block = 32, FI_DECODE_COSTS, .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = FI_PACK_MAX_TILES_PER_CTA, .parallel_variant = 2,
     .family = &fi_family_mla},
    /* The wgmma body with the data-parallel partition: the device planner's row from 32
     * heads on (as mla_decode_parallel_plan above). */
    {.kind = FI_KIND_MLA_DECODE, .variant = 5, .name = "mla_decode_wgmma_parallel_plan",
     .tile_rows = 64, .kv_block = 32, FI_DECODE_COSTS, .pack_thin_tiles_per_cta = 0,
     .pack_max_tiles_per_cta = 0, .partition = FI_PARTITION_PARALLEL, .family = &fi_family_mla_wg},
    /* The 64-token wgmma body (executor/mla/mla_wg64_tile.cuh): 64-row tiles, KV blocks of
     * 64 tokens, 16-bit dense caches.  The default from 128 heads for a 16-bit cache of
     * page_size >= 64, where its blocks go by TMA (H200, heads 128, us, against row 3:
     * B128 x 4096 293-295 vs 300-302, q_len 2 578-582 vs 587-592, trace snapshot 139-140
     * vs 140-143, B1 x 32k 49 vs 50; at page_size 16 it copies by cp.async: 378 vs 299).
     * Planned on the device by row 5 (the 32-token body: no 64-token parallel row).  Its
     * item charge is its own (FI_COST_BETA_WG64: the trace snapshot 136 vs 138-140 us). */
    {.kind = FI_KIND_MLA_DECODE, .variant = 6, .name = "mla_decode_wgmma64", .tile_rows = 64,
     .kv_block = 64, FI_BETA_COSTS(FI_COST_BETA_WG64),
     .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = FI_PACK_MAX_TILES_PER_CTA, .default_min_heads = 128,
     .default_kv16_page = 64, .parallel_variant = 5, .family = &fi_family_mla_wg64},
    /* The transposed fp8 body (executor/mla/mla_wgt_tile.cuh): q and cache fp8 e4m3, tiles
     * of at most 16 rows (a query token's 16 heads), KV blocks of 64 tokens on wgmma's M
     * side.  The default for q and cache fp8 when the caps bound a request to 16 rows
     * (heads 16 at q_len 1), on every page size.  H200, heads 16, b2b us, against the
     * mma.sync body (row 0 there): B128 x 4096 page 64 86.1-87.0 vs 155.0, page 1
     * 102.9-103.0 vs 156.8-157.1, trace snapshot of 128 requests 48.3-50.9 vs 50.1-50.2
     * (35.7-36.6 since the row has its own charges, FI_FP8_ROWS16_COSTS). */
    {.kind = FI_KIND_MLA_DECODE, .variant = 7, .name = "mla_decode_fp8_rows16", .tile_rows = 16,
     .kv_block = 64, FI_FP8_ROWS16_COSTS, .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = FI_PACK_MAX_TILES_PER_CTA, .default_fp8_max_rows = 16,
     .parallel_variant = 8, .family = &fi_family_mla_wgt},
    /* Row 7's tiles, body and charges with the data-parallel partition (pairs as row 2):
     * the device planner's row for q and cache fp8 at <= 16 rows a request (as row 2 is
     * for row 0). */
    {.kind = FI_KIND_MLA_DECODE, .variant = 8, .name = "mla_decode_fp8_rows16_parallel_plan",
     .tile_rows = 16, .kv_block = 64, FI_FP8_ROWS16_COSTS,
     .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = 0, .partition = FI_PARTITION_PARALLEL, .family = &fi_family_mla_wgt},
    /* The transposed 16-bit body (executor/mla/mla_wgt16_tile.cuh): q, cache and out bf16
     * or fp16, tiles of at most 16 rows, KV blocks of 64 tokens on wgmma's M side (row 7's
     * twin for 16-bit caches).  The default for a 16-bit cache of page_size >= 64 when the
     * caps bound a request to 16 rows (heads 16 at q_len 1).  H200, heads 16, b2b us,
     * against row 0 (docs/perf-log.md, thirty-eighth session): trace snapshot of 128
     * requests 45.3-47.1 vs 49.5-49.9, B1 x 32k 26.9-27.6 vs 27.9-28.3, B128 x 4096
     * 157.0-157.3 vs 153.2-154.3; page 1 (every block by cp.async) 347 vs 158, so smaller
     * pages (16 and 32 not measured) stay on row 0.  Its charges are its own
     * (FI_ROWS16_COSTS: the trace snapshot 45.2-45.6 vs 46.4-47.7 us with row 7's). */
    {.kind = FI_KIND_MLA_DECODE, .variant = 9, .name = "mla_decode_rows16", .tile_rows = 16,
     .kv_block = 64, FI_ROWS16_COSTS, .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = FI_PACK_MAX_TILES_PER_CTA, .default_kv16_page = 64,
     .default_kv16_max_rows = 16, .parallel_variant = 10, .family = &fi_family_mla_wgt16},
    /* Row 9 with the data-parallel partition (as row 8 is for row 7). */
    {.kind = FI_KIND_MLA_DECODE, .variant = 10, .name = "mla_decode_rows16_parallel_plan",
     .tile_rows = 16, .kv_block = 64, FI_ROWS16_COSTS,
     .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = 0, .partition = FI_PARTITION_PARALLEL, .family = &fi_family_mla_wgt16},
    {.kind = FI_KIND_GQA_DECODE, .variant = 0, .name = "gqa_decode", .tile_rows = 64,
     .kv_block = 64, FI_DECODE_COSTS, .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = FI_PACK_MAX_TILES_PER_CTA, .kv_head_major = 1,
     .parallel_variant = 1, .family = &fi_family_gqa},
    /* GQA decode with the data-parallel partition (as mla_decode_parallel_plan). */
    {.kind = FI_KIND_GQA_DECODE, .variant = 1, .name = "gqa_decode_parallel_plan",
     .tile_rows = 64, .kv_block = 64, FI_DECODE_COSTS, .pack_thin_tiles_per_cta = 0,
     .pack_max_tiles_per_cta = 0, .partition = FI_PARTITION_PARALLEL, .kv_head_major = 1,
     .family = &fi_family_gqa},
    /* GQA decode on tiles of at most 8 rows, run by the kernel that holds the transposed
     * consumers alone (executor/gqa: GqaRows8Family).  The default when the caps bound a
     * request to 8 rows (group x q_len: Llama / Qwen / Mistral decode, MTP at group 4 to
     * q_len 2); a batch that still brings a request of more rows has it cut into tiles of
     * 8, each reading its KV head's keys again.  H200, us, against row 0's kernel
     * (perf-log 2026-11-30 twentieth session): B1 x 32k 43.0-43.4 vs 45.9, B128 x 4096
     * fp8 279 vs 291, NVFP4 373-376 vs 380-382, bf16 494 vs 500.  Its item charge is its own
     * (FI_COST_BETA_GQA_ROWS8: the trace snapshot 118 vs 122 us). */
    {.kind = FI_KIND_GQA_DECODE, .variant = 2, .name = "gqa_decode_rows8", .tile_rows = 8,
     .kv_block = 64, FI_BETA_COSTS(FI_COST_BETA_GQA_ROWS8),
     .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = FI_PACK_MAX_TILES_PER_CTA, .kv_head_major = 1,
     .default_max_rows = 8, .parallel_variant = 4, .family = &fi_family_gqa},
    /* Row 2's tiles and kernel with the data-parallel partition: the device-planning row
     * for requests of at most 8 rows (as row 1 is for row 0). */
    {.kind = FI_KIND_GQA_DECODE, .variant = 4, .name = "gqa_decode_rows8_parallel_plan",
     .tile_rows = 8, .kv_block = 64, FI_DECODE_COSTS, .pack_thin_tiles_per_cta = 0,
     .pack_max_tiles_per_cta = 0, .partition = FI_PARTITION_PARALLEL, .kv_head_major = 1,
     .family = &fi_family_gqa},
    /* Row 0 by number: the 64-row tiles whatever the caps' rows (A/B against row 2). */
    {.kind = FI_KIND_GQA_DECODE, .variant = 3, .name = "gqa_decode_rows64", .tile_rows = 64,
     .kv_block = 64, FI_DECODE_COSTS, .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = FI_PACK_MAX_TILES_PER_CTA, .kv_head_major = 1,
     .parallel_variant = 1, .family = &fi_family_gqa},
    /* Context: the walk, or the list schedule (planner/listsched.h) when the model rates
     * it within FI_LIST_SLACK_64THS / 64 of the walk's plan (plan/cost_model.h). */
    {.kind = FI_KIND_CONTEXT, .variant = 0, .name = "context", .tile_rows = 128,
     .kv_block = 64, FI_DECODE_COSTS, .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = FI_PACK_MAX_TILES_PER_CTA, .partition = FI_PARTITION_LIST,
     .list_slack_64ths = FI_LIST_SLACK_64THS, .family = &fi_family_context},
    /* The same context tiles on the walk / packing partition only (no list schedule): the
     * A/B baseline of the list schedule's L2 locality (bench_context --variant 1). */
    {.kind = FI_KIND_CONTEXT, .variant = 1, .name = "context_walk", .tile_rows = 128,
     .kv_block = 64, FI_DECODE_COSTS, .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = FI_PACK_MAX_TILES_PER_CTA, .family = &fi_family_context},
};

const fi_variant *fi_variant_find(fi_kind kind, int32_t variant) {
    for (size_t i = 0; i < sizeof k_variants / sizeof k_variants[0]; ++i)
        if (k_variants[i].kind == kind && k_variants[i].variant == variant)
            return &k_variants[i];
    return NULL;
}

const fi_variant *fi_variant_select(fi_kind kind, int32_t variant, int32_t num_qo_heads,
                                    int32_t special, int32_t kv16_page_size,
                                    int32_t request_rows, int32_t both_fp8) {
    const fi_variant *best = NULL;
    if (variant == 0)
        for (size_t i = 0; i < sizeof k_variants / sizeof k_variants[0]; ++i) {
            const fi_variant *v = &k_variants[i];
            if (v->kind != kind)
                continue;
            if (special && v->default_special)
                return v;
            if (!special && both_fp8 && v->default_fp8_max_rows > 0 && request_rows > 0 &&
                request_rows <= v->default_fp8_max_rows)
                return v;
            if (!special && kv16_page_size > 0 && kv16_page_size >= v->default_kv16_page &&
                v->default_kv16_max_rows > 0 && request_rows > 0 &&
                request_rows <= v->default_kv16_max_rows)
                return v;
            if (!special && v->default_max_rows > 0 && request_rows > 0 &&
                request_rows <= v->default_max_rows)
                return v;
            if (v->default_kv16_page > 0 && kv16_page_size < v->default_kv16_page)
                continue;
            if (v->default_min_heads > 0 && num_qo_heads >= v->default_min_heads &&
                (!best || v->default_min_heads > best->default_min_heads))
                best = v;
        }
    return best ? best : fi_variant_find(kind, variant);
}
