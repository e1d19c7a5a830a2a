/*
 * tests/gpu/gpu_case_common.h - what the GPU cases of every family share (header-only,
 * static inline): host conversions between fp32 and the 16-bit and 8/4-bit formats the
 * executors take, random fills, the device probe, message formatting and the CUDA-call
 * macro.  Included by mla_gpu_case.h and gqa_gpu_case.h (and through them by the GPU tests
 * and the benches).  Functions return values or 0 / -1 with a message; nothing aborts.
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

#endif /* FI_TESTS_GPU_GPU_CASE_COMMON_H */
