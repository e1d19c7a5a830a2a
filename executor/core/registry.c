/*
 * executor/core/registry.c - the registration table: every (kind, variant) fiattn plans,
 * its tile shape, its cost-model constants (plan/cost_model.h) and the GPU family that
 * runs it.  Adding a kernel family = its folder under executor/ + one row here.
 */
#include <stddef.h>

#include "executor/core/family.h"
#include "plan/cost_model.h"
#include "plan/variant.h"

/* Cost-model constants shared by the rows calibrated together (plan/cost_model.h). */
#define FI_DECODE_COSTS                                                                    \
    .kv_tile_tokens = FI_KV_TILE_TOKENS, .min_chunk_tokens = FI_MIN_CHUNK_TOKENS,           \
    .cost_alpha = FI_COST_ALPHA, .cost_beta = FI_COST_BETA, .cost_merge = FI_COST_MERGE,    \
    .cost_arrive = FI_COST_ARRIVE

static const fi_variant k_variants[] = {
    {.kind = FI_KIND_MLA_DECODE, .variant = 0, .name = "mla_decode", .tile_rows = 64,
     .kv_block = 32, FI_DECODE_COSTS, .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = FI_PACK_MAX_TILES_PER_CTA, .family = NULL},
    {.kind = FI_KIND_GQA_DECODE, .variant = 0, .name = "gqa_decode", .tile_rows = 64,
     .kv_block = 64, FI_DECODE_COSTS, .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = FI_PACK_MAX_TILES_PER_CTA, .family = NULL},
    {.kind = FI_KIND_CONTEXT, .variant = 0, .name = "context", .tile_rows = 128,
     .kv_block = 64, FI_DECODE_COSTS, .pack_thin_tiles_per_cta = FI_PACK_THIN_TILES_PER_CTA,
     .pack_max_tiles_per_cta = FI_PACK_MAX_TILES_PER_CTA, .family = NULL},
};

const fi_variant *fi_variant_find(fi_kind kind, int32_t variant) {
    for (size_t i = 0; i < sizeof k_variants / sizeof k_variants[0]; ++i)
        if (k_variants[i].kind == kind && k_variants[i].variant == variant)
            return &k_variants[i];
    return NULL;
}
