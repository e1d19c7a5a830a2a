/* planner/caps_internal.h - caps helpers shared inside the planner (not installed). */
#ifndef FIATTN_PLANNER_CAPS_INTERNAL_H
#define FIATTN_PLANNER_CAPS_INTERNAL_H

#include "fiattn.h"
#include "workspace/layout.h"

/* Validate *caps and copy it to *resolved with num_ctas 0 replaced by the current CUDA
 * device's SM count (1 CTA per SM).  Makes no CUDA call when caps->num_ctas > 0.
 * @return FI_OK; a fi_caps_validate status; FI_ERR_NO_DEVICE (no usable device). */
fi_status fi_caps_resolve(const fi_caps *caps, fi_caps *resolved, int *cuda_error);

/* fi_caps_resolve, then the workspace layout of the resolved caps (workspace/layout.h).
 * @return FI_OK, a fi_caps_resolve status or a fi_layout_compute status. */
fi_status fi_caps_resolve_layout(const fi_caps *caps, fi_caps *resolved, fi_layout *layout);

#endif
