/*
 * viz/alloc.h - allocate through an optional fi_allocator (NULL or NULL hooks = libc),
 * the hook type of fiattn.h, so fiplan can route the trace and batch arrays to its own
 * jemalloc arena while tests and benches use plain malloc.
 */
#ifndef FIATTN_VIZ_ALLOC_H
#define FIATTN_VIZ_ALLOC_H

#include <stdlib.h>
#include <string.h>

#include "fiattn.h"

/* Copy of *a with libc defaults filled in where a hook is missing. */
static inline fi_allocator fiviz_allocator(const fi_allocator *a) {
    fi_allocator r = {0};
    if (a && a->alloc && a->free) r = *a;
    return r;
}

/* bytes > 0; 16-byte alignment is enough for every array here (malloc gives it). */
static inline void *fiviz_alloc(const fi_allocator *a, size_t bytes) {
    if (bytes == 0) bytes = 1;
    return (a && a->alloc) ? a->alloc(a->ctx, bytes, 16) : malloc(bytes);
}

static inline void fiviz_free(const fi_allocator *a, void *p) {
    if (!p) return;
    if (a && a->free) a->free(a->ctx, p);
    else free(p);
}

#endif /* FIATTN_VIZ_ALLOC_H */
