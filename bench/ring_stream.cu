/*
 * bench/ring_stream.cu - how fast one producer thread a CTA streams paged KV into a ring of
 * shared-memory stages, by the copy forms the decode producers can use; a probe, not a
 * ceiling (bench/ceilings is the ceiling).
 *
 * The bytes are those of bench_mla's mla_fp8_h16_q1_b128_kv4096 (128 x 4096 tokens of 576
 * bytes, 64-token pages of 36,864 bytes, pages drawn at random from a 2 GiB pool so that
 * nothing is L2-resident); each CTA takes an equal run of pages.  The consumer warp only
 * waits for a stage and frees it: the time is the stream's alone.  Forms (one line each):
 *
 *   bulk      one cp.async.bulk of the whole page (contiguous 36 KB: the DRAM's best case)
 *   bulk9     nine 4 KB bulk copies a page
 *   boxes     the transposed fp8 MLA body's copies: 4 ckv boxes [64 rows][128 B] in the
 *             128-byte swizzle and 1 kpe box [64][64 B] a page (tensor maps, 3-D)
 *   box4d     the 4 ckv boxes as one 4-D box (dims 128 B, rows, panels, pages)
 *   rows      64 bulk copies a page, one a token's row, in token order
 *
 * --bf16: the 16-bit cache's pages instead (mla_h16_q1_b128_kv4096's bytes: 64 tokens of
 * 1,152 bytes, 73,728 a page; boxes: 8 ckv + 1 kpe of [64 rows][128 B], as row 9 copies
 * them; a ring of 2 stages, as row 9's; no box4d).
 *
 * at 132 (the SM count) and 128 CTAs, 5 stages, L2 evict-first, beside a grid-stride
 * 16-byte read of the same byte count (bench/ceilings' kernel, bench/stream_read.cuh);
 * then "bulk" on pieces of 8, 16, 18, 36 and 72 KB instead of pages (the same bytes, ~180 KB in
 * flight a CTA: how the DRAM rate follows the length of each contiguous run; GQA's HND
 * pages give runs of page_size x head_dim bytes).  Why it exists: the transposed body's KV
 * stream alone reached 84% of the read ceiling; this separates the copy form from the rest
 * of the kernel (docs/perf-log.md, twenty-third session: boxes ~6-7% slower than bulk).
 *
 * Output: "ring <form> ctas <n> us <x> TBps <x>" and "stream_read us <x> TBps <x>" lines,
 * medians of --reps (default 20) back-to-back launches timed with cudaEvents.  Exit 0 with
 * "skip" when there is no GPU.  Usage: ring_stream [--reps N] [--bf16] [--l2 0|64|128|256]
 * (--l2: the maps' L2 promotion in bytes, default 128 as mla_host.c's; the twenty-third
 * session's figures are of 256).
 */
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "bench/stream_read.cuh"
#include "executor/cuda/common/ptx.cuh"
extern "C" {
#include "executor/core/tensor_map.h"
}

using namespace fi;

namespace {

constexpr int kMaxStages = 24;
constexpr uint32_t kPage8 = 64 * 576;          /* bytes an fp8 MLA page: 64 tokens of 576 */
constexpr uint32_t kRingBytes = 5 * kPage8;    /* 5 fp8 pages, 2 of 16 bits (the bodies' rings) */
enum Form { kBulk, kBulk9, kBoxes, kBox4d, kRows };
const char *const kFormName[] = {"bulk", "bulk9", "boxes", "box4d", "rows"};

struct Maps {
    CUtensorMap ckv, kpe, ckv4;
};

/* Piece `pg` (`bytes` long; the box forms: an MLA page) into the stage at dst, completing
 * on bar, in form f. */
__device__ __forceinline__ void copy_page(Form f, const uint8_t *kv, int pg, uint32_t bytes, uint32_t dst,
                                          uint32_t bar, uint64_t pol, const Maps &m) {
    const uint8_t *src = kv + (size_t)pg * bytes;
    const bool b16 = bytes == 2 * kPage8;
    const int panels = b16 ? 8 : 4; /* ckv panels of [64 rows][128 B] */
    switch (f) {
    case kBulk: bulk_g2s(dst, src, bytes, bar, pol); break;
    case kBulk9:
        for (int i = 0; i < 9; ++i)
            bulk_g2s(dst + bytes / 9 * i, src + bytes / 9 * i, bytes / 9, bar, pol);
        break;
    case kRows: /* a token's row a copy, in token order */
        for (int i = 0; i < 64; ++i)
            bulk_g2s(dst + bytes / 64 * i, src + bytes / 64 * i, bytes / 64, bar, pol);
        break;
    case kBoxes: /* the transposed bodies' copies: ckv panels, then the kpe one */
        for (int i = 0; i < panels; ++i)
            tma_load_3d(dst + 8192 * i, &m.ckv, (b16 ? 64 : 128) * i, 0, pg, bar, pol);
        tma_load_3d(dst + 8192 * panels, &m.kpe, 0, 0, pg, bar, pol);
        break;
    case kBox4d:
        asm volatile(
            "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
            " [%0], [%1, {%2, %2, %2, %3}], [%4], %5;\n" ::"r"(dst),
            "l"(&m.ckv4), "r"(0), "r"(pg), "r"(bar), "l"(pol)
            : "memory");
        tma_load_3d(dst + 32768, &m.kpe, 0, 0, pg, bar, pol);
        break;
    }
}

/* Warp 0 lane 0 produces, warp 1 consumes (waits, frees); pieces [b0, b1) of order, each
 * `bytes` long, into a ring of kStages stages. */
__global__ void __launch_bounds__(64) ring(const uint8_t *kv, const int *order, int n_pages, uint32_t bytes,
                                           int kStages, Form f, unsigned *sink, const __grid_constant__ Maps m) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const uint32_t full0 = smem_u32(smem + kStages * bytes), empty0 = full0 + 8 * kStages;
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) {
            mbar_init(full0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, 1);
        }
        mbar_init_fence();
    }
    __syncthreads();
    const int b0 = (int)((long long)n_pages * blockIdx.x / gridDim.x);
    const int b1 = (int)((long long)n_pages * (blockIdx.x + 1) / gridDim.x);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp == 0 && lane == 0) {
        const uint64_t pol = l2_evict_first(1.0f);
        for (int i = b0; i < b1; ++i) {
            const int k = i - b0, s = k % kStages;
            if (k >= kStages)
                mbar_wait(empty0 + 8 * s, ((k / kStages) & 1) ^ 1);
            mbar_expect_tx(full0 + 8 * s, bytes);
            copy_page(f, kv, order[i], bytes, smem_u32(smem + (size_t)s * bytes), full0 + 8 * s, pol, m);
        }
    } else if (warp == 1) {
        unsigned acc = 0;
        for (int i = b0; i < b1; ++i) {
            const int k = i - b0, s = k % kStages;
            mbar_wait(full0 + 8 * s, (k / kStages) & 1);
            acc += smem[(size_t)s * bytes + lane * 4];
            __syncwarp();
            if (lane == 0)
                mbar_arrive(empty0 + 8 * s);
        }
        if (acc == 0xdeadbeefu) /* never in practice: keeps the reads */
            *sink = acc;
    }
}

bool ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess)
        fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}

}  // namespace

int main(int argc, char **argv) {
    int reps = 20;
    bool b16 = false;
    uint32_t l2 = 128; /* the maps' L2 promotion, bytes (mla_host.c's) */
    for (int i = 1; i < argc; ++i)
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = std::max(1, atoi(argv[++i]));
        else if (!strcmp(argv[i], "--bf16"))
            b16 = true;
        else if (!strcmp(argv[i], "--l2") && i + 1 < argc)
            l2 = (uint32_t)atoi(argv[++i]);
    const uint32_t kPage = b16 ? 2 * kPage8 : kPage8, row = kPage / 64;
    const fi_dtype dt = b16 ? FI_DTYPE_BF16 : FI_DTYPE_E4M3;
    const uint32_t esz = b16 ? 2 : 1;
    int ndev = 0, sms = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("skip\n");
        return 0;
    }
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const size_t pool = 1ull << 31;
    const int pool_pages = (int)(pool / kPage), n_pages = 128 * 4096 / 64;
    const size_t bytes = (size_t)n_pages * kPage;
    uint8_t *kv = nullptr;
    unsigned *sink = nullptr;
    int *order = nullptr;
    if (!ok(cudaMalloc(&kv, pool), "cudaMalloc") || !ok(cudaMalloc(&sink, 4), "cudaMalloc") ||
        !ok(cudaMalloc(&order, (pool / 8192) * sizeof(int)), "cudaMalloc"))
        return 1;
    cudaMemset(kv, 1, pool);
    /* the first `count` of a random permutation of the pool's pieces of `piece` bytes */
    auto draw = [&](uint32_t piece) {
        std::vector<int> o(pool / piece);
        for (size_t i = 0; i < o.size(); ++i)
            o[i] = (int)i;
        std::shuffle(o.begin(), o.end(), std::mt19937(7));
        const int count = (int)(bytes / piece);
        cudaMemcpy(order, o.data(), count * sizeof(int), cudaMemcpyHostToDevice);
        return count;
    };

    Maps m;
    const uint64_t pages = (uint64_t)pool_pages;
    /* ckv: boxes of 128 bytes x 64 rows; kpe (64 elements): 64 bytes (fp8) or 128 */
    const uint64_t d_ckv[3] = {512, 64, pages}, d_kpe[3] = {64, 64, pages}, st[2] = {row, kPage};
    const uint32_t b_ckv[3] = {128 / esz, 64, 1}, b_kpe[3] = {64, 64, 1};
    const uint64_t d4[4] = {128, 64, 4, pages}, st4[3] = {576, 128, kPage};
    const uint32_t b4[4] = {128, 64, 4, 1};
    const bool maps = fi_tensor_map(&m.ckv, dt, kv, 3, d_ckv, st, b_ckv, 128, l2) == 0 &&
                      fi_tensor_map(&m.kpe, dt, kv + 512 * esz, 3, d_kpe, st, b_kpe, 64 * esz, l2) == 0;
    const bool map4 = !b16 && fi_tensor_map(&m.ckv4, FI_DTYPE_E4M3, kv, 4, d4, st4, b4, 128, l2) == 0;

    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    auto median_us = [&](auto launch) {
        std::vector<float> t(reps);
        for (int w = 0; w < 3; ++w)
            launch();
        for (int r = 0; r < reps; ++r) {
            cudaEventRecord(e0);
            launch();
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            cudaEventElapsedTime(&t[r], e0, e1);
        }
        std::sort(t.begin(), t.end());
        return t[reps / 2] * 1000.f;
    };
    /* the reference read: the first `bytes` of the pool, contiguous */
    const float us_ref = median_us([&] { stream_read<<<sms * 8, 256>>>((const uint4 *)kv, bytes / 16, sink); });
    printf("stream_read us %.1f TBps %.3f\n", us_ref, bytes / us_ref / 1e6);
    const size_t smem = kRingBytes + 16 * kMaxStages;
    if (!ok(cudaFuncSetAttribute(ring, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), "smem"))
        return 1;
    /* one form at one piece size and CTA count: a line */
    auto run = [&](Form f, uint32_t piece, int ctas) {
        const int n = draw(piece), stages = std::min<int>(kMaxStages, kRingBytes / piece);
        const float us = median_us([&] { ring<<<ctas, 64, smem>>>(kv, order, n, piece, stages, f, sink, m); });
        if (!ok(cudaGetLastError(), kFormName[f]))
            return false;
        printf("ring %s piece %u stages %d ctas %d us %.1f TBps %.3f\n", kFormName[f], piece, stages, ctas, us,
               bytes / us / 1e6);
        return true;
    };
    printf("pages of %u bytes (%s), maps' L2 promotion %u bytes\n", kPage, b16 ? "16-bit" : "fp8", l2);
    for (int f = kBulk; f <= kRows; ++f) {
        if ((f == kBoxes && !maps) || (f == kBox4d && !(maps && map4))) {
            printf("ring %s: no tensor map\n", kFormName[f]);
            continue;
        }
        for (int ctas : {sms, 128})
            if (!run((Form)f, kPage, ctas))
                return 1;
    }
    for (uint32_t piece : {8192u, 16384u, 18432u, 36864u, 73728u})
        if (!run(kBulk, piece, sms))
            return 1;
    return ok(cudaDeviceSynchronize(), "sync") ? 0 : 1;
}
