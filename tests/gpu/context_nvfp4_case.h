/*
 * tests/gpu/context_nvfp4_case.h - NVFP4 output of a context case (fi_attn_args.o_sf,
 * caps.o_dtype E2M1; the format: include/fiattn_run.h) for tests/gpu/test_context_gpu.c:
 * the run, and its check against the fp64 reference of context_gpu_case.h.
 *
 * Buffers: the case is a ctx_case built with o_dtype E2M1 (its plan's caps), so its d_out
 * holds tokens x H_q x D x 2 bytes; the NVFP4 out takes the first T H D / 2 (the codes,
 * [T, H_q, D / 2]) and the next T H D / 16 (the scales, [T, H_q, D / 16]); the rest stays
 * poison and must stay so.  The case's poison, download and untouched checks then cover
 * all of it.
 *
 * Check of every checked row (token, head), a 16-element block at a time (x_i the fp64
 * reference, s the GPU's scale, g = o_sf_scale, d_i = e2m1(code_i) s / g):
 *   - the quantisation bound: |d_i - x_i| <= max(s / g, |x_i|) / 4 + 1.25 e, with
 *     e = NVFP4_TOL_ACC x amax(|x|): half an e2m1 step of the value the GPU quantised,
 *     which differs from x_i by its bf16 / fp16 accumulation error e (the bound holds for
 *     that value; moving it to x_i costs e, and its scale part e / 4);
 *   - the scale: s within 2^-4 (e4m3's half step) + NVFP4_TOL_ACC of (amax / 6) g, relative;
 *   - bit agreement with a host quantisation of float(x_i) by the same recipe: the scale
 *     bytes of at most NVFP4_MAX_SCALE_FLIPS of the blocks, and the codes of at most
 *     NVFP4_MAX_CODE_FLIPS of the elements of the agreeing blocks, may differ (values
 *     within the accumulation error of a rounding boundary); a code that differs must be
 *     a neighbour (magnitudes one step apart, or both within one step of zero).
 * The caller's scale keeps (amax / 6) g in e4m3's normal range for non-empty blocks.
 */
#ifndef FI_TESTS_GPU_CONTEXT_NVFP4_CASE_H
#define FI_TESTS_GPU_CONTEXT_NVFP4_CASE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gpu/context_gpu_case.h"

#define NVFP4_TOL_ACC 2e-2          /* the GPU's pre-quantisation error, x block amax */
#define NVFP4_MAX_SCALE_FLIPS 0.05  /* fraction of blocks */
#define NVFP4_MAX_CODE_FLIPS 0.03   /* fraction of the elements of agreeing blocks */

/* Host copy of the device's NVFP4 recipe (executor/cuda/common/dtype.cuh), fp32 steps in
 * the same order: the e2m1 code of v (sign bit 3), ties to the even code, saturating. */
static inline uint8_t nv4_e2m1_code(float v) {
    const float a = fabsf(v);
    const uint8_t m = (uint8_t)((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) +
                                (a > 2.5f) + (a >= 3.5f) + (a > 5.0f));
    return (uint8_t)(m | (signbit(v) ? 8u : 0u));
}

/* Host quantisation of one block x[16] under g: the scale byte, codes into q[16]. */
static inline uint8_t nv4_quantise_block(const float *x, float g, uint8_t *q) {
    float amax = 0.0f;
    for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(x[i]));
    const volatile float pre = (amax / 6.0f) * g; /* two roundings, as the device */
    const uint8_t s = gc_f32_to_e4m3(pre);
    const float sf = gc_e4m3_to_f32(s);
    const volatile float mul = sf == 0.0f ? 0.0f : g / sf;
    for (int i = 0; i < 16; i++) q[i] = nv4_e2m1_code(x[i] * mul);
    return s;
}

/* fi_run's arguments for the NVFP4 out of case c (buffers in the file comment). */
static inline fi_attn_args nv4_args(const gqa_case *c, float g, int32_t vec_size) {
    fi_attn_args a = gqa_case_args(c);
    const int64_t T = c->tokens, H = c->o.heads_q, D = c->o.head_dim;
    int64_t os[3] = {T, H, D / 2}, ost[3] = {H * D / 2, D / 2, 1};
    int64_t ss[3] = {T, H, D / 16}, sst[3] = {H * D / 16, D / 16, 1};
    a.out = fi_tensor_make(c->d_out, FI_DTYPE_E2M1, 3, os, ost);
    a.o_sf = fi_tensor_make((uint8_t *)c->d_out + T * H * D / 2, FI_DTYPE_E4M3, 3, ss, sst);
    a.o_sf_scale = g;
    a.o_sf_vec_size = vec_size;
    return a;
}

/* The codes and scales of the downloaded out (h_out). */
static inline const uint8_t *nv4_codes(const gqa_case *c) { return (const uint8_t *)c->h_out; }
static inline const uint8_t *nv4_scales(const gqa_case *c) {
    return (const uint8_t *)c->h_out + (int64_t)c->tokens * c->o.heads_q * c->o.head_dim / 2;
}

/* Figures of one comparison, for the log and the caller's assertions. */
typedef struct nv4_stats {
    int64_t blocks, scale_flips, elems, code_flips;
    double worst; /* largest |d - x| / bound */
} nv4_stats;

/* Magnitude codes a and b (3 bits) are neighbours: one step apart, or both <= 1. */
static inline int nv4_neighbours(uint8_t a, uint8_t b) {
    const int ma = a & 7, mb = b & 7;
    if (ma <= 1 && mb <= 1) return 1;
    return (a & 8) == (b & 8) && (ma - mb == 1 || mb - ma == 1);
}

/* Check one block: row r (token t, head h) block k of the downloaded out against x[16]. */
static inline int nv4_check_block(const gqa_case *c, int64_t t, int64_t h, int64_t k,
                                  const float *x, float g, nv4_stats *st, char *msg, size_t cap) {
    const int64_t H = c->o.heads_q, D = c->o.head_dim, row = t * H + h;
    const uint8_t sb = nv4_scales(c)[row * (D / 16) + k];
    const uint8_t *codes = nv4_codes(c) + row * (D / 2) + 8 * k;
    const double s = gc_e4m3_to_f32(sb);
    double amax = 0.0;
    for (int i = 0; i < 16; i++) amax = fmax(amax, fabs((double)x[i]));
    const double want = amax / 6.0 * g;
    if (isnan(s) || (want >= 0x1p-6 && want <= 448.0 &&
                     fabs(s - want) > (0.0625 + NVFP4_TOL_ACC) * want) ||
        (amax == 0.0 && s != 0.0)) {
        gc_msg(msg, cap, "token %lld head %lld block %lld: scale %g (byte 0x%02x), want ~%g "
               "(amax %g x g %g / 6)", (long long)t, (long long)h, (long long)k, s, sb, want,
               amax, g);
        return -1;
    }
    uint8_t q[16];
    const uint8_t sh = nv4_quantise_block(x, g, q);
    st->blocks++;
    st->scale_flips += sh != sb;
    const double e = NVFP4_TOL_ACC * amax;
    for (int i = 0; i < 16; i++) {
        const uint8_t code = (uint8_t)((codes[i >> 1] >> (4 * (i & 1))) & 0xfu);
        const double d = gc_e2m1_to_f32(code) * s / g;
        /* below e4m3's smallest scale the block may be all zeros (s = 0) */
        const double bound = fmax(s / g, fabs((double)x[i])) / 4.0 + 1.25 * e + 1e-30 +
                             (want < 0x1p-9 ? amax : 0.0);
        const double err = fabs(d - (double)x[i]);
        if (!(err <= bound)) {
            gc_msg(msg, cap, "token %lld head %lld dim %lld: NVFP4 %g (code 0x%x x scale %g / "
                   "g %g), ref %g: error %.3g > bound %.3g", (long long)t, (long long)h,
                   (long long)(16 * k + i), d, code, s, g, x[i], err, bound);
            return -1;
        }
        if (err / bound > st->worst) st->worst = err / bound;
        if (sh == sb) {
            st->elems++;
            if (code != q[i]) {
                st->code_flips++;
                if (!nv4_neighbours(code, q[i])) {
                    gc_msg(msg, cap, "token %lld head %lld dim %lld: code 0x%x, the host's "
                           "quantisation of ref %g gives 0x%x (scale 0x%02x both)",
                           (long long)t, (long long)h, (long long)(16 * k + i), code, x[i],
                           q[i], sb);
                    return -1;
                }
            }
        }
    }
    return 0;
}

/* The downloaded NVFP4 out of a ctx_case (o_dtype E2M1) against the fp64 truth of its
 * checked blocks (ctx_case_reference first): every scale byte finite (all rows: poison
 * 0xff is e4m3 NaN), every lse of every row finite or -inf as its request allows, each
 * checked row's blocks by nv4_check_block and its lse within GQA_TOL_LSE; then the flip
 * fractions.  Figures into *st.  0, or -1 and a message. */
static inline int nv4_compare(const ctx_case *x, float g, nv4_stats *st, char *msg, size_t cap) {
    const gqa_case *c = &x->g;
    const int64_t H = c->o.heads_q, D = c->o.head_dim;
    memset(st, 0, sizeof *st);
    const uint8_t *sf = nv4_scales(c);
    for (int32_t b = 0; b < c->B; b++)
        for (int32_t i = 0; i < c->fb.q_lens[b]; i++) {
            const int64_t t = (int64_t)c->q_offset[b] + i;
            for (int64_t k = t * H * (D / 16); k < (t + 1) * H * (D / 16); k++)
                if ((sf[k] & 0x7fu) == 0x7fu) {
                    gc_msg(msg, cap, "request %d q row %d head %lld block %lld: scale byte "
                           "0x%02x (NaN: poison left)", b, i, (long long)(k / (D / 16) % H),
                           (long long)(k % (D / 16)), sf[k]);
                    return -1;
                }
        }
    const gc_rows r = {c->fb.q_lens, c->fb.kv_lens, c->q_offset, H, D, H / c->o.heads_kv,
                       NULL, c, c->h_lse, c->ref_out, c->ref_lse, c->o.return_lse, GQA_TOL_LSE};
    for (int32_t n = 0; n < x->n_blocks; n++) {
        const ctx_block *bl = &x->blocks[n];
        for (int32_t i = bl->i0; i < bl->i1; i++)
            for (int64_t h = 0; h < H; h++) {
                const int64_t t = (int64_t)c->q_offset[bl->b] + i;
                for (int64_t k = 0; k < D / 16; k++)
                    if (nv4_check_block(c, t, h, k, c->ref_out + (t * H + h) * D + 16 * k, g,
                                        st, msg, cap))
                        return -1;
                double e = 0;
                if (c->o.return_lse && gc_compare_lse(&r, bl->b, i, t, h, &e, msg, cap))
                    return -1;
            }
    }
    if (c->o.return_lse) { /* every row's lse written (coverage, as ctx_check_coverage) */
        for (int32_t b = 0; b < c->B; b++) {
            const int finite = c->fb.kv_lens[b] > 0 || c->o.sinks;
            for (int32_t i = 0; i < c->fb.q_lens[b]; i++)
                for (int64_t h = 0; h < H; h++) {
                    const float l = c->h_lse[((int64_t)c->q_offset[b] + i) * H + h];
                    if (finite ? !isfinite(l) : !(isinf(l) && l < 0)) {
                        gc_msg(msg, cap, "request %d q row %d head %lld: lse %g, want %s", b,
                               i, (long long)h, l, finite ? "finite" : "-inf");
                        return -1;
                    }
                }
        }
    }
    if (st->scale_flips > NVFP4_MAX_SCALE_FLIPS * (double)st->blocks + 2 ||
        st->code_flips > NVFP4_MAX_CODE_FLIPS * (double)st->elems + 2) {
        gc_msg(msg, cap, "bits differ from the host quantisation of the reference too often: "
               "scale bytes of %lld / %lld blocks, codes of %lld / %lld elements",
               (long long)st->scale_flips, (long long)st->blocks, (long long)st->code_flips,
               (long long)st->elems);
        return -1;
    }
    return 0;
}

/* Run the NVFP4 out of case x twice: poisoned 0xff, then 0x00 (with PDL the second time);
 * both must give the same bytes (so every code and scale byte was written: a byte left
 * alone keeps its poison, which differs between the runs) and leave the rest of d_out as
 * poisoned (nothing written past the scales).  The first run's bytes stay in h_out. */
static inline int nv4_run_twice(ctx_case *x, float g, int32_t vec_size, char *msg, size_t cap) {
    gqa_case *c = &x->g;
    const int64_t used = (int64_t)c->tokens * c->o.heads_q * c->o.head_dim * 9 / 16;
    uint8_t *first = (uint8_t *)malloc(c->out_bytes ? c->out_bytes : 1);
    if (!first) {
        gc_msg(msg, cap, "host allocation failed");
        return -1;
    }
    int rc = 0;
    for (int run = 0; run < 2 && !rc; run++) {
        fi_attn_args a = nv4_args(c, g, vec_size);
        a.enable_pdl = run;
        const int poison = run ? 0x00 : 0xff;
        fi_status st;
        if (gqa_case_poison(c, msg, cap) ||
            cudaMemsetAsync(c->d_out, poison, c->out_bytes, c->stream) != cudaSuccess) {
            gc_msg(msg, cap, "poison failed");
            rc = -1;
        } else if ((st = fi_run(c->plan, &a, c->stream)) != FI_OK) {
            gc_msg(msg, cap, "fi_run (NVFP4 out): %s", fi_status_name(st));
            rc = -1;
        } else if (cudaStreamSynchronize(c->stream) != cudaSuccess ||
                   gqa_case_download(c, msg, cap)) {
            gc_msg(msg, cap, "run / download failed: %s", cudaGetErrorString(cudaGetLastError()));
            rc = -1;
        }
        if (rc) break;
        const uint8_t *h = (const uint8_t *)c->h_out;
        for (size_t i = (size_t)used; i < c->out_bytes; i++)
            if (h[i] != poison) {
                gc_msg(msg, cap, "byte %zu past the NVFP4 out (%lld bytes) written", i,
                       (long long)used);
                rc = -1;
                break;
            }
        if (!run) {
            memcpy(first, h, c->out_bytes);
        } else if (!rc && memcmp(first, h, (size_t)used)) {
            int64_t i = 0;
            while (first[i] == h[i]) i++;
            gc_msg(msg, cap, "byte %lld of the NVFP4 out: 0x%02x after 0xff poison, 0x%02x "
                   "after 0x00 poison and PDL (not written, or not deterministic)", (long long)i,
                   first[i], h[i]);
            rc = -1;
        }
    }
    if (!rc) memcpy(c->h_out, first, c->out_bytes);
    free(first);
    return rc;
}

#endif /* FI_TESTS_GPU_CONTEXT_NVFP4_CASE_H */
