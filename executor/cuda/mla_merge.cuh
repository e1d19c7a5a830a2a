/*
 * executor/cuda/mla_merge.cuh - the in-kernel split-KV merge of the MLA decode executor:
 * small groups by their last arriving CTA (merge_group), large ones by all their CTAs
 * after their last items (merge_phase / merge_slice).  Always in split order, so the bits
 * never depend on which CTA arrives last.  Method: flash-decoding's LSE merge (Dao et al.
 * 2023), as in FlashAttention-2's online softmax.
 */
#pragma once

#include "executor/cuda/mla_common.cuh"

namespace fimla {

/* Row statistics over the splits, for rows rr < R: sRow[rr] = max_s lse(s, rr) and
 * sRow[kRows + rr] = sum_s exp(lse(s, rr) - max); a warp a row, lanes stride the splits.
 * Every caller runs the same loop and shuffle tree, so a row's statistics come out with
 * the same bits in merge_group and in every slice of merge_slice. */
template <typename LseAt>
__device__ __forceinline__ void row_stats(LseAt lse_at, int ns, int R, float *sRow) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int rr = warp; rr < R; rr += kThreads / 32) {
        float mx = -CUDART_INF_F;
        for (int s = lane; s < ns; s += 32)
            mx = fmaxf(mx, lse_at(s, rr));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float sum = 0.f;
        if (mx != -CUDART_INF_F)
            for (int s = lane; s < ns; s += 32)
                sum += expf(lse_at(s, rr) - mx);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0) {
            sRow[rr] = mx;
            sRow[kRows + rr] = sum;
        }
    }
}

/* Write one merged float4 (dims 4*c4 .. 4*c4+3) of group row r: t is the keys-only output
 * (sum over splits of w_s O_s), sRow[rr] / sRow[kRows + rr] the row's max and sum of
 * exp(lse_s - max) (row_stats); the sink enters through exp(lse_keys - lse).  The row's
 * LSE is written with column 0. */
template <typename T>
__device__ __forceinline__ void write_merged(const fi_mla_params &p, const RunCtx &ctx,
                                             const fi_merge_group &grp, const fi_request_info &rq,
                                             int nh, int r, int c4, float4 t, const float *sRow,
                                             int rr) {
    const float mx = sRow[rr];
    const float lse_keys = mx == -CUDART_INF_F ? -CUDART_INF_F : mx + logf(sRow[kRows + rr]);
    const int h = grp.head_begin + r % nh;
    const int64_t tok = (int64_t)rq.q_offset + grp.q_begin + r / nh;
    const float lse = p.sinks ? logaddexp(lse_keys, p.sinks[h]) : lse_keys;
    const float f = lse_keys == -CUDART_INF_F ? 0.f : ctx.scale2 * expf(lse_keys - lse);
    T *dst = (T *)p.out + tok * p.out_stride_tok + h * p.out_stride_head + c4 * 4;
    uint2 packed;
    packed.x = Dt<T>::pack(t.x * f, t.y * f);
    packed.y = Dt<T>::pack(t.z * f, t.w * f);
    *reinterpret_cast<uint2 *>(dst) = packed;
    if (p.lse && c4 == 0)
        p.lse[tok * p.lse_stride_tok + h * p.lse_stride_head] = lse;
}

/* Merge a small split group's partial slots (in split order) into out / lse, by its last
 * arriving CTA right after that CTA's item (merge_is_solo).  Whole CTA.
 * The partials sit in L2; every pass issues all its loads at once: (1) all partial LSEs
 * into shared memory, (2) a warp a row reduces max and sum, (3) weights w_s =
 * exp(lse_s - max) / sum, (4) each thread sums float4 columns of its rows, splits outer so
 * its 8 rows' loads are in flight together.  kMergeChunk splits per round. */
constexpr int kMergeChunk = 256;
template <typename T>
__device__ __noinline__ /* see merge_slice */ void merge_group(const fi_mla_params &p, const RunCtx &ctx, int g, float *sW,
                            float *sRow) {
    const fi_merge_group grp = p.groups[g];
    const fi_request_info rq = p.requests[grp.request];
    const int nh = grp.head_end - grp.head_begin;
    const int M = (grp.q_end - grp.q_begin) * nh;
    const int tid = threadIdx.x;
    const int ns = grp.num_splits;
    const float *plse = p.partial_lse + (int64_t)grp.first_slot * p.tile_rows;
    /* Row max and sum over all splits (a warp a row, lanes stride the splits).  With at
     * most kMergeChunk splits the partial LSEs are first staged in shared memory by one
     * parallel pass, so max, sum and weights cost one L2 round trip, not three. */
    const bool staged = ns <= kMergeChunk;
    if (staged) {
        for (int idx = tid; idx < ns * M; idx += kThreads) {
            const int s = idx / M, r = idx - s * M;
            sW[s * kRows + r] = __ldcg(plse + (int64_t)s * p.tile_rows + r);
        }
        __syncthreads();
    }
    auto lse_at = [&](int s, int r) -> float {
        return staged ? sW[s * kRows + r] : __ldcg(plse + (int64_t)s * p.tile_rows + r);
    };
    row_stats(lse_at, ns, M, sRow);
    const int v4 = tid & 127; /* float4 column: dims 4*v4 .. 4*v4+3 */
    const int64_t slot_f4 = (int64_t)p.tile_rows * kDv / 4;
    /* Passes of 16 rows: thread rows r = 16 * pass + (tid >> 7) + 2 * i, i < 8. */
    for (int pass = 0; pass * 16 < M; ++pass) {
        const int r0 = pass * 16 + (tid >> 7);
        float4 acc[8];
#pragma unroll
        for (int i = 0; i < 8; ++i)
            acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int s0 = 0; s0 < ns; s0 += kMergeChunk) {
            const int nc = min(kMergeChunk, ns - s0);
            if (pass == 0 || ns > kMergeChunk) {
                __syncthreads(); /* sRow ready; previous chunk's sW consumed */
                for (int idx = tid; idx < nc * M; idx += kThreads) {
                    const int s = idx / M, r = idx - s * M;
                    const float mx = sRow[r];
                    sW[s * kRows + r] =
                        mx == -CUDART_INF_F
                            ? 0.f
                            : expf(lse_at(s0 + s, r) - mx) / sRow[kRows + r];
                }
                __syncthreads();
            }
            const float4 *src = reinterpret_cast<const float4 *>(
                                    p.partial_o + ((int64_t)(grp.first_slot + s0) * p.tile_rows + r0) * kDv) + v4;
            /* Two splits x 8 rows = 16 independent loads in flight, summed in split order. */
            constexpr int kU = 2;
            for (int s = 0; s < nc; s += kU) {
                float4 o[kU][8];
#pragma unroll
                for (int u = 0; u < kU; ++u)
#pragma unroll
                    for (int i = 0; i < 8; ++i)
                        if (s + u < nc && r0 + 2 * i < M)
                            o[u][i] = __ldcg(src + (s + u) * slot_f4 + i * (kDv / 2));
#pragma unroll
                for (int u = 0; u < kU; ++u)
#pragma unroll
                    for (int i = 0; i < 8; ++i)
                        if (s + u < nc && r0 + 2 * i < M) {
                            const float w = sW[(s + u) * kRows + r0 + 2 * i];
                            acc[i].x += w * o[u][i].x;
                            acc[i].y += w * o[u][i].y;
                            acc[i].z += w * o[u][i].z;
                            acc[i].w += w * o[u][i].w;
                        }
            }
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int r = r0 + 2 * i;
            if (r < M)
                write_merged<T>(p, ctx, grp, rq, nh, r, v4, acc[i], sRow, r);
        }
    }
}

/* Cooperative merge of split group g: the group's outputs, M rows x 128 float4 columns
 * (units u = r * 128 + c, also the float4 offset inside a partial slot), are cut into
 * num_splits contiguous slices; slice `part` (the split index of the item whose CTA calls
 * this) is merged here, by the whole CTA, once every split of the group has arrived.  So a
 * group of n splits is merged by n CTAs at once (B 1 x 32k h16: 128 CTAs read 32 KB each
 * instead of one CTA reading 4 MB).
 * Latency (this runs at the end of a CTA, on the kernel's tail): (1) the slice rows'
 * partial LSEs in one parallel pass into shared memory, (2) a warp a row: max and sum,
 * (3) weights w[s][rr] = exp(lse - max) / sum in place, (4) each thread sums up to kQ units
 * over its part of the splits (K parts a unit, K = 256 / units, at most n), 4 x kQ loads in
 * flight, then the parts are added in order through shared memory.  part / nparts: the
 * slice (nparts = num_splits in merge_phase).
 * Determinism: a row's max / sum come out the same in any slice (same order, same shuffle
 * tree); K depends only on (slice size, n); each part is summed in split order and the
 * parts in order: the bits never depend on which CTA merges which slice.
 * Shared memory (the whole dynamic block; no item is in flight): [kQ][kThreads] float4 part
 * sums, [2][kRows] row max / sum, then [n][R] LSEs / weights when they fit (else read from
 * L2 each time). */
constexpr int kF4 = kDv / 4; /* float4 columns of an output row */
constexpr int kQ = 4;        /* units a thread */
constexpr size_t kMergeFixedBytes = (size_t)kQ * kThreads * 16 + 2 * kRows * 4;
/* Groups with num_splits x rows <= this (<= 512 KB of fp32 partials: 2-4 splits of 64
 * rows, up to 16 of 16) are merged whole by their last arriving CTA right after its item
 * (merge_group, as before); larger ones cooperatively by all their CTAs (merge_phase).
 * Measured on H200 (bench_mla, same GPU, A/B against the last-arriver-only executor):
 * all-cooperative made B 1 x 32k h16 (128 x 16) 94 -> 30 us and h128 (2 x 64 x 64)
 * 214-222 -> 80 us, but the trace snapshot (77 groups of 2 x 16 rows) 67.7 -> 70-72 us:
 * there every CTA with a split paid the merge phase at its end. */
constexpr int kSoloMergeRows = 256;
__device__ __forceinline__ bool merge_is_solo(const fi_merge_group &grp) {
    return grp.num_splits * (grp.q_end - grp.q_begin) * (grp.head_end - grp.head_begin) <=
           kSoloMergeRows;
}
/* Not inlined, like merge_group: the kernel body spills least that way (ptxas -v, bf16,
 * bulk-copy path: 36 spilled bytes; 64-80 with either merge inlined; the last-arriver-only
 * executor had 32).  -DFIMLA_MERGE_INLINE inlines this one, for comparisons. */
template <typename T>
__device__
#ifndef FIMLA_MERGE_INLINE
__noinline__
#endif
void merge_slice(const fi_mla_params &p, const RunCtx &ctx, int g, int part, int nparts,
                 unsigned char *smem, size_t smem_bytes) {
    const fi_merge_group grp = p.groups[g];
    const fi_request_info rq = p.requests[grp.request];
    const int nh = grp.head_end - grp.head_begin;
    const int M = (grp.q_end - grp.q_begin) * nh;
    const int ns = grp.num_splits;
    const int U = M * kF4;
    const int u0 = (int)((int64_t)part * U / nparts), u1 = (int)((int64_t)(part + 1) * U / nparts);
    if (u0 >= u1)
        return; /* uniform over the CTA */
    const int r_lo = u0 / kF4, R = (u1 - 1) / kF4 - r_lo + 1;
    float4 *sAcc = reinterpret_cast<float4 *>(smem);
    float *sRow = reinterpret_cast<float *>(smem + (size_t)kQ * kThreads * 16);
    float *sWt = sRow + 2 * kRows;
    const bool staged = (size_t)ns * R * 4 + kMergeFixedBytes <= smem_bytes;
    const float *plse = p.partial_lse + (int64_t)grp.first_slot * p.tile_rows + r_lo;
    const int tid = threadIdx.x;
    if (staged) {
        for (int idx = tid; idx < ns * R; idx += kThreads) {
            const int s = idx / R, rr = idx - s * R;
            sWt[idx] = __ldcg(plse + (int64_t)s * p.tile_rows + rr);
        }
        __syncthreads();
    }
    auto lse_at = [&](int s, int rr) -> float {
        return staged ? sWt[s * R + rr] : __ldcg(plse + (int64_t)s * p.tile_rows + rr);
    };
    row_stats(lse_at, ns, R, sRow);
    __syncthreads();
    auto weight_of = [&](float lse, int rr) -> float {
        const float mx = sRow[rr];
        return mx == -CUDART_INF_F ? 0.f : expf(lse - mx) / sRow[kRows + rr];
    };
    if (staged) {
        for (int idx = tid; idx < ns * R; idx += kThreads)
            sWt[idx] = weight_of(sWt[idx], idx % R); /* in place: own element only */
        __syncthreads();
    }
    auto weight = [&](int s, int rr) -> float {
        return staged ? sWt[s * R + rr] : weight_of(__ldcg(plse + (int64_t)s * p.tile_rows + rr), rr);
    };
    const int nu = u1 - u0;
    const int K = max(1, min(ns, kThreads / nu)); /* parts a unit (1 when nu >= 256) */
    const int per = kThreads / K;                      /* units a round, per q */
    const int k = tid % K, jt = tid / K;
    const int sa = (int)((int64_t)k * ns / K), sb = (int)((int64_t)(k + 1) * ns / K);
    const int64_t slot_f4 = (int64_t)p.tile_rows * kF4;
    const float4 *po = reinterpret_cast<const float4 *>(p.partial_o) + (int64_t)grp.first_slot * slot_f4;
    for (int base = 0; base < nu; base += kQ * per) {
        float4 a[kQ];
        int uq[kQ];
        bool vq[kQ];
#pragma unroll
        for (int q = 0; q < kQ; ++q) {
            const int j = base + q * per + jt;
            vq[q] = jt < per && j < nu;
            uq[q] = u0 + j;
            a[q] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
        for (int s = sa; s < sb; s += 4) {
            float4 o[4][kQ]; /* 4 splits x kQ units in flight, summed in split order */
#pragma unroll
            for (int h = 0; h < 4; ++h)
#pragma unroll
                for (int q = 0; q < kQ; ++q)
                    if (s + h < sb && vq[q])
                        o[h][q] = __ldcg(po + (int64_t)(s + h) * slot_f4 + uq[q]);
#pragma unroll
            for (int h = 0; h < 4; ++h)
#pragma unroll
                for (int q = 0; q < kQ; ++q)
                    if (s + h < sb && vq[q]) {
                        const float w = weight(s + h, uq[q] / kF4 - r_lo);
                        a[q].x += w * o[h][q].x;
                        a[q].y += w * o[h][q].y;
                        a[q].z += w * o[h][q].z;
                        a[q].w += w * o[h][q].w;
                    }
        }
        if (K > 1) {
#pragma unroll
            for (int q = 0; q < kQ; ++q)
                sAcc[q * kThreads + tid] = a[q];
            __syncthreads();
        }
        if (k == 0) {
#pragma unroll
            for (int q = 0; q < kQ; ++q) {
                if (!vq[q])
                    continue;
                float4 t = a[q];
                for (int kk = 1; kk < K; ++kk) {
                    const float4 b = sAcc[q * kThreads + tid + kk];
                    t.x += b.x;
                    t.y += b.y;
                    t.z += b.z;
                    t.w += b.w;
                }
                const int r = uq[q] / kF4;
                write_merged<T>(p, ctx, grp, rq, nh, r, uq[q] - r * kF4, t, sRow, r - r_lo);
            }
        }
        if (K > 1)
            __syncthreads(); /* sAcc is rewritten by the next round */
    }
}

/* Merge phase of a CTA, after ALL its items: for each of its split items, in item order,
 * wait until the group's counter shows all n arrivals, merge the item's slice, depart.
 * Counter of a group with n splits, atom.inc bound 2n-1, zero at rest: n arrivals
 * (run_item) bring it to n; each of the n departures adds one and the last one (old value
 * 2n-1) wraps it to 0, so no reset is needed between replays.  A waiter cannot see the
 * wrap before it departs itself, so "value >= n" is the complete condition.  Waiting is
 * deadlock-free only if every CTA of the grid is resident (a CTA waits only after issuing
 * all its arrivals): fi_launch_mla_decode refuses larger grids. */
template <typename T>
__device__ void merge_phase(const fi_mla_params &p, const RunCtx &ctx, int i0, int i1,
                            unsigned char *smem) {
    for (int i = i0; i < i1; ++i) {
        const int slot = p.items[i].out_slot, g = p.items[i].merge_group;
        if (slot < 0)
            continue;
        const fi_merge_group grp = p.groups[g];
        if (merge_is_solo(grp))
            continue;
        const int n = grp.num_splits;
        if (threadIdx.x == 0)
            while (ld_acquire(p.semaphores + g) < (uint32_t)n)
                __nanosleep(64);
        __syncthreads();
        __threadfence();
        merge_slice<T>(p, ctx, g, slot - grp.first_slot, n, smem, kSmemBytes);
        __syncthreads();
        if (threadIdx.x == 0)
            sem_inc(p.semaphores + g, (uint32_t)(2 * n - 1));
    }
}

}  // namespace fimla
