/*
 * executor/cuda/common/run_ctx.cuh - per-launch constants every item of a CTA uses,
 * read once after griddepcontrol.wait from the common block and the plan header, and the
 * softmax helpers shared by tile bodies and the split merge.
 */
#pragma once

#include <math_constants.h>

#include "executor/core/exec_params.h"
#include "plan/mask.h"

namespace fi {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct RunCtx {
    float scale_log2;  /* bmm1_scale * log2(e): logits in the exp2 domain */
    float scale2;      /* bmm2_scale */
    int causal;        /* plan header: the mask rule's inputs (plan/mask.h) */
    int window_left;
};

/* Global reads: call after griddepcontrol.wait (scales and header may come from the
 * previous kernel). */
__device__ __forceinline__ RunCtx run_ctx(const fi_exec_common &c) {
    RunCtx ctx;
    ctx.scale_log2 = (c.bmm1_scale_ptr ? *c.bmm1_scale_ptr : c.bmm1_scale) * kLog2e;
    ctx.scale2 = c.bmm2_scale_ptr ? *c.bmm2_scale_ptr : c.bmm2_scale;
    ctx.causal = c.header->causal;
    ctx.window_left = c.header->window_left;
    return ctx;
}

/* Visit a CTA's items in order, each with its request row, the next pair loaded while the
 * current one is visited (a producer's walk; the persistent loop does the same). */
template <class Fn>
__device__ __forceinline__ void for_each_item(const fi_exec_common &c, const fi_cta_start &cs, Fn &&fn) {
    fi_work_item it = cs.first;
    fi_request_info rq = cs.request;
    for (int i = cs.item_begin; i < cs.item_end; ++i) {
        fi_work_item nit = it;
        fi_request_info nrq = rq;
        if (i + 1 < cs.item_end) {
            nit = c.items[i + 1];
            nrq = c.requests[nit.request];
        }
        fn(it, rq);
        it = nit;
        rq = nrq;
    }
}

/* Key bounds [lo, hi] (inclusive) of a thread's two rows r0 and r0 + dr of item it (M
 * rows, nh heads a query row, q-major), clipped to the item's KV range: the mask rule of
 * plan/mask.h; rows past M see nothing. */
__device__ __forceinline__ void row_bounds(const RunCtx &ctx, const fi_work_item &it,
                                           const fi_request_info &rq, int M, int nh, int r0, int dr,
                                           int *lo, int *hi) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = r0 + dr * i;
        lo[i] = 0;
        hi[i] = -1;
        if (r < M) {
            int32_t l, h;
            fi_row_kv_range(ctx.causal, ctx.window_left, rq.q_len, rq.kv_len, it.q_begin + r / nh, &l, &h);
            lo[i] = max(l, it.kv_begin);
            hi[i] = min(h, it.kv_end) - 1;
        }
    }
}

/* log(exp(a) + exp(b)) without overflow; -inf + -inf = -inf (never NaN). */
__device__ __forceinline__ float logaddexp(float a, float b) {
    const float m = fmaxf(a, b);
    if (m == -CUDART_INF_F)
        return -CUDART_INF_F;
    return m + logf(expf(a - m) + expf(b - m));
}

}  // namespace fi
