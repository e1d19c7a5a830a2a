/*
 * planner/build.h - one batch -> one whole plan region (header, work_indptr, CTA start
 * records, request table, merge groups, items), at the layout's offsets from `base`.
 *
 * The single planning source: fi_plan_update runs it on the host into pinned staging,
 * fi_plan_update_device's kernel (planner/device/plan_kernel.cu) runs it on the device
 * straight into the workspace.  Same input, same bytes.  Not installed.
 */
#ifndef FIATTN_PLANNER_BUILD_H
#define FIATTN_PLANNER_BUILD_H

#include "plan/page_table.h"
#include "plan/variant.h"
#include "planner/scratch.h"
#include "workspace/layout.h"

/* Validate `batch` (fi_batch_validate's rules; page_verdict: planner/validate.h, NULL to
 * scan the pages here), cut it into tiles, partition them (planner/partition.h) and write
 * the plan region at base (layout l).  Tails of the request and group tables past the
 * batch are zeroed, so the bytes depend on the batch only.  *geom (may be NULL): what the
 * plan reads of the page table.  s: the planner's scratch for l.
 * @return FI_OK, or the first broken rule's status with *err filled; on error base holds
 *   a partly written plan that must not be used (callers keep the previous one). */
FI_PD fi_status fi_plan_build(const fi_caps *caps, const fi_variant *v, const fi_layout *l,
                              fi_planner_scratch *s, const fi_batch *batch,
                              const int64_t *page_verdict, unsigned char *base,
                              fi_page_table_geom *geom, fi_error_detail *err);

/* fi_plan_build for rows whose partition is FI_PARTITION_PARALLEL: every thread of the
 * device planner calls it (planner/parallel.h), the host once; validation, tiles and the
 * partition (planner/ppart.c) as data-parallel steps.  Same contract and statuses. */
FI_PD fi_status fi_plan_build_parallel(const fi_caps *caps, const fi_variant *v,
                                       const fi_layout *l, fi_planner_scratch *s,
                                       const fi_batch *batch, const int64_t *page_verdict,
                                       unsigned char *base, fi_page_table_geom *geom,
                                       fi_error_detail *err);

/* fi_plan_build_parallel on fi_batch_read_parallel's requests, no rule checked: the device
 * planner's cluster, whose other CTA runs fi_batch_check_parallel meanwhile and whose
 * verdict replaces this result when a rule is broken (planner/device/plan_kernel.cu).  On
 * the host only for the fuzzer (tests/fuzz), which checks that it stays in its arrays on
 * any batch whose scalars pass and equals fi_plan_build_parallel on every batch that
 * passes validation. */
FI_PD fi_status fi_plan_build_parallel_unchecked(const fi_caps *caps, const fi_variant *v,
                                                 const fi_layout *l, fi_planner_scratch *s,
                                                 const fi_batch *batch, unsigned char *base,
                                                 fi_error_detail *err);

/* The plan that runs nothing: header with zero counts (tile_rows set), every CTA's range
 * empty, request and group tables zeroed.  What the device planner writes for a batch it
 * refuses, so the executor writes no output for that step. */
FI_PD void fi_plan_build_empty(const fi_layout *l, unsigned char *base);

#endif /* FIATTN_PLANNER_BUILD_H */
