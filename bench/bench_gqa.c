/*
 * bench/bench_gqa.c - GQA paged decode (fi_run, FI_KIND_GQA_DECODE: the surface of
 * xqa_batch_decode_with_kv_cache) on the cases of issue 13, checked before timed.  KV cache
 * as one NHD tensor [pages, 2, page_size, H_kv, D] (xqa's default), shuffled page ids, q_len 1:
 *
 *   gqa_32x8_d128_b128_kv4096_p64_bf16   Llama-3-8B heads, batch 128 x kv_len 4096, page 64
 *   gqa_32x8_d128_b128_kv4096_p16_bf16   the same at page 16
 *   gqa_32x8_d128_b128_kv4096_p64_fp8    fp8 e4m3 KV (bf16 q and out)
 *   gqa_32x8_d128_b128_kv4096_p64_nvfp4  NVFP4 KV (skipped, one line, while unsupported)
 *   gqa_32x8_d128_trace128               decode snapshot of 128 requests of the bundled
 *                                        Azure trace (step --trace-step, default 100)
 *   gqa_32x8_d128_b1_kv32768             batch 1 x 32768 (split-k decides everything)
 *   gqa_64x8_d128_b64_kv8192             Llama-3-70B heads, batch 64 x 8192
 *
 * Correctness first: one fi_run on NaN-poisoned outputs; every output element must be
 * finite, and a few requests (first, last, longest) are compared with fi_naive_attention
 * (fp64, on the request's pages dequantised as the kernel must) within 1e-2 per row.
 * A failing case is reported and not timed (exit status 1); a case the GPU family refuses
 * (FI_ERR_UNSUPPORTED_*) says so in one line (exit status 1, except NVFP4: a skip).
 *
 * Timing (as bench_mla): fi_run captured once per input set in a CUDA graph; up to 4 input
 * sets (q, KV, out at distinct addresses) rotated so replays do not reuse L2; each replay
 * timed alone between two cudaEvents, median of --reps (>= 50):
 *   b2b    replays back to back;
 *   flush  a cudaMemsetAsync over 4x the L2 size before each replay, outside the timing;
 *   chain  --chain N (default 8, 0: off) PDL-launched runs in ONE graph, on rotating input
 *          sets: replay time / N.
 * GB/s = (KV bytes of the tokens the batch reads, each once: kv_len x H_kv x D x 2 (K and
 * V) x bytes per element (NVFP4: D / 2 value bytes + D / 16 scale bytes a row) + q + out)
 * / time; read_frac = that over the streaming-read ceiling of bench/ceilings measured in
 * the same run (--read-tbps or env FI_CEIL_READ_TBPS; bench/run_gpu_bench.sh wires it).
 *
 * Usage: bench_gqa [--reps N] [--sets N] [--chain N] [--case SUBSTR] [--read-tbps X]
 *                  [--ctas N] [--trace-step S] [--layout nhd|hnd]
 * Output: a table on stdout, and machine-readable lines on stderr
 *   "result <case> <mode> us <x> GBps <x> read_frac <x>".
 * No GPU: prints "skip" and exits 0.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "gpu/gqa_gpu_case.h"
#include "viz/trace.h"

#define MAX_SETS 4
#define MSG 768

typedef struct bench_case {
    const char *name;
    int32_t batch, heads_q, heads_kv, head_dim, kv_len; /* kv_len -1: trace snapshot */
    int32_t page_size;
    fi_dtype kv_dtype;                                  /* 0: bf16 */
} bench_case;

static const bench_case CASES[] = {
    {"gqa_32x8_d128_b128_kv4096_p64_bf16", 128, 32, 8, 128, 4096, 64, 0},
    {"gqa_32x8_d128_b128_kv4096_p16_bf16", 128, 32, 8, 128, 4096, 16, 0},
    {"gqa_32x8_d128_b128_kv4096_p64_fp8", 128, 32, 8, 128, 4096, 64, FI_DTYPE_E4M3},
    {"gqa_32x8_d128_b128_kv4096_p64_nvfp4", 128, 32, 8, 128, 4096, 64, FI_DTYPE_E2M1},
    {"gqa_32x8_d128_trace128", 128, 32, 8, 128, -1, 64, 0},
    {"gqa_32x8_d128_b1_kv32768", 1, 32, 8, 128, 32768, 64, 0},
    {"gqa_64x8_d128_b64_kv8192", 64, 64, 8, 128, 8192, 64, 0},
};

typedef struct cfg {
    int reps, sets, ctas, chain;
    const char *only;
    double read_tbps;
} cfg;

static int32_t g_trace_step = 100;
static int g_layout = GQA_NHD; /* --layout nhd | hnd: the KV cache's axis order */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define CK(call) GC_CUDA(call, msg, cap)

/* fi_run once on poisoned outputs; every element finite; requests first, last and longest
 * against the fp64 reference. */
static int check_case(gqa_case *c, char *msg, size_t cap) {
    if (gqa_case_run(c, msg, cap) || gqa_case_download(c, msg, cap)) return -1;
    const int64_t n = (int64_t)c->tokens * c->o.heads_q * c->o.head_dim;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(gqa_out_value(c, i))) {
            gc_msg(msg, cap, "out element %lld not finite (poison left or NaN)", (long long)i);
            return -1;
        }
    int32_t longest = 0;
    for (int32_t b = 1; b < c->B; b++)
        if (c->fb.kv_lens[b] > c->fb.kv_lens[longest]) longest = b;
    int32_t pick[3] = {0, c->B - 1, longest};
    double worst = 0, wl = 0;
    for (int k = 0; k < 3; k++) {
        if (k > 0 && (pick[k] == pick[0] || (k == 2 && pick[2] == pick[1]))) continue;
        if (gqa_case_reference_range(c, pick[k], pick[k] + 1, msg, cap) ||
            gqa_case_compare(c, pick[k], pick[k] + 1, gqa_case_tol(c), &worst, &wl, msg, cap))
            return -1;
    }
    printf("# check: requests %d %d %d vs fp64: worst row rel err %.2e\n", pick[0], pick[1],
           pick[2], worst);
    return 0;
}

/* Input sets: set 0 is the case's own buffers, the others device copies of them. */
typedef struct sets {
    int n;
    void *q[MAX_SETS], *kv[MAX_SETS], *sf[MAX_SETS], *out[MAX_SETS];
    cudaGraphExec_t exec[MAX_SETS];
    cudaGraph_t graph[MAX_SETS];
} sets;

static void sets_free(sets *s) {
    for (int i = 0; i < s->n; i++) {
        if (s->exec[i]) cudaGraphExecDestroy(s->exec[i]);
        if (s->graph[i]) cudaGraphDestroy(s->graph[i]);
        if (i > 0) {
            cudaFree(s->q[i]);
            cudaFree(s->kv[i]);
            if (s->sf[i]) cudaFree(s->sf[i]);
            cudaFree(s->out[i]);
        }
    }
    memset(s, 0, sizeof *s);
}

/* The case's run arguments on input set i. */
static fi_attn_args set_args(const gqa_case *c, const sets *s, int i) {
    fi_attn_args a = gqa_case_args(c);
    a.q.data = s->q[i];
    a.k.data = (uint8_t *)s->kv[i] + c->kv.k_off * c->kv_es;
    a.v.data = (uint8_t *)s->kv[i] + c->kv.v_off * c->kv_es;
    if (c->sf_w) {
        a.k_sf.data = (uint8_t *)s->sf[i] + c->sf.k_off;
        a.v_sf.data = (uint8_t *)s->sf[i] + c->sf.v_off;
    }
    a.out.data = s->out[i];
    return a;
}

static int sets_build(gqa_case *c, int want, sets *s, char *msg, size_t cap) {
    memset(s, 0, sizeof *s);
    const size_t qb = (size_t)c->n_q * 2;
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    const size_t per = qb + c->kv_bytes + c->sf_bytes + c->out_bytes;
    int n = want < 1 ? 1 : want > MAX_SETS ? MAX_SETS : want;
    while (n > 1 && (size_t)(n - 1) * per > free_b / 2) n--;
    for (int i = 0; i < n; i++) {
        if (i == 0) {
            s->q[0] = c->d_q;
            s->kv[0] = c->d_kv;
            s->sf[0] = c->d_sf;
            s->out[0] = c->d_out;
        } else {
            s->n = i + 1; /* so sets_free releases what exists */
            CK(cudaMalloc(&s->q[i], qb));
            CK(cudaMalloc(&s->kv[i], c->kv_bytes));
            if (c->sf_bytes) CK(cudaMalloc(&s->sf[i], c->sf_bytes));
            CK(cudaMalloc(&s->out[i], c->out_bytes));
            CK(cudaMemcpy(s->q[i], c->d_q, qb, cudaMemcpyDeviceToDevice));
            CK(cudaMemcpy(s->kv[i], c->d_kv, c->kv_bytes, cudaMemcpyDeviceToDevice));
            if (c->sf_bytes) CK(cudaMemcpy(s->sf[i], c->d_sf, c->sf_bytes, cudaMemcpyDeviceToDevice));
        }
        s->n = i + 1;
        fi_attn_args a = set_args(c, s, i);
        CK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeGlobal));
        fi_status st = fi_run(c->plan, &a, c->stream);
        CK(cudaStreamEndCapture(c->stream, &s->graph[i]));
        if (st != FI_OK) {
            gc_msg(msg, cap, "fi_run under capture: %s", fi_status_name(st));
            return -1;
        }
        CK(cudaGraphInstantiate(&s->exec[i], s->graph[i], 0));
    }
    return 0;
}

static int chain_build(gqa_case *c, const sets *s, int n_runs, cudaGraph_t *graph,
                       cudaGraphExec_t *exec, char *msg, size_t cap) {
    fi_status st = FI_OK;
    CK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeGlobal));
    for (int k = 0; k < n_runs && st == FI_OK; k++) {
        fi_attn_args a = set_args(c, s, k % s->n);
        a.enable_pdl = 1;
        st = fi_run(c->plan, &a, c->stream);
    }
    CK(cudaStreamEndCapture(c->stream, graph));
    if (st != FI_OK) {
        gc_msg(msg, cap, "fi_run under capture (chain): %s", fi_status_name(st));
        return -1;
    }
    CK(cudaGraphInstantiate(exec, *graph, 0));
    return 0;
}

/* Median seconds of reps replays; flush_bytes > 0: memset that many bytes before each. */
static int time_replays(gqa_case *c, const sets *s, int reps, void *flush, size_t flush_bytes,
                        double *median_s, char *msg, size_t cap) {
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
    for (int w = 0; w < 10; w++)
        if (cudaGraphLaunch(s->exec[w % s->n], c->stream) != cudaSuccess) goto out;
    for (int i = 0; i < reps; i++) {
        if (flush_bytes && cudaMemsetAsync(flush, i & 0xff, flush_bytes, c->stream) != cudaSuccess)
            goto out;
        if (cudaEventRecord(ev[2 * i], c->stream) != cudaSuccess ||
            cudaGraphLaunch(s->exec[i % s->n], c->stream) != cudaSuccess ||
            cudaEventRecord(ev[2 * i + 1], c->stream) != cudaSuccess)
            goto out;
    }
    if (cudaStreamSynchronize(c->stream) != cudaSuccess) goto out;
    for (int i = 0; i < reps; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]) != cudaSuccess) goto out;
        t[i] = ms * 1e-3;
    }
    qsort(t, (size_t)reps, sizeof(double), cmp_double);
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

/* kv lengths of a case: uniform, or the trace decode snapshot (step g_trace_step, row 0). */
static int case_lengths(const bench_case *bc, int32_t *kv, char *msg, size_t cap) {
    if (bc->kv_len >= 0) {
        for (int32_t b = 0; b < bc->batch; b++) kv[b] = bc->kv_len;
        return 0;
    }
    fitrace *tr = NULL;
    if (fitrace_load_default(NULL, &tr) != FITRACE_OK) {
        gc_msg(msg, cap, "fitrace_load_default failed");
        return -1;
    }
    int32_t *q = (int32_t *)malloc(sizeof(int32_t) * (size_t)bc->batch);
    int32_t *src = (int32_t *)malloc(sizeof(int32_t) * (size_t)bc->batch);
    fitrace_lens l = {bc->batch, q, kv, src};
    fitrace_status st = q && src ? fitrace_decode(tr, 0, g_trace_step, 1, &l) : FITRACE_ERR_NOMEM;
    free(q);
    free(src);
    fitrace_free(tr);
    if (st != FITRACE_OK) {
        gc_msg(msg, cap, "fitrace_decode: %s", fitrace_status_name(st));
        return -1;
    }
    return 0;
}

static void print_row(const bench_case *bc, const char *mode, double s, double bytes,
                      const cfg *g) {
    const double gbps = bytes / s / 1e9;
    const double rf = g->read_tbps > 0 ? gbps / (g->read_tbps * 1e3) : NAN;
    printf("| %-36s | %-5s | %9.1f | %8.1f | %6.1f%% |\n", bc->name, mode, s * 1e6, gbps, rf * 100);
    fprintf(stderr, "result %s %s us %.2f GBps %.1f read_frac %.4f\n", bc->name, mode, s * 1e6,
            gbps, rf);
}

/* 0: timed; 1: failed; 2: skipped (NVFP4 not supported yet). */
static int run_case(const bench_case *bc, const cfg *g, void *flush, size_t flush_bytes,
                    tt_rng *rng, int *header_done) {
    char msg[MSG];
    const size_t cap = sizeof msg;
    const int nvfp4 = bc->kv_dtype == FI_DTYPE_E2M1;
    int32_t *kv = (int32_t *)malloc(sizeof(int32_t) * (size_t)bc->batch);
    if (!kv || case_lengths(bc, kv, msg, cap)) {
        fprintf(stderr, "%s: %s\n", bc->name, kv ? msg : "allocation failed");
        free(kv);
        return 1;
    }
    gqa_opts o;
    memset(&o, 0, sizeof o);
    o.dtype = FI_DTYPE_BF16;
    o.kv_dtype = bc->kv_dtype;
    o.heads_q = bc->heads_q;
    o.heads_kv = bc->heads_kv;
    o.head_dim = bc->head_dim;
    o.page_size = bc->page_size;
    o.layout = g_layout;
    o.kv_form = GQA_KV_SINGLE;
    o.q_len = 1;
    o.num_ctas = g->ctas;
    o.return_lse = 0;
    if (nvfp4) { /* ask the caps first: no point filling gigabytes for a refusal */
        fi_caps caps = gqa_caps(&o, bc->batch, bc->batch, 1);
        const fi_status st = fi_caps_validate(&caps);
        if (st != FI_OK) {
            printf("skip %s: NVFP4 KV not supported yet (fi_caps_validate: %s)\n", bc->name,
                   fi_status_name(st));
            free(kv);
            return 2;
        }
    }
    gqa_case c;
    if (gqa_case_init(&c, &o, kv, bc->batch, rng, msg, cap)) {
        const int unsup = strstr(msg, "FI_ERR_UNSUPPORTED_") != NULL;
        printf("%s %s: init: %s\n", unsup && nvfp4 ? "skip" : "# FAILED", bc->name, msg);
        free(kv);
        return unsup && nvfp4 ? 2 : 1;
    }
    double kv_tokens = 0;
    for (int32_t b = 0; b < bc->batch; b++) kv_tokens += kv[b];
    const double row_bytes = (double)c.row_bytes + (double)c.sf_w; /* values (+ scales) */
    const double bytes = kv_tokens * bc->heads_kv * 2.0 * row_bytes + (double)c.n_q * 2 +
                         (double)c.out_bytes;
    fi_plan_view v;
    fi_plan_get_view(c.plan, &v);
    double kv_read = 0;
    for (int32_t i = 0; i < v.header->num_items; i++)
        kv_read += v.items[i].kv_end - v.items[i].kv_begin;
    printf("# %s: B=%d H=%d/%d D=%d page_size=%d kv %s, kv mean %.0f max %d; plan: ctas %d "
           "items %d groups %d kv_chunk %d balance %.3f kv reads/unique %.2f\n", bc->name,
           bc->batch, bc->heads_q, bc->heads_kv, bc->head_dim, bc->page_size,
           gqa_dtype_name(c.o.kv_dtype), kv_tokens / bc->batch, c.fb.max_kv_len, v.num_ctas,
           v.header->num_items, v.header->num_groups, v.header->kv_chunk,
           fi_plan_balance(c.plan), kv_tokens > 0 ? kv_read / kv_tokens : 0.0);
    int rc = check_case(&c, msg, cap);
    if (rc) {
        const int unsup = strstr(msg, "FI_ERR_UNSUPPORTED_") != NULL;
        if (unsup && nvfp4) {
            printf("skip %s: NVFP4 KV not run by the GPU family yet (%s)\n", bc->name, msg);
            gqa_case_free(&c);
            free(kv);
            return 2;
        }
        printf("# %s: %s, not timed: %s\n", bc->name,
               unsup ? "NOT SUPPORTED BY THE GPU FAMILY YET" : "CHECK FAILED", msg);
    } else {
        sets s;
        double t_b2b = 0, t_fl = 0, t_chain = 0;
        rc = sets_build(&c, g->sets, &s, msg, cap);
        if (!rc) rc = time_replays(&c, &s, g->reps, NULL, 0, &t_b2b, msg, cap);
        if (!rc) rc = time_replays(&c, &s, g->reps, flush, flush_bytes, &t_fl, msg, cap);
        if (!rc && g->chain > 0) {
            sets chain;
            memset(&chain, 0, sizeof chain);
            chain.n = 1;
            rc = chain_build(&c, &s, g->chain, &chain.graph[0], &chain.exec[0], msg, cap);
            if (!rc) rc = time_replays(&c, &chain, g->reps, NULL, 0, &t_chain, msg, cap);
            t_chain /= g->chain;
            if (chain.exec[0]) cudaGraphExecDestroy(chain.exec[0]);
            if (chain.graph[0]) cudaGraphDestroy(chain.graph[0]);
        }
        const int nsets = s.n;
        sets_free(&s);
        if (rc) {
            printf("# %s: TIMING FAILED: %s\n", bc->name, msg);
        } else {
            printf("# %s: %d input sets rotated, %d replays each mode\n", bc->name, nsets, g->reps);
            if (!*header_done) {
                printf("| case                                 | mode  | median us |     GB/s | %%read  |\n");
                printf("|--------------------------------------|-------|-----------|----------|---------|\n");
                *header_done = 1;
            }
            print_row(bc, "b2b", t_b2b, bytes, g);
            print_row(bc, "flush", t_fl, bytes, g);
            if (g->chain > 0) print_row(bc, "chain", t_chain, bytes, g);
        }
    }
    fflush(stdout);
    gqa_case_free(&c);
    free(kv);
    return rc ? 1 : 0;
}

static double env_double(const char *name) {
    const char *s = getenv(name);
    return s && *s ? atof(s) : 0.0;
}

int main(int argc, char **argv) {
    cfg g = {.reps = 100, .sets = MAX_SETS, .chain = 8, .only = NULL,
             .read_tbps = env_double("FI_CEIL_READ_TBPS")};
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val) {
            fprintf(stderr, "usage: bench_gqa [--reps N] [--sets N] [--chain N] [--case SUBSTR] "
                            "[--read-tbps X] [--ctas N] [--trace-step S] [--layout nhd|hnd]\n");
            return 2;
        }
        if (!strcmp(a, "--reps")) g.reps = atoi(val);
        else if (!strcmp(a, "--sets")) g.sets = atoi(val);
        else if (!strcmp(a, "--chain")) g.chain = atoi(val);
        else if (!strcmp(a, "--ctas")) g.ctas = atoi(val);
        else if (!strcmp(a, "--trace-step")) g_trace_step = atoi(val);
        else if (!strcmp(a, "--case")) g.only = val;
        else if (!strcmp(a, "--layout")) g_layout = val && !strcmp(val, "hnd") ? GQA_HND : GQA_NHD;
        else if (!strcmp(a, "--read-tbps")) g.read_tbps = atof(val);
        else if (!strcmp(a, "--tflops")) (void)0; /* accepted for run_gpu_bench.sh symmetry */
        else {
            fprintf(stderr, "bench_gqa: unknown option %s\n", a);
            return 2;
        }
    }
    if (g.reps < 50) g.reps = 50;
    if (!gc_gpu_available()) {
        printf("skip no CUDA device\n");
        return 0;
    }
    int l2 = 0, dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) != cudaSuccess) {
        fprintf(stderr, "bench_gqa: device query failed\n");
        return 1;
    }
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, dev);
    if (g.ctas <= 0) g.ctas = sms;
    const uint64_t seed = tt_test_seed();
    tt_rng rng = {seed};
    printf("# bench_gqa: %s, %d SMs, L2 %d MiB; planner num_ctas = %d; seed %llu\n", prop.name,
           sms, l2 >> 20, g.ctas, (unsigned long long)seed);
    printf("# ceilings: read %.3f TB/s (%s)\n", g.read_tbps,
           g.read_tbps > 0 ? "measured by bench/ceilings" : "not given: fractions are nan");
    const size_t flush_bytes = (size_t)4 * (size_t)l2;
    void *flush = NULL;
    if (cudaMalloc(&flush, flush_bytes) != cudaSuccess) {
        fprintf(stderr, "bench_gqa: cannot allocate the L2 flush buffer\n");
        return 1;
    }
    int header = 0, failed = 0;
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        if (g.only && !strstr(CASES[i].name, g.only)) continue;
        if (run_case(&CASES[i], &g, flush, flush_bytes, &rng, &header) == 1) failed = 1;
    }
    cudaFree(flush);
    return failed;
}
