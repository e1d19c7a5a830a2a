/* plan/host_alloc.c - fi_allocator hooks with a posix_memalign default (host_alloc.h). */
#include "plan/host_alloc.h"

#include <stdlib.h>

void *fi_host_alloc(const fi_allocator *a, size_t bytes, size_t alignment) {
    if (a && a->alloc && a->free)
        return a->alloc(a->ctx, bytes, alignment);
    void *p = NULL;
    if (posix_memalign(&p, alignment, bytes) != 0)
        return NULL;
    return p;
}

void fi_host_free(const fi_allocator *a, void *ptr) {
    if (!ptr)
        return;
    if (a && a->alloc && a->free)
        a->free(a->ctx, ptr);
    else
        free(ptr);
}
