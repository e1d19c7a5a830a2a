/*
 * tests/gpu/test_multi_gpu.c - several GPUs in one process (issue 19): a device plan belongs
 * to the GPU of its workspace, whichever device is current when it is updated or run
 * (plan/device_guard.h).  Skips with fewer than two CUDA devices.
 *
 *   two_plans_alternate_from_one_thread: an MLA case on each of two GPUs, different caps;
 *       rounds of re-plan + run + fp64 check, each plan used while the OTHER GPU is current;
 *       the caller's current device is unchanged afterwards.
 *   two_plans_from_two_threads: the same cases, one host thread each, several rounds at once.
 * Fresh random data (the seed is printed; FI_TEST_SEED replays), outputs poisoned with NaN
 * before each run (full coverage), per-row relative error <= 1e-2.
 */
#include <pthread.h>

#include "gpu/mla_gpu_case.h"
#include "gpu/gpu_test_common.h"
#include "gpu/mla_gt_family.h"

#define MSG 768
#define ROUNDS 4

static int device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

#define REQUIRE_TWO_GPUS()                                                                  \
    do {                                                                                    \
        if (device_count() < 2) {                                                           \
            print_message("fewer than two CUDA devices: skipped\n");                        \
            skip();                                                                         \
        }                                                                                   \
    } while (0)

/* Case d on GPU d: heads 16 page 64 (GPU 0) or heads 128 page 32 (GPU 1), a few requests
 * cut over few CTAs so the merge runs too. */
static void open_case(mla_case *c, int d, tt_rng *rng) {
    mla_opts o;
    memset(&o, 0, sizeof o);
    o.dtype = FI_DTYPE_BF16;
    o.heads = d == 0 ? 16 : 128;
    o.page_size = d == 0 ? 64 : 32;
    o.form = FI_FORM_BLOCK_TABLES;
    o.return_lse = 1;
    o.num_ctas = d == 0 ? 7 : 11;
    const int32_t n = d == 0 ? 5 : 3;
    int32_t q[5], kv[5];
    for (int32_t b = 0; b < n; b++) {
        q[b] = 1;
        kv[b] = 1 + tt_rng_int(rng, 0, 1500);
    }
    char msg[MSG];
    if (cudaSetDevice(d) != cudaSuccess) fail_msg("cudaSetDevice(%d)", d);
    if (mla_case_init(c, &o, q, kv, n, rng, msg, sizeof msg)) fail_msg("GPU %d init: %s", d, msg);
}

/* Free case d on its own GPU. */
static void close_case(mla_case *c, int d) {
    (void)cudaSetDevice(d);
    mla_case_free(c);
}

/* Re-plan and run case c (its own batch) with GPU `current` current, check against fp64;
 * the current device must still be `current` afterwards.  0, or -1 with msg. */
static int round_trip(mla_case *c, int current, char *msg, size_t cap) {
    if (cudaSetDevice(current) != cudaSuccess) {
        gc_msg(msg, cap, "cudaSetDevice(%d)", current);
        return -1;
    }
    const fi_status st = fi_plan_update(c->plan, &c->fb.batch, c->stream);
    if (st != FI_OK) {
        gc_msg(msg, cap, "fi_plan_update with GPU %d current: %s", current, fi_status_name(st));
        return -1;
    }
    const gt_case g = mla_gt(c);
    double wo = 0, wl = 0;
    if (gt_verify(&g, 1, &wo, &wl, msg, cap)) return -1;
    int now = -1;
    if (cudaGetDevice(&now) != cudaSuccess || now != current) {
        gc_msg(msg, cap, "the current device moved from %d to %d", current, now);
        return -1;
    }
    return 0;
}

static void two_plans_alternate_from_one_thread(void **state) {
    (void)state;
    REQUIRE_TWO_GPUS();
    tt_rng rng = gt_test_rng(301);
    mla_case c[2];
    open_case(&c[0], 0, &rng);
    open_case(&c[1], 1, &rng);
    char msg[MSG];
    for (int r = 0; r < ROUNDS; r++)
        for (int d = 1; d >= 0; d--) /* each plan while the other GPU is current */
            if (round_trip(&c[d], d ^ 1, msg, sizeof msg)) {
                close_case(&c[0], 0);
                close_case(&c[1], 1);
                fail_msg("round %d, GPU %d's plan: %s", r, d, msg);
            }
    print_message("%d rounds x 2 plans, each run with the other GPU current: all within %g\n",
                  ROUNDS, MLA_GT_TOL);
    close_case(&c[0], 0);
    close_case(&c[1], 1);
}

typedef struct worker {
    mla_case *c;
    int current; /* the device this thread keeps current */
    int rc;
    char msg[MSG];
} worker;

static void *work(void *arg) {
    worker *w = (worker *)arg;
    for (int r = 0; r < ROUNDS && !w->rc; r++)
        w->rc = round_trip(w->c, w->current, w->msg, sizeof w->msg);
    return NULL;
}

static void two_plans_from_two_threads(void **state) {
    (void)state;
    REQUIRE_TWO_GPUS();
    tt_rng rng = gt_test_rng(302);
    mla_case c[2];
    open_case(&c[0], 0, &rng);
    open_case(&c[1], 1, &rng);
    /* thread d runs GPU d's plan with the other GPU current */
    worker w[2] = {{&c[0], 1, 0, ""}, {&c[1], 0, 0, ""}};
    pthread_t t[2];
    for (int d = 0; d < 2; d++)
        if (pthread_create(&t[d], NULL, work, &w[d]) != 0) fail_msg("pthread_create");
    for (int d = 0; d < 2; d++) pthread_join(t[d], NULL);
    close_case(&c[0], 0);
    close_case(&c[1], 1);
    for (int d = 0; d < 2; d++)
        if (w[d].rc) fail_msg("thread %d (GPU %d's plan): %s", d, d, w[d].msg);
    print_message("2 threads x %d rounds: all within %g\n", ROUNDS, MLA_GT_TOL);
}

int main(void) {
    gt_begin("test_multi_gpu");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_plans_alternate_from_one_thread),
        cmocka_unit_test(two_plans_from_two_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
