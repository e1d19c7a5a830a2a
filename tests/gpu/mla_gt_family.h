/*
 * tests/gpu/mla_gt_family.h - the MLA case (mla_gpu_case.h) as the shared GPU harness sees
 * it (gpu_test_common.h's gt_family): included after both.  Tolerance MLA_GT_TOL per row
 * (MLA_TOL_FP8 with fp8 inputs).
 */
#ifndef FI_TESTS_GPU_MLA_GT_FAMILY_H
#define FI_TESTS_GPU_MLA_GT_FAMILY_H

#define MLA_GT_TOL 1e-2

static inline fi_attn_args mla_gt_args(const void *c) {
    return mla_case_args((const mla_case *)c, 1);
}
static inline int mla_gt_upload(void *c, char *msg, size_t cap) {
    return mla_case_upload((mla_case *)c, msg, cap);
}
static inline int mla_gt_reference(void *c, char *msg, size_t cap) {
    return mla_case_reference((mla_case *)c, msg, cap);
}
/* MLA_GT_TOL for 16-bit inputs, MLA_TOL_FP8 with fp8 (mla_case_tol). */
static inline int mla_gt_compare(void *c, double *wo, double *wl, char *msg, size_t cap) {
    const mla_case *m = (const mla_case *)c;
    const double tol = mla_case_tol(&m->o) > MLA_GT_TOL ? mla_case_tol(&m->o) : MLA_GT_TOL;
    return mla_case_compare(m, 0, m->B, tol, wo, wl, msg, cap);
}
static inline void mla_gt_name(const void *c, char *buf, size_t cap) {
    mla_case_name((const mla_case *)c, buf, cap);
}
static inline void mla_gt_free(void *c) { mla_case_free((mla_case *)c); }
/* The graph loop's fresh q and bmm1 scale. */
static inline void mla_gt_new_step_inputs(void *c, tt_rng *rng) {
    mla_case *m = (mla_case *)c;
    mla_fill_random(m->h_q, m->n_q, mla_q_dtype(&m->o), rng);
    m->bmm1_scale = 0.05f + 0.1f * (tt_rng_float(rng) + 1.0f) * 0.5f;
}
/* In gt_family's order: args, upload, reference, compare, name, free, new_step_inputs,
 * unsupported (none: the MLA family runs every case its caps accept). */
static const gt_family MLA_GT_FAMILY = {mla_gt_args, mla_gt_upload, mla_gt_reference,
                                        mla_gt_compare, mla_gt_name, mla_gt_free,
                                        mla_gt_new_step_inputs, NULL};

static inline gt_case mla_gt(mla_case *c) {
    return gt_case_make(c, &MLA_GT_FAMILY, c->plan, c->stream, &c->fb, c->B, c->P,
                        c->num_pages, mla_case_outputs(c));
}

/* The CUDA graph decode loop (gt_graph_decode_loop: one capture, LOOP_STEPS replays
 * following a trace's continuous batching) on a case of options o, made a BLOCK_TABLES
 * case of page size LOOP_PS whose LOOP_B slots each own a full page row of the trace's
 * longest request.  Fails the test on a mismatch; frees the case. */
static inline void mla_gt_graph_decode_loop(mla_opts o, tt_rng *rng) {
    static gt_loop_trace t;
    gt_loop_trace_pick(&t, rng);
    const int32_t P = (t.max_kv + LOOP_PS - 1) / LOOP_PS;
    o.page_size = LOOP_PS;
    o.form = FI_FORM_BLOCK_TABLES;
    int32_t q1[LOOP_B], kv_full[LOOP_B];
    for (int b = 0; b < LOOP_B; b++) {
        q1[b] = 1;
        kv_full[b] = P * LOOP_PS; /* the case's own batch: every slot's full page row */
    }
    mla_case c;
    char msg[512];
    if (mla_case_init(&c, &o, q1, kv_full, LOOP_B, rng, msg, sizeof msg))
        fail_msg("init: %s", msg);
    const gt_case g = mla_gt(&c);
    gt_graph_decode_loop(&g, &t, P, rng);
}

#endif /* FI_TESTS_GPU_MLA_GT_FAMILY_H */
