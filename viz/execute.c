/*
 * viz/execute.c - fiplan --execute: run a plan on random data and measure its error
 * against fi_naive_attention (fp64, no plan).
 *
 * CPU path: fi_ref_run on the host plan, fp32 tensors; expected error ~1e-7 (fp32
 *   accumulation against fp64).
 * GPU path (a CUDA device is present and the kind is MLA): a device plan over an owned
 *   workspace, bf16 q / ckv / kpe / out in device memory, fi_run, then the bf16 output
 *   against the naive result on the same bf16-rounded inputs; expected error ~4e-3 (bf16
 *   output rounding plus bf16 P in the P.V product).
 * Tensor layouts (fiattn_run.h): MLA q is a [T, H, 576] buffer seen as the 512-wide q and
 * the 64-wide q_rope at +512; the cache is [pages, page_size, 1, 576] seen the same way.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "executor/cpu/dtype_convert.h" /* fi_f32_to_bf16_rne, fi_bf16_to_f32 */
#include "fiattn_ref.h"
#include "fiattn_run.h"
#include "viz/fiplan.h"

int fiplan_have_gpu(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform [-1, 1); rounded through bf16 when `bf16` so host and device see one value. */
static void fill_random(float *x, int64_t n, uint64_t *s, int bf16) {
    for (int64_t i = 0; i < n; i++) {
        float v = (float)((mix(s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
        x[i] = bf16 ? fi_bf16_to_f32(fi_f32_to_bf16_rne(v)) : v;
    }
}

/* Host buffers of one problem, all fp32 (page table int32 from the fibatch). */
typedef struct problem {
    int32_t T, H, Hkv, dqk, dvo, dmain, drope, ps, np;
    float *q, *k, *v;          /* [T,H,dqk], [np,ps,Hkv,dqk], [np,ps,Hkv,dvo] (non-MLA) */
    float *out, *lse;          /* executor result [T,H,dvo], [T,H] */
    float *ref_out, *ref_lse;  /* naive result */
} problem;

/* args over the buffers (data pointers possibly replaced by device ones later). */
static fi_attn_args make_args(const problem *p, const fibatch *b, fi_dtype dt, void *q, void *k,
                              void *v, void *out, float *lse) {
    fi_attn_args a;
    memset(&a, 0, sizeof a);
    size_t esz = dt == FI_DTYPE_F32 ? 4 : 2;
    int mla = p->drope > 0;
    const int64_t qs[3] = {(int64_t)p->H * p->dqk, p->dqk, 1};
    const int64_t ks[4] = {(int64_t)p->ps * p->Hkv * p->dqk, (int64_t)p->Hkv * p->dqk, p->dqk, 1};
    const int64_t qsh[3] = {p->T, p->H, p->dmain};
    const int64_t ksh[4] = {p->np, p->ps, p->Hkv, p->dmain};
    a.q = fi_tensor_make(q, dt, 3, qsh, qs);
    a.k = fi_tensor_make(k, dt, 4, ksh, ks);
    if (mla) {
        const int64_t qrsh[3] = {p->T, p->H, p->drope};
        const int64_t krsh[4] = {p->np, p->ps, 1, p->drope};
        a.q_rope = fi_tensor_make((char *)q + (size_t)p->dmain * esz, dt, 3, qrsh, qs);
        a.k_rope = fi_tensor_make((char *)k + (size_t)p->dmain * esz, dt, 4, krsh, ks);
    } else {
        const int64_t vs[4] = {(int64_t)p->ps * p->Hkv * p->dvo, (int64_t)p->Hkv * p->dvo, p->dvo, 1};
        const int64_t vsh[4] = {p->np, p->ps, p->Hkv, p->dvo};
        a.v = fi_tensor_make(v, dt, 4, vsh, vs);
    }
    const int64_t os[3] = {(int64_t)p->H * p->dvo, p->dvo, 1}, osh[3] = {p->T, p->H, p->dvo};
    a.out = fi_tensor_make(out, dt, 3, osh, os);
    const int64_t ls[2] = {p->H, 1}, lsh[2] = {p->T, p->H};
    a.lse = fi_tensor_make(lse, FI_DTYPE_F32, 2, lsh, ls);
    const fi_batch *fb = &b->batch;
    if (fb->form == FI_FORM_INDPTR) {
        const int64_t sh[1] = {b->page_table_len > 0 ? b->page_table_len : 1}, st[1] = {1};
        a.page_table = fi_tensor_make(b->page_table, FI_DTYPE_I32, 1, sh, st);
    } else if (fb->kv_split_pages) {
        const int64_t sh[3] = {fb->batch_size, 2, fb->max_pages_per_seq};
        const int64_t st[3] = {2LL * fb->max_pages_per_seq, fb->max_pages_per_seq, 1};
        a.page_table = fi_tensor_make(b->page_table, FI_DTYPE_I32, 3, sh, st);
    } else {
        const int64_t sh[2] = {fb->batch_size, fb->max_pages_per_seq};
        const int64_t st[2] = {fb->max_pages_per_seq, 1};
        a.page_table = fi_tensor_make(b->page_table, FI_DTYPE_I32, 2, sh, st);
    }
    a.bmm1_scale = 1.0f / sqrtf((float)p->dqk);
    a.bmm2_scale = 1.0f;
    return a;
}

/* rel = ||x - r|| / ||r|| over positions where both are finite; *bad counts positions
 * where either is NaN or where they disagree on a non-finite value. */
static double rel_error(const float *x, const float *r, int64_t n, int64_t *bad) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i]) || isnan(r[i])) { (*bad)++; continue; }
        if (!isfinite(x[i]) || !isfinite(r[i])) { *bad += x[i] != r[i]; continue; }
        double d = (double)x[i] - r[i];
        num += d * d;
        den += (double)r[i] * r[i];
    }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num / den);
}

static void problem_free(problem *p) {
    fiplan_free(p->q);
    fiplan_free(p->k);
    fiplan_free(p->v);
    fiplan_free(p->out);
    fiplan_free(p->lse);
    fiplan_free(p->ref_out);
    fiplan_free(p->ref_lse);
}

/* The GPU half: device plan, bf16 copies, fi_run, result back into p->out / p->lse. */
/* Mean time of `runs` fi_run launches after 3 warm-ups, CUDA events around them; and the
 * bytes one run moves (KV rows of every item, q, out; lse ignored) over that time. */
static fi_status time_gpu(const fi_plan *plan, const fi_attn_args *a, const problem *p,
                          fiplan_exec_result *res) {
    const int runs = 10;
    cudaEvent_t e0 = NULL, e1 = NULL;
    fi_status st = FI_ERR_CUDA;
    float ms = 0;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) goto out;
    for (int i = 0; i < 3 + runs; i++) {
        if (i == 3 && cudaEventRecord(e0, NULL) != cudaSuccess) goto out;
        if ((st = fi_run(plan, a, NULL)) != FI_OK) goto out;
    }
    st = FI_ERR_CUDA;
    if (cudaEventRecord(e1, NULL) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
        cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
        goto out;
    fi_plan_view v;
    if ((st = fi_plan_get_view(plan, &v)) != FI_OK) goto out;
    double kv = 0;
    for (int32_t i = 0; i < v.header->num_items; i++)
        kv += (double)(v.items[i].kv_end - v.items[i].kv_begin);
    const double bytes = 2.0 * (kv * p->dqk * p->Hkv + (double)p->T * p->H * (p->dqk + p->dvo));
    res->gpu_runs = runs;
    res->gpu_us = ms * 1e3 / runs;
    res->gpu_gbps = res->gpu_us > 0 ? bytes / (res->gpu_us * 1e3) : 0;
    st = FI_OK;
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return st;
}

static fi_status run_gpu(const fi_caps *caps, const fibatch *b, problem *p, double *ms,
                         fiplan_exec_result *res) {
    fi_caps dc = *caps;
    dc.q_dtype = dc.kv_dtype = dc.o_dtype = FI_DTYPE_BF16;
    int64_t nq = (int64_t)p->T * p->H * p->dqk, nk = (int64_t)p->np * p->ps * p->dqk;
    int64_t no = (int64_t)p->T * p->H * p->dvo, nl = (int64_t)p->T * p->H;
    uint16_t *hq = fiplan_alloc((size_t)nq * 2), *hk = fiplan_alloc((size_t)nk * 2);
    uint16_t *ho = fiplan_alloc((size_t)no * 2);
    void *dq = NULL, *dk = NULL, *dout = NULL, *dlse = NULL, *dpt = NULL;
    fi_plan *plan = NULL;
    fi_status st = FI_ERR_OUT_OF_MEMORY;
    if (!hq || !hk || !ho) goto done;
    for (int64_t i = 0; i < nq; i++) hq[i] = fi_f32_to_bf16_rne(p->q[i]);
    for (int64_t i = 0; i < nk; i++) hk[i] = fi_f32_to_bf16_rne(p->k[i]);
    size_t pt_bytes = (size_t)(b->page_table_len > 0 ? b->page_table_len : 1) * 4;
    st = FI_ERR_CUDA;
    if (cudaMalloc(&dq, (size_t)nq * 2) != cudaSuccess || cudaMalloc(&dk, (size_t)nk * 2) != cudaSuccess ||
        cudaMalloc(&dout, (size_t)no * 2) != cudaSuccess || cudaMalloc(&dlse, (size_t)nl * 4) != cudaSuccess ||
        cudaMalloc(&dpt, pt_bytes) != cudaSuccess)
        goto done;
    if (cudaMemcpy(dq, hq, (size_t)nq * 2, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(dk, hk, (size_t)nk * 2, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(dpt, b->page_table, pt_bytes, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemset(dout, 0xff, (size_t)no * 2) != cudaSuccess) /* poison: bf16 NaN */
        goto done;
    if ((st = fi_plan_create_owned(&dc, fiplan_allocator(), &plan)) != FI_OK) goto done;
    if ((st = fi_plan_update(plan, &b->batch, NULL)) != FI_OK) goto done;
    fi_attn_args a = make_args(p, b, FI_DTYPE_BF16, dq, dk, NULL, dout, dlse);
    a.page_table.data = dpt;
    double t0 = now_ms();
    st = fi_run(plan, &a, NULL);
    if (st == FI_OK && cudaDeviceSynchronize() != cudaSuccess) st = FI_ERR_CUDA;
    *ms = now_ms() - t0;
    if (st != FI_OK) goto done;
    st = FI_ERR_CUDA;
    if (cudaMemcpy(ho, dout, (size_t)no * 2, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(p->lse, dlse, (size_t)nl * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
        goto done;
    for (int64_t i = 0; i < no; i++) p->out[i] = fi_bf16_to_f32(ho[i]);
    st = time_gpu(plan, &a, p, res); /* after the checked run: replays of the same step */
done:
    fi_plan_destroy(plan);
    cudaFree(dq);
    cudaFree(dk);
    cudaFree(dout);
    cudaFree(dlse);
    cudaFree(dpt);
    fiplan_free(hq);
    fiplan_free(hk);
    fiplan_free(ho);
    return st;
}

fi_status fiplan_execute(const fi_caps *caps, const fibatch *b, const fi_plan *plan,
                         uint64_t seed, int force_cpu, fiplan_exec_result *res) {
    memset(res, 0, sizeof *res);
    problem p;
    memset(&p, 0, sizeof p);
    int mla = caps->kind == FI_KIND_MLA_DECODE;
    /* The GPU half runs bf16 copies on a plan of bf16 caps: the shown plan's row only when
     * the caps are bf16 too; other dtypes are checked on the CPU reference. */
    int gpu = !force_cpu && mla && caps->q_dtype == FI_DTYPE_BF16 && fiplan_have_gpu();
    p.T = b->total_q_tokens;
    p.H = caps->num_qo_heads;
    p.Hkv = caps->num_kv_heads;
    p.dqk = caps->head_dim_qk;
    p.dvo = caps->head_dim_vo;
    p.dmain = mla ? p.dvo : p.dqk;
    p.drope = mla ? p.dqk - p.dvo : 0;
    p.ps = caps->page_size;
    p.np = caps->num_pages;
    int64_t nq = (int64_t)p.T * p.H * p.dqk, nk = (int64_t)p.np * p.ps * p.Hkv * p.dqk;
    int64_t nv = mla ? 0 : (int64_t)p.np * p.ps * p.Hkv * p.dvo;
    int64_t no = (int64_t)p.T * p.H * p.dvo, nl = (int64_t)p.T * p.H;
    p.q = fiplan_alloc((size_t)nq * 4);
    p.k = fiplan_alloc((size_t)nk * 4);
    p.v = nv ? fiplan_alloc((size_t)nv * 4) : NULL;
    p.out = fiplan_alloc((size_t)no * 4);
    p.lse = fiplan_alloc((size_t)nl * 4);
    p.ref_out = fiplan_alloc((size_t)no * 4);
    p.ref_lse = fiplan_alloc((size_t)nl * 4);
    if (!p.q || !p.k || (nv && !p.v) || !p.out || !p.lse || !p.ref_out || !p.ref_lse) {
        problem_free(&p);
        fprintf(stderr, "fiplan: out of memory for the execute tensors\n");
        return FI_ERR_OUT_OF_MEMORY;
    }
    uint64_t s = seed;
    fill_random(p.q, nq, &s, gpu);
    fill_random(p.k, nk, &s, gpu);
    if (nv) fill_random(p.v, nv, &s, gpu);
    for (int64_t i = 0; i < no; i++) p.out[i] = NAN; /* poison: unwritten rows show up */
    for (int64_t i = 0; i < nl; i++) p.lse[i] = NAN;

    fi_status st;
    if (gpu) {
        st = run_gpu(caps, b, &p, &res->exec_ms, res);
        res->tolerance = 2e-2;
    } else {
        fi_attn_args a = make_args(&p, b, FI_DTYPE_F32, p.q, p.k, p.v, p.out, p.lse);
        double t0 = now_ms();
        st = fi_ref_run(plan, &a);
        res->exec_ms = now_ms() - t0;
        res->tolerance = 1e-5;
    }
    if (st != FI_OK) {
        fprintf(stderr, "fiplan: %s executor failed: %s\n", gpu ? "GPU" : "CPU",
                fi_status_name(st));
        problem_free(&p);
        return st;
    }
    fi_attn_args ra = make_args(&p, b, FI_DTYPE_F32, p.q, p.k, p.v, p.ref_out, p.ref_lse);
    fi_caps rc = *caps;
    rc.q_dtype = rc.kv_dtype = rc.o_dtype = FI_DTYPE_F32;
    st = fi_naive_attention(&rc, &b->batch, &ra);
    if (st != FI_OK) {
        fprintf(stderr, "fiplan: naive reference failed: %s\n", fi_status_name(st));
        problem_free(&p);
        return st;
    }
    res->ran = 1;
    res->on_gpu = gpu;
    res->rel_err = rel_error(p.out, p.ref_out, no, &res->nonfinite);
    res->lse_rel_err = rel_error(p.lse, p.ref_lse, nl, &res->nonfinite);
    problem_free(&p);
    return FI_OK;
}
