/*
 * planner/device/plan_kernel.h - the C ABI of the device planner's kernel (plan_kernel.cu),
 * called by fi_plan_update_device (planner/plan_update_device.c).  Not installed.
 */
#ifndef FIATTN_PLANNER_DEVICE_PLAN_KERNEL_H
#define FIATTN_PLANNER_DEVICE_PLAN_KERNEL_H

#include "fiattn.h"
#include "plan/variant.h"
#include "planner/scratch.h"
#include "workspace/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Everything the planning kernel reads besides the batch's device arrays: by value. */
typedef struct fi_device_plan_params {
    fi_caps caps;               /* num_ctas resolved */
    fi_variant variant;         /* its pointers are host pointers, never read on the device */
    fi_layout layout;
    fi_batch batch;             /* device arrays; batch_size = the capacity B_max */
    const int32_t *batch_size;  /* device [1] or NULL (B = B_max) */
    int32_t max_q_tokens;       /* declared q rows */
    int32_t kv_indices_len;     /* INDPTR: declared kv_indices entries */
    unsigned char *workspace;   /* plan region at offset 0 (layout offsets) */
    fi_planner_scratch scratch_places; /* set by the launcher: the scratch arrays' places
                                          (planner/scratch.h), bound by the kernel */
} fi_device_plan_params;

/* Launch the planning kernel on stream (one CTA; for the parallel rows a cluster of two,
 * the second scanning the page table and checking the rules); PDL attribute when
 * enable_pdl.
 * @return the cudaError_t of the launch (0: launched). */
int fi_device_plan_launch(const fi_device_plan_params *p, int enable_pdl, void *stream);

/* The two builds fi_device_plan_launch picks from: the data-parallel rows whose plans hold
 * at most FI_DEVPLAN_SMALL_MAX_TILES tiles (the layout's max_tiles) run the smaller CTA
 * (plan_kernel_small.cu: fewer warps running the same instruction path, which is what a
 * plan costs while a thread has at most a tile or two a step); the rest the default size.
 * Measured (H200, docs/perf-log.md thirty-third session): 512 takes GQA 32/8 at 32
 * requests (272 tiles) from 15.5 to 14.1 us; at 2048, GQA at 128 requests (1088) was
 * level and MLA heads 16 at 1,024 (1280) went from 23.4 to 32.8 us. */
#define FI_DEVPLAN_SMALL_MAX_TILES 512
int fi_device_plan_launch_default(const fi_device_plan_params *p, int enable_pdl,
                                  void *stream);
int fi_device_plan_launch_small(const fi_device_plan_params *p, int enable_pdl, void *stream);

#ifdef FI_PROFILE
/* Profiling builds (make PROFILE=1): the SM clock stamps of the last plan, host[FI_PD_STAMPS]
 * (plan_kernel.cu: FI_PD_STAMP points 0 .. FI_PD_STAMPS - 1, 0 where a point was not
 * reached; the build uses 0-11, the rest are free for experiments).
 * @return the cudaError_t of the copy. */
#define FI_PD_STAMPS 32
int fi_device_plan_read_stamps(long long *host);
#endif

#ifdef __cplusplus
}
#endif
#endif /* FIATTN_PLANNER_DEVICE_PLAN_KERNEL_H */
