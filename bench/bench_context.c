/*
 * bench/bench_context.c - context (prefill) attention (fi_run, FI_KIND_CONTEXT: the surface
 * of trtllm_batch_context_with_kv_cache) on the cases of issue 14, checked before timed.
 * bf16 q, KV and out, head_dim 128, page_size 64, the KV cache as one HND tensor [pages, 2,
 * H_kv, page_size, D] (trtllm's default; --layout nhd for [pages, 2, page_size, H_kv, D]),
 * shuffled page ids, causal, no lse:
 *
 *   context_8k_causal_h32_d128    1 request, 8192 new tokens, no cache, 32/32 heads
 *   context_8k_causal_h32x8_d128  the same with 32/8 heads (GQA group 4)
 *   context_trace16k              a prefill batch of the bundled trace's prompts from row 0,
 *                                 as many as keep the total <= 16384 tokens (no cache), 32/8
 *   mixed_4k_chunk_127_decodes    one request prefilling a 4096-token chunk over a 4096-token
 *                                 cached prefix + 127 q_len-1 decodes (the trace's decode
 *                                 snapshot of 127 slots at --trace-step), 32/8: ONE context
 *                                 plan, one fi_run; reported beside
 *   mixed_4k_chunk_127_decodes_2launch  the same work (same inputs) as two launches in one
 *                                 graph: the chunk as a context plan, then the 127 decodes
 *                                 as an FI_KIND_GQA_DECODE plan
 *
 * Correctness first: one fi_run (the two-launch pair too) on NaN-poisoned outputs; every
 * output element must be finite; with --check, sampled rows of every request (first,
 * middle, last, either side of the plan's tile starts, random: tests/gpu/context_gpu_case.h)
 * are compared with fi_naive_attention (fp64) within 1e-2 per row.  A failing case is
 * reported and not timed (exit status 1).
 *
 * Timing (bench/bench_common.h, shared with bench_gqa / bench_mla): the run captured once
 * per input set in a CUDA graph, up to 4 input sets (q, KV, out at distinct addresses)
 * rotated; each replay timed alone between two cudaEvents, median of --reps (>= 50):
 *   b2b    replays back to back;
 *   flush  a read of 4x the L2 size before each replay (clean lines), outside the timing;
 *   chain  --chain N (default 8, 0: off) PDL-launched runs in ONE graph: replay time / N.
 * Figures: TFLOP/s = 4 x D x (sum over (query token, query head) rows of the keys that row
 * sees) / time: Q K^T and P V, 2 flops a multiply-add, causal keys counted once (an 8k
 * causal prompt at 32 heads: 4 x 128 x 32 x 8192 x 8193 / 2 = 549.8 GFLOP); %mma = that
 * over the bf16 cuBLAS rate measured by bench/ceilings in the same run (--tflops or env
 * FI_CEIL_BF16_TFLOPS; bench/run_gpu_bench.sh wires it; nan when not given).  GB/s = the
 * bytes the batch must read and write, each once: every request's kv_len keys x H_kv x 2
 * (K and V) x a row's bytes (D x 2 for bf16, D for fp8, D / 2 values + D / 16 block scales
 * for NVFP4) + q + out; a context case is matmul-bound, so this says how far the KV format
 * moves the bytes, not a bandwidth the kernel is after.
 *
 * --kv e4m3: the KV cache in fp8 e4m3 (q and out bf16; the case ids get "_fp8kv");
 * --kv nvfp4: NVFP4 (e2m1 values + e4m3 block scales per 16; the case ids get "_nvfp4kv").
 *
 * Usage: bench_context [--reps N] [--sets N] [--chain N] [--case SUBSTR] [--ctas N]
 *                      [--trace-step S] [--tflops X] [--layout hnd|nhd]
 *                      [--kv bf16|e4m3|nvfp4] [--check]
 * Output: a table on stdout, and machine-readable lines on stderr
 *   "result <case> <mode> us <x> TFLOPs <x> mma_frac <x> GBps <x>".
 * No GPU: prints "skip" and exits 0.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "bench_gqa_case.h"
#include "gpu/context_gpu_case.h"

#define MSG 1024
#define MIXED_DECODES 127
#define TRACE_MAX_REQUESTS 256

typedef enum case_shape {
    SHAPE_PROMPT, /* one request: q_len new tokens over a cached prefix */
    SHAPE_TRACE,  /* the trace's prompts up to q_len tokens in all */
    SHAPE_MIXED,  /* one q_len chunk over prefix + MIXED_DECODES decodes, 1 and 2 launches */
} case_shape;

typedef struct bench_case {
    const char *name;
    int32_t heads_q, heads_kv, head_dim, page_size;
    case_shape shape;
    int32_t q_len, prefix; /* SHAPE_TRACE: q_len is the batch's token budget */
} bench_case;

static const bench_case CASES[] = {
    {"context_8k_causal_h32_d128", 32, 32, 128, 64, SHAPE_PROMPT, 8192, 0},
    {"context_8k_causal_h32x8_d128", 32, 8, 128, 64, SHAPE_PROMPT, 8192, 0},
    {"context_trace16k", 32, 8, 128, 64, SHAPE_TRACE, 16384, 0},
    {"mixed_4k_chunk_127_decodes", 32, 8, 128, 64, SHAPE_MIXED, 4096, 4096},
};

typedef struct cfg {
    bench_cfg b;
    double tflops;     /* bf16 mma ceiling (bench/ceilings), 0: unknown */
    gqa_layout layout; /* --layout hnd | nhd */
    fi_dtype kv_dtype; /* --kv: 0 (the q dtype), FI_DTYPE_E4M3 or FI_DTYPE_E2M1 (NVFP4) */
    int check;         /* --check: sampled rows against the fp64 reference */
    int variant;       /* --variant: caps.variant (1: the walk only, the list schedule's A/B) */
} cfg;

/* ---- lengths, check ------------------------------------------------------------------- */

/* The requests of a case into q / kv (room for TRACE_MAX_REQUESTS) and their count. */
static int case_lengths(const bench_case *bc, const cfg *g, int32_t *q, int32_t *kv, int32_t *n,
                        char *msg, size_t cap) {
    switch (bc->shape) {
    case SHAPE_PROMPT:
        *n = 1;
        q[0] = bc->q_len;
        kv[0] = bc->q_len + bc->prefix;
        return 0;
    case SHAPE_TRACE:
        return ctx_trace_prefill_tokens(0, bc->prefix, bc->q_len, TRACE_MAX_REQUESTS, q, kv, n,
                                        msg, cap);
    case SHAPE_MIXED:
        *n = 1 + MIXED_DECODES;
        q[0] = bc->q_len;
        kv[0] = bc->q_len + bc->prefix;
        return bench_trace_lengths(MIXED_DECODES, g->b.trace_step, 1, q + 1, kv + 1, msg, cap);
    }
    return -1;
}

/* The outputs of the last run (downloaded here): every element finite, and with --check
 * the sampled rows against the fp64 reference (computed once, on the first call). */
static int check_outputs(ctx_case *x, const cfg *g, int *ref_done, const char *what, char *msg,
                         size_t cap) {
    if (gqa_case_download(&x->g, msg, cap) || ctx_check_coverage(&x->g, msg, cap)) return -1;
    if (!g->check) return 0;
    if (!*ref_done && ctx_case_reference(x, msg, cap)) return -1;
    *ref_done = 1;
    double wo = 0, wl = 0;
    if (ctx_case_compare(x, &wo, &wl, msg, cap)) return -1;
    printf("# check %s: %lld rows x %d heads vs fp64 (%.1f GMAC): worst row rel err %.2e\n",
           what, (long long)x->rows_checked, x->g.o.heads_q, x->ref_macs * 1e-9, wo);
    return 0;
}

/* ---- the two-launch equivalent of the mixed batch ------------------------------------------ */

/* Request 0 of the mixed case (the chunk) as a context plan of its own, requests 1.. (the
 * decodes) as a GQA decode plan; both read the case's q, KV, page table and write its out
 * at the same rows as the one-launch run. */
typedef struct two_launch {
    const gqa_case *c;
    void *ws[2];
    size_t ws_bytes[2];
    fi_plan *chunk, *decode;
} two_launch;

/* Destroy both plans and their workspaces (a partly made pair too). */
static void two_launch_free(two_launch *t) {
    fi_plan_destroy(t->chunk);
    fi_plan_destroy(t->decode);
    cudaFree(t->ws[0]);
    cudaFree(t->ws[1]);
    memset(t, 0, sizeof *t);
}

/* Plan both halves on the case's stream (the same caps.num_ctas). */
static int two_launch_init(two_launch *t, const gqa_case *c, char *msg, size_t cap) {
    memset(t, 0, sizeof *t);
    t->c = c;
    const int32_t q0 = c->fb.q_lens[0], nd = c->B - 1;
    int32_t cq[2] = {0, q0}, ck[2] = {0, c->fb.kv_lens[0]};
    fi_batch chunk = c->fb.batch; /* CUM_SEQ_LENS, block_tables row 0 */
    chunk.batch_size = 1;
    chunk.cum_seq_lens_q = cq;
    chunk.cum_seq_lens_kv = ck;
    chunk.seq_lens = NULL;
    fi_caps caps = gqa_caps(&c->o, 1, q0, c->num_pages);
    if (gc_plan_make(&caps, &chunk, c->stream, &t->ws[0], &t->ws_bytes[0], &t->chunk,
                     " (chunk)", msg, cap))
        return -1;
    fi_batch dec;
    memset(&dec, 0, sizeof dec);
    dec.form = FI_FORM_BLOCK_TABLES;
    dec.batch_size = nd;
    dec.block_tables = c->fb.page_table + c->P; /* rows 1.. of the [B, P] table */
    dec.max_pages_per_seq = c->P;
    dec.seq_lens = c->fb.kv_lens + 1;
    dec.q_len_per_request = 1;
    dec.window_left = -1;
    gqa_opts o = c->o;
    o.kind = FI_KIND_GQA_DECODE;
    o.form = 0;
    caps = gqa_caps(&o, nd, nd, c->num_pages);
    return gc_plan_make(&caps, &dec, c->stream, &t->ws[1], &t->ws_bytes[1], &t->decode,
                        " (decodes)", msg, cap);
}

/* bench_inputs.launch: the chunk's fi_run on rows [0, q0), then the decodes' on the rows
 * after, block_tables from row 1 (ctx: the two_launch). */
static fi_status two_launch_run(const void *ctx, void *const *buf, int chained,
                                cudaStream_t stream) {
    const two_launch *t = (const two_launch *)ctx;
    const gqa_case *c = t->c;
    const int64_t row = (int64_t)c->o.heads_q * c->o.head_dim, q0 = c->fb.q_lens[0];
    fi_attn_args a = gqa_bench_set_args(c, buf);
    a.enable_pdl = chained;
    a.page_table.shape[0] = 1;
    fi_status st = fi_run(t->chunk, &a, stream);
    if (st != FI_OK) return st;
    a = gqa_bench_set_args(c, buf);
    a.enable_pdl = chained;
    a.q.data = (uint16_t *)a.q.data + q0 * row;
    a.out.data = (uint8_t *)a.out.data + q0 * row * c->out_es;
    a.q.shape[0] = a.out.shape[0] = c->B - 1;
    a.page_table.data = (int32_t *)a.page_table.data + c->P;
    a.page_table.shape[0] = c->B - 1;
    return fi_run(t->decode, &a, stream);
}

/* ---- report ------------------------------------------------------------------------------- */

/* Bytes the case must move, each once (file comment): the requests' K and V rows (values,
 * and NVFP4's block scales), q and out. */
static double case_bytes(const gqa_case *c) {
    double keys = 0;
    for (int32_t b = 0; b < c->B; b++) keys += c->fb.kv_lens[b];
    const double row = (double)c->row_bytes + (double)c->sf_w;
    return keys * c->o.heads_kv * 2.0 * row + (double)c->n_q * 2 + (double)c->out_bytes;
}

/* What a table row needs: the case's name, its FLOPs (ctx_case_flops) and bytes
 * (case_bytes), the options. */
typedef struct row_ctx {
    const char *name;
    double flops, bytes;
    const cfg *g;
} row_ctx;

/* One table row (stdout) and its result line (stderr): median seconds s of a mode. */
static void print_row(const void *ctx, const char *mode, double s) {
    const row_ctx *r = (const row_ctx *)ctx;
    const double tf = r->flops / s / 1e12, gbps = r->bytes / s / 1e9;
    const double mf = r->g->tflops > 0 ? tf / r->g->tflops : NAN;
    printf("| %-36s | %-5s | %9.1f | %8.1f | %6.1f%% | %7.0f |\n", r->name, mode, s * 1e6, tf,
           mf * 100, gbps);
    fprintf(stderr, "result %s %s us %.2f TFLOPs %.2f mma_frac %.4f GBps %.1f\n", r->name, mode,
            s * 1e6, tf, mf, gbps);
}

static const bench_table TABLE = {
    {"| case                                 | mode  | median us |  TFLOP/s | %mma    |    GB/s |",
     "|--------------------------------------|-------|-----------|----------|---------|---------|"},
    print_row, NULL};

/* Time in (after its check passed) and report it as name. */
static int time_and_report(const char *name, const bench_inputs *in, double flops,
                           double bytes, const cfg *g, void *flush, size_t flush_bytes,
                           int *header_done, double *b2b) {
    char msg[MSG];
    bench_times t;
    const int rc = bench_time_modes(in, &g->b, flush, flush_bytes, NULL, &t, msg, sizeof msg);
    const row_ctx r = {name, flops, bytes, g};
    bench_table tab = TABLE;
    tab.ctx = &r;
    bench_report(name, rc, msg, &t, &g->b, &tab, header_done);
    *b2b = t.b2b;
    return rc;
}

/* The mixed case's second row: the two-launch pair checked on poisoned outputs, timed, and
 * the one-launch time against it. */
static int run_two_launch(const bench_case *bc, ctx_case *x, const cfg *g, double flops,
                          double one_b2b, void *flush, size_t flush_bytes, int *ref_done,
                          int *header_done) {
    char msg[MSG], name[128];
    snprintf(name, sizeof name, "%s_2launch", bc->name);
    two_launch t;
    bench_inputs in = gqa_bench_inputs(&x->g);
    in.launch = two_launch_run;
    in.ctx = &t;
    int rc = two_launch_init(&t, &x->g, msg, sizeof msg);
    if (!rc) {
        const gc_outputs o = gqa_case_outputs(&x->g);
        void *buf[BENCH_MAX_BUFS];
        memcpy(buf, in.base, sizeof buf);
        rc = gc_poison(&o, x->g.stream, msg, sizeof msg);
        const fi_status st = rc ? FI_OK : two_launch_run(&t, buf, 0, x->g.stream);
        if (st != FI_OK) {
            gc_msg(msg, sizeof msg, "fi_run: %s", fi_status_name(st));
            rc = -1;
        }
        if (!rc && cudaStreamSynchronize(x->g.stream) != cudaSuccess) {
            gc_msg(msg, sizeof msg, "two launches: %s", cudaGetErrorString(cudaGetLastError()));
            rc = -1;
        }
        if (!rc) rc = check_outputs(x, g, ref_done, name, msg, sizeof msg);
    }
    double b2b = 0;
    if (rc)
        printf("# %s: CHECK FAILED, not timed: %s\n", name, msg);
    else
        rc = time_and_report(name, &in, flops, case_bytes(&x->g), g, flush, flush_bytes,
                             header_done, &b2b);
    if (!rc && one_b2b > 0)
        printf("# %s: one launch %.1f us, two launches %.1f us (b2b): %.2fx\n", bc->name,
               one_b2b * 1e6, b2b * 1e6, b2b / one_b2b);
    two_launch_free(&t);
    return rc;
}

/* 0: timed; 1: failed. */
static int run_case(const bench_case *bc, const cfg *g, void *flush, size_t flush_bytes,
                    tt_rng *rng, int *header_done) {
    char msg[MSG];
    int32_t q[TRACE_MAX_REQUESTS], kv[TRACE_MAX_REQUESTS], n = 0;
    if (case_lengths(bc, g, q, kv, &n, msg, sizeof msg)) {
        printf("# FAILED %s: lengths: %s\n", bc->name, msg);
        return 1;
    }
    gqa_opts o = ctx_default_opts(bc->heads_q, bc->heads_kv, bc->head_dim, bc->page_size);
    o.layout = g->layout;
    o.return_lse = 0;
    o.num_ctas = g->b.ctas;
    o.variant = g->variant;
    o.kv_dtype = g->kv_dtype;
    char name_buf[96];
    snprintf(name_buf, sizeof name_buf, "%s%s", bc->name,
             g->kv_dtype == FI_DTYPE_E4M3   ? "_fp8kv"
             : g->kv_dtype == FI_DTYPE_E2M1 ? "_nvfp4kv"
                                            : "");
    bench_case named = *bc;
    named.name = name_buf;
    bc = &named;
    ctx_case x;
    if (ctx_case_init(&x, &o, q, kv, n, 0, rng, msg, sizeof msg)) {
        printf("# FAILED %s: init: %s\n", bc->name, msg);
        return 1;
    }
    const double flops = ctx_case_flops(&x.g);
    fi_plan_view v;
    fi_plan_get_view(x.g.plan, &v);
    printf("# %s: B=%d tokens %d (max q_len %d) H=%d/%d D=%d page_size=%d %s, max kv_len %d, "
           "%.1f GFLOP; plan: ctas %d items %d groups %d kv_chunk %d balance %.3f\n", bc->name,
           n, x.g.tokens, x.g.fb.max_q_len, bc->heads_q, bc->heads_kv, bc->head_dim,
           bc->page_size, g->layout == GQA_HND ? "HND" : "NHD", x.g.fb.max_kv_len, flops * 1e-9,
           v.num_ctas, v.header->num_items, v.header->num_groups, v.header->kv_chunk,
           fi_plan_balance(x.g.plan));
    int ref_done = 0;
    int rc = gqa_case_run(&x.g, msg, sizeof msg) ||
             check_outputs(&x, g, &ref_done, bc->name, msg, sizeof msg);
    double b2b = 0;
    if (rc) {
        printf("# %s: %s, not timed: %s\n", bc->name,
               strstr(msg, "FI_ERR_UNSUPPORTED_") ? "NOT SUPPORTED BY THE GPU FAMILY YET"
                                                  : "CHECK FAILED", msg);
    } else {
        const bench_inputs in = gqa_bench_inputs(&x.g);
        rc = time_and_report(bc->name, &in, flops, case_bytes(&x.g), g, flush, flush_bytes,
                             header_done, &b2b);
    }
    if (bc->shape == SHAPE_MIXED &&
        run_two_launch(bc, &x, g, flops, rc ? 0 : b2b, flush, flush_bytes, &ref_done, header_done))
        rc = 1;
    fflush(stdout);
    ctx_case_free(&x);
    return rc ? 1 : 0;
}

/* The options, on stderr. */
static void usage(void) {
    fprintf(stderr, "usage: bench_context [--reps N] [--sets N] [--chain N] [--case SUBSTR] "
                    "[--ctas N] [--trace-step S] [--tflops X] [--layout hnd|nhd] [--variant N] "
                    "[--kv bf16|e4m3|nvfp4] [--check] [--warm-ms N]\n");
}

int main(int argc, char **argv) {
    cfg g = {.b = bench_cfg_default(), .tflops = bench_env_double("FI_CEIL_BF16_TFLOPS"),
             .layout = GQA_HND};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--check")) {
            g.check = 1;
            continue;
        }
        const char *val = i + 1 < argc ? argv[++i] : NULL;
        if (!val) {
            usage();
            return 2;
        }
        if (bench_cfg_option(&g.b, a, val)) continue;
        if (!strcmp(a, "--tflops")) g.tflops = atof(val);
        else if (!strcmp(a, "--layout")) g.layout = !strcmp(val, "nhd") ? GQA_NHD : GQA_HND;
        else if (!strcmp(a, "--variant")) g.variant = atoi(val);
        else if (!strcmp(a, "--kv") && !strcmp(val, "bf16"))
            g.kv_dtype = 0;
        else if (!strcmp(a, "--kv") && !strcmp(val, "e4m3"))
            g.kv_dtype = FI_DTYPE_E4M3;
        else if (!strcmp(a, "--kv") && !strcmp(val, "nvfp4"))
            g.kv_dtype = FI_DTYPE_E2M1;
        else {
            fprintf(stderr, "bench_context: unknown option %s\n", a);
            usage();
            return 2;
        }
    }
    bench_device d;
    tt_rng rng;
    int rc = 0;
    if (bench_begin("bench_context", &g.b, &d, &rng, &rc)) return rc;
    printf("# ceilings: bf16 mma %.1f TFLOP/s (%s)\n", g.tflops,
           g.tflops > 0 ? "measured by bench/ceilings" : "not given: fractions are nan");
    size_t flush_bytes = 0;
    void *flush = bench_flush_alloc("bench_context", &d, &flush_bytes);
    if (!flush) return 1;
    int header = 0, failed = 0;
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        if (g.b.only && !strstr(CASES[i].name, g.b.only)) continue;
        failed |= run_case(&CASES[i], &g, flush, flush_bytes, &rng, &header);
    }
    cudaFree(flush);
    return failed;
}
