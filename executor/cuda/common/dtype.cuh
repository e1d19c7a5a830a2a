/*
 * executor/cuda/common/dtype.cuh - element types the kernels compute and store:
 *   Dt<T>        16-bit inputs (bf16, fp16): pack two floats, mma.sync m16n8k16 with fp32
 *                accumulate (PTX ISA, "mma" for sm_80+).
 *   OutStore<O>  the output element (bf16, fp16, fp8 e4m3 with a scale): store 2 or 4
 *                consecutive fp32 values rounded to nearest (even).
 *   Exact conversions of quantised KV to the 16-bit types: fp8 e4m3, NVFP4 (e2m1 values
 *                with an e4m3 scale per 16).
 *   nvfp4_*      NVFP4 output (e2m1 values with an fp8 e4m3 scale a block of 16, the
 *                scale taken from the block's amax): the quantisation of one block spread
 *                over the 4 lanes of a quad.
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "executor/cuda/common/ptx.cuh"

namespace fi {

template <typename T> struct Dt;
template <> struct Dt<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&v);
    }
    static __device__ __forceinline__ float2 unpack(uint32_t x) {
        return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&x));
    }
    static __device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0,
                                               uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct Dt<__half> {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __half2 v = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&v);
    }
    static __device__ __forceinline__ float2 unpack(uint32_t x) {
        return __half22float2(*reinterpret_cast<const __half2 *>(&x));
    }
    static __device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0,
                                               uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

/* Output stores.  `o_scale` multiplies before the fp8 conversion (fi_exec_common.o_scale)
 * and is ignored by the 16-bit types, whose scale is folded into bmm2_scale. */
template <typename O> struct OutStore {
    static __device__ __forceinline__ void store4(O *dst, float4 v, float o_scale) {
        (void)o_scale;
        uint2 packed;
        packed.x = Dt<O>::pack(v.x, v.y);
        packed.y = Dt<O>::pack(v.z, v.w);
        *reinterpret_cast<uint2 *>(dst) = packed;
    }
};
template <> struct OutStore<__nv_fp8_e4m3> {
    static __device__ __forceinline__ void store4(__nv_fp8_e4m3 *dst, float4 v, float o_scale) {
        const float4 s = make_float4(v.x * o_scale, v.y * o_scale, v.z * o_scale, v.w * o_scale);
        const __nv_fp8x4_e4m3 q(s); /* satfinite, round to nearest even */
        *reinterpret_cast<__nv_fp8x4_e4m3 *>(dst) = q;
    }
};

/* An output type chosen at run time: T (bf16 / fp16), or fp8 e4m3 when the common block's
 * o_fp8 is set (one instantiation serves both; the branch is uniform over the grid). */
template <typename T> struct OutDyn {};
/* OutDyn<T>, or NVFP4 when the common block's o_fp4 is set (the context family: its split
 * merge quantises merged rows a 16-element block at a time, SplitMerge::write_merged). */
template <typename T> struct OutDynFp4 {};

/* Store 4 consecutive fp32 outputs at element offset `off` of c.out ([.., D] rows of O or,
 * for OutDyn<T>, of T or fp8 e4m3). */
template <typename O, typename C>
__device__ __forceinline__ void store_out4(const C &c, int64_t off, float4 v) {
    OutStore<O>::store4(static_cast<O *>(c.out) + off, v, c.o_scale);
}
template <typename O> struct is_out_dyn {
    static constexpr bool value = false;
    static constexpr bool nvfp4 = false;
};
template <typename T> struct is_out_dyn<OutDyn<T>> {
    static constexpr bool value = true;
    static constexpr bool nvfp4 = false;
    using type = T;
};
template <typename T> struct is_out_dyn<OutDynFp4<T>> {
    static constexpr bool value = true;
    static constexpr bool nvfp4 = true; /* fi_exec_common.o_fp4 may be set */
    using type = T;
};
template <typename T, typename C>
__device__ __forceinline__ void store_out4_dyn(const C &c, int64_t off, float4 v) {
    if (c.o_fp8)
        OutStore<__nv_fp8_e4m3>::store4(static_cast<__nv_fp8_e4m3 *>(c.out) + off, v, c.o_scale);
    else
        OutStore<T>::store4(static_cast<T *>(c.out) + off, v, 1.f);
}

/* Two consecutive outputs at element offset off of c.out (a common block with o_fp8 /
 * o_scale): T, or fp8 e4m3 scaled by c.o_scale when c.o_fp8 (uniform over the grid). */
template <typename T, typename C>
__device__ __forceinline__ void store_out2(const C &c, int64_t off, float x, float y) {
    if (c.o_fp8) {
        const __nv_fp8x2_e4m3 q(make_float2(x * c.o_scale, y * c.o_scale));
        *reinterpret_cast<__nv_fp8x2_e4m3 *>(static_cast<__nv_fp8_e4m3 *>(c.out) + off) = q;
    } else {
        *reinterpret_cast<uint32_t *>(static_cast<T *>(c.out) + off) = Dt<T>::pack(x, y);
    }
}

/* ---- NVFP4 output (fi_exec_common.o_fp4; the format: include/fiattn_run.h, o_sf) ------
 * Per block of 16 consecutive outputs x_i of a row, with the global scale g = o_sf_scale
 * (TensorRT-LLM's NVFP4 recipe, its cvt_warp_fp16_to_fp4, with its approximate reciprocals
 * rcp = rcp.approx.ftz: IEEE division compiles to a slow-path call, which made ptxas spill
 * registers around it in every context kernel):
 *   amax = max_i |x_i|  (NaN if any x_i is NaN)
 *   s    = e4m3_rn_satfinite(g * (amax * rcp(6)))        the stored scale byte
 *   q_i  = e2m1_rn_satfinite(x_i * rcp(s * rcp(g)))  (q_i = 0 when s = 0)
 * so x_i ~ q_i * s / g.  The host test (tests/gpu/context_nvfp4_case.h) repeats it with
 * exact division and counts the values on a rounding boundary that land the other way. */

/* The 4-bit e2m1 code (sign bit 3, magnitude code 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6) of v,
 * rounded to nearest, ties to the even code, magnitudes past 6 saturated to 6 (Hopper has
 * no cvt to e2m1: the conversion sm_100 does in one instruction).  A tie sits between an
 * even and an odd code, so the thresholds alternate '>' (tie stays at the even code below)
 * and '>=' (tie goes to the even code above).  NaN gives code 0 or 8 (its block's scale is
 * NaN, nvfp4_scale). */
__device__ __forceinline__ uint32_t e2m1_code(float v) {
    const float a = fabsf(v);
    const uint32_t m = (uint32_t)(a > 0.25f) + (uint32_t)(a >= 0.75f) + (uint32_t)(a > 1.25f) +
                       (uint32_t)(a >= 1.75f) + (uint32_t)(a > 2.5f) + (uint32_t)(a >= 3.5f) +
                       (uint32_t)(a > 5.f);
    return m | ((__float_as_uint(v) >> 28) & 8u);
}

/* The block scale of amax under global scale g: the e4m3 byte (RN, satfinite: past 448
 * it stays 448; NaN stays NaN) and the factor g / s the block's values are multiplied by
 * before e2m1_code (0 when s is 0: an all-zero block, or one below the smallest e4m3). */
__device__ __forceinline__ float rcp_approx_ftz(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ uint32_t nvfp4_scale(float amax, float g, float *mul) {
    const __nv_fp8_e4m3 s(__fmul_rn(g, __fmul_rn(amax, rcp_approx_ftz(6.f))));
    const float sf = static_cast<float>(s);
    *mul = sf == 0.f ? 0.f : rcp_approx_ftz(__fmul_rn(sf, rcp_approx_ftz(g)));
    return s.__x;
}

/* A block of 16 outputs held as 4 values a lane by the 4 lanes of an aligned quad (lanes
 * 4k .. 4k + 3): the block's scale byte (the same in all four lanes) into *sf, and the
 * lane's 4 codes, value k's code in bits 4k .. 4k + 3.  kWarp: the whole warp calls it
 * together (the tile epilogue: a full shuffle mask; a per-lane quad mask there made ptxas
 * spill 160 bytes in the head_dim 256 kernels); else the quad's four lanes do and the rest
 * of the warp may be elsewhere (the split merge). */
template <bool kWarp = false>
__device__ __forceinline__ uint32_t nvfp4_quad_block(const float *v, float g, uint32_t *sf) {
    const unsigned quad = kWarp ? 0xffffffffu : 0xfu << (threadIdx.x & 28u);
    float amax = fmax_nan(fmax_nan(fabsf(v[0]), fabsf(v[1])), fmax_nan(fabsf(v[2]), fabsf(v[3])));
    amax = fmax_nan(amax, __shfl_xor_sync(quad, amax, 1));
    amax = fmax_nan(amax, __shfl_xor_sync(quad, amax, 2));
    float mul;
    *sf = nvfp4_scale(amax, g, &mul);
    uint32_t codes = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k)
        codes |= e2m1_code(__fmul_rn(v[k], mul)) << (4 * k);
    return codes;
}

/* Store 4 consecutive outputs (columns 4 c4 .. 4 c4 + 3 of row (tok, h)) as NVFP4, the
 * quad holding c4 = 4 b .. 4 b + 3 storing block b together (nvfp4_quad_block): two code
 * bytes at c.out (strides in e2m1 elements: twice the byte strides), the scale byte by the
 * block's first lane. */
template <typename C>
__device__ __forceinline__ void store_nvfp4_4(const C &c, int64_t tok, int h, int c4, float4 t) {
    const float v[4] = {t.x, t.y, t.z, t.w};
    uint32_t sf;
    const uint32_t codes = nvfp4_quad_block(v, c.o_sf_scale, &sf);
    const int64_t off = tok * c.out_stride_tok + h * c.out_stride_head + 4 * c4;
    *reinterpret_cast<uint16_t *>(static_cast<uint8_t *>(c.out) + (off >> 1)) = (uint16_t)codes;
    if ((c4 & 3) == 0)
        static_cast<uint8_t *>(c.o_sf)[tok * c.o_sf_stride_tok + h * c.o_sf_stride_head + (c4 >> 2)] =
            (uint8_t)sf;
}

/* Two fp32 -> e4m3 (round to nearest, saturating; NaN stays NaN): lo in byte 0, hi in
 * byte 1. */
__device__ __forceinline__ uint16_t e4m3x2(float lo, float hi) {
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

/* fp8 e4m3 -> fp16 (exact: every e4m3 value is an fp16 value; NaN stays NaN). */
/* Two e4m3 values (bytes 0, 1 of x) as an fp16 pair. */
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t x) {
    uint32_t r;
    asm("{\n.reg .b16 lo;\nmov.b32 {lo, _}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(r) : "r"(x));
    return r;
}
__device__ __forceinline__ uint32_t e4m3x2_hi_to_f16x2(uint32_t x) { /* bytes 2, 3 */
    uint32_t r;
    asm("{\n.reg .b16 hi;\nmov.b32 {_, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(r) : "r"(x));
    return r;
}
/* The bytes of x that prmt selector sel picks (a byte permutation: the fp8 fragments'
 * regrouping after ldmatrix.trans). */
__device__ __forceinline__ uint32_t bytes2(uint32_t x, uint32_t sel) {
    uint32_t r;
    asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(r) : "r"(x), "r"(sel));
    return r;
}
/* Eight e4m3 values (x.x bytes 0..3, x.y bytes 0..3) as eight fp16 (a 16-byte chunk). */
__device__ __forceinline__ uint4 e4m3x8_to_f16x8(uint2 x) {
    return make_uint4(e4m3x2_to_f16x2(x.x), e4m3x2_hi_to_f16x2(x.x), e4m3x2_to_f16x2(x.y),
                      e4m3x2_hi_to_f16x2(x.y));
}
/* Two fp16 values as two bf16, rounded to nearest (exact for fp16 values of at most 8
 * significant bits, e.g. every converted e4m3 value; NaN stays NaN). */
__device__ __forceinline__ uint32_t f16x2_to_bf16x2(uint32_t x) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&x));
    const __nv_bfloat162 b = __float22bfloat162_rn(f);
    return *reinterpret_cast<const uint32_t *>(&b);
}
/* Eight fp16 values as eight T (bf16 or fp16): exact for values of at most 8 significant
 * bits (the converted e4m3 and e2m1 x e4m3 values below). */
template <typename T> __device__ __forceinline__ uint4 f16x8_to(uint4 h);
template <> __device__ __forceinline__ uint4 f16x8_to<__half>(uint4 h) { return h; }
template <> __device__ __forceinline__ uint4 f16x8_to<__nv_bfloat16>(uint4 h) {
    return make_uint4(f16x2_to_bf16x2(h.x), f16x2_to_bf16x2(h.y), f16x2_to_bf16x2(h.z),
                      f16x2_to_bf16x2(h.w));
}
/* Eight e4m3 values as eight T (bf16 or fp16), exact. */
template <typename T> __device__ __forceinline__ uint4 e4m3x8_to(uint2 x) {
    return f16x8_to<T>(e4m3x8_to_f16x8(x));
}

/* ---- NVFP4: e2m1 values, two a byte (low nibble first), an e4m3 scale per 16 values ---- */

/* The KV element tag of an NVFP4 cache (its tensors are described in bytes). */
struct nvfp4 {};

/* e2m1 nibbles as fp8 e4m3 bytes (exact: sign to bit 7, the 3 magnitude bits to bits
 * 4..2, so every value comes out x 2^-6; the block scale carries the 2^6 back).  x: one
 * nibble in the low half of each byte. */
__device__ __forceinline__ uint32_t e2m1_bytes_to_e4m3(uint32_t x) {
    return ((x & 0x08080808u) << 4) | ((x & 0x07070707u) << 2);
}
/* Block scales (e4m3 bytes a, b) as an fp16 pair x 64 (<= 448 x 64: in range). */
__device__ __forceinline__ __half2 sf_pair(uint32_t a, uint32_t b) {
    const uint32_t h = e4m3x2_to_f16x2(a | (b << 8));
    return __hmul2(*reinterpret_cast<const __half2 *>(&h), __floats2half2_rn(64.f, 64.f));
}
__device__ __forceinline__ uint32_t hmul2u(uint32_t x, __half2 s) {
    const __half2 r = __hmul2(*reinterpret_cast<const __half2 *>(&x), s);
    return *reinterpret_cast<const uint32_t *>(&r);
}
/* Eight e2m1 values (the 4 bytes of w, low nibble first) times their block scale s2 (both
 * halves the scale x 64: sf_pair), as eight fp16 in element order.  Exact: an e2m1 value
 * is 0, 0.5, 1, 1.5, 2, 3, 4 or 6 (2 significant bits) and an e4m3 scale has at most 4, so
 * a product has at most 6 significant bits, is a multiple of 2^-10 (0.5 x the smallest
 * e4m3 subnormal 2^-9) and at most 6 x 448 = 2688 in magnitude: an fp16 value (11 bits,
 * normal from 2^-14) and a bf16 value (8 bits, fp32's range), so the one rounding of
 * the fp16 multiply (and of f16x8_to<bf16>) changes nothing.  The factors are exact too:
 * e2m1 x 2^-6 >= 2^-7 and scale x 64 in [2^-3, 28672]. */
__device__ __forceinline__ uint4 e2m1x8_to_f16x8(uint32_t w, __half2 s2) {
    const uint32_t ev = e2m1_bytes_to_e4m3(w), od = e2m1_bytes_to_e4m3(w >> 4);
    const uint32_t a = __byte_perm(ev, od, 0x5140u); /* elements 0, 1, 2, 3 */
    const uint32_t b = __byte_perm(ev, od, 0x7362u); /* elements 4, 5, 6, 7 */
    return make_uint4(hmul2u(e4m3x2_to_f16x2(a), s2), hmul2u(e4m3x2_hi_to_f16x2(a), s2),
                      hmul2u(e4m3x2_to_f16x2(b), s2), hmul2u(e4m3x2_hi_to_f16x2(b), s2));
}
/* The same as eight T (bf16 or fp16), exact. */
template <typename T> __device__ __forceinline__ uint4 e2m1x8_to(uint32_t w, __half2 s2) {
    return f16x8_to<T>(e2m1x8_to_f16x8(w, s2));
}
/* Eight bf16 values as eight fp16, rounded to nearest (exact for |x| in [2^-14, 65504]:
 * fp16 has the more mantissa bits; smaller values become fp16 subnormals, larger inf). */
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t x) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&x));
    const __half2 h = __float22half2_rn(f);
    return *reinterpret_cast<const uint32_t *>(&h);
}
__device__ __forceinline__ uint4 bf16x8_to_f16x8(uint4 x) {
    return make_uint4(bf16x2_to_f16x2(x.x), bf16x2_to_f16x2(x.y), bf16x2_to_f16x2(x.z),
                      bf16x2_to_f16x2(x.w));
}

}  // namespace fi
