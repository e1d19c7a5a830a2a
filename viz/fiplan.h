/*
 * viz/fiplan.h - the pieces of the fiplan tool (not a library interface).
 *
 *   fiplan.c    options, building the batch, driving the others, exit codes
 *   arena.c     the tool's host memory: a private jemalloc arena behind an fi_allocator
 *   summary.c   plan statistics and plan-update timing, the text summary
 *   dot.c       the plan as a cgraph graph: DOT text, SVG through gvc
 *   json.c      the plan and its statistics as JSON
 *   execute.c   run the plan (GPU fi_run or CPU fi_ref_run) and check it against
 *               fi_naive_attention
 */
#ifndef FIATTN_VIZ_FIPLAN_H
#define FIATTN_VIZ_FIPLAN_H

#include <stdint.h>
#include <stdio.h>

#include "fiattn.h"
#include "viz/batch.h"

/* ---- arena.c --------------------------------------------------------------------------- */

/* The tool's allocator: a private jemalloc arena (mallctl "arenas.create", mallocx with
 * MALLOCX_ARENA), or libc malloc when built with FI_NO_JEMALLOC (sanitizer builds) or if
 * the arena cannot be created.  Never NULL; lives for the whole process. */
const fi_allocator *fiplan_allocator(void);

/* Name of what backs fiplan_allocator(): "jemalloc arena N" or "malloc". */
const char *fiplan_allocator_name(void);

/* calloc-like helpers over fiplan_allocator() (NULL on failure). */
void *fiplan_alloc(size_t bytes);
void fiplan_free(void *p);

/* ---- summary.c ------------------------------------------------------------------------- */

typedef struct fiplan_stats {
    int32_t num_items, num_groups, num_slots, num_ctas, busy_ctas;
    int32_t split_items;          /* items with out_slot >= 0 */
    int32_t batch_size, total_q_tokens, tile_rows, kv_chunk;
    int64_t total_kv_tokens;      /* sum of item kv ranges */
    int64_t max_cta_cost;         /* header cost-model units */
    double mean_cta_cost;         /* total_cost / num_ctas */
    double balance;               /* fi_plan_balance */
    int32_t heads_in_flight_max;  /* fi_model_heads_in_flight (planner/model.h); text only */
    double heads_in_flight_mean;
    size_t workspace_bytes;       /* fi_workspace_size */
    size_t plan_bytes_used;       /* bytes an update copies: header .. last used item */
    double update_us_median;      /* median fi_plan_update, host plan; < 0 if not timed */
    double update_us_min, update_us_max;
    int32_t update_repeats;
} fiplan_stats;

/* Fill statistics of a planned plan (no timing). */
int fiplan_stats_of(const fi_plan *plan, fiplan_stats *st);

/* Median / min / max microseconds of `repeats` fi_plan_update(plan, batch, stream) calls
 * (after 3 warm-ups) into st->update_*.  @return the first non-OK status, or FI_OK. */
fi_status fiplan_time_updates(fi_plan *plan, const fi_batch *batch, void *stream,
                              int32_t repeats, fiplan_stats *st);

/* Median of v[n] (sorts v). */
double fiplan_median(double *v, int32_t n);

/* Human-readable summary; explain: one line under each figure saying what it means. */
void fiplan_print_summary(FILE *f, const fi_caps *caps, const fibatch *b,
                          const fiplan_stats *st, int explain);

const char *fiplan_kind_name(fi_kind kind);
const char *fiplan_dtype_name(fi_dtype d); /* "bf16", "f16", "e4m3", "f32", else "other" */
const char *fiplan_form_name(fi_batch_form form);

/* ---- dot.c ----------------------------------------------------------------------------- */

/* Draw at most this many CTAs / items; the rest is one summary node. */
#define FIPLAN_DOT_MAX_CTAS 64
#define FIPLAN_DOT_MAX_ITEMS 512
/* Drawn CTAs per row of the picture (the next ones wrap below). */
#define FIPLAN_DOT_ROW_CTAS 8

/* Write the plan as DOT to f.  @return 0, or -1 on a cgraph / write failure. */
int fiplan_write_dot(const fi_plan *plan, const fiplan_stats *st, FILE *f);

/* Lay out with dot and render SVG to svg_path through gvc (plugins registered in-process).
 * @return 0, or -1 (message on stderr). */
int fiplan_write_svg(const fi_plan *plan, const fiplan_stats *st, const char *svg_path);

/* ---- json.c ---------------------------------------------------------------------------- */

typedef struct fiplan_exec_result {
    int32_t ran;          /* 1 if --execute ran */
    int32_t on_gpu;       /* 1: fi_run on the device, 0: fi_ref_run on the CPU */
    double rel_err;       /* ||out - ref|| / ||ref|| over the written rows */
    double lse_rel_err;   /* same for lse (finite positions) */
    int64_t nonfinite;    /* mismatched non-finite positions (NaN anywhere counts) */
    double tolerance;     /* pass threshold for rel_err */
    double exec_ms;       /* wall time of the executor call */
    double gpu_us;        /* GPU: mean fi_run time over timed replays (CUDA events), else 0 */
    int32_t gpu_runs;     /* replays timed */
    double gpu_gbps;      /* GPU: bytes read and written (KV of every item, q, out) / gpu_us */
} fiplan_exec_result;

int fiplan_write_json(FILE *f, const fi_plan *plan, const fi_caps *caps, const fibatch *b,
                      const fiplan_stats *st, const fiplan_exec_result *ex);

/* ---- execute.c ------------------------------------------------------------------------- */

/* 1 if a CUDA device is usable (cudaGetDeviceCount > 0). */
int fiplan_have_gpu(void);

/* Execute the batch under caps: on the GPU (fi_run; bf16 data, device plan created here)
 * when a device exists and the kind is MLA, else on the CPU through fi_ref_run on `plan`
 * (fp32 data).  Random q / KV (seeded), then the relative error against
 * fi_naive_attention on the same (rounded) inputs.  @return FI_OK or the failing status
 * (message on stderr). */
fi_status fiplan_execute(const fi_caps *caps, const fibatch *b, const fi_plan *plan,
                         uint64_t seed, int force_cpu, fiplan_exec_result *res);

#endif /* FIATTN_VIZ_FIPLAN_H */
