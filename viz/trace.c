/*
 * viz/trace.c - Azure-format trace CSV parsing and the decode / prefill / mixed length
 * builders declared (with their semantics) in viz/trace.h.
 */
#include "viz/trace.h"

#include <stdio.h>
#include <string.h>

#include "viz/alloc.h"

#define FITRACE_MAX_TOKENS (1 << 30)

const char *fitrace_status_name(fitrace_status status) {
    switch (status) {
    case FITRACE_OK: return "FITRACE_OK";
    case FITRACE_ERR_IO: return "FITRACE_ERR_IO";
    case FITRACE_ERR_PARSE: return "FITRACE_ERR_PARSE";
    case FITRACE_ERR_EMPTY: return "FITRACE_ERR_EMPTY";
    case FITRACE_ERR_NOMEM: return "FITRACE_ERR_NOMEM";
    case FITRACE_ERR_ARG: return "FITRACE_ERR_ARG";
    }
    return "FITRACE_STATUS_UNKNOWN";
}

/* ---- parsing ----------------------------------------------------------------------- */

/* Exactly `n` decimal digits at s -> *v. */
static int parse_fixed_digits(const char *s, int n, int *v) {
    int x = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        x = x * 10 + (s[i] - '0');
    }
    *v = x;
    return 1;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (Hinnant's days_from_civil). */
static long days_from_civil(int y, int m, int d) {
    y -= m <= 2;
    long era = (y >= 0 ? y : y - 399) / 400;
    long yoe = y - era * 400;
    long doy = (153L * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* "YYYY-MM-DD HH:MM:SS[.frac]" occupying exactly [s, s+n) -> seconds since the epoch. */
static int parse_timestamp(const char *s, size_t n, double *out) {
    int y, mo, d, h, mi, se;
    if (n < 19 || s[4] != '-' || s[7] != '-' || s[10] != ' ' || s[13] != ':' || s[16] != ':')
        return 0;
    if (!parse_fixed_digits(s, 4, &y) || !parse_fixed_digits(s + 5, 2, &mo) ||
        !parse_fixed_digits(s + 8, 2, &d) || !parse_fixed_digits(s + 11, 2, &h) ||
        !parse_fixed_digits(s + 14, 2, &mi) || !parse_fixed_digits(s + 17, 2, &se))
        return 0;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || se > 60) return 0;
    double frac = 0.0, scale = 0.1;
    if (n > 19) {
        if (s[19] != '.' || n == 20) return 0;
        for (size_t i = 20; i < n; i++) {
            if (s[i] < '0' || s[i] > '9') return 0;
            frac += (s[i] - '0') * scale;
            scale *= 0.1;
        }
    }
    *out = (double)days_from_civil(y, mo, d) * 86400.0 + h * 3600.0 + mi * 60.0 + se + frac;
    return 1;
}

/* Unsigned decimal integer occupying exactly [s, s+n), value in [lo, FITRACE_MAX_TOKENS]. */
static int parse_count(const char *s, size_t n, int32_t lo, int32_t *out) {
    if (n == 0 || n > 10) return 0;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (s[i] - '0');
    }
    if (v < lo || v > FITRACE_MAX_TOKENS) return 0;
    *out = (int32_t)v;
    return 1;
}

/* One data row [s, s+n) (no line end).  Returns NULL or the reason it is malformed. */
static const char *parse_row(const char *s, size_t n, double *t, int32_t *ctx, int32_t *gen) {
    const char *c1 = memchr(s, ',', n);
    if (!c1) return "expected 3 comma-separated fields";
    const char *c2 = memchr(c1 + 1, ',', (size_t)(s + n - c1 - 1));
    if (!c2) return "expected 3 comma-separated fields";
    if (memchr(c2 + 1, ',', (size_t)(s + n - c2 - 1))) return "expected 3 comma-separated fields";
    if (!parse_timestamp(s, (size_t)(c1 - s), t))
        return "TIMESTAMP not YYYY-MM-DD HH:MM:SS[.frac]";
    if (!parse_count(c1 + 1, (size_t)(c2 - c1 - 1), 1, ctx))
        return "ContextTokens not an integer in [1, 2^30]";
    if (!parse_count(c2 + 1, (size_t)(s + n - c2 - 1), 0, gen))
        return "GeneratedTokens not an integer in [0, 2^30]";
    return NULL;
}

static fitrace *trace_alloc(const fi_allocator *alloc, int32_t cap) {
    fi_allocator a = fiviz_allocator(alloc);
    fitrace *t = fiviz_alloc(&a, sizeof *t);
    if (!t) return NULL;
    memset(t, 0, sizeof *t);
    t->alloc = a;
    t->context_tokens = fiviz_alloc(&a, (size_t)cap * sizeof(int32_t));
    t->generated_tokens = fiviz_alloc(&a, (size_t)cap * sizeof(int32_t));
    t->arrival_s = fiviz_alloc(&a, (size_t)cap * sizeof(double));
    if (!t->context_tokens || !t->generated_tokens || !t->arrival_s) {
        fitrace_free(t);
        return NULL;
    }
    return t;
}

void fitrace_free(fitrace *trace) {
    if (!trace) return;
    fi_allocator a = trace->alloc;
    fiviz_free(&a, trace->context_tokens);
    fiviz_free(&a, trace->generated_tokens);
    fiviz_free(&a, trace->arrival_s);
    fiviz_free(&a, trace);
}

fitrace_status fitrace_parse(const char *text, size_t len, const fi_allocator *alloc,
                             fitrace **out, fitrace_error *err) {
    if (err) *err = (fitrace_error){0, NULL};
    if (!text || !out) return FITRACE_ERR_ARG;
    /* Upper bound on rows: line ends + 1. */
    size_t cap = 1;
    for (size_t i = 0; i < len; i++) cap += text[i] == '\n';
    if (cap > (size_t)INT32_MAX) return FITRACE_ERR_ARG;
    fitrace *t = trace_alloc(alloc, (int32_t)cap);
    if (!t) return FITRACE_ERR_NOMEM;

    int32_t rows = 0, line = 0;
    int seen_content = 0;
    size_t pos = 0;
    while (pos < len) {
        const char *s = text + pos;
        const char *nl = memchr(s, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - s) : len - pos;
        pos += n + (nl ? 1 : 0);
        line++;
        if (n > 0 && s[n - 1] == '\r') n--;
        if (n == 0) continue;
        if (!seen_content && n >= 9 && memcmp(s, "TIMESTAMP", 9) == 0) {
            seen_content = 1;  /* header: only allowed as the first non-blank line */
            continue;
        }
        seen_content = 1;
        const char *why = parse_row(s, n, &t->arrival_s[rows], &t->context_tokens[rows],
                                    &t->generated_tokens[rows]);
        if (why) {
            if (err) *err = (fitrace_error){line, why};
            fitrace_free(t);
            return FITRACE_ERR_PARSE;
        }
        rows++;
    }
    if (rows == 0) {
        fitrace_free(t);
        return FITRACE_ERR_EMPTY;
    }
    double t0 = t->arrival_s[0];
    for (int32_t i = 0; i < rows; i++) t->arrival_s[i] -= t0;
    t->num_requests = rows;
    *out = t;
    return FITRACE_OK;
}

fitrace_status fitrace_load(const char *path, const fi_allocator *alloc, fitrace **out,
                            fitrace_error *err) {
    if (err) *err = (fitrace_error){0, NULL};
    if (!path || !out) return FITRACE_ERR_ARG;
    FILE *f = fopen(path, "rb");
    if (!f) return FITRACE_ERR_IO;
    fi_allocator a = fiviz_allocator(alloc);
    size_t cap = 1 << 16, len = 0;
    char *buf = fiviz_alloc(&a, cap);
    fitrace_status st = FITRACE_OK;
    while (buf) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap) break;
        char *bigger = fiviz_alloc(&a, cap * 2);
        if (bigger) memcpy(bigger, buf, len);
        fiviz_free(&a, buf);
        buf = bigger;
        cap *= 2;
    }
    if (!buf) st = FITRACE_ERR_NOMEM;
    else if (ferror(f)) st = FITRACE_ERR_IO;
    fclose(f);
    if (st == FITRACE_OK) st = fitrace_parse(buf, len, alloc, out, err);
    fiviz_free(&a, buf);
    return st;
}

fitrace_status fitrace_load_default(const fi_allocator *alloc, fitrace **out) {
    size_t len = 0;
    const char *csv = fitrace_default_csv(&len);
    return fitrace_parse(csv, len, alloc, out, NULL);
}

/* ---- batch lengths ----------------------------------------------------------------- */

static int lens_ok(const fitrace *trace, int32_t first, const fitrace_lens *lens) {
    return trace && lens && lens->n >= 1 && lens->q_len && lens->kv_len && lens->source &&
           first >= 0 && first < trace->num_requests;
}

/* Next admissible trace row (GeneratedTokens > 0) at or after *next (wrapping); advances
 * *next past it.  The caller has checked that one exists. */
static int32_t admit_next(const fitrace *trace, int64_t *next) {
    for (;;) {
        int32_t row = (int32_t)(*next % trace->num_requests);
        (*next)++;
        if (trace->generated_tokens[row] > 0) return row;
    }
}

fitrace_status fitrace_decode(const fitrace *trace, int32_t first, int32_t step,
                              int32_t mtp, fitrace_lens *lens) {
    if (!lens_ok(trace, first, lens) || step < 0 || mtp < 1 || mtp > 64) return FITRACE_ERR_ARG;
    int any = 0;
    for (int32_t i = 0; i < trace->num_requests && !any; i++) any = trace->generated_tokens[i] > 0;
    if (!any) return FITRACE_ERR_ARG;

    /* source[k]: trace row in slot k; kv_len[k] holds its own decode step t meanwhile. */
    int64_t next = first;
    for (int32_t k = 0; k < lens->n; k++) {
        lens->source[k] = admit_next(trace, &next);
        lens->kv_len[k] = 0;
    }
    for (int32_t s = 1; s <= step; s++) {
        for (int32_t k = 0; k < lens->n; k++) {
            if (++lens->kv_len[k] >= trace->generated_tokens[lens->source[k]]) {
                lens->source[k] = admit_next(trace, &next);
                lens->kv_len[k] = 0;
            }
        }
    }
    for (int32_t k = 0; k < lens->n; k++) {
        int32_t row = lens->source[k], t = lens->kv_len[k];
        int32_t g = trace->generated_tokens[row];
        /* The mtp - 1 draft tokens being verified are already in the cache. */
        lens->kv_len[k] = trace->context_tokens[row] + (t < g ? t : g) + (mtp - 1);
        lens->q_len[k] = mtp;
    }
    return FITRACE_OK;
}

fitrace_status fitrace_prefill(const fitrace *trace, int32_t first, int32_t cached_prefix,
                               fitrace_lens *lens) {
    if (!lens_ok(trace, first, lens) || cached_prefix < 0) return FITRACE_ERR_ARG;
    for (int32_t k = 0; k < lens->n; k++) {
        int32_t row = (int32_t)(((int64_t)first + k) % trace->num_requests);
        int32_t c = trace->context_tokens[row];
        int32_t p = cached_prefix < c - 1 ? cached_prefix : c - 1;
        lens->source[k] = row;
        lens->kv_len[k] = c;
        lens->q_len[k] = c - p;
    }
    return FITRACE_OK;
}

fitrace_status fitrace_mixed(const fitrace *trace, int32_t first, int32_t num_prefill,
                             int32_t chunk, int32_t step, int32_t mtp, fitrace_lens *lens) {
    if (!lens_ok(trace, first, lens) || num_prefill < 0 || num_prefill > lens->n || chunk < 1)
        return FITRACE_ERR_ARG;
    for (int32_t k = 0; k < num_prefill; k++) {
        int32_t row = (int32_t)(((int64_t)first + k) % trace->num_requests);
        int32_t c = trace->context_tokens[row];
        lens->source[k] = row;
        lens->kv_len[k] = c;
        lens->q_len[k] = chunk < c ? chunk : c;
    }
    if (num_prefill == lens->n) return FITRACE_OK;
    fitrace_lens rest = {lens->n - num_prefill, lens->q_len + num_prefill,
                         lens->kv_len + num_prefill, lens->source + num_prefill};
    int32_t dfirst = (int32_t)(((int64_t)first + num_prefill) % trace->num_requests);
    return fitrace_decode(trace, dfirst, step, mtp, &rest);
}
