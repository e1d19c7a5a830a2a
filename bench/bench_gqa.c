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
 * and, only when --case names their head_dim ("d64", "d256", or more of a name; not in
 * the table: for A/Bs of the tile table rows, e.g. --variant 2 against 3):
 *   gqa_32x8_d64_b128_kv4096_p64_{bf16,fp8}, gqa_32x8_d256_b64_kv4096_p64_{bf16,fp8}
 *
 * Correctness first: one fi_run on NaN-poisoned outputs; every output element must be
 * finite, and a few requests (first, last, longest) are compared with fi_naive_attention
 * (fp64, on the request's pages dequantised as the kernel must) within 1e-2 per row.
 * A failing case is reported and not timed (exit status 1); a case the GPU family refuses
 * (FI_ERR_UNSUPPORTED_*) says so in one line (exit status 1, except NVFP4: a skip).
 *
 * Timing (bench/bench_common.h, shared with bench_mla): fi_run captured once per input set
 * in a CUDA graph; up to 4 input sets (q, KV, out at distinct addresses) rotated so replays
 * do not reuse L2; each replay timed alone between two cudaEvents, median of --reps (>= 50):
 *   b2b    replays back to back;
 *   flush  a read of 4x the L2 size before each replay (clean lines), outside the timing;
 *   chain  --chain N (default 8, 0: off) PDL-launched runs in ONE graph, on rotating input
 *          sets: replay time / N.
 * GB/s = (KV bytes of the tokens the batch reads, each once: kv_len x H_kv x D x 2 (K and
 * V) x bytes per element (NVFP4: D / 2 value bytes + D / 16 scale bytes a row) + q + out)
 * / time; read_frac = that over the streaming-read ceiling of bench/ceilings measured in
 * the same run (--read-tbps or env FI_CEIL_READ_TBPS; bench/run_gpu_bench.sh wires it).
 *
 * Usage: bench_gqa [--reps N] [--sets N] [--chain N] [--case SUBSTR] [--read-tbps X]
 *                  [--ctas N] [--trace-step S] [--layout nhd|hnd] [--variant V]
 * --variant V: the plan's tile table row (caps.variant; 0 the default: gqa_decode_rows8
 * when group x q_len <= 8, else gqa_decode; 2 gqa_decode_rows8, 3 gqa_decode_rows64 (the
 * 64-row kernel by number), for an A/B of the two kernels in one build).
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

#include "bench_gqa_case.h"

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

/* Run only when --case names their head_dim (the other head_dims of the family). */
static const bench_case EXTRA_CASES[] = {
    {"gqa_32x8_d64_b128_kv4096_p64_bf16", 128, 32, 8, 64, 4096, 64, 0},
    {"gqa_32x8_d64_b128_kv4096_p64_fp8", 128, 32, 8, 64, 4096, 64, FI_DTYPE_E4M3},
    {"gqa_32x8_d256_b64_kv4096_p64_bf16", 64, 32, 8, 256, 4096, 64, 0},
    {"gqa_32x8_d256_b64_kv4096_p64_fp8", 64, 32, 8, 256, 4096, 64, FI_DTYPE_E4M3},
};

typedef struct cfg {
    bench_cfg b;
    gqa_layout layout; /* --layout nhd | hnd: the KV cache's axis order */
    int32_t variant;   /* --variant V: caps.variant (0 the default row; 2 rows8, 3 rows64) */
} cfg;

static double out_value(const void *c, int64_t i) { return gqa_out_value((const gqa_case *)c, i); }

/* Request b alone against the fp64 reference (computed on its own pages). */
static int check_request(void *ctx, int32_t b, double *worst, char *msg, size_t cap) {
    gqa_case *c = (gqa_case *)ctx;
    double wl = 0;
    return gqa_case_reference_range(c, b, b + 1, msg, cap) ||
                   gqa_case_compare(c, b, b + 1, gqa_case_tol(c), worst, &wl, msg, cap)
               ? -1
               : 0;
}

/* fi_run once on poisoned outputs; every element finite; requests first, last and longest
 * against the fp64 reference. */
static int check_case(gqa_case *c, char *msg, size_t cap) {
    if (gqa_case_run(c, msg, cap) || gqa_case_download(c, msg, cap)) return -1;
    const int64_t n = (int64_t)c->tokens * c->o.heads_q * c->o.head_dim;
    if (bench_all_finite(n, out_value, c, msg, cap)) return -1;
    return bench_check_requests(c->B, c->fb.kv_lens, check_request, c, msg, cap);
}

/* kv lengths of a case: uniform, or the trace decode snapshot (step --trace-step, row 0). */
static int case_lengths(const bench_case *bc, const cfg *g, int32_t *kv, char *msg, size_t cap) {
    if (bc->kv_len >= 0) {
        for (int32_t b = 0; b < bc->batch; b++) kv[b] = bc->kv_len;
        return 0;
    }
    return bench_trace_lengths(bc->batch, g->b.trace_step, 1, NULL, kv, msg, cap);
}

typedef struct row_ctx {
    const bench_case *bc;
    double bytes;
    const cfg *g;
} row_ctx;

static void print_row(const void *ctx, const char *mode, double s) {
    const row_ctx *r = (const row_ctx *)ctx;
    const double gbps = r->bytes / s / 1e9;
    const double rf = r->g->b.read_tbps > 0 ? gbps / (r->g->b.read_tbps * 1e3) : NAN;
    printf("| %-36s | %-5s | %9.1f | %8.1f | %6.1f%% |\n", r->bc->name, mode, s * 1e6, gbps,
           rf * 100);
    fprintf(stderr, "result %s %s us %.2f GBps %.1f read_frac %.4f\n", r->bc->name, mode,
            s * 1e6, gbps, rf);
}

#ifdef FI_PROFILE
/* Profiling build (`make profile`): the stamps of the last b2b replay.  Only the bf16
 * head_dim 128 module defines the reader, so only its cases have stamps. */
void fi_profile_read_stamps_gqa(unsigned long long *host, int which, int n);
static void hook_profile(void *ctx) {
    bench_profile_ctas((const fi_plan_view *)ctx, fi_profile_read_stamps_gqa);
}
#endif

/* 0: timed; 1: failed; 2: skipped (NVFP4 not supported yet). */
static int run_case(const bench_case *bc, const cfg *g, void *flush, size_t flush_bytes,
                    tt_rng *rng, int *header_done) {
    char msg[MSG];
    const size_t cap = sizeof msg;
    const int nvfp4 = bc->kv_dtype == FI_DTYPE_E2M1;
    int32_t *kv = (int32_t *)malloc(sizeof(int32_t) * (size_t)bc->batch);
    if (!kv || case_lengths(bc, g, kv, msg, cap)) {
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
    o.layout = g->layout;
    o.kv_form = GQA_KV_SINGLE;
    o.q_len = 1;
    o.num_ctas = g->b.ctas;
    o.variant = g->variant;
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
    const double kv_read = bench_plan_kv_reads(&v);
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
        const bench_inputs in = gqa_bench_inputs(&c);
        bench_times t;
#ifdef FI_PROFILE
        const bench_hooks hooks = {NULL, hook_profile, &v};
        rc = bench_time_modes(&in, &g->b, flush, flush_bytes, &hooks, &t, msg, cap);
#else
        rc = bench_time_modes(&in, &g->b, flush, flush_bytes, NULL, &t, msg, cap);
#endif
        const row_ctx r = {bc, bytes, g};
        const bench_table tab = {
            {"| case                                 | mode  | median us |     GB/s | %read  |",
             "|--------------------------------------|-------|-----------|----------|---------|"},
            print_row, &r};
        bench_report(bc->name, rc, msg, &t, &g->b, &tab, header_done);
    }
    fflush(stdout);
    gqa_case_free(&c);
    free(kv);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    cfg g = {.b = bench_cfg_default(), .layout = GQA_NHD};
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val) {
            fprintf(stderr, "usage: bench_gqa [--reps N] [--sets N] [--chain N] [--case SUBSTR] "
                            "[--read-tbps X] [--ctas N] [--trace-step S] [--layout nhd|hnd] "
                            "[--variant V] [--warm-ms N]\n");
            return 2;
        }
        if (bench_cfg_option(&g.b, a, val)) continue;
        if (!strcmp(a, "--layout")) g.layout = !strcmp(val, "hnd") ? GQA_HND : GQA_NHD;
        else if (!strcmp(a, "--variant")) g.variant = atoi(val);
        else if (!strcmp(a, "--tflops")) (void)0; /* accepted for run_gpu_bench.sh symmetry */
        else {
            fprintf(stderr, "bench_gqa: unknown option %s\n", a);
            return 2;
        }
    }
    bench_device d;
    tt_rng rng;
    int rc = 0;
    if (bench_begin("bench_gqa", &g.b, &d, &rng, &rc)) return rc;
    printf("# ceilings: read %.3f TB/s (%s)\n", g.b.read_tbps,
           g.b.read_tbps > 0 ? "measured by bench/ceilings" : "not given: fractions are nan");
    size_t flush_bytes = 0;
    void *flush = bench_flush_alloc("bench_gqa", &d, &flush_bytes);
    if (!flush) return 1;
    int header = 0, failed = 0;
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        if (g.b.only && !strstr(CASES[i].name, g.b.only)) continue;
        if (run_case(&CASES[i], &g, flush, flush_bytes, &rng, &header) == 1) failed = 1;
    }
    for (size_t i = 0; i < sizeof EXTRA_CASES / sizeof EXTRA_CASES[0]; i++) {
        /* only a --case that names d64 or d256 (so "p64_fp8" keeps its one case) */
        if (!g.b.only || (!strstr(g.b.only, "d64") && !strstr(g.b.only, "d256")) ||
            !strstr(EXTRA_CASES[i].name, g.b.only))
            continue;
        if (run_case(&EXTRA_CASES[i], &g, flush, flush_bytes, &rng, &header) == 1) failed = 1;
    }
    cudaFree(flush);
    return failed;
}
