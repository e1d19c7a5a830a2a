/*
 * tests/test_ref_tensors.c - tensors as the library reads them, and the test helpers that
 * build them.  Library: the CPU references read fp8 (E4M3 / E5M2) inputs as the exact
 * values they encode and refuse NVFP4, and read a KV cache / query the same whatever its
 * memory order (NHD, HND).  Helpers (tests/common/tensors.h): the references and the GPU
 * tests agree *through* them, so a wrong stride or a lenient comparison there would hide a
 * bug everywhere.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/batchgen.h"
#include "common/rng.h"
#include "common/tensors.h"
#include "fiattn_ref.h"

static tt_rng g_rng;

/* HND memory order of a logical [pages, page_size, H, D] cache: D innermost, then the
 * slot, then the head. */
static void hnd_tensor_has_head_major_strides(void **state) {
    (void)state;
    const int64_t P = tt_rng_int(&g_rng, 1, 5), S = 16, H = tt_rng_int(&g_rng, 2, 4), D = 64;
    const int64_t shape[4] = {P, S, H, D};
    const int32_t hnd[4] = {0, 2, 1, 3};
    fi_tensor t;
    assert_int_equal(tt_tensor_alloc(&t, FI_DTYPE_BF16, 4, shape, hnd), 0);
    assert_int_equal(t.stride[3], 1);
    assert_int_equal(t.stride[1], D);
    assert_int_equal(t.stride[2], S * D);
    assert_int_equal(t.stride[0], H * S * D);
    fi_tensor n;
    assert_int_equal(tt_tensor_alloc(&n, FI_DTYPE_F32, 4, shape, NULL), 0);
    assert_int_equal(n.stride[2], D);
    assert_int_equal(n.stride[1], H * D);
    /* every logical element has its own memory: converting HND -> NHD keeps each value */
    tt_tensor_fill_random(&t, &g_rng, 1.0f);
    assert_int_equal(tt_tensor_convert(&n, &t), 0);
    double err = 1.0;
    assert_int_equal(tt_tensor_compare(&n, &t, P, &err), 0);
    assert_true(err == 0.0);
    tt_tensor_free(&t);
    tt_tensor_free(&n);
}

/* The 64-wide view of a [T, H, 576] tensor starts at element 512 of each row. */
static void view_last_selects_the_rope_columns(void **state) {
    (void)state;
    const int64_t shape[3] = {3, 2, 576};
    fi_tensor t;
    assert_int_equal(tt_tensor_alloc(&t, FI_DTYPE_F32, 3, shape, NULL), 0);
    tt_tensor_fill_random(&t, &g_rng, 1.0f);
    const fi_tensor v = tt_tensor_view_last(&t, 512, 64);
    assert_int_equal(v.shape[2], 64);
    const int64_t iv[3] = {2, 1, 5}, it[3] = {2, 1, 517};
    assert_true(tt_tensor_get(&v, iv) == tt_tensor_get(&t, it));
    tt_tensor_free(&t);
}

/* Poisoned elements count as NaN; -inf counts as non-finite but not NaN; only rows
 * [0, rows) are looked at. */
static void poison_and_finite_checks_count_the_right_rows(void **state) {
    (void)state;
    const int64_t shape[2] = {4, 8};
    fi_tensor t;
    assert_int_equal(tt_tensor_alloc(&t, FI_DTYPE_F16, 2, shape, NULL), 0);
    tt_tensor_poison(&t);
    assert_int_equal(tt_tensor_count_nan(&t, 4), 32);
    tt_tensor_fill_random(&t, &g_rng, 1.0f);
    assert_int_equal(tt_tensor_count_nonfinite(&t, 4), 0);
    const int64_t a[2] = {1, 3}, b[2] = {3, 0};
    tt_tensor_set(&t, a, -INFINITY);
    tt_tensor_set(&t, b, NAN);
    assert_int_equal(tt_tensor_count_nan(&t, 4), 1);
    assert_int_equal(tt_tensor_count_nan(&t, 3), 0);
    assert_int_equal(tt_tensor_count_nonfinite(&t, 3), 1);
    tt_tensor_free(&t);
}

/* compare: relative 2-norm error over finite pairs; a -inf against a finite value, or any
 * NaN, is a mismatch. */
static void compare_reports_norm_error_and_nonfinite_mismatches(void **state) {
    (void)state;
    const int64_t shape[1] = {4};
    fi_tensor x, y;
    assert_int_equal(tt_tensor_alloc(&x, FI_DTYPE_F32, 1, shape, NULL), 0);
    assert_int_equal(tt_tensor_alloc(&y, FI_DTYPE_F32, 1, shape, NULL), 0);
    const float ref[4] = {3.0f, 4.0f, -INFINITY, 0.0f};
    memcpy(y.data, ref, sizeof ref);
    memcpy(x.data, ref, sizeof ref);
    ((float *)x.data)[0] = 3.5f;   /* error 0.5 against ||y|| = 5 over finite pairs */
    double err = 0.0;
    assert_int_equal(tt_tensor_compare(&x, &y, 4, &err), 0);
    assert_float_equal(err, 0.1, 1e-12);
    ((float *)x.data)[2] = 1.0f;   /* finite where the reference has -inf */
    assert_int_equal(tt_tensor_compare(&x, &y, 4, &err), 1);
    ((float *)x.data)[2] = -INFINITY;
    ((float *)x.data)[3] = NAN;
    assert_int_equal(tt_tensor_compare(&x, &y, 4, &err), 1);
    tt_tensor_free(&x);
    tt_tensor_free(&y);
}

/* scale_ptrs: the values are left 0 so a reader of the value instead of the pointer
 * gets a wrong answer; MLA q / k are the 512 + 64 halves of one 576-wide buffer. */
static void attn_make_builds_mla_views_and_scale_pointers(void **state) {
    (void)state;
    fi_caps caps = {.kind = FI_KIND_MLA_DECODE, .max_batch = 1, .max_q_tokens = 2,
                    .num_pages = 3, .page_size = 16, .num_qo_heads = 16, .num_kv_heads = 1,
                    .head_dim_qk = 576, .head_dim_vo = 512, .q_dtype = FI_DTYPE_BF16,
                    .kv_dtype = FI_DTYPE_BF16, .o_dtype = FI_DTYPE_F32, .num_ctas = 1};
    const int32_t table[2] = {2, 0}, seq_lens[1] = {20};
    fi_batch batch = {.form = FI_FORM_BLOCK_TABLES, .batch_size = 1, .block_tables = table,
                      .max_pages_per_seq = 2, .seq_lens = seq_lens, .q_len_per_request = 2,
                      .causal = 1, .window_left = -1};
    fi_test_attn_opts opts = {.scale_ptrs = 1, .bmm1_scale = 0.125f, .sinks = 1};
    tt_test_attn ta;
    assert_int_equal(tt_test_attn_make(&ta, &caps, &batch, &opts, &g_rng), 0);
    assert_int_equal(ta.q_tokens, 2);
    assert_true(ta.args.bmm1_scale == 0.0f && ta.args.bmm2_scale == 0.0f);
    assert_true(*ta.args.bmm1_scale_ptr == 0.125f && *ta.args.bmm2_scale_ptr == 1.0f);
    assert_non_null(ta.args.sinks);
    assert_int_equal(ta.args.q.shape[2], 512);
    assert_int_equal(ta.args.q_rope.shape[2], 64);
    assert_ptr_equal((char *)ta.args.q_rope.data, (char *)ta.args.q.data + 512 * 2);
    assert_ptr_equal((char *)ta.args.k_rope.data, (char *)ta.args.k.data + 512 * 2);
    assert_int_equal(ta.args.k.shape[0], 3);
    assert_int_equal(ta.args.page_table.ndim, 2);
    assert_ptr_equal(ta.args.page_table.data, table);
    assert_null(ta.args.v.data);
    assert_int_equal(ta.args.out.shape[0], 2);
    assert_int_equal(ta.args.lse.shape[1], 16);
    tt_test_attn_free(&ta);
}

/* fi_tensor_make (fiattn_run.h): every part copied, the rest zero; an ndim above
 * FI_MAX_DIMS is kept as given (so the run functions reject it) and only FI_MAX_DIMS
 * entries are read (make asan would catch a read past the caller's arrays). */
static void tensor_make_copies_parts_and_keeps_an_oversized_ndim(void **state) {
    (void)state;
    int64_t shape[FI_MAX_DIMS + 2], stride[FI_MAX_DIMS + 2];
    for (int i = 0; i < FI_MAX_DIMS + 2; i++) {
        shape[i] = tt_rng_int(&g_rng, 1, 1000);
        stride[i] = tt_rng_int(&g_rng, 1, 100000);
    }
    int dummy;
    const fi_tensor t = fi_tensor_make(&dummy, FI_DTYPE_F16, 3, shape, stride);
    assert_ptr_equal(t.data, &dummy);
    assert_int_equal(t.dtype, FI_DTYPE_F16);
    assert_int_equal(t.ndim, 3);
    for (int i = 0; i < FI_MAX_DIMS; i++) {
        assert_int_equal(t.shape[i], i < 3 ? shape[i] : 0);
        assert_int_equal(t.stride[i], i < 3 ? stride[i] : 0);
    }
    const fi_tensor big = fi_tensor_make(NULL, FI_DTYPE_BF16, FI_MAX_DIMS + 2, shape, stride);
    assert_int_equal(big.ndim, FI_MAX_DIMS + 2);
    for (int i = 0; i < FI_MAX_DIMS; i++)
        assert_int_equal(big.shape[i], shape[i]);
}

/* ---- library behaviour: the CPU references read tensors as fiattn_run.h says ---------- */

/* A random valid batch of `kind` (F32 caps) and a host plan updated with it. */
static fi_plan *planned_batch(fi_kind kind, int32_t max_batch, int32_t max_kv, batchgen_batch *g) {
    /* Any shape but the long tail, whose 131,072-key request ignores max_kv (the fp64 naive
     * reference then took minutes: 2.7 min at -O2, over 10 under ASan, for heads 128). */
    static const batchgen_shape shapes[] = {BATCHGEN_RANDOM, BATCHGEN_BATCH1, BATCHGEN_KV_EDGES,
                                            BATCHGEN_MAX_BATCH};
    batchgen_opts o = {0};
    o.kind = kind;
    o.shape = shapes[tt_rng_int(&g_rng, 0, 3)];
    o.max_batch = max_batch;
    o.max_kv_len = max_kv;
    assert_int_equal(batchgen_make(&g_rng, &o, g), 0);
    fi_plan *plan = NULL;
    assert_int_equal(fi_plan_create(&g->caps, NULL, 0, NULL, &plan), FI_OK);
    assert_int_equal(fi_plan_update(plan, &g->batch, NULL), FI_OK);
    return plan;
}

/* An fp8 byte's value from its fields, independent of the library's decoders:
 * (-1)^s 2^(e - bias) (1 + m / 2^mbits), subnormal 2^(1 - bias) m / 2^mbits. */
static double fp8_value(uint8_t x, int ebits, int mbits) {
    const int bias = (1 << (ebits - 1)) - 1;
    const int e = (x >> mbits) & ((1 << ebits) - 1), m = x & ((1 << mbits) - 1);
    const double v = e == 0 ? ldexp((double)m, 1 - bias - mbits)
                            : ldexp(1.0 + ldexp((double)m, -mbits), e - bias);
    return (x & 0x80) ? -v : v;
}

/* A random fp8 byte of magnitude <= 4 (finite in both formats). */
static uint8_t fp8_random(int ebits, int mbits) {
    for (;;) {
        const uint8_t x = (uint8_t)tt_rng_int(&g_rng, 0, 255);
        if (fabs(fp8_value(x, ebits, mbits)) <= 4.0 && ((x >> mbits) & ((1 << ebits) - 1)) !=
                                                            (1 << ebits) - 1)
            return x;
    }
}

/* fp8 tensor of t's shape with random bytes; t gets their values (both row-major). */
static void fp8_twin(fi_tensor *t, fi_tensor *out8, fi_dtype dt) {
    const int ebits = dt == FI_DTYPE_E4M3 ? 4 : 5, mbits = dt == FI_DTYPE_E4M3 ? 3 : 2;
    assert_int_equal(tt_tensor_alloc(out8, dt, t->ndim, t->shape, NULL), 0);
    const int64_t n = tt_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        const uint8_t x = fp8_random(ebits, mbits);
        ((uint8_t *)out8->data)[i] = x;
        ((float *)t->data)[i] = (float)fp8_value(x, ebits, mbits);
    }
}

/* E4M3 / E5M2 q, k, v: both references read the bytes as the exact values they encode
 * (the naive reference gives bit-identical outputs on the fp8 tensors and on F32 tensors
 * holding those values), and fi_ref_run agrees with it; E2M1 is refused, nothing written. */
static void references_read_fp8_inputs_exactly(void **state) {
    (void)state;
    for (int it = 0; it < 8; it++) {
        const fi_dtype dt = it % 2 ? FI_DTYPE_E5M2 : FI_DTYPE_E4M3;
        batchgen_batch g;
        fi_plan *plan = planned_batch(it % 4 < 2 ? FI_KIND_GQA_DECODE : FI_KIND_CONTEXT, 4, 300, &g);
        tt_test_attn ta;
        assert_int_equal(tt_test_attn_make(&ta, &g.caps, &g.batch, NULL, &g_rng), 0);
        fi_tensor q8, k8, v8, out8, lse8, out_ref, lse_ref;
        fp8_twin(&ta.q_buf, &q8, dt);
        fp8_twin(&ta.k_buf, &k8, dt);
        fp8_twin(&ta.v_buf, &v8, dt);
        fi_attn_args a8 = ta.args;
        a8.q = q8;
        a8.k = k8;
        a8.v = v8;
        assert_int_equal(tt_test_attn_alloc_outputs(&ta, &out8, &lse8), 0);
        assert_int_equal(tt_test_attn_alloc_outputs(&ta, &out_ref, &lse_ref), 0);
        const int64_t rows = g.total_q_tokens;
        /* F32 values through the naive reference */
        tt_tensor_poison(&ta.args.out);
        tt_tensor_poison(&ta.args.lse);
        assert_int_equal(fi_naive_attention(&g.caps, &g.batch, &ta.args), FI_OK);
        /* the same values as fp8 bytes */
        a8.out = out8;
        a8.lse = lse8;
        tt_tensor_poison(&a8.out);
        tt_tensor_poison(&a8.lse);
        assert_int_equal(fi_naive_attention(&g.caps, &g.batch, &a8), FI_OK);
        const size_t ob = (size_t)(out8.shape[1] * out8.shape[2] * rows) * sizeof(float);
        const size_t lb = (size_t)(lse8.shape[1] * rows) * sizeof(float);
        assert_memory_equal(out8.data, ta.args.out.data, ob);
        assert_memory_equal(lse8.data, ta.args.lse.data, lb);
        /* the plan's executor on the fp8 bytes */
        a8.out = out_ref;
        a8.lse = lse_ref;
        tt_tensor_poison(&a8.out);
        tt_tensor_poison(&a8.lse);
        assert_int_equal(fi_ref_run(plan, &a8), FI_OK);
        double err = 1.0, lerr = 1.0;
        assert_int_equal(tt_tensor_compare(&out_ref, &out8, rows, &err), 0);
        assert_int_equal(tt_tensor_compare(&lse_ref, &lse8, rows, &lerr), 0);
        if (!(err < 1e-5 && lerr < 1e-5))
            fail_msg("fp8 %d: fi_ref_run vs naive %g (lse %g) (%s)", (int)dt, err, lerr,
                     batchgen_describe(&g));
        /* NVFP4 is not read by the CPU references */
        a8.k.dtype = FI_DTYPE_E2M1;
        tt_tensor_poison(&a8.out);
        assert_int_equal(fi_ref_run(plan, &a8), FI_ERR_UNSUPPORTED_DTYPE);
        assert_int_equal(fi_naive_attention(&g.caps, &g.batch, &a8), FI_ERR_UNSUPPORTED_DTYPE);
        assert_int_equal(tt_tensor_count_nan(&a8.out, rows), a8.out.shape[1] * a8.out.shape[2] * rows);
        tt_tensor_free(&q8);
        tt_tensor_free(&k8);
        tt_tensor_free(&v8);
        tt_tensor_free(&out8);
        tt_tensor_free(&lse8);
        tt_tensor_free(&out_ref);
        tt_tensor_free(&lse_ref);
        tt_test_attn_free(&ta);
        fi_plan_destroy(plan);
        batchgen_free(&g);
    }
}

/* Memory order is the strides' business only: the same logical KV cache laid out NHD and
 * HND, and the same query and output as differently strided views, give bit-identical
 * outputs from both references. */
static void references_read_every_memory_order_the_same(void **state) {
    (void)state;
    for (int it = 0; it < 6; it++) {
        batchgen_batch g;
        fi_plan *plan = planned_batch((fi_kind)(1 + it % 3), 3, 200, &g);
        const uint64_t s = tt_rng_next(&g_rng);
        tt_test_attn nhd, hnd;
        tt_rng r1 = {s}, r2 = {s};
        const fi_test_attn_opts on = {.hnd = 0}, oh = {.hnd = 1};
        assert_int_equal(tt_test_attn_make(&nhd, &g.caps, &g.batch, &on, &r1), 0);
        assert_int_equal(tt_test_attn_make(&hnd, &g.caps, &g.batch, &oh, &r2), 0);
        /* the same logical values in both caches (a helper-independent copy) */
        assert_int_equal(tt_tensor_convert(&hnd.k_buf, &nhd.k_buf), 0);
        if (nhd.v_buf.data)
            assert_int_equal(tt_tensor_convert(&hnd.v_buf, &nhd.v_buf), 0);
        assert_int_equal(tt_tensor_convert(&hnd.q_buf, &nhd.q_buf), 0);
        const int64_t rows = g.total_q_tokens;
        for (int ref = 0; ref < 2; ref++) {
            tt_tensor_poison(&nhd.args.out);
            tt_tensor_poison(&hnd.args.out);
            tt_tensor_poison(&nhd.args.lse);
            tt_tensor_poison(&hnd.args.lse);
            if (ref) {
                assert_int_equal(fi_ref_run(plan, &nhd.args), FI_OK);
                assert_int_equal(fi_ref_run(plan, &hnd.args), FI_OK);
            } else {
                assert_int_equal(fi_naive_attention(&g.caps, &g.batch, &nhd.args), FI_OK);
                assert_int_equal(fi_naive_attention(&g.caps, &g.batch, &hnd.args), FI_OK);
            }
            assert_int_equal(tt_tensor_count_nan(&nhd.args.out, rows), 0);
            double err = 1.0;
            assert_int_equal(tt_tensor_compare(&hnd.args.out, &nhd.args.out, rows, &err), 0);
            if (err != 0.0)
                fail_msg("%s: NHD and HND differ by %g (%s)", ref ? "fi_ref_run" : "naive", err,
                         batchgen_describe(&g));
            assert_int_equal(tt_tensor_compare(&hnd.args.lse, &nhd.args.lse, rows, &err), 0);
            assert_true(err == 0.0);
        }
        tt_test_attn_free(&nhd);
        tt_test_attn_free(&hnd);
        fi_plan_destroy(plan);
        batchgen_free(&g);
    }
}

int main(void) {
    const uint64_t seed = tt_test_seed();
    printf("test_ref_tensors: seed %llu\n", (unsigned long long)seed);
    g_rng.s = seed;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hnd_tensor_has_head_major_strides),
        cmocka_unit_test(view_last_selects_the_rope_columns),
        cmocka_unit_test(poison_and_finite_checks_count_the_right_rows),
        cmocka_unit_test(compare_reports_norm_error_and_nonfinite_mismatches),
        cmocka_unit_test(attn_make_builds_mla_views_and_scale_pointers),
        cmocka_unit_test(tensor_make_copies_parts_and_keeps_an_oversized_ndim),
        cmocka_unit_test(references_read_fp8_inputs_exactly),
        cmocka_unit_test(references_read_every_memory_order_the_same),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
