/*
 * bench/bench_gqa_case.h - a gqa_case (tests/gpu/gqa_gpu_case.h: GQA decode, and context
 * attention through tests/gpu/context_gpu_case.h) as the timing harness of bench_common.h
 * sees it: the device buffers an input set copies (q, the KV cache, NVFP4 scales, out) and
 * fi_run's arguments on one set's copies.  Shared by bench_gqa.c and bench_context.c
 * (header-only, static inline).
 */
#ifndef FI_BENCH_BENCH_GQA_CASE_H
#define FI_BENCH_BENCH_GQA_CASE_H

#include "bench_common.h"
#include "gpu/gqa_gpu_case.h"

/* The buffers an input set copies, in this order (also the order they are allocated in). */
enum { GQA_BUF_Q, GQA_BUF_KV, GQA_BUF_SF, GQA_BUF_OUT };

/* The case's run arguments on one input set's buffers (ctx: the gqa_case). */
static inline fi_attn_args gqa_bench_set_args(const void *ctx, void *const *buf) {
    return gqa_case_args_at((const gqa_case *)ctx, buf[GQA_BUF_Q], buf[GQA_BUF_KV],
                            buf[GQA_BUF_SF], buf[GQA_BUF_OUT]);
}

/* The harness's view of the case: its plan, stream and buffers (NVFP4 scales 0 bytes, so
 * absent, for other KV dtypes; out allocated per set, not copied). */
static inline bench_inputs gqa_bench_inputs(gqa_case *c) {
    bench_inputs in = bench_inputs_make(c->plan, c->stream, gqa_bench_set_args, c);
    bench_inputs_buf(&in, GQA_BUF_Q, c->d_q, (size_t)c->n_q * 2, 1);
    bench_inputs_buf(&in, GQA_BUF_KV, c->d_kv, c->kv_bytes, 1);
    bench_inputs_buf(&in, GQA_BUF_SF, c->d_sf, c->sf_bytes, 1);
    bench_inputs_buf(&in, GQA_BUF_OUT, c->d_out, c->out_bytes, 0);
    return in;
}

#endif /* FI_BENCH_BENCH_GQA_CASE_H */
