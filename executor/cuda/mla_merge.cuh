/*
 * executor/cuda/mla_merge.cuh - the in-kernel split-KV merge of the MLA decode executor.
 *
 * A split group's n items each left, in its partial slot s (split order), fp32 O_s
 * normalised by its own denominator ([tile_rows][512]) and lse_s (natural log, keys only).
 * The merge (flash-decoding, Dao et al. 2023; the LSE combine of FlashAttention-2):
 *   lse_keys = log(sum_s exp(lse_s)),  den = exp(lse_keys) + (sinks ? exp(sink[h]) : 0)
 *   out = bmm2_scale * sum_s exp(lse_s) * O_s / den,  lse = log(den)
 * always summed in split order, so the bits never depend on which CTA arrives last.
 * Two ways, chosen per group by its size (merge_is_solo):
 *  - small groups: the last CTA to arrive merges the whole group at once (merge_group);
 *  - large groups: all n CTAs of the group merge one slice each after their last item
 *    (merge_phase / merge_slice), so B 1 x 32k does not leave one CTA reading 4 MB.
 * Counters: one u32 per group, zero at rest, advanced by atom.inc (self-resetting, see
 * ../shared/DESIGN.md): bound n-1 for small groups (n arrivals wrap it to 0), bound 2n-1
 * for large ones (n arrivals, then n departures wrap it to 0).
 */
#pragma once

#include "executor/cuda/mla_common.cuh"

namespace fimla {

/* Groups with num_splits x rows <= this (<= 512 KB of fp32 partials: 2-4 splits of 64
 * rows, up to 16 of 16) are merged whole by their last arriving CTA right after its item;
 * larger ones cooperatively.  Measured on H200 (BENCHMARKS.md, 41ee2b1): all-cooperative
 * made B 1 x 32k h16 94 -> 30 us but the trace snapshot (77 groups of 2 x 16 rows)
 * 67.7 -> 72 us, every CTA with a split paying a merge phase at its end. */
constexpr int kSoloMergeRows = 256;
__device__ __forceinline__ bool merge_is_solo(const fi_merge_group &grp) {
    return grp.num_splits * (grp.q_end - grp.q_begin) * (grp.head_end - grp.head_begin) <=
           kSoloMergeRows;
}

/* Row statistics over the splits: sRow[rr] = max_s lse(s, rr), sRow[kRows + rr] =
 * sum_s exp(lse(s, rr) - max), for rr < R; a warp a row, lanes stride the splits, the
 * same shuffle tree for every caller (so every slice of a row sees the same bits). */
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

/* Final output of row r (of the group's tile), float4 column c: acc is the keys-only
 * output sum_s w_s O_s (w_s = exp(lse_s - max) / sum); the sink enters through
 * exp(lse_keys - lse).  Writes 4 output elements, and the LSE from column 0. */
template <typename T>
__device__ __forceinline__ void write_merged(const fi_mla_params &p, const RunCtx &ctx,
                                             const fi_merge_group &grp, const fi_request_info &rq,
                                             int r, int c, float4 acc, float mx, float sum) {
    const int nh = grp.head_end - grp.head_begin;
    const float lse_keys = mx == -CUDART_INF_F ? -CUDART_INF_F : mx + logf(sum);
    const int h = grp.head_begin + r % nh;
    const int64_t tok = (int64_t)rq.q_offset + grp.q_begin + r / nh;
    const float lse = p.sinks ? logaddexp(lse_keys, p.sinks[h]) : lse_keys;
    const float f = lse_keys == -CUDART_INF_F ? 0.f : ctx.scale2 * expf(lse_keys - lse);
    T *dst = (T *)p.out + tok * p.out_stride_tok + h * p.out_stride_head + c * 4;
    uint2 packed;
    packed.x = Dt<T>::pack(acc.x * f, acc.y * f);
    packed.y = Dt<T>::pack(acc.z * f, acc.w * f);
    *reinterpret_cast<uint2 *>(dst) = packed;
    if (p.lse && c == 0)
        p.lse[tok * p.lse_stride_tok + h * p.lse_stride_head] = lse;
}

/* Merge a small split group g whole (its last arriver, right after its item).  Whole CTA.
 * sW: scratch of chunk x kRows fp32 (the weights of `chunk` splits at a time); sRow:
 * [2][kRows] fp32.  The partials sit in L2; each pass issues all its loads at once:
 * (1) the partial LSEs into sW when ns <= chunk, (2) row_stats, (3) weights in sW,
 * (4) each thread sums float4 column v4 of its 8 rows, two splits' loads in flight. */
template <typename T>
__device__ __noinline__ void merge_group(const fi_mla_params &p, const RunCtx &ctx, int g,
                                         float *sW, int chunk, float *sRow) {
    const fi_merge_group grp = p.groups[g];
    const fi_request_info rq = p.requests[grp.request];
    const int nh = grp.head_end - grp.head_begin;
    const int M = (grp.q_end - grp.q_begin) * nh;
    const int tid = threadIdx.x;
    const int ns = grp.num_splits;
    const float *plse = p.partial_lse + (int64_t)grp.first_slot * p.tile_rows;
    const bool staged = ns <= chunk;
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
        for (int s0 = 0; s0 < ns; s0 += chunk) {
            const int nc = min(chunk, ns - s0);
            if (pass == 0 || ns > chunk) {
                __syncthreads(); /* sRow ready; previous chunk's sW consumed */
                for (int idx = tid; idx < nc * M; idx += kThreads) {
                    const int s = idx / M, r = idx - s * M;
                    const float mx = sRow[r];
                    sW[s * kRows + r] =
                        mx == -CUDART_INF_F ? 0.f : expf(lse_at(s0 + s, r) - mx) / sRow[kRows + r];
                }
                __syncthreads();
            }
            const float4 *src = reinterpret_cast<const float4 *>(
                                    p.partial_o + ((int64_t)(grp.first_slot + s0) * p.tile_rows + r0) * kDv) + v4;
            constexpr int kU = 2; /* two splits x 8 rows = 16 loads in flight, in split order */
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
                write_merged<T>(p, ctx, grp, rq, r, v4, acc[i], sRow[r], sRow[kRows + r]);
        }
    }
}

/* Cooperative merge of split group g: the group's outputs, M rows x 128 float4 columns
 * (units u = r * 128 + c, also the float4 offset inside a partial slot), are cut into
 * nparts contiguous slices; slice `part` is merged here by the whole CTA once every split
 * has arrived.  (1) the slice rows' partial LSEs in one pass into shared memory,
 * (2) row_stats, (3) weights in place, (4) each thread sums up to kQ units over its part
 * of the splits (K parts a unit, K = 256 / units, at most n), 4 x kQ loads in flight; the
 * parts are then added in order through shared memory.  Determinism: a row's statistics
 * are the same in every slice; K depends only on (slice size, n); parts are summed in
 * split order and added in order.  Shared memory (no item is in flight, the ring is idle):
 * [kQ][kThreads] float4 part sums, [2][kRows] row stats, then [n][R] LSEs / weights when
 * they fit in smem_bytes (else read from L2 each time). */
constexpr int kF4 = kDv / 4; /* float4 columns of an output row */
constexpr int kQ = 4;        /* units a thread */
constexpr size_t kMergeFixedBytes = (size_t)kQ * kThreads * 16 + 2 * kRows * 4;
/* Not inlined: the kernel body spills least that way (ptxas -v, bf16: 36 spilled bytes at
 * 41ee2b1; 64-80 with either merge inlined).  -DFIMLA_MERGE_INLINE inlines it, to compare. */
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
    const int per = kThreads / K;                 /* units a round, per q */
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
                const int r = uq[q] / kF4, rr = r - r_lo;
                write_merged<T>(p, ctx, grp, rq, r, uq[q] - r * kF4, t, sRow[rr], sRow[kRows + rr]);
            }
        }
        if (K > 1)
            __syncthreads(); /* sAcc is rewritten by the next round */
    }
}

/* Merge phase of a CTA, after ALL its items: for each of its split items of a large group,
 * in item order, wait until the group's counter shows all n arrivals, merge the item's
 * slice (its split index), depart.  A waiter cannot see the wrap to 0 before it departs
 * itself, so "value >= n" is the complete condition.  Deadlock-free only if the whole grid
 * is resident (a CTA waits only after issuing all its arrivals): the launcher refuses
 * larger grids.  smem: the whole dynamic block (no copy is in flight any more). */
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
