/*
 * scripts/gqa_smoke.c - a quick GQA decode check on the GPU while the full suite
 * (tests/gpu/test_gqa_gpu.c) is written: one random batch, fi_run against
 * fi_naive_attention, max per-row relative error, then a rough CUDA-event timing.
 *
 *   gqa_smoke D H_q H_kv page_size B max_kv q_len hnd window sinks num_ctas [reps]
 *
 * Build: cc -std=c11 -O2 -Iinclude -I. -I/usr/local/cuda/include scripts/gqa_smoke.c
 *        build/libfiattn.a -L/usr/local/cuda/lib64 -lcudart_static -ldl -lrt -lpthread
 *        -lstdc++ -lm
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "fiattn.h"
#include "fiattn_ref.h"
#include "fiattn_run.h"

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float frand(void) { return (float)(rnd() % 2000001) / 1000000.0f - 1.0f; }
static uint16_t bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float unbf(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#define CK(x)                                                                               \
    do {                                                                                    \
        cudaError_t e_ = (x);                                                               \
        if (e_ != cudaSuccess) {                                                            \
            printf("FAIL %s: %s\n", #x, cudaGetErrorString(e_));                            \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 12) {
        printf("usage: gqa_smoke D H_q H_kv page_size B max_kv q_len hnd window sinks num_ctas [reps]\n");
        return 2;
    }
    const int D = atoi(argv[1]), HQ = atoi(argv[2]), HK = atoi(argv[3]), PS = atoi(argv[4]);
    const int B = atoi(argv[5]), MAXKV = atoi(argv[6]), QL = atoi(argv[7]), HND = atoi(argv[8]);
    const int WIN = atoi(argv[9]), SINKS = atoi(argv[10]), CTAS = atoi(argv[11]);
    const int REPS = argc > 12 ? atoi(argv[12]) : 0;
    const int uniform = MAXKV < 0;
    const int maxkv = uniform ? -MAXKV : MAXKV;
    int32_t *kv = malloc(sizeof(int32_t) * B);
    int64_t pages = 0;
    const int P = (maxkv + PS - 1) / PS;
    for (int b = 0; b < B; b++) {
        kv[b] = uniform ? maxkv : (int32_t)(rnd() % (uint32_t)maxkv) + (QL > 1 ? QL : 0);
        if (kv[b] > maxkv) kv[b] = maxkv;
        pages += (kv[b] + PS - 1) / PS;
    }
    const int64_t NP = pages + 3;
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)B * P);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)NP);
    for (int64_t i = 0; i < NP; i++) perm[i] = (int32_t)i;
    for (int64_t i = NP - 1; i > 0; i--) {
        int64_t j = rnd() % (uint64_t)(i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int64_t next = 0;
    for (int b = 0; b < B; b++)
        for (int p = 0; p < P; p++) bt[(int64_t)b * P + p] = p < (kv[b] + PS - 1) / PS ? perm[next++] : 0;
    const int64_t T = (int64_t)B * QL;
    const int64_t nq = T * HQ * D, nkv = NP * 2 * PS * HK * D, no = T * HQ * D;
    uint16_t *hq = malloc(nq * 2), *hkv = malloc(nkv * 2), *hout = malloc(no * 2);
    for (int64_t i = 0; i < nq; i++) hq[i] = bf(frand());
    for (int64_t i = 0; i < nkv; i++) hkv[i] = bf(frand());
    float *sinks = malloc(sizeof(float) * HQ);
    for (int h = 0; h < HQ; h++) sinks[h] = 2.0f * frand() + 1.0f;

    fi_caps caps = {0};
    caps.kind = FI_KIND_GQA_DECODE;
    caps.max_batch = B;
    caps.max_q_tokens = (int32_t)T;
    caps.num_pages = (int32_t)NP;
    caps.page_size = PS;
    caps.num_qo_heads = HQ;
    caps.num_kv_heads = HK;
    caps.head_dim_qk = caps.head_dim_vo = D;
    caps.q_dtype = caps.kv_dtype = caps.o_dtype = FI_DTYPE_BF16;
    caps.num_ctas = CTAS;
    fi_batch bat = {0};
    bat.form = FI_FORM_BLOCK_TABLES;
    bat.batch_size = B;
    bat.block_tables = bt;
    bat.max_pages_per_seq = P;
    bat.seq_lens = kv;
    bat.q_len_per_request = QL;
    bat.causal = QL > 1;
    bat.window_left = WIN;

    void *dq, *dkv, *dout, *dws, *dlse;
    int32_t *dbt;
    float *dsinks;
    size_t wsb = 0;
    fi_status st = fi_workspace_size(&caps, &wsb);
    if (st) { printf("FAIL ws %s\n", fi_status_name(st)); return 1; }
    CK(cudaMalloc(&dq, nq * 2));
    CK(cudaMalloc(&dkv, nkv * 2));
    CK(cudaMalloc(&dout, no * 2));
    CK(cudaMalloc(&dlse, T * HQ * 4));
    CK(cudaMalloc(&dws, wsb));
    CK(cudaMalloc((void **)&dbt, sizeof(int32_t) * (size_t)B * P));
    CK(cudaMalloc((void **)&dsinks, sizeof(float) * HQ));
    CK(cudaMemcpy(dq, hq, nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dkv, hkv, nkv * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dbt, bt, sizeof(int32_t) * (size_t)B * P, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dsinks, sinks, sizeof(float) * HQ, cudaMemcpyHostToDevice));
    CK(cudaMemset(dout, 0xff, no * 2));
    fi_plan *plan = NULL;
    if ((st = fi_plan_create(&caps, dws, wsb, NULL, &plan))) { printf("FAIL create %s\n", fi_status_name(st)); return 1; }
    if ((st = fi_plan_update(plan, &bat, NULL))) { printf("FAIL update %s\n", fi_status_name(st)); return 1; }
    fi_plan_view view;
    fi_plan_get_view(plan, &view);

    /* Views: single tensor [pages, 2, ps, H, D] (NHD) or [pages, 2, H, ps, D] (HND). */
    const int64_t ps_ = PS, H = HK;
    const int64_t sp = 2 * ps_ * H * D, half = ps_ * H * D;
    const int64_t st_tok = HND ? D : H * D, st_head = HND ? ps_ * D : D;
    int64_t ks[4] = {NP, PS, HK, D}, kst[4] = {sp, st_tok, st_head, 1};
    int64_t qs[3] = {T, HQ, D}, qst[3] = {(int64_t)HQ * D, D, 1};
    int64_t ts[2] = {B, P}, tst[2] = {P, 1};
    int64_t ls[2] = {T, HQ}, lst[2] = {HQ, 1};
    fi_attn_args a;
    memset(&a, 0, sizeof a);
    a.q = fi_tensor_make(dq, FI_DTYPE_BF16, 3, qs, qst);
    a.k = fi_tensor_make(dkv, FI_DTYPE_BF16, 4, ks, kst);
    a.v = fi_tensor_make((uint16_t *)dkv + half, FI_DTYPE_BF16, 4, ks, kst);
    a.page_table = fi_tensor_make(dbt, FI_DTYPE_I32, 2, ts, tst);
    a.out = fi_tensor_make(dout, FI_DTYPE_BF16, 3, qs, qst);
    a.lse = fi_tensor_make(dlse, FI_DTYPE_F32, 2, ls, lst);
    a.bmm1_scale = 1.0f / sqrtf((float)D);
    a.bmm2_scale = 1.0f;
    a.sinks = SINKS ? dsinks : NULL;
    if ((st = fi_run(plan, &a, NULL))) { printf("FAIL run %s\n", fi_status_name(st)); return 1; }
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hout, dout, no * 2, cudaMemcpyDeviceToHost));
    float *hlse = malloc(T * HQ * 4);
    CK(cudaMemcpy(hlse, dlse, T * HQ * 4, cudaMemcpyDeviceToHost));

    int check = (int64_t)B * maxkv <= 64ll * 4096 * 8;
    double worst = 0, worst_lse = 0;
    int nan = 0;
    for (int64_t i = 0; i < no; i++) nan += isnan(unbf(hout[i])) != 0;
    if (check) {
        float *rout = malloc(no * 4), *rlse = malloc(T * HQ * 4);
        fi_attn_args r = a;
        int64_t kvs[4] = {NP, PS, HK, D};
        r.q = fi_tensor_make(hq, FI_DTYPE_BF16, 3, qs, qst);
        r.k = fi_tensor_make(hkv, FI_DTYPE_BF16, 4, kvs, kst);
        r.v = fi_tensor_make(hkv + half, FI_DTYPE_BF16, 4, kvs, kst);
        r.page_table = fi_tensor_make(bt, FI_DTYPE_I32, 2, ts, tst);
        r.out = fi_tensor_make(rout, FI_DTYPE_F32, 3, qs, qst);
        r.lse = fi_tensor_make(rlse, FI_DTYPE_F32, 2, ls, lst);
        r.sinks = SINKS ? sinks : NULL;
        if ((st = fi_naive_attention(&caps, &bat, &r))) { printf("FAIL naive %s\n", fi_status_name(st)); return 1; }
        for (int64_t row = 0; row < T * HQ; row++) {
            double num = 0, den = 0;
            for (int d = 0; d < D; d++) {
                double x = unbf(hout[row * D + d]), y = rout[row * D + d];
                num += (x - y) * (x - y);
                den += y * y;
            }
            double e = den > 0 ? sqrt(num / den) : sqrt(num);
            if (!(e <= worst)) worst = e;
            double el = isinf(rlse[row]) && isinf(hlse[row]) ? 0 : fabs((double)rlse[row] - hlse[row]);
            if (!(el <= worst_lse)) worst_lse = el;
        }
    }
    printf("%s D=%d Hq=%d Hkv=%d ps=%d B=%d maxkv=%d q=%d hnd=%d win=%d sinks=%d ctas=%d items=%d groups=%d: nan=%d max_rel=%.3g max_lse=%.3g\n",
           (check && (worst > 1e-2 || worst_lse > 1e-2)) || nan ? "FAIL" : "ok", D, HQ, HK, PS, B, maxkv,
           QL, HND, WIN, SINKS, CTAS, view.header->num_items, view.header->num_groups, nan, worst, worst_lse);
    if (REPS > 0) {
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        for (int i = 0; i < 5; i++) fi_run(plan, &a, NULL);
        cudaEventRecord(e0, NULL);
        for (int i = 0; i < REPS; i++) fi_run(plan, &a, NULL);
        cudaEventRecord(e1, NULL);
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        double kvbytes = 0;
        for (int b = 0; b < B; b++) kvbytes += (double)kv[b] * HK * D * 2 * 2;
        const double us = ms * 1000.0 / REPS;
        printf("time %.1f us  %.0f GB/s (KV only)\n", us, kvbytes / us / 1e3);
    }
    fi_plan_destroy(plan);
    return 0;
}
