/*
 * bench/bench_device_plan.c - the device planner (fi_plan_update_device) on the GPU: what
 * planning a step costs on the device, what a captured step (plan + run) costs, and the
 * host planner's step beside them, on decode snapshots of the bundled Azure trace.
 *
 *   devplan_mla_h16_b{32,128,1024}          MLA decode, heads 16 (576 / 512), page 64,
 *                                           concatenated layout (bench_mla's trace cases)
 *   devplan_gqa_32x8_d128_p16_b{32,128,1024}  GQA decode, 32 / 8 heads, d128, page 16, NHD
 *   devplan_{mla_h16,gqa_32x8_d128_p16}_parallel_b{...}  the same on the tile table rows with
 *                                           the data-parallel partition (MLA 2, GQA 1)
 *   devplan_gqa_32x8_d128_p16_rows8_parallel_b{...}  GQA on row 4 (the rows-8 kernel's
 *                                           data-parallel row; the walk's row is then row 2)
 * bf16, q_len 1, the trace's decode snapshot of B requests (rows from 0) at --trace-step
 * (default 100), caps.max_batch = B, caps.num_ctas = the SM count (or --ctas).
 *
 * Correctness first: the device plan's bytes equal the host plan's of the same batch, region
 * by region (tests/gpu/gpu_case_common.h gc_plan_compare); fi_run after the device plan
 * writes out and lse bitwise equal to fi_run after fi_plan_update (the host-planned run is
 * the one bench_mla, bench_gqa and tests/gpu check against the fp64 reference), every
 * element finite; again after the first replay of the captured step.  A failing case is
 * reported and not timed (exit status 1).
 *
 * Timed on the GPU (bench_common.h's replay timing: each CUDA-graph replay alone between
 * two cudaEvents, back to back, median of --reps):
 *   plan      a graph of fi_plan_update_device alone
 *   e2e_pdl   a graph of fi_plan_update_device -> fi_run, PDL on for both launches (the
 *             executor's launch overlaps the planner's exit; it waits for the plan)
 *   e2e       the same graph without PDL
 *   exec      a graph of fi_run alone on a host-planned plan of the same batch
 *   gap       e2e - plan - exec (and gap_pdl from e2e_pdl): what chaining the two costs;
 *             negative where the executor's launch overlaps the planner
 *   inside one graph (a "#" line): event record nodes between the kernels of an 8-step
 *             graph of plan -> run steps, of plan-only and of run-only steps, so that each
 *             kernel is timed where it follows the other (which of the two the gap lands
 *             on) or itself (dp_split_times)
 * Timed on the host (CLOCK_MONOTONIC, --steps steps after 32 warm-ups, the same batch
 * every step, so the host planner's caches are warm: bench_plan's loop column has it cold):
 *   host_sync   fi_plan_update + replay of the fi_run graph + stream sync, median a step
 *   dev_sync    replay of the e2e_pdl graph + stream sync, median a step
 *   host_ahead / dev_ahead   the same loops without the sync (the host runs ahead; the
 *               slower of host and GPU sets the rate): total / steps
 *
 * Usage: bench_device_plan [--kind mla|gqa|all] [--batch B ...] [--reps N]
 *                          [--steps N >= 10] [--case SUBSTR] [--ctas N] [--trace-step S]
 * (--sets, --chain, --read-tbps and --tflops are taken and ignored, so that
 * bench/run_gpu_bench.sh can hand every bench one option list.)
 * Output: one table row per case on stdout; "result <case> plan_us <x> e2e_pdl_us <x> e2e_us
 * <x> exec_us <x> gap_pdl_us <x> gap_us <x> host_sync_us <x> dev_sync_us <x> host_ahead_us <x>
 * dev_ahead_us <x>" on stderr.  No GPU: prints "skip" and exits 0.
 */
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "bench_common.h"
#include "planner/device/plan_kernel.h"
#include "gpu/gqa_gpu_case.h"
#include "gpu/mla_gpu_case.h"

#define MSG 1024
#define MAX_BATCHES 8
#define WARM_STEPS 32

typedef struct cfg {
    bench_cfg b;
    int mla, gqa;                  /* families run */
    int32_t batch[MAX_BATCHES];    /* trace snapshot sizes */
    int nbatch;
    int steps;                     /* host wall-clock loop steps */
    void *flush;                   /* L2 flush buffer (FLUSH_BYTES), NULL: no flushed timings */
} cfg;

/* Bytes read before each flushed replay: over four times the H200's 60 MiB L2. */
#define FLUSH_BYTES ((size_t)256 << 20)

/* ---- one family's case, as this bench sees it -------------------------------------------- */

/* What the timing needs of a family's case (tests/gpu/mla_gpu_case.h, gqa_gpu_case.h): its host-updated plan,
 * stream, batch, device page table (the device batch's too: fi_run must name the table the
 * device planner validated), outputs, q rows and run arguments. */
typedef struct bench_view {
    void *c;
    fi_plan *plan;
    cudaStream_t stream;
    fibatch *fb;
    int32_t *d_pt;
    gc_outputs io;
    int32_t tokens;
    int64_t out_elems;
    double (*out_value)(const void *c, int64_t i);
    fi_attn_args (*args)(const void *c);
    void (*free)(void *c);
} bench_view;

typedef struct family {
    const char *tag; /* case id part: devplan_<tag>_b<B> */
    int (*init)(bench_view *v, const int32_t *kv, int32_t n, const cfg *g, int32_t variant,
                tt_rng *rng, char *msg, size_t cap);
    int32_t variant; /* caps.variant: 0 the walk's row, else the parallel partition's */
} family;

static fi_attn_args mla_args(const void *c) { return mla_case_args((const mla_case *)c, 1); }
static double mla_out(const void *c, int64_t i) {
    return mla_bf16_to_f32(((const mla_case *)c)->h_out[i]);
}
static void mla_free(void *c) {
    mla_case_free((mla_case *)c);
    free(c);
}

/* MLA heads 16, page 64, concatenated cache (bench_mla's trace cases). */
static int mla_init(bench_view *v, const int32_t *kv, int32_t n, const cfg *g, int32_t variant,
                    tt_rng *rng,
                    char *msg, size_t cap) {
    mla_case *c = (mla_case *)calloc(1, sizeof *c);
    int32_t *q = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    if (!c || !q) {
        free(c);
        free(q);
        gc_msg(msg, cap, "host allocation failed");
        return -1;
    }
    for (int32_t b = 0; b < n; b++) q[b] = 1;
    mla_opts o;
    memset(&o, 0, sizeof o);
    o.dtype = FI_DTYPE_BF16;
    o.heads = 16;
    o.page_size = 64;
    o.form = FI_FORM_BLOCK_TABLES;
    o.return_lse = 1;
    o.num_ctas = g->b.ctas;
    o.variant = variant;
    const int rc = mla_case_init(c, &o, q, kv, n, rng, msg, cap);
    free(q);
    if (rc) {
        free(c);
        return -1;
    }
    const bench_view bv = {c, c->plan, c->stream, &c->fb, c->d_pt, mla_case_outputs(c),
                           c->tokens, (int64_t)c->tokens * o.heads * MLA_D_CKV, mla_out,
                           mla_args, mla_free};
    *v = bv;
    return 0;
}

static fi_attn_args gqa_args(const void *c) { return gqa_case_args((const gqa_case *)c); }
static double gqa_out(const void *c, int64_t i) { return gqa_out_value((const gqa_case *)c, i); }
static void gqa_free(void *c) {
    gqa_case_free((gqa_case *)c);
    free(c);
}

/* GQA 32 / 8 heads, d128, page 16, one NHD tensor (bench_gqa's default layout). */
static int gqa_init(bench_view *v, const int32_t *kv, int32_t n, const cfg *g, int32_t variant,
                    tt_rng *rng,
                    char *msg, size_t cap) {
    gqa_case *c = (gqa_case *)calloc(1, sizeof *c);
    if (!c) {
        gc_msg(msg, cap, "host allocation failed");
        return -1;
    }
    gqa_opts o;
    memset(&o, 0, sizeof o);
    o.dtype = FI_DTYPE_BF16;
    o.heads_q = 32;
    o.heads_kv = 8;
    o.head_dim = 128;
    o.page_size = 16;
    o.layout = GQA_NHD;
    o.kv_form = GQA_KV_SINGLE;
    o.q_len = 1;
    o.return_lse = 1;
    o.num_ctas = g->b.ctas;
    o.variant = variant;
    if (gqa_case_init(c, &o, kv, n, rng, msg, cap)) {
        free(c);
        return -1;
    }
    const bench_view bv = {c, c->plan, c->stream, &c->fb, c->d_pt, gqa_case_outputs(c),
                           c->tokens, (int64_t)c->tokens * o.heads_q * o.head_dim, gqa_out,
                           gqa_args, gqa_free};
    *v = bv;
    return 0;
}

static const family MLA = {"mla_h16", mla_init, 0};
static const family GQA = {"gqa_32x8_d128_p16", gqa_init, 0};
/* The same with the data-parallel partition rows (planner/ppart.c). */
static const family MLA_PP = {"mla_h16_parallel", mla_init, 2};
static const family GQA_PP = {"gqa_32x8_d128_p16_parallel", gqa_init, 1};
/* GQA 32/8 at q_len 1 is 4 rows a request: the rows-8 kernel's parallel row (GQA 4). */
static const family GQA_PP8 = {"gqa_32x8_d128_p16_rows8_parallel", gqa_init, 4};

/* ---- the device plan beside the case's host plan ----------------------------------------- */

/* A case with its device plan (own workspace, the case's caps), the device batch (seq_lens
 * and B written here, block_tables the case's), the host-planned run's outputs and the four
 * graphs. */
/* G_MIX: the device plan, then fi_run on the host plan (no dependence: what running the
 * planner kernel before the executor costs by itself); G_EXEC_DEV: fi_run alone on the
 * device-written plan (what the plan's bytes coming from the device cost). */
/* G_MEMSET: a 4-byte memset node, then fi_run on the host plan (a node before the run that
 * is not a kernel).  G_FLOOR: the 4-byte memset alone (what replaying a one-node graph back
 * to back costs whatever the node: the floor under the plan column). */
enum { G_PLAN, G_E2E_PDL, G_E2E, G_EXEC, G_MIX, G_EXEC_DEV, G_MEMSET, G_FLOOR, G_COUNT };

typedef struct dp_case {
    bench_view v;
    char name[64];
    int32_t batch, items, groups;  /* the plan's figures, for the row */
    fi_plan *dplan;
    void *d_ws;
    gc_dev_batch dev;
    fi_device_batch db;
    gc_outputs io2;
    unsigned char *buf;
    size_t buf_bytes;
    cudaGraph_t graph[G_COUNT];
    cudaGraphExec_t exec[G_COUNT];
} dp_case;


static void dp_free(dp_case *d) {
    if (d->v.stream) cudaStreamSynchronize(d->v.stream);
    for (int i = 0; i < G_COUNT; i++) {
        if (d->exec[i]) cudaGraphExecDestroy(d->exec[i]);
        if (d->graph[i]) cudaGraphDestroy(d->graph[i]);
    }
    fi_plan_destroy(d->dplan);
    cudaFree(d->d_ws);
    gc_dev_batch_free(&d->dev);
    cudaFree(d->io2.d_out);
    cudaFree(d->io2.d_lse);
    free(d->io2.h_out);
    free(d->io2.h_lse);
    free(d->buf);
    if (d->v.c) d->v.free(d->v.c);
    memset(d, 0, sizeof *d);
}

/* The device plan, its batch on the device and the second outputs. */
static int dp_open(dp_case *d, char *msg, size_t cap) {
    const fi_caps caps = *fi_plan_caps(d->v.plan);
    size_t bytes = 0;
    fi_status st = fi_workspace_size(&caps, &bytes);
    if (st != FI_OK) {
        gc_msg(msg, cap, "fi_workspace_size: %s", fi_status_name(st));
        return -1;
    }
    BENCH_CK(cudaMalloc(&d->d_ws, bytes));
    st = fi_plan_create(&caps, d->d_ws, bytes, NULL, &d->dplan);
    if (st != FI_OK) {
        gc_msg(msg, cap, "fi_plan_create (device plan): %s", fi_status_name(st));
        return -1;
    }
    const fi_batch *hb = &d->v.fb->batch;
    gc_dev_batch_init(&d->dev, d->v.d_pt);
    if (gc_dev_batch_upload(&d->dev, hb, d->v.fb->page_table_len, hb->batch_size, d->v.stream,
                            msg, cap))
        return -1;
    d->db = gc_dev_batch_describe(&d->dev, hb, 1, d->v.tokens, 0);
    d->io2.out_bytes = d->v.io.out_bytes;
    d->io2.lse_bytes = d->v.io.lse_bytes;
    BENCH_CK(cudaMalloc(&d->io2.d_out, d->io2.out_bytes));
    BENCH_CK(cudaMalloc(&d->io2.d_lse, d->io2.lse_bytes));
    d->io2.h_out = malloc(d->io2.out_bytes);
    d->io2.h_lse = malloc(d->io2.lse_bytes);
    if (!d->io2.h_out || !d->io2.h_lse) {
        gc_msg(msg, cap, "host allocation failed");
        return -1;
    }
    return 0;
}

/* The case's run arguments writing into o (the case's own outputs or io2). */
static fi_attn_args dp_args(const dp_case *d, const gc_outputs *o, int pdl) {
    fi_attn_args a = d->v.args(d->v.c);
    a.out.data = o->d_out;
    if (a.lse.data) a.lse.data = o->d_lse;
    a.enable_pdl = pdl;
    return a;
}

/* out / lse of the device-planned run (the case's) bitwise equal to the host-planned run's
 * (io2, downloaded already), every element finite. */
static int dp_same_outputs(dp_case *d, const char *when, char *msg, size_t cap) {
    if (gc_download(&d->v.io, msg, cap)) return -1;
    if (memcmp(d->v.io.h_out, d->io2.h_out, d->v.io.out_bytes) != 0 ||
        memcmp(d->v.io.h_lse, d->io2.h_lse, d->v.io.lse_bytes) != 0) {
        gc_msg(msg, cap, "%s: out / lse not bitwise equal to fi_run after fi_plan_update", when);
        return -1;
    }
    return bench_all_finite(d->v.out_elems, d->v.out_value, d->v.c, msg, cap);
}

/* The check before timing: status word, plan bytes, outputs (file comment). */
static int dp_check(dp_case *d, char *msg, size_t cap) {
    cudaStream_t s = d->v.stream;
    fi_status st = fi_plan_update_device(d->dplan, &d->db, 0, s);
    fi_error_detail e = {FI_OK, -1, -1, -1, 0};
    if (st == FI_OK) st = fi_plan_device_error(d->dplan, &e, s);
    if (st != FI_OK || e.status != FI_OK) {
        gc_msg(msg, cap, "device plan: %s / status word %s (request %d)", fi_status_name(st),
               st == FI_OK ? fi_status_name(e.status) : "-", st == FI_OK ? e.request : -1);
        return -1;
    }
    fi_plan_view v;
    if (fi_plan_get_view(d->v.plan, &v) != FI_OK) {
        gc_msg(msg, cap, "the host plan has no view");
        return -1;
    }
    if (gc_plan_download(d->d_ws, gc_plan_used_bytes(&v), &d->buf, &d->buf_bytes, msg, cap) ||
        gc_plan_compare(&v, fi_plan_caps(d->v.plan)->max_batch, d->buf, msg, cap))
        return -1;
    const fi_attn_args a = dp_args(d, &d->v.io, 0), a2 = dp_args(d, &d->io2, 0);
    if (gc_run_args(&d->io2, d->v.plan, s, &a2, msg, cap) || gc_download(&d->io2, msg, cap) ||
        gc_run_args(&d->v.io, d->dplan, s, &a, msg, cap))
        return -1;
    return dp_same_outputs(d, "fi_run after fi_plan_update_device", msg, cap);
}

/* Capture graph k: the device plan alone, plan -> run with and without PDL, or the run
 * alone on the host plan. */
static int dp_capture(dp_case *d, int k, char *msg, size_t cap) {
    cudaStream_t s = d->v.stream;
    fi_status st = FI_OK;
    BENCH_CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    if (k == G_EXEC) {
        const fi_attn_args a = dp_args(d, &d->v.io, 0);
        st = fi_run(d->v.plan, &a, s);
    } else if (k == G_MIX) {
        st = fi_plan_update_device(d->dplan, &d->db, 0, s);
        const fi_attn_args a = dp_args(d, &d->v.io, 0);
        if (st == FI_OK)
            st = fi_run(d->v.plan, &a, s);
    } else if (k == G_MEMSET) {
        const fi_attn_args a = dp_args(d, &d->v.io, 0);
        BENCH_CK(cudaMemsetAsync(d->io2.d_lse, 0, 4, s));
        st = fi_run(d->v.plan, &a, s);
    } else if (k == G_FLOOR) {
        BENCH_CK(cudaMemsetAsync(d->io2.d_lse, 0, 4, s));
    } else if (k == G_EXEC_DEV) {
        const fi_attn_args a = dp_args(d, &d->v.io, 0);
        st = fi_run(d->dplan, &a, s);
    } else {
        const int pdl = k == G_E2E_PDL;
        st = fi_plan_update_device(d->dplan, &d->db, pdl, s);
        if (st == FI_OK && k != G_PLAN) {
            const fi_attn_args a = dp_args(d, &d->v.io, pdl);
            st = fi_run(d->dplan, &a, s);
        }
    }
    BENCH_CK(cudaStreamEndCapture(s, &d->graph[k]));
    if (st != FI_OK) {
        gc_msg(msg, cap, "under capture (graph %d): %s", k, fi_status_name(st));
        return -1;
    }
    BENCH_CK(cudaGraphInstantiate(&d->exec[k], d->graph[k], 0));
    return 0;
}

/* Median seconds of reps replays of graph k (bench_common.h's timing of one input set). */
static int dp_time_graph(dp_case *d, int k, int reps, double *s, char *msg, size_t cap) {
    bench_sets one;
    memset(&one, 0, sizeof one);
    one.n = 1;
    one.exec[0] = d->exec[k];
    return bench_time_replays(d->v.stream, &one, reps, NULL, 0, s, msg, cap);
}

/* The same with the L2 flushed before each replay (flush: FLUSH_BYTES). */
static int dp_time_graph_flushed(dp_case *d, int k, int reps, void *flush, double *s, char *msg,
                                 size_t cap) {
    bench_sets one;
    memset(&one, 0, sizeof one);
    one.n = 1;
    one.exec[0] = d->exec[k];
    return bench_time_replays(d->v.stream, &one, reps, flush, FLUSH_BYTES, s, msg, cap);
}

/* Kernel times inside one graph, to see which of two chained kernels the gap lands on: a
 * graph of SPLIT_STEPS steps, each the ops of `ops` ('p': the device plan, no PDL; 'r':
 * fi_run on the device plan; 'h': fi_run on the host plan), an event record node before
 * the first op and after every op, so that each op's time is that of its event pair and
 * every op after the first follows the op before it back to back, as in a serving loop.
 * The event nodes keep the kernels apart (no PDL overlap).  Replayed reps times (a sync
 * each, to read the events); med[k]: the median time of ops[k] over every op of every
 * replay but the graph's first, seconds.  The graph is built and freed here. */
#define SPLIT_STEPS 8
#define SPLIT_OPS 4
static int dp_split_times(dp_case *d, const char *ops, int reps, double *med, char *msg,
                          size_t cap) {
    const int per = (int)strlen(ops), n_ops = SPLIT_STEPS * per;
    cudaStream_t s = d->v.stream;
    cudaEvent_t ev[SPLIT_STEPS * SPLIT_OPS + 1];
    double *t[SPLIT_OPS] = {NULL, NULL, NULL, NULL};
    int cnt[SPLIT_OPS] = {0, 0, 0, 0};
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    int made = 0, rc = -1;
    gc_msg(msg, cap, "split graph \"%s\": host allocation or event creation failed", ops);
    if (per < 1 || per > SPLIT_OPS) goto out;
    for (int k = 0; k < per; k++)
        if (!(t[k] = (double *)malloc(sizeof(double) * (size_t)(reps * SPLIT_STEPS)))) goto out;
    for (; made <= n_ops; made++)
        if (cudaEventCreate(&ev[made]) != cudaSuccess) goto out;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) != cudaSuccess) goto out;
    fi_status st = FI_OK;
    cudaError_t ce = cudaEventRecordWithFlags(ev[0], s, cudaEventRecordExternal);
    for (int i = 0; i < n_ops && st == FI_OK && ce == cudaSuccess; i++) {
        const char op = ops[i % per];
        if (op == 'p') {
            st = fi_plan_update_device(d->dplan, &d->db, 0, s);
        } else {
            const fi_attn_args a = dp_args(d, &d->v.io, 0);
            st = fi_run(op == 'r' ? d->dplan : d->v.plan, &a, s);
        }
        if (st == FI_OK) ce = cudaEventRecordWithFlags(ev[i + 1], s, cudaEventRecordExternal);
    }
    const cudaError_t ee = cudaStreamEndCapture(s, &graph);
    if (st != FI_OK || ce != cudaSuccess || ee != cudaSuccess ||
        cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
        gc_msg(msg, cap, "split graph \"%s\": %s / %s", ops, fi_status_name(st),
               cudaGetErrorString(ce != cudaSuccess ? ce : ee));
        goto out;
    }
    for (int r = 0; r < reps; r++) {
        if (cudaGraphLaunch(exec, s) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess)
            goto fail;
        for (int i = 1; i < n_ops; i++) { /* the graph's first op follows the sync: left out */
            float ms = 0;
            if (cudaEventElapsedTime(&ms, ev[i], ev[i + 1]) != cudaSuccess) goto fail;
            t[i % per][cnt[i % per]++] = ms * 1e-3;
        }
    }
    for (int k = 0; k < per; k++) {
        qsort(t[k], (size_t)cnt[k], sizeof(double), bench_cmp_double);
        med[k] = t[k][cnt[k] / 2];
    }
    rc = 0;
    goto out;
fail:
    gc_msg(msg, cap, "split graph \"%s\": %s", ops, cudaGetErrorString(cudaGetLastError()));
out:
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    for (int i = 0; i < made; i++) cudaEventDestroy(ev[i]);
    for (int k = 0; k < SPLIT_OPS; k++) free(t[k]);
    return rc;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One step of the host-clock loops: host plan + the run's graph, or the e2e_pdl graph. */
static int dp_loop_step(dp_case *d, int host, int sync) {
    if (host && fi_plan_update(d->v.plan, &d->v.fb->batch, d->v.stream) != FI_OK) return -1;
    if (cudaGraphLaunch(d->exec[host ? G_EXEC : G_E2E_PDL], d->v.stream) != cudaSuccess)
        return -1;
    return sync && cudaStreamSynchronize(d->v.stream) != cudaSuccess ? -1 : 0;
}

/* Host-clock seconds a step: with sync, the median of steps steps; without, total / steps.
 * The run graphs write the case's outputs (the checks are over by then). */
static int dp_time_loop(dp_case *d, int host, int sync, int steps, double *t, double *out_s,
                        char *msg, size_t cap) {
    for (int i = 0; i < WARM_STEPS; i++)
        if (dp_loop_step(d, host, 1)) goto fail;
    const double t0 = now_s();
    for (int i = 0; i < steps; i++) {
        const double ts = now_s();
        if (dp_loop_step(d, host, sync)) goto fail;
        t[i] = now_s() - ts;
    }
    if (cudaStreamSynchronize(d->v.stream) != cudaSuccess) goto fail;
    if (sync) {
        qsort(t, (size_t)steps, sizeof(double), bench_cmp_double);
        *out_s = t[steps / 2];
    } else {
        *out_s = (now_s() - t0) / steps;
    }
    return 0;
fail:
    gc_msg(msg, cap, "%s loop: %s", host ? "host" : "device",
           cudaGetErrorString(cudaGetLastError()));
    return -1;
}

/* Everything a case's row reports, seconds. */
typedef struct dp_times {
    double plan, e2e_pdl, e2e, exec, host_sync, dev_sync, host_ahead, dev_ahead;
    double mix, exec_dev, memset_run, floor; /* diagnostics: G_MIX, G_EXEC_DEV, G_MEMSET,
                                                 G_FLOOR */
    double plan_fl, e2e_pdl_fl, exec_fl; /* L2 flushed before each replay */
    /* inside one graph (dp_split_times): plan and run of plan -> run steps; plan of plan
     * steps; run of run steps */
    double in_plan, in_run, in_plan_plan, in_run_run;
} dp_times;

static int dp_time_all(dp_case *d, const cfg *g, dp_times *t, char *msg, size_t cap) {
    double *buf = (double *)malloc(sizeof(double) * (size_t)g->steps), split[2] = {0, 0};
    if (!buf) {
        gc_msg(msg, cap, "host allocation failed");
        return -1;
    }
    int rc = dp_time_graph(d, G_PLAN, g->b.reps, &t->plan, msg, cap) ||
             dp_time_graph(d, G_E2E_PDL, g->b.reps, &t->e2e_pdl, msg, cap) ||
             dp_time_graph(d, G_E2E, g->b.reps, &t->e2e, msg, cap) ||
             dp_time_graph(d, G_EXEC, g->b.reps, &t->exec, msg, cap) ||
             dp_time_graph(d, G_MIX, g->b.reps, &t->mix, msg, cap) ||
             dp_time_graph(d, G_EXEC_DEV, g->b.reps, &t->exec_dev, msg, cap) ||
             dp_time_graph(d, G_MEMSET, g->b.reps, &t->memset_run, msg, cap) ||
             dp_time_graph(d, G_FLOOR, g->b.reps, &t->floor, msg, cap) ||
             (g->flush &&
              (dp_time_graph_flushed(d, G_PLAN, g->b.reps, g->flush, &t->plan_fl, msg, cap) ||
               dp_time_graph_flushed(d, G_E2E_PDL, g->b.reps, g->flush, &t->e2e_pdl_fl, msg,
                                     cap) ||
               dp_time_graph_flushed(d, G_EXEC, g->b.reps, g->flush, &t->exec_fl, msg, cap))) ||
             dp_split_times(d, "pr", g->b.reps, split, msg, cap) ||
             dp_split_times(d, "p", g->b.reps, &t->in_plan_plan, msg, cap) ||
             dp_split_times(d, "h", g->b.reps, &t->in_run_run, msg, cap) ||
             dp_time_loop(d, 1, 1, g->steps, buf, &t->host_sync, msg, cap) ||
             dp_time_loop(d, 0, 1, g->steps, buf, &t->dev_sync, msg, cap) ||
             dp_time_loop(d, 1, 0, g->steps, buf, &t->host_ahead, msg, cap) ||
             dp_time_loop(d, 0, 0, g->steps, buf, &t->dev_ahead, msg, cap);
    free(buf);
    t->in_plan = split[0];
    t->in_run = split[1];
    return rc ? -1 : 0;
}

#ifdef FI_PROFILE
/* Profiling builds: one more replay of the plan graph, then where the kernel's clock went:
 * the stamp points reached (planner/device/plan_kernel.cu, plan/hd.h FI_PD_STAMP) in clock
 * order, each with the cycles since the one before (point 9 is the kernel's start). */
static void dp_print_stamps(const dp_case *d) {
    long long s[FI_PD_STAMPS];
    if (cudaGraphLaunch(d->exec[G_PLAN], d->v.stream) != cudaSuccess ||
        cudaStreamSynchronize(d->v.stream) != cudaSuccess || fi_device_plan_read_stamps(s))
        return;
    int order[FI_PD_STAMPS] = {0}, n = 0;
    for (int k = 0; k < FI_PD_STAMPS; k++) {
        if (k == 9 || !s[k]) continue;
        int j = n++;
        for (; j > 0 && s[order[j - 1]] > s[k]; j--) order[j] = order[j - 1];
        order[j] = k;
    }
    printf("# %s: plan kernel cycles, point: since the one before:", d->name);
    long long prev = s[9];
    for (int i = 0; i < n; i++) {
        printf(" %d: %lld", order[i], s[order[i]] - prev);
        prev = s[order[i]];
    }
    printf(" (total %lld)\n", prev - s[9]);
}
#endif

static void dp_report(const dp_case *d, const dp_times *t, int *header) {
    if (!*header) {
        printf("| case | B | items | groups | plan us | e2e pdl us | e2e us | exec us | gap pdl us "
               "| gap us | host step sync us | dev step sync us | host step ahead us | dev step "
               "ahead us |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
               "|\n");
        *header = 1;
    }
    const double us = 1e6, gap_pdl = t->e2e_pdl - t->plan - t->exec, gap = t->e2e - t->plan - t->exec;
    printf("| %s | %d | %d | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | "
           "%.2f |\n", d->name, d->batch, d->items, d->groups,
           t->plan * us, t->e2e_pdl * us, t->e2e * us, t->exec * us, gap_pdl * us, gap * us,
           t->host_sync * us, t->dev_sync * us, t->host_ahead * us, t->dev_ahead * us);
    printf("# %s: plan then the host plan's run (no dependence) %.2f us; run alone on the "
           "device-written plan %.2f us; a memset node then the run %.2f us; a memset node "
           "alone (the replay floor) %.2f us\n", d->name, t->mix * us, t->exec_dev * us,
           t->memset_run * us, t->floor * us);
    printf("# %s: L2 flushed before each replay: plan %.2f us, e2e pdl %.2f us, exec %.2f us, "
           "gap pdl %.2f us\n", d->name, t->plan_fl * us, t->e2e_pdl_fl * us, t->exec_fl * us,
           (t->e2e_pdl_fl - t->plan_fl - t->exec_fl) * us);
    printf("# %s: inside one graph (event nodes between the kernels, no PDL, median of "
           "the %d-step graph's ops after its first): plan %.2f us and run %.2f us of plan -> "
           "run steps; plan %.2f us of plan-only steps, run %.2f us of run-only steps\n",
           d->name, SPLIT_STEPS, t->in_plan * us, t->in_run * us, t->in_plan_plan * us,
           t->in_run_run * us);
    fprintf(stderr, "result %s plan_us %.2f e2e_pdl_us %.2f e2e_us %.2f exec_us %.2f gap_pdl_us "
            "%.2f gap_us %.2f host_sync_us %.2f dev_sync_us %.2f host_ahead_us %.2f "
            "dev_ahead_us %.2f\n", d->name, t->plan * us, t->e2e_pdl * us, t->e2e * us,
            t->exec * us, gap_pdl * us, gap * us, t->host_sync * us, t->dev_sync * us,
            t->host_ahead * us, t->dev_ahead * us);
}

/* Check, capture, time and report one case.  0, or 1 (reported as failed). */
static int run_case(const family *f, int32_t B, const cfg *g, tt_rng *rng, int *header) {
    char msg[MSG] = "host allocation failed";
    const size_t cap = sizeof msg;
    dp_case d;
    memset(&d, 0, sizeof d);
    snprintf(d.name, sizeof d.name, "devplan_%s_b%d", f->tag, B);
    if (g->b.only && !strstr(d.name, g->b.only)) return 0;
    int32_t *kv = (int32_t *)malloc(sizeof(int32_t) * (size_t)B);
    int rc = !kv || bench_trace_lengths(B, g->b.trace_step, 1, NULL, kv, msg, cap) ||
             f->init(&d.v, kv, B, g, f->variant, rng, msg, cap);
    if (!rc) rc = dp_open(&d, msg, cap);
    fi_plan_view v;
    if (!rc && fi_plan_get_view(d.v.plan, &v) != FI_OK) {
        gc_msg(msg, cap, "the host plan has no view");
        rc = 1;
    }
    if (!rc) {
        d.batch = v.header->batch_size;
        d.items = v.header->num_items;
        d.groups = v.header->num_groups;
        double mean = 0;
        for (int32_t b = 0; b < B; b++) mean += kv[b];
        printf("# %s: kv mean %.0f max %d; plan: ctas %d items %d groups %d balance %.3f\n",
               d.name, mean / B, d.v.fb->max_kv_len, v.num_ctas, v.header->num_items,
               v.header->num_groups, fi_plan_balance(d.v.plan));
    }
    free(kv);
    if (!rc && dp_check(&d, msg, cap)) {
        printf("# %s: CHECK FAILED, not timed: %s\n", d.name, msg);
        dp_free(&d);
        return 1;
    }
    for (int k = 0; k < G_COUNT && !rc; k++) rc = dp_capture(&d, k, msg, cap);
    if (!rc) { /* the captured step writes what the host-planned run wrote */
        rc = gc_poison(&d.v.io, d.v.stream, msg, cap) ||
             cudaGraphLaunch(d.exec[G_E2E_PDL], d.v.stream) != cudaSuccess ||
             cudaStreamSynchronize(d.v.stream) != cudaSuccess ||
             dp_same_outputs(&d, "first replay of the plan -> run graph (PDL)", msg, cap);
        if (rc) {
            printf("# %s: CHECK FAILED, not timed: %s\n", d.name, msg);
            dp_free(&d);
            return 1;
        }
    }
    dp_times t;
    if (!rc) rc = dp_time_all(&d, g, &t, msg, cap);
    if (rc) printf("# %s: FAILED: %s\n", d.name, msg);
    else dp_report(&d, &t, header);
#ifdef FI_PROFILE
    if (!rc) dp_print_stamps(&d);
#endif
    fflush(stdout);
    dp_free(&d);
    return rc ? 1 : 0;
}

/* ---- options ------------------------------------------------------------------------------ */

static void usage(FILE *f) {
    fputs("usage: bench_device_plan [--kind mla|gqa|all] [--batch B ...] [--reps N]\n"
          "  [--steps N >= 10] [--case SUBSTR] [--ctas N] [--trace-step S]  (see the file "
          "comment)\n", f);
}

/* getopt_long; the options every bench takes go through bench_cfg_option under their own
 * names.  0, or -1 on a bad option. */
static int parse_args(int argc, char **argv, cfg *g) {
    enum { O_KIND = 256, O_BATCH, O_STEPS, O_HELP };
    static const struct option opts[] = {
        {"reps", required_argument, 0, 0},      {"sets", required_argument, 0, 0},
        {"chain", required_argument, 0, 0},     {"ctas", required_argument, 0, 0},
        {"trace-step", required_argument, 0, 0}, {"case", required_argument, 0, 0},
        {"read-tbps", required_argument, 0, 0}, {"tflops", required_argument, 0, 0},
        {"kind", required_argument, 0, O_KIND}, {"batch", required_argument, 0, O_BATCH},
        {"steps", required_argument, 0, O_STEPS}, {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0}};
    int c, idx = 0;
    while ((c = getopt_long(argc, argv, "", opts, &idx)) != -1) {
        switch (c) {
        case 0: {
            char name[32];
            snprintf(name, sizeof name, "--%s", opts[idx].name);
            if (!bench_cfg_option(&g->b, name, optarg) && strcmp(name, "--tflops") != 0)
                return -1;
            break;
        }
        case O_KIND:
            g->mla = !strcmp(optarg, "mla") || !strcmp(optarg, "all");
            g->gqa = !strcmp(optarg, "gqa") || !strcmp(optarg, "all");
            if (!g->mla && !g->gqa) return -1;
            break;
        case O_BATCH: {
            const int b = atoi(optarg);
            if (b < 1 || b > FI_LIMIT_MAX_BATCH || g->nbatch >= MAX_BATCHES) return -1;
            g->batch[g->nbatch++] = b;
            break;
        }
        case O_STEPS: g->steps = atoi(optarg); break;
        case O_HELP: usage(stdout); exit(0);
        default: return -1;
        }
    }
    if (g->steps < 10) { /* the host loops time 32 warm-ups, then at least 10 steps */
        fprintf(stderr, "bench_device_plan: --steps %d: at least 10\n", g->steps);
        return -1;
    }
    if (optind < argc) return -1;
    if (g->nbatch == 0) {
        static const int32_t sizes[] = {32, 128, 1024};
        for (int i = 0; i < 3; i++) g->batch[g->nbatch++] = sizes[i];
    }
    return 0;
}

int main(int argc, char **argv) {
    cfg g;
    memset(&g, 0, sizeof g);
    g.b = bench_cfg_default();
    g.mla = g.gqa = 1;
    g.steps = 1000;
    if (parse_args(argc, argv, &g)) {
        usage(stderr);
        return 2;
    }
    bench_device dev;
    tt_rng rng;
    int rc = 0;
    if (bench_begin("bench_device_plan", &g.b, &dev, &rng, &rc)) return rc;
    if (cudaMalloc(&g.flush, FLUSH_BYTES) != cudaSuccess) g.flush = NULL;
    printf("# trace decode snapshots at step %d, bf16, q_len 1; graph replays timed back to "
           "back (median of %d); host loops: %d steps of the same batch\n", g.b.trace_step,
           g.b.reps, g.steps);
    int header = 0, failed = 0;
    const family *fams[5] = {g.mla ? &MLA_PP : NULL, g.gqa ? &GQA_PP : NULL,
                             g.gqa ? &GQA_PP8 : NULL, g.mla ? &MLA : NULL, g.gqa ? &GQA : NULL};
    for (int f = 0; f < 5; f++)
        for (int i = 0; fams[f] && i < g.nbatch; i++)
            failed |= run_case(fams[f], g.batch[i], &g, &rng, &header);
    return failed;
}
