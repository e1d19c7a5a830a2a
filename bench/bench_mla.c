/*
 * bench/bench_mla.c - MLA paged decode (fi_run, concatenated trtllm layout, bf16, page_size
 * 64) on the cases of issue 3, checked before timed:
 *
 *   h16_q1     batch 128 x kv_len 4096, heads 16,  q_len 1
 *   h16_q1_ps1 the same with page_size 1 (one page-table entry and one gather a token)
 *   h128_q1    batch 128 x kv_len 4096, heads 128, q_len 1
 *   h128_q2    batch 128 x kv_len 4096, heads 128, q_len 2 (causal MTP)
 *   h128_q1_ps16 h128_q1 with page_size 16 (the wgmma bodies' copies at a small page)
 *   trace128   decode snapshot of 128 requests of the bundled Azure trace, heads 16, q_len 1
 *   u128_trace uniform batch of the same 128 requests and the same total KV (every kv_len
 *              the snapshot's mean, rounded): the same bytes without the skew, so the
 *              snapshot's GB/s against it is what load balancing loses, apart from the
 *              fixed costs a smaller batch pays (launch, ring fill, tail)
 *   trace_h128 the trace128 snapshot with heads 128 (two 64-head tiles a request, each
 *              reading the request's KV: the plan line's "kv reads/unique" is 2)
 *   b1_32k_h16 / b1_32k_h128   batch 1 x kv_len 32768 (split-k decides everything; with
 *              --ctas N fewer, longer pieces)
 * and the fp8 / sparse cases of the fp8 issue (ids as the issue names them; q fp8 e4m3, KV
 * fp8 e4m3, out bf16 for fp8; the wgmma body, which runs both):
 *   mla_fp8_h128_q1_b128_kv4096 / mla_fp8_h128_q2_b128_kv4096 / mla_fp8_h16_q1_b128_kv4096
 *              the h128_q1 / h128_q2 / h16_q1 batches with an fp8 cache
 *   mla_fp8_h16_q1_ps1 mla_fp8_h16_q1_b128_kv4096 with page_size 1
 *   mla_fp8_b1_kv32768_h128 / mla_fp8_b1_kv32768_h16   b1_32k_h128 / b1_32k_h16 with an
 *              fp8 cache
 *   mla_sparse_top2048_h128_q2 sparse top-k 2048 (fiattn.h fi_caps.sparse_top_k), heads
 *              128, q_len 2, 64 requests of 32768 tokens, bf16 cache: each query token reads
 *              2048 distinct keys drawn from its request's 32768 (mla_gpu_case.h)
 *   mla_sparse_fp8_top2048_h128_q2  the same with q and cache fp8 e4m3
 *
 * Correctness first: one fi_run on NaN-poisoned outputs; every output element must be
 * finite, and a few requests (first, last, longest) are compared with fi_naive_attention
 * (fp64) on a one-request sub-batch (the full fp64 reference of 128 x 4096 x 128 heads would
 * take minutes on the CPU).  A failing case is reported and not timed (exit status 1).
 *
 * Timing (bench/bench_common.h, shared with bench_gqa): fi_run captured once per input
 * set in a CUDA graph; up to 4 input sets (q, KV cache, out at distinct addresses, same
 * values) are rotated so replays do not reuse L2.  Each replay is timed alone between two
 * cudaEvents, median of --reps (>= 50):
 *   b2b    replays back to back;
 *   flush  a read of a buffer of 4x the L2 size (bench_l2_flush) before each replay, outside
 *          the timed region (L2 holds none of the inputs);
 *   chain  --chain N (default 8, 0: off) runs captured in ONE graph, each launched with PDL
 *          and on the next input set, as a decode step chains its layers' kernels: replay
 *          time / N, median of --reps replays.  The graph launch (an empty one-CTA-per-SM
 *          launch is ~4.6 us event to event on an H200, bench/ceilings) is paid once per N
 *          runs and a run's launch overlaps its predecessor's tail, so this is the
 *          per-layer cost a serving loop sees; b2b and flush are the figures.
 * Figures: GB/s = (KV bytes of the tokens the batch reads, each once, 576 x 2 bytes per
 * token (576 bytes for fp8) + q + out) / time; sparse cases: the keys listed, once per query
 * token (576 x 2 or 576 bytes each); TFLOP/s = 2 x heads x sum over query tokens of the keys
 * they see (visible, or listed) x (576 + 512) / time;
 * fractions of the ceilings measured by bench/ceilings in the same run (--read-tbps,
 * --tflops, --tflops-fp8, or env FI_CEIL_READ_TBPS / FI_CEIL_BF16_TFLOPS /
 * FI_CEIL_FP8_TFLOPS; bench/run_gpu_bench.sh wires them): the fp8 cases' matmul fraction is
 * of the fp8 rate when it is given, else of the bf16 one.
 *
 * Usage: bench_mla [--reps N] [--sets N] [--chain N] [--case NAME] [--read-tbps X]
 *                  [--tflops Y] [--tflops-fp8 Z] [--ctas N] (caps.num_ctas instead of the
 *                  SM count)
 *                  [--uniform B:KV ...]   (heads-16 q_len-1 batches B x KV
 *                  instead of the list) [--trace B[:H] ...] (trace decode snapshots of B
 *                  requests, heads H (16), instead of the list) [--trace-step S] (the trace
 *                  snapshots' decode step, default 100: the figures)
 * --case NAME: the case of that name, or, when no case has it, every case whose name
 * contains it (--case h128_q1: that case only; --case mla_fp8: the seven fp8 ones).
 * --warm-ms N: each mode first replays for N ms (default: 10 replays), so it is timed at
 * the clock sustained work runs at (heads 128 is power-capped after ~0.1 s: BENCHMARKS.md).
 * Env FI_BENCH_L2_PAGES=N: consumer-rate probe (page ids modulo N, KV served from L2;
 * dense cases only).
 * Output: one table on stdout, plus machine-readable lines "result <case> <mode> us <x>
 * GBps <x> TFLOPs <x> read_frac <x> mma_frac <x>".  No GPU: prints "skip" and exits 0.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "bench_common.h"
#include "gpu/mla_gpu_case.h"

#define PAGE_SIZE 64
#define MSG 512

typedef struct bench_case {
    const char *name;
    int32_t batch, heads, q_len, kv_len; /* kv_len -1: trace snapshot; -2: uniform at the
                                            snapshot's mean kv_len (same batch) */
    int32_t page_size;                   /* 0: PAGE_SIZE */
    int32_t fp8;                         /* 1: q and cache fp8 e4m3, out bf16 */
    int32_t sparse_top_k;                /* > 0: sparse top-k plan, K keys a query token */
} bench_case;

static const bench_case CASES[] = {
    {"h16_q1", 128, 16, 1, 4096, 0, 0, 0},     {"h16_q1_ps1", 128, 16, 1, 4096, 1, 0, 0},
    {"h128_q1", 128, 128, 1, 4096, 0, 0, 0},   {"h128_q2", 128, 128, 2, 4096, 0, 0, 0},
    {"h128_q1_ps16", 128, 128, 1, 4096, 16, 0, 0},
    {"trace128", 128, 16, 1, -1, 0, 0, 0},     {"u128_trace", 128, 16, 1, -2, 0, 0, 0},
    {"trace_h128", 128, 128, 1, -1, 0, 0, 0},
    {"b1_32k_h16", 1, 16, 1, 32768, 0, 0, 0},  {"b1_32k_h128", 1, 128, 1, 32768, 0, 0, 0},
    {"mla_fp8_h128_q1_b128_kv4096", 128, 128, 1, 4096, 0, 1, 0},
    {"mla_fp8_h128_q2_b128_kv4096", 128, 128, 2, 4096, 0, 1, 0},
    {"mla_fp8_h16_q1_b128_kv4096", 128, 16, 1, 4096, 0, 1, 0},
    {"mla_fp8_h16_q1_ps1", 128, 16, 1, 4096, 1, 1, 0},
    {"mla_fp8_trace128_h16", 128, 16, 1, -1, 0, 1, 0},
    {"mla_fp8_b1_kv32768_h128", 1, 128, 1, 32768, 0, 1, 0},
    {"mla_fp8_b1_kv32768_h16", 1, 16, 1, 32768, 0, 1, 0},
    {"mla_sparse_top2048_h128_q2", 64, 128, 2, 32768, 0, 0, 2048},
    {"mla_sparse_fp8_top2048_h128_q2", 64, 128, 2, 32768, 0, 1, 2048},
};

typedef struct cfg {
    bench_cfg b;
    double tflops;     /* bf16 mma ceiling (bench/ceilings), 0: unknown */
    double tflops_fp8; /* fp8 e4m3 mma ceiling, 0: unknown (the fp8 cases then use tflops) */
    int l2_pages;  /* > 0: consumer-rate probe, see main */
} cfg;

/* fp64 check of request b alone (mla_case_reference_request: a one-request sub-batch, or
 * a sparse request's gathered rows), at the case's tolerance. */
static int check_request(void *ctx, int32_t b, double *worst, char *msg, size_t cap) {
    mla_case *c = (mla_case *)ctx;
    if (mla_case_reference_request(c, b, msg, cap)) return -1;
    double wl = 0;
    return mla_case_compare(c, b, b + 1, mla_case_tol(&c->o), worst, &wl, msg, cap);
}

/* fi_run once on poisoned outputs; every element finite; requests first, last and longest
 * against the fp64 reference. */
static int check_case(mla_case *c, char *msg, size_t cap) {
    if (mla_case_run(c, msg, cap) || mla_case_download(c, msg, cap)) return -1;
    const int64_t n = (int64_t)c->tokens * c->o.heads * MLA_D_CKV;
    if (bench_all_finite(n, mla_out_value, c, msg, cap)) return -1;
    return bench_check_requests(c->B, c->fb.kv_lens, check_request, c, msg, cap);
}

/* The buffers an input set copies, in this order (also the order they are allocated in). */
enum { BUF_Q, BUF_KV, BUF_OUT };

/* The case's run arguments on one input set's buffers (the concatenated cache: rope views
 * at +512). */
static fi_attn_args set_args(const void *ctx, void *const *buf) {
    const mla_case *c = (const mla_case *)ctx;
    fi_attn_args a = mla_case_args(c, 1);
    a.q.data = buf[BUF_Q];
    a.q_rope.data = mla_at(buf[BUF_Q], MLA_D_CKV, c->q_es);
    a.k.data = buf[BUF_KV];
    a.k_rope.data = mla_at(buf[BUF_KV], MLA_D_CKV, c->kv_es);
    a.out.data = buf[BUF_OUT];
    return a;
}

static bench_inputs case_inputs(mla_case *c) {
    bench_inputs in = bench_inputs_make(c->plan, c->stream, set_args, c);
    bench_inputs_buf(&in, BUF_Q, c->d_q, (size_t)(c->n_q * c->q_es), 1);
    bench_inputs_buf(&in, BUF_KV, c->d_kv, (size_t)(c->n_kv * c->kv_es), 1);
    bench_inputs_buf(&in, BUF_OUT, c->d_out, c->out_bytes, 0);
    return in;
}

/* Consumer-rate probe (FI_BENCH_L2_PAGES=N): after the check, the device page table is
 * rewritten to page ids modulo N, so every set's KV reads hit the same N pages and are
 * served from L2 (N = 64: 4.7 MB a set).  The timed figures then show how fast the CTAs
 * consume KV when DRAM is not the limit; outputs are no longer checked.  Probe only. */
static int l2_probe_pages(mla_case *c, int n, char *msg, size_t cap) {
    const int64_t len = c->fb.page_table_len;
    int32_t *pt = (int32_t *)malloc(sizeof(int32_t) * (size_t)(len > 0 ? len : 1));
    if (!pt) {
        mla_msg(msg, cap, "host allocation failed");
        return -1;
    }
    for (int64_t i = 0; i < len; i++) pt[i] = c->fb.page_table[i] % n;
    cudaError_t e = cudaMemcpy(c->d_pt, pt, (size_t)len * 4, cudaMemcpyHostToDevice);
    free(pt);
    if (e != cudaSuccess) {
        mla_msg(msg, cap, "page table upload: %s", cudaGetErrorString(e));
        return -1;
    }
    printf("# probe: KV page ids taken modulo %d (L2-resident, outputs not checked)\n", n);
    return 0;
}

/* Lengths of a case: uniform, or the trace decode snapshot (step --trace-step from row 0). */
static int case_lengths(const bench_case *bc, const cfg *g, int32_t *q, int32_t *kv, char *msg,
                        size_t cap) {
    if (bc->kv_len >= 0) {
        for (int32_t b = 0; b < bc->batch; b++) {
            q[b] = bc->q_len;
            kv[b] = bc->kv_len;
        }
        return 0;
    }
    if (bench_trace_lengths(bc->batch, g->b.trace_step, bc->q_len, q, kv, msg, cap)) return -1;
    if (bc->kv_len == -2) { /* same requests, same total KV, uniform lengths */
        int64_t sum = 0;
        for (int32_t b = 0; b < bc->batch; b++)
            sum += kv[b];
        const int32_t mean = (int32_t)((sum + bc->batch / 2) / bc->batch);
        for (int32_t b = 0; b < bc->batch; b++)
            kv[b] = mean > q[b] ? mean : q[b];
    }
    return 0;
}

typedef struct row_ctx {
    const bench_case *bc;
    double bytes, flops;
    const cfg *g;
} row_ctx;

static void print_row(const void *ctx, const char *mode, double s) {
    const row_ctx *r = (const row_ctx *)ctx;
    double gbps = r->bytes / s / 1e9, tf = r->flops / s / 1e12;
    double rf = r->g->b.read_tbps > 0 ? gbps / (r->g->b.read_tbps * 1e3) : NAN;
    const double ceil_tf = r->bc->fp8 && r->g->tflops_fp8 > 0 ? r->g->tflops_fp8 : r->g->tflops;
    double mf = ceil_tf > 0 ? tf / ceil_tf : NAN;
    printf("| %-12s | %-5s | %9.1f | %8.1f | %6.1f%% | %8.1f | %6.1f%% |\n", r->bc->name, mode,
           s * 1e6, gbps, rf * 100, tf, mf * 100);
    fprintf(stderr, "result %s %s us %.2f GBps %.1f TFLOPs %.2f read_frac %.4f mma_frac %.4f\n",
            r->bc->name, mode, s * 1e6, gbps, tf, rf, mf);
}

#ifdef FI_PROFILE
void fi_profile_read_stamps(unsigned long long *host, int which, int n);
void fi_profile_read_stamps_wg64(unsigned long long *host, int which, int n);
void fi_profile_read_stamps_wg(unsigned long long *host, int which, int n);
void fi_profile_read_stamps_wg8(unsigned long long *host, int which, int n);
void fi_profile_read_stamps_e4m3(unsigned long long *host, int which, int n);
void fi_profile_read_stamps_wgt16(unsigned long long *host, int which, int n);
void fi_profile_read_stamps_wgt(unsigned long long *host, int which, int n);

/* The stamp reader of the tile body that ran last: each module keeps its own stamps
 * (profile.cuh), so the one whose CTAs ended latest (%globaltimer) is this case's.  The
 * bench's cases run the bf16 and fp8 bodies of these seven modules. */
static bench_stamp_reader latest_stamps(int ctas) {
    static const bench_stamp_reader r[] = {fi_profile_read_stamps, fi_profile_read_stamps_e4m3,
                                           fi_profile_read_stamps_wg, fi_profile_read_stamps_wg64,
                                           fi_profile_read_stamps_wg8, fi_profile_read_stamps_wgt16,
                                           fi_profile_read_stamps_wgt};
    static unsigned long long st[1024 * 4];
    const int n = ctas < 1024 ? ctas : 1024;
    bench_stamp_reader best = r[0];
    unsigned long long best_end = 0;
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        r[i](st, 0, n);
        for (int c = 0; c < n; c++)
            if (st[c * 4 + 3] > best_end) {
                best_end = st[c * 4 + 3];
                best = r[i];
            }
    }
    return best;
}

/* A wgmma body's round phases (profile.cuh g_phase, the phases its item loop names), summed
 * over its CTAs, both consumer warpgroups and the case's b2b launches (zeroed before them:
 * profile_phases_zero): cycles a round each.  Nothing when that body did not run. */
static void profile_phases(const char *body, bench_stamp_reader read, const char *const *name,
                           int np, int ctas) {
    static unsigned long long ph[1024][2][16];
    const int n = ctas < 1024 ? ctas : 1024;
    read(&ph[0][0][0], 3, n);
    double sum[11] = {0}, rounds = 0, total = 0;
    for (int c = 0; c < n; c++)
        for (int w = 0; w < 2; w++) {
            rounds += (double)ph[c][w][15];
            for (int k = 0; k < 11; k++) sum[k] += (double)ph[c][w][k];
        }
    if (rounds == 0) return;
    printf("# profile: %s, cycles a round (%.0f rounds, a warpgroup's own block and the "
           "other's):",
           body, rounds);
    for (int k = 0; k < np; k++) {
        printf(" %s %.0f%s", name[k], sum[k] / rounds, k < np - 1 ? "," : ";");
        total += sum[k] / rounds;
    }
    printf(" total %.0f\n", total);
}

/* Every wgmma body's phase sums to zero (before a case's b2b mode). */
static void profile_phases_zero(void) {
    fi_profile_read_stamps_wg64(NULL, 4, 0);
    fi_profile_read_stamps_wg(NULL, 4, 0);
    fi_profile_read_stamps_wg8(NULL, 4, 0);
    fi_profile_read_stamps_wgt16(NULL, 4, 0);
}

/* The phases of the item loops (mla_wg64_tile.cuh run_item64, mla_wg_tile.cuh
 * wg_run_item: the 32-token body's 16-bit and fp8 forms; mla_wgt16_tile.cuh: row 9). */
static void profile_wg_phases(int ctas) {
    static const char *const wg64[11] = {
        "other's P awaited", "other's P V issued", "S groups awaited", "S issued",
        "P_{b-1} V_{b-1} awaited", "S awaited", "barrier before softmax", "softmax",
        "P published", "own P V issued", "own P V awaited"};
    static const char *const wg[11] = {
        "key ballot", "other's P awaited", "other's P V issued", "barrier before softmax",
        "softmax", "P published", "P_{b-1} V_{b-1} awaited", "own P V issued",
        "K of b + 2 awaited", "S_{b+2} issued", "own P V and S awaited"};
    static const char *const wgt16[6] = {"panels awaited and S issued", "S awaited", "softmax",
                                         "barrier before P V", "P V issued", "P V awaited"};
    profile_phases("64-token body", fi_profile_read_stamps_wg64, wg64, 11, ctas);
    profile_phases("32-token body (16-bit)", fi_profile_read_stamps_wg, wg, 11, ctas);
    profile_phases("32-token body (fp8)", fi_profile_read_stamps_wg8, wg, 11, ctas);
    profile_phases("transposed 16-bit body (row 9)", fi_profile_read_stamps_wgt16, wgt16, 6, ctas);
}
#endif

/* The steps bench_mla adds between the timings (bench_hooks). */
typedef struct hook_ctx {
    mla_case *c;
    const cfg *g;
    const fi_plan_view *v;
} hook_ctx;

/* Before a case's timings: profiling builds zero the phase sums (so the phases printed
 * after b2b are this case's), and FI_BENCH_L2_PAGES rewrites the page table. */
static int hook_before_timing(void *ctx, char *msg, size_t cap) {
    const hook_ctx *h = (const hook_ctx *)ctx;
#ifdef FI_PROFILE
    profile_phases_zero();
#endif
    /* dense page tables only: a sparse table's entries are slots, not page ids */
    return h->g->l2_pages > 0 && h->c->o.sparse_top_k == 0
               ? l2_probe_pages(h->c, h->g->l2_pages, msg, cap)
               : 0;
}

#ifdef FI_PROFILE
static void hook_profile(void *ctx) {
    const fi_plan_view *v = ((const hook_ctx *)ctx)->v;
    bench_profile_ctas(v, latest_stamps(v->num_ctas));
    profile_wg_phases(v->num_ctas);
}
#define HOOK_AFTER_B2B hook_profile
#else
#define HOOK_AFTER_B2B NULL
#endif

static int run_case(const bench_case *bc, const cfg *g, void *flush, size_t flush_bytes,
                    tt_rng *rng, int *header_done, double gbps[2]) {
    char msg[MSG];
    const size_t cap = sizeof msg;
    int32_t *q = (int32_t *)malloc(sizeof(int32_t) * (size_t)bc->batch);
    int32_t *kv = (int32_t *)malloc(sizeof(int32_t) * (size_t)bc->batch);
    if (!q || !kv || case_lengths(bc, g, q, kv, msg, cap)) {
        free(q);
        free(kv);
        fprintf(stderr, "%s: %s\n", bc->name, q && kv ? msg : "allocation failed");
        return -1;
    }
    mla_opts o;
    memset(&o, 0, sizeof o);
    o.dtype = FI_DTYPE_BF16;
    o.heads = bc->heads;
    o.page_size = bc->page_size > 0 ? bc->page_size : PAGE_SIZE;
    o.form = FI_FORM_BLOCK_TABLES;
    o.causal = bc->q_len > 1;
    o.num_ctas = g->b.ctas;
    o.return_lse = 0;
    if (bc->fp8) o.q_dtype = o.kv_dtype = FI_DTYPE_E4M3; /* out bf16 */
    o.sparse_top_k = bc->sparse_top_k;
    mla_case c;
    int rc = mla_case_init(&c, &o, q, kv, bc->batch, rng, msg, cap);
    if (rc) {
        fprintf(stderr, "%s: init: %s\n", bc->name, msg);
        free(q);
        free(kv);
        return -1;
    }
    /* bytes and flops of the batch: KV bytes at the cache's element size (576 a token for
     * fp8); a sparse batch reads the keys each query token lists */
    double kv_tokens = 0, flops = 0;
    for (int32_t b = 0; b < bc->batch; b++) {
        if (o.sparse_top_k > 0) {
            for (int32_t i = 0; i < q[b]; i++) {
                const int32_t *row = c.h_sparse + (int64_t)(c.q_offset[b] + i) * o.sparse_top_k;
                double listed = 0;
                for (int32_t j = 0; j < o.sparse_top_k; j++) listed += row[j] >= 0;
                kv_tokens += listed;
                flops += 2.0 * bc->heads * listed * (MLA_D_QK + MLA_D_CKV);
            }
            continue;
        }
        kv_tokens += kv[b];
        for (int32_t i = 0; i < q[b]; i++) {
            double visible = o.causal ? kv[b] - q[b] + i + 1 : kv[b];
            flops += 2.0 * bc->heads * visible * (MLA_D_QK + MLA_D_CKV);
        }
    }
    double bytes = kv_tokens * MLA_D_QK * (double)c.kv_es +
                   (double)c.tokens * bc->heads * MLA_D_QK * (double)c.q_es + (double)c.out_bytes;
    fi_plan_view v;
    fi_plan_get_view(c.plan, &v);
    const double kv_read = bench_plan_kv_reads(&v);
    printf("# %s: B=%d H=%d q_len=%d page_size=%d kv mean %.0f max %d q %s kv %s out %s "
           "sparse_top_k %d; plan: ctas %d items %d groups %d kv_chunk %d balance %.3f kv "
           "reads/unique %.2f\n", bc->name, bc->batch, bc->heads, bc->q_len, o.page_size,
           kv_tokens / bc->batch, c.fb.max_kv_len, gc_dtype_name(mla_q_dtype(&o)),
           gc_dtype_name(mla_kv_dtype(&o)), gc_dtype_name(mla_o_dtype(&o)), o.sparse_top_k,
           v.num_ctas, v.header->num_items, v.header->num_groups, v.header->kv_chunk,
           fi_plan_balance(c.plan), kv_tokens > 0 ? kv_read / kv_tokens : 0.0);
    rc = check_case(&c, msg, cap);
    if (rc) {
        printf("# %s: CHECK FAILED, not timed: %s\n", bc->name, msg);
    } else {
        const bench_inputs in = case_inputs(&c);
        hook_ctx hc = {&c, g, &v};
        const bench_hooks hooks = {hook_before_timing, HOOK_AFTER_B2B, &hc};
        bench_times t;
        rc = bench_time_modes(&in, &g->b, flush, flush_bytes, &hooks, &t, msg, cap);
        const row_ctx r = {bc, bytes, flops, g};
        const bench_table tab = {
            {"| case         | mode  | median us |     GB/s | %read  |  TFLOP/s | %mma   |",
             "|--------------|-------|-----------|----------|---------|----------|---------|"},
            print_row, &r};
        bench_report(bc->name, rc, msg, &t, &g->b, &tab, header_done);
        if (!rc) {
            gbps[0] = bytes / t.b2b / 1e9;
            gbps[1] = bytes / t.flush / 1e9;
        }
    }
    fflush(stdout);
    mla_case_free(&c);
    free(q);
    free(kv);
    return rc;
}

/* The bar: the trace snapshot's GB/s within 15% of the uniform batch's.  Printed
 * against both uniform references, b2b and flush; a case that did not run (--case) has
 * GB/s 0 and is skipped. */
static int case_index(const char *name) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
        if (!strcmp(CASES[i].name, name))
            return (int)i;
    return -1;
}
static void report_trace_bar(const double gbps[][2]) {
    const char *mode[2] = {"b2b", "flush"};
    const int tr = case_index("trace128"), big = case_index("h16_q1"),
              same = case_index("u128_trace");
    if (tr < 0 || big < 0 || same < 0)
        return; /* a case renamed: nothing to compare */
    for (int m = 0; m < 2; m++) {
        if (gbps[tr][m] <= 0)
            continue;
        if (gbps[big][m] > 0)
            printf("# trace bar (%s): trace128 at %.1f%% of h16_q1's GB/s (B 128 x 4096)\n",
                   mode[m], 100.0 * gbps[tr][m] / gbps[big][m]);
        if (gbps[same][m] > 0)
            printf("# trace bar (%s): trace128 at %.1f%% of u128_trace's GB/s (same requests "
                   "and total KV, uniform lengths)\n",
                   mode[m], 100.0 * gbps[tr][m] / gbps[same][m]);
    }
}

#define MAX_EXTRA 24

int main(int argc, char **argv) {
    cfg g = {.b = bench_cfg_default(), .tflops = bench_env_double("FI_CEIL_BF16_TFLOPS"),
             .tflops_fp8 = bench_env_double("FI_CEIL_FP8_TFLOPS"),
             .l2_pages = (int)bench_env_double("FI_BENCH_L2_PAGES")};
    static bench_case extra[MAX_EXTRA];
    static char extra_name[MAX_EXTRA][32];
    int n_extra = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val) {
            fprintf(stderr, "usage: bench_mla [--reps N] [--sets N] [--chain N] [--case NAME] "
                            "[--read-tbps X] [--tflops Y] [--tflops-fp8 Z] [--ctas N] "
                            "[--uniform B:KV ...] "
                            "[--trace B[:H] ...] [--trace-step S] [--warm-ms N]\n");
            return 2;
        }
        if (bench_cfg_option(&g.b, a, val)) {
            i++;
            continue;
        }
        if (!strcmp(a, "--tflops")) g.tflops = atof(val);
        else if (!strcmp(a, "--tflops-fp8")) g.tflops_fp8 = atof(val);
        else if (!strcmp(a, "--uniform")) {
            /* extra heads-16 q_len-1 case B x KV (e.g. 132:818), run instead of the list */
            int b = 0, k = 0;
            if (n_extra >= MAX_EXTRA || sscanf(val, "%d:%d", &b, &k) != 2 || b < 1 || k < 1) {
                fprintf(stderr, "bench_mla: --uniform wants B:KV (at most %d)\n", MAX_EXTRA);
                return 2;
            }
            snprintf(extra_name[n_extra], sizeof extra_name[0], "u%d_%d", b, k);
            extra[n_extra] = (bench_case){extra_name[n_extra], b, 16, 1, k, 0, 0, 0};
            n_extra++;
        } else if (!strcmp(a, "--trace")) {
            /* extra case: the trace decode snapshot of B requests, q_len 1, heads H (B or
             * B:H, default 16) */
            int b = 0, h = 16;
            const int got = sscanf(val, "%d:%d", &b, &h);
            if (n_extra >= MAX_EXTRA || got < 1 || b < 1 || b > 4096 ||
                (h != 16 && h != 32 && h != 64 && h != 128)) {
                fprintf(stderr, "bench_mla: --trace wants B or B:H (B 1..4096, H 16/32/64/128; "
                                "at most %d cases)\n", MAX_EXTRA);
                return 2;
            }
            snprintf(extra_name[n_extra], sizeof extra_name[0], "trace%d_h%d", b, h);
            extra[n_extra] = (bench_case){extra_name[n_extra], b, h, 1, -1, 0, 0, 0};
            n_extra++;
        } else {
            fprintf(stderr, "bench_mla: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    bench_device d;
    tt_rng rng;
    int rc = 0;
    if (bench_begin("bench_mla", &g.b, &d, &rng, &rc)) return rc;
    printf("# ceilings: read %.3f TB/s, bf16 mma %.1f TFLOP/s, fp8 mma %.1f TFLOP/s (%s; the "
           "fp8 cases' %%mma is of the fp8 rate when it is known)\n",
           g.b.read_tbps, g.tflops, g.tflops_fp8,
           g.b.read_tbps > 0 ? "measured by bench/ceilings" : "not given: fractions are nan");
    size_t flush_bytes = 0;
    void *flush = bench_flush_alloc("bench_mla", &d, &flush_bytes);
    if (!flush) return 1;
    int header = 0, failed = 0;
    const bench_case *list = n_extra ? extra : CASES;
    const size_t n_list = n_extra ? (size_t)n_extra : sizeof CASES / sizeof CASES[0];
    _Static_assert(sizeof CASES / sizeof CASES[0] <= MAX_EXTRA, "gbps holds every case");
    double gbps[MAX_EXTRA][2]; /* b2b, flush GB/s of list[i]; 0 where not run */
    memset(gbps, 0, sizeof gbps);
    /* --case: an exact name selects that case alone, else every name containing it */
    int exact = 0;
    for (size_t i = 0; g.b.only && i < n_list; i++) exact |= !strcmp(list[i].name, g.b.only);
    for (size_t i = 0; i < n_list; i++) {
        if (g.b.only && (exact ? strcmp(list[i].name, g.b.only) != 0
                               : !strstr(list[i].name, g.b.only)))
            continue;
        if (run_case(&list[i], &g, flush, flush_bytes, &rng, &header, gbps[i])) failed = 1;
    }
    if (!n_extra) /* the trace bar, against both uniform references */
        report_trace_bar(gbps);
    cudaFree(flush);
    return failed;
}
