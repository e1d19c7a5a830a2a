/*
 * executor/gqa/gqa_rows16.cuh - the GQA consumers for items of more than 8 rows (sm_90a):
 * rows on the m16 side of mma.sync m16n8k16.  S = Q K^T and O += P V, Q and K through
 * ldmatrix, V through ldmatrix.trans (fp8 / NVFP4 rows converted into fp16 fragments),
 * P kept in registers (the S accumulator layout is the A operand's); at the item's end
 * the team combine and the rows' store.  The family's design: gqa_family.cuh.
 */
#pragma once

#include "executor/gqa/gqa_consume.cuh"

namespace figqa {
using namespace fi;

/* A warp's softmax state for its 16 rows (rows g and g + 8 in this lane) and its O. */
template <int D> struct Acc {
    float o[D / 8][4];
    float m[2], l[2]; /* l: this lane's columns only until finish_rows */
};

/* S = Q K^T for 16 rows x 8 NT tokens (NT 2 or 4: one or two 16-token slices; s[n] is
 * tokens 8n..8n+7 in the mma accumulator layout).  16-bit KV: K fragments by ldmatrix; qa(kk, frag) gives Q's A
 * fragment of k16 step kk (registers, or ldmatrix from the Q rows: QFrags).  sK: the slot's
 * K region from a 16-token tile (laid out as Geo says). */
template <typename C, int D, int NT, typename QA>
__device__ __forceinline__ void qk_scores(const unsigned char *sK, int lane, const QA &qa,
                                          float (&s)[NT][4]) {
    using G = Geo<D, 2 * D>;
    const uint32_t sKa = G::lane_addr(smem_u32(sK), (lane & 7) + ((lane >> 4) << 3), ((lane >> 3) & 1) * 16);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t q[4];
        qa(kk, q);
#pragma unroll
        for (int t = 0; t < NT / 2; ++t) { /* 16 tokens a step: NT / 2 independent chains */
            uint32_t kb[4];
            ldsm_x4(G::at(sKa, t, kk * 32), kb);
            Dt<C>::mma(s[2 * t], q, kb[0], kb[1]);
            Dt<C>::mma(s[2 * t + 1], q, kb[2], kb[3]);
        }
    }
}

/* fp8 KV: ldmatrix on the fp8 rows hands this lane 4 consecutive bytes of token g (dims
 * 4 q4 .. 4 q4 + 3 of a 16-dim group) as b0 / b1 of one k16 step; the dot product does
 * not care about the order of its terms, so Q's fragment takes the same dims (a0 / a1 =
 * dims 4 q4, +1 of rows g / g + 8, a2 / a3 = dims 4 q4 + 2, +3: QFrags).  qa as qk_scores. */
template <int D, int NT, typename QA>
__device__ __forceinline__ void qk_scores_fp8(const unsigned char *sK, int lane, const QA &qa,
                                              float (&s)[NT][4]) {
    using G = Geo<D, D>; /* padded rows (Geo::kSwz false) */
    /* matrices: tokens 0-7 / 8-15 (lane bit 4) x bytes +0 / +16 (lane bit 3) of 32 dims */
    const uint32_t sKa = smem_u32(sK + ((lane & 7) + ((lane >> 4) << 3)) * G::kKvPitch + ((lane >> 3) & 1) * 16);
#pragma unroll
    for (int c = 0; c < D / 32; ++c) {
        uint32_t kb[NT / 2][4];
#pragma unroll
        for (int t = 0; t < NT / 2; ++t) /* kb[t][0]: tok 0-7 dims 32c..+15, [1]: +16.., [2] / [3]: tok 8-15 */
            ldsm_x4(sKa + t * 16 * G::kKvPitch + c * 32, kb[t]);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            uint32_t q[4];
            qa(2 * c + h, q);
#pragma unroll
            for (int t = 0; t < NT / 2; ++t) {
                const uint32_t k0 = kb[t][h], k1 = kb[t][2 + h];
                Dt<__half>::mma(s[2 * t], q, e4m3x2_to_f16x2(k0), e4m3x2_hi_to_f16x2(k0));
                Dt<__half>::mma(s[2 * t + 1], q, e4m3x2_to_f16x2(k1), e4m3x2_hi_to_f16x2(k1));
            }
        }
    }
}

/* S = Q K^T for NVFP4 K: a lane reads 4 bytes (dims 8 q4 .. 8 q4 + 7 of a 32-dim block) of
 * token g of each 8-token tile and its block's scale; the even nibbles (dims 0, 2, 4, 6)
 * and the odd ones convert as two e4m3 words, so the two k16 steps of the block take dims
 * (0, 2 | 1, 3) and (4, 6 | 5, 7), which QFrags<2> gives Q in the same order.  sSf: the
 * slot's K scale rows (D / 16 bytes each). */
template <int D, int NT, typename QA>
__device__ __forceinline__ void qk_scores_fp4(const unsigned char *sK, const unsigned char *sSf,
                                              int lane, const QA &qa, float (&s)[NT][4]) {
    using G = Geo<D, D / 2, D / 16>;
    const int g = lane >> 2, q4 = lane & 3;
#pragma unroll
    for (int c = 0; c < D / 32; ++c) {
        uint32_t b[NT][4];
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int tok = 8 * t + g;
            const uint32_t w = *reinterpret_cast<const uint32_t *>(sK + tok * G::kKvPitch + 16 * c + 4 * q4);
            const uint32_t sc = sSf[tok * (D / 16) + 2 * c + (q4 >> 1)];
            const __half2 s2 = sf_pair(sc, sc);
            const uint32_t ev = e2m1_bytes_to_e4m3(w), od = e2m1_bytes_to_e4m3(w >> 4);
            b[t][0] = hmul2u(e4m3x2_to_f16x2(ev), s2);    /* dims 0, 2 */
            b[t][1] = hmul2u(e4m3x2_to_f16x2(od), s2);    /* dims 1, 3 */
            b[t][2] = hmul2u(e4m3x2_hi_to_f16x2(ev), s2); /* dims 4, 6 */
            b[t][3] = hmul2u(e4m3x2_hi_to_f16x2(od), s2); /* dims 5, 7 */
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            uint32_t q[4];
            qa(2 * c + h, q);
#pragma unroll
            for (int t = 0; t < NT; ++t)
                Dt<__half>::mma(s[t], q, b[t][2 * h], b[t][2 * h + 1]);
        }
    }
}

/* O += P V, NVFP4 V: ldmatrix.trans on 16-byte rows treats 4-nibble groups as 16-bit
 * elements, so a lane gets tokens 2 q4, 2 q4 + 1 x dims 4 g .. 4 g + 3 of a 32-dim block;
 * nibble j of both tokens pairs up as the B operand of tile 4 c + j (col_of).  Each token
 * has its own block scale.  sSf: the slot's V scale rows. */
template <int D, int NT>
__device__ __forceinline__ void pv_accumulate_fp4(const unsigned char *sV, const unsigned char *sSf,
                                                  int lane, const uint32_t (&pa)[NT / 2][4], Acc<D> &a) {
    using G = Geo<D, D / 2, D / 16>; /* padded rows */
    const int g = lane >> 2, q4 = lane & 3;
    /* matrices: tokens 0-7 / 8-15 (lane bit 3) x bytes +0 / +16 (lane bit 4): 2 blocks */
    const uint32_t sVa = smem_u32(sV + (((lane >> 3) & 1) * 8 + (lane & 7)) * G::kKvPitch + (lane >> 4) * 16);
#pragma unroll
    for (int t = 0; t < NT / 2; ++t)
#pragma unroll
        for (int cc = 0; cc < D / 64; ++cc) {
            uint32_t vb[4];
            ldsm_x4_t(sVa + t * 16 * G::kKvPitch + cc * 32, vb);
#pragma unroll
            for (int hb = 0; hb < 2; ++hb) {
                const int c = 2 * cc + hb, grp = 2 * c + (g >> 2);
                uint32_t bj[2][4]; /* [token half][dim j] */
#pragma unroll
                for (int k = 0; k < 2; ++k) { /* tokens 2 q4 (+8 k), 2 q4 + 1 (+8 k) */
                    const int t0 = 16 * t + 8 * k + 2 * q4;
                    const __half2 s2 = sf_pair(sSf[t0 * (D / 16) + grp], sSf[(t0 + 1) * (D / 16) + grp]);
                    const uint32_t w = vb[2 * hb + k];
                    const uint32_t e02 = __byte_perm(e2m1_bytes_to_e4m3(w), 0, 0x3120);
                    const uint32_t e13 = __byte_perm(e2m1_bytes_to_e4m3(w >> 4), 0, 0x3120);
                    bj[k][0] = hmul2u(e4m3x2_to_f16x2(e02), s2);
                    bj[k][1] = hmul2u(e4m3x2_to_f16x2(e13), s2);
                    bj[k][2] = hmul2u(e4m3x2_hi_to_f16x2(e02), s2);
                    bj[k][3] = hmul2u(e4m3x2_hi_to_f16x2(e13), s2);
                }
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    Dt<__half>::mma(a.o[4 * c + j], pa[t], bj[0][j], bj[1][j]);
            }
        }
}

/* Q's A fragments of one warp's 16 rows, for every k16 step: held in registers for the
 * item (D <= 128: 32 registers) or read from the Q rows at each use (D 256).  16-bit KV:
 * the ldmatrix layout; fp8 KV: the dim order of qk_scores_fp8 (two 8-byte reads). */
template <int KIND, int D> struct QFrags {
    static constexpr bool kReg = D <= 128;
    uint32_t f[kReg ? D / 16 : 1][4];
    uint32_t base; /* shared address: row g (fp8, NVFP4) or the ldmatrix row of this lane */
    __device__ __forceinline__ void fetch(int kk, uint32_t *q) const {
        if (KIND == 0) {
            ldsm_x4(base + kk * 32, q);
            return;
        }
        /* fp8: dims 16 kk + 4 q4 .. +3 (base holds the 4 q4); NVFP4: dims
         * 32 (kk / 2) + 8 q4 + 4 (kk % 2) .. +3 (base holds the 8 q4), taken in the order
         * 0, 2 | 1, 3 of qk_scores_fp4 */
        const uint32_t a = base + (KIND == 1 ? 16 * kk : 32 * (kk >> 1) + 4 * (kk & 1)) * 2;
        uint32_t x0, y0, x1, y1;
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(x0), "=r"(y0) : "r"(a));
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(x1), "=r"(y1)
                     : "r"(a + 8 * Geo<D, D>::kPitch * 2));
        if (KIND == 1) {
            q[0] = x0; q[1] = x1; q[2] = y0; q[3] = y1;
        } else {
            q[0] = __byte_perm(x0, y0, 0x5410); /* dims 0, 2 */
            q[1] = __byte_perm(x1, y1, 0x5410);
            q[2] = __byte_perm(x0, y0, 0x7632); /* dims 1, 3 */
            q[3] = __byte_perm(x1, y1, 0x7632);
        }
    }
    /* sQ: the item's Q rows (fp16 for fp8 / NVFP4 KV); rg: the warp's row group. */
    __device__ __forceinline__ void load(const void *sQ, int rg, int lane) {
        const int row = rg * 16 + (KIND ? (lane >> 2) : (lane & 15));
        base = smem_u32(static_cast<const unsigned char *>(sQ) + (size_t)row * Geo<D, 2 * D>::kRowBytes) +
               (KIND == 0 ? (lane >> 4) * 16 : KIND == 1 ? (lane & 3) * 8 : (lane & 3) * 16);
        if (kReg) {
#pragma unroll
            for (int kk = 0; kk < (kReg ? D / 16 : 1); ++kk)
                fetch(kk, f[kk]);
        }
    }
    __device__ __forceinline__ void operator()(int kk, uint32_t *q) const {
        if (kReg) {
            q[0] = f[kk][0]; q[1] = f[kk][1]; q[2] = f[kk][2]; q[3] = f[kk][3];
        } else {
            fetch(kk, q);
        }
    }
};

/* Mask, online softmax update of the warp's state (rescaling O), and P as the A operand
 * of P V (the accumulator layout of S is the A layout of a k16 step). */
template <typename C, int D, int NT>
__device__ __forceinline__ void softmax_step(const RunCtx &ctx, const Lane &ln, int t0,
                                             const int *lo, const int *hi, float (&s)[NT][4],
                                             Acc<D> &a, uint32_t (&pa)[NT / 2][4]) {
    float mx[2] = {-CUDART_INF_F, -CUDART_INF_F};
    /* a slice inside both rows' key ranges skips the per-score mask test */
    const bool whole = keys_inside(lo, hi, t0, t0 + 8 * NT - 1);
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = e >> 1;
            const int tok = t0 + n * 8 + ln.q4 * 2 + (e & 1);
            const float v = s[n][e] * ctx.scale_log2;
            s[n][e] = whole || (tok >= lo[i] && tok <= hi[i]) ? v : -CUDART_INF_F;
            mx[i] = fmaxf(mx[i], s[n][e]);
        }
    float m_use[2], alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        const float m_new = fmaxf(a.m[i], mx[i]);
        m_use[i] = m_new == -CUDART_INF_F ? 0.f : m_new;
        alpha[i] = ex2_ftz(a.m[i] - m_use[i]);
        a.m[i] = m_new;
        a.l[i] *= alpha[i];
    }
    /* O is rescaled only when a row max of the warp moved (x 1 would leave the bits as
     * they are): past the first slices of a row, most slices skip these D / 2 products. */
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            a.o[n][0] *= alpha[0];
            a.o[n][1] *= alpha[0];
            a.o[n][2] *= alpha[1];
            a.o[n][3] *= alpha[1];
        }
    }
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[n][e] = ex2_ftz(s[n][e] - m_use[e >> 1]);
            a.l[e >> 1] += s[n][e];
        }
#pragma unroll
    for (int t = 0; t < NT / 2; ++t) { /* k16 step t of P V: tokens 16t .. 16t + 15 */
        pa[t][0] = Dt<C>::pack(s[2 * t][0], s[2 * t][1]);
        pa[t][1] = Dt<C>::pack(s[2 * t][2], s[2 * t][3]);
        pa[t][2] = Dt<C>::pack(s[2 * t + 1][0], s[2 * t + 1][1]);
        pa[t][3] = Dt<C>::pack(s[2 * t + 1][2], s[2 * t + 1][3]);
    }
}

/* O += P V, 16-bit V by ldmatrix.trans: a.o[n] holds dims 8n + 2 q4, +1 (col_of). */
template <typename C, int D, int NT>
__device__ __forceinline__ void pv_accumulate(const unsigned char *sV, int lane,
                                              const uint32_t (&pa)[NT / 2][4], Acc<D> &a) {
    using G = Geo<D, 2 * D>;
    const uint32_t sVa = G::lane_addr(smem_u32(sV), ((lane >> 3) & 1) * 8 + (lane & 7), (lane >> 4) * 16);
#pragma unroll
    for (int t = 0; t < NT / 2; ++t)
#pragma unroll
        for (int nn = 0; nn < D / 16; ++nn) {
            uint32_t vb[4];
            ldsm_x4_t(G::at(sVa, t, nn * 32), vb);
            Dt<C>::mma(a.o[2 * nn], pa[t], vb[0], vb[1]);
            Dt<C>::mma(a.o[2 * nn + 1], pa[t], vb[2], vb[3]);
        }
}

/* O += P V, fp8 V: ldmatrix.trans on 16-byte rows of fp8 treats byte pairs as 16-bit
 * elements, so a lane gets tokens 2 q4, 2 q4 + 1 x dims 2 g, 2 g + 1 of a 16-dim group;
 * the even dims (bytes 0, 2) and the odd dims (bytes 1, 3) are two n8 tiles.  So a.o[n]
 * of 32-dim block c = n / 4 holds dims 32 c + 16 ((n / 2) % 2) + 4 q4 + {0, 2} + (n % 2)
 * (col_of). */
template <int D, int NT>
__device__ __forceinline__ void pv_accumulate_fp8(const unsigned char *sV, int lane,
                                                  const uint32_t (&pa)[NT / 2][4], Acc<D> &a) {
    using G = Geo<D, D>; /* padded rows */
    /* matrices: tokens 0-7 / 8-15 (lane bit 3) x bytes +0 / +16 (lane bit 4) */
    const uint32_t sVa = smem_u32(sV + (((lane >> 3) & 1) * 8 + (lane & 7)) * G::kKvPitch + (lane >> 4) * 16);
#pragma unroll
    for (int t = 0; t < NT / 2; ++t)
#pragma unroll
        for (int c = 0; c < D / 32; ++c) {
            uint32_t vb[4];
            ldsm_x4_t(sVa + t * 16 * G::kKvPitch + c * 32, vb); /* [0] tok 0-7 bytes 0-15, [1] tok 8-15, [2] / [3] bytes 16-31 */
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint32_t lo = bytes2(vb[2 * h], 0x3120u), hi = bytes2(vb[2 * h + 1], 0x3120u);
                Dt<__half>::mma(a.o[4 * c + 2 * h], pa[t], e4m3x2_to_f16x2(lo), e4m3x2_to_f16x2(hi));
                Dt<__half>::mma(a.o[4 * c + 2 * h + 1], pa[t], e4m3x2_hi_to_f16x2(lo),
                                e4m3x2_hi_to_f16x2(hi));
            }
        }
}

/* The output dim of a.o[n][e] (e 0 / 1; rows g and g + 8 alike) for this lane. */
template <int KIND>
__device__ __forceinline__ int col_of(int n, int e, int q4) {
    if (KIND == 1)
        return 32 * (n >> 2) + 16 * ((n >> 1) & 1) + 4 * q4 + 2 * e + (n & 1);
    if (KIND == 2) /* pv_accumulate_fp4: tile 4 c + j holds dims 32 c + 4 g + j */
        return 32 * (n >> 2) + 8 * q4 + 4 * e + (n & 3);
    return 8 * n + 2 * q4 + e;
}

/* Combine the W warp states of each team in a fixed order: the row max and sum over the
 * team (sM / sL), every O rescaled to the team max, then a tree of adds through the
 * combine buffer (warps W/2.. hand to 0.., and so on).  Leaves warp tw == 0 of each team
 * with the team's O and the rows' max (mt) and sum (lt). */
template <int D>
__device__ __forceinline__ void combine_team(unsigned char *smem, const Lane &ln, Acc<D> &a,
                                             float *mt, float *lt) {
    using G = Geo<D, 2 * D>; /* the fixed region and the combine buffer do not depend on KB */
    float *sM = reinterpret_cast<float *>(smem + G::kOffM);
    float *sL = reinterpret_cast<float *>(smem + G::kOffL);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        a.l[i] += __shfl_xor_sync(0xffffffffu, a.l[i], 1);
        a.l[i] += __shfl_xor_sync(0xffffffffu, a.l[i], 2);
    }
    if (ln.q4 == 0) {
        sM[ln.warp * 16 + ln.g] = a.m[0];
        sM[ln.warp * 16 + ln.g + 8] = a.m[1];
        sL[ln.warp * 16 + ln.g] = a.l[0];
        sL[ln.warp * 16 + ln.g + 8] = a.l[1];
    }
    cta_sync<kThreads>();
    const int w0 = ln.rg * ln.W;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float f = team_row(sM, sL, w0, ln.W, ln.g + 8 * i, a.m[i], &mt[i], &lt[i]);
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            a.o[n][2 * i] *= f;
            a.o[n][2 * i + 1] *= f;
        }
    }
    cta_sync<kThreads>(); /* sM / sL read everywhere: the next item may rewrite them */
    tree_add<D, D / 8>(smem, ln, a.o);
}

/* Store warp tw == 0's rows: unsplit, out = bmm2 * O / l * exp(lse_keys - lse) with
 * lse = logaddexp(lse_keys, sink); split, the fp32 partial O / l and lse_keys (no sink, no
 * bmm2) into the item's slot.  l == 0 (no key): zeros and -inf; NaN stays NaN.  Column
 * pairs by col_of: 16-bit KV, a.o[n][e] at 8 n + 2 q4 + e; fp8 KV, tiles n and n + 1 (n
 * even) interleave into dims base .. base + 3. */
template <typename T, int KIND, int D>
__device__ __forceinline__ void store_rows(const fi_gqa_params &p, const RunCtx &ctx,
                                           const fi_work_item &it, const fi_request_info &rq,
                                           int M, int nh, const Lane &ln, const Acc<D> &a,
                                           const float *mt, const float *lt) {
    const fi_exec_common &c = p.c;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = ln.rg * 16 + ln.g + 8 * i;
        if (r >= M)
            continue;
        const float l = lt[i];
        const float lse_keys = l == 0.f ? -CUDART_INF_F : (mt[i] + log2f(l)) * kLn2;
        const bool split = it.out_slot >= 0;
        const int h = it.head_begin + r % nh;
        const int64_t tok = (int64_t)rq.q_offset + it.q_begin + r / nh;
        const float lse = c.sinks && !split ? logaddexp(lse_keys, c.sinks[h]) : lse_keys;
        const float f = l == 0.f ? 0.f : split ? 1.f / l : ctx.scale2 / l * expf(lse_keys - lse);
        float *pdst = c.partial_o + ((int64_t)it.out_slot * c.tile_rows + r) * D;
        const int64_t off = tok * c.out_stride_tok + h * c.out_stride_head;
        if constexpr (KIND == 2) { /* tiles 4 c .. 4 c + 3: dims d0 .. d0 + 3 for each e */
#pragma unroll
            for (int n = 0; n < D / 8; n += 4)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int d0 = col_of<2>(n, e, ln.q4);
                    const float v0 = a.o[n][2 * i + e] * f, v1 = a.o[n + 1][2 * i + e] * f;
                    const float v2 = a.o[n + 2][2 * i + e] * f, v3 = a.o[n + 3][2 * i + e] * f;
                    if (split) {
                        __stcg(reinterpret_cast<float4 *>(pdst + d0), make_float4(v0, v1, v2, v3));
                    } else {
                        store_out2<T>(c, off + d0, v0, v1);
                        store_out2<T>(c, off + d0 + 2, v2, v3);
                    }
                }
        }
#pragma unroll
        for (int n = 0; n < (KIND == 2 ? 0 : D / 8); n += 2) {
            /* four outputs: dims d0, d0 + 1 of tile n (16-bit) or d0 .. d0 + 3 (fp8) */
            constexpr bool F8 = KIND == 1;
            const int d0 = col_of<KIND>(n, 0, ln.q4), d1 = col_of<KIND>(n + 1, 0, ln.q4);
            const float x0 = a.o[n][2 * i] * f, x1 = a.o[n][2 * i + 1] * f;
            const float y0 = a.o[n + 1][2 * i] * f, y1 = a.o[n + 1][2 * i + 1] * f;
            if (split) {
                if (F8) {
                    __stcg(reinterpret_cast<float4 *>(pdst + d0), make_float4(x0, y0, x1, y1));
                } else {
                    __stcg(reinterpret_cast<float2 *>(pdst + d0), make_float2(x0, x1));
                    __stcg(reinterpret_cast<float2 *>(pdst + d1), make_float2(y0, y1));
                }
            } else if (F8) {
                store_out2<T>(c, off + d0, x0, y0);
                store_out2<T>(c, off + d0 + 2, x1, y1);
            } else {
                store_out2<T>(c, off + d0, x0, x1);
                store_out2<T>(c, off + d1, y0, y1);
            }
        }
        if (ln.q4 == 0) {
            if (split)
                __stcg(c.partial_lse + (int64_t)it.out_slot * c.tile_rows + r, lse_keys);
            else if (c.lse)
                c.lse[tok * c.lse_stride_tok + h * c.lse_stride_head] = lse;
        }
    }
}

}  // namespace figqa
