/*
 * executor/mla/mla_q.cuh - an fp8 MLA item's Q into shared memory, shared by the fp8
 * wgmma bodies (mla_wg8_tile.cuh: 64-row tiles; mla_wgt_tile.cuh: 16-row tiles).
 */
#pragma once

#include "executor/cuda/common/ptx.cuh"
#include "executor/cuda/common/wgmma.cuh"
#include "executor/mla/mla_params.h"

namespace fimlaq {
using namespace fi;

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
        if (r < M) {
            const int64_t tok = (int64_t)rq.q_offset + it.q_begin + r / nh;
            const int h = it.head_begin + r % nh;
            src = c < 32 ? (const uint8_t *)p.m.q_nope + tok * p.m.q_nope_stride_tok + h * p.m.q_nope_stride_head + c * 16
                         : (const uint8_t *)p.m.q_pe + tok * p.m.q_pe_stride_tok + h * p.m.q_pe_stride_head + (c - 32) * 16;
        }
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
        if (r < M) {
            const int64_t tok = (int64_t)rq.q_offset + it.q_begin + r / nh;
            const int h = it.head_begin + r % nh;
            src = c < 64 ? (const T *)p.m.q_nope + tok * p.m.q_nope_stride_tok + h * p.m.q_nope_stride_head + c * 8
                         : (const T *)p.m.q_pe + tok * p.m.q_pe_stride_tok + h * p.m.q_pe_stride_head + (c - 64) * 8;
        }
        cp_async16(dst, src, r < M ? 16 : 0);
    }
}

}  // namespace fimlaq
