/*
 * tests/gpu/gpu_test_common.h - the test harness the GPU test suites of every family share
 * (cmocka; header-only, static inline; included by tests/gpu/test_*_gpu.c after their case
 * header): seeds and the skip without a device, the plan's split figures, checking a case
 * (once, or twice with PDL off / on and bitwise identical), the determinism test, the CUDA
 * graph decode loop over the bundled trace, PDL-chained graph pairs and the "bad arguments
 * write nothing" checks.
 *
 * The family is seen through a gt_case: its plan, stream, batch and outputs, and a
 * gt_family of callbacks (run, download, reference, compare, fresh step inputs, ...) over
 * its own case type, so the test logic is written once and each family keeps what is its
 * own (shapes, layouts, references, tolerances).
 */
#ifndef FI_TESTS_GPU_GPU_TEST_COMMON_H
#define FI_TESTS_GPU_GPU_TEST_COMMON_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gpu/gpu_case_common.h"
#include "viz/batch.h"
#include "viz/trace.h"
#include "plan/plan.h" /* the workspace layout: the loop poisons the split partials */

/* ---- seeds, skips ---------------------------------------------------------------------- */

static uint64_t gt_seed;

/* Print the seed (FI_TEST_SEED replays it) and apply FI_GPU_TEST_FILTER (a cmocka glob
 * over test names, e.g. one test under compute-sanitizer). */
static inline void gt_begin(const char *suite) {
    gt_seed = tt_test_seed();
    printf("%s: seed %llu (replay with FI_TEST_SEED=%llu)\n", suite,
           (unsigned long long)gt_seed, (unsigned long long)gt_seed);
    const char *filter = getenv("FI_GPU_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
}

/* Fresh generator per test, derived from the printed seed and the test's own tag, so a
 * single test replays alone with FI_TEST_SEED. */
static inline tt_rng gt_test_rng(uint64_t tag) {
    tt_rng r = {gt_seed ^ (tag * 0x9e3779b97f4a7c15ull)};
    tt_rng_next(&r);
    return r;
}

#define REQUIRE_GPU()                                                                       \
    do {                                                                                    \
        if (!gc_gpu_available()) {                                                          \
            print_message("no CUDA device: skipped\n");                                      \
            skip();                                                                         \
        }                                                                                   \
    } while (0)

/* ---- a family's case, as the shared tests see it -------------------------------------- */

typedef struct gt_family {
    fi_attn_args (*args)(const void *c);           /* fi_run's arguments on the device */
    int (*upload)(void *c, char *msg, size_t cap); /* q, page table, sinks, scales */
    int (*reference)(void *c, char *msg, size_t cap);
    /* downloaded rows of every request against the reference, at the family's tolerance */
    int (*compare)(void *c, double *worst_out, double *worst_lse, char *msg, size_t cap);
    void (*name)(const void *c, char *buf, size_t cap);
    void (*free)(void *c);
    /* fresh q and bmm1 scale for the next step of the graph decode loop */
    void (*new_step_inputs)(void *c, tt_rng *rng);
    /* 1 when msg says the family refused the case as unsupported (NULL: never asked) */
    int (*unsupported)(const char *msg);
} gt_family;

/* Running and downloading need no callback: every family's outputs are a gc_outputs. */
typedef struct gt_case {
    void *c;
    const gt_family *f;
    fi_plan *plan;
    cudaStream_t stream;
    fibatch *fb;
    int32_t B, P, num_pages;
    gc_outputs io;
} gt_case;

/* A family's test file wraps its case with this once it is initialised (plan and buffers
 * set). */
static inline gt_case gt_case_make(void *c, const gt_family *f, fi_plan *plan,
                                   cudaStream_t stream, fibatch *fb, int32_t B, int32_t P,
                                   int32_t num_pages, gc_outputs io) {
    const gt_case g = {c, f, plan, stream, fb, B, P, num_pages, io};
    return g;
}

/* A failure message's prefix when the family says the case is unsupported, else "". */
static inline const char *gt_unsupported_prefix(const gt_case *g, const char *msg,
                                                const char *prefix) {
    return g->f->unsupported && g->f->unsupported(msg) ? prefix : "";
}

/* Poison, fi_run with a, synchronise. */
static inline int gt_run_args(const gt_case *g, const fi_attn_args *a, char *msg, size_t cap) {
    return gc_run_args(&g->io, g->plan, g->stream, a, msg, cap);
}

/* Poison, fi_run with the case's own arguments, synchronise. */
static inline int gt_run(const gt_case *g, char *msg, size_t cap) {
    const fi_attn_args a = g->f->args(g->c);
    return gt_run_args(g, &a, msg, cap);
}

static inline int gt_download(const gt_case *g, char *msg, size_t cap) {
    return gc_download(&g->io, msg, cap);
}

/* ---- the plan's split figures ---------------------------------------------------------- */

/* What a case's plan asks of the executor: merge groups, the most pieces of one group,
 * CTAs that run more than one item. */
typedef struct split_stats {
    int32_t groups, max_splits, multi_item_ctas;
} split_stats;

static inline split_stats plan_split_stats(const fi_plan *plan) {
    split_stats s = {0, 0, 0};
    fi_plan_view v;
    if (fi_plan_get_view(plan, &v) != FI_OK) return s;
    s.groups = v.header->num_groups;
    for (int32_t g = 0; g < s.groups; g++)
        if (v.groups[g].num_splits > s.max_splits) s.max_splits = v.groups[g].num_splits;
    for (int32_t k = 0; k < v.num_ctas; k++)
        s.multi_item_ctas += v.work_indptr[k + 1] - v.work_indptr[k] > 1;
    return s;
}

/* Fail (freeing the case) unless one merge group of the plan has at least min_splits
 * pieces: the tests that need splits must not pass without them. */
static inline void gt_require_splits(const gt_case *g, int32_t min_splits) {
    const split_stats s = plan_split_stats(g->plan);
    if (s.groups <= 0 || s.max_splits < min_splits) {
        char name[512];
        g->f->name(g->c, name, sizeof name);
        g->f->free(g->c);
        fail_msg("%s: the plan's largest merge group has %d pieces (%d groups); the test "
                 "needs %d", name, s.max_splits, s.groups, min_splits);
    }
}

/* ---- checking a case ------------------------------------------------------------------- */

/* The second run of gt_verify: PDL on, outputs and lse bitwise identical to the first's. */
static inline int gt_rerun_with_pdl(const gt_case *g, char *msg, size_t cap) {
    void *o1 = malloc(g->io.out_bytes);
    float *l1 = (float *)malloc(g->io.lse_bytes);
    int bad = 0;
    if (!o1 || !l1) {
        gc_msg(msg, cap, "host allocation failed");
        bad = 1;
    } else {
        memcpy(o1, g->io.h_out, g->io.out_bytes);
        memcpy(l1, g->io.h_lse, g->io.lse_bytes);
        fi_attn_args a = g->f->args(g->c);
        a.enable_pdl = 1;
        bad = gt_run_args(g, &a, msg, cap) || gt_download(g, msg, cap);
        if (!bad && (memcmp(o1, g->io.h_out, g->io.out_bytes) != 0 ||
                     memcmp(l1, g->io.h_lse, g->io.lse_bytes) != 0)) {
            gc_msg(msg, cap, "a second run (PDL on) is not bitwise identical to the first");
            bad = 1;
        }
    }
    free(o1);
    free(l1);
    return bad;
}

/* Run the case once, or twice (runs 2: without, then with PDL; the two outputs and lse
 * must be bitwise identical), then compare the last run with the fp64 reference.  0, or
 * -1 and the first difference in msg. */
static inline int gt_verify(const gt_case *g, int runs, double *wo, double *wl, char *msg,
                            size_t cap) {
    int bad = gt_run(g, msg, cap) || gt_download(g, msg, cap);
    if (!bad && runs > 1) bad = gt_rerun_with_pdl(g, msg, cap);
    if (!bad) bad = g->f->reference(g->c, msg, cap);
    if (!bad) bad = g->f->compare(g->c, wo, wl, msg, cap);
    return bad ? -1 : 0;
}

/* gt_verify, print the case and its errors; on failure free the case and fail the test
 * (a refusal as unsupported says so first). */
static inline void gt_check(const gt_case *g, int runs) {
    char msg[768], name[768];
    g->f->name(g->c, name, sizeof name);
    double wo = 0, wl = 0;
    const int bad = gt_verify(g, runs, &wo, &wl, msg, sizeof msg);
    print_message("  %s: out err %.2e lse err %.2e%s\n", name, wo, wl, bad ? " FAILED" : "");
    if (bad) {
        const char *pre = gt_unsupported_prefix(g, msg, "NOT SUPPORTED BY THE GPU FAMILY YET: ");
        g->f->free(g->c);
        fail_msg("%s%s: %s", pre, name, msg);
    }
}

/* ---- determinism ------------------------------------------------------------------------- */

/* Run, re-plan the same batch (must be byte-identical), run again: outputs and lse bitwise
 * identical.  Frees the case. */
static inline void gt_same_inputs_identical(const gt_case *g) {
    char msg[768];
    void *o1 = malloc(g->io.out_bytes);
    float *l1 = (float *)malloc(g->io.lse_bytes);
    assert_non_null(o1);
    assert_non_null(l1);
    int bad = gt_run(g, msg, sizeof msg) || gt_download(g, msg, sizeof msg);
    if (!bad) {
        memcpy(o1, g->io.h_out, g->io.out_bytes);
        memcpy(l1, g->io.h_lse, g->io.lse_bytes);
        const fi_status st = fi_plan_update(g->plan, &g->fb->batch, g->stream);
        if (st != FI_OK) {
            gc_msg(msg, sizeof msg, "second fi_plan_update: %s", fi_status_name(st));
            bad = 1;
        }
    }
    if (!bad) bad = gt_run(g, msg, sizeof msg) || gt_download(g, msg, sizeof msg);
    const int same_o = !bad && memcmp(o1, g->io.h_out, g->io.out_bytes) == 0;
    const int same_l = !bad && memcmp(l1, g->io.h_lse, g->io.lse_bytes) == 0;
    free(o1);
    free(l1);
    const char *pre = gt_unsupported_prefix(g, msg, "NOT SUPPORTED YET: ");
    g->f->free(g->c);
    if (bad) fail_msg("%s%s", pre, msg);
    assert_true(same_o);
    assert_true(same_l);
}

/* ---- CUDA graph decode loop driven by the bundled trace ---------------------------------- */

#define LOOP_B 8
#define LOOP_STEPS 64
#define LOOP_PS 32
#define LOOP_MAX_KV 3000 /* keeps the fp64 reference of 64 steps to seconds */

/* The loop's lengths, all steps up front: slot b's kv_len at step s and the trace request
 * it holds (a change: the request finished and a new one took the slot). */
typedef struct gt_loop_trace {
    int32_t kv[LOOP_STEPS][LOOP_B], src[LOOP_STEPS][LOOP_B];
    int32_t first, max_kv, replaced;
} gt_loop_trace;

/* Pick a start row of the trace whose requests stay <= LOOP_MAX_KV and where at least one
 * request finishes and is replaced within the steps. */
static inline void gt_loop_trace_pick(gt_loop_trace *t, tt_rng *rng) {
    fitrace *tr = NULL;
    assert_int_equal(fitrace_load_default(NULL, &tr), FITRACE_OK);
    int32_t ql[LOOP_B] = {0};
    t->first = -1;
    for (int attempt = 0; attempt < 1000 && t->first < 0; attempt++) {
        int32_t f = tt_rng_int(rng, 0, tr->num_requests - 1);
        t->max_kv = 0;
        t->replaced = 0;
        for (int32_t s = 0; s < LOOP_STEPS; s++) {
            fitrace_lens l = {LOOP_B, ql, t->kv[s], t->src[s]};
            assert_int_equal(fitrace_decode(tr, f, s, 1, &l), FITRACE_OK);
            for (int b = 0; b < LOOP_B; b++) {
                if (t->kv[s][b] > t->max_kv) t->max_kv = t->kv[s][b];
                if (s > 0) t->replaced += t->src[s][b] != t->src[s - 1][b];
            }
        }
        if (t->max_kv <= LOOP_MAX_KV && t->replaced > 0) t->first = f;
    }
    fitrace_free(tr);
    assert_true(t->first >= 0);
    print_message("  trace rows from %d, max kv_len %d, %d requests replaced in %d steps\n",
                  t->first, t->max_kv, t->replaced, LOOP_STEPS);
}

/* Pages of a slot: first_page .. first_page + P - 1 in a fresh random order. */
static inline void gt_shuffle_row(int32_t *row, int32_t P, int32_t first_page, tt_rng *rng) {
    for (int32_t j = 0; j < P; j++) row[j] = first_page + j;
    for (int32_t j = P - 1; j > 0; j--) {
        int32_t k = tt_rng_int(rng, 0, j), t = row[j];
        row[j] = row[k];
        row[k] = t;
    }
}

/* Step s's batch in place: slot b's kv_len, new (shuffled) pages for a new request. */
static inline void gt_loop_step_batch(const gt_case *g, const gt_loop_trace *t, int32_t s,
                                      tt_rng *rng) {
    int32_t *bt = g->fb->page_table; /* host [B, P], rewritten in place per step */
    for (int b = 0; b < LOOP_B; b++) {
        if (s == 0 || t->src[s][b] != t->src[s - 1][b]) /* new request in slot b: new pages */
            gt_shuffle_row(bt + (int64_t)b * g->P, g->P, b * g->P, rng);
        g->fb->kv_lens[b] = t->kv[s][b];
    }
}

/* Capture fi_run(dargs) once into *exec (after the first plan). */
static inline int gt_loop_capture(const gt_case *g, const fi_attn_args *dargs, cudaGraph_t *graph,
                                  cudaGraphExec_t *exec, char *msg, size_t cap) {
    cudaError_t e = cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeGlobal);
    fi_status st = e == cudaSuccess ? fi_run(g->plan, dargs, g->stream) : FI_ERR_CUDA;
    cudaError_t e2 = cudaStreamEndCapture(g->stream, graph);
    if (e != cudaSuccess || st != FI_OK || e2 != cudaSuccess ||
        cudaGraphInstantiate(exec, *graph, 0) != cudaSuccess) {
        gc_msg(msg, cap, "capture: begin %d fi_run %s end %d", (int)e, fi_status_name(st),
               (int)e2);
        return -1;
    }
    return 0;
}

/* A step's replays (FI_LOOP_REPLAYS overrides): the first is checked against the
 * reference, the others bitwise against the first.  Each runs over poisoned split partials,
 * so a merge that reads a slot before the launch wrote it gives NaN and any other race
 * gives different bits.  The transposed fp8 body's stage-release race (docs/perf-log.md,
 * thirty-seventh session) differed in about one launch in a thousand; 32 replays a step
 * found it in 2 of 5 runs of the fp8 loop, 1 replay (no bitwise check) in ~1 of 7 (H200). */
#define LOOP_REPLAYS 64

/* What the loop carries from step to step: the graph (captured at step 0), the replay
 * count, the checked run's outputs (host copies) and the worst errors. */
typedef struct gt_loop_state {
    fi_attn_args dargs;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    int replays;
    void *first_out, *first_lse;
    double worst, worst_lse;
} gt_loop_state;

/* Poison out / lse and the workspace's split partials (partial O and LSE: 0xff bytes,
 * NaN), replay the graph, synchronise. */
static inline int gt_loop_launch(const gt_case *g, const gt_loop_state *ls, char *msg,
                                 size_t cap) {
    const fi_layout *L = &g->plan->layout;
    GC_CUDA(cudaMemsetAsync((unsigned char *)g->plan->workspace + L->off_partial_o, 0xff,
                            L->off_semaphores - L->off_partial_o, g->stream), msg, cap);
    if (gc_poison(&g->io, g->stream, msg, cap)) return -1;
    if (cudaGraphLaunch(ls->exec, g->stream) != cudaSuccess ||
        cudaStreamSynchronize(g->stream) != cudaSuccess) {
        gc_msg(msg, cap, "graph launch failed: %s", cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    return 0;
}

/* Replay r's downloaded outputs against the step's checked run: 0 when bitwise equal,
 * else -1 with the first differing byte, the count of differing 16-byte pieces and the
 * replay's own comparison with the reference in msg. */
static inline int gt_loop_same_as_first(const gt_case *g, gt_loop_state *ls, int r,
                                        char *msg, size_t cap) {
    const gc_outputs *io = &g->io;
    const int lse_same = !memcmp(io->h_lse, ls->first_lse, io->lse_bytes);
    if (lse_same && !memcmp(io->h_out, ls->first_out, io->out_bytes))
        return 0;
    const unsigned char *a = (const unsigned char *)io->h_out, *b = (const unsigned char *)ls->first_out;
    size_t first = io->out_bytes, pieces = 0;
    for (size_t k = 0; k < io->out_bytes; k += 16) {
        const size_t n = io->out_bytes - k < 16 ? io->out_bytes - k : 16;
        if (memcmp(a + k, b + k, n)) {
            pieces++;
            if (first == io->out_bytes) first = k;
        }
    }
    char ref[512];
    double w = 0, wl = 0;
    if (g->f->compare(g->c, &w, &wl, ref, sizeof ref) == 0)
        snprintf(ref, sizeof ref, "within the tolerance of the reference (worst %.2e)", w);
    gc_msg(msg, cap, "replay %d differs from the step's first run (a race): %zu 16-byte pieces "
           "of out from byte %zu (lse %s); this replay: %s", r, pieces, first,
           lse_same ? "equal" : "differs", ref);
    return -1;
}

/* One step of the loop: re-plan, new inputs at the same device addresses, replay the graph
 * (captured at step 0) over poisoned outputs and partials, check every request against the
 * fp64 reference, then replay it ls->replays - 1 more times, each bitwise equal. */
static inline int gt_loop_step(const gt_case *g, const gt_loop_trace *t, int32_t s,
                               gt_loop_state *ls, tt_rng *rng, char *msg, size_t cap) {
    gt_loop_step_batch(g, t, s, rng);
    const fi_status st = fi_plan_update(g->plan, &g->fb->batch, g->stream);
    if (st != FI_OK) {
        gc_msg(msg, cap, "fi_plan_update: %s", fi_status_name(st));
        return -1;
    }
    g->f->new_step_inputs(g->c, rng);
    if (g->f->upload(g->c, msg, cap)) return -1;
    if (s == 0 && gt_loop_capture(g, &ls->dargs, &ls->graph, &ls->exec, msg, cap)) return -1;
    if (gt_loop_launch(g, ls, msg, cap) || g->f->reference(g->c, msg, cap) ||
        gt_download(g, msg, cap) || g->f->compare(g->c, &ls->worst, &ls->worst_lse, msg, cap))
        return -1;
    memcpy(ls->first_out, g->io.h_out, g->io.out_bytes);
    memcpy(ls->first_lse, g->io.h_lse, g->io.lse_bytes);
    for (int r = 1; r < ls->replays; r++)
        if (gt_loop_launch(g, ls, msg, cap) || gt_download(g, msg, cap) ||
            gt_loop_same_as_first(g, ls, r, msg, cap))
            return -1;
    return 0;
}

/* The plan of a failing step, one line an item (CTA, request, keys, partial slot, merge
 * group): the record a failure of the loop needs (the stage-release race of the
 * thirty-seventh session was placed by it: unsplit items of 6-7 KV blocks). */
static inline void gt_print_plan(const fi_plan *plan) {
    fi_plan_view v;
    if (fi_plan_get_view(plan, &v) != FI_OK)
        return;
    print_message("  plan of that step: %d items, %d groups on %d CTAs\n", v.header->num_items,
                  v.header->num_groups, v.num_ctas);
    for (int32_t c = 0; c < v.num_ctas; c++)
        for (int32_t i = v.work_indptr[c]; i < v.work_indptr[c + 1]; i++) {
            const fi_work_item *it = &v.items[i];
            print_message("    item %d cta %d request %d heads [%d, %d) q [%d, %d) kv [%d, %d) "
                          "slot %d group %d\n", i, c, it->request, it->head_begin, it->head_end,
                          it->q_begin, it->q_end, it->kv_begin, it->kv_end, it->out_slot,
                          it->merge_group);
        }
}

/* One graph captured after the first plan, replayed for the trace's steps of continuous
 * batching (LOOP_B slots): every step re-plans (lengths grow, finished requests are
 * replaced by new ones on freshly shuffled pages), writes new q, block tables and bmm1
 * scale at the same device addresses and replays LOOP_REPLAYS times over poisoned outputs
 * and partials (gt_loop_step): the first run checked against the reference, the others
 * bitwise against it.  The case was built for the whole loop: LOOP_B requests of P full
 * pages each (slot b owns pages [b P, (b + 1) P), the block_tables row stride P fixed, so
 * every step's table lands at the same device address).  Frees the case. */
static inline void gt_graph_decode_loop(const gt_case *g, const gt_loop_trace *t, int32_t P,
                                        tt_rng *rng) {
    assert_int_equal(g->P, P);
    assert_int_equal(g->num_pages, LOOP_B * P);
    g->fb->batch.seq_lens = g->fb->kv_lens; /* rewritten in place per step */
    const char *env = getenv("FI_LOOP_REPLAYS");
    gt_loop_state ls = {g->f->args(g->c), NULL, NULL, env && atoi(env) > 0 ? atoi(env) : LOOP_REPLAYS,
                        malloc(g->io.out_bytes), malloc(g->io.lse_bytes), 0, 0};
    assert_non_null(ls.first_out);
    assert_non_null(ls.first_lse);
    int bad = 0, bad_step = -1;
    char msg[1024];
    for (int32_t s = 0; s < LOOP_STEPS && !bad; s++) {
        bad_step = s;
        bad = gt_loop_step(g, t, s, &ls, rng, msg, sizeof msg);
    }
    print_message("  %d steps x %d replays: worst out err %.2e lse err %.2e\n", LOOP_STEPS,
                  ls.replays, ls.worst, ls.worst_lse);
    if (bad)
        gt_print_plan(g->plan);
    if (ls.exec) cudaGraphExecDestroy(ls.exec);
    if (ls.graph) cudaGraphDestroy(ls.graph);
    free(ls.first_out);
    free(ls.first_lse);
    const char *pre = gt_unsupported_prefix(g, msg, "NOT SUPPORTED YET: ");
    g->f->free(g->c);
    if (bad) fail_msg("%sstep %d: %s", pre, bad_step, msg);
}

/* ---- PDL: two chained launches in one graph (layer 2 reads layer 1's output) ------------- */

/* Host copies of both layers' outputs, for PDL off [0] and on [1], and layer 2's device
 * outputs (layer 1 writes the case's own). */
typedef struct gt_pdl_bufs {
    void *o1[2], *o2[2];
    float *l2[2];
    void *d_out2, *d_lse2;
} gt_pdl_bufs;

static inline int gt_pdl_bufs_alloc(gt_pdl_bufs *p, const gc_outputs *io, char *msg, size_t cap) {
    memset(p, 0, sizeof *p);
    const size_t ob = io->out_bytes, lb = io->lse_bytes;
    for (int i = 0; i < 2; i++) {
        p->o1[i] = malloc(ob);
        p->o2[i] = malloc(ob);
        p->l2[i] = (float *)malloc(lb);
    }
    if (!p->o1[0] || !p->o1[1] || !p->o2[0] || !p->o2[1] || !p->l2[0] || !p->l2[1]) {
        gc_msg(msg, cap, "host allocation failed");
        return -1;
    }
    if (cudaMalloc(&p->d_out2, ob) != cudaSuccess || cudaMalloc(&p->d_lse2, lb) != cudaSuccess) {
        gc_msg(msg, cap, "cudaMalloc failed");
        return -1;
    }
    return 0;
}

static inline void gt_pdl_bufs_free(gt_pdl_bufs *p) {
    for (int i = 0; i < 2; i++) {
        free(p->o1[i]);
        free(p->o2[i]);
        free(p->l2[i]);
    }
    if (p->d_out2) cudaFree(p->d_out2);
    if (p->d_lse2) cudaFree(p->d_lse2);
    memset(p, 0, sizeof *p);
}

/* Capture run1 -> run2 with the given enable_pdl, replay once, copy back out1 and out2 /
 * lse2 into the host buffers of slot pdl. */
static inline int gt_pdl_pair(const gt_case *g, fi_attn_args *a1, fi_attn_args *a2, int pdl,
                              gt_pdl_bufs *p, char *msg, size_t cap) {
    const size_t ob = g->io.out_bytes, lb = g->io.lse_bytes;
    a1->enable_pdl = a2->enable_pdl = pdl;
    cudaGraph_t gr = NULL;
    cudaGraphExec_t x = NULL;
    GC_CUDA(cudaMemsetAsync(a1->out.data, 0xff, ob, g->stream), msg, cap);
    GC_CUDA(cudaMemsetAsync(a2->out.data, 0xff, ob, g->stream), msg, cap);
    GC_CUDA(cudaMemsetAsync(a2->lse.data, 0xff, lb, g->stream), msg, cap);
    GC_CUDA(cudaStreamSynchronize(g->stream), msg, cap);
    GC_CUDA(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeGlobal), msg, cap);
    fi_status s1 = fi_run(g->plan, a1, g->stream);
    fi_status s2 = fi_run(g->plan, a2, g->stream);
    GC_CUDA(cudaStreamEndCapture(g->stream, &gr), msg, cap);
    if (s1 != FI_OK || s2 != FI_OK) {
        cudaGraphDestroy(gr);
        gc_msg(msg, cap, "pdl=%d: fi_run %s / %s", pdl, fi_status_name(s1), fi_status_name(s2));
        return -1;
    }
    cudaError_t e = cudaGraphInstantiate(&x, gr, 0);
    if (e == cudaSuccess) e = cudaGraphLaunch(x, g->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream);
    if (x) cudaGraphExecDestroy(x);
    cudaGraphDestroy(gr);
    if (e != cudaSuccess) {
        gc_msg(msg, cap, "pdl=%d: graph: %s", pdl, cudaGetErrorString(e));
        return -1;
    }
    GC_CUDA(cudaMemcpy(p->o1[pdl], a1->out.data, ob, cudaMemcpyDeviceToHost), msg, cap);
    GC_CUDA(cudaMemcpy(p->o2[pdl], a2->out.data, ob, cudaMemcpyDeviceToHost), msg, cap);
    GC_CUDA(cudaMemcpy(p->l2[pdl], a2->lse.data, lb, cudaMemcpyDeviceToHost), msg, cap);
    return 0;
}

/* Layer 1 (the case's arguments) then layer 2 (q = layer 1's out, writing p's device
 * outputs), captured without and with PDL.  *same: both captures bitwise identical. */
static inline int gt_pdl_chain(const gt_case *g, gt_pdl_bufs *p, int *same, char *msg,
                               size_t cap) {
    fi_attn_args a1 = g->f->args(g->c), a2 = a1;
    a2.q = a1.out;
    a2.out.data = p->d_out2;
    a2.lse.data = p->d_lse2;
    int bad = 0;
    for (int pdl = 0; pdl <= 1 && !bad; pdl++) bad = gt_pdl_pair(g, &a1, &a2, pdl, p, msg, cap);
    const size_t ob = g->io.out_bytes, lb = g->io.lse_bytes;
    *same = !bad && memcmp(p->o1[0], p->o1[1], ob) == 0 && memcmp(p->o2[0], p->o2[1], ob) == 0 &&
            memcmp(p->l2[0], p->l2[1], lb) == 0;
    return bad;
}

/* The PDL-chained test: layer 1 then layer 2 captured without and with PDL must give
 * bitwise identical outputs, and both layers must be right, not just equal (check_layers:
 * the family's reference of layer 1, then of layer 2 with the GPU's layer-1 output as its
 * q).  Frees the case. */
static inline void gt_pdl_chained_matches_unchained(
    const gt_case *g, int (*check_layers)(void *c, const gt_pdl_bufs *p, char *msg, size_t cap)) {
    char msg[768];
    gt_pdl_bufs p;
    int same = 0;
    int bad = gt_pdl_bufs_alloc(&p, &g->io, msg, sizeof msg);
    if (!bad) bad = gt_pdl_chain(g, &p, &same, msg, sizeof msg);
    if (!bad) bad = check_layers(g->c, &p, msg, sizeof msg);
    gt_pdl_bufs_free(&p);
    const char *pre = gt_unsupported_prefix(g, msg, "NOT SUPPORTED YET: ");
    g->f->free(g->c);
    if (bad) fail_msg("%s%s", pre, msg);
    assert_true(same);
}

/* ---- bad arguments: statuses, and nothing written ---------------------------------------- */

/* fi_run(a) must return want; otherwise free the case and fail naming what. */
static inline void gt_expect_status(const gt_case *g, const fi_attn_args *a, fi_status want,
                                    const char *what) {
    fi_status got = fi_run(g->plan, a, g->stream);
    if (got != want) {
        g->f->free(g->c);
        fail_msg("%s: fi_run returned %s, want %s", what, fi_status_name(got),
                 fi_status_name(want));
    }
}

/* fi_run on good with one member changed by `edit` (on a_) must return want; the message
 * names the change (printf format and arguments).  In gt_expect_paged_tensor_statuses. */
#define GT_EXPECT_EDIT(g, good, edit, want, ...)                                            \
    do {                                                                                    \
        fi_attn_args a_ = *(good);                                                          \
        char what_[160];                                                                    \
        edit;                                                                               \
        snprintf(what_, sizeof what_, __VA_ARGS__);                                         \
        gt_expect_status((g), &a_, (want), what_);                                          \
    } while (0)

/* The refusals of the families whose q / out are [tokens, H_q, D] and whose k / v are paged
 * [pages, page_size, H_kv, D] views (GQA decode and context, one set of tensor checks:
 * executor/gqa/gqa_host.h), on a plan whose KV is not NVFP4: each member of good (the
 * case's own arguments, which run) broken alone gets its status, before any launch.  Wrong
 * sizes are taken off the plan's caps (half / twice the heads and head_dim, twice the page
 * size, a page and a row short).  The caller checks afterwards that nothing was written. */
static inline void gt_expect_paged_tensor_statuses(const gt_case *g, const fi_attn_args *good) {
    const fi_caps *caps = fi_plan_caps(g->plan);
    const long long Hq = caps->num_qo_heads, Hkv = caps->num_kv_heads, D = caps->head_dim_qk,
                    ps = caps->page_size, pages = caps->num_pages;
    fi_plan_view v;
    assert_int_equal(fi_plan_get_view(g->plan, &v), FI_OK);
    const long long rows = v.header->total_q_tokens;
    const long long few_q = Hq > 1 ? Hq / 2 : 2, few_kv = Hkv > 1 ? Hkv / 2 : 2;
    const long long few_out = Hq >= 4 ? Hq / 4 : Hq + 1;
    const fi_dtype other_q = caps->q_dtype == FI_DTYPE_F16 ? FI_DTYPE_BF16 : FI_DTYPE_F16;
    const fi_dtype other_kv = caps->kv_dtype == FI_DTYPE_F16 ? FI_DTYPE_BF16 : FI_DTYPE_F16;
    const fi_dtype fp8_kv = caps->kv_dtype == FI_DTYPE_E4M3 ? FI_DTYPE_BF16 : FI_DTYPE_E4M3;

    gt_expect_status(g, NULL, FI_ERR_NULL_ARGUMENT, "args NULL");
    GT_EXPECT_EDIT(g, good, a_.q.data = NULL, FI_ERR_NULL_ARGUMENT, "q.data NULL");
    GT_EXPECT_EDIT(g, good, a_.k.data = NULL, FI_ERR_NULL_ARGUMENT, "k.data NULL");
    GT_EXPECT_EDIT(g, good, (memset(&a_.v, 0, sizeof a_.v)), FI_ERR_NULL_ARGUMENT, "v missing");
    GT_EXPECT_EDIT(g, good, a_.out.data = NULL, FI_ERR_NULL_ARGUMENT, "out.data NULL");
    /* wrong layout: last stride not 1, a page / token stride not a multiple of 16 bytes */
    GT_EXPECT_EDIT(g, good, a_.k.stride[3] = 2, FI_ERR_BAD_STRIDE, "k last stride 2");
    GT_EXPECT_EDIT(g, good, a_.v.stride[3] = 2, FI_ERR_BAD_STRIDE, "v last stride 2");
    GT_EXPECT_EDIT(g, good, a_.q.stride[2] = 2, FI_ERR_BAD_STRIDE, "q last stride 2");
    GT_EXPECT_EDIT(g, good, a_.out.stride[2] = 2, FI_ERR_BAD_STRIDE, "out last stride 2");
    GT_EXPECT_EDIT(g, good, a_.k.stride[0] += 4, FI_ERR_BAD_STRIDE, "k page stride + 4 elements");
    GT_EXPECT_EDIT(g, good, a_.v.stride[1] = D + 4, FI_ERR_BAD_STRIDE, "v token stride %lld",
                   D + 4);
    /* wrong head count / head_dim / page_size / page count / rows */
    GT_EXPECT_EDIT(g, good, a_.k.shape[2] = few_kv, FI_ERR_SHAPE_MISMATCH,
                   "k %lld heads under H_kv %lld", few_kv, Hkv);
    GT_EXPECT_EDIT(g, good, a_.v.shape[2] = 2 * Hkv, FI_ERR_SHAPE_MISMATCH,
                   "v %lld heads under H_kv %lld", 2 * Hkv, Hkv);
    GT_EXPECT_EDIT(g, good, a_.q.shape[1] = few_q, FI_ERR_SHAPE_MISMATCH,
                   "q %lld heads under H_q %lld", few_q, Hq);
    GT_EXPECT_EDIT(g, good, a_.out.shape[1] = few_out, FI_ERR_SHAPE_MISMATCH,
                   "out %lld heads under H_q %lld", few_out, Hq);
    GT_EXPECT_EDIT(g, good, a_.k.shape[3] = D / 2, FI_ERR_SHAPE_MISMATCH,
                   "k head_dim %lld under D %lld", D / 2, D);
    GT_EXPECT_EDIT(g, good, a_.v.shape[3] = 2 * D, FI_ERR_SHAPE_MISMATCH,
                   "v head_dim %lld under D %lld", 2 * D, D);
    GT_EXPECT_EDIT(g, good, a_.q.shape[2] = D / 2, FI_ERR_SHAPE_MISMATCH, "q head_dim %lld", D / 2);
    GT_EXPECT_EDIT(g, good, a_.out.shape[2] = 2 * D, FI_ERR_SHAPE_MISMATCH, "out head_dim %lld",
                   2 * D);
    GT_EXPECT_EDIT(g, good, a_.k.shape[1] = 2 * ps, FI_ERR_SHAPE_MISMATCH,
                   "k page_size %lld under %lld", 2 * ps, ps);
    GT_EXPECT_EDIT(g, good, a_.v.shape[0] = pages - 1, FI_ERR_SHAPE_MISMATCH,
                   "v %lld pages under caps.num_pages %lld", pages - 1, pages);
    GT_EXPECT_EDIT(g, good, a_.k.ndim = 3, FI_ERR_SHAPE_MISMATCH, "k 3-D");
    GT_EXPECT_EDIT(g, good, a_.q.shape[0] = rows - 1, FI_ERR_SHAPE_MISMATCH,
                   "q %lld rows under the plan's %lld tokens", rows - 1, rows);
    /* wrong dtype */
    GT_EXPECT_EDIT(g, good, a_.q.dtype = other_q, FI_ERR_UNSUPPORTED_DTYPE, "q not the caps' type");
    GT_EXPECT_EDIT(g, good, a_.k.dtype = other_kv, FI_ERR_UNSUPPORTED_DTYPE, "k not the KV type");
    GT_EXPECT_EDIT(g, good, a_.v.dtype = fp8_kv, FI_ERR_UNSUPPORTED_DTYPE,
                   "v fp8 e4m3 (or bf16) under other KV caps");
    GT_EXPECT_EDIT(g, good, a_.out.dtype = FI_DTYPE_F32, FI_ERR_UNSUPPORTED_DTYPE, "out f32");
    GT_EXPECT_EDIT(g, good, a_.lse.dtype = FI_DTYPE_F16, FI_ERR_UNSUPPORTED_DTYPE, "lse f16");
    GT_EXPECT_EDIT(g, good, a_.page_table.dtype = FI_DTYPE_F32, FI_ERR_UNSUPPORTED_DTYPE,
                   "page_table f32");
    /* NVFP4 block scales given for a cache that is not NVFP4 (an argument that must be
     * absent: FI_ERR_INVALID_ARGUMENT) */
    GT_EXPECT_EDIT(g, good, (a_.k_sf = good->k, a_.k_sf.dtype = FI_DTYPE_E4M3),
                   FI_ERR_INVALID_ARGUMENT, "k_sf given for a cache that is not NVFP4");
    GT_EXPECT_EDIT(g, good, (a_.v_sf = good->v, a_.v_sf.dtype = FI_DTYPE_E4M3),
                   FI_ERR_INVALID_ARGUMENT, "v_sf given for a cache that is not NVFP4");
    /* misaligned bases, bad scalars */
    GT_EXPECT_EDIT(g, good, a_.k.data = (uint8_t *)good->k.data + 2, FI_ERR_MISALIGNED_POINTER,
                   "k + 2 bytes");
    GT_EXPECT_EDIT(g, good, a_.q.data = (uint8_t *)good->q.data + 8, FI_ERR_MISALIGNED_POINTER,
                   "q + 8 bytes");
    GT_EXPECT_EDIT(g, good, a_.sinks = (const float *)((uintptr_t)good->sinks + 2),
                   FI_ERR_MISALIGNED_POINTER, "sinks + 2 bytes");
    GT_EXPECT_EDIT(g, good, a_.o_scale = -1.0f, FI_ERR_INVALID_ARGUMENT, "o_scale -1");
}

/* Out and lse still all 0xff after the refusals (stream synchronised first). */
static inline void gt_expect_untouched(const gt_case *g) {
    char msg[768];
    assert_int_equal(cudaStreamSynchronize(g->stream), cudaSuccess);
    assert_int_equal(gt_download(g, msg, sizeof msg), 0);
    const unsigned char *ob = (const unsigned char *)g->io.h_out;
    const unsigned char *lb = (const unsigned char *)g->io.h_lse;
    size_t touched = 0;
    for (size_t i = 0; i < g->io.out_bytes; i++) touched += ob[i] != 0xff;
    for (size_t i = 0; i < g->io.lse_bytes; i++) touched += lb[i] != 0xff;
    if (touched) {
        g->f->free(g->c);
        fail_msg("a rejected fi_run wrote %zu bytes of out / lse", touched);
    }
}

/* The refusals of an NVFP4 plan's block scales (k_sf / v_sf, executor/gqa/gqa_host.c,
 * shared by GQA decode and context) and of its packed k / v row width, on a plan whose KV
 * is E2M1: each member of good (the case's own arguments) broken alone gets its status,
 * before any launch.  good must run first (else every status below would be the family's
 * refusal); out and lse are poisoned after it and must stay untouched. */
static inline void gt_expect_nvfp4_scale_statuses(const gt_case *g, const fi_attn_args *good) {
    const fi_caps *caps = fi_plan_caps(g->plan);
    const long long Hkv = caps->num_kv_heads, D = caps->head_dim_qk, ps = caps->page_size;
    const long long other_heads = Hkv > 1 ? Hkv / 2 : 2;
    char msg[768];
    assert_int_equal(caps->kv_dtype, FI_DTYPE_E2M1);
    if (gt_run_args(g, good, msg, sizeof msg)) {
        g->f->free(g->c);
        fail_msg("%sgood NVFP4 arguments: %s",
                 gt_unsupported_prefix(g, msg, "NOT SUPPORTED BY THE GPU FAMILY YET: "), msg);
    }
    assert_int_equal(gc_poison(&g->io, g->stream, msg, sizeof msg), 0);
    GT_EXPECT_EDIT(g, good, (memset(&a_.k_sf, 0, sizeof a_.k_sf)), FI_ERR_NULL_ARGUMENT,
                   "NVFP4 without k_sf");
    GT_EXPECT_EDIT(g, good, (memset(&a_.v_sf, 0, sizeof a_.v_sf)), FI_ERR_NULL_ARGUMENT,
                   "NVFP4 without v_sf");
    GT_EXPECT_EDIT(g, good, a_.k_sf.shape[3] = D / 8, FI_ERR_SHAPE_MISMATCH,
                   "k_sf last dim D / 8 = %lld", D / 8);
    GT_EXPECT_EDIT(g, good, a_.v_sf.shape[2] = other_heads, FI_ERR_SHAPE_MISMATCH,
                   "v_sf %lld heads under H_kv %lld", other_heads, Hkv);
    GT_EXPECT_EDIT(g, good, a_.k_sf.shape[1] = 2 * ps, FI_ERR_SHAPE_MISMATCH,
                   "k_sf page_size %lld under %lld", 2 * ps, ps);
    GT_EXPECT_EDIT(g, good, a_.k_sf.ndim = 3, FI_ERR_SHAPE_MISMATCH, "k_sf 3-D");
    GT_EXPECT_EDIT(g, good, a_.k_sf.dtype = FI_DTYPE_BF16, FI_ERR_UNSUPPORTED_DTYPE, "k_sf bf16");
    GT_EXPECT_EDIT(g, good, a_.v_sf.dtype = FI_DTYPE_E2M1, FI_ERR_UNSUPPORTED_DTYPE,
                   "v_sf E2M1 (scales are e4m3)");
    GT_EXPECT_EDIT(g, good, a_.v_sf.stride[3] = 2, FI_ERR_BAD_STRIDE, "v_sf last stride 2");
    GT_EXPECT_EDIT(g, good, a_.k_sf.data = (uint8_t *)good->k_sf.data + 2,
                   FI_ERR_MISALIGNED_POINTER, "k_sf + 2 bytes (rows of %lld bytes)", D / 16);
    GT_EXPECT_EDIT(g, good, a_.k.shape[3] = D, FI_ERR_SHAPE_MISMATCH,
                   "NVFP4 k last dim D = %lld (must be D / 2 bytes)", D);
    GT_EXPECT_EDIT(g, good, a_.v.dtype = FI_DTYPE_E4M3, FI_ERR_UNSUPPORTED_DTYPE,
                   "v fp8 e4m3 under NVFP4 caps");
    gt_expect_untouched(g);
}

/* The plan states fi_run refuses whatever the arguments: a device plan before its first
 * update (FI_ERR_NOT_PLANNED) and a host-only plan, planned for batch but without a
 * workspace (FI_ERR_HOST_PLAN).  good: arguments valid for caps. */
static inline void gt_expect_unplanned_refused(const gt_case *g, const fi_caps *caps,
                                               const fi_batch *batch, const fi_attn_args *good) {
    size_t bytes = 0;
    void *ws = NULL;
    fi_plan *p = NULL;
    assert_int_equal(fi_workspace_size(caps, &bytes), FI_OK);
    assert_int_equal(cudaMalloc(&ws, bytes), cudaSuccess);
    assert_int_equal(fi_plan_create(caps, ws, bytes, NULL, &p), FI_OK);
    fi_status st = fi_run(p, good, g->stream); /* valid args for these caps, but no plan */
    fi_plan_destroy(p);
    cudaFree(ws);
    assert_int_equal(st, FI_ERR_NOT_PLANNED);
    p = NULL;
    assert_int_equal(fi_plan_create(caps, NULL, 0, NULL, &p), FI_OK);
    st = fi_plan_update(p, batch, NULL);
    fi_status st_run = st == FI_OK ? fi_run(p, good, g->stream) : st;
    fi_plan_destroy(p);
    assert_int_equal(st, FI_OK);
    assert_int_equal(st_run, FI_ERR_HOST_PLAN);
}

#endif /* FI_TESTS_GPU_GPU_TEST_COMMON_H */
