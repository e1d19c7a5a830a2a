/*
 * bench/bench_plan.c - fi_plan_update time for decode batches from the bundled Azure trace.
 *
 * MLA decode, 128 query heads, page_size 64, 132 CTAs (an H100's SMs), block_tables form,
 * shuffled page ids; decode snapshots at step 200 (viz/trace.h continuous batching) of
 * 1, 32, 128, 256, 512 and 1024 requests.  For each batch: check the plan first (every key of
 * every (request, head tile) read exactly once, CTA ranges well formed), then time many
 * updates and print the median (and 10th / 90th percentiles) in microseconds:
 *   host    host-only plan (fi_plan_create with no workspace): validate + tiles + partition
 *           + layout into staging;
 *   device  device plan (only with a GPU): the same plus the one cudaMemcpyAsync of the
 *           plan bytes and its event record (no sync; the staging double buffer waits
 *           only if the copy of two updates ago is still pending).
 * Targets (docs/DESIGN.md): < 10 us at 128 requests, < 60 us at 1024.
 *   make build/bench/bench_plan && build/bench/bench_plan [--step S] [--repeats N] [--batch B]
 *   [--heads H] (H_q, default 128; 16 is DeepSeek-V3 under tensor parallelism 8, where a
 *   128-request batch has one tile a CTA and the packing partition runs, planner/pack.h)
 * --batch B runs only the row of B requests (e.g. under valgrind --tool=callgrind
 * --toggle-collect=fi_plan_update, whose instruction counts do not depend on machine load).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "fiattn.h"
#include "viz/batch.h"
#include "viz/trace.h"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median, p10, p90 of `repeats` updates after 20 warm-ups; -1 on a failed update. */
static int time_updates(fi_plan *plan, const fi_batch *batch, int repeats, double *t,
                        double *med, double *p10, double *p90) {
    for (int i = 0; i < 20; i++)
        if (fi_plan_update(plan, batch, NULL) != FI_OK) return -1;
    for (int i = 0; i < repeats; i++) {
        double t0 = now_us();
        fi_status s = fi_plan_update(plan, batch, NULL);
        t[i] = now_us() - t0;
        if (s != FI_OK) return -1;
    }
    qsort(t, (size_t)repeats, sizeof *t, cmp_double);
    *med = t[repeats / 2];
    *p10 = t[repeats / 10];
    *p90 = t[repeats * 9 / 10];
    return 0;
}

/* Every key of every (request, head tile) covered exactly once, CSR well formed.
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

int main(int argc, char **argv) {
    int step = 200, repeats = 2000, only = 0, heads = 128;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--step")) step = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--repeats")) repeats = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) only = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) heads = atoi(argv[i + 1]);
    }
    if (heads < 1 || heads > 128) heads = 128;
    if (repeats < 10) repeats = 10;
    int ngpu = 0;
    int gpu = cudaGetDeviceCount(&ngpu) == cudaSuccess && ngpu > 0;

    fitrace *trace = NULL;
    if (fitrace_load_default(NULL, &trace) != FITRACE_OK) {
        fprintf(stderr, "bench_plan: cannot parse the embedded trace\n");
        return 1;
    }
    static const int sizes[] = {1, 32, 128, 256, 512, 1024};
    double *t = malloc((size_t)repeats * sizeof *t);
    printf("fi_plan_update, MLA decode, H_q %d, page_size 64, 132 CTAs, Azure conv trace "
           "step %d, %d updates per row (median / p10 / p90, us)\n\n", heads, step, repeats);
    printf("| batch | kv_len mean | items | groups | balance | host median | host p10 | host p90 "
           "| device median |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    int rc = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0] && rc == 0; k++) {
        int n = sizes[k];
        if (only > 0 && n != only)
            continue;
        int32_t *q = malloc((size_t)n * 4), *kv = malloc((size_t)n * 4), *src = malloc((size_t)n * 4);
        fitrace_lens l = {n, q, kv, src};
        fibatch b;
        memset(&b, 0, sizeof b);
        fibatch_opts o = fibatch_default_opts();
        o.form = FI_FORM_BLOCK_TABLES;
        o.page_size = 64;
        o.shuffle = 1;
        o.seed = 42;
        fi_plan *plan = NULL, *dplan = NULL;
        if (fitrace_decode(trace, 0, step, 1, &l) != FITRACE_OK ||
            fibatch_build(&o, q, kv, n, NULL, &b) != FIBATCH_OK) {
            fprintf(stderr, "bench_plan: cannot build the batch of %d\n", n);
            rc = 1;
            goto next;
        }
        fi_caps caps = {0};
        caps.kind = FI_KIND_MLA_DECODE;
        caps.max_batch = n;
        caps.max_q_tokens = n;
        caps.num_pages = b.num_pages;
        caps.page_size = 64;
        caps.num_qo_heads = heads;
        caps.num_kv_heads = 1;
        caps.head_dim_qk = 576;
        caps.head_dim_vo = 512;
        caps.q_dtype = caps.kv_dtype = caps.o_dtype = FI_DTYPE_BF16;
        caps.num_ctas = 132;
        fi_status s = fi_plan_create(&caps, NULL, 0, NULL, &plan);
        if (s == FI_OK) s = fi_plan_update(plan, &b.batch, NULL);
        if (s != FI_OK || check_plan(plan, &b) != 0) {
            fprintf(stderr, "bench_plan: batch %d: plan failed or wrong (%s)\n", n, fi_status_name(s));
            rc = 1;
            goto next;
        }
        double med, p10, p90, dmed = -1, d10, d90;
        if (time_updates(plan, &b.batch, repeats, t, &med, &p10, &p90) != 0) {
            rc = 1;
            goto next;
        }
        if (gpu) {
            if (fi_plan_create_owned(&caps, NULL, &dplan) != FI_OK ||
                time_updates(dplan, &b.batch, repeats, t, &dmed, &d10, &d90) != 0) {
                fprintf(stderr, "bench_plan: device plan failed for batch %d\n", n);
                rc = 1;
                goto next;
            }
        }
        double mean_kv = 0;
        for (int i = 0; i < n; i++) mean_kv += kv[i];
        fi_plan_view v;
        fi_plan_get_view(plan, &v);
        printf("| %d | %.0f | %d | %d | %.3f | %.2f | %.2f | %.2f | ", n, mean_kv / n,
               v.header->num_items, v.header->num_groups, fi_plan_balance(plan), med, p10, p90);
        if (dmed >= 0) printf("%.2f |\n", dmed);
        else printf("(no GPU) |\n");
    next:
        fi_plan_destroy(plan);
        fi_plan_destroy(dplan);
        fibatch_free(&b);
        free(q);
        free(kv);
        free(src);
    }
    free(t);
    fitrace_free(trace);
    return rc;
}
