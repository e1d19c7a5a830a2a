/*
 * bench/bench_common.h - the timing harness the family benches (bench_gqa.c, bench_mla.c)
 * share, header-only and static inline (each bench is built from its one .c file): the
 * options every bench takes, device setup and the L2 flush buffer, trace snapshot lengths,
 * the spot check of a few requests, input-set rotation under CUDA graphs and the b2b /
 * flush / chain replay timings with their report, and (FI_BENCH_CLOCKS=1) the SM clock and
 * board power sampled while each mode runs.
 *
 * A family describes its case as a bench_inputs: the device buffers that get a copy per
 * input set and a callback that points the case's fi_run arguments at one set.  Everything
 * timed goes through here, so the families are timed by one method and their figures
 * compare.  Functions return 0 / -1 with a message, like the GPU cases.
 */
#ifndef FI_BENCH_BENCH_COMMON_H
#define FI_BENCH_BENCH_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlfcn.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "bench/support/l2_flush.h"
#include "fiattn_run.h"
#include "gpu/gpu_case_common.h"
#include "viz/trace.h"

#define BENCH_MAX_SETS 4 /* input sets rotated (fewer when device memory is short) */
#define BENCH_MAX_BUFS 4 /* device buffers copied per set */

/* Fold a failed CUDA call into a message and return -1 from the calling function (the
 * caller has msg and cap in scope). */
#define BENCH_CK(call) GC_CUDA(call, msg, cap)

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static inline double bench_env_double(const char *name) {
    const char *s = getenv(name);
    return s && *s ? atof(s) : 0.0;
}

/* ---- options ------------------------------------------------------------------------- */

/* The options every bench takes (the family's own ones beside it in its cfg). */
typedef struct bench_cfg {
    int reps, sets;
    int ctas;           /* caps.num_ctas of every case: the SM count unless --ctas */
    int chain;          /* runs per graph of the chain mode, 0: off */
    const char *only;   /* --case SUBSTR */
    double read_tbps;   /* streaming-read ceiling (bench/ceilings), 0: unknown */
    int32_t trace_step; /* decode step of the trace snapshot cases (the issues use 100) */
    int warm_ms;        /* --warm-ms: each mode first replays for this long (0: 10 replays) */
} bench_cfg;

static inline bench_cfg bench_cfg_default(void) {
    bench_cfg g = {.reps = 100, .sets = BENCH_MAX_SETS, .chain = 8, .only = NULL,
                   .read_tbps = bench_env_double("FI_CEIL_READ_TBPS"), .trace_step = 100};
    return g;
}

/* Option a with value val when it is one of the common ones: 1 (taken), else 0. */
static inline int bench_cfg_option(bench_cfg *g, const char *a, const char *val) {
    if (!strcmp(a, "--reps")) g->reps = atoi(val);
    else if (!strcmp(a, "--sets")) g->sets = atoi(val);
    else if (!strcmp(a, "--chain")) g->chain = atoi(val);
    else if (!strcmp(a, "--ctas")) g->ctas = atoi(val);
    else if (!strcmp(a, "--trace-step")) g->trace_step = atoi(val);
    else if (!strcmp(a, "--case")) g->only = val;
    else if (!strcmp(a, "--read-tbps")) g->read_tbps = atof(val);
    else if (!strcmp(a, "--warm-ms")) g->warm_ms = atoi(val);
    else return 0;
    return 1;
}

/* ---- device -------------------------------------------------------------------------- */

typedef struct bench_device {
    int dev, sms, l2; /* l2: bytes */
    struct cudaDeviceProp prop;
} bench_device;

/* Query the current device; on failure say so on stderr (as prog) and return 1. */
static inline int bench_device_query(const char *prog, bench_device *d) {
    memset(d, 0, sizeof *d);
    if (cudaGetDevice(&d->dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&d->sms, cudaDevAttrMultiProcessorCount, d->dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&d->l2, cudaDevAttrL2CacheSize, d->dev) != cudaSuccess) {
        fprintf(stderr, "%s: device query failed\n", prog);
        return 1;
    }
    cudaGetDeviceProperties(&d->prop, d->dev);
    return 0;
}

/* Everything a bench does before its cases: the reps floor (50), the skip without a
 * device ("skip no CUDA device", exit status 0), the device query, caps.num_ctas defaulting
 * to the SM count, the seed, and the bench's first line.  0: go on; else exit with *rc. */
static inline int bench_begin(const char *prog, bench_cfg *g, bench_device *d, tt_rng *rng,
                              int *rc) {
    if (g->reps < 50) g->reps = 50;
    *rc = 0;
    if (!gc_gpu_available()) {
        printf("skip no CUDA device\n");
        return -1;
    }
    if (bench_device_query(prog, d)) {
        *rc = 1;
        return -1;
    }
    if (g->ctas <= 0) g->ctas = d->sms;
    const uint64_t seed = tt_test_seed();
    rng->s = seed;
    printf("# %s: %s, %d SMs, L2 %d MiB; planner num_ctas = %d; seed %llu\n", prog,
           d->prop.name, d->sms, d->l2 >> 20, g->ctas, (unsigned long long)seed);
    return 0;
}

/* The flush mode's buffer: 4x the L2, so one read of it (bench_l2_flush) leaves none of the
 * inputs in L2.  NULL (and a line on stderr) when it cannot be allocated. */
static inline void *bench_flush_alloc(const char *prog, const bench_device *d, size_t *bytes) {
    *bytes = (size_t)4 * (size_t)d->l2;
    void *flush = NULL;
    if (cudaMalloc(&flush, *bytes) != cudaSuccess || cudaMemset(flush, 0, *bytes) != cudaSuccess) {
        fprintf(stderr, "%s: cannot allocate the L2 flush buffer\n", prog);
        cudaFree(flush);
        return NULL;
    }
    return flush;
}

/* ---- case lengths and plan figures ------------------------------------------------------ */

/* q_len / kv_len of the bundled trace's decode snapshot of batch requests (rows from 0) at
 * decode step `step`, each request with q_len rows; q may be NULL (lengths not wanted). */
static inline int bench_trace_lengths(int32_t batch, int32_t step, int32_t q_len, int32_t *q,
                                      int32_t *kv, char *msg, size_t cap) {
    fitrace *tr = NULL;
    if (fitrace_load_default(NULL, &tr) != FITRACE_OK) {
        gc_msg(msg, cap, "fitrace_load_default failed");
        return -1;
    }
    int32_t *own_q = q ? NULL : (int32_t *)malloc(sizeof(int32_t) * (size_t)batch);
    int32_t *src = (int32_t *)malloc(sizeof(int32_t) * (size_t)batch);
    fitrace_lens l = {batch, q ? q : own_q, kv, src};
    fitrace_status st = (q || own_q) && src ? fitrace_decode(tr, 0, step, q_len, &l)
                                            : FITRACE_ERR_NOMEM;
    free(own_q);
    free(src);
    fitrace_free(tr);
    if (st != FITRACE_OK) {
        gc_msg(msg, cap, "fitrace_decode: %s", fitrace_status_name(st));
        return -1;
    }
    return 0;
}

/* KV tokens the plan's items read (a request's KV once per head tile); over the batch's
 * unique KV tokens this is the plan line's "kv reads/unique". */
static inline double bench_plan_kv_reads(const fi_plan_view *v) {
    double kv_read = 0;
    for (int32_t i = 0; i < v->header->num_items; i++)
        kv_read += v->items[i].kv_end - v->items[i].kv_begin;
    return kv_read;
}

/* ---- the check before timing ------------------------------------------------------------ */

/* 0 when the n output values value(ctx, i) are all finite (no poison left, no NaN). */
static inline int bench_all_finite(int64_t n, double (*value)(const void *ctx, int64_t i),
                                   const void *ctx, char *msg, size_t cap) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(value(ctx, i))) {
            gc_msg(msg, cap, "out element %lld not finite (poison left or NaN)", (long long)i);
            return -1;
        }
    return 0;
}

/* Check requests first, last and longest (each once) with check(ctx, b, &worst, ...):
 * the full fp64 reference of a benchmark batch would take minutes on the CPU.  Prints the
 * worst row error on success. */
static inline int bench_check_requests(int32_t B, const int32_t *kv_lens,
                                       int (*check)(void *ctx, int32_t b, double *worst,
                                                    char *msg, size_t cap),
                                       void *ctx, char *msg, size_t cap) {
    int32_t longest = 0;
    for (int32_t b = 1; b < B; b++)
        if (kv_lens[b] > kv_lens[longest]) longest = b;
    int32_t pick[3] = {0, B - 1, longest};
    double worst = 0;
    for (int k = 0; k < 3; k++) {
        if (k > 0 && (pick[k] == pick[0] || (k == 2 && pick[2] == pick[1]))) continue;
        if (check(ctx, pick[k], &worst, msg, cap)) return -1;
    }
    printf("# check: requests %d %d %d vs fp64: worst row rel err %.2e\n", pick[0], pick[1],
           pick[2], worst);
    return 0;
}

/* ---- input sets and their graphs -------------------------------------------------------- */

/* What a family hands the harness: the case's plan and stream, the device buffers that
 * get a copy per input set (inputs copied, outputs only allocated; bytes 0: absent), and
 * fi_run's arguments on one set's buffers (buf[j] in place of base[j]); or, when one replay
 * is more than one fi_run (bench_context's two-launch mixed batch), the launches
 * themselves. */
typedef struct bench_inputs {
    fi_plan *plan;
    cudaStream_t stream;
    int nbufs;
    void *base[BENCH_MAX_BUFS];   /* set 0: the case's own buffers */
    size_t bytes[BENCH_MAX_BUFS];
    int copy[BENCH_MAX_BUFS];     /* 1: an input, copied into every set */
    fi_attn_args (*args)(const void *ctx, void *const *buf);
    const void *ctx;
    /* optional (NULL: fi_run of plan with args): one replay's launches on one set's
     * buffers, on stream; chained: every launch with PDL (the chain mode) */
    fi_status (*launch)(const void *ctx, void *const *buf, int chained, cudaStream_t stream);
} bench_inputs;

/* One replay's work on one set's buffers: the family's launches, else fi_run of the plan
 * with its arguments (chained: enable_pdl 1, else as the arguments say). */
static inline fi_status bench_inputs_run(const bench_inputs *in, void *const *buf, int chained) {
    if (in->launch) return in->launch(in->ctx, buf, chained, in->stream);
    fi_attn_args a = in->args(in->ctx, buf);
    if (chained) a.enable_pdl = 1;
    return fi_run(in->plan, &a, in->stream);
}

/* The harness's view of a case: its plan, stream and run-argument callback; the buffers
 * follow through bench_inputs_buf. */
static inline bench_inputs bench_inputs_make(fi_plan *plan, cudaStream_t stream,
                                             fi_attn_args (*args)(const void *, void *const *),
                                             const void *ctx) {
    const bench_inputs in = {.plan = plan, .stream = stream, .args = args, .ctx = ctx};
    return in;
}

/* Buffer j of set 0 (the case's own), its size (0: absent) and whether it is an input. */
static inline void bench_inputs_buf(bench_inputs *in, int j, void *base, size_t bytes, int copy) {
    in->base[j] = base;
    in->bytes[j] = bytes;
    in->copy[j] = copy;
    if (j >= in->nbufs) in->nbufs = j + 1;
}

/* Input sets: set 0 is the case's own buffers, the others device copies of them (q, KV,
 * out at distinct addresses, same values), so rotated replays do not reuse L2. */
typedef struct bench_sets {
    int n;
    void *buf[BENCH_MAX_SETS][BENCH_MAX_BUFS];
    cudaGraphExec_t exec[BENCH_MAX_SETS];
    cudaGraph_t graph[BENCH_MAX_SETS];
} bench_sets;

static inline void bench_sets_free(bench_sets *s) {
    for (int i = 0; i < s->n; i++) {
        if (s->exec[i]) cudaGraphExecDestroy(s->exec[i]);
        if (s->graph[i]) cudaGraphDestroy(s->graph[i]);
        for (int j = 0; i > 0 && j < BENCH_MAX_BUFS; j++)
            if (s->buf[i][j]) cudaFree(s->buf[i][j]);
    }
    memset(s, 0, sizeof *s);
}

/* The buffers of set i > 0: allocated in the order of in->base, then the inputs copied. */
static inline int bench_set_alloc(const bench_inputs *in, bench_sets *s, int i, char *msg,
                                  size_t cap) {
    for (int j = 0; j < in->nbufs; j++)
        if (in->bytes[j]) BENCH_CK(cudaMalloc(&s->buf[i][j], in->bytes[j]));
    for (int j = 0; j < in->nbufs; j++)
        if (in->bytes[j] && in->copy[j])
            BENCH_CK(cudaMemcpy(s->buf[i][j], in->base[j], in->bytes[j],
                                cudaMemcpyDeviceToDevice));
    return 0;
}

/* Up to want sets (as many as fit in half the free device memory), each with fi_run
 * captured once in its own graph. */
static inline int bench_sets_build(const bench_inputs *in, int want, bench_sets *s, char *msg,
                                   size_t cap) {
    memset(s, 0, sizeof *s);
    size_t free_b = 0, total_b = 0, per = 0;
    BENCH_CK(cudaMemGetInfo(&free_b, &total_b));
    for (int j = 0; j < in->nbufs; j++) per += in->bytes[j];
    int n = want < 1 ? 1 : want > BENCH_MAX_SETS ? BENCH_MAX_SETS : want;
    while (n > 1 && (size_t)(n - 1) * per > free_b / 2) n--;
    for (int i = 0; i < n; i++) {
        s->n = i + 1; /* so bench_sets_free releases what exists */
        if (i == 0) {
            for (int j = 0; j < in->nbufs; j++) s->buf[0][j] = in->base[j];
        } else if (bench_set_alloc(in, s, i, msg, cap)) {
            return -1;
        }
        BENCH_CK(cudaStreamBeginCapture(in->stream, cudaStreamCaptureModeGlobal));
        fi_status st = bench_inputs_run(in, s->buf[i], 0);
        BENCH_CK(cudaStreamEndCapture(in->stream, &s->graph[i]));
        if (st != FI_OK) {
            gc_msg(msg, cap, "fi_run under capture: %s", fi_status_name(st));
            return -1;
        }
        BENCH_CK(cudaGraphInstantiate(&s->exec[i], s->graph[i], 0));
    }
    return 0;
}

/* The chain mode's graph: n_runs fi_run launches with PDL, run k on input set k % s->n,
 * as a decode step chains its layers' kernels (the sets' buffers must outlive *graph /
 * *exec). */
static inline int bench_chain_build(const bench_inputs *in, const bench_sets *s, int n_runs,
                                    cudaGraph_t *graph, cudaGraphExec_t *exec, char *msg,
                                    size_t cap) {
    fi_status st = FI_OK;
    BENCH_CK(cudaStreamBeginCapture(in->stream, cudaStreamCaptureModeGlobal));
    for (int k = 0; k < n_runs && st == FI_OK; k++) st = bench_inputs_run(in, s->buf[k % s->n], 1);
    BENCH_CK(cudaStreamEndCapture(in->stream, graph));
    if (st != FI_OK) {
        gc_msg(msg, cap, "fi_run under capture (chain): %s", fi_status_name(st));
        return -1;
    }
    BENCH_CK(cudaGraphInstantiate(exec, *graph, 0));
    return 0;
}

/* ---- SM clock and board power while a mode runs (FI_BENCH_CLOCKS=1) ------------------- */

/* Why: the heads-128 MLA kernels are power-limited on an H200 (issue 12: ~690 W, SM clock
 * ~1.7 GHz), and the three modes differ by up to 10% there.  NVML, the driver's management
 * library, is opened with dlopen, so no bench links it and each runs where it is missing
 * (the lines are then absent).  The entry points used are NVML's stable ones. */
typedef struct bench_clocks {
    double mhz, watts; /* medians of the samples (SM clock; board power, instantaneous where
                          the driver has it, else its 1-second average: `instant`) */
    int n;             /* samples; 0: not sampled */
    int instant;       /* 1: NVML_FI_DEV_POWER_INSTANT; 0: nvmlDeviceGetPowerUsage, which
                          averages over 1 s from Ampere on (a mode shorter than that reads
                          mostly the idle before it) */
} bench_clocks;

/* nvml.h's nvmlFieldValue_t (its ABI: 40 bytes), for nvmlDeviceGetFieldValues. */
typedef struct bench_nvml_field {
    unsigned field_id, scope_id;
    long long timestamp, latency_usec;
    int value_type, nvml_return;
    union {
        double d;
        unsigned u;
        unsigned long long ull;
    } value;
} bench_nvml_field;
enum { BENCH_NVML_FI_POWER_INSTANT = 186 }; /* NVML_FI_DEV_POWER_INSTANT: mW, unsigned */

typedef struct bench_nvml {
    void *dev;
    int (*clock)(void *dev, int type, unsigned *mhz); /* nvmlDeviceGetClockInfo */
    int (*power)(void *dev, unsigned *mw);            /* nvmlDeviceGetPowerUsage */
    int (*fields)(void *dev, int n, bench_nvml_field *v); /* nvmlDeviceGetFieldValues */
} bench_nvml;

/* The board power now, in W, instantaneous when the driver answers the field (*instant 1),
 * else the 1-second average; < 0: no reading. */
static inline double bench_nvml_watts(const bench_nvml *n, int *instant) {
    if (n->fields) {
        bench_nvml_field f;
        memset(&f, 0, sizeof f);
        f.field_id = BENCH_NVML_FI_POWER_INSTANT;
        if (n->fields(n->dev, 1, &f) == 0 && f.nvml_return == 0) {
            *instant = 1;
            return f.value.u / 1000.0;
        }
    }
    unsigned mw = 0;
    *instant = 0;
    return n->power(n->dev, &mw) == 0 ? mw / 1000.0 : -1.0;
}

/* NVML for the current CUDA device, opened once; NULL unless FI_BENCH_CLOCKS=1 and NVML
 * answers. */
static inline const bench_nvml *bench_nvml_get(void) {
    static bench_nvml n;
    static int state; /* 0 untried, 1 ready, -1 off */
    if (state)
        return state > 0 ? &n : NULL;
    state = -1;
    const char *on = getenv("FI_BENCH_CLOCKS");
    if (!on || strcmp(on, "1") != 0)
        return NULL;
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return NULL;
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*by_bus)(const char *, void **) =
        (int (*)(const char *, void **))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    n.clock = (int (*)(void *, int, unsigned *))dlsym(lib, "nvmlDeviceGetClockInfo");
    n.power = (int (*)(void *, unsigned *))dlsym(lib, "nvmlDeviceGetPowerUsage");
    n.fields = (int (*)(void *, int, bench_nvml_field *))dlsym(lib, "nvmlDeviceGetFieldValues");
    char bus[32];
    int d = 0;
    if (!init || !by_bus || !n.clock || !n.power || init() != 0 ||
        cudaGetDevice(&d) != cudaSuccess ||
        cudaDeviceGetPCIBusId(bus, (int)sizeof bus, d) != cudaSuccess || by_bus(bus, &n.dev) != 0)
        return NULL;
    state = 1;
    return &n;
}

/* Until `stream` has no work left: every ~0.2 ms one sample of the SM clock (NVML_CLOCK_SM
 * = 1) and the power, their medians into *ck (ck->n 0 when NVML is off).  Called after a
 * mode's replays are enqueued, so every sample falls while they run. */
static inline void bench_sample_until_idle(cudaStream_t stream, bench_clocks *ck) {
    enum { kMax = 8192 };
    static double mhz[kMax], w[kMax];
    const bench_nvml *n = bench_nvml_get();
    int k = 0;
    ck->n = 0;
    if (!n)
        return;
    const struct timespec pause = {0, 200000};
    int instant = 0;
    while (cudaStreamQuery(stream) == cudaErrorNotReady) {
        unsigned c = 0;
        double p = -1.0;
        if (k < kMax && n->clock(n->dev, 1, &c) == 0 && (p = bench_nvml_watts(n, &instant)) >= 0) {
            mhz[k] = c;
            w[k] = p;
            k++;
        }
        nanosleep(&pause, NULL);
    }
    if (k == 0)
        return;
    qsort(mhz, (size_t)k, sizeof(double), bench_cmp_double);
    qsort(w, (size_t)k, sizeof(double), bench_cmp_double);
    *ck = (bench_clocks){mhz[k / 2], w[k / 2], k, instant};
}

/* ---- timing ------------------------------------------------------------------------------ */

/* Replays of s's graphs for warm_ms of wall time (each after a flush when flush_bytes > 0),
 * or 10 when warm_ms is 0: clocks, instruction cache, TLBs.  Why warm_ms: the
 * heads-128 MLA bodies run at the maximum SM clock for the first ~0.1 s of work and
 * power-capped after it (BENCHMARKS.md), so a mode timed after a few hundred ms of the same
 * work measures the sustained speed.  0 / -1 (CUDA error). */
static inline int bench_warm(cudaStream_t stream, const bench_sets *s, void *flush,
                             size_t flush_bytes, int warm_ms) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int w = 0;; w++) {
        if (warm_ms > 0 && flush_bytes &&
            bench_l2_flush(flush, flush_bytes, stream) != cudaSuccess)
            return -1;
        if (cudaGraphLaunch(s->exec[w % s->n], stream) != cudaSuccess) return -1;
        if (warm_ms <= 0) {
            if (w + 1 >= 10) return 0;
            continue;
        }
        if (w % 16 != 15) continue; /* keep the queue full between clock reads */
        if (cudaStreamSynchronize(stream) != cudaSuccess) return -1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if ((t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6 >= warm_ms) return 0;
    }
}

/* Median seconds of reps replays of s's graphs in turn, each timed alone between two
 * cudaEvents, after bench_warm for warm_ms; flush_bytes > 0: read that many bytes of flush
 * before each (bench_l2_flush), outside the timing. */
static inline int bench_time_replays_ck(cudaStream_t stream, const bench_sets *s, int reps,
                                        void *flush, size_t flush_bytes, int warm_ms,
                                        double *median_s, bench_clocks *ck, char *msg,
                                        size_t cap) {
    cudaEvent_t *ev = (cudaEvent_t *)calloc((size_t)reps * 2, sizeof(cudaEvent_t));
    double *t = (double *)malloc(sizeof(double) * (size_t)reps);
    if (!ev || !t) {
        free(ev);
        free(t);
        gc_msg(msg, cap, "host allocation failed");
        return -1;
    }
    int rc = -1;
    for (int i = 0; i < 2 * reps; i++)
        if (cudaEventCreate(&ev[i]) != cudaSuccess) goto out;
    if (bench_warm(stream, s, flush, flush_bytes, warm_ms) != 0) goto out;
    for (int i = 0; i < reps; i++) {
        if (flush_bytes && bench_l2_flush(flush, flush_bytes, stream) != cudaSuccess)
            goto out;
        if (cudaEventRecord(ev[2 * i], stream) != cudaSuccess ||
            cudaGraphLaunch(s->exec[i % s->n], stream) != cudaSuccess ||
            cudaEventRecord(ev[2 * i + 1], stream) != cudaSuccess)
            goto out;
    }
    if (ck) bench_sample_until_idle(stream, ck);
    if (cudaStreamSynchronize(stream) != cudaSuccess) goto out;
    for (int i = 0; i < reps; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]) != cudaSuccess) goto out;
        t[i] = ms * 1e-3;
    }
    qsort(t, (size_t)reps, sizeof(double), bench_cmp_double);
    *median_s = t[reps / 2];
    rc = 0;
out:
    if (rc) gc_msg(msg, cap, "timing: %s", cudaGetErrorString(cudaGetLastError()));
    for (int i = 0; i < 2 * reps; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
    free(ev);
    free(t);
    return rc;
}

/* The same without clock samples. */
static inline int bench_time_replays(cudaStream_t stream, const bench_sets *s, int reps,
                                     void *flush, size_t flush_bytes, double *median_s,
                                     char *msg, size_t cap) {
    return bench_time_replays_ck(stream, s, reps, flush, flush_bytes, 0, median_s, NULL, msg, cap);
}

/* Chain mode: one graph of g->chain PDL runs over the sets; replay time / g->chain. */
static inline int bench_time_chain(const bench_inputs *in, const bench_sets *s,
                                   const bench_cfg *g, double *per_run_s, bench_clocks *ck,
                                   char *msg, size_t cap) {
    bench_sets chain;
    memset(&chain, 0, sizeof chain);
    chain.n = 1; /* bench_time_replays replays exec[0]; the buffers stay in s */
    int rc = bench_chain_build(in, s, g->chain, &chain.graph[0], &chain.exec[0], msg, cap);
    if (!rc)
        rc = bench_time_replays_ck(in->stream, &chain, g->reps, NULL, 0, g->warm_ms, per_run_s, ck,
                                   msg, cap);
    *per_run_s /= g->chain;
    if (chain.exec[0]) cudaGraphExecDestroy(chain.exec[0]);
    if (chain.graph[0]) cudaGraphDestroy(chain.graph[0]);
    return rc;
}

/* Optional family steps between the timings (NULL: none): before_timing after the sets
 * are built (bench_mla's L2 probe rewrites the page table there), after_b2b between the
 * b2b and the flush timings (the profiling builds of bench_mla and bench_gqa read their
 * stamps there). */
typedef struct bench_hooks {
    int (*before_timing)(void *ctx, char *msg, size_t cap);
    void (*after_b2b)(void *ctx);
    void *ctx;
} bench_hooks;

typedef struct bench_times {
    double b2b, flush, chain; /* median seconds a run */
    int nsets;                /* input sets rotated */
    bench_clocks ck[3];       /* b2b, flush, chain (FI_BENCH_CLOCKS=1) */
} bench_times;

/* The three modes: b2b (replays back to back), flush (the L2 flushed before each replay),
 * chain (g->chain > 0).  The input sets are built here and released before returning. */
static inline int bench_time_modes(const bench_inputs *in, const bench_cfg *g, void *flush,
                                   size_t flush_bytes, const bench_hooks *h, bench_times *t,
                                   char *msg, size_t cap) {
    bench_sets s;
    memset(t, 0, sizeof *t);
    int rc = bench_sets_build(in, g->sets, &s, msg, cap);
    if (!rc && h && h->before_timing) rc = h->before_timing(h->ctx, msg, cap);
    if (!rc)
        rc = bench_time_replays_ck(in->stream, &s, g->reps, NULL, 0, g->warm_ms, &t->b2b, &t->ck[0],
                                   msg, cap);
    if (!rc && h && h->after_b2b) h->after_b2b(h->ctx);
    if (!rc)
        rc = bench_time_replays_ck(in->stream, &s, g->reps, flush, flush_bytes, g->warm_ms,
                                   &t->flush, &t->ck[1], msg, cap);
    if (!rc && g->chain > 0) rc = bench_time_chain(in, &s, g, &t->chain, &t->ck[2], msg, cap);
    t->nsets = s.n;
    bench_sets_free(&s);
    return rc;
}

/* ---- report ------------------------------------------------------------------------------ */

/* The family's table: its two header lines (printed before the first row of the run) and
 * its row printer (table row on stdout, "result ..." line on stderr). */
typedef struct bench_table {
    const char *head[2];
    void (*row)(const void *ctx, const char *mode, double seconds);
    const void *ctx;
} bench_table;

/* Report a case's timings (rc 0) or why they failed (rc != 0, the message in msg). */
static inline void bench_report(const char *name, int rc, const char *msg, const bench_times *t,
                                const bench_cfg *g, const bench_table *tab, int *header_done) {
    if (rc) {
        printf("# %s: TIMING FAILED: %s\n", name, msg);
        return;
    }
    printf("# %s: %d input sets rotated, %d replays each mode\n", name, t->nsets, g->reps);
    if (!*header_done) {
        printf("%s\n%s\n", tab->head[0], tab->head[1]);
        *header_done = 1;
    }
    tab->row(tab->ctx, "b2b", t->b2b);
    tab->row(tab->ctx, "flush", t->flush);
    if (g->chain > 0) tab->row(tab->ctx, "chain", t->chain);
    static const char *const mode[3] = {"b2b", "flush", "chain"};
    for (int i = 0; i < 3; i++)
        if (t->ck[i].n > 0)
            printf("# %s %s: sm_clock_mhz %.0f power_w %.0f (%s; medians of %d samples)\n",
                   name, mode[i], t->ck[i].mhz, t->ck[i].watts,
                   t->ck[i].instant ? "instantaneous" : "1-s average", t->ck[i].n);
}

#ifdef FI_PROFILE
/* Profiling build only (`make profile`: library and benches built with -DFI_PROFILE into
 * build-prof/): per-CTA %globaltimer stamps of the last launch (head and tail of each
 * CTA, executor/cuda/common/profile.cuh), read by the family's reader, next to what the
 * plan gave each CTA (items, keys, split items), slowest CTAs first. */
typedef void (*bench_stamp_reader)(unsigned long long *host, int which, int n);
/* Median of v[0 .. n) (sorts v in place; NAN for none). */
static inline double bench_med(double *v, int n) {
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof(double), bench_cmp_double);
    return v[n / 2];
}
/* The three stamp arrays of a launch, n CTAs (profile.cuh: [cta][4] each), t0 the
 * earliest start. */
typedef struct bench_stamps {
    unsigned long long st[1024 * 4], s2[1024 * 4], s3[1024 * 4];
    int n;
    unsigned long long t0;
} bench_stamps;
static inline double bench_us(unsigned long long a, unsigned long long b) {
    return (double)(a - b) / 1e3;
}
static inline int bench_cta_busy(const fi_plan_view *v, int c) {
    return v->work_indptr[c + 1] > v->work_indptr[c];
}

/* Head and tail of a CTA (globaltimer, us; medians over the CTAs with items): plan read,
 * first Q landed, first KV block landed (from the CTA's start); last loop end and last
 * output written to the CTA's end; start skew and the kernel's stamp span. */
static inline void bench_profile_head_tail(const fi_plan_view *v, const bench_stamps *S) {
    static double h[5][1024], skew[1024];
    const unsigned long long *st = S->st, *s2 = S->s2;
    unsigned long long t_end = 0;
    int m = 0;
    for (int c = 0; c < S->n; c++) {
        if (st[c * 4 + 3] > t_end) t_end = st[c * 4 + 3];
        skew[c] = bench_us(st[c * 4], S->t0);
        if (!bench_cta_busy(v, c)) continue;
        h[0][m] = bench_us(st[c * 4 + 1], st[c * 4]);
        h[1][m] = bench_us(s2[c * 4 + 0], st[c * 4]);
        h[2][m] = bench_us(s2[c * 4 + 1], st[c * 4]);
        h[3][m] = bench_us(st[c * 4 + 3], s2[c * 4 + 2]);
        h[4][m] = bench_us(st[c * 4 + 3], s2[c * 4 + 3]);
        m++;
    }
    /* the latest split arrival (kernel-relative): the cooperative merges start after it */
    unsigned long long t_arr = 0;
    int c_arr = -1;
    for (int c = 0; c < S->n; c++)
        if (bench_cta_busy(v, c) && st[c * 4 + 2] >= st[c * 4] && st[c * 4 + 2] > t_arr) {
            t_arr = st[c * 4 + 2];
            c_arr = c;
        }
    const double span = bench_us(t_end, S->t0);
    const double mplan = bench_med(h[0], m), mq = bench_med(h[1], m), mkv = bench_med(h[2], m),
                 mloop = bench_med(h[3], m), mout = bench_med(h[4], m),
                 mskew = bench_med(skew, S->n); /* sorts skew: skew[n - 1] is the max */
    printf("# profile: head (median us from CTA start): plan read %.2f, Q landed %.2f, first KV "
           "block %.2f; tail (to CTA end): from last loop end %.2f, from last output %.2f; "
           "start skew median %.2f max %.2f; stamp span %.1f\n",
           mplan, mq, mkv, mloop, mout, mskew, skew[S->n - 1], span);
    if (c_arr >= 0) {
        /* the cooperative merges (g_stamp3 [1] group complete, [2] slice written), medians
         * over the CTAs that ran one in this launch */
        static double mw[1024], mx[1024], ms[1024];
        int k = 0;
        for (int c = 0; c < S->n; c++)
            if (bench_cta_busy(v, c) && S->s3[c * 4 + 1] >= st[c * 4] &&
                S->s3[c * 4 + 3] >= S->s3[c * 4 + 1] && S->s3[c * 4 + 2] >= S->s3[c * 4 + 3]) {
                mw[k] = bench_us(S->s3[c * 4 + 1], S->t0);
                mx[k] = bench_us(S->s3[c * 4 + 3], S->s3[c * 4 + 1]);
                ms[k++] = bench_us(S->s3[c * 4 + 2], S->s3[c * 4 + 3]);
            }
        printf("# profile: last split arrival +%.2f us (cta %d), kernel end +%.2f (from the "
               "earliest start)", bench_us(t_arr, S->t0), c_arr, span);
        if (k > 0) /* none: every group merged solo */
            printf("; cooperative merges (%d CTAs): group complete seen +%.2f, weights %.2f, "
                   "sums and stores %.2f (medians)", k, bench_med(mw, k), bench_med(mx, k),
                   bench_med(ms, k));
        printf("\n");
    }
}

/* SMs 2k and 2k + 1 share a TPC: the CTAs with items whose partner SM ran none, against
 * those whose partner also worked (does an SM stream faster alone in its TPC?). */
static inline void bench_profile_tpc(const fi_plan_view *v, const bench_stamps *S,
                                     const double *work) {
    static unsigned char busy[1024];
    static double lone[1024], paired[1024];
    const unsigned long long *s3 = S->s3;
    memset(busy, 0, sizeof busy);
    for (int c = 0; c < S->n; c++)
        if (bench_cta_busy(v, c) && s3[c * 4] < 1024) busy[s3[c * 4]] = 1;
    int nl = 0, np = 0;
    for (int c = 0; c < S->n; c++) {
        if (!bench_cta_busy(v, c) || s3[c * 4] >= 1024) continue;
        if (busy[s3[c * 4] ^ 1u]) paired[np++] = work[c];
        else lone[nl++] = work[c];
    }
    printf("# profile: CTA time median, partner SM busy %.1f us (%d CTAs), partner SM idle %.1f "
           "us (%d)\n", bench_med(paired, np), np, bench_med(lone, nl), nl);
}

/* CTA c's row: its SM, time, start, what the plan gave it, and its last item's loop end
 * and output and last split's arrival (a solo merger's merge lies between its arrival
 * and its end). */
static inline void bench_profile_row(const fi_plan_view *v, const bench_stamps *S,
                                     const double *work, int c) {
    const unsigned long long *st = S->st, *s2 = S->s2;
    int64_t keys = 0;
    int splits = 0;
    for (int32_t i = v->work_indptr[c]; i < v->work_indptr[c + 1]; i++) {
        keys += v->items[i].kv_end - v->items[i].kv_begin;
        splits += v->items[i].out_slot >= 0;
    }
    printf("#   cta %3d (sm %3llu): %6.1f us (starts +%.1f) items %d keys %lld splits %d", c,
           S->s3[c * 4], work[c], bench_us(st[c * 4], S->t0),
           v->work_indptr[c + 1] - v->work_indptr[c], (long long)keys, splits);
    if (bench_cta_busy(v, c))
        printf("; loop end +%.1f, output +%.1f", bench_us(s2[c * 4 + 2], st[c * 4]),
               bench_us(s2[c * 4 + 3], st[c * 4]));
    if (splits > 0 && st[c * 4 + 2] >= st[c * 4])
        printf(", arrival +%.1f", bench_us(st[c * 4 + 2], st[c * 4]));
    printf("\n");
}

static inline void bench_profile_ctas(const fi_plan_view *v, bench_stamp_reader read) {
    static bench_stamps S;
    static double work[1024];
    static int order[1024];
    S.n = v->num_ctas < 1024 ? v->num_ctas : 1024;
    const int n = S.n;
    read(S.st, 0, n);
    read(S.s2, 1, n);
    read(S.s3, 2, n);
    S.t0 = ~0ull;
    for (int c = 0; c < n; c++)
        if (S.st[c * 4] < S.t0) S.t0 = S.st[c * 4];
    for (int c = 0; c < n; c++) {
        work[c] = bench_us(S.st[c * 4 + 3], S.st[c * 4]);
        order[c] = c;
    }
    for (int i = 1; i < n; i++) /* insertion sort, slowest first */
        for (int j = i; j > 0 && work[order[j]] > work[order[j - 1]]; j--) {
            const int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    printf("# profile: CTA time (start -> end, us): max %.1f p90 %.1f median %.1f min %.1f\n",
           work[order[0]], work[order[n / 10]], work[order[n / 2]], work[order[n - 1]]);
    bench_profile_head_tail(v, &S);
    bench_profile_tpc(v, &S, work);
    for (int r = 0; r < n; r++)
        if (r < 12 || r >= n - 4) /* slowest 12 and fastest 4 */
            bench_profile_row(v, &S, work, order[r]);
}
#endif

#endif /* FI_BENCH_BENCH_COMMON_H */
