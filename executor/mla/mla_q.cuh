/*
 * executor/mla/mla_q.cuh - an MLA item's Q into shared memory by its producer warps: fp8
 * (produce_q_e4m3: mla_wg8_tile.cuh, mla_wgt_tile.cuh) or 16-bit (produce_q16:
 * mla_wg_tile.cuh, mla_wg64_tile.cuh, mla_wgt16_tile.cuh).
 */
#pragma once

#include "executor/cuda/common/ptx.cuh"
#include "executor/cuda/common/wgmma.cuh"
#include "executor/mla/mla_params.h"

namespace fimlaq {
using namespace fi;

/* Element e of Q row r of item it (row r = (q - q_begin) * nh + h - head_begin; E the
 * element type): e < 512 in q_nope, else element e - 512 of q_pe. */
template <typename E>
__device__ __forceinline__ const E *q_row_at(const fi_mla_params &p, const fi_work_item &it,
                                             const fi_request_info &rq, int nh, int r, int e) {
    const int64_t tok = (int64_t)rq.q_offset + it.q_begin + r / nh;
    const int h = it.head_begin + r % nh;
    return e < 512 ? (const E *)p.m.q_nope + tok * p.m.q_nope_stride_tok + h * p.m.q_nope_stride_head + e
                   : (const E *)p.m.q_pe + tok * p.m.q_pe_stride_tok + h * p.m.q_pe_stride_head + (e - 512);
}

/* Q rows of item it (e4m3, row r = (q - q_begin) * nh + h - head_begin) by 16-byte cp.async
 * from thread pt of kThreadsP: at qbase four 128-byte-swizzled panels [R][128 B] of the
 * 512 ckv dims, then a [R][64 B] kpe panel in the 64-byte swizzle; rows past the item's M
 * zero.  The caller arrives on its barrier (cp_async_mbar_arrive). */
template <int R, int kThreadsP>
__device__ __forceinline__ void produce_q_e4m3(const fi_mla_params &p, const fi_work_item &it,
                                               const fi_request_info &rq, uint32_t qbase, int pt) {
    constexpr int kChunks = 576 / 16; /* 36: 32 of ckv, 4 of kpe */
    constexpr uint32_t kPanel = (uint32_t)R * 128, kOffPe = 4 * kPanel;
    const int nh = it.head_end - it.head_begin;
    const int M = (it.q_end - it.q_begin) * nh;
    for (int idx = pt; idx < R * kChunks; idx += kThreadsP) {
        const int r = idx / kChunks, c = idx - r * kChunks; /* 16-byte chunk c */
        const uint32_t dst = qbase + (c < 32 ? (c >> 3) * kPanel + sw128_8(r, (c & 7) * 16)
                                             : kOffPe + sw64_8(r, (c - 32) * 16));
        const uint8_t *src = (const uint8_t *)p.m.q_nope;
        if (r < M)
            src = q_row_at<uint8_t>(p, it, rq, nh, r, c * 16);
        cp_async16(dst, src, r < M ? 16 : 0);
    }
}

/* Q rows of item it (bf16 / fp16 T, row r = (q - q_begin) * nh + h - head_begin) by 16-byte
 * cp.async from thread pt of kThreadsP: at qbase nine 128-byte-swizzled panels [R][64] of
 * 64 dims each (8 of ckv, then kpe); rows past the item's M zero.  The caller arrives on
 * its barrier (cp_async_mbar_arrive). */
template <typename T, int R, int kThreadsP>
__device__ __forceinline__ void produce_q16(const fi_mla_params &p, const fi_work_item &it,
                                            const fi_request_info &rq, uint32_t qbase, int pt) {
    constexpr int kChunks = 576 / 8; /* 72 of 8 elements: 64 of ckv, 8 of kpe */
    constexpr uint32_t kPanel = (uint32_t)R * 128;
    const int nh = it.head_end - it.head_begin;
    const int M = (it.q_end - it.q_begin) * nh;
    for (int idx = pt; idx < R * kChunks; idx += kThreadsP) {
        const int r = idx / kChunks, c = idx - r * kChunks;
        const uint32_t dst = qbase + (c >> 3) * kPanel + sw128(r, (c & 7) * 8);
        const T *src = (const T *)p.m.q_nope;
        if (r < M)
            src = q_row_at<T>(p, it, rq, nh, r, c * 8);
        cp_async16(dst, src, r < M ? 16 : 0);
    }
}

}  // namespace fimlaq
