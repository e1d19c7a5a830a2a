/*
 * examples/decode_cpu.c - the whole fiattn API on the CPU: caps, a host-only plan, a
 * decode batch in the block_tables form, the CPU reference executor, and the check
 * against the naive fp64 reference.  No GPU, no CUDA call.
 *
 *   make lib
 *   cc -std=c11 -Iinclude examples/decode_cpu.c build/libfiattn.a \
 *      -L/usr/local/cuda/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++ -lm -o decode_cpu
 *   ./decode_cpu
 *
 * Problem: 3 requests of MLA decode (16 heads, q_nope 512 + q_pe 64, ckv 512 + kpe 64),
 * kv_len 700, 90, 1500 tokens in pages of 64 tokens, 8 persistent CTAs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "fiattn.h"
#include "fiattn_ref.h"

enum { B = 3, H = 16, DQK = 576, DVO = 512, PAGE = 64, MAX_PAGES = 24 };

/* A dense row-major fp32 tensor view of `shape` over data (strides derived). */
static fi_tensor view(float *data, int ndim, const int64_t *shape, int64_t row_stride) {
    fi_tensor t = {0};
    t.data = data;
    t.dtype = FI_DTYPE_F32;
    t.ndim = ndim;
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.stride[i] = i == ndim - 1 ? 1 : s;
        s *= i == ndim - 1 ? row_stride : shape[i];
    }
    return t;
}

int main(void) {
    const int32_t seq_lens[B] = {700, 90, 1500};
    int32_t block_tables[B][MAX_PAGES];
    int32_t next_page = 0;
    for (int b = 0; b < B; b++)  /* pages handed out in order; unused entries -1 */
        for (int i = 0; i < MAX_PAGES; i++)
            block_tables[b][i] = i < (seq_lens[b] + PAGE - 1) / PAGE ? next_page++ : -1;

    fi_caps caps = {.kind = FI_KIND_MLA_DECODE, .max_batch = B, .max_q_tokens = B,
                    .num_pages = next_page, .page_size = PAGE, .num_qo_heads = H,
                    .num_kv_heads = 1, .head_dim_qk = DQK, .head_dim_vo = DVO,
                    .q_dtype = FI_DTYPE_F32, .kv_dtype = FI_DTYPE_F32,
                    .o_dtype = FI_DTYPE_F32, .num_ctas = 8};
    fi_plan *plan = NULL;
    fi_status s = fi_plan_create(&caps, NULL, 0, NULL, &plan);  /* host-only plan */
    fi_batch batch = {.form = FI_FORM_BLOCK_TABLES, .batch_size = B,
                      .block_tables = &block_tables[0][0], .max_pages_per_seq = MAX_PAGES,
                      .seq_lens = seq_lens, .q_len_per_request = 1, .causal = 1,
                      .window_left = -1};
    if (s == FI_OK) s = fi_plan_update(plan, &batch, NULL);
    if (s != FI_OK) {
        fi_error_detail d = fi_plan_error(plan);
        fprintf(stderr, "plan: %s (request %d)\n", fi_status_name(s), d.request);
        fi_plan_destroy(plan);
        return 1;
    }
    fi_plan_view v;
    fi_plan_get_view(plan, &v);
    printf("%d work items, %d merge groups on %d CTAs, balance %.3f\n", v.header->num_items,
           v.header->num_groups, v.num_ctas, fi_plan_balance(plan));

    /* q [B, H, 576] and the cache [pages, 64, 1, 576], each seen as a 512 and a 64 view. */
    float *q = malloc(sizeof(float) * B * H * DQK);
    float *kv = malloc(sizeof(float) * (size_t)next_page * PAGE * DQK);
    float *out = malloc(sizeof(float) * B * H * DVO), *ref = malloc(sizeof(float) * B * H * DVO);
    float *lse = malloc(sizeof(float) * B * H), *ref_lse = malloc(sizeof(float) * B * H);
    if (!q || !kv || !out || !ref || !lse || !ref_lse) return 1;
    srand(1);
    for (int i = 0; i < B * H * DQK; i++) q[i] = (float)rand() / RAND_MAX - 0.5f;
    for (long i = 0; i < (long)next_page * PAGE * DQK; i++) kv[i] = (float)rand() / RAND_MAX - 0.5f;

    fi_attn_args a = {0};
    a.q = view(q, 3, (int64_t[]){B, H, 512}, DQK);
    a.q_rope = view(q + 512, 3, (int64_t[]){B, H, 64}, DQK);
    a.k = view(kv, 4, (int64_t[]){next_page, PAGE, 1, 512}, DQK);
    a.k_rope = view(kv + 512, 4, (int64_t[]){next_page, PAGE, 1, 64}, DQK);
    a.out = view(out, 3, (int64_t[]){B, H, DVO}, DVO);
    a.lse = view(lse, 2, (int64_t[]){B, H}, H);
    a.page_table.data = &block_tables[0][0];
    a.page_table.dtype = FI_DTYPE_I32;
    a.page_table.ndim = 2;
    a.page_table.shape[0] = B;
    a.page_table.shape[1] = MAX_PAGES;
    a.page_table.stride[0] = MAX_PAGES;
    a.page_table.stride[1] = 1;
    a.bmm1_scale = 1.0f / sqrtf((float)DQK);
    a.bmm2_scale = 1.0f;

    s = fi_ref_run(plan, &a);                   /* the plan, executed on the CPU */
    fi_attn_args r = a;
    r.out.data = ref;
    r.lse.data = ref_lse;
    if (s == FI_OK) s = fi_naive_attention(&caps, &batch, &r);  /* fp64, no plan */
    if (s != FI_OK) {
        fprintf(stderr, "run: %s\n", fi_status_name(s));
        return 1;
    }
    double num = 0, den = 0;
    for (int i = 0; i < B * H * DVO; i++) {
        num += (double)(out[i] - ref[i]) * (out[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    printf("||out - ref|| / ||ref|| = %.3g\n", sqrt(num / den));
    fi_plan_destroy(plan);
    free(q); free(kv); free(out); free(ref); free(lse); free(ref_lse);
    return sqrt(num / den) < 1e-5 ? 0 : 1;
}
