/*
 * executor/cuda/mla_load.cuh - Q and KV loading of the MLA decode executor, shared by the
 * lock-step item loop (mla_decode.cuh) and the warp-specialised producers (mla_ws.cuh):
 * Q rows by cp.async, KV tokens through the page table by bulk copies (TMA engine, no
 * tensor map) into a ring stage completed on an mbarrier (expect_tx).
 */
#pragma once

#include "executor/cuda/mla_common.cuh"

namespace fimla {

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

/* Producer warps pw .. 7 share the tokens of a block: pw = 0, every warp copies 4 tokens
 * (lanes 0..3); pw = 4 (tiles of <= 16 rows, KP = 2, where warps 4..7 do no math), warps
 * 4..7 copy 8 tokens each, so the math warps 0..3 carry no producer work.  The bulk copies
 * have uniform operands (the compiler loops over the lanes). */
__device__ __forceinline__ int prod_tokens(int pw) { return pw ? 8 : 4; } /* pw: 0 or 4 */
__device__ __forceinline__ int prod_token(int pw) { /* this lane's token in a block */
    return ((int)(threadIdx.x >> 5) - pw) * prod_tokens(pw) + (int)(threadIdx.x & 31);
}

/* Page index of this lane's token of block b, -1 past the range or for lanes without one. */
__device__ __forceinline__ int32_t fetch_page(const fi_mla_params &p, const fi_request_info &rq,
                                              int kv_begin, int kv_end, int b, int nblk, int pw) {
    const int lane = threadIdx.x & 31;
    const int t = kv_begin + b * kBlockN + prod_token(pw);
    if (lane >= prod_tokens(pw) || b >= nblk || t >= kv_end)
        return -1;
    return p.page_table[rq.page_row_offset + (t >> p.page_shift)];
}

/* Every producer warp: copy its tokens of block b into the ring stage with two bulk copies
 * a token (ckv 1024 B, kpe 128 B) and arrive on the stage's mbarrier (one arrival a
 * producer warp a phase, or with kLaneArrive one a token: lane 0 with the warp's bytes,
 * the other token lanes plainly, so each lane's zero rows are released by that lane, which
 * compute-sanitizer racecheck can follow; the barrier then counts kBlockN arrivals).  Rows past kv_end are zeroed with ordinary stores, ordered before
 * the arrival by __syncwarp (P = 0 must not meet NaN bit patterns). */
template <typename T, bool kLaneArrive = false>
__device__ __forceinline__ void issue_block(const fi_mla_params &p, T *stage, uint32_t bar,
                                            int t0, int kv_end, int32_t page, int pw) {
    const int lane = threadIdx.x & 31;
    const int tpw = prod_tokens(pw);
    const int j = prod_token(pw) & (kBlockN - 1);
    const int t = t0 + j;
    T *row = stage + j * kPitch;
    if (lane < tpw && page < 0) {
#pragma unroll 8
        for (int c = 0; c < kChunks; ++c)
            reinterpret_cast<uint4 *>(row)[c] = make_uint4(0, 0, 0, 0);
        fence_proxy_async();
    }
    __syncwarp();
    if (lane == 0) {
        const int w0 = t0 + ((int)(threadIdx.x >> 5) - pw) * tpw;
        const int nv = max(0, min(tpw, kv_end - w0));
        mbar_expect_tx(bar, (uint32_t)nv * (kDqk * 2));
    } else if (kLaneArrive && lane < tpw) {
        mbar_arrive(bar); /* its own zero rows released by itself (one arrival a token) */
    }
    if (lane < tpw && page >= 0) {
        const int slot = t & (p.page_size - 1);
        const T *ckv = (const T *)p.ckv + (int64_t)page * p.ckv_stride_page + (int64_t)slot * p.ckv_stride_tok;
        const T *kpe = (const T *)p.kpe + (int64_t)page * p.kpe_stride_page + (int64_t)slot * p.kpe_stride_tok;
        if (kpe == ckv + kDv) {
            /* Concatenated cache ([.., 576]): one copy a token. */
            bulk_g2s(smem_u32(row), ckv, kDqk * 2, bar);
        } else {
            bulk_g2s(smem_u32(row), ckv, kDv * 2, bar);
            bulk_g2s(smem_u32(row + kDv), kpe, (kDqk - kDv) * 2, bar);
        }
    }
}

}  // namespace fimla
