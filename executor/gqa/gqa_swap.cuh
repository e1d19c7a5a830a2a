/*
 * executor/gqa/gqa_swap.cuh - the GQA consumers for items of at most 8 rows (group x q_len
 * <= 8: Llama-3 8B / 70B, Qwen and Mistral decode), with the matmuls transposed so the
 * tokens are the mma's M side:
 *     S^T = K Q^T      m16n8k16: 16 tokens x 8 rows x 16 dims
 *     O^T += V^T P^T   m16n8k16: 16 dims x 8 rows x 16 tokens
 * The 16-row path (gqa_rows16.cuh) puts the rows on the m16 side, where 4 rows leave 12 of 16
 * idle; here they sit on the n8 side, so a token costs half the mma.sync, O half the
 * registers (D / 4 floats a lane) and the softmax half the exponentials.  The producer,
 * the ring protocol, the team combine and the split merge are the 16-row path's.
 *
 * Fragments (lane = 4 g + q4):
 *  - S^T tile t (tokens 16 t ..): s[t][0..1] = token g, rows 2 q4, 2 q4 + 1; s[t][2..3] =
 *    token g + 8, same rows.  K is the A operand, taken from the slot rows as the 16-row
 *    path takes Q (ldmatrix; fp8 and NVFP4 bytes converted to fp16 in registers, the k
 *    order permuted within a step and Q's B fragment permuted the same way: QFragsT).
 *  - P^T, the B operand of O^T += V^T P^T, is the packed S^T accumulator transposed in
 *    registers: for 8 tokens x 8 rows the accumulator is the ldmatrix layout of
 *    [token][row], and movmatrix.trans turns it into that of [row][token], which is the B
 *    fragment (k = token, n = row).
 *  - O^T tile n: o[n][0..1] = dim dim_of<KIND>(n, 0, g), rows 2 q4, 2 q4 + 1; o[n][2..3] =
 *    dim dim_of<KIND>(n, 1, g).  V^T (the A operand) comes from ldmatrix.trans of the V rows.
 * Rows past the item's M read stale Q rows; the mma keeps columns apart and the mask sets
 * their scores to -inf, so they never reach a stored row.
 * Source: computing a matmul transposed so that its large dimension (here the KV tokens)
 * fills the mma's M side is the standard remedy for few query rows; the online softmax is
 * FlashAttention-2's (Dao 2023); the tile and the fragment maps are this file's own.
 */
#pragma once

#include "executor/gqa/gqa_consume.cuh"

namespace figqa {
using namespace fi;

constexpr int kSwapRows = FI_GQA_SWAP_ROWS; /* items of at most this many rows take this path */

/* A warp's softmax state for rows 2 q4, 2 q4 + 1, and its O^T (D / 16 tiles). */
template <int D> struct AccT {
    float o[D / 16][4];
    float m[2], l[2]; /* l: this lane's tokens only until combine_t */
};

/* The output dim of O^T tile n, half h (0: m = g, 1: m = g + 8), for KV kind KIND. */
template <int KIND>
__device__ __forceinline__ int dim_of(int n, int h, int g) {
    if (KIND == 1) /* fp8: tiles 2 c / 2 c + 1 take the even / odd dims of 32-dim block c */
        return 32 * (n >> 1) + 16 * h + 2 * g + (n & 1);
    if (KIND == 2) /* NVFP4: tile 4 c + j takes dims 64 c + 32 h + 4 g + j */
        return 64 * (n >> 2) + 32 * h + 4 * g + (n & 3);
    return 16 * n + 8 * h + g;
}

/* Q^T's B fragments of every k16 step, for row g, in registers for the item (D / 8
 * registers).  The k order matches the A fragments qk_t builds:
 *  16-bit: b0 = dims 16 kk + 2 q4, +1, b1 = +8, +9 (the mma's own order);
 *  fp8:    b0 = dims 16 kk + 4 q4, +1, b1 = +2, +3;
 *  NVFP4:  step kk = 2 c + h: b0 = dims 32 c + 8 q4 + 4 h + {0, 2}, b1 = + {1, 3}. */
template <int KIND, int D> struct QFragsT {
    uint32_t f[D / 16][2];
    /* sQ: the item's Q rows (fp16 for fp8 / NVFP4 KV) */
    __device__ __forceinline__ void load(const void *sQ, int lane) {
        const int g = lane >> 2, q4 = lane & 3;
        const uint16_t *row = reinterpret_cast<const uint16_t *>(
            static_cast<const unsigned char *>(sQ) + (size_t)g * Geo<D, 2 * D>::kRowBytes);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            if (KIND == 0) {
                f[kk][0] = *reinterpret_cast<const uint32_t *>(row + 16 * kk + 2 * q4);
                f[kk][1] = *reinterpret_cast<const uint32_t *>(row + 16 * kk + 2 * q4 + 8);
            } else if (KIND == 1) {
                const uint2 v = *reinterpret_cast<const uint2 *>(row + 16 * kk + 4 * q4);
                f[kk][0] = v.x;
                f[kk][1] = v.y;
            } else {
                const uint2 v = *reinterpret_cast<const uint2 *>(row + 32 * (kk >> 1) + 8 * q4 + 4 * (kk & 1));
                f[kk][0] = __byte_perm(v.x, v.y, 0x5410); /* dims 0, 2 */
                f[kk][1] = __byte_perm(v.x, v.y, 0x7632); /* dims 1, 3 */
            }
        }
    }
};

/* ldmatrix lane address of a 16 x 32-byte block of K or V region `region` (shared
 * address, Geo G's layout): matrices (tokens 0-7, bytes 0-15), (8-15, 0-15), (0-7, 16-31),
 * (8-15, 16-31): the A operand order when tokens are M. */
template <class G> __device__ __forceinline__ uint32_t lane_a(uint32_t region, int lane) {
    return G::lane_addr(region, (lane & 7) + ((lane >> 3) & 1) * 8, (lane >> 4) * 16);
}
/* ... and matrices (0-7, 0-15), (0-7, 16-31), (8-15, 0-15), (8-15, 16-31), which with
 * .trans is the A operand order when dims are M (V^T). */
template <class G> __device__ __forceinline__ uint32_t lane_vt(uint32_t region, int lane) {
    return G::lane_addr(region, (lane & 7) + ((lane >> 4) & 1) * 8, ((lane >> 3) & 1) * 16);
}

/* NVFP4 here leaves the 2^-6 of e2m1_bytes_to_e4m3 in K and V (the 16-row path multiplies
 * every block scale by 64 instead) and takes it back in fp32: scores x kFp4Up before the
 * softmax, outputs x kFp4Up at the store.  The fp16 products e2m1 x 2^-6 x scale stay
 * exact (>= 2^-16 with at most 6 significant bits, inside fp16's subnormal grid). */
constexpr float kFp4Up = 64.f;
/* Word w of token tok's block-scale row (D / 16 e4m3 bytes, 4-byte aligned). */
template <int D>
__device__ __forceinline__ uint32_t sf_word(const unsigned char *sSf, int tok, int w) {
    return reinterpret_cast<const uint32_t *>(sSf + tok * (D / 16))[w];
}
/* Byte i of words a and b (two block scales) as an fp16 pair. */
__device__ __forceinline__ __half2 sf_pair_raw(uint32_t a, uint32_t b, uint32_t i) {
    const uint32_t h = e4m3x2_to_f16x2(__byte_perm(a, b, i | ((i + 4) << 4)));
    return *reinterpret_cast<const __half2 *>(&h);
}

/* S^T = K Q^T for a slot's NT 16-token tiles (G: the slot geometry).  sK: the K region (Geo's layout); sSf: NVFP4
 * scale rows of K (D / 16 bytes a token). */
template <typename C, int KIND, class G, int D, int NT>
__device__ __forceinline__ void qk_t(const unsigned char *sK, const unsigned char *sSf, int lane,
                                     const QFragsT<KIND, D> &qf, float (&s)[NT][4]) {
    /* even and odd k16 steps accumulate apart (x[0] / x[1]) and are added at the end: 2 NT
     * independent mma chains of D / 32 instead of NT of D / 16 (one warp a scheduler
     * cannot hide a long chain's latency) */
    float x[2][NT][4];
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int t = 0; t < NT; ++t)
            x[u][t][0] = x[u][t][1] = x[u][t][2] = x[u][t][3] = 0.f;
    if constexpr (KIND == 0) {
        const uint32_t base = lane_a<G>(smem_u32(sK), lane);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                uint32_t a[4];
                ldsm_x4(G::at(base, t, kk * 32), a);
                Dt<C>::mma(x[kk & 1][t], a, qf.f[kk][0], qf.f[kk][1]);
            }
    } else if constexpr (KIND == 1) {
        /* a lane gets 4 bytes (dims 4 q4 .. +3 of a 16-dim chunk) of tokens g and g + 8 */
        const uint32_t base = lane_a<G>(smem_u32(sK), lane);
#pragma unroll
        for (int c = 0; c < D / 32; ++c)
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                uint32_t k[4];
                ldsm_x4(G::at(base, t, c * 32), k);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint32_t a[4] = {e4m3x2_to_f16x2(k[2 * h]), e4m3x2_to_f16x2(k[2 * h + 1]),
                                           e4m3x2_hi_to_f16x2(k[2 * h]), e4m3x2_hi_to_f16x2(k[2 * h + 1])};
                    Dt<__half>::mma(x[h][t], a, qf.f[2 * c + h][0], qf.f[2 * c + h][1]);
                }
            }
    } else {
        /* a lane reads 4 bytes (dims 8 q4 .. +7 of a 32-dim block) of tokens g and g + 8,
         * even and odd nibbles converted apart, each times its token's block scale */
        const int g = lane >> 2, q4 = lane & 3;
#pragma unroll
        for (int c = 0; c < D / 32; ++c)
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                uint32_t ev[2], od[2];
                __half2 sc[2];
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    const int tok = 16 * t + 8 * u + g;
                    const uint32_t w = *reinterpret_cast<const uint32_t *>(sK + tok * G::kKvPitch + 16 * c + 4 * q4);
                    const uint32_t sw = sf_word<D>(sSf, tok, c >> 1); /* block 2 c + q4 / 2 */
                    sc[u] = sf_pair_raw(sw, sw, 2 * (c & 1) + (q4 >> 1));
                    ev[u] = e2m1_bytes_to_e4m3(w);
                    od[u] = e2m1_bytes_to_e4m3(w >> 4);
                }
                const uint32_t a0[4] = {hmul2u(e4m3x2_to_f16x2(ev[0]), sc[0]), hmul2u(e4m3x2_to_f16x2(ev[1]), sc[1]),
                                        hmul2u(e4m3x2_to_f16x2(od[0]), sc[0]), hmul2u(e4m3x2_to_f16x2(od[1]), sc[1])};
                Dt<__half>::mma(x[0][t], a0, qf.f[2 * c][0], qf.f[2 * c][1]);
                const uint32_t a1[4] = {hmul2u(e4m3x2_hi_to_f16x2(ev[0]), sc[0]), hmul2u(e4m3x2_hi_to_f16x2(ev[1]), sc[1]),
                                        hmul2u(e4m3x2_hi_to_f16x2(od[0]), sc[0]), hmul2u(e4m3x2_hi_to_f16x2(od[1]), sc[1])};
                Dt<__half>::mma(x[1][t], a1, qf.f[2 * c + 1][0], qf.f[2 * c + 1][1]);
            }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            s[t][e] = x[0][t][e] + x[1][t][e];
}

/* Mask, online softmax update (rows 2 q4, 2 q4 + 1: their tokens are spread over the 8
 * lanes of equal q4), and P^T as B fragments: pb[t][0] tokens 16 t + 0..7, pb[t][1] + 8..15. */
template <typename C, int D, int NT>
__device__ __forceinline__ void softmax_t(float scale_log2, int g, int t0, const int *lo, const int *hi,
                                          float (&s)[NT][4], AccT<D> &a, uint32_t (&pb)[NT][2]) {
    float mx[2] = {-CUDART_INF_F, -CUDART_INF_F};
    /* a slice inside both rows' key ranges skips the per-score mask test */
    const bool whole = keys_inside(lo, hi, t0, t0 + 16 * NT - 1);
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = e & 1;
            const int tok = t0 + 16 * t + g + 8 * (e >> 1);
            const float v = s[t][e] * scale_log2;
            s[t][e] = whole || (tok >= lo[i] && tok <= hi[i]) ? v : -CUDART_INF_F;
            mx[i] = fmaxf(mx[i], s[t][e]);
        }
    float m_use[2], alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int x = 4; x <= 16; x <<= 1)
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], x));
        const float m_new = fmaxf(a.m[i], mx[i]);
        m_use[i] = m_new == -CUDART_INF_F ? 0.f : m_new;
        alpha[i] = ex2_ftz(a.m[i] - m_use[i]);
        a.m[i] = m_new;
        a.l[i] *= alpha[i];
    }
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) { /* as softmax_step */
#pragma unroll
        for (int n = 0; n < D / 16; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                a.o[n][e] *= alpha[e & 1];
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[t][e] = ex2_ftz(s[t][e] - m_use[e & 1]);
            a.l[e & 1] += s[t][e];
        }
        pb[t][0] = movm_t(Dt<C>::pack(s[t][0], s[t][1]));
        pb[t][1] = movm_t(Dt<C>::pack(s[t][2], s[t][3]));
    }
}

/* O^T += V^T P^T for a slot's NT 16-token tiles.  sV: V rows; sSf: NVFP4 V scale rows. */
template <typename C, int KIND, class G, int D, int NT>
__device__ __forceinline__ void pv_t(const unsigned char *sV, const unsigned char *sSf, int lane,
                                     const uint32_t (&pb)[NT][2], AccT<D> &a) {
    const uint32_t base = lane_vt<G>(smem_u32(sV), lane);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        if constexpr (KIND == 0) { /* 16 dims a tile: m = g <-> dim 16 n + g, m = g + 8 <-> + 8 */
#pragma unroll
            for (int n = 0; n < D / 16; ++n) {
                uint32_t v[4];
                ldsm_x4_t(G::at(base, t, n * 32), v);
                const uint32_t av[4] = {v[0], v[1], v[2], v[3]};
                Dt<C>::mma(a.o[n], av, pb[t][0], pb[t][1]);
            }
        } else if constexpr (KIND == 1) {
            /* v[r]: tokens 2 q4, 2 q4 + 1 (+ 8 for r >= 2) x bytes 2 g, 2 g + 1 of chunk r % 2;
             * byte-permuted to (dim 2 g: both tokens | dim 2 g + 1: both tokens) */
#pragma unroll
            for (int c = 0; c < D / 32; ++c) {
                uint32_t v[4];
                ldsm_x4_t(G::at(base, t, c * 32), v);
                uint32_t p[4];
#pragma unroll
                for (int r = 0; r < 4; ++r)
                    p[r] = bytes2(v[r], 0x3120u);
                const uint32_t ae[4] = {e4m3x2_to_f16x2(p[0]), e4m3x2_to_f16x2(p[1]), e4m3x2_to_f16x2(p[2]),
                                        e4m3x2_to_f16x2(p[3])};
                Dt<__half>::mma(a.o[2 * c], ae, pb[t][0], pb[t][1]);
                const uint32_t ao[4] = {e4m3x2_hi_to_f16x2(p[0]), e4m3x2_hi_to_f16x2(p[1]),
                                        e4m3x2_hi_to_f16x2(p[2]), e4m3x2_hi_to_f16x2(p[3])};
                Dt<__half>::mma(a.o[2 * c + 1], ao, pb[t][0], pb[t][1]);
            }
        } else {
            /* v[r]: tokens 2 q4, 2 q4 + 1 (+ 8 for r >= 2) x bytes 2 g, 2 g + 1 (dims 4 g .. +3)
             * of 32-dim half r % 2 of 64-dim block cc; nibble j of both tokens is tile j's */
            const int g = lane >> 2, q4 = lane & 3;
#pragma unroll
            for (int cc = 0; cc < D / 64; ++cc) {
                uint32_t v[4];
                ldsm_x4_t(G::at(base, t, cc * 32), v);
                uint32_t x[4][4]; /* [r][j] */
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    /* block 4 cc + 2 (r % 2) + g / 4 of tokens tk, tk + 1: word cc */
                    const int tk = 16 * t + 8 * (r >> 1) + 2 * q4;
                    const __half2 s2 = sf_pair_raw(sf_word<D>(sSf, tk, cc), sf_word<D>(sSf, tk + 1, cc),
                                                   2 * (r & 1) + (g >> 2));
                    const uint32_t e02 = bytes2(e2m1_bytes_to_e4m3(v[r]), 0x3120u);
                    const uint32_t e13 = bytes2(e2m1_bytes_to_e4m3(v[r] >> 4), 0x3120u);
                    x[r][0] = hmul2u(e4m3x2_to_f16x2(e02), s2);
                    x[r][1] = hmul2u(e4m3x2_to_f16x2(e13), s2);
                    x[r][2] = hmul2u(e4m3x2_hi_to_f16x2(e02), s2);
                    x[r][3] = hmul2u(e4m3x2_hi_to_f16x2(e13), s2);
                }
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const uint32_t av[4] = {x[0][j], x[1][j], x[2][j], x[3][j]};
                    Dt<__half>::mma(a.o[4 * cc + j], av, pb[t][0], pb[t][1]);
                }
            }
        }
    }
}

/* Row max and sum over the team's W warps (one team: M <= 8), every O^T rescaled to the
 * team max, then the fixed-order tree add (tree_add).  Leaves warp 0 with the sum and the
 * rows' max (mt) and sum (lt) for rows 2 q4, 2 q4 + 1. */
template <int D>
__device__ __forceinline__ void combine_t(unsigned char *smem, const Lane &ln, AccT<D> &a, float *mt,
                                          float *lt) {
    using G = Geo<D, 2 * D>;
    float *sM = reinterpret_cast<float *>(smem + G::kOffM);
    float *sL = reinterpret_cast<float *>(smem + G::kOffL);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int x = 4; x <= 16; x <<= 1)
            a.l[i] += __shfl_xor_sync(0xffffffffu, a.l[i], x);
    if (ln.g == 0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            sM[ln.warp * 16 + 2 * ln.q4 + i] = a.m[i];
            sL[ln.warp * 16 + 2 * ln.q4 + i] = a.l[i];
        }
    }
    cta_sync<kThreads>();
    float f[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) /* one team: warps 0 .. W - 1 */
        f[i] = team_row(sM, sL, 0, ln.W, 2 * ln.q4 + i, a.m[i], &mt[i], &lt[i]);
#pragma unroll
    for (int n = 0; n < D / 16; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            a.o[n][e] *= f[e & 1];
    cta_sync<kThreads>(); /* sM / sL read everywhere: the next item may rewrite them */
    tree_add<D, D / 16>(smem, ln, a.o);
}

/* Warp 0 stores the item's rows as store_rows does (final output with sinks and bmm2, or
 * the split's fp32 partial and lse_keys).  O^T spreads a row's dims over 8 lanes, so the
 * scaled rows go through shared memory first (the combine buffer, free after tree_add;
 * pitch D + 4 floats: the 32 lanes' writes fall on distinct banks) and leave row-major,
 * two outputs or four partial floats a lane at a time. */
template <typename T, int KIND, int D>
__device__ __forceinline__ void store_t(unsigned char *smem, const fi_gqa_params &p, const RunCtx &ctx,
                                        const fi_work_item &it, const fi_request_info &rq, int M, int nh,
                                        const Lane &ln, const AccT<D> &a, const float *mt, const float *lt) {
    constexpr int kPitch = D + 4;
    float *st = reinterpret_cast<float *>(smem + Geo<D, 2 * D>::kOffComb); /* [8][kPitch] */
    const fi_exec_common &c = p.c;
    const bool split = it.out_slot >= 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = 2 * ln.q4 + i;
        const float l = lt[i];
        const float lse_keys = l == 0.f ? -CUDART_INF_F : (mt[i] + log2f(l)) * kLn2;
        const int h = it.head_begin + r % nh;
        const float lse = c.sinks && !split && r < M ? logaddexp(lse_keys, c.sinks[h]) : lse_keys;
        const float up = KIND == 2 ? kFp4Up : 1.f;
        const float f = l == 0.f ? 0.f : split ? up / l : up * ctx.scale2 / l * expf(lse_keys - lse);
#pragma unroll
        for (int n = 0; n < D / 16; ++n)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
                st[r * kPitch + dim_of<KIND>(n, hf, ln.g)] = a.o[n][2 * hf + i] * f;
        if (ln.g == 0 && r < M) {
            const int64_t tok = (int64_t)rq.q_offset + it.q_begin + r / nh;
            if (split)
                __stcg(c.partial_lse + (int64_t)it.out_slot * c.tile_rows + r, lse_keys);
            else if (c.lse)
                c.lse[tok * c.lse_stride_tok + h * c.lse_stride_head] = lse;
        }
    }
    __syncwarp();
    if (split) {
        float *pdst = c.partial_o + (int64_t)it.out_slot * c.tile_rows * D;
        for (int idx = ln.lane; idx < M * (D / 4); idx += 32) {
            const int r = idx / (D / 4), d = (idx - r * (D / 4)) * 4;
            __stcg(reinterpret_cast<float4 *>(pdst + r * D + d), *reinterpret_cast<const float4 *>(st + r * kPitch + d));
        }
    } else {
        for (int idx = ln.lane; idx < M * (D / 2); idx += 32) {
            const int r = idx / (D / 2), d = (idx - r * (D / 2)) * 2;
            const int64_t tok = (int64_t)rq.q_offset + it.q_begin + r / nh;
            const int h = it.head_begin + r % nh;
            const float2 v = *reinterpret_cast<const float2 *>(st + r * kPitch + d);
            store_out2<T>(c, tok * c.out_stride_tok + h * c.out_stride_head + d, v.x, v.y);
        }
    }
}

}  // namespace figqa
