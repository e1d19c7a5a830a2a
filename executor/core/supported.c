/*
 * executor/core/supported.c - fi_run_supported: may fi_run run plans of these caps on the
 * GPU?  Bindings (python/fiattn) ask before planning, so a family that has no GPU
 * executor yet is reported by name of kind instead of as a failed launch.
 *
 * It answers from the registration table only (executor/core/registry.c): the (kind,
 * variant) row must exist and name a GPU family.  Dtype combinations inside a family are
 * still checked by fi_run before any launch (FI_ERR_UNSUPPORTED_DTYPE).
 */
#include "fiattn_run.h"
#include "plan/variant.h"

fi_status fi_run_supported(const fi_caps *caps) {
    if (!caps)
        return FI_ERR_NULL_ARGUMENT;
    const fi_status st = fi_caps_validate(caps);
    if (st != FI_OK)
        return st;
    const fi_variant *v = fi_variant_of(caps);
    if (!v)
        return FI_ERR_UNSUPPORTED_VARIANT;
    return v->family ? FI_OK : FI_ERR_UNSUPPORTED_KIND;
}
