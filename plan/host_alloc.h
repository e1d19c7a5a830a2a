/* plan/host_alloc.h - the plan's host allocations through fi_allocator (fiattn.h).
 * NULL hooks mean posix_memalign / free.  Not installed. */
#ifndef FIATTN_PLAN_HOST_ALLOC_H
#define FIATTN_PLAN_HOST_ALLOC_H

#include <stddef.h>

#include "fiattn.h"

/* bytes (> 0) aligned to `alignment` (a power of two >= sizeof(void *)); NULL on failure. */
void *fi_host_alloc(const fi_allocator *a, size_t bytes, size_t alignment);
/* NULL is fine. */
void fi_host_free(const fi_allocator *a, void *ptr);

#endif
