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
 * 64: finer grains measured no faster (a piece starting mid-block reads two partial KV
 * blocks); the calibration runs are in docs/perf-log.md. */
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
 * trace snapshot (bench_mla trace128); 192 was the fastest of the values tried (the sweeps:
 * docs/perf-log.md, "Cost-model calibration").  Coarser pieces raise the cost-model balance
 * of some small trace batches; tests/test_plan_balance.c bounds it.
 * The measured fixed cost of an item (several us, hundreds of tokens of streaming) is NOT
 * what the planner should charge: a larger beta buys fewer, longer items at the price of
 * balance, and past the optimum balance wins. */
#ifndef FI_COST_BETA /* -DFI_COST_BETA=... overrides it (calibration builds) */
#define FI_COST_BETA 192
#endif

/* Split-piece charges, KV-token units, for the packing partition's choice (planner/pack.h):
 * the piece that completes its group merges it (~235 keys of time on an H200 at heads
 * 16), the others publish and leave (~2 us); measurements in docs/perf-log.md. */
#ifndef FI_COST_MERGE
#define FI_COST_MERGE 232
#endif
#ifndef FI_COST_ARRIVE
#define FI_COST_ARRIVE 64
#endif

/* The transposed fp8 MLA body's row (mla_decode_fp8_rows16, executor/mla/mla_wgt_tile.cuh)
 * charges its own: a token costs it half the bytes of a 16-bit one, while an item's start
 * and a group's merge cost it about as much time, so in KV-token units they are several
 * times the shared ones above.  Swept on an H200 (fp8 q and cache, heads 16, the bundled
 * trace's 128-request snapshots at steps 100 / 400 / 800; docs/perf-log.md, twenty-fourth
 * session): with the shared charges 48.7 / 55.0 / 58.2 us, with these 36.1 / 39.2 / 41.5;
 * raising beta alone did nothing, the merge and arrival charges did most of it. */
#ifndef FI_COST_BETA_FP8_ROWS16 /* -D... overrides them (calibration: scripts/sweep_charges.sh) */
#define FI_COST_BETA_FP8_ROWS16 768
#endif
#ifndef FI_COST_MERGE_FP8_ROWS16
#define FI_COST_MERGE_FP8_ROWS16 900
#endif
#ifndef FI_COST_ARRIVE_FP8_ROWS16
#define FI_COST_ARRIVE_FP8_ROWS16 256
#endif
/* The transposed 16-bit MLA body's row (mla_decode_rows16, executor/mla/mla_wgt16_tile.cuh)
 * and its device-planner twin charge their own, three quarters of row 7's: its tokens cost
 * twice the bytes and its item start and merge about the same time.  H200, heads 16, the
 * bundled trace's 128-request snapshots, b2b us, row 7's charges -> these over two calls
 * (docs/perf-log.md, forty-second session): step 100 46.4-47.7 -> 45.2-45.6, steps 400 /
 * 800 level (54.1-56.5 / 58.4-58.9 -> 54.2-55.2 / 57.9-59.4); half of row 7's lost up to
 * 9% at step 800; B1 x 32k and B128 x 4096 keep their cuts. */
#ifndef FI_COST_BETA_ROWS16
#define FI_COST_BETA_ROWS16 576
#endif
#ifndef FI_COST_MERGE_ROWS16
#define FI_COST_MERGE_ROWS16 675
#endif
#ifndef FI_COST_ARRIVE_ROWS16
#define FI_COST_ARRIVE_ROWS16 192
#endif
/* The 64-token wgmma MLA body (mla_decode_wgmma64, heads 128) charges an item twice the
 * shared beta (the split charges stay): H200, the trace's 128-request snapshots at heads
 * 128, b2b us, shared -> this (docs/perf-log.md, twenty-fourth session): steps 100 / 400 /
 * 800 137.9-139.5 / 163.6 / 175.0 -> 135.8-136.2 / 153.9-154.2 / 161.6.  The uniform
 * B128 x 4096 and B1 x 32768 plans are the same cuts either way (fiplan).  Merge and
 * arrival charges of 900 / 256 were slower. */
#ifndef FI_COST_BETA_WG64
#define FI_COST_BETA_WG64 384
#endif

/* GQA's 8-row body (gqa_decode_rows8, executor/gqa) charges an item twice the shared beta
 * (the split charges stay).  H200, b2b us, shared -> this, two interleaved rounds
 * (docs/perf-log.md, twenty-fifth session): the bundled trace's 128-request snapshots at
 * steps 100 / 400 121.8-122.0 / 156.9-157.2 -> 117.7-118.0 / 154.3-154.4, NVFP4 B128 x
 * 4096 376.7-377.1 -> 371.5-372.8; bf16 (page 64 and 16), fp8 and B1 x 32k within noise
 * although their cuts move (1147 -> 1129 items at B128 x 4096). */
#ifndef FI_COST_BETA_GQA_ROWS8
#define FI_COST_BETA_GQA_ROWS8 384
#endif

/* Packing limits (planner/pack.h): tiles a CTA may hold when the planner packs. */
#ifndef FI_PACK_MAX_TILES_PER_CTA /* -D...=0 with the next =0 turns packing off */
#define FI_PACK_MAX_TILES_PER_CTA 0
#endif
#ifndef FI_PACK_THIN_TILES_PER_CTA /* tiles of <= 16 rows (pack.c) */
#define FI_PACK_THIN_TILES_PER_CTA 2
#endif

/* List schedule (planner/listsched.h, the context row): chosen over the walk's plan while
 * its modelled time is at most this many 64ths above the walk's.  The model counts work
 * only; the walk's plan of an 8k causal prefill (32 heads) ran 1.4x slower than the same
 * kernel without its KV loads (L2 hit rate 26%: every head's KV in flight at once,
 * docs/perf-log.md), which the list schedule's few heads in flight are meant to recover.
 * Guess, to be calibrated on the GPU (context batches with the walk and the list schedule
 * side by side: fiplan shows both figures). */
#ifndef FI_LIST_SLACK_64THS
#define FI_LIST_SLACK_64THS 4
#endif

#endif /* FIATTN_PLAN_COST_MODEL_H */
