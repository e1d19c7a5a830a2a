/*
 * executor/cuda/merge/split_merge.cuh - the in-kernel split-KV merge every family shares,
 * templated on the output width W (64..1024, a multiple of 4), the tile height Rows (16 to
 * 128: the partial slot's rows), the output element O (bf16, fp16, fp8 e4m3 with
 * fi_exec_common.o_scale, OutDyn<T>: T or fp8 chosen by fi_exec_common.o_fp8, or
 * OutDynFp4<T>: those or NVFP4 by fi_exec_common.o_fp4, a quad of threads a block) and the
 * number of threads that run it (the family's kThreads: barrier 1 over those).  It reads only the common block
 * (executor/core/exec_params.h) and the plan region.
 *
 * Small groups (merge_is_solo) are merged whole by their last arriving CTA right after
 * its item (merge_group); larger ones by all their CTAs after their last items
 * (merge_phase / merge_slice).  Always in split order, so the bits never depend on which
 * CTA arrives last.  Method: flash-decoding's LSE merge (Dao et al. 2023):
 *   L = log(sum_s exp(lse_s)),  O = sum_s exp(lse_s - L) O_s,  sink and bmm2_scale after.
 */
#pragma once

#include "executor/cuda/common/dtype.cuh"
#include "executor/cuda/common/profile.cuh"
#include "executor/cuda/common/ptx.cuh"
#include "executor/cuda/common/run_ctx.cuh"

namespace fi {

/* Groups with num_splits x rows <= this (<= 512 KB of fp32 partials at W 512: 2-4 splits
 * of 64 rows, up to 16 of 16) are merged whole by their last arriving CTA; larger ones
 * cooperatively.  Why (H200, BENCHMARKS.md): all-cooperative merging made B1 x 32k 3x
 * faster but the trace snapshot, whose groups are small, slower: every CTA with a split
 * then paid a merge phase at its end. */
constexpr int kSoloMergeRows = 256;
__device__ __forceinline__ bool merge_is_solo(const fi_merge_group &grp) {
    return grp.num_splits * (grp.q_end - grp.q_begin) * (grp.head_end - grp.head_begin) <=
           kSoloMergeRows;
}

/* kSolo false: every group is merged cooperatively in merge_phase, none inside the item
 * loop (a wgmma tile body: ptxas serialises every wgmma of a kernel whose item loop holds
 * the solo merge's call, and spills around it).  kSoloSplits: groups of more splits are
 * merged cooperatively too.  The MLA mma.sync body takes 8: a solo merger reads a row's
 * splits two at a time, and the long requests of small batches (heads 16, 8 x 32k: 16
 * splits a tile) ran 4% faster cooperatively (H200, perf-log 2026-11-29 sixth session);
 * the GQA body keeps every small group solo (its B1 x 32k, 16 splits of 4 rows, ran 10%
 * slower cooperatively, and 5% slower with kOneLoads 16).  kOneLoads: the splits' loads a
 * merge_slice thread holding one unit keeps in flight; 8 to 16 (4 registers each) where
 * the family's merge_slice has the registers (ptxas reports no spill there), else 4.
 * kOneRow: a solo merger whose threads hold at most one row each reads 16 splits a round
 * instead of 2 (merge_group; the GQA rows-8 kernel: in the shared GQA kernel, at the
 * register cap, the path moved the spills and cost 1-3% on B128 x 4096). */
template <int W, int Rows, typename O, int Threads, bool kSolo = true, int kSoloSplits = 1 << 30,
          int kOneLoads = 4, bool kOneRow = false>
struct SplitMerge {
    static_assert(W % 4 == 0 && W / 4 <= Threads && Threads % (W / 4) == 0, "merge width");
    static_assert(Rows >= 16 && Rows <= 128, "merge rows");
    static constexpr int kF4 = W / 4;              /* float4 columns of an output row */
    static constexpr int kRowsPerStep = Threads / kF4; /* rows a CTA covers at once */
    static constexpr int kChunk = 256;             /* splits whose weights sW holds at once */
    static constexpr int kQ = 4;                   /* merge_slice: units a thread */
    static constexpr bool kMergesSolo = kSolo;     /* merge_group runs: sW needed */
    /* merge_group: sW [splits][group rows] floats, at most kSoloMergeRows of them (a solo
     * group, merge_is_solo); sRow [2][Rows]. */
    static constexpr size_t kGroupSmemBytes = (size_t)kSoloMergeRows * 4;
    static constexpr size_t kSliceFixedBytes = (size_t)kQ * Threads * 16 + 2 * Rows * 4;
    static __device__ __forceinline__ bool solo(const fi_merge_group &grp) {
        constexpr bool kAnySplits = kSoloSplits >= (1 << 30); /* the default: no test */
        return kSolo && (kAnySplits || grp.num_splits <= kSoloSplits) && merge_is_solo(grp);
    }
    /* merge_slice cuts NVFP4 outputs on block bounds and gives each unit one thread. */
    static __device__ __forceinline__ bool fp4_slices(const fi_exec_common &c) {
        return is_out_dyn<O>::nvfp4 && c.o_fp4;
    }

    /* Row statistics over the splits, rows rr < R: sRow[rr] = max_s lse(s, rr) and
     * sRow[Rows + rr] = sum_s exp(lse(s, rr) - max); a warp a row, lanes stride the
     * splits.  Every caller runs the same loop and shuffle tree, so a row's statistics
     * have the same bits in merge_group and in every slice of merge_slice. */
    template <typename LseAt>
    static __device__ __forceinline__ void row_stats(LseAt lse_at, int ns, int R, float *sRow) {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        for (int rr = warp; rr < R; rr += Threads / 32) {
            float mx = -CUDART_INF_F;
            for (int s = lane; s < ns; s += 32) /* a NaN partial LSE makes the row NaN */
                mx = fmax_nan(mx, lse_at(s, rr));
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                mx = fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float sum = 0.f;
            if (mx != -CUDART_INF_F)
                for (int s = lane; s < ns; s += 32)
                    sum += expf(lse_at(s, rr) - mx);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if (lane == 0) {
                sRow[rr] = mx;
                sRow[Rows + rr] = sum;
            }
        }
    }

    /* Write one merged float4 (dims 4*c4 .. +3) of group row r: t = sum_s w_s O_s (keys
     * only); sRow[rr] / sRow[Rows + rr] are the row's max and sum (row_stats); the sink
     * enters through exp(lse_keys - lse).  The row's LSE is written with column 0.  NVFP4
     * out: the 4 threads of an aligned quad of lanes call it together for c4 = 4 b .. 4 b
     * + 3 of one row (merge_group's mapping, and merge_slice's with fp4_slices). */
    static __device__ __forceinline__ void write_merged(const fi_exec_common &c, const RunCtx &ctx,
                                                        const fi_merge_group &grp,
                                                        const fi_request_info &rq, int nh, int r,
                                                        int c4, float4 t, const float *sRow,
                                                        int rr) {
        const float mx = sRow[rr];
        const float lse_keys = mx == -CUDART_INF_F ? -CUDART_INF_F : mx + logf(sRow[Rows + rr]);
        const int h = grp.head_begin + r % nh;
        const int64_t tok = (int64_t)rq.q_offset + grp.q_begin + r / nh;
        const float lse = c.sinks ? logaddexp(lse_keys, c.sinks[h]) : lse_keys;
        const float f = lse_keys == -CUDART_INF_F ? 0.f : ctx.scale2 * expf(lse_keys - lse);
        const int64_t off = tok * c.out_stride_tok + h * c.out_stride_head + c4 * 4;
        const float4 v = make_float4(t.x * f, t.y * f, t.z * f, t.w * f);
        if (is_out_dyn<O>::nvfp4 && c.o_fp4) /* with the quad of c4 = 4 b .. 4 b + 3 */
            store_nvfp4_4(c, tok, h, c4, v);
        else if constexpr (is_out_dyn<O>::value)
            store_out4_dyn<typename is_out_dyn<O>::type>(c, off, v);
        else
            store_out4<O>(c, off, v);
        if (c.lse && c4 == 0)
            c.lse[tok * c.lse_stride_tok + h * c.lse_stride_head] = lse;
    }

    /* Merge small group g's partial slots (in split order) into out / lse: the whole CTA,
     * by the group's last arriving CTA right after its item.  sW: kGroupSmemBytes of free
     * shared memory (splits x group rows <= kSoloMergeRows floats); sRow: 2 * Rows floats.  Each pass issues all its loads at once: the
     * partial LSEs into shared memory, a warp a row for max and sum, the weights
     * w_s = exp(lse_s - max) / sum, then each thread sums float4 columns of 8 rows, splits
     * outer, so 16 loads are in flight (kOneRow: of 16 splits when a thread has one row;
     * GQA B1 x 32k's merge 7.0 -> 4.6 us, H200).  Not inlined: the tile bodies spill least
     * then. */
    static __device__ __noinline__ void merge_group(const fi_exec_common &c, const RunCtx &ctx,
                                                    int g, float *sW, float *sRow) {
        const fi_merge_group grp = c.groups[g];
        const fi_request_info rq = c.requests[grp.request];
        const int nh = grp.head_end - grp.head_begin;
        const int M = (grp.q_end - grp.q_begin) * nh;
        const int tid = threadIdx.x;
        const int ns = grp.num_splits;
        const float *plse = c.partial_lse + (int64_t)grp.first_slot * c.tile_rows;
        /* With at most kChunk splits the LSEs are staged in shared memory by one pass, so
         * max, sum and weights cost one L2 round trip, not three. */
        const bool staged = ns <= kChunk;
        if (staged) {
            for (int idx = tid; idx < ns * M; idx += Threads) {
                const int s = idx / M, r = idx - s * M;
                sW[s * M + r] = __ldcg(plse + (int64_t)s * c.tile_rows + r);
            }
            cta_sync<Threads>();
        }
        auto lse_at = [&](int s, int r) -> float {
            return staged ? sW[s * M + r] : __ldcg(plse + (int64_t)s * c.tile_rows + r);
        };
        row_stats(lse_at, ns, M, sRow);
        const int v4 = tid % kF4; /* float4 column: dims 4*v4 .. 4*v4+3 */
        const int64_t slot_f4 = (int64_t)c.tile_rows * kF4;
        /* kOneRow with at most a row a thread (GQA decode, a KV head's 4 to 8 rows): the
         * loads below take 16 splits of that row, not 2 splits of 8 rows */
        const bool one = kOneRow && M <= kRowsPerStep;
        /* Passes of 8 * kRowsPerStep rows: thread rows r0 + kRowsPerStep * i, i < 8. */
        for (int pass = 0; pass * 8 * kRowsPerStep < M; ++pass) {
            const int r0 = pass * 8 * kRowsPerStep + tid / kF4;
            float4 acc[8];
#pragma unroll
            for (int i = 0; i < 8; ++i)
                acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int s0 = 0; s0 < ns; s0 += kChunk) {
                const int nc = min(kChunk, ns - s0);
                if (pass == 0 || ns > kChunk) {
                    cta_sync<Threads>(); /* sRow ready; previous chunk's sW consumed */
                    for (int idx = tid; idx < nc * M; idx += Threads) {
                        const int s = idx / M, r = idx - s * M;
                        const float mx = sRow[r];
                        sW[s * M + r] = mx == -CUDART_INF_F
                                               ? 0.f
                                               : expf(lse_at(s0 + s, r) - mx) / sRow[Rows + r];
                    }
                    cta_sync<Threads>();
                }
                const float4 *src = reinterpret_cast<const float4 *>(
                                        c.partial_o + ((int64_t)(grp.first_slot + s0) * c.tile_rows + r0) * W) +
                                    v4;
                /* Two splits x 8 rows = 16 independent loads in flight, summed in split order.
                 * `one`: the same 16 registers take 16 splits of the thread's row instead,
                 * acc[i] summing splits i, i + 8 (of each 16) in order, and the 8 sums are
                 * added in order at the end (one round trip for 16 splits, not 8). */
                constexpr int kU = 2;
                /* register (u, i): split s + sp(u, i) of row r0 + dr(i) */
                auto sp = [one](int u, int i) { return one ? 8 * u + i : u; };
                auto dr = [one](int i) { return one ? 0 : kRowsPerStep * i; };
                for (int s = 0; s < nc; s += one ? 8 * kU : kU) {
                    float4 o[kU][8];
#pragma unroll
                    for (int u = 0; u < kU; ++u)
#pragma unroll
                        for (int i = 0; i < 8; ++i)
                            if (s + sp(u, i) < nc && r0 + dr(i) < M)
                                o[u][i] = __ldcg(src + (s + sp(u, i)) * slot_f4 + dr(i) * kF4);
#pragma unroll
                    for (int u = 0; u < kU; ++u)
#pragma unroll
                        for (int i = 0; i < 8; ++i)
                            if (s + sp(u, i) < nc && r0 + dr(i) < M) {
                                const float w = sW[(s + sp(u, i)) * M + r0 + dr(i)];
                                acc[i].x += w * o[u][i].x;
                                acc[i].y += w * o[u][i].y;
                                acc[i].z += w * o[u][i].z;
                                acc[i].w += w * o[u][i].w;
                            }
                }
            }
            if (one) { /* the loop below writes row r0 alone */
#pragma unroll
                for (int i = 1; i < 8; ++i) {
                    acc[0].x += acc[i].x;
                    acc[0].y += acc[i].y;
                    acc[0].z += acc[i].z;
                    acc[0].w += acc[i].w;
                }
            }
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int r = r0 + kRowsPerStep * i;
                if (r < M)
                    write_merged(c, ctx, grp, rq, nh, r, v4, acc[i], sRow, r);
            }
        }
    }

    /* a[q] += sum over splits s in [sa, sb) of weight(s, row) x O_s[unit uq[q]], q < kQn
     * and vq[q], in split order: kH splits x kQn units of loads in flight at once. */
    template <int kH, int kQn, typename Wf>
    static __device__ __forceinline__ void sum_splits(const float4 *po, int64_t slot_f4, int sa,
                                                      int sb, const int *uq, const bool *vq,
                                                      int r_lo, Wf weight, float4 *a) {
        for (int s = sa; s < sb; s += kH) {
            float4 o[kH][kQn];
#pragma unroll
            for (int h = 0; h < kH; ++h)
#pragma unroll
                for (int q = 0; q < kQn; ++q)
                    if (s + h < sb && vq[q])
                        o[h][q] = __ldcg(po + (int64_t)(s + h) * slot_f4 + uq[q]);
#pragma unroll
            for (int h = 0; h < kH; ++h)
#pragma unroll
                for (int q = 0; q < kQn; ++q)
                    if (s + h < sb && vq[q]) {
                        const float w = weight(s + h, uq[q] / kF4 - r_lo);
                        a[q].x += w * o[h][q].x;
                        a[q].y += w * o[h][q].y;
                        a[q].z += w * o[h][q].z;
                        a[q].w += w * o[h][q].w;
                    }
        }
    }

    /* Cooperative merge of group g: its outputs, M rows x kF4 float4 columns (units u = r *
     * kF4 + c4, also the float4 offset inside a slot), are cut into `nparts` contiguous
     * slices; slice `part` (the split index of the calling CTA's item) is merged here by
     * the whole CTA, once every split has arrived.  So n CTAs share a
     * group's merge (B1 x 32k: 128 CTAs read 32 KB each instead of one CTA 4 MB).
     * Steps: the slice rows' LSEs into shared memory, a warp a row for max and sum, the
     * weights in place, then each thread sums up to kQ units over its part of the splits
     * (K parts a unit, K = Threads / units, at most n), parts added in order through
     * shared memory.  A thread holding one unit keeps kOneLoads splits' loads in flight,
     * else 4 splits x kQ units (B1 x 32k heads 128, 32 splits a part: the sums took 10.7 us
     * with 4 in flight, 6.7 with 16; H200, docs/perf-log.md).  Loading the first 16 before
     * the statistics made those wait behind them (6.2 us instead of 2).  Deterministic: a
     * row's statistics come out the same in any slice; K depends only on (slice size, n);
     * parts are summed in split order and added in order.  grp, rq: group g's record and
     * its request's (plan data, read by merge_phase before its wait: reloading them here,
     * after the acquire, put two more dependent L2 round trips before the LSE loads).
     * smem: the whole dynamic block (no item in flight), smem_bytes long. */
    static __device__ __noinline__ void merge_slice(const fi_exec_common &c, const RunCtx &ctx,
                                                    const fi_merge_group grp, const fi_request_info rq,
                                                    int part, int nparts, unsigned char *smem,
                                                    size_t smem_bytes) {
        const int nh = grp.head_end - grp.head_begin;
        const int M = (grp.q_end - grp.q_begin) * nh;
        const int ns = grp.num_splits;
        const int U = M * kF4;
        /* NVFP4: slices of whole 16-element blocks (4 units; U is a multiple of 4) */
        const bool fp4 = fp4_slices(c);
        const int al = fp4 ? 4 : 1;
        const int u0 = (int)((int64_t)part * U / nparts) / al * al,
                  u1 = (int)((int64_t)(part + 1) * U / nparts) / al * al;
        if (u0 >= u1)
            return; /* uniform over the CTA */
        const int r_lo = u0 / kF4, R = (u1 - 1) / kF4 - r_lo + 1;
        float4 *sAcc = reinterpret_cast<float4 *>(smem);
        float *sRow = reinterpret_cast<float *>(smem + (size_t)kQ * Threads * 16);
        float *sWt = sRow + 2 * Rows;
        const bool staged = (size_t)ns * R * 4 + kSliceFixedBytes <= smem_bytes;
        const float *plse = c.partial_lse + (int64_t)grp.first_slot * c.tile_rows + r_lo;
        const int tid = threadIdx.x;
        if (staged) {
            for (int idx = tid; idx < ns * R; idx += Threads) {
                const int s = idx / R, rr = idx - s * R;
                sWt[idx] = __ldcg(plse + (int64_t)s * c.tile_rows + rr);
            }
            cta_sync<Threads>();
        }
        auto lse_at = [&](int s, int rr) -> float {
            return staged ? sWt[s * R + rr] : __ldcg(plse + (int64_t)s * c.tile_rows + rr);
        };
        row_stats(lse_at, ns, R, sRow);
        cta_sync<Threads>();
        auto weight_of = [&](float lse, int rr) -> float {
            const float mx = sRow[rr];
            return mx == -CUDART_INF_F ? 0.f : expf(lse - mx) / sRow[Rows + rr];
        };
        if (staged) {
            for (int idx = tid; idx < ns * R; idx += Threads)
                sWt[idx] = weight_of(sWt[idx], idx % R); /* in place: own element only */
            cta_sync<Threads>();
        }
        auto weight = [&](int s, int rr) -> float {
            return staged ? sWt[s * R + rr]
                          : weight_of(__ldcg(plse + (int64_t)s * c.tile_rows + rr), rr);
        };
        FI_STAMP3(3);
        const int nu = u1 - u0;
        /* parts a unit (1 when nu >= Threads); NVFP4: 1, so thread j of a round writes unit
         * base + q * Threads + j and an aligned quad of lanes holds a block (write_merged) */
        const int K = fp4 ? 1 : max(1, min(ns, Threads / nu));
        const int per = Threads / K;                 /* units a round, per q */
        /* part k of the splits, unit jt: consecutive threads read consecutive units of one
         * part (whole 128-byte lines of a slot a warp), not one unit of consecutive parts */
        const int k = tid / per, jt = tid % per;
        const int sa = (int)((int64_t)k * ns / K), sb = (int)((int64_t)(k + 1) * ns / K);
        const int64_t slot_f4 = (int64_t)c.tile_rows * kF4;
        const float4 *po = reinterpret_cast<const float4 *>(c.partial_o) + (int64_t)grp.first_slot * slot_f4;
        for (int base = 0; base < nu; base += kQ * per) {
            float4 a[kQ];
            int uq[kQ];
            bool vq[kQ];
#pragma unroll
            for (int q = 0; q < kQ; ++q) {
                const int j = base + q * per + jt;
                vq[q] = k < K && j < nu;
                uq[q] = u0 + j;
                a[q] = make_float4(0.f, 0.f, 0.f, 0.f);
            }
            /* a unit a thread (nu <= per: only q 0 holds one): kOneLoads splits in flight;
             * kOneLoads 4 compiles the general path alone */
            if (kOneLoads > 4 && nu <= per)
                sum_splits<kOneLoads, 1>(po, slot_f4, sa, sb, uq, vq, r_lo, weight, a);
            else
                sum_splits<4, kQ>(po, slot_f4, sa, sb, uq, vq, r_lo, weight, a);
            if (K > 1) {
#pragma unroll
                for (int q = 0; q < kQ; ++q)
                    sAcc[q * Threads + tid] = a[q];
                cta_sync<Threads>();
            }
            if (k == 0) {
#pragma unroll
                for (int q = 0; q < kQ; ++q) {
                    if (!vq[q])
                        continue;
                    float4 t = a[q];
                    for (int kk = 1; kk < K; ++kk) {
                        const float4 b = sAcc[q * Threads + tid + kk * per];
                        t.x += b.x;
                        t.y += b.y;
                        t.z += b.z;
                        t.w += b.w;
                    }
                    const int r = uq[q] / kF4;
                    write_merged(c, ctx, grp, rq, nh, r, uq[q] - r * kF4, t, sRow, r - r_lo);
                }
            }
            if (K > 1)
                cta_sync<Threads>(); /* sAcc is rewritten by the next round */
        }
    }

    /* A CTA's merge phase, after ALL its items: for each of its split items of a large
     * group, in item order, wait until the group's counter shows all n arrivals, merge the
     * item's slice, depart.  Counter (atom.inc bound 2n-1, zero at rest): n arrivals bring
     * it to n; the n departures take it to 2n-1 and the last wraps it to 0, so replays need
     * no reset, and a waiter cannot see the wrap before it departs itself ("value >= n" is
     * the whole condition).  Deadlock-free only when every CTA of the grid is resident (a
     * CTA waits only after issuing all its arrivals): the launcher refuses larger grids. */
    static __device__ void merge_phase(const fi_exec_common &c, const RunCtx &ctx, int i0,
                                       int i1, unsigned char *smem, size_t smem_bytes) {
        for (int i = i0; i < i1; ++i) {
            const int slot = c.items[i].out_slot, g = c.items[i].merge_group;
            if (slot < 0)
                continue;
            const fi_merge_group grp = c.groups[g];
            if (solo(grp))
                continue;
            const fi_request_info rq = c.requests[grp.request]; /* travels during the wait */
            const int n = grp.num_splits;
            if (threadIdx.x == 0)
                while (ld_acquire(c.semaphores + g) < (uint32_t)n)
                    __nanosleep(64);
            cta_sync<Threads>();
            __threadfence();
            FI_STAMP3(1);
            merge_slice(c, ctx, grp, rq, slot - grp.first_slot, n, smem, smem_bytes);
            cta_sync<Threads>();
            FI_STAMP3(2);
            if (threadIdx.x == 0)
                sem_inc(c.semaphores + g, (uint32_t)(2 * n - 1));
        }
    }

    /* Arrival of a split item whose partial (O / l and lse over its keys) is in its slot:
     * one counter increment by thread 0 after a CTA barrier (the barrier orders every
     * thread's partial stores before the cumulative release of atom.acq_rel).  Small
     * groups: bound n-1, and the last arriver merges the group now (into sW / sRow, see
     * merge_group).  Returns 1 when the item's group is merged cooperatively later
     * (merge_phase).  Whole CTA; uses sFlag[0..1] (shared ints). */
    static __device__ __forceinline__ bool arrive(const fi_exec_common &c, const RunCtx &ctx,
                                                  const fi_work_item &it, int *sFlag, float *sW,
                                                  float *sRow) {
        cta_sync<Threads>();
        if (threadIdx.x == 0) {
            const fi_merge_group grp = c.groups[it.merge_group];
            const uint32_t n = (uint32_t)grp.num_splits;
            const bool one = solo(grp);
            const uint32_t old = sem_inc(c.semaphores + it.merge_group, one ? n - 1 : 2 * n - 1);
            sFlag[0] = one && old == n - 1; /* bound n-1 wraps to 0: no reset either */
            sFlag[1] = !one;
        }
        cta_sync<Threads>();
        const bool coop = sFlag[1] != 0;
        FI_STAMP(2);
        if constexpr (kSolo) {
            if (sFlag[0])
                merge_group(c, ctx, it.merge_group, sW, sRow);
        }
        return coop;
    }
};

}  // namespace fi
