/*
 * viz/trace_embed.c - the bundled trace excerpt, data/azure_conv_2048.csv, as bytes in
 * .rodata.  The GNU assembler's .incbin copies the file at build time (make runs from the
 * repository root, so the relative path resolves; the Makefile lists the CSV as a
 * prerequisite of this object so an edited excerpt is re-embedded).  No generated source,
 * no xxd, no ld -r -b binary: the plain and the sanitizer builds work alike.
 */
#include <stddef.h>
#include <stdint.h>

#include "viz/trace.h"

/* Hidden globals: visible to the C below, never exported from a shared object. */
__asm__(".pushsection .rodata\n"
        ".balign 16\n"
        ".globl fitrace_embedded_begin\n"
        ".hidden fitrace_embedded_begin\n"
        "fitrace_embedded_begin:\n"
        ".incbin \"data/azure_conv_2048.csv\"\n"
        "fitrace_embedded_end:\n"
        ".byte 0\n"
        ".balign 8\n"
        ".globl fitrace_embedded_size\n"
        ".hidden fitrace_embedded_size\n"
        "fitrace_embedded_size:\n"
        ".quad fitrace_embedded_end - fitrace_embedded_begin\n"
        ".popsection\n");

/* The size is computed by the assembler, so C never subtracts pointers to two objects. */
extern const char fitrace_embedded_begin[];
extern const uint64_t fitrace_embedded_size;

const char *fitrace_default_csv(size_t *len) {
    if (len) *len = (size_t)fitrace_embedded_size;
    return fitrace_embedded_begin;
}
