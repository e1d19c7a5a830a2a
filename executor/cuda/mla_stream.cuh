/*
 * executor/cuda/mla_stream.cuh - the KV block stream of one CTA: every KV block of every
 * item of the CTA, in item order, through one shared-memory ring.
 *
 * Why one stream and not a ring per item: a CTA's items follow each other, and a ring that
 * drains at the end of an item and refills at the start of the next one pays, per item,
 * the whole dependent chain item -> request -> page table -> first copy (several us under
 * load) with nothing to compute.  Here the producer runs NS blocks ahead of the consumer
 * across item boundaries, so the next item's first blocks land while this item finishes
 * its last steps, its epilogue and its merge.
 *
 * Numbering: the CTA's blocks get global indices g = 0, 1, ... in stream order (item i
 * contributes nblk_i = ceil((kv_end - kv_begin) / 32) blocks).  Block g lives in ring
 * stage g % NS, its (g / NS)-th use of that stage, complete at mbarrier parity
 * (g / NS) & 1.  The barriers are initialised once per CTA.
 * Producer: every warp copies 4 tokens of a block (bulk copies, one or two a token), and
 * arrives with the bytes it expects; the page indices of the next blocks are fetched one
 * step before their copies are issued (global loads off the critical path).  A stage is
 * refilled only after the step that consumed it has passed the CTA barrier at the top of
 * the next step, so the producer may issue block g once g < c + NS (c: first block the
 * current step consumes).
 */
#pragma once

#include "executor/cuda/mla_common.cuh"

namespace fimla {

/* What the producer needs of an item (from the item table, mla_common.cuh). */
struct StreamItem {
    int32_t kv_begin, kv_end, page_row_offset, nblk;
};
__device__ __forceinline__ int item_blocks(int kv_begin, int kv_end) {
    return (kv_end - kv_begin + kBlockN - 1) / kBlockN;
}

/* One fetched block, waiting to be issued: t0 (request-local first token, < 0: none, the
 * stream has ended), kv_end of its item, and this lane's page index (-1: none). */
struct Pend {
    int32_t t0, kv_end, page;
};

/* Tokens of a block are spread over the 8 warps: warp w copies tokens 4w .. 4w+3, one a
 * lane (lanes 0..3), so each warp issues 4-8 bulk copies a block. */
constexpr int kTokPerWarp = kBlockN / (kThreads / 32);

struct Stream {
    int i0, n_items;       /* the CTA's items: i0 .. i0 + n_items - 1 */
    int k, b;              /* fetch cursor: item k (relative to i0), its block b */
    StreamItem d;          /* descriptor of item k */

    __device__ __forceinline__ StreamItem desc(const fi_mla_params &p, int kk) const {
        fi_work_item it;
        fi_request_info rq;
        item_at(p, i0, kk, it, rq);
        StreamItem s;
        s.kv_begin = it.kv_begin;
        s.kv_end = it.kv_end;
        s.page_row_offset = rq.page_row_offset;
        s.nblk = item_blocks(it.kv_begin, it.kv_end);
        return s;
    }
    __device__ __forceinline__ void start(const fi_mla_params &p, int first, int n) {
        i0 = first;
        n_items = n;
        k = 0;
        b = 0;
        if (n > 0)
            d = desc(p, 0);
    }
    /* The next block of the stream and this lane's page index (a load whose value is only
     * needed when the block is issued, one step later). */
    __device__ __forceinline__ Pend fetch(const fi_mla_params &p) {
        while (k < n_items && b >= d.nblk) { /* uniform: skip finished and empty items */
            ++k;
            b = 0;
            if (k < n_items)
                d = desc(p, k);
        }
        Pend e;
        e.page = -1;
        if (k >= n_items) {
            e.t0 = -1;
            e.kv_end = 0;
            return e;
        }
        e.t0 = d.kv_begin + b * kBlockN;
        e.kv_end = d.kv_end;
        const int lane = threadIdx.x & 31;
        const int t = e.t0 + (threadIdx.x >> 5) * kTokPerWarp + lane;
        if (lane < kTokPerWarp && t < d.kv_end)
            e.page = p.page_table[d.page_row_offset + (t >> p.page_shift)];
        ++b;
        return e;
    }
};

/* Every warp: copy its 4 tokens of block e into `stage` with two bulk copies a token (ckv
 * 1024 B, kpe 128 B; one of 1152 B for a concatenated cache) and arrive on the stage's
 * mbarrier (8 arrivals a phase) with the bytes it expects.  Rows past kv_end are zeroed
 * with ordinary stores, ordered before the arrival by __syncwarp (P = 0 must not meet NaN
 * bit patterns), after a proxy fence (the stage may have been written by bulk copies). */
template <typename T>
__device__ __forceinline__ void issue_block(const fi_mla_params &p, T *stage, uint32_t bar,
                                            const Pend &e) {
    const int lane = threadIdx.x & 31;
    const int j = (threadIdx.x >> 5) * kTokPerWarp + (lane & (kTokPerWarp - 1));
    const int t = e.t0 + j;
    T *row = stage + j * kPitch;
    if (lane < kTokPerWarp && e.page < 0) {
#pragma unroll 8
        for (int c = 0; c < kChunks; ++c)
            reinterpret_cast<uint4 *>(row)[c] = make_uint4(0, 0, 0, 0);
        fence_proxy_async();
    }
    __syncwarp();
    if (lane == 0) {
        const int w0 = e.t0 + (threadIdx.x >> 5) * kTokPerWarp;
        const int nv = max(0, min(kTokPerWarp, e.kv_end - w0));
        mbar_expect_tx(bar, (uint32_t)nv * (kDqk * 2));
    }
    if (lane < kTokPerWarp && e.page >= 0) {
        const int slot = t & (p.page_size - 1);
        const T *ckv = (const T *)p.ckv + (int64_t)e.page * p.ckv_stride_page + (int64_t)slot * p.ckv_stride_tok;
        const T *kpe = (const T *)p.kpe + (int64_t)e.page * p.kpe_stride_page + (int64_t)slot * p.kpe_stride_tok;
        if (kpe == ckv + kDv) {
            bulk_g2s(smem_u32(row), ckv, kDqk * 2, bar); /* concatenated cache [.., 576] */
        } else {
            bulk_g2s(smem_u32(row), ckv, kDv * 2, bar);
            bulk_g2s(smem_u32(row + kDv), kpe, (kDqk - kDv) * 2, bar);
        }
    }
}

/* The ring and the producer side of the stream (CTA-uniform registers). */
template <typename T>
struct Ring {
    uint32_t base;       /* byte offset of stage 0 in the dynamic shared memory */
    int NS;              /* stages */
    int gprod;           /* blocks issued so far */
    Stream st;
    Pend q0, q1;         /* the next two blocks, pages already requested */

    __device__ __forceinline__ T *stage(int g) const {
        return dyn_smem<T>(base + (uint32_t)(g % NS) * (uint32_t)kStageBytes);
    }
    /* mbarrier of block g's stage (shared-window address). */
    __device__ __forceinline__ uint32_t bar(int g) const {
        return smem_u32(dyn_smem<unsigned char>(kOffBars)) + (uint32_t)(g % NS) * 8;
    }
    __device__ __forceinline__ void wait(int g) const {
        mbar_wait(bar(g), (uint32_t)(g / NS) & 1u);
    }
    __device__ __forceinline__ void put(const fi_mla_params &p, const Pend &e) {
        issue_block<T>(p, stage(gprod), bar(gprod), e);
        ++gprod;
    }
    /* Fill the empty ring (NS blocks) and queue the next two.  Barriers initialised. */
    __device__ __forceinline__ void fill(const fi_mla_params &p) {
        Pend e[kMaxStages];
#pragma unroll
        for (int x = 0; x < kMaxStages; ++x)
            if (x < NS)
                e[x] = st.fetch(p);
#pragma unroll
        for (int x = 0; x < kMaxStages; ++x)
            if (x < NS && e[x].t0 >= 0)
                put(p, e[x]);
        q0 = st.fetch(p);
        q1 = st.fetch(p);
    }
    /* Top of a step whose first block is c (after the CTA barrier): issue what the freed
     * stages allow (c + NS - gprod blocks: the 1 or 2 the previous step consumed), then
     * request the pages of as many more. */
    __device__ __forceinline__ void produce(const fi_mla_params &p, int c) {
        const int n = c + NS - gprod;
        if (n <= 0 || q0.t0 < 0)
            return;
        put(p, q0);
        if (n >= 2 && q1.t0 >= 0) {
            put(p, q1);
            q0 = st.fetch(p);
            q1 = st.fetch(p);
        } else {
            q0 = q1;
            q1 = st.fetch(p);
        }
    }
};

}  // namespace fimla
