/* tests/install/consumer.c - a program outside the tree: built by .ci/run against an
 * installed fiattn with `pkg-config --cflags --libs fiattn` only, it plans one batch on a
 * host-only plan and prints the plan's size; exits 1 on any error. */
#include <stdio.h>

#include <fiattn.h>

int main(void) {
    const fi_caps caps = {.kind = FI_KIND_MLA_DECODE, .max_batch = 2, .max_q_tokens = 2,
                          .num_pages = 8, .page_size = 64, .num_qo_heads = 128,
                          .num_kv_heads = 1, .head_dim_qk = 576, .head_dim_vo = 512,
                          .q_dtype = FI_DTYPE_BF16, .kv_dtype = FI_DTYPE_BF16,
                          .o_dtype = FI_DTYPE_BF16, .num_ctas = 4};
    const int32_t tables[2 * 4] = {0, 1, 2, 3, 4, 5, 6, 7}, seq_lens[2] = {250, 100};
    const fi_batch batch = {.form = FI_FORM_BLOCK_TABLES, .batch_size = 2,
                            .block_tables = tables, .max_pages_per_seq = 4,
                            .seq_lens = seq_lens, .q_len_per_request = 1, .causal = 1,
                            .window_left = -1};
    fi_plan *plan = NULL;
    fi_status st = fi_plan_create(&caps, NULL, 0, NULL, &plan);
    if (st == FI_OK)
        st = fi_plan_update(plan, &batch, NULL);
    fi_plan_view view;
    if (st == FI_OK)
        st = fi_plan_get_view(plan, &view);
    if (st != FI_OK) {
        fprintf(stderr, "consumer: %s\n", fi_status_name(st));
        fi_plan_destroy(plan);
        return 1;
    }
    printf("fiattn %d.%d.%d: %d items on %d CTAs\n", FIATTN_VERSION_MAJOR, FIATTN_VERSION_MINOR,
           FIATTN_VERSION_PATCH, view.header->num_items, view.num_ctas);
    fi_plan_destroy(plan);
    return 0;
}
