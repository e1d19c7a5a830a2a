/*
 * plan/cost_model.h - the calibrated values of the planner's cost model: the numbers of
 * the tile table rows (executor/core/registry.c), and the record of how they were found.
 * Code never reads these macros: the planner reads the plan's fi_variant row
 * (plan/variant.h: fi_variant_item_cost, fi_variant_piece_charge), so another row can
 * carry other values.
 *
 * Cost of one work item (a tile, or a piece of a split tile), in units of "KV tokens":
 *     cost = kv_tokens + FI_COST_ALPHA * rows + FI_COST_BETA
 * kv_tokens: keys the item reads (after causal / window_left trimming); rows: query rows x
 * heads of the tile (its Q load and output write); beta: fixed per-item overhead
 * (prologue, work-list read, Q load latency, output or partial write).
 * (docs/DESIGN.md "Partitioning"; the same form as FlashMLA's get_mla_metadata scheduler,
 * which charges each request its KV blocks plus a fixed overhead of a few blocks.)
 *
 * THE CONSTANTS BELOW ARE FIRST GUESSES.  They are to be calibrated from measured kernel
 * times (time per item vs kv_tokens and rows on the GPU executor: slope = 1 token, alpha
 * and beta from the intercepts), then only this file changes.
 */
#ifndef FIATTN_PLAN_COST_MODEL_H
#define FIATTN_PLAN_COST_MODEL_H

#include <stdint.h>

/* KV tile of the executor, tokens: split points are rounded to multiples of this (absolute
 * request-local token index), so a piece starts on a KV tile boundary of the kernel.
 * H200, 2026-11-21, three reps each: 32 gave the same times as 64; 16 made the trace
 * snapshot 1 us slower (59.1-59.6 vs 58.2-58.9 us) though its cost balance improved
 * (1.053 vs 1.069): a piece that starts mid-block reads two partial 32-token blocks. */
#ifndef FI_KV_TILE_TOKENS /* -DFI_KV_TILE_TOKENS=... overrides it (calibration builds) */
#define FI_KV_TILE_TOKENS 64
#endif
/* The partition rounds cuts with a mask (planner/partition.c). */
_Static_assert((FI_KV_TILE_TOKENS & (FI_KV_TILE_TOKENS - 1)) == 0 && FI_KV_TILE_TOKENS > 0,
               "FI_KV_TILE_TOKENS must be a power of two");

/* No piece of a split tile is shorter than this many KV tokens (2 KV tiles), so merge
 * traffic (fp32 partial O + LSE per piece) stays small next to the attention work.  It is
 * also the partition's coarsest grain: on trace decode snapshots (128 requests, 132 CTAs,
 * about one request per CTA) 128 gives balance <= ~1.07, 256 gave up to 1.4 with the plain
 * walk.  Guess, like the costs below. */
#ifndef FI_MIN_CHUNK_TOKENS /* -DFI_MIN_CHUNK_TOKENS=... overrides it (calibration builds) */
#define FI_MIN_CHUNK_TOKENS 128
#endif

/* Cost per tile row (query row x head), in KV-token units.  Guess. */
#ifndef FI_COST_ALPHA /* -DFI_COST_ALPHA=... overrides it (calibration builds) */
#define FI_COST_ALPHA 1
#endif

/* Fixed cost per item, in KV-token units (3 KV tiles).  Calibrated on an H200 against the
 * trace snapshot (bench_mla trace128: 128 requests, h16, kv mean 837), builds with
 * -DFI_COST_BETA / -DFI_MIN_CHUNK_TOKENS, two reps each:
 *  - 2026-11-21 07:25 UTC, executor 1aefe9f (producer warps 4..7 for h16): beta 128: 62.4 /
 *    62.6 us, 192: 59.3 / 59.7, 256: 60.3 / 60.6, 384: 60.2 / 60.6; min chunk 256 with
 *    beta 256: 59.1 / 59.5, 512: 62.3 / 62.2, 768: 64.2 / 64.0.  Now 192 (4.5% faster
 *    here): a faster KV loop makes an item's fixed cost worth more tokens.  Coarser
 *    pieces raise the cost-model balance of some small trace batches (1.108 seen); the
 *    balance test bounds it by one piece over the mean there (tests/test_plan_balance.c).
 *  - earlier, executor 41ee2b1: beta 0: 82.7 us, 64: 75.1, 96: 71.7, 128: 70.2-72.1,
 *    192: 71.5, 256: 76.3, 384: 78.7, 512: 81.8.
 * The measured fixed cost of an item (several us, hundreds of tokens of streaming) is NOT
 * what the planner should charge: a larger beta buys fewer, longer items at the price of
 * balance, and past the optimum balance wins. */
#ifndef FI_COST_BETA /* -DFI_COST_BETA=... overrides it (calibration builds) */
#define FI_COST_BETA 192
#endif

/* Split-piece charges, KV-token units, for the packing partition's choice (planner/pack.h):
 * the piece that completes its group merges it, the others publish and leave.  H200,
 * 2026-11-21 (heads 16, 34 ns a key per CTA): one piece per CTA with the merge at each
 * group's end (u66 x 1636) took 8 us longer than one whole request per CTA (u132 x 818):
 * ~235 keys; a non-last piece's partial store and arrival ~2 us (BENCHMARKS.md). */
#ifndef FI_COST_MERGE
#define FI_COST_MERGE 232
#endif
#ifndef FI_COST_ARRIVE
#define FI_COST_ARRIVE 64
#endif

/* Packing limits (planner/pack.h): tiles a CTA may hold when the planner packs. */
#ifndef FI_PACK_MAX_TILES_PER_CTA /* -D...=0 with the next =0 turns packing off */
#define FI_PACK_MAX_TILES_PER_CTA 0
#endif
#ifndef FI_PACK_THIN_TILES_PER_CTA /* tiles of <= 16 rows (pack.c) */
#define FI_PACK_THIN_TILES_PER_CTA 2
#endif

#endif /* FIATTN_PLAN_COST_MODEL_H */
