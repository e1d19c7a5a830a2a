/*
 * executor/cuda/common/wgmma.cuh - Hopper warpgroup matrix multiply (wgmma.mma_async) for
 * kernel families: shared-memory matrix descriptors, the m64nNk16 instructions a family
 * uses (A and B from shared memory, fp32 accumulate), the async-group fences and named
 * barriers between warpgroups.  Source: the PTX ISA 8.x, "Asynchronous
 * Warpgroup Level Matrix Multiply-Accumulate Instructions" (sm_90a).
 *
 * Shared-memory operand layouts used here (128-byte swizzle, bf16 / fp16; sw64 below for
 * 32-element rows):
 *  - K-major (A = Q or P, B = K for S = Q K^T): rows of 64 elements (128 B), 8-row atoms of
 *    1024 B, the 16-byte chunk c of row r stored at chunk c ^ (r % 8); a k16 step advances
 *    the start address by 32 B; SBO = 1024 (next 8 rows), LBO unused.
 *  - MN-major (B = V for O += P V, the transpose bit set): the same bytes read with the
 *    64-element rows along N; LBO = the stride between 64-wide N panels, SBO = 1024 (next 8
 *    K rows); a k16 step advances the start by 2048 B.
 * 8-bit operands (Wgmma8, e4m3, k32 steps of 32 bytes) use the same K-major layouts by bytes:
 * sw128_8 / sw64_8, and sw32_8 for 32-byte rows (32-byte swizzle, layout field 3, SBO 256).
 * Every atom starts on a 1024-byte boundary (base offset 0).
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "executor/cuda/common/ptx.cuh"

namespace fi {

/* Descriptor of a swizzled operand at shared address addr (see above); swz: the layout
 * field, 1 = 128-byte swizzle, 2 = 64-byte. */
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo, uint32_t swz = 1) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFFu) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFFu) << 32) | ((uint64_t)swz << 62);
}

/* The descriptor as a base plus a byte offset: the low word carries the start address
 * (smem addresses < 2^18 leave the 14-bit field room for any in-range offset). */
struct WgDesc {
    uint32_t lo, hi;
    __device__ __forceinline__ uint64_t at(uint32_t off) const {
        return ((uint64_t)hi << 32) | (uint64_t)(lo + (off >> 4));
    }
};
/* A descriptor base the compiler cannot hoist out of a loop (asm volatile): without it,
 * ptxas keeps every k-step's 64-bit descriptor of a loop-invariant operand (Q) live in
 * registers across the KV loop and spills the accumulators. */
__device__ __forceinline__ WgDesc wg_desc_base(uint32_t addr, uint32_t lbo, uint32_t sbo, uint32_t swz = 1) {
    uint32_t a;
    asm volatile("mov.u32 %0, %1;\n" : "=r"(a) : "r"(addr));
    const uint64_t d = wg_desc(a, lbo, sbo, swz);
    return WgDesc{(uint32_t)d, (uint32_t)(d >> 32)};
}


/* Byte offset of byte b of row r of a [rows][128 B] panel in the 128-byte swizzle (the
 * 16-byte chunk b / 16 of row r at chunk (b / 16) ^ (r % 8)). */
__device__ __forceinline__ uint32_t sw128_8(int r, int b) {
    return (uint32_t)(r * 128 + ((((b >> 4) ^ r) & 7) << 4) + (b & 15));
}
/* ... of a [rows][64 B] panel in the 64-byte swizzle (8-row atoms of 512 B, chunk b / 16
 * of row r at (b / 16) ^ ((r / 2) % 4)); SBO 512. */
__device__ __forceinline__ uint32_t sw64_8(int r, int b) {
    return (uint32_t)(r * 64 + ((((b >> 4) ^ (r >> 1)) & 3) << 4) + (b & 15));
}
/* ... of a [rows][32 B] panel in the 32-byte swizzle (8-row atoms of 256 B, 16-byte chunk h
 * of row r at h ^ ((r / 4) % 2)), for 8-bit operands of one k32 step; b: the byte in the
 * row (0..31).  SBO 256. */
__device__ __forceinline__ uint32_t sw32_8(int r, int b) {
    return (uint32_t)(r * 32 + ((((b >> 4) ^ (r >> 2)) & 1) << 4) + (b & 15));
}
/* Element (r, c) of a [rows][64] 16-bit panel in the 128-byte swizzle, and of a [rows][32]
 * 16-bit panel in the 64-byte swizzle: the bytes of column c. */
__device__ __forceinline__ uint32_t sw128(int r, int c) { return sw128_8(r, 2 * c); }
__device__ __forceinline__ uint32_t sw64(int r, int c) { return sw64_8(r, 2 * c); }

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Keep the compiler from moving reads / writes of accumulator registers across an
 * in-flight wgmma (the asm statements above do not name them). */
template <int N> __device__ __forceinline__ void wg_pin(float *d) {
#pragma unroll
    for (int i = 0; i < N; ++i)
        asm volatile("" : "+f"(d[i])::"memory");
}

/* Named barriers (ids 2..15; 0 is __syncthreads, 1 cta_sync): count threads, % 32 == 0. */
__device__ __forceinline__ void nbar_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void nbar_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
/* A named barrier that also ANDs v over its count threads: every one gets the result. */
__device__ __forceinline__ bool nbar_and(int id, int count, bool v) {
    uint32_t r;
    asm volatile(
        "{\n"
        ".reg .pred p, q;\n"
        "setp.ne.u32 p, %1, 0;\n"
        "bar.red.and.pred q, %2, %3, p;\n"
        "selp.u32 %0, 1, 0, q;\n"
        "}\n"
        : "=r"(r)
        : "r"((uint32_t)v), "r"(id), "r"(count)
        : "memory");
    return r != 0;
}

/* threadIdx.x / 128 as a value the compiler knows to be warp-uniform (ptxas serialises
 * wgmma on paths it cannot prove uniform). */
__device__ __forceinline__ int warpgroup_idx() { return uniform((int)(threadIdx.x >> 7)); }

/* D (fp32, m64 x N, the accumulator layout: warp w of the warpgroup rows 16 w + lane / 4
 * and + 8, columns 8 j + 2 (lane % 4) + {0, 1} in d[4 j ..]) (+)= A B; accumulate 0
 * overwrites D.  ss: A and B from shared memory (descriptors); kTransB: B is MN-major;
 * kTransA: A is MN-major (V^T of a [tokens][dims] panel, mla_wgt16_tile.cuh).
 * rs: A from registers, a[4] per thread in the m16n8k16 A-fragment order of the thread's
 * 16-row slice (a[0] row lane / 4, k 2 (lane % 4) + {0, 1}; a[1] row + 8; a[2], a[3] the
 * same at k + 8), as packed 16-bit pairs: an fp32 accumulator of S (m64 x 16 k) converts
 * into it register for register, a[i] = pack(d[2 i], d[2 i + 1]) (FlashAttention-3's P in
 * registers). */
template <int N, typename T> struct Wgmma;
/* One specialisation per (N, input type): the asm names N / 2 accumulator registers, then
 * the operands from %R = N / 2 on; FI_WG_REGS_<N> / FI_WG_OPS_<N> spell the register list
 * once per N. */
#define FI_WGMMA(N, T, TY, R0, R1, R2, R3, R4, R5, R6)                                      \
    template <> struct Wgmma<N, T> {                                                        \
        template <int kTransB, int kTransA = 0>                                             \
        static __device__ __forceinline__ void ss(float *d, uint64_t a, uint64_t b,         \
                                                  int accumulate) {                         \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #R2 ", 0;\n"                 \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " "    \
                         FI_WG_REGS_##N ", %" #R0 ", %" #R1 ", p, 1, 1, %" #R4 ", %" #R3    \
                         ";\n}\n"                                                           \
                         : FI_WG_OPS_##N                                                    \
                         : "l"(a), "l"(b), "r"(accumulate), "n"(kTransB), "n"(kTransA));    \
        }                                                                                   \
        template <int kTransB>                                                              \
        static __device__ __forceinline__ void rs(float *d, const uint32_t *a, uint64_t b,  \
                                                  int accumulate) {                         \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #R5 ", 0;\n"                 \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " "    \
                         FI_WG_REGS_##N ", {%" #R0 ", %" #R1 ", %" #R2 ", %" #R3 "}, %" #R4 \
                         ", p, 1, 1, %" #R6 ";\n}\n"                                        \
                         : FI_WG_OPS_##N                                                    \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b),              \
                           "r"(accumulate), "n"(kTransB));                                  \
        }                                                                                   \
    };
#define FI_WG_REGS_16 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define FI_WG_OPS_16 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
FI_WGMMA(16, __nv_bfloat16, "bf16", 8, 9, 10, 11, 12, 13, 14)
FI_WGMMA(16, __half, "f16", 8, 9, 10, 11, 12, 13, 14)
#define FI_WG_REGS_32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define FI_WG_OPS_32 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
FI_WGMMA(32, __nv_bfloat16, "bf16", 16, 17, 18, 19, 20, 21, 22)
FI_WGMMA(32, __half, "f16", 16, 17, 18, 19, 20, 21, 22)

#define FI_WG_REGS_64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FI_WG_OPS_64 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
FI_WGMMA(64, __nv_bfloat16, "bf16", 32, 33, 34, 35, 36, 37, 38)
FI_WGMMA(64, __half, "f16", 32, 33, 34, 35, 36, 37, 38)
#undef FI_WG_REGS_64
#undef FI_WG_OPS_64

#define FI_WG_REGS_128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FI_WG_OPS_128 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
FI_WGMMA(128, __nv_bfloat16, "bf16", 64, 65, 66, 67, 68, 69, 70)
FI_WGMMA(128, __half, "f16", 64, 65, 66, 67, 68, 69, 70)
#undef FI_WG_REGS_128
#undef FI_WG_OPS_128

#define FI_WG_REGS_256 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define FI_WG_OPS_256 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
FI_WGMMA(256, __nv_bfloat16, "bf16", 128, 129, 130, 131, 132, 133, 134)
FI_WGMMA(256, __half, "f16", 128, 129, 130, 131, 132, 133, 134)

#undef FI_WGMMA

/* fp8 e4m3 x e4m3 -> fp32, m64nNk32, both operands K-major (fp8 wgmma has no transpose:
 * an MN-major operand must be transposed first); the accumulator layout is Wgmma's.
 * ss: A and B from shared memory.  rs: A from registers, a[4] per thread holding 4 bytes
 * each in the m16n8k32 8-bit A-fragment order of the thread's 16-row slice (a[0] row
 * lane / 4, k 4 (lane % 4) .. + 3; a[1] row + 8; a[2], a[3] the same at k + 16). */
template <int N> struct Wgmma8;
#define FI_WGMMA8(N, R0, R1, R2, R3, R4, R5)                                                \
    template <> struct Wgmma8<N> {                                                          \
        static __device__ __forceinline__ void ss(float *d, uint64_t a, uint64_t b,         \
                                                  int accumulate) {                         \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #R2 ", 0;\n"                 \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 "        \
                         FI_WG_REGS_##N ", %" #R0 ", %" #R1 ", p, 1, 1;\n}\n"              \
                         : FI_WG_OPS_##N                                                    \
                         : "l"(a), "l"(b), "r"(accumulate));                                \
        }                                                                                   \
        static __device__ __forceinline__ void rs(float *d, const uint32_t *a, uint64_t b,  \
                                                  int accumulate) {                         \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #R5 ", 0;\n"                 \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 "        \
                         FI_WG_REGS_##N ", {%" #R0 ", %" #R1 ", %" #R2 ", %" #R3 "}, %" #R4 \
                         ", p, 1, 1;\n}\n"                                                  \
                         : FI_WG_OPS_##N                                                    \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b),              \
                           "r"(accumulate));                                                \
        }                                                                                   \
    };
FI_WGMMA8(16, 8, 9, 10, 11, 12, 13)
FI_WGMMA8(32, 16, 17, 18, 19, 20, 21)
FI_WGMMA8(256, 128, 129, 130, 131, 132, 133)
#undef FI_WGMMA8
#undef FI_WG_REGS_16
#undef FI_WG_OPS_16
#undef FI_WG_REGS_32
#undef FI_WG_OPS_32
#undef FI_WG_REGS_256
#undef FI_WG_OPS_256

}  // namespace fi
