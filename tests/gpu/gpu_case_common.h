/*
 * tests/gpu/gpu_case_common.h - what the GPU cases of every family share (header-only,
 * static inline): host conversions between fp32 and the 16-bit and 8/4-bit formats the
 * executors take, random fills, the device probe, message formatting and the CUDA-call
 * macro; and what every case does whatever its inputs look like: make its device plan,
 * poison / run / download its outputs and compare their rows with the fp64 truth; for the
 * device planner, a batch's device arrays (gc_dev_batch) and a plan's bytes compared region
 * by region with a host plan's (gc_plan_compare).
 * Included by mla_gpu_case.h and gqa_gpu_case.h (and through them by the GPU tests and the
 * benches).  Functions return values or 0 / -1 with a message; nothing aborts.
 */
#ifndef FI_TESTS_GPU_GPU_CASE_COMMON_H
#define FI_TESTS_GPU_GPU_CASE_COMMON_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "fiattn.h"
#include "fiattn_run.h"
#include "common/rng.h"

/* ---- 16-bit formats ---------------------------------------------------------------------- */

static inline uint16_t gc_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static inline float gc_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t gc_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                                    /* below 2^-14: subnormal */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f)); /* units of 2^-24, RNE */
    }
    uint32_t h = ((((ax >> 23) - 127u + 15u)) << 10) | ((ax & 0x7fffffu) >> 13);
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* carry may bump the exponent */
    return (uint16_t)(sign | h);
}

static inline float gc_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    uint32_t u = e == 31 ? (sign | 0x7f800000u | (m << 13))
                         : (sign | ((e - 15u + 127u) << 23) | (m << 13));
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* dt: FI_DTYPE_F16, else bf16. */
static inline uint16_t gc_from_f32(fi_dtype dt, float f) {
    return dt == FI_DTYPE_F16 ? gc_f32_to_f16(f) : gc_f32_to_bf16(f);
}
static inline float gc_to_f32(fi_dtype dt, uint16_t h) {
    return dt == FI_DTYPE_F16 ? gc_f16_to_f32(h) : gc_bf16_to_f32(h);
}

/* Fill n 16-bit elements with uniform [-1, 1) values of dtype dt. */
static inline void gc_fill_random(uint16_t *p, int64_t n, fi_dtype dt, tt_rng *rng) {
    for (int64_t i = 0; i < n; i++) p[i] = gc_from_f32(dt, tt_rng_float(rng));
}

/* ---- fp8 e4m3 (OCP "fn": bias 7, no inf, 0x7f / 0xff NaN, max 448) ----------------------- */

/* Exact value of an e4m3 byte (NaN for the two NaN codes). */
static inline float gc_e4m3_to_f32(uint8_t b) {
    const uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
    float f;
    if (e == 15 && m == 7) f = NAN;
    else if (e == 0) f = ldexpf((float)m, -9); /* subnormal: m x 2^-6 / 8 */
    else f = ldexpf((float)(8 + m), (int)e - 10);
    return (b & 0x80u) ? -f : f;
}

/* Nearest e4m3 byte to f, ties to even, saturating at +-448 (NaN in, NaN out). */
static inline uint8_t gc_f32_to_e4m3(float f) {
    if (isnan(f)) return 0x7f;
    const uint8_t sign = signbit(f) ? 0x80u : 0u;
    const float a = fabsf(f);
    if (a >= 448.0f) return (uint8_t)(sign | 0x7e);
    /* binary search over the 127 finite non-negative codes (monotone in the code) */
    uint8_t lo = 0, hi = 0x7e;
    while (hi - lo > 1) {
        const uint8_t mid = (uint8_t)((lo + hi) / 2);
        if (gc_e4m3_to_f32(mid) <= a) lo = mid;
        else hi = mid;
    }
    const float dl = a - gc_e4m3_to_f32(lo), dh = gc_e4m3_to_f32(hi) - a;
    const uint8_t pick = dl < dh ? lo : dh < dl ? hi : ((lo & 1u) ? hi : lo);
    return (uint8_t)(sign | pick);
}

/* Random e4m3 codes with |x| < 2 (exponent field 0..7, subnormals included): every
 * mantissa and binade from 2^-9 to 1.875 occurs, so a dequantisation bug in any of them
 * shows. */
static inline void gc_fill_random_e4m3(uint8_t *p, int64_t n, tt_rng *rng) {
    for (int64_t i = 0; i < n;) {
        uint64_t r = tt_rng_next(rng);
        for (int k = 0; k < 8 && i < n; k++, i++, r >>= 8) p[i] = (uint8_t)(r & 0xbfu);
    }
}

/* Bytes of one element of an input dtype the cases fill: 1 for fp8 e4m3, else 2 (the
 * 16-bit formats). */
static inline int64_t gc_elem_bytes(fi_dtype dt) { return dt == FI_DTYPE_E4M3 ? 1 : 2; }

/* Fill n elements of dtype dt at p: fp8 e4m3 random codes (gc_fill_random_e4m3), else
 * gc_fill_random's 16-bit uniform [-1, 1) values (the same draws as calling it). */
static inline void gc_fill_random_as(void *p, int64_t n, fi_dtype dt, tt_rng *rng) {
    if (dt == FI_DTYPE_E4M3) gc_fill_random_e4m3((uint8_t *)p, n, rng);
    else gc_fill_random((uint16_t *)p, n, dt, rng);
}

/* Short name of a dtype, for case names and logs. */
static inline const char *gc_dtype_name(fi_dtype d) {
    switch (d) {
    case FI_DTYPE_BF16: return "bf16";
    case FI_DTYPE_F16: return "f16";
    case FI_DTYPE_F32: return "f32";
    case FI_DTYPE_E4M3: return "e4m3";
    case FI_DTYPE_E2M1: return "nvfp4";
    default: return "?";
    }
}

/* ---- NVFP4: e2m1 values (two a byte, low nibble first) x e4m3 block scales ---------------- */

static inline float gc_e2m1_to_f32(uint8_t nibble) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float f = mag[nibble & 7u];
    return (nibble & 8u) ? -f : f;
}

/* Element d of a packed e2m1 row. */
static inline float gc_e2m1_at(const uint8_t *row, int64_t d) {
    const uint8_t b = row[d >> 1];
    return gc_e2m1_to_f32((uint8_t)((d & 1) ? b >> 4 : b & 0xfu));
}

/* Random bytes (any two e2m1 values). */
static inline void gc_fill_random_bytes(uint8_t *p, int64_t n, tt_rng *rng) {
    for (int64_t i = 0; i < n;) {
        uint64_t r = tt_rng_next(rng);
        for (int k = 0; k < 8 && i < n; k++, i++, r >>= 8) p[i] = (uint8_t)r;
    }
}

/* Random positive e4m3 block scales in [2^-4, 0.5] (so a block's values reach +-3). */
static inline void gc_fill_random_e4m3_scales(uint8_t *p, int64_t n, tt_rng *rng) {
    for (int64_t i = 0; i < n; i++) p[i] = (uint8_t)tt_rng_int(rng, 0x18, 0x30);
}

/* ---- device, messages ----------------------------------------------------------------------- */

/* 1 when a CUDA device is usable (tests skip, benches exit 0, otherwise). */
static inline int gc_gpu_available(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static inline void gc_msg(char *msg, size_t cap, const char *fmt, ...) {
    if (!msg || !cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
}

/* Evaluate a CUDA call; on failure write the message and return -1 from the caller. */
#define GC_CUDA(call, msg, cap)                                                             \
    do {                                                                                    \
        cudaError_t gc_e_ = (call);                                                         \
        if (gc_e_ != cudaSuccess) {                                                         \
            gc_msg((msg), (cap), "%s:%d %s -> %s", __FILE__, __LINE__, #call,               \
                   cudaGetErrorString(gc_e_));                                              \
            return -1;                                                                      \
        }                                                                                   \
    } while (0)

/* ---- what every case does with its plan and outputs --------------------------------------- */

/* The device plan of a case: the workspace for caps cudaMalloc'd into *ws (*ws_bytes), the
 * plan created into *plan and updated for batch on stream.  On failure the message names
 * the call (ws_note follows fi_workspace_size's status: "" or the family's details); what
 * was made is left in *ws / *plan for the case's free. */
static inline int gc_plan_make(const fi_caps *caps, const fi_batch *batch, cudaStream_t stream,
                               void **ws, size_t *ws_bytes, fi_plan **plan, const char *ws_note,
                               char *msg, size_t cap) {
    fi_status st = fi_workspace_size(caps, ws_bytes);
    if (st != FI_OK) {
        gc_msg(msg, cap, "fi_workspace_size: %s%s", fi_status_name(st), ws_note);
        return -1;
    }
    if (cudaMalloc(ws, *ws_bytes) != cudaSuccess) {
        gc_msg(msg, cap, "cudaMalloc workspace %zu bytes failed", *ws_bytes);
        return -1;
    }
    st = fi_plan_create(caps, *ws, *ws_bytes, NULL, plan);
    if (st != FI_OK) {
        gc_msg(msg, cap, "fi_plan_create: %s", fi_status_name(st));
        return -1;
    }
    st = fi_plan_update(*plan, batch, stream);
    if (st != FI_OK) {
        fi_error_detail d = fi_plan_error(*plan);
        gc_msg(msg, cap, "fi_plan_update: %s (request %d needed %lld limit %lld)",
               fi_status_name(st), d.request, (long long)d.needed, (long long)d.limit);
        return -1;
    }
    return 0;
}

/* The device buffers every case has besides its inputs, allocated in this order (after
 * the inputs, as the cases always did): the page table (pt_len ints, at least one), out,
 * lse, sinks [heads] (also without sinks: the bad-argument tests point at them) and the
 * two scales. */
static inline int gc_alloc_case_buffers(int32_t **d_pt, int64_t pt_len, void **d_out,
                                        size_t out_bytes, void **d_lse, size_t lse_bytes,
                                        float **d_sinks, int64_t heads, float **d_scales,
                                        char *msg, size_t cap) {
    GC_CUDA(cudaMalloc((void **)d_pt, (size_t)(pt_len > 0 ? pt_len : 1) * 4), msg, cap);
    GC_CUDA(cudaMalloc(d_out, out_bytes), msg, cap);
    GC_CUDA(cudaMalloc(d_lse, lse_bytes), msg, cap);
    GC_CUDA(cudaMalloc((void **)d_sinks, sizeof(float) * (size_t)heads), msg, cap);
    GC_CUDA(cudaMalloc((void **)d_scales, 2 * sizeof(float)), msg, cap);
    return 0;
}

/* A case's device outputs and their host copies: out (any dtype) and lse (fp32). */
typedef struct gc_outputs {
    void *d_out, *d_lse, *h_out, *h_lse;
    size_t out_bytes, lse_bytes;
} gc_outputs;

/* Poison out and lse (0xff bytes: NaN in every output dtype) on stream. */
static inline int gc_poison(const gc_outputs *o, cudaStream_t stream, char *msg, size_t cap) {
    GC_CUDA(cudaMemsetAsync(o->d_out, 0xff, o->out_bytes, stream), msg, cap);
    GC_CUDA(cudaMemsetAsync(o->d_lse, 0xff, o->lse_bytes, stream), msg, cap);
    return 0;
}

/* Poison, fi_run with a, synchronise.  0 on success; the message names fi_run's status. */
static inline int gc_run_args(const gc_outputs *o, fi_plan *plan, cudaStream_t stream,
                              const fi_attn_args *a, char *msg, size_t cap) {
    if (gc_poison(o, stream, msg, cap)) return -1;
    fi_status st = fi_run(plan, a, stream);
    if (st != FI_OK) {
        gc_msg(msg, cap, "fi_run: %s (cuda %d)", fi_status_name(st), fi_plan_error(plan).cuda_error);
        return -1;
    }
    GC_CUDA(cudaStreamSynchronize(stream), msg, cap);
    return 0;
}

/* Copy the device outputs to their host copies. */
static inline int gc_download(const gc_outputs *o, char *msg, size_t cap) {
    GC_CUDA(cudaMemcpy(o->h_out, o->d_out, o->out_bytes, cudaMemcpyDeviceToHost), msg, cap);
    GC_CUDA(cudaMemcpy(o->h_lse, o->d_lse, o->lse_bytes, cudaMemcpyDeviceToHost), msg, cap);
    return 0;
}

/* What the row comparison reads of a case: the batch's rows, the downloaded output
 * (through value: element i of out [tokens, H, D] as the attention value) and lse, the
 * fp32 truth.  kv_group > 0 names each head's KV head in messages (GQA). */
typedef struct gc_rows {
    const int32_t *q_lens, *kv_lens, *q_offset;
    int64_t heads, dim, kv_group;
    double (*value)(const void *ctx, int64_t i);
    const void *ctx;
    const float *h_lse, *ref_out, *ref_lse;
    int return_lse;
    double lse_tol; /* absolute: an lse off by e scales a merged partial by exp(e) */
} gc_rows;

/* "request b q row i head h" (+ " (kv head k)" under a group) for the messages. */
static inline void gc_row_where(const gc_rows *r, int32_t b, int32_t i, int64_t h, char *buf,
                                size_t cap) {
    int n = snprintf(buf, cap, "request %d q row %d head %lld", b, i, (long long)h);
    if (r->kv_group > 0 && n > 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, " (kv head %lld)", (long long)(h / r->kv_group));
}

/* Row (token t of request b, row i; head h) of out against ref_out: ||out - ref|| / ||ref||
 * (||out|| where the reference is zero) into *rel; -1 and a message on a non-finite
 * element, on rel > tol, or on a non-zero row where the reference is zero. */
static inline int gc_compare_out_row(const gc_rows *r, int32_t b, int32_t i, int64_t t,
                                     int64_t h, double tol, double *rel, char *msg, size_t cap) {
    const int64_t base = (t * r->heads + h) * r->dim;
    const float *ref = r->ref_out + base;
    char where[96];
    double dd = 0.0, rr = 0.0, oo = 0.0;
    for (int64_t d = 0; d < r->dim; d++) {
        const double x = r->value(r->ctx, base + d);
        if (isnan(x) || isinf(x)) {
            gc_row_where(r, b, i, h, where, sizeof where);
            gc_msg(msg, cap, "%s dim %lld: %g (NaN poison not overwritten or bad value); "
                   "kv_len %d", where, (long long)d, x, r->kv_lens[b]);
            return -1;
        }
        dd += (x - ref[d]) * (x - ref[d]);
        rr += (double)ref[d] * ref[d];
        oo += x * x;
    }
    *rel = rr > 0.0 ? sqrt(dd / rr) : sqrt(oo);
    if (*rel > tol || (rr == 0.0 && oo != 0.0)) {
        gc_row_where(r, b, i, h, where, sizeof where);
        gc_msg(msg, cap, "%s: rel err %.3e > %.1e (|ref| %.3e |out| %.3e) kv_len %d q_len %d",
               where, *rel, tol, sqrt(rr), sqrt(oo), r->kv_lens[b], r->q_lens[b]);
        return -1;
    }
    return 0;
}

/* lse of token t, head h against the truth: -inf exactly where the reference is -inf,
 * else within lse_tol; the error into *err (0 for -inf rows). */
static inline int gc_compare_lse(const gc_rows *r, int32_t b, int32_t i, int64_t t, int64_t h,
                                 double *err, char *msg, size_t cap) {
    const double l = r->h_lse[t * r->heads + h], lr = r->ref_lse[t * r->heads + h];
    *err = 0.0;
    if (isinf(lr) && lr < 0) {
        if (!(isinf(l) && l < 0)) {
            gc_msg(msg, cap, "request %d q row %d head %lld: lse %g, want -inf", b, i,
                   (long long)h, l);
            return -1;
        }
        return 0;
    }
    const double e = fabs(l - lr);
    if (isnan(l) || e > r->lse_tol) {
        gc_msg(msg, cap, "request %d q row %d head %lld: lse %g ref %g (err %.3e)", b, i,
               (long long)h, l, lr, e);
        return -1;
    }
    *err = e;
    return 0;
}

/* Compare the rows of requests [b0, b1) with the truth (out within tol per row, lse when
 * returned).  *worst_out / *worst_lse (may be NULL): raised to the largest errors seen.  0
 * if every row passes, else -1 and the first bad row in msg. */
static inline int gc_compare_rows(const gc_rows *r, int32_t b0, int32_t b1, double tol,
                                  double *worst_out, double *worst_lse, char *msg, size_t cap) {
    double wo = 0.0, wl = 0.0;
    for (int32_t b = b0; b < b1; b++)
        for (int32_t i = 0; i < r->q_lens[b]; i++) {
            const int64_t t = r->q_offset[b] + i;
            for (int64_t h = 0; h < r->heads; h++) {
                double rel = 0.0, e = 0.0;
                if (gc_compare_out_row(r, b, i, t, h, tol, &rel, msg, cap)) return -1;
                if (rel > wo) wo = rel;
                if (!r->return_lse) continue;
                if (gc_compare_lse(r, b, i, t, h, &e, msg, cap)) return -1;
                if (e > wl) wl = e;
            }
        }
    if (worst_out && wo > *worst_out) *worst_out = wo;
    if (worst_lse && wl > *worst_lse) *worst_lse = wl;
    return 0;
}

/* The plan's group and item counts (-1 without a plan) and the batch's longest kv_len, for
 * the case names. */
/* Row (token tok, head h) of D outputs, read through value(ctx, element), against the
 * reference (ref_out / ref_lse, H heads a token) under fiattn_run.h's non-finite policy:
 * the same elements NaN, the same infinities, the finite ones within tol (relative 2-norm
 * over them), lse NaN alike and otherwise within lse_tol.  0, or -1 and the first
 * difference in msg. */
static inline int gc_compare_nonfinite_row(double (*value)(const void *, int64_t), const void *ctx,
                                           const float *lse, const float *ref_out,
                                           const float *ref_lse, int64_t H, int64_t D, int64_t tok,
                                           int64_t h, double tol, double lse_tol, char *msg,
                                           size_t cap) {
    const int64_t base = (tok * H + h) * D;
    double num = 0, den = 0;
    for (int64_t d = 0; d < D; d++) {
        const double g = value(ctx, base + d), r = ref_out[base + d];
        if (isnan(g) != isnan(r) || isinf(g) != isinf(r) || (isinf(g) && (g > 0) != (r > 0))) {
            gc_msg(msg, cap, "token %lld head %lld dim %lld: GPU %g, reference %g", (long long)tok,
                   (long long)h, (long long)d, g, r);
            return -1;
        }
        if (isfinite(r)) {
            num += (g - r) * (g - r);
            den += r * r;
        }
    }
    if (den > 0 && sqrt(num / den) > tol) {
        gc_msg(msg, cap, "token %lld head %lld: finite dims off by %g", (long long)tok,
               (long long)h, sqrt(num / den));
        return -1;
    }
    const double gl = lse[tok * H + h], rl = ref_lse[tok * H + h];
    if (isnan(gl) != isnan(rl) || (isfinite(rl) && fabs(gl - rl) > lse_tol)) {
        gc_msg(msg, cap, "token %lld head %lld: lse GPU %g, reference %g", (long long)tok,
               (long long)h, gl, rl);
        return -1;
    }
    return 0;
}

static inline void gc_plan_counts(const fi_plan *plan, const int32_t *kv_lens, int32_t B,
                                  int *groups, int *items, int32_t *max_kv) {
    fi_plan_view v;
    *groups = *items = -1;
    if (plan && fi_plan_get_view(plan, &v) == FI_OK) {
        *groups = v.header->num_groups;
        *items = v.header->num_items;
    }
    *max_kv = 0;
    for (int32_t b = 0; b < B; b++)
        if (kv_lens[b] > *max_kv) *max_kv = kv_lens[b];
}

/* GC_CUDA for a case's init: on failure write the message and jump to the caller's
 * cleanup label (which frees what was allocated so far). */
#define GC_CUDA_OR_GOTO(call, msg, cap, label)                                              \
    do {                                                                                    \
        cudaError_t gc_e_ = (call);                                                         \
        if (gc_e_ != cudaSuccess) {                                                         \
            gc_msg((msg), (cap), "%s -> %s", #call, cudaGetErrorString(gc_e_));             \
            goto label;                                                                     \
        }                                                                                   \
    } while (0)

/* ---- device planning (fi_plan_update_device): a batch's device arrays, plan bytes -------- */

/* The device copy of a batch for fi_plan_update_device: the form's arrays at the capacity
 * B_max (a host fi_batch whose batch_size is B_max) and the step's B in d_bs.  The page
 * table is the caller's device buffer (the one fi_run's page_table tensor names: the plan
 * reads it at run time) or one owned and grown here. */
typedef struct gc_dev_batch {
    int32_t *d_bs;         /* [1] the step's B */
    int32_t *d_lens;       /* [B_max] seq_lens (BLOCK_TABLES) or kv_len (INDPTR) */
    int32_t *d_qo, *d_kvp; /* [B_max + 1] qo_indptr, kv_indptr (INDPTR only) */
    int32_t *d_pt;         /* block_tables [B_max, (2,) P] or kv_indices */
    int own_pt;            /* 1: d_pt allocated here */
    int64_t n_lens, n_pt;  /* elements allocated: d_lens (d_qo, d_kvp: one more), owned d_pt */
} gc_dev_batch;

/* Start empty over the caller's page table d_pt (NULL: own one). */
static inline void gc_dev_batch_init(gc_dev_batch *d, int32_t *d_pt) {
    memset(d, 0, sizeof *d);
    d->d_pt = d_pt;
    d->own_pt = d_pt == NULL;
}

static inline void gc_dev_batch_free(gc_dev_batch *d) {
    cudaFree(d->d_bs);
    cudaFree(d->d_lens);
    cudaFree(d->d_qo);
    cudaFree(d->d_kvp);
    if (d->own_pt) cudaFree(d->d_pt);
    memset(d, 0, sizeof *d);
}

/* Room for B_max requests and (owned table) pt_len entries; a buffer that grows is freed
 * and allocated again (a device synchronisation: never inside a capture). */
static inline int gc_dev_batch_reserve(gc_dev_batch *d, int64_t B_max, int64_t pt_len, char *msg,
                                       size_t cap) {
    if (!d->d_bs) GC_CUDA(cudaMalloc((void **)&d->d_bs, sizeof(int32_t)), msg, cap);
    if (!d->d_lens || B_max > d->n_lens) {
        const int64_t n = B_max > 0 ? B_max : 1;
        cudaFree(d->d_lens);
        cudaFree(d->d_qo);
        cudaFree(d->d_kvp);
        d->d_lens = d->d_qo = d->d_kvp = NULL;
        d->n_lens = 0;
        GC_CUDA(cudaMalloc((void **)&d->d_lens, sizeof(int32_t) * (size_t)n), msg, cap);
        GC_CUDA(cudaMalloc((void **)&d->d_qo, sizeof(int32_t) * (size_t)(n + 1)), msg, cap);
        GC_CUDA(cudaMalloc((void **)&d->d_kvp, sizeof(int32_t) * (size_t)(n + 1)), msg, cap);
        d->n_lens = n;
    }
    if (d->own_pt && (!d->d_pt || pt_len > d->n_pt)) {
        const int64_t n = pt_len > 0 ? pt_len : 1;
        cudaFree(d->d_pt);
        d->d_pt = NULL;
        d->n_pt = 0;
        GC_CUDA(cudaMalloc((void **)&d->d_pt, sizeof(int32_t) * (size_t)n), msg, cap);
        d->n_pt = n;
    }
    return 0;
}

/* Copy hb's arrays (hb->batch_size = B_max requests; pt_len entries of its page table: the
 * host array's length, never taken from a kv_indptr a test may have broken) and the step's
 * B to the device on stream, as an engine's own kernels write them before a replay.  The
 * sources are pageable: each cudaMemcpyAsync has read its source when it returns. */
static inline int gc_dev_batch_upload(gc_dev_batch *d, const fi_batch *hb, int64_t pt_len,
                                      int32_t step_b, cudaStream_t stream, char *msg,
                                      size_t cap) {
    const int64_t B = hb->batch_size, pt = pt_len;
    const int indptr = hb->form == FI_FORM_INDPTR;
    const enum cudaMemcpyKind h2d = cudaMemcpyHostToDevice;
    if (gc_dev_batch_reserve(d, B, pt, msg, cap)) return -1;
    GC_CUDA(cudaMemcpyAsync(d->d_bs, &step_b, sizeof step_b, h2d, stream), msg, cap);
    if (B > 0)
        GC_CUDA(cudaMemcpyAsync(d->d_lens, indptr ? hb->kv_len : hb->seq_lens,
                                sizeof(int32_t) * (size_t)B, h2d, stream), msg, cap);
    if (indptr) {
        GC_CUDA(cudaMemcpyAsync(d->d_qo, hb->qo_indptr, sizeof(int32_t) * (size_t)(B + 1), h2d,
                                stream), msg, cap);
        GC_CUDA(cudaMemcpyAsync(d->d_kvp, hb->kv_indptr, sizeof(int32_t) * (size_t)(B + 1), h2d,
                                stream), msg, cap);
    }
    if (pt > 0)
        GC_CUDA(cudaMemcpyAsync(d->d_pt, indptr ? hb->kv_indices : hb->block_tables,
                                sizeof(int32_t) * (size_t)pt, h2d, stream), msg, cap);
    return 0;
}

/* The fi_device_batch over d: hb's form and scalars (hb->batch_size = B_max), d's arrays,
 * the step's B read from d_bs (use_bs) or B_max every step (use_bs 0: NULL). */
static inline fi_device_batch gc_dev_batch_describe(const gc_dev_batch *d, const fi_batch *hb,
                                                    int use_bs, int32_t max_q_tokens,
                                                    int32_t kv_indices_len) {
    fi_device_batch db;
    memset(&db, 0, sizeof db);
    db.batch = *hb;
    db.batch.block_tables = db.batch.seq_lens = db.batch.qo_indptr = db.batch.kv_indptr = NULL;
    db.batch.kv_indices = db.batch.kv_len = NULL;
    db.batch.cum_seq_lens_q = db.batch.cum_seq_lens_kv = NULL;
    if (hb->form == FI_FORM_INDPTR) {
        db.batch.qo_indptr = d->d_qo;
        db.batch.kv_indptr = d->d_kvp;
        db.batch.kv_indices = d->d_pt;
        db.batch.kv_len = d->d_lens;
    } else {
        db.batch.block_tables = d->d_pt;
        db.batch.seq_lens = d->d_lens;
    }
    db.batch_size = use_bs ? d->d_bs : NULL;
    db.max_q_tokens = max_q_tokens;
    db.kv_indices_len = kv_indices_len;
    return db;
}

/* A region of the plan a planner defines: byte offset in the plan region, entry size,
 * entries (the padding between regions, which no planner writes, is left out). */
typedef struct gc_plan_region {
    const char *name;
    size_t off, size, count;
} gc_plan_region;

#define GC_PLAN_REGIONS 6

/* The regions of the plan of host view v, located from the view's pointers (the header is
 * at offset 0 of the plan region, laid out alike in staging and in the workspace): header,
 * work_indptr [num_ctas + 1], cta_starts [num_ctas], requests [max_batch] (zero past the
 * batch), groups [num_ctas - 1] (the bound C of docs/DESIGN.md section 5: zero past
 * num_groups; never past the room before the items), items [num_items]. */
static inline void gc_plan_regions(const fi_plan_view *v, int32_t max_batch,
                                   gc_plan_region r[GC_PLAN_REGIONS]) {
    const unsigned char *base = (const unsigned char *)v->header;
    const size_t off_groups = (size_t)((const unsigned char *)v->groups - base);
    const size_t off_items = (size_t)((const unsigned char *)v->items - base);
    size_t groups = v->num_ctas > 1 ? (size_t)v->num_ctas - 1 : 0;
    if (groups < (size_t)v->header->num_groups) groups = (size_t)v->header->num_groups;
    if (groups > (off_items - off_groups) / sizeof(fi_merge_group))
        groups = (off_items - off_groups) / sizeof(fi_merge_group);
    const gc_plan_region all[GC_PLAN_REGIONS] = {
        {"header", 0, sizeof(fi_plan_header), 1},
        {"work_indptr", (size_t)((const unsigned char *)v->work_indptr - base), sizeof(int32_t),
         (size_t)v->num_ctas + 1},
        {"cta_starts", (size_t)((const unsigned char *)v->cta_starts - base),
         sizeof(fi_cta_start), (size_t)v->num_ctas},
        {"requests", (size_t)((const unsigned char *)v->requests - base),
         sizeof(fi_request_info), (size_t)max_batch},
        {"groups", off_groups, sizeof(fi_merge_group), groups},
        {"items", off_items, sizeof(fi_work_item), (size_t)v->header->num_items},
    };
    memcpy(r, all, sizeof all);
}

/* Bytes of the plan region through the last used item (what fi_plan_update copies). */
static inline size_t gc_plan_used_bytes(const fi_plan_view *v) {
    return (size_t)((const unsigned char *)v->items - (const unsigned char *)v->header) +
           sizeof(fi_work_item) * (size_t)v->header->num_items;
}

/* The int32 words of one entry, "[a b c ...]", for the messages. */
static inline void gc_plan_words(const unsigned char *p, size_t bytes, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i + 4 <= bytes && n + 16 < cap; i += 4) {
        int32_t w;
        memcpy(&w, p + i, 4);
        n += (size_t)snprintf(buf + n, cap - n, "%s%d", i ? " " : "[", w);
    }
    if (n + 2 < cap) snprintf(buf + n, cap - n, "]");
}

/* Compare, region by region, the plan of host view v (a plan of the same caps and
 * num_ctas) with dev, a copy of a device workspace's first gc_plan_used_bytes(v) bytes.
 * 0, or -1 and the first difference in msg: region, entry, byte, plan offset and both
 * entries as int32 words. */
static inline int gc_plan_compare(const fi_plan_view *v, int32_t max_batch,
                                  const unsigned char *dev, char *msg, size_t cap) {
    gc_plan_region r[GC_PLAN_REGIONS];
    gc_plan_regions(v, max_batch, r);
    const unsigned char *host = (const unsigned char *)v->header;
    for (int k = 0; k < GC_PLAN_REGIONS; k++) {
        const unsigned char *h = host + r[k].off, *d = dev + r[k].off;
        const size_t n = r[k].size * r[k].count;
        if (memcmp(h, d, n) == 0) continue;
        size_t i = 0;
        while (h[i] == d[i]) i++;
        const size_t e = i / r[k].size;
        char hw[256], dw[256];
        gc_plan_words(h + e * r[k].size, r[k].size, hw, sizeof hw);
        gc_plan_words(d + e * r[k].size, r[k].size, dw, sizeof dw);
        gc_msg(msg, cap, "plan bytes differ: %s[%zu] (of %zu), byte %zu of the entry, plan "
               "offset %zu: host %s device %s", r[k].name, e, r[k].count, i % r[k].size,
               r[k].off + i, hw, dw);
        return -1;
    }
    return 0;
}

/* Copy the first `bytes` of a device workspace into *buf (grown to fit; *buf_bytes its
 * size), after the work already queued (a synchronous copy). */
static inline int gc_plan_download(const void *workspace, size_t bytes, unsigned char **buf,
                                   size_t *buf_bytes, char *msg, size_t cap) {
    if (bytes > *buf_bytes) {
        unsigned char *nb = (unsigned char *)realloc(*buf, bytes);
        if (!nb) {
            gc_msg(msg, cap, "host allocation failed (%zu bytes)", bytes);
            return -1;
        }
        *buf = nb;
        *buf_bytes = bytes;
    }
    GC_CUDA(cudaMemcpy(*buf, workspace, bytes, cudaMemcpyDeviceToHost), msg, cap);
    return 0;
}

#endif /* FI_TESTS_GPU_GPU_CASE_COMMON_H */
