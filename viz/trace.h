/*
 * viz/trace.h - request traces and the per-request lengths built from them.
 *
 * A trace is the Azure LLM inference trace 2023 CSV format (data/README.md):
 *     TIMESTAMP,ContextTokens,GeneratedTokens
 *     2023-11-16 18:15:46.6805900,374,44
 * The binaries embed an excerpt (data/azure_conv_2048.csv, the first 2048 requests of the
 * conversation trace) so fiplan, tests and benches need no file on disk.
 *
 * From a trace we build the shapes a serving engine hands to attention (lengths in tokens,
 * int32, arrays owned by the caller; see fitrace_lens):
 *   decode snapshot  q_len = mtp (1..8); kv_len = ContextTokens + min(t, GeneratedTokens)
 *                    + (mtp - 1) where t is the request's own decode step (continuous
 *                    batching below; the mtp - 1 draft tokens are already in the cache);
 *   prefill          q_len = ContextTokens - P', kv_len = ContextTokens, P' = min(P, C - 1)
 *                    (P = cached prefix, so q_len >= 1);
 *   mixed            chunked prefill beside decodes: the first requests carry their last
 *                    prompt chunk (q_len = min(chunk, C), kv_len = C), the rest decode.
 *
 * Continuous batching of the decode snapshot (fitrace_decode): B slots start at step 0 with
 * requests first .. first+B-1.  Each step every request decodes one token.  A request with
 * G generated tokens occupies its slot for steps t = 0 .. G-1 of its own life; when it has
 * produced all G it leaves and, in slot order, the slot admits the next request of the
 * trace not yet admitted (it starts at t = 0; requests with G = 0 are skipped).  At global
 * step s each slot reports its request's kv_len.  Indices past the end of the trace wrap
 * around, so any (first, B, s) gives a full batch.  Deterministic; O(s * B).
 *
 * Names are fitrace_* (fi_* is the library's exported prefix).  Memory: through an
 * optional fi_allocator (NULL = malloc/free), so fiplan can route it to its jemalloc arena.
 */
#ifndef FIATTN_VIZ_TRACE_H
#define FIATTN_VIZ_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "fiattn.h"

typedef enum fitrace_status {
    FITRACE_OK = 0,
    FITRACE_ERR_IO = 1,       /* file cannot be opened / read */
    FITRACE_ERR_PARSE = 2,    /* malformed row; fitrace_error.line says which */
    FITRACE_ERR_EMPTY = 3,    /* no data rows */
    FITRACE_ERR_NOMEM = 4,
    FITRACE_ERR_ARG = 5,      /* NULL / out-of-range argument */
} fitrace_status;

/* Where parsing failed: 1-based line number (0 if not a parse error) and a short reason
 * ("expected 3 fields", "ContextTokens not a positive integer", ...), static string. */
typedef struct fitrace_error {
    int32_t line;
    const char *reason;
} fitrace_error;

/* A parsed trace.  Row i = request i in file order. */
typedef struct fitrace {
    int32_t num_requests;
    int32_t *context_tokens;    /* [num_requests] >= 1 */
    int32_t *generated_tokens;  /* [num_requests] >= 0 */
    double *arrival_s;          /* [num_requests] seconds since the first row's TIMESTAMP */
    fi_allocator alloc;         /* how the arrays were allocated (copied at load) */
} fitrace;

/* Per-request lengths of one batch, in tokens.  The caller owns the three arrays, each of
 * capacity >= n; builders fill [0, n). */
typedef struct fitrace_lens {
    int32_t n;         /* requests in the batch */
    int32_t *q_len;    /* [n] */
    int32_t *kv_len;   /* [n] */
    int32_t *source;   /* [n] trace row of each request (-1 if not from a trace) */
} fitrace_lens;

/* Parse CSV text (text[0..len), need not be NUL-terminated).  A header line starting with
 * "TIMESTAMP" is optional; blank lines and a final line without '\n' are accepted; CR LF
 * ends are accepted.  A data row must be exactly: timestamp "YYYY-MM-DD HH:MM:SS[.frac]",
 * ContextTokens integer in [1, 2^30], GeneratedTokens integer in [0, 2^30].  Any other row
 * rejects the whole text (FITRACE_ERR_PARSE, err->line set).
 * @return FITRACE_OK and *out (free with fitrace_free); on error *out untouched. */
fitrace_status fitrace_parse(const char *text, size_t len, const fi_allocator *alloc,
                             fitrace **out, fitrace_error *err);

/* Read and parse a CSV file.  Same rules as fitrace_parse; FITRACE_ERR_IO if unreadable. */
fitrace_status fitrace_load(const char *path, const fi_allocator *alloc, fitrace **out,
                            fitrace_error *err);

/* The embedded default excerpt: its raw CSV bytes (not NUL-terminated) and length. */
const char *fitrace_default_csv(size_t *len);

/* Parse the embedded excerpt (never a parse error unless the build embedded a bad file). */
fitrace_status fitrace_load_default(const fi_allocator *alloc, fitrace **out);

/* Free a trace (NULL is fine). */
void fitrace_free(fitrace *trace);

/* Decode snapshot at global step `step` >= 0 of `lens->n` slots starting at trace row
 * `first` (0 <= first < num_requests), q_len = mtp (>= 1) for every request.
 * Fills q_len, kv_len, source.  Continuous-batching rule in the file comment.
 * @return FITRACE_OK, FITRACE_ERR_ARG (NULL, n < 1, bad first/step/mtp, or every request
 *   of the trace has GeneratedTokens 0). */
fitrace_status fitrace_decode(const fitrace *trace, int32_t first, int32_t step,
                              int32_t mtp, fitrace_lens *lens);

/* Prefill batch of requests first .. first+n-1 (wrapping): kv_len = ContextTokens,
 * q_len = kv_len - min(cached_prefix, kv_len - 1); cached_prefix >= 0.
 * @return FITRACE_OK, FITRACE_ERR_ARG. */
fitrace_status fitrace_prefill(const fitrace *trace, int32_t first, int32_t cached_prefix,
                               fitrace_lens *lens);

/* Mixed batch: lens->n requests; the first num_prefill (0..n) come from rows first,
 * first+1, ... and carry their last prompt chunk (q_len = min(chunk, C), kv_len = C,
 * chunk >= 1); the remaining n - num_prefill are the decode snapshot (fitrace_decode with
 * q_len = mtp) of slots starting at row first + num_prefill.
 * @return FITRACE_OK, FITRACE_ERR_ARG. */
fitrace_status fitrace_mixed(const fitrace *trace, int32_t first, int32_t num_prefill,
                             int32_t chunk, int32_t step, int32_t mtp, fitrace_lens *lens);

/* Name of a status ("FITRACE_ERR_PARSE"). */
const char *fitrace_status_name(fitrace_status status);

#endif /* FIATTN_VIZ_TRACE_H */
