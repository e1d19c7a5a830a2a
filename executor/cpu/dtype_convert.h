/*
 * executor/cpu/dtype_convert.h - scalar conversions between fp32 and the 16-bit float
 * formats (bf16, IEEE fp16), and from the fp8 formats (e4m3, e5m2), shared by the CPU
 * references and the tests.
 *
 * f32 -> 16-bit rounds to nearest, ties to even (what cvt.rn does on the GPU), keeps the
 * sign of zero, maps NaN to a quiet NaN and overflow to +-inf.  16-bit -> f32 is exact.
 */
#ifndef FIATTN_CPU_DTYPE_CONVERT_H
#define FIATTN_CPU_DTYPE_CONVERT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t fi_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float fi_f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bf16 is the top half of an fp32: exact widening. */
static inline float fi_bf16_to_f32(uint16_t h) { return fi_f32_from_bits((uint32_t)h << 16); }

/* fp32 -> bf16, round to nearest even on the 16 dropped bits. */
static inline uint16_t fi_f32_to_bf16_rne(float f) {
    uint32_t u = fi_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)               /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);                   /* carry into the exponent = overflow to inf */
    return (uint16_t)(u >> 16);
}

/* IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
static inline float fi_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    if (exp == 0) {                                    /* zero / subnormal: mant * 2^-24 */
        const float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    if (exp == 31)                                     /* inf / NaN */
        return fi_f32_from_bits(sign | 0x7f800000u | (mant << 13));
    return fi_f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* fp32 -> fp16, round to nearest even (subnormals included). */
static inline uint16_t fi_f32_to_f16_rne(float f) {
    const uint32_t u = fi_f32_bits(f);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);       /* NaN */
    if (a >= 0x47800000u) return (uint16_t)(sign | 0x7c00u);      /* >= 65536: inf */
    if (a < 0x38800000u) {
        /* |f| < 2^-14: the result is an fp16 subnormal (unit 2^-24).  Adding 0.5 puts the
         * unit at the last mantissa bit of the fp32 sum, so the FPU's own round-to-nearest-
         * even does the rounding; the bits above 0.5's are the fp16 mantissa. */
        const float s = fi_f32_from_bits(a) + 0.5f;
        return (uint16_t)(sign | (uint16_t)(fi_f32_bits(s) - fi_f32_bits(0.5f)));
    }
    /* Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to even; a
     * carry out of the mantissa bumps the exponent (up to inf for 65520..65535). */
    const uint32_t odd = (a >> 13) & 1u;
    a += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
    return (uint16_t)(sign | (uint16_t)(a >> 13));
}

/* fp8 e4m3 ("fn": 1 sign, 4 exponent (bias 7), 3 mantissa bits; no inf, S.1111.111 is
 * NaN), widened exactly. */
static inline float fi_e4m3_to_f32(uint8_t x) {
    const uint32_t exp = (x >> 3) & 0xfu, mant = x & 0x7u;
    float v;
    if ((x & 0x7fu) == 0x7fu)
        v = NAN;
    else if (exp == 0)
        v = ldexpf((float)mant, -9);                   /* subnormal: mant * 2^-9 */
    else
        v = ldexpf((float)(8u + mant), (int)exp - 10); /* 1.mmm * 2^(exp - 7) */
    return (x & 0x80u) ? -v : v;
}

/* fp8 e5m2 (1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-style inf and NaN): the
 * top byte of an fp16, widened exactly. */
static inline float fi_e5m2_to_f32(uint8_t x) { return fi_f16_to_f32((uint16_t)(x << 8)); }

#endif /* FIATTN_CPU_DTYPE_CONVERT_H */
