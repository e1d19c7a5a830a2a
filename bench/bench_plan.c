/*
 * bench/bench_plan.c - fi_plan_update time for decode batches from the bundled Azure trace.
 *
 * Decode snapshots at step S (viz/trace.h continuous batching) of 1, 32, 128, 256, 512 and
 * 1024 requests, block_tables form, shuffled page ids, page_size 64, 132 CTAs (an H100's
 * SMs); MLA decode (576/512, H_q 128 by default) or GQA decode (--kind gqa: H_q 32, H_kv 8,
 * head_dim 128).  Each plan is checked first (every key of every (request, head) read
 * exactly once, CSR well formed).  Two measurements a row, medians in microseconds:
 *   hot    the same batch updated again and again on a host-only plan whose caps fit the
 *          batch exactly (the figure of the earlier BENCHMARKS tables: caches and branch
 *          predictors warm; the lower bound of an update);
 *   loop   what a serving loop sees on the host: caps of a serving engine (max_batch
 *          max(B, 256), a page pool of --pool-pages ids with the batch's pages spread over
 *          it), each update plans the *next* decode step (32 consecutive steps, cycled:
 *          lengths grow, requests leave and join), and before each update the host caches
 *          are evicted (--evict-mb of writes) as the rest of a serving step (the replay,
 *          sampling, the framework) does.  Host-only plan: validation, tiles, partition,
 *          layout into staging; no CUDA call.
 * --kv-scale F multiplies every kv length (the serving loop had ~5,300 pages in use
 * at 128 requests, the bundled excerpt ~2,000 at step 200: --kv-scale 2.7).
 *
 * With a GPU (the lead's machine) two more columns, and with --gpu-loop (MLA only) the
 * serving loop itself on a device plan: per step the engine's page-table copy, then
 * fi_plan_update (timed: validation ... the pinned staging, the one cudaMemcpyAsync, the
 * event record, and the event wait when the host is two updates ahead of the GPU), then a
 * CUDA-graph replay of fi_run; once with the host free to run ahead of the GPU, once with a
 * stream sync after each replay (a loop that reads its sampled tokens every step: no event
 * wait left).  The difference of the two is the event wait; sync minus the host-only loop
 * column is the CUDA calls.  A last line times each part of the update alone in the same
 * loop (gpu_loop_parts: the host build, the capture check, the event wait, the plan copy,
 * the event record).
 *
 *   make build/bench/bench_plan && build/bench/bench_plan [--kind mla|gqa] [--heads H]
 *     [--batch B] [--step S] [--repeats N] [--loop-repeats N] [--kv-scale F]
 *     [--pool-pages P] [--evict-mb M] [--gpu-loop] [--variant V]
 * --variant V plans on tile table row V of the kind (caps.variant; 0 the default row): e.g.
 * MLA 2 / GQA 1, the data-parallel partition's rows, which the device planner runs.
 * --batch B runs only the row of B requests (e.g. under valgrind --tool=callgrind
 * --toggle-collect=fi_plan_update, whose instruction counts do not depend on machine load).
 * Targets (issue 18, this 2-core VM): loop <= 15 us at 128 requests (MLA H_q 128); GQA
 * decode <= 60 us at 1024 and no slower at 32 than at 128; MLA H_q 16 <= 12 us at 128.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "fiattn.h"
#include "fiattn_run.h"
#include "viz/batch.h"
#include "viz/trace.h"

#define LOOP_STEPS 32 /* consecutive decode steps a loop row cycles through */

typedef struct config {
    int mla, heads, kv_heads, head_dim;
    int step, repeats, loop_repeats, only, evict_mb, pool_pages, gpu_loop, variant;
    double kv_scale;
} config;

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct stats {
    double med, p10, p90, max;
} stats;

static stats stats_of(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    stats s = {t[n / 2], t[n / 10], t[n * 9 / 10], t[n - 1]};
    return s;
}

/* What the rest of a serving step does to the host caches: write `bytes` of memory. */
static unsigned char *g_evict;
static size_t g_evict_bytes;
static void evict(void) {
    if (g_evict_bytes) memset(g_evict, (int)(now_us()) & 0xff, g_evict_bytes);
}

/* Every key of every (request, head) covered exactly once, CSR well formed.
 * Decode rows (q_len 1, causal) read all kv_len keys.  @return 0 or -1 (printed). */
static int check_plan(const fi_plan *plan, const fibatch *b) {
    fi_plan_view v;
    if (fi_plan_get_view(plan, &v) != FI_OK) return -1;
    if (v.work_indptr[0] != 0 || v.work_indptr[v.num_ctas] != v.header->num_items) {
        fprintf(stderr, "bench_plan: work_indptr does not span the items\n");
        return -1;
    }
    for (int32_t c = 0; c < v.num_ctas; c++)
        if (v.work_indptr[c + 1] < v.work_indptr[c]) {
            fprintf(stderr, "bench_plan: work_indptr decreases at CTA %d\n", c);
            return -1;
        }
    int32_t B = b->batch.batch_size, H = fi_plan_caps(plan)->num_qo_heads;
    int64_t *cov = calloc((size_t)B * (size_t)H, sizeof *cov);
    if (!cov) return -1;
    for (int32_t i = 0; i < v.header->num_items; i++) {
        const fi_work_item *it = &v.items[i];
        for (int32_t h = it->head_begin; h < it->head_end; h++)
            cov[(int64_t)it->request * H + h] += it->kv_end - it->kv_begin;
    }
    int rc = 0;
    for (int32_t r = 0; r < B && rc == 0; r++)
        for (int32_t h = 0; h < H; h++)
            if (cov[(int64_t)r * H + h] != b->kv_lens[r]) {
                fprintf(stderr, "bench_plan: request %d head %d reads %lld keys of %d\n", r, h,
                        (long long)cov[(int64_t)r * H + h], b->kv_lens[r]);
                rc = -1;
                break;
            }
    free(cov);
    return rc;
}

static fi_caps caps_of(const config *cf, int32_t max_batch, int32_t num_pages) {
    fi_caps c;
    memset(&c, 0, sizeof c);
    c.kind = cf->mla ? FI_KIND_MLA_DECODE : FI_KIND_GQA_DECODE;
    c.max_batch = max_batch;
    c.max_q_tokens = max_batch;
    c.num_pages = num_pages;
    c.page_size = 64;
    c.num_qo_heads = cf->heads;
    c.num_kv_heads = cf->kv_heads;
    c.head_dim_qk = cf->mla ? 576 : cf->head_dim;
    c.head_dim_vo = cf->mla ? 512 : cf->head_dim;
    c.q_dtype = c.kv_dtype = c.o_dtype = FI_DTYPE_BF16;
    c.num_ctas = 132;
    c.variant = cf->variant;
    return c;
}

/* The decode snapshot of n requests at `step`, kv lengths times kv_scale; page ids spread
 * over a pool of `pool` ids (0: ids 0 .. pages-1, shuffled).  @return 0 or -1. */
static int build_batch(const config *cf, const fitrace *trace, int n, int step, int pool,
                       fibatch *b) {
    int32_t *q = malloc((size_t)n * 4), *kv = malloc((size_t)n * 4), *src = malloc((size_t)n * 4);
    fitrace_lens l = {n, q, kv, src};
    int rc = -1;
    memset(b, 0, sizeof *b);
    if (!q || !kv || !src || fitrace_decode(trace, 0, step, 1, &l) != FITRACE_OK) goto out;
    for (int i = 0; i < n; i++) kv[i] = (int32_t)lround(kv[i] * cf->kv_scale);
    fibatch_opts o = fibatch_default_opts();
    o.form = FI_FORM_BLOCK_TABLES;
    o.page_size = 64;
    o.shuffle = 1;
    o.seed = 42 + (uint64_t)step;
    if (fibatch_build(&o, q, kv, n, NULL, b) != FIBATCH_OK) goto out;
    if (pool > b->num_pages) { /* spread: id -> an increasing injection into [0, pool) */
        const double stride = (double)pool / b->num_pages;
        for (int64_t i = 0; i < b->page_table_len; i++)
            if (b->page_table[i] >= 0) b->page_table[i] = (int32_t)(b->page_table[i] * stride);
        b->num_pages = pool;
    }
    rc = 0;
out:
    free(q);
    free(kv);
    free(src);
    return rc;
}

/* Median etc. of `repeats` updates of the same batch after 20 warm-ups; -1 on a failure. */
static int time_hot(fi_plan *plan, const fi_batch *batch, int repeats, double *t, stats *s) {
    for (int i = 0; i < 20; i++)
        if (fi_plan_update(plan, batch, NULL) != FI_OK) return -1;
    for (int i = 0; i < repeats; i++) {
        double t0 = now_us();
        fi_status st = fi_plan_update(plan, batch, NULL);
        t[i] = now_us() - t0;
        if (st != FI_OK) return -1;
    }
    *s = stats_of(t, repeats);
    return 0;
}

/* The loop's case on a host-only plan: the next step's batch, caches evicted before each. */
static int time_loop(fi_plan *plan, const fibatch *steps, int repeats, double *t, stats *s) {
    for (int i = 0; i < repeats + LOOP_STEPS; i++) {
        const fi_batch *b = &steps[i % LOOP_STEPS].batch;
        evict();
        double t0 = now_us();
        fi_status st = fi_plan_update(plan, b, NULL);
        double dt = now_us() - t0;
        if (st != FI_OK) return -1;
        if (i >= LOOP_STEPS) t[i - LOOP_STEPS] = dt; /* the first round warms up */
    }
    *s = stats_of(t, repeats);
    return 0;
}

#define CK(x)                                                                                 \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "bench_plan: %s: %s\n", #x, cudaGetErrorString(e_));              \
            goto out;                                                                         \
        }                                                                                     \
    } while (0)

/* Where the in-loop update's time goes (after gpu_loop's synchronised loop, on its stream,
 * graph and steps): each step, after the page-table copy and the eviction, times ONE of
 * fi_plan_update's parts done on its own, in turn: the host build (a host-only plan of the
 * same caps), the capture check (cudaGetDevice + cudaStreamIsCapturing), the wait on an
 * event that has completed, the plan copy (the device plan's used bytes, pinned host to a
 * scratch device buffer) and the event record; then the replay and a stream sync.  Each
 * part pays its own cold misses, so the parts may add up to more than the update.
 * Prints one line of medians.  @return 0 or -1. */
static int gpu_loop_parts(const fi_caps *caps, fi_plan *dplan, const fibatch *steps,
                          int repeats, void *pt, void *pts, int64_t pt_max, cudaStream_t st,
                          cudaGraphExec_t exec) {
    enum { PARTS = 5 };
    static const char *name[PARTS] = {"host build", "capture check", "event wait (done)",
                                      "plan copy", "event record"};
    fi_plan_view v;
    fi_plan *hp = NULL;
    void *pin = NULL, *dst = NULL;
    cudaEvent_t ev = NULL;
    double *t = malloc(sizeof(double) * PARTS * (size_t)repeats);
    int rc = -1;
    if (!t || fi_plan_get_view(dplan, &v) != FI_OK ||
        fi_plan_create(caps, NULL, 0, NULL, &hp) != FI_OK)
        goto out;
    const size_t used = (size_t)((const unsigned char *)v.items - (const unsigned char *)v.header) +
                        sizeof(fi_work_item) * (size_t)v.header->num_items;
    CK(cudaHostAlloc(&pin, used, cudaHostAllocDefault));
    CK(cudaMalloc(&dst, used));
    memcpy(pin, v.header, used);
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CK(cudaEventRecord(ev, st));
    for (int i = 0; i < PARTS * (repeats + LOOP_STEPS); i++) {
        const int k = i % LOOP_STEPS, part = i % PARTS;
        CK(cudaMemcpyAsync(pt, (int32_t *)pts + k * pt_max, (size_t)steps[k].page_table_len * 4,
                           cudaMemcpyDeviceToDevice, st));
        evict();
        cudaError_t e = cudaSuccess;
        enum cudaStreamCaptureStatus cs;
        int dev = 0;
        const double t0 = now_us();
        switch (part) {
        case 0: e = fi_plan_update(hp, &steps[k].batch, NULL) == FI_OK ? cudaSuccess
                                                                        : cudaErrorUnknown; break;
        case 1: e = cudaGetDevice(&dev); if (e == cudaSuccess) e = cudaStreamIsCapturing(st, &cs); break;
        case 2: e = cudaEventSynchronize(ev); break;
        case 3: e = cudaMemcpyAsync(dst, pin, used, cudaMemcpyHostToDevice, st); break;
        default: e = cudaEventRecord(ev, st); break;
        }
        const double dt = now_us() - t0;
        CK(e);
        if (i >= PARTS * LOOP_STEPS) t[part * repeats + (i / PARTS - LOOP_STEPS)] = dt;
        /* The update itself, untimed: the replay reads the plan of the copied page table. */
        if (fi_plan_update(dplan, &steps[k].batch, st) != FI_OK) goto out;
        CK(cudaGraphLaunch(exec, st));
        CK(cudaStreamSynchronize(st));
    }
    printf("gpu loop parts (each alone after the page-table copy and the eviction; us, "
           "medians):");
    for (int p = 0; p < PARTS; p++)
        printf("%s %s %.2f", p ? "," : "", name[p], stats_of(t + p * repeats, repeats).med);
    printf(" (%zu bytes)\n", used);
    rc = 0;
out:
    if (st) cudaStreamSynchronize(st);
    if (ev) cudaEventDestroy(ev);
    cudaFreeHost(pin);
    cudaFree(dst);
    fi_plan_destroy(hp);
    free(t);
    return rc;
}

/* The serving loop on the GPU (MLA): per step the engine's page-table copy (device to
 * device, untimed), fi_plan_update on a device plan (timed), one CUDA-graph replay of
 * fi_run; `sync`: a stream sync after each replay.  Prints one line.  @return 0 or -1. */
static int gpu_loop(const config *cf, const fi_caps *caps, const fibatch *steps, int repeats,
                    double *t, int sync) {
    const int64_t H = caps->num_qo_heads, T = caps->max_q_tokens, pool = caps->num_pages;
    int64_t pt_max = 1;
    for (int k = 0; k < LOOP_STEPS; k++)
        if (steps[k].page_table_len > pt_max) pt_max = steps[k].page_table_len;
    fi_plan *plan = NULL;
    void *q = NULL, *kv = NULL, *o = NULL, *lse = NULL, *pt = NULL, *pts = NULL;
    cudaStream_t st = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = -1;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaMalloc(&q, (size_t)(T * H * 576 * 2)));
    CK(cudaMalloc(&kv, (size_t)(pool * 64 * 576 * 2)));
    CK(cudaMalloc(&o, (size_t)(T * H * 512 * 2)));
    CK(cudaMalloc(&lse, (size_t)(T * H * 4)));
    CK(cudaMalloc(&pt, (size_t)pt_max * 4));
    CK(cudaMalloc(&pts, (size_t)(LOOP_STEPS * pt_max * 4)));
    CK(cudaMemset(q, 0, (size_t)(T * H * 576 * 2)));
    CK(cudaMemset(kv, 0, (size_t)(pool * 64 * 576 * 2)));
    for (int k = 0; k < LOOP_STEPS; k++)
        CK(cudaMemcpy((int32_t *)pts + k * pt_max, steps[k].page_table,
                      (size_t)steps[k].page_table_len * 4, cudaMemcpyHostToDevice));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    if (fi_plan_create_owned(caps, NULL, &plan) != FI_OK) goto out;
    CK(cudaMemcpy(pt, pts, (size_t)steps[0].page_table_len * 4, cudaMemcpyDeviceToDevice));
    if (fi_plan_update(plan, &steps[0].batch, st) != FI_OK) goto out;
    /* fi_run's arguments (fiattn_run.h; the concatenated layout, as viz/execute.c). */
    const fi_batch *b0 = &steps[0].batch;
    fi_attn_args a;
    memset(&a, 0, sizeof a);
    const int64_t qs[3] = {H * 576, 576, 1}, qsh[3] = {b0->batch_size, H, 512};
    const int64_t qrsh[3] = {b0->batch_size, H, 64};
    const int64_t ks[4] = {64 * 576, 576, 576, 1}, ksh[4] = {pool, 64, 1, 512};
    const int64_t krsh[4] = {pool, 64, 1, 64};
    const int64_t os[3] = {H * 512, 512, 1}, osh[3] = {b0->batch_size, H, 512};
    const int64_t ls[2] = {H, 1}, lsh[2] = {b0->batch_size, H};
    const int64_t psh[2] = {b0->batch_size, b0->max_pages_per_seq};
    const int64_t pst[2] = {b0->max_pages_per_seq, 1};
    a.q = fi_tensor_make(q, FI_DTYPE_BF16, 3, qsh, qs);
    a.q_rope = fi_tensor_make((char *)q + 1024, FI_DTYPE_BF16, 3, qrsh, qs);
    a.k = fi_tensor_make(kv, FI_DTYPE_BF16, 4, ksh, ks);
    a.k_rope = fi_tensor_make((char *)kv + 1024, FI_DTYPE_BF16, 4, krsh, ks);
    a.out = fi_tensor_make(o, FI_DTYPE_BF16, 3, osh, os);
    a.lse = fi_tensor_make(lse, FI_DTYPE_F32, 2, lsh, ls);
    a.page_table = fi_tensor_make(pt, FI_DTYPE_I32, 2, psh, pst);
    a.bmm1_scale = 1.0f / sqrtf(576.0f);
    a.bmm2_scale = 1.0f;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    fi_status fs = fi_run(plan, &a, st);
    CK(cudaStreamEndCapture(st, &graph));
    if (fs != FI_OK) {
        fprintf(stderr, "bench_plan: fi_run under capture: %s\n", fi_status_name(fs));
        goto out;
    }
    CK(cudaGraphInstantiate(&exec, graph, 0));
    double replay_ms = 0;
    for (int i = 0; i < repeats + LOOP_STEPS; i++) {
        const int k = i % LOOP_STEPS;
        CK(cudaMemcpyAsync(pt, (int32_t *)pts + k * pt_max, (size_t)steps[k].page_table_len * 4,
                           cudaMemcpyDeviceToDevice, st));
        evict();
        double t0 = now_us();
        fi_status us = fi_plan_update(plan, &steps[k].batch, st);
        double dt = now_us() - t0;
        if (us != FI_OK) {
            fprintf(stderr, "bench_plan: device update: %s\n", fi_status_name(us));
            goto out;
        }
        if (i == LOOP_STEPS) CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(exec, st));
        if (sync) CK(cudaStreamSynchronize(st));
        if (i >= LOOP_STEPS) t[i - LOOP_STEPS] = dt;
    }
    CK(cudaEventRecord(e1, st));
    CK(cudaStreamSynchronize(st));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    replay_ms = ms;
    stats s = stats_of(t, repeats);
    printf("gpu loop (%s): fi_plan_update median %.2f us, p90 %.2f, max %.2f; step on the GPU "
           "(page-table copy + plan copy + replay) %.1f us mean\n",
           sync ? "stream sync after each replay" : "host free to run ahead", s.med, s.p90,
           s.max, replay_ms * 1e3 / repeats);
    if (sync && gpu_loop_parts(caps, plan, steps, repeats, pt, pts, pt_max, st, exec) != 0)
        goto out;
    rc = 0;
out:
    if (st) cudaStreamSynchronize(st);
    fi_plan_destroy(plan);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(q);
    cudaFree(kv);
    cudaFree(o);
    cudaFree(lse);
    cudaFree(pt);
    cudaFree(pts);
    if (st) cudaStreamDestroy(st);
    return rc;
}

static void usage(FILE *f) {
    fputs("usage: bench_plan [--kind mla|gqa] [--heads H] [--kv-heads H] [--head-dim D]\n"
          "  [--batch B] [--step S] [--repeats N] [--loop-repeats N] [--kv-scale F]\n"
          "  [--pool-pages P] [--evict-mb M] [--gpu-loop] [--variant V]  (see the file comment)\n",
          f);
}

static int parse_args(int argc, char **argv, config *cf) {
    enum { O_KIND = 256, O_HEADS, O_KVH, O_HD, O_BATCH, O_STEP, O_REP, O_LREP, O_SCALE, O_POOL,
           O_EVICT, O_GPU, O_VARIANT, O_HELP };
    static const struct option opts[] = {
        {"kind", required_argument, 0, O_KIND},     {"heads", required_argument, 0, O_HEADS},
        {"kv-heads", required_argument, 0, O_KVH},  {"head-dim", required_argument, 0, O_HD},
        {"batch", required_argument, 0, O_BATCH},   {"step", required_argument, 0, O_STEP},
        {"repeats", required_argument, 0, O_REP},   {"loop-repeats", required_argument, 0, O_LREP},
        {"kv-scale", required_argument, 0, O_SCALE}, {"pool-pages", required_argument, 0, O_POOL},
        {"evict-mb", required_argument, 0, O_EVICT}, {"gpu-loop", no_argument, 0, O_GPU},
        {"variant", required_argument, 0, O_VARIANT}, {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0}};
    int c, heads = 0, kvh = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case O_KIND:
            if (!strcmp(optarg, "mla")) cf->mla = 1;
            else if (!strcmp(optarg, "gqa")) cf->mla = 0;
            else return -1;
            break;
        case O_HEADS: heads = atoi(optarg); break;
        case O_KVH: kvh = atoi(optarg); break;
        case O_HD: cf->head_dim = atoi(optarg); break;
        case O_BATCH: cf->only = atoi(optarg); break;
        case O_STEP: cf->step = atoi(optarg); break;
        case O_REP: cf->repeats = atoi(optarg); break;
        case O_LREP: cf->loop_repeats = atoi(optarg); break;
        case O_SCALE: cf->kv_scale = atof(optarg); break;
        case O_POOL: cf->pool_pages = atoi(optarg); break;
        case O_EVICT: cf->evict_mb = atoi(optarg); break;
        case O_GPU: cf->gpu_loop = 1; break;
        case O_VARIANT: cf->variant = atoi(optarg); break;
        case O_HELP: usage(stdout); exit(0);
        default: return -1;
        }
    }
    if (optind < argc) return -1;
    cf->heads = heads > 0 ? heads : cf->mla ? 128 : 32;
    cf->kv_heads = kvh > 0 ? kvh : cf->mla ? 1 : 8;
    if (cf->heads > 128 || cf->heads % cf->kv_heads || cf->step < 0 || cf->kv_scale <= 0 ||
        cf->head_dim < 1 || cf->evict_mb < 0 || cf->pool_pages < 0 || cf->variant < 0)
        return -1;
    if (cf->repeats < 10) cf->repeats = 10;
    if (cf->loop_repeats < 10) cf->loop_repeats = 10;
    return 0;
}

int main(int argc, char **argv) {
    config cf = {.mla = 1, .head_dim = 128, .step = 200, .repeats = 2000, .loop_repeats = 500,
                 .evict_mb = 32, .pool_pages = 65536, .kv_scale = 1.0};
    if (parse_args(argc, argv, &cf) != 0) {
        usage(stderr);
        return 2;
    }
    int ngpu = 0;
    int gpu = cudaGetDeviceCount(&ngpu) == cudaSuccess && ngpu > 0;
    fitrace *trace = NULL;
    if (fitrace_load_default(NULL, &trace) != FITRACE_OK) {
        fprintf(stderr, "bench_plan: cannot parse the embedded trace\n");
        return 1;
    }
    g_evict_bytes = (size_t)cf.evict_mb << 20;
    g_evict = g_evict_bytes ? malloc(g_evict_bytes) : NULL;
    static const int sizes[] = {1, 32, 128, 256, 512, 1024};
    int nt = cf.repeats > cf.loop_repeats ? cf.repeats : cf.loop_repeats;
    double *t = malloc((size_t)nt * sizeof *t);
    if (!t || (g_evict_bytes && !g_evict)) return 1;
    printf("fi_plan_update, %s decode, H_q %d, H_kv %d, page_size 64, 132 CTAs, Azure conv "
           "trace step %d, kv x %.2f; hot: %d updates of one batch; loop: %d updates over %d "
           "steps, %d MB evicted before each, pool %d pages (median / p10 / p90, us)\n\n",
           cf.mla ? "MLA" : "GQA", cf.heads, cf.kv_heads, cf.step, cf.kv_scale, cf.repeats,
           cf.loop_repeats, LOOP_STEPS, cf.evict_mb, cf.pool_pages);
    printf("| batch | kv_len mean | pages | items | groups | balance | hot median | hot p10 | hot "
           "p90 | loop median | loop p90 | device hot median |\n"
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    int rc = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0] && rc == 0; k++) {
        const int n = sizes[k];
        if (cf.only > 0 && n != cf.only) continue;
        fibatch b, steps[LOOP_STEPS];
        memset(steps, 0, sizeof steps);
        fi_plan *plan = NULL, *lplan = NULL, *dplan = NULL;
        int32_t used = 0;
        if (build_batch(&cf, trace, n, cf.step, 0, &b) != 0) {
            fprintf(stderr, "bench_plan: cannot build the batch of %d\n", n);
            rc = 1;
            goto next;
        }
        used = b.num_pages;
        int pool = cf.pool_pages;
        for (int s = 0; s < LOOP_STEPS; s++) {
            if (build_batch(&cf, trace, n, cf.step + s, 0, &steps[s]) != 0) rc = 1;
            else if (steps[s].num_pages > pool) pool = steps[s].num_pages;
        }
        for (int s = 0; s < LOOP_STEPS && rc == 0; s++) { /* again, spread over the pool */
            fibatch_free(&steps[s]);
            if (build_batch(&cf, trace, n, cf.step + s, pool, &steps[s]) != 0) rc = 1;
        }
        const fi_caps caps = caps_of(&cf, n, b.num_pages);
        const fi_caps lcaps = caps_of(&cf, n > 256 ? n : 256, pool);
        fi_status s = rc ? FI_ERR_INVALID_ARGUMENT : fi_plan_create(&caps, NULL, 0, NULL, &plan);
        if (s == FI_OK) s = fi_plan_update(plan, &b.batch, NULL);
        if (s != FI_OK || check_plan(plan, &b) != 0) {
            fprintf(stderr, "bench_plan: batch %d: plan failed or wrong (%s)\n", n, fi_status_name(s));
            rc = 1;
            goto next;
        }
        s = fi_plan_create(&lcaps, NULL, 0, NULL, &lplan);
        for (int i = 0; i < LOOP_STEPS && s == FI_OK; i++) {
            s = fi_plan_update(lplan, &steps[i].batch, NULL);
            if (s == FI_OK && check_plan(lplan, &steps[i]) != 0) s = FI_ERR_INVALID_ARGUMENT;
        }
        if (s != FI_OK) {
            fprintf(stderr, "bench_plan: batch %d: loop plan failed or wrong (%s)\n", n,
                    fi_status_name(s));
            rc = 1;
            goto next;
        }
        stats hot, loop, dhot = {-1, 0, 0, 0};
        if (time_hot(plan, &b.batch, cf.repeats, t, &hot) != 0 ||
            time_loop(lplan, steps, cf.loop_repeats, t, &loop) != 0) {
            rc = 1;
            goto next;
        }
        if (gpu && (fi_plan_create_owned(&caps, NULL, &dplan) != FI_OK ||
                    time_hot(dplan, &b.batch, cf.repeats, t, &dhot) != 0)) {
            fprintf(stderr, "bench_plan: device plan failed for batch %d\n", n);
            rc = 1;
            goto next;
        }
        double mean_kv = 0;
        for (int i = 0; i < n; i++) mean_kv += b.kv_lens[i];
        fi_plan_view v;
        fi_plan_get_view(plan, &v);
        printf("| %d | %.0f | %d | %d | %d | %.3f | %.2f | %.2f | %.2f | %.2f | %.2f | ", n,
               mean_kv / n, used, v.header->num_items, v.header->num_groups,
               fi_plan_balance(plan), hot.med, hot.p10, hot.p90, loop.med, loop.p90);
        if (dhot.med >= 0) printf("%.2f |\n", dhot.med);
        else printf("(no GPU) |\n");
        if (cf.gpu_loop && gpu && cf.mla)
            for (int sync = 0; sync < 2 && rc == 0; sync++)
                if (gpu_loop(&cf, &lcaps, steps, cf.loop_repeats, t, sync) != 0) rc = 1;
    next:
        fi_plan_destroy(plan);
        fi_plan_destroy(lplan);
        fi_plan_destroy(dplan);
        fibatch_free(&b);
        for (int i = 0; i < LOOP_STEPS; i++) fibatch_free(&steps[i]);
    }
    if (cf.gpu_loop && !gpu) printf("\n--gpu-loop: no CUDA device here; host columns only\n");
    free(t);
    free(g_evict);
    fitrace_free(trace);
    return rc;
}
