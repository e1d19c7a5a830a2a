/*
 * executor/cuda/mla_decode.cuh - persistent MLA paged-decode executor (sm_90a).
 *
 * What it computes (fiattn_run.h): for every row (query token, head) of the plan,
 *   s_j = bmm1_scale * (q_nope . ckv_j + q_pe . kpe_j),  out = bmm2_scale * softmax(s) . ckv
 * with the causal / window_left mask of the plan header, sinks in the denominator, and the
 * natural-log LSE.  CTA c walks its items work_indptr[c] .. work_indptr[c+1]-1 (plan region
 * of the workspace; the grid never changes, so a captured graph follows fi_plan_update).
 *
 * How (one CTA = 8 warps = 256 threads, one CTA per SM):
 *  - Tile: up to 64 rows (q-major: r = (q - q_begin) * heads + (h - head_begin)) in shared
 *    memory, [64][576] (+8 pad elements a row so ldmatrix rows fall in distinct banks).
 *  - KV: blocks of 32 tokens, 576 elements each (ckv ++ kpe), gathered through the page table
 *    with 16-byte cp.async into a 3-stage ring (2 blocks in flight while one is computed).
 *    Tokens outside [kv_begin, kv_end) are zero-filled so P = 0 never meets garbage.
 *  - Warp w: row group rg = w / 2 (16 rows), half wh = w % 2.  S = Q K^T for its 16 rows x
 *    the wh-th 16 tokens of the block (mma.sync m16n8k16, fp32 accumulate); the two halves
 *    swap row maxima through shared memory so both keep the same running max; each writes
 *    its half of P (input dtype) to shared memory; then O[16 x 256] += P[16 x 32] V[32 x 256]
 *    for its half of the 512 output dims (V = ckv, read with ldmatrix.trans).  Row groups
 *    with no live row skip the math (heads 16 / q_len 1 uses warps 0 and 1 only).
 *  - Online softmax in the log2 domain (exp2f), fp32; masked logits are -inf and a row whose
 *    keys are all masked so far keeps m = -inf, l = 0, O = 0 (never NaN).
 *  - Unsplit item: out = bmm2 * O / l * exp(lse_keys - lse), lse = logaddexp(lse_keys, sink).
 *    Split item: fp32 partial O / l and lse_keys into its slot, then a threadfence and an
 *    `atom.acq_rel.gpu.inc` on the group's semaphore with bound n-1 (wraps back to 0: no
 *    reset between replays); the CTA that sees n-1 merges the group's slots in split order
 *    (deterministic) into out / lse.
 *  - PDL: nothing global is read before griddepcontrol.wait; launch_dependents once the CTA's
 *    last item is done.
 * Sources of the method: FlashAttention-2 (Dao 2023) online softmax and warp tiling,
 * flash-decoding split-KV with LSE merge, FlashMLA's persistent decode scheduling.
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>
#include <stdint.h>

#include "executor/mla_params.h"

namespace fimla {

constexpr int kThreads = 256;
constexpr int kRows = 64;                 /* tile rows (fi_tile_rows for MLA) */
constexpr int kDqk = 576;                 /* 512 ckv + 64 kpe */
constexpr int kDv = 512;
constexpr int kChunksNope = kDv / 8;      /* 16-byte chunks of a 512-element row: 64 */
constexpr int kChunks = kDqk / 8;         /* 72 */
constexpr int kBlockN = 32;               /* KV tokens per block */
constexpr int kStages = 3;
constexpr int kPitch = kDqk + 8;          /* elements per smem row: 1168 B, 292 words */
constexpr int kPPitch = kBlockN + 8;      /* P row: 80 B */
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

constexpr size_t kSmemQ = (size_t)kRows * kPitch * 2;
constexpr size_t kSmemKV = (size_t)kStages * kBlockN * kPitch * 2;
constexpr size_t kSmemP = (size_t)4 * 16 * kPPitch * 2;
constexpr size_t kSmemRed = (size_t)2 * 2 * kRows * sizeof(float); /* max and l, per half */
constexpr size_t kSmemBytes = kSmemQ + kSmemKV + kSmemP + kSmemRed + 16;

template <typename T> struct Dt;
template <> struct Dt<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&v);
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
    static __device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0,
                                               uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t *r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t *r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
/* 16-byte async copy; src_bytes 0 zero-fills the destination (src must still be valid). */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
/* Self-resetting group semaphore: returns the old value; bound n-1 wraps to 0. */
__device__ __forceinline__ uint32_t sem_inc(uint32_t *sem, uint32_t bound) {
    uint32_t old;
    asm volatile("atom.acq_rel.gpu.global.inc.u32 %0, [%1], %2;\n"
                 : "=r"(old)
                 : "l"(sem), "r"(bound)
                 : "memory");
    return old;
}
__device__ __forceinline__ float logaddexp(float a, float b) {
    const float m = fmaxf(a, b);
    if (m == -CUDART_INF_F)
        return -CUDART_INF_F;
    return m + logf(expf(a - m) + expf(b - m));
}

/* Per-run constants shared by every item of a CTA. */
struct RunCtx {
    float scale_log2;  /* bmm1_scale * log2(e) */
    float scale2;      /* bmm2_scale */
    int causal;
    int window_left;
};

/* Load the tile's Q rows into sQ (rows >= M inside a live row group are zeroed). */
template <typename T>
__device__ __forceinline__ void load_q(const fi_mla_params &p, T *sQ, const fi_work_item &it,
                                       const fi_request_info &rq, int nh, int M) {
    const int tid = threadIdx.x;
    const int rows_live = (M + 15) & ~15;
    for (int idx = tid; idx < rows_live * kChunks; idx += kThreads) {
        const int r = idx / kChunks, c = idx - r * kChunks;
        T *dst = sQ + r * kPitch + c * 8;
        if (r < M) {
            const int qi = it.q_begin + r / nh;
            const int h = it.head_begin + r % nh;
            const int64_t tok = (int64_t)rq.q_offset + qi;
            const T *src = c < kChunksNope
                               ? (const T *)p.q_nope + tok * p.q_nope_stride_tok +
                                     h * p.q_nope_stride_head + c * 8
                               : (const T *)p.q_pe + tok * p.q_pe_stride_tok +
                                     h * p.q_pe_stride_head + (c - kChunksNope) * 8;
            cp_async16(smem_u32(dst), src, 16);
        } else {
            *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
        }
    }
}

/* Gather KV tokens [t0, t0 + 32) of the request into one ring stage.  8 threads a token,
 * 9 chunks each, consecutive threads on consecutive 16 bytes. */
template <typename T>
__device__ __forceinline__ void load_kv(const fi_mla_params &p, T *stage,
                                        const fi_request_info &rq, int t0, int kv_end) {
    const int tid = threadIdx.x;
    const int j = tid >> 3, sub = tid & 7;
    const int t = t0 + j;
    const bool valid = t < kv_end;
    const T *ckv = (const T *)p.ckv;
    const T *kpe = (const T *)p.kpe;
    if (valid) {
        const int64_t page = p.page_table[rq.page_row_offset + (t >> p.page_shift)];
        const int slot = t & (p.page_size - 1);
        ckv += page * p.ckv_stride_page + (int64_t)slot * p.ckv_stride_tok;
        kpe += page * p.kpe_stride_page + (int64_t)slot * p.kpe_stride_tok;
    }
    const int bytes = valid ? 16 : 0;
    T *dst = stage + j * kPitch;
#pragma unroll
    for (int k = 0; k < kChunks / 8; ++k) {
        const int c = sub + 8 * k;
        const T *src = c < kChunksNope ? ckv + c * 8 : kpe + (c - kChunksNope) * 8;
        cp_async16(smem_u32(dst + c * 8), src, bytes);
    }
}

/* Merge a split group's partial slots (in split order) into out / lse.  Whole CTA. */
template <typename T>
__device__ void merge_group(const fi_mla_params &p, const RunCtx &ctx, int g) {
    const fi_merge_group grp = p.groups[g];
    const fi_request_info rq = p.requests[grp.request];
    const int nh = grp.head_end - grp.head_begin;
    const int M = (grp.q_end - grp.q_begin) * nh;
    const int tid = threadIdx.x;
    const int v4 = tid & 127; /* float4 column: dims 4*v4 .. 4*v4+3 */
    for (int r = tid >> 7; r < M; r += 2) {
        float mx = -CUDART_INF_F;
        for (int s = 0; s < grp.num_splits; ++s)
            mx = fmaxf(mx, __ldcg(p.partial_lse + (int64_t)(grp.first_slot + s) * p.tile_rows + r));
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        float sum = 0.f;
        if (mx != -CUDART_INF_F) {
            for (int s = 0; s < grp.num_splits; ++s) {
                const int64_t slot = grp.first_slot + s;
                const float w = expf(__ldcg(p.partial_lse + slot * p.tile_rows + r) - mx);
                const float4 o = __ldcg(reinterpret_cast<const float4 *>(
                                            p.partial_o + (slot * p.tile_rows + r) * kDv) +
                                        v4);
                sum += w;
                acc.x += w * o.x;
                acc.y += w * o.y;
                acc.z += w * o.z;
                acc.w += w * o.w;
            }
        }
        const float lse_keys = mx == -CUDART_INF_F ? -CUDART_INF_F : mx + logf(sum);
        const int h = grp.head_begin + r % nh;
        const int64_t tok = (int64_t)rq.q_offset + grp.q_begin + r / nh;
        const float lse = p.sinks ? logaddexp(lse_keys, p.sinks[h]) : lse_keys;
        /* sum_s w_s O_s / sum is the keys-only output; exp(lse_keys - lse) adds the sink. */
        const float f = lse_keys == -CUDART_INF_F ? 0.f
                                                  : ctx.scale2 / sum * expf(lse_keys - lse);
        T *dst = (T *)p.out + tok * p.out_stride_tok + h * p.out_stride_head + v4 * 4;
        uint2 packed;
        packed.x = Dt<T>::pack(acc.x * f, acc.y * f);
        packed.y = Dt<T>::pack(acc.z * f, acc.w * f);
        *reinterpret_cast<uint2 *>(dst) = packed;
        if (p.lse && v4 == 0)
            p.lse[tok * p.lse_stride_tok + h * p.lse_stride_head] = lse;
    }
}

/* One work item: attention of the tile over KV [kv_begin, kv_end), then its output. */
template <typename T>
__device__ void run_item(const fi_mla_params &p, const RunCtx &ctx, const fi_work_item &it,
                         unsigned char *smem) {
    T *sQ = reinterpret_cast<T *>(smem);
    T *sKV = reinterpret_cast<T *>(smem + kSmemQ);
    T *sP = reinterpret_cast<T *>(smem + kSmemQ + kSmemKV);
    float *sMax = reinterpret_cast<float *>(smem + kSmemQ + kSmemKV + kSmemP);
    float *sL = sMax + 2 * kRows;
    int *sFlag = reinterpret_cast<int *>(sL + 2 * kRows);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int rg = warp >> 1, wh = warp & 1;
    const int g = lane >> 2, q4 = lane & 3;

    const fi_request_info rq = p.requests[it.request];
    const int nh = it.head_end - it.head_begin;
    const int M = (it.q_end - it.q_begin) * nh;
    const bool active = rg * 16 < M;
    const int kv_begin = it.kv_begin, kv_end = it.kv_end;
    const int nblk = (kv_end - kv_begin + kBlockN - 1) / kBlockN;

    /* Key bounds [lo, hi] of this thread's two rows (rg*16 + g and + 8). */
    int lo[2], hi[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = rg * 16 + g + 8 * i;
        if (r < M) {
            const int pos = rq.kv_len - rq.q_len + it.q_begin + r / nh;
            int h_ = ctx.causal ? pos : rq.kv_len - 1;
            int l_ = ctx.window_left >= 0 ? max(0, pos - ctx.window_left) : 0;
            lo[i] = max(l_, kv_begin);
            hi[i] = min(h_, kv_end - 1);
        } else {
            lo[i] = 0;
            hi[i] = -1;
        }
    }

    /* Prologue of the ring: Q with block 0, then blocks 1 .. kStages-2. */
    load_q<T>(p, sQ, it, rq, nh, M);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < nblk)
            load_kv<T>(p, sKV + s * kBlockN * kPitch, rq, kv_begin + s * kBlockN, kv_end);
        cp_async_commit();
    }

    float acc[32][4];
#pragma unroll
    for (int n = 0; n < 32; ++n)
        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    float m_run[2] = {-CUDART_INF_F, -CUDART_INF_F};
    float l_run[2] = {0.f, 0.f};

    const uint32_t sQ_a = smem_u32(sQ + (rg * 16 + (lane & 15)) * kPitch + (lane >> 4) * 8);
    const uint32_t sP_a =
        smem_u32(sP + (rg * 16 + (lane & 15)) * kPPitch + (lane >> 4) * 8);

    for (int b = 0; b < nblk; ++b) {
        cp_async_wait<kStages - 2>();
        __syncthreads();
        {
            const int nb = b + kStages - 1;
            if (nb < nblk)
                load_kv<T>(p, sKV + (nb % kStages) * kBlockN * kPitch, rq,
                           kv_begin + nb * kBlockN, kv_end);
            cp_async_commit();
        }
        const T *stage = sKV + (b % kStages) * kBlockN * kPitch;
        const int t0 = kv_begin + b * kBlockN;
        float s[2][2][4]; /* [k parity][n8 tile][frag]: two chains per tile for ILP */
        if (active) {
#pragma unroll
            for (int a = 0; a < 2; ++a)
#pragma unroll
                for (int n = 0; n < 2; ++n)
                    s[a][n][0] = s[a][n][1] = s[a][n][2] = s[a][n][3] = 0.f;
            /* B rows: tokens wh*16 + (lane>>4)*8 + (lane&7), k offset ((lane>>3)&1)*8. */
            const uint32_t sK_a = smem_u32(stage + (wh * 16 + (lane >> 4) * 8 + (lane & 7)) * kPitch +
                                           ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int k = 0; k < kDqk / 16; ++k) {
                uint32_t af[4], bf[4];
                ldsm_x4(sQ_a + k * 32, af);
                ldsm_x4(sK_a + k * 32, bf);
                Dt<T>::mma(s[k & 1][0], af, bf[0], bf[1]);
                Dt<T>::mma(s[k & 1][1], af, bf[2], bf[3]);
            }
            float mloc[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = e >> 1;
                    const int t = t0 + wh * 16 + n * 8 + q4 * 2 + (e & 1);
                    float v = (s[0][n][e] + s[1][n][e]) * ctx.scale_log2;
                    if (t < lo[i] || t > hi[i])
                        v = -CUDART_INF_F;
                    s[0][n][e] = v;
                    mloc[i] = fmaxf(mloc[i], v);
                }
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                mloc[i] = fmaxf(mloc[i], __shfl_xor_sync(0xffffffffu, mloc[i], 1));
                mloc[i] = fmaxf(mloc[i], __shfl_xor_sync(0xffffffffu, mloc[i], 2));
            }
            if (q4 == 0) {
                sMax[wh * kRows + rg * 16 + g] = mloc[0];
                sMax[wh * kRows + rg * 16 + g + 8] = mloc[1];
            }
        }
        __syncthreads();
        if (active) {
            float alpha[2], m_use[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const float mo = sMax[(wh ^ 1) * kRows + rg * 16 + g + 8 * i];
                const float m_new = fmaxf(m_run[i], fmaxf(sMax[wh * kRows + rg * 16 + g + 8 * i], mo));
                m_use[i] = m_new == -CUDART_INF_F ? 0.f : m_new;
                alpha[i] = exp2f(m_run[i] - m_use[i]);
                m_run[i] = m_new;
            }
            float rs[2] = {0.f, 0.f};
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                const float p0 = exp2f(s[0][n][0] - m_use[0]);
                const float p1 = exp2f(s[0][n][1] - m_use[0]);
                const float p2 = exp2f(s[0][n][2] - m_use[1]);
                const float p3 = exp2f(s[0][n][3] - m_use[1]);
                rs[0] += p0 + p1;
                rs[1] += p2 + p3;
                T *row0 = sP + (rg * 16 + g) * kPPitch + wh * 16 + n * 8 + q4 * 2;
                *reinterpret_cast<uint32_t *>(row0) = Dt<T>::pack(p0, p1);
                *reinterpret_cast<uint32_t *>(row0 + 8 * kPPitch) = Dt<T>::pack(p2, p3);
            }
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                rs[i] += __shfl_xor_sync(0xffffffffu, rs[i], 1);
                rs[i] += __shfl_xor_sync(0xffffffffu, rs[i], 2);
                l_run[i] = l_run[i] * alpha[i] + rs[i];
            }
#pragma unroll
            for (int n = 0; n < 32; ++n) {
                acc[n][0] *= alpha[0];
                acc[n][1] *= alpha[0];
                acc[n][2] *= alpha[1];
                acc[n][3] *= alpha[1];
            }
        }
        __syncthreads();
        if (active) {
            /* V = ckv: tokens are k, dims are n; ldmatrix.trans gives the col-major B frag. */
            const uint32_t sV_a = smem_u32(stage + (((lane >> 3) & 1) * 8 + (lane & 7)) * kPitch +
                                           wh * 256 + (lane >> 4) * 8);
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) {
                uint32_t af[4];
                ldsm_x4(sP_a + kk * 32, af);
#pragma unroll
                for (int nn = 0; nn < 16; ++nn) {
                    uint32_t bf[4];
                    ldsm_x4_t(sV_a + (kk * 16 * kPitch + nn * 16) * 2, bf);
                    Dt<T>::mma(acc[2 * nn], af, bf[0], bf[1]);
                    Dt<T>::mma(acc[2 * nn + 1], af, bf[2], bf[3]);
                }
            }
        }
    }
    cp_async_wait<0>();

    /* Row sums: each half summed its own tokens under the shared running max. */
    if (active && q4 == 0) {
        sL[wh * kRows + rg * 16 + g] = l_run[0];
        sL[wh * kRows + rg * 16 + g + 8] = l_run[1];
    }
    __syncthreads();
    const bool split = it.out_slot >= 0;
    if (active) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int r = rg * 16 + g + 8 * i;
            if (r >= M)
                continue;
            const float l = sL[r] + sL[kRows + r];
            const float lse_keys = l > 0.f ? (m_run[i] + log2f(l)) * kLn2 : -CUDART_INF_F;
            if (split) {
                const float inv = l > 0.f ? 1.f / l : 0.f;
                float *dst = p.partial_o + ((int64_t)it.out_slot * p.tile_rows + r) * kDv +
                             wh * 256 + q4 * 2;
#pragma unroll
                for (int n = 0; n < 32; ++n)
                    __stcg(reinterpret_cast<float2 *>(dst + n * 8),
                           make_float2(acc[n][2 * i] * inv, acc[n][2 * i + 1] * inv));
                if (wh == 0 && q4 == 0)
                    __stcg(p.partial_lse + (int64_t)it.out_slot * p.tile_rows + r, lse_keys);
            } else {
                const int h = it.head_begin + r % nh;
                const int64_t tok = (int64_t)rq.q_offset + it.q_begin + r / nh;
                const float lse = p.sinks ? logaddexp(lse_keys, p.sinks[h]) : lse_keys;
                const float f = l > 0.f ? ctx.scale2 / l * expf(lse_keys - lse) : 0.f;
                T *dst = (T *)p.out + tok * p.out_stride_tok + h * p.out_stride_head + wh * 256 +
                         q4 * 2;
#pragma unroll
                for (int n = 0; n < 32; ++n)
                    *reinterpret_cast<uint32_t *>(dst + n * 8) =
                        Dt<T>::pack(acc[n][2 * i] * f, acc[n][2 * i + 1] * f);
                if (p.lse && wh == 0 && q4 == 0)
                    p.lse[tok * p.lse_stride_tok + h * p.lse_stride_head] = lse;
            }
        }
    }
    if (split) {
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            const int n = p.groups[it.merge_group].num_splits;
            const uint32_t old = sem_inc(p.semaphores + it.merge_group, (uint32_t)(n - 1));
            *sFlag = old == (uint32_t)(n - 1);
        }
        __syncthreads();
        if (*sFlag) {
            __threadfence();
            merge_group<T>(p, ctx, it.merge_group);
        }
    }
    __syncthreads(); /* smem (Q, ring, flags) is reused by the next item */
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_kernel(const __grid_constant__ fi_mla_params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    /* Everything global (plan, q, KV, scales) may come from the previous kernel. */
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    RunCtx ctx;
    ctx.scale_log2 = (p.bmm1_scale_ptr ? *p.bmm1_scale_ptr : p.bmm1_scale) * kLog2e;
    ctx.scale2 = p.bmm2_scale_ptr ? *p.bmm2_scale_ptr : p.bmm2_scale;
    ctx.causal = p.header->causal;
    ctx.window_left = p.header->window_left;
    const int i0 = p.work_indptr[blockIdx.x], i1 = p.work_indptr[blockIdx.x + 1];
    for (int i = i0; i < i1; ++i) {
        const fi_work_item it = p.items[i];
        run_item<T>(p, ctx, it, smem);
    }
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

/* Host side: launch one instantiation (grid fixed at params.num_ctas). */
template <typename T>
cudaError_t launch(const fi_mla_params &p, int enable_pdl, cudaStream_t stream) {
    static bool attr_done = false; /* idempotent, so a race only repeats it */
    if (!attr_done) {
        cudaError_t e = cudaFuncSetAttribute(mla_decode_kernel<T>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)kSmemBytes);
        if (e != cudaSuccess)
            return e;
        attr_done = true;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)p.num_ctas);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kSmemBytes;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = enable_pdl ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, mla_decode_kernel<T>, p);
    if (e != cudaSuccess)
        return e;
    return cudaGetLastError();
}

}  // namespace fimla
