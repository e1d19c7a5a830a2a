/*
 * viz/arena.c - fiplan's host memory: a private jemalloc arena.
 *
 * The tool's trace, batch, tensor and plan-scratch allocations all go through one
 * fi_allocator whose hooks call mallocx / dallocx on an arena created with
 * mallctl("arenas.create"), with the thread cache bypassed, so they never mix with libc or
 * graphviz allocations.  FI_NO_JEMALLOC (set by the Makefile for sanitizer builds, where
 * ASan must see every allocation) compiles a malloc fallback instead.
 */
#include "viz/fiplan.h"

#include <stdlib.h>
#include <string.h>

#ifndef FI_NO_JEMALLOC
#include <jemalloc/jemalloc.h>
#include <stdio.h>
#endif

#ifndef FI_NO_JEMALLOC
static unsigned g_arena;
static int g_have_arena; /* 0 unknown, 1 arena, -1 failed: malloc fallback */
static char g_name[48];

static void *arena_alloc(void *ctx, size_t bytes, size_t alignment) {
    (void)ctx;
    if (bytes == 0) bytes = 1;
    int flags = MALLOCX_ARENA(g_arena) | MALLOCX_TCACHE_NONE;
    if (alignment > 1) flags |= MALLOCX_ALIGN(alignment);
    return mallocx(bytes, flags);
}

static void arena_free(void *ctx, void *ptr) {
    (void)ctx;
    if (ptr) dallocx(ptr, MALLOCX_TCACHE_NONE);
}
#endif

static void *libc_alloc(void *ctx, size_t bytes, size_t alignment) {
    (void)ctx;
    if (bytes == 0) bytes = 1;
    if (alignment <= 16) return malloc(bytes);
    void *p = NULL;
    return posix_memalign(&p, alignment, bytes) == 0 ? p : NULL;
}

static void libc_free(void *ctx, void *ptr) {
    (void)ctx;
    free(ptr);
}

static fi_allocator g_alloc;

const fi_allocator *fiplan_allocator(void) {
    if (g_alloc.alloc) return &g_alloc;
#ifndef FI_NO_JEMALLOC
    size_t sz = sizeof g_arena;
    if (mallctl("arenas.create", &g_arena, &sz, NULL, 0) == 0) {
        g_have_arena = 1;
        snprintf(g_name, sizeof g_name, "jemalloc arena %u", g_arena);
        g_alloc = (fi_allocator){arena_alloc, arena_free, NULL};
        return &g_alloc;
    }
    g_have_arena = -1;
#endif
    g_alloc = (fi_allocator){libc_alloc, libc_free, NULL};
    return &g_alloc;
}

const char *fiplan_allocator_name(void) {
    fiplan_allocator();
#ifndef FI_NO_JEMALLOC
    if (g_have_arena == 1) return g_name;
#endif
    return "malloc";
}

void *fiplan_alloc(size_t bytes) {
    const fi_allocator *a = fiplan_allocator();
    void *p = a->alloc(a->ctx, bytes, 64);
    if (p) memset(p, 0, bytes);
    return p;
}

void fiplan_free(void *p) {
    const fi_allocator *a = fiplan_allocator();
    if (p) a->free(a->ctx, p);
}
