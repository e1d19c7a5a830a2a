/*
 * tests/test_tensor_map.c - fi_tensor_map (executor/core/tensor_map.h) refuses what TMA or
 * the wgmma panels cannot take before it asks the driver for anything, so a family falls
 * back to cp.async rather than encoding a map it would misread (fi_tensor_map_args_ok, the
 * rules alone, is checked directly: without a driver fi_tensor_map refuses everything):
 *   - a dtype other than bf16 / fp16 / fp8 e4m3 (fp32, E2M1);
 *   - a swizzle other than 128 or 64 bytes, or a box row that is not exactly that wide
 *     (64 bf16 or 128 fp8 elements for 128 bytes, 64 fp8 for 64);
 *   - an L2 promotion other than 0, 64, 128 or 256 bytes;
 *   - a base not 16-byte aligned, a stride 0, not a multiple of 16 or >= 2^40;
 *   - a rank outside 2..5.
 * Each rule is broken in a request that passes every other rule (random dims, strides and
 * a random 16-byte-aligned base; seed printed, FI_TEST_SEED replays), which the rules
 * accept untouched and fi_tensor_map refuses broken.  Where a CUDA device is present the
 * untouched request must also encode (0); without one (CI) that check is skipped.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "common/tensors.h"
#include "executor/core/tensor_map.h"

static uint64_t g_seed;

/* A valid 3-D map request: [inner, page_size, pages] of dt, strides 16-byte multiples, a
 * 16-byte-aligned base inside a real buffer (the encoder never reads it). */
typedef struct map_req {
    fi_dtype dt;
    const void *base;
    int rank;
    uint64_t dims[3], strides[2];
    uint32_t box[3], swizzle, l2;
} map_req;

static unsigned char g_buf[4096] __attribute__((aligned(64)));

static map_req valid_req(tt_rng *r) {
    map_req q;
    const int kind = (int)tt_rng_int(r, 0, 2); /* bf16 / fp16 at 128 B; fp8 at 128 or 64 B */
    q.dt = kind == 0 ? FI_DTYPE_BF16 : kind == 1 ? FI_DTYPE_F16 : FI_DTYPE_E4M3;
    const uint32_t esize = q.dt == FI_DTYPE_E4M3 ? 1 : 2;
    q.swizzle = q.dt == FI_DTYPE_E4M3 && tt_rng_int(r, 0, 1) ? 64 : 128;
    q.base = g_buf + 16 * tt_rng_int(r, 0, 63);
    q.rank = 3;
    const uint64_t inner = q.swizzle / esize * (uint64_t)tt_rng_int(r, 1, 9);
    const uint64_t page_size = (uint64_t)1 << tt_rng_int(r, 3, 7);
    q.dims[0] = inner;
    q.dims[1] = page_size;
    q.dims[2] = (uint64_t)tt_rng_int(r, 1, 100000);
    q.strides[0] = (inner * esize + 15) / 16 * 16;
    q.strides[1] = q.strides[0] * page_size;
    q.box[0] = q.swizzle / esize;
    q.box[1] = 8;
    q.box[2] = 1;
    static const uint32_t kL2[4] = {0, 64, 128, 256}; /* the promotions TMA has */
    q.l2 = kL2[tt_rng_int(r, 0, 3)];
    return q;
}

static int encode(const map_req *q) {
    CUtensorMap m;
    return fi_tensor_map(&m, q->dt, q->base, q->rank, q->dims, q->strides, q->box, q->swizzle, q->l2);
}

/* A broken request: the rules refuse it, and so does fi_tensor_map. */
static void assert_refused(const map_req *q) {
    assert_int_equal(fi_tensor_map_args_ok(q->dt, q->base, q->rank, q->strides, q->box, q->swizzle, q->l2), 0);
    assert_int_equal(encode(q), -1);
}

static void refuses_each_broken_rule(void **state) {
    (void)state;
    tt_rng rng = {g_seed};
    for (int it = 0; it < 200; it++) {
        const map_req ok = valid_req(&rng);
        assert_int_equal(fi_tensor_map_args_ok(ok.dt, ok.base, ok.rank, ok.strides, ok.box, ok.swizzle, ok.l2), 1);
        map_req q = ok;
        q.dt = tt_rng_int(&rng, 0, 1) ? FI_DTYPE_F32 : FI_DTYPE_E2M1;
        assert_refused(&q);
        q = ok;
        q.swizzle = tt_rng_int(&rng, 0, 1) ? 32 : 256;
        assert_refused(&q);
        q = ok;
        q.l2 = tt_rng_int(&rng, 0, 1) ? 32 : 512; /* L2 promotion: 0, 64, 128 or 256 only */
        assert_refused(&q);
        q = ok;
        q.box[0] = ok.box[0] * 2; /* a row twice the swizzle's width */
        assert_refused(&q);
        q = ok;
        q.box[0] = ok.box[0] / 2; /* half of it */
        assert_refused(&q);
        q = ok;
        q.base = (const unsigned char *)ok.base + tt_rng_int(&rng, 1, 15);
        assert_refused(&q);
        q = ok;
        q.strides[tt_rng_int(&rng, 0, 1)] = 0;
        assert_refused(&q);
        q = ok;
        q.strides[tt_rng_int(&rng, 0, 1)] += (uint64_t)tt_rng_int(&rng, 1, 15);
        assert_refused(&q);
        q = ok;
        q.strides[1] = (uint64_t)1 << 40;
        assert_refused(&q);
        q = ok;
        q.rank = tt_rng_int(&rng, 0, 1) ? 1 : 6;
        assert_refused(&q);
    }
}

static void encodes_a_valid_map_where_a_driver_is(void **state) {
    (void)state;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        print_message("  no CUDA device here: the positive case is not checked\n");
        skip();
    }
    tt_rng rng = {g_seed ^ 0x5a5aull};
    for (int it = 0; it < 50; it++) {
        const map_req ok = valid_req(&rng);
        assert_int_equal(encode(&ok), 0);
    }
}

int main(void) {
    g_seed = tt_test_seed();
    printf("FI_TEST_SEED=%llu\n", (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(refuses_each_broken_rule),
        cmocka_unit_test(encodes_a_valid_map_where_a_driver_is),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
