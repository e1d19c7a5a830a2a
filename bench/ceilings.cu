/*
 * bench/ceilings.cu - the two ceilings an attention kernel is measured against, taken on the
 * same GPU in the same run as the benchmark (clocks and power limits drift between runs).
 *
 *   read_TBps    streaming read bandwidth: a grid-stride kernel of 16-byte loads (uint4),
 *                8 independent loads in flight per thread (bench/stream_read.cuh), over a >= 1 GiB buffer
 *                (far beyond L2), median of REPEATS timed runs (cudaEvent).  A plain
 *                reduction (torch.sum) stays below this; it is the number to divide by.
 *   bf16_TFLOPs  cublasGemmEx, bf16 in / bf16 out, fp32 accumulation, M = N = K = 8192,
 *                random data in [-1, 1) (zeros would let the tensor cores idle at lower
 *                power and read high), median of REPEATS, 2 M N K flops per product.
 *   fp8_TFLOPs   the same product with fp8 e4m3 inputs (cublasLtMatmul, A transposed as
 *                fp8 requires, bf16 out, fp32 accumulation): the rate the fp8 MLA bodies'
 *                TFLOP/s is measured against.  0 when cuBLASLt has no such product here
 *                (the reason on stderr): the run goes on with the other ceilings.
 *
 * Output: human lines on stderr, machine-readable lines on stdout:
 *   device <name> sms <n> l2_bytes <n>
 *   ceiling read_TBps <x>
 *   ceiling bf16_TFLOPs <x>
 *   ceiling fp8_TFLOPs <x>
 *   floor empty_kernel_us <x>            (reference points, see small_reads)
 *   small_read MB <n> us <x> TBps <x>
 * Usage: ceilings [read_GiB (default 2)].  Exit 0 with "skip" on stdout when no GPU.
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/stream_read.cuh"

#define CK(call)                                                                            \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,                    \
                    cudaGetErrorString(e_));                                                \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)
#define CB(call)                                                                            \
    do {                                                                                    \
        cublasStatus_t s_ = (call);                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                  \
            fprintf(stderr, "%s:%d %s: cublas status %d\n", __FILE__, __LINE__, #call,      \
                    (int)s_);                                                               \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

static const int REPEATS = 21;

/* Deterministic pseudo-random value in [-1, 1) of index i (a hash of it). */
__device__ __forceinline__ float hash_unit(size_t i, unsigned seed) {
    unsigned x = (unsigned)i * 2654435761u ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return (float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

/* Those values as bf16, and as fp8 e4m3 (round to nearest). */
__global__ void fill_bf16(__nv_bfloat16 *p, size_t n, unsigned seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16(hash_unit(i, seed));
}
__global__ void fill_e4m3(__nv_fp8_e4m3 *p, size_t n, unsigned seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = __nv_fp8_e4m3(hash_unit(i, seed));
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* Median seconds of REPEATS runs of launch(r), each timed alone between two events. */
template <typename F> static double median_time(F &&launch) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<double> t;
    for (int r = 0; r < REPEATS; r++) {
        CK(cudaEventRecord(a));
        launch(r);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1e-3);
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return median(t);
}

__global__ void empty_kernel() {}

/* A read buffer of `bytes` (filled, so the pages are mapped), its sink word, and how many
 * streaming-read CTAs fit on an SM. */
static uint4 *read_buffer(size_t bytes, unsigned **sink, int *per_sm) {
    uint4 *buf = nullptr;
    CK(cudaMalloc(&buf, bytes));
    CK(cudaMalloc(sink, sizeof(unsigned)));
    CK(cudaMemset(buf, 0x5a, bytes));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, stream_read, 256, 0));
    return buf;
}

/* Reference points for small batches (printed, not ceilings): the event-to-event time of an
 * empty one-CTA-per-SM launch, and the same streaming read over windows of a few hundred MB
 * or less, each window a different part of the buffer so L2 holds none of it (ramp-up and
 * tail included: what any kernel reading that many bytes pays). */
static void small_reads(int sms) {
    const size_t win_mb[3] = {38, 128, 604}; /* B1 x 32k, trace snapshot, B128 x 4096 at h16 */
    const size_t total = (size_t)2 << 30;
    unsigned *sink = nullptr;
    int per_sm = 0;
    uint4 *buf = read_buffer(total, &sink, &per_sm);
    const double t0 = median_time([&](int) { empty_kernel<<<sms, 256>>>(); });
    printf("floor empty_kernel_us %.2f\n", t0 * 1e6);
    for (size_t w : win_mb) {
        const size_t bytes = w << 20, nwin = total / bytes;
        const double s_ = median_time([&](int r) {
            stream_read<<<sms * per_sm, 256>>>(buf + (size_t)(r % nwin) * (bytes / 16), bytes / 16,
                                               sink);
        });
        printf("small_read MB %zu us %.2f TBps %.3f\n", w, s_ * 1e6, (double)bytes / s_ / 1e12);
    }
    fflush(stdout);
    CK(cudaFree(buf));
    CK(cudaFree(sink));
}

static double read_ceiling(double gib, int sms) {
    size_t bytes = (size_t)(gib * 1073741824.0);
    bytes &= ~(size_t)4095;
    size_t n16 = bytes / 16;
    unsigned *sink = nullptr;
    int per_sm = 0;
    uint4 *buf = read_buffer(bytes, &sink, &per_sm);
    int grid = sms * per_sm;
    stream_read<<<grid, 256>>>(buf, n16, sink); /* warm up */
    CK(cudaGetLastError());
    const double s = median_time([&](int) { stream_read<<<grid, 256>>>(buf, n16, sink); });
    fprintf(stderr, "stream read: %.2f GiB, grid %d x 256, median %.1f us over %d\n", gib, grid,
            s * 1e6, REPEATS);
    CK(cudaFree(buf));
    CK(cudaFree(sink));
    return (double)bytes / s / 1e12;
}

static double gemm_ceiling(void) {
    const int n = 8192;
    const size_t elems = (size_t)n * n;
    __nv_bfloat16 *A, *B, *C;
    CK(cudaMalloc(&A, elems * 2));
    CK(cudaMalloc(&B, elems * 2));
    CK(cudaMalloc(&C, elems * 2));
    fill_bf16<<<1024, 256>>>(A, elems, 12345u);
    fill_bf16<<<1024, 256>>>(B, elems, 67890u);
    CK(cudaGetLastError());
    cublasHandle_t h;
    CB(cublasCreate(&h));
    const float alpha = 1.0f, beta = 0.0f;
    auto gemm = [&]() {
        CB(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, A, CUDA_R_16BF, n, B,
                        CUDA_R_16BF, n, &beta, C, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
    };
    for (int w = 0; w < 3; w++) gemm();
    const double s = median_time([&](int) { gemm(); });
    fprintf(stderr, "bf16 gemm %d^3: median %.1f us over %d\n", n, s * 1e6, REPEATS);
    CB(cublasDestroy(h));
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(C));
    return 2.0 * n * (double)n * n / s / 1e12;
}

/* cuBLASLt's status as a message; 0 when ok.  The fp8 ceiling is optional, so its errors
 * are reported and the ceiling skipped instead of exiting. */
static int lt_failed(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return 0;
    fprintf(stderr, "fp8 gemm: %s: cublas status %d (fp8_TFLOPs reported as 0)\n", what, (int)st);
    return 1;
}

/* fp8 e4m3 8192^3 through cublasLtMatmul: D (bf16, M x N) = A^T B, A stored K x M and B
 * K x N column-major (the TN form fp8 matmuls take), fp32 accumulation and scale.  TFLOP/s,
 * or 0 when cuBLASLt finds no algorithm or fails (the message on stderr). */
static double fp8_gemm_ceiling(void) {
    const int n = 8192;
    const size_t elems = (size_t)n * n, ws_bytes = (size_t)32 << 20;
    __nv_fp8_e4m3 *A, *B;
    __nv_bfloat16 *D;
    void *ws;
    CK(cudaMalloc(&A, elems));
    CK(cudaMalloc(&B, elems));
    CK(cudaMalloc(&D, elems * 2));
    CK(cudaMalloc(&ws, ws_bytes));
    fill_e4m3<<<1024, 256>>>(A, elems, 12345u);
    fill_e4m3<<<1024, 256>>>(B, elems, 67890u);
    CK(cudaGetLastError());
    double tflops = 0;
    cublasLtHandle_t lt = NULL;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t algo;
    int found = 0;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const float alpha = 1.0f, beta = 0.0f;
    if (lt_failed(cublasLtCreate(&lt), "cublasLtCreate") ||
        lt_failed(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc") ||
        lt_failed(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
                  "transa") ||
        lt_failed(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
                  "transb") ||
        lt_failed(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, n, n, n), "layout A") ||
        lt_failed(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, n, n, n), "layout B") ||
        lt_failed(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, n, n), "layout D") ||
        lt_failed(cublasLtMatmulPreferenceCreate(&pref), "preference") ||
        lt_failed(cublasLtMatmulPreferenceSetAttribute(
                      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes),
                  "workspace") ||
        lt_failed(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &algo, &found),
                  "heuristic"))
        goto out;
    if (found < 1) {
        fprintf(stderr, "fp8 gemm: no cuBLASLt algorithm (fp8_TFLOPs reported as 0)\n");
        goto out;
    }
    {
        auto gemm = [&]() {
            return cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &algo.algo,
                                  ws, ws_bytes, 0);
        };
        if (lt_failed(gemm(), "cublasLtMatmul")) goto out;
        for (int w = 0; w < 2; w++) gemm();
        const double s = median_time([&](int) { gemm(); });
        fprintf(stderr, "fp8 gemm %d^3: median %.1f us over %d\n", n, s * 1e6, REPEATS);
        tflops = 2.0 * n * (double)n * n / s / 1e12;
    }
out:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    if (lt) cublasLtDestroy(lt);
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(D));
    CK(cudaFree(ws));
    return tflops;
}

int main(int argc, char **argv) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("skip no CUDA device\n");
        return 0;
    }
    double gib = argc > 1 ? atof(argv[1]) : 2.0;
    if (gib < 1.0) gib = 1.0; /* the ceiling must not fit in any cache */
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    for (char *c = prop.name; *c; c++)
        if (*c == ' ') *c = '_'; /* one token, for the parser */
    printf("device %s sms %d l2_bytes %d\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize);
    fflush(stdout);
    double tbps = read_ceiling(gib, prop.multiProcessorCount);
    printf("ceiling read_TBps %.3f\n", tbps);
    fflush(stdout);
    double tflops = gemm_ceiling();
    printf("ceiling bf16_TFLOPs %.1f\n", tflops);
    fflush(stdout);
    printf("ceiling fp8_TFLOPs %.1f\n", fp8_gemm_ceiling());
    fflush(stdout);
    small_reads(prop.multiProcessorCount);
    return 0;
}
