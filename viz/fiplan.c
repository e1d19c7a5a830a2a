/*
 * viz/fiplan.c - fiplan: plan one batch from a request trace (or explicit lengths), print
 * the plan's statistics and plan-update time, draw it (DOT / SVG), dump it (JSON), and
 * optionally execute it and check it against the naive reference.
 *
 * Exit status: 0 ok, 1 error (bad trace, plan or execution failure, error over tolerance),
 * 2 usage.  `fiplan --help` lists the options.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "viz/batch.h"
#include "viz/fiplan.h"
#include "viz/trace.h"

typedef enum { MODE_DECODE, MODE_PREFILL, MODE_MIXED } fiplan_mode;

typedef struct options {
    const char *trace_path;     /* NULL: embedded excerpt */
    fiplan_mode mode;
    int32_t batch, step, first, q_len, prefix, num_prefill;
    int32_t *lengths, num_lengths;
    int32_t kind;               /* 0: by mode */
    int32_t heads, kv_heads, head_dim, page_size, ctas, window_left, causal, variant;
    int32_t form;               /* 0: by kind and lengths */
    int32_t sparse_top_k;       /* > 0: plan the batch as a sparse top-k one (MLA) */
    int32_t dtype;              /* fi_dtype of q and the KV cache: picks the tile-table row */
    int32_t shuffle;
    uint64_t seed;
    int32_t repeat;
    int dot;                    /* 1: --dot given */
    const char *dot_path;       /* NULL: stdout */
    const char *svg_path;
    int json;
    const char *json_path;
    int execute, force_cpu;
    int explain;                /* one line under each figure saying what it means */
} options;

static void usage(FILE *f) {
    fputs(
        "usage: fiplan [options]\n"
        "Plan one attention batch with fiattn and show the plan.\n\n"
        "batch (default: decode snapshot of 8 requests from the embedded Azure excerpt)\n"
        "  --trace FILE        Azure-format CSV (TIMESTAMP,ContextTokens,GeneratedTokens)\n"
        "  --mode M            decode | prefill | mixed                     [decode]\n"
        "  --batch N           requests                                     [8]\n"
        "  --first I           first trace row                              [0]\n"
        "  --step S            decode step of the snapshot                  [0]\n"
        "  --lengths L,L,...   explicit kv lengths instead of a trace\n"
        "  --q-len N           decode/--lengths: query rows per request (MTP depth) [1];\n"
        "                      mixed: prefill chunk [256]\n"
        "  --prefix P          prefill: cached prefix tokens                [0]\n"
        "  --prefill N         mixed: requests carrying a prompt chunk      [batch/4]\n"
        "shape\n"
        "  --kind K            mla | gqa | context           [decode: mla, else context]\n"
        "  --heads H           query heads            [mla 128, gqa/context 32]\n"
        "  --kv-heads H        KV heads               [mla 1, gqa/context 8]\n"
        "  --head-dim D        gqa/context head dim   [128] (MLA is 576/512)\n"
        "  --page-size P       tokens per page        [64]\n"
        "  --ctas N            persistent CTAs        [132]\n"
        "  --dtype D           q and KV cache dtype: bf16 | f16 | e4m3 | f32 (it picks the\n"
        "                      default row: e.g. MLA heads 128 bf16 row 6, e4m3 at heads\n"
        "                      16 row 7; the out dtype is bf16, f16 or f32)    [bf16]\n"
        "  --variant N         tile table row of the kind (docs/DESIGN.md; e.g. the\n"
        "                      data-parallel partition rows: mla 2, gqa 1)   [0]\n"
        "  --window-left W     sliding window (-1 unlimited) [-1]\n"
        "  --causal 0|1        [1]\n"
        "  --form F            block_tables | indptr | cum_seq_lens (context only)  [by kind]\n"
        "  --sparse-top-k K    MLA: sparse top-k plan; each query token lists the K most\n"
        "                      recent keys up to its position as slots (-1 past the start);\n"
        "                      block tables, no --execute\n"
        "  --shuffle           random page ids (seeded)\n"
        "  --seed N            data / page seed       [1]\n"
        "output\n"
        "  --dot[=FILE]        plan as Graphviz DOT (stdout without FILE)\n"
        "  --svg FILE          plan rendered to SVG\n"
        "  --json[=FILE]       plan and statistics as JSON (stdout without FILE)\n"
        "  --execute           run the plan (GPU for MLA when present, else the CPU\n"
        "                      reference) and report ||out-ref||/||ref|| vs the naive reference\n"
        "  --cpu               with --execute: always the CPU reference executor\n"
        "  --explain           one line under each printed figure saying what it means\n"
        "  --repeat N          plan updates timed (median reported), 0 = none [200]\n"
        "  --help\n"
        "exit status: 0 ok, 1 error, 2 usage\n",
        f);
}

/* Whole-string integer in [lo, hi]. */
static int parse_int(const char *s, int32_t lo, int32_t hi, int32_t *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return 0;
    *out = (int32_t)v;
    return 1;
}

static int parse_lengths(const char *s, options *o) {
    int32_t n = 1;
    for (const char *c = s; *c; c++) n += *c == ',';
    o->lengths = fiplan_alloc((size_t)n * sizeof(int32_t));
    if (!o->lengths) return 0;
    char buf[32];
    const char *c = s;
    for (int32_t i = 0; i < n; i++) {
        const char *e = strchr(c, ',');
        size_t len = e ? (size_t)(e - c) : strlen(c);
        if (len == 0 || len >= sizeof buf) return 0;
        memcpy(buf, c, len);
        buf[len] = 0;
        if (!parse_int(buf, 0, 1 << 30, &o->lengths[i])) return 0;
        c = e ? e + 1 : c + len;
    }
    o->num_lengths = n;
    return 1;
}

enum {
    OPT_TRACE = 256, OPT_MODE, OPT_BATCH, OPT_STEP, OPT_FIRST, OPT_LENGTHS, OPT_QLEN,
    OPT_PREFIX, OPT_PREFILL, OPT_KIND, OPT_HEADS, OPT_KVHEADS, OPT_HEADDIM, OPT_PAGESIZE,
    OPT_CTAS, OPT_VARIANT, OPT_WINDOW, OPT_CAUSAL, OPT_FORM, OPT_SHUFFLE, OPT_SEED, OPT_DOT, OPT_SVG,
    OPT_JSON, OPT_EXECUTE, OPT_CPU, OPT_REPEAT, OPT_HELP, OPT_EXPLAIN, OPT_SPARSE, OPT_DTYPE,
};

/* @return 0 ok, 2 usage error (message printed), 3 --help. */
static int parse_options(int argc, char **argv, options *o) {
    static const struct option longopts[] = {
        {"trace", required_argument, 0, OPT_TRACE}, {"mode", required_argument, 0, OPT_MODE},
        {"batch", required_argument, 0, OPT_BATCH}, {"step", required_argument, 0, OPT_STEP},
        {"first", required_argument, 0, OPT_FIRST},
        {"lengths", required_argument, 0, OPT_LENGTHS},
        {"q-len", required_argument, 0, OPT_QLEN}, {"prefix", required_argument, 0, OPT_PREFIX},
        {"prefill", required_argument, 0, OPT_PREFILL},
        {"kind", required_argument, 0, OPT_KIND}, {"heads", required_argument, 0, OPT_HEADS},
        {"kv-heads", required_argument, 0, OPT_KVHEADS},
        {"head-dim", required_argument, 0, OPT_HEADDIM},
        {"page-size", required_argument, 0, OPT_PAGESIZE},
        {"ctas", required_argument, 0, OPT_CTAS},
        {"variant", required_argument, 0, OPT_VARIANT},
        {"dtype", required_argument, 0, OPT_DTYPE},
        {"window-left", required_argument, 0, OPT_WINDOW},
        {"causal", required_argument, 0, OPT_CAUSAL}, {"form", required_argument, 0, OPT_FORM},
        {"shuffle", no_argument, 0, OPT_SHUFFLE}, {"seed", required_argument, 0, OPT_SEED},
        {"dot", optional_argument, 0, OPT_DOT}, {"svg", required_argument, 0, OPT_SVG},
        {"json", optional_argument, 0, OPT_JSON}, {"execute", no_argument, 0, OPT_EXECUTE},
        {"cpu", no_argument, 0, OPT_CPU}, {"explain", no_argument, 0, OPT_EXPLAIN}, {"repeat", required_argument, 0, OPT_REPEAT},
        {"sparse-top-k", required_argument, 0, OPT_SPARSE},
        {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0},
    };
    const int32_t big = 1 << 30;
    int c, ok = 1;
    int32_t seed32 = 1;
    opterr = 0;
    while (ok && (c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_TRACE: o->trace_path = optarg; break;
        case OPT_MODE:
            if (!strcmp(optarg, "decode")) o->mode = MODE_DECODE;
            else if (!strcmp(optarg, "prefill")) o->mode = MODE_PREFILL;
            else if (!strcmp(optarg, "mixed")) o->mode = MODE_MIXED;
            else ok = 0;
            break;
        case OPT_BATCH: ok = parse_int(optarg, 1, 1 << 20, &o->batch); break;
        case OPT_STEP: ok = parse_int(optarg, 0, 1 << 20, &o->step); break;
        case OPT_FIRST: ok = parse_int(optarg, 0, big, &o->first); break;
        case OPT_LENGTHS: ok = parse_lengths(optarg, o); break;
        case OPT_QLEN: ok = parse_int(optarg, 1, big, &o->q_len); break;
        case OPT_PREFIX: ok = parse_int(optarg, 0, big, &o->prefix); break;
        case OPT_PREFILL: ok = parse_int(optarg, 0, 1 << 20, &o->num_prefill); break;
        case OPT_KIND:
            if (!strcmp(optarg, "mla")) o->kind = FI_KIND_MLA_DECODE;
            else if (!strcmp(optarg, "gqa")) o->kind = FI_KIND_GQA_DECODE;
            else if (!strcmp(optarg, "context")) o->kind = FI_KIND_CONTEXT;
            else ok = 0;
            break;
        case OPT_HEADS: ok = parse_int(optarg, 1, 4096, &o->heads); break;
        case OPT_KVHEADS: ok = parse_int(optarg, 1, 4096, &o->kv_heads); break;
        case OPT_HEADDIM: ok = parse_int(optarg, 1, 4096, &o->head_dim); break;
        case OPT_PAGESIZE: ok = parse_int(optarg, 1, 1 << 16, &o->page_size); break;
        case OPT_CTAS: ok = parse_int(optarg, 1, 1 << 16, &o->ctas); break;
        case OPT_VARIANT: ok = parse_int(optarg, 0, 64, &o->variant); break;
        case OPT_DTYPE: { /* the names fiplan_dtype_name prints */
            static const fi_dtype choices[] = {FI_DTYPE_BF16, FI_DTYPE_F16, FI_DTYPE_E4M3,
                                               FI_DTYPE_F32};
            ok = 0;
            for (size_t i = 0; i < sizeof choices / sizeof choices[0]; i++)
                if (!strcmp(optarg, fiplan_dtype_name(choices[i]))) {
                    o->dtype = choices[i];
                    ok = 1;
                }
            break;
        }
        case OPT_WINDOW: ok = parse_int(optarg, -1, big, &o->window_left); break;
        case OPT_CAUSAL: ok = parse_int(optarg, 0, 1, &o->causal); break;
        case OPT_FORM:
            if (!strcmp(optarg, "block_tables")) o->form = FI_FORM_BLOCK_TABLES;
            else if (!strcmp(optarg, "indptr")) o->form = FI_FORM_INDPTR;
            else if (!strcmp(optarg, "cum_seq_lens")) o->form = FI_FORM_CUM_SEQ_LENS;
            else ok = 0;
            break;
        case OPT_SHUFFLE: o->shuffle = 1; break;
        case OPT_SEED: ok = parse_int(optarg, 0, INT32_MAX, &seed32); o->seed = (uint64_t)seed32; break;
        case OPT_DOT: o->dot = 1; o->dot_path = optarg; break;
        case OPT_SVG: o->svg_path = optarg; break;
        case OPT_JSON: o->json = 1; o->json_path = optarg; break;
        case OPT_EXECUTE: o->execute = 1; break;
        case OPT_CPU: o->force_cpu = 1; break;
        case OPT_EXPLAIN: o->explain = 1; break;
        case OPT_REPEAT: ok = parse_int(optarg, 0, 1 << 24, &o->repeat); break;
        case OPT_SPARSE: ok = parse_int(optarg, 1, FI_LIMIT_SPARSE_TOP_K, &o->sparse_top_k); break;
        case OPT_HELP: return 3;
        default: ok = 0; break;
        }
        if (!ok) {
            if (c == '?' || c == ':') fprintf(stderr, "fiplan: unknown option or missing value: %s\n", argv[optind - 1]);
            else fprintf(stderr, "fiplan: bad value for %s: '%s'\n", argv[optind - 1], optarg ? optarg : "");
        }
    }
    if (ok && optind < argc) {
        fprintf(stderr, "fiplan: unexpected argument '%s'\n", argv[optind]);
        ok = 0;
    }
    if (ok && o->dot && !o->dot_path && o->json && !o->json_path) {
        fprintf(stderr, "fiplan: --dot and --json cannot both go to stdout\n");
        ok = 0;
    }
    return ok ? 0 : 2;
}

/* Per-request lengths from the options.  @return 0 or 1 (message printed). */
static int build_lengths(const options *o, fitrace_lens *l) {
    int32_t n = o->num_lengths ? o->num_lengths : o->batch;
    l->n = n;
    l->q_len = fiplan_alloc((size_t)n * sizeof(int32_t));
    l->kv_len = fiplan_alloc((size_t)n * sizeof(int32_t));
    l->source = fiplan_alloc((size_t)n * sizeof(int32_t));
    if (!l->q_len || !l->kv_len || !l->source) {
        fprintf(stderr, "fiplan: out of memory\n");
        return 1;
    }
    if (o->num_lengths) {
        int32_t q = o->q_len ? o->q_len : 1;
        for (int32_t i = 0; i < n; i++) {
            l->kv_len[i] = o->lengths[i];
            /* causal needs q_len <= kv_len */
            l->q_len[i] = o->causal && q > o->lengths[i] ? o->lengths[i] : q;
            l->source[i] = -1;
        }
        return 0;
    }
    fitrace *t = NULL;
    fitrace_error err = {0, NULL};
    fitrace_status s = o->trace_path ? fitrace_load(o->trace_path, fiplan_allocator(), &t, &err)
                                     : fitrace_load_default(fiplan_allocator(), &t);
    if (s != FITRACE_OK) {
        fprintf(stderr, "fiplan: cannot load trace %s: %s", o->trace_path ? o->trace_path : "(embedded)",
                fitrace_status_name(s));
        if (err.line) fprintf(stderr, " at line %d (%s)", err.line, err.reason);
        fputc('\n', stderr);
        return 1;
    }
    int32_t first = o->first % t->num_requests;
    switch (o->mode) {
    case MODE_DECODE: s = fitrace_decode(t, first, o->step, o->q_len ? o->q_len : 1, l); break;
    case MODE_PREFILL: s = fitrace_prefill(t, first, o->prefix, l); break;
    case MODE_MIXED: {
        int32_t np = o->num_prefill >= 0 ? o->num_prefill : n / 4;
        if (np > n) np = n;
        s = fitrace_mixed(t, first, np, o->q_len ? o->q_len : 256, o->step, 1, l);
        break;
    }
    }
    fitrace_free(t);
    if (s != FITRACE_OK) {
        fprintf(stderr, "fiplan: cannot build the batch: %s\n", fitrace_status_name(s));
        return 1;
    }
    return 0;
}

static FILE *open_out(const char *path, FILE *dflt) {
    if (!path) return dflt;
    FILE *f = fopen(path, "w");
    if (!f) fprintf(stderr, "fiplan: cannot write %s: %s\n", path, strerror(errno));
    return f;
}

/* The sparse top-k table of a built BLOCK_TABLES batch b: query token (r, i) of request r
 * sits at position p = kv_len - q_len + i and lists the flat slots (page * page_size +
 * offset) of keys max(0, p - K + 1) .. p, most recent last, -1 in the slots before the
 * first key.  [B, q_len, K] from fiplan_alloc (NULL when out of memory). */
static int32_t *sparse_table(const fibatch *b, int32_t K, int32_t page_size) {
    const fi_batch *bt = &b->batch;
    const int64_t q = bt->q_len_per_request, P = bt->max_pages_per_seq;
    int32_t *t = fiplan_alloc(sizeof(int32_t) * (size_t)(bt->batch_size * q * K + 1));
    if (!t) return NULL;
    for (int32_t r = 0; r < bt->batch_size; r++)
        for (int64_t i = 0; i < q; i++) {
            int32_t *row = t + (r * q + i) * K;
            const int64_t p = (int64_t)b->kv_lens[r] - q + i;   /* may be < 0: no key */
            for (int64_t s = 0; s < K; s++) {
                const int64_t key = p - (K - 1) + s;
                row[s] = key < 0 || key >= b->kv_lens[r]
                             ? -1
                             : bt->block_tables[r * P + key / page_size] * page_size +
                                   (int32_t)(key % page_size);
            }
        }
    return t;
}

int main(int argc, char **argv) {
    options o;
    memset(&o, 0, sizeof o);
    o.batch = 8;
    o.page_size = 64;
    o.dtype = FI_DTYPE_BF16; /* what serving engines run, so the plan shown is theirs */
    o.ctas = 132;
    o.window_left = -1;
    o.causal = 1;
    o.num_prefill = -1;
    o.seed = 1;
    o.repeat = 200;
    int pr = parse_options(argc, argv, &o);
    if (pr) {
        fiplan_free(o.lengths);
        if (pr == 3) {
            usage(stdout);
            return 0;
        }
        fputs("fiplan: try --help\n", stderr);
        return 2;
    }
    fi_kind kind = o.kind ? (fi_kind)o.kind : o.mode == MODE_DECODE ? FI_KIND_MLA_DECODE : FI_KIND_CONTEXT;
    int mla = kind == FI_KIND_MLA_DECODE;

    /* Everything below is released at `out`, whatever failed. */
    int rc = 0;
    fi_plan *plan = NULL;
    int32_t *sparse = NULL; /* --sparse-top-k: the batch's table */
    fibatch b;
    memset(&b, 0, sizeof b);
    fitrace_lens l;
    memset(&l, 0, sizeof l);
    if (build_lengths(&o, &l)) {
        rc = 1;
        goto out;
    }

    int uniform_q = 1;
    for (int32_t i = 1; i < l.n; i++) uniform_q &= l.q_len[i] == l.q_len[0];
    fibatch_opts bo = fibatch_default_opts();
    bo.form = o.form ? (fi_batch_form)o.form
              : o.sparse_top_k > 0 ? FI_FORM_BLOCK_TABLES
              : kind == FI_KIND_CONTEXT ? FI_FORM_CUM_SEQ_LENS
              : uniform_q ? FI_FORM_BLOCK_TABLES : FI_FORM_INDPTR;
    bo.page_size = o.page_size;
    bo.shuffle = o.shuffle;
    bo.seed = o.seed;
    bo.causal = o.causal;
    bo.window_left = o.window_left;
    fibatch_status bs = fibatch_build(&bo, l.q_len, l.kv_len, l.n, fiplan_allocator(), &b);
    if (bs != FIBATCH_OK) {
        fprintf(stderr, "fiplan: cannot build the batch: %s%s\n", fibatch_status_name(bs),
                bs == FIBATCH_ERR_NONUNIFORM ? " (block_tables needs one q_len: use --form indptr)" : "");
        rc = 1;
        goto out;
    }

    if (o.sparse_top_k > 0) { /* the dense batch's keys, K a token, as its top-k table */
        if (o.execute || bo.form != FI_FORM_BLOCK_TABLES) {
            fputs("fiplan: --sparse-top-k plans block tables only, without --execute\n", stderr);
            rc = 1;
            goto out;
        }
        sparse = sparse_table(&b, o.sparse_top_k, o.page_size);
        if (!sparse) {
            fputs("fiplan: out of memory\n", stderr);
            rc = 1;
            goto out;
        }
        b.batch.block_tables = sparse;
        b.batch.max_pages_per_seq = o.sparse_top_k;
    }

    fi_caps caps;
    memset(&caps, 0, sizeof caps);
    caps.kind = kind;
    caps.max_batch = l.n;
    caps.max_q_tokens = b.total_q_tokens > 0 ? b.total_q_tokens : 1;
    caps.num_pages = b.num_pages;
    caps.page_size = o.page_size;
    caps.num_qo_heads = o.heads ? o.heads : mla ? 128 : 32;
    caps.num_kv_heads = o.kv_heads ? o.kv_heads : mla ? 1 : 8;
    caps.head_dim_qk = mla ? 576 : (o.head_dim ? o.head_dim : 128);
    caps.head_dim_vo = mla ? 512 : caps.head_dim_qk;
    /* The dtypes choose the row (plan/variant.h fi_variant_of); the CPU reference of
     * --execute reads f32 tensors whatever the plan was made for. */
    caps.q_dtype = caps.kv_dtype = o.dtype;
    caps.o_dtype = o.dtype == FI_DTYPE_E4M3 ? FI_DTYPE_BF16 : o.dtype;
    caps.num_ctas = o.ctas;
    caps.variant = o.variant;
    caps.sparse_top_k = o.sparse_top_k;

    fi_status s = fi_plan_create(&caps, NULL, 0, fiplan_allocator(), &plan);
    if (s != FI_OK) {
        fprintf(stderr, "fiplan: fi_plan_create: %s\n", fi_status_name(s));
        rc = 1;
        goto out;
    }
    s = fi_plan_update(plan, &b.batch, NULL);
    if (s != FI_OK) {
        fi_error_detail d = fi_plan_error(plan);
        fprintf(stderr, "fiplan: fi_plan_update: %s (request %d, needed %lld, limit %lld)\n",
                fi_status_name(s), d.request, (long long)d.needed, (long long)d.limit);
        rc = 1;
        goto out;
    }
    fiplan_stats st;
    fiplan_stats_of(plan, &st);
    if (o.repeat > 0) {
        fiplan_stats timed = st;
        if (fiplan_time_updates(plan, &b.batch, NULL, o.repeat, &timed) == FI_OK) {
            st.update_us_median = timed.update_us_median;
            st.update_us_min = timed.update_us_min;
            st.update_us_max = timed.update_us_max;
            st.update_repeats = timed.update_repeats;
        }
    }

    fiplan_exec_result ex;
    memset(&ex, 0, sizeof ex);
    if (o.execute) {
        s = fiplan_execute(&caps, &b, plan, o.seed, o.force_cpu, &ex);
        if (s != FI_OK) rc = 1;
        else if (ex.nonfinite != 0 || !(ex.rel_err <= ex.tolerance)) rc = 1;
    }

    /* The summary yields stdout to a DOT / JSON stream written there. */
    FILE *sf = (o.dot && !o.dot_path) || (o.json && !o.json_path) ? stderr : stdout;
    fiplan_print_summary(sf, &caps, &b, &st, o.explain);
    fprintf(sf, "host memory    %s\n", fiplan_allocator_name());
    if (o.explain)
        fprintf(sf, "               = where fiplan's own buffers come from (the library takes "
                    "an fi_allocator)\n");
    if (ex.ran) {
        fprintf(sf, "execute        %s: ||out-ref||/||ref|| = %.3g (lse %.3g, non-finite "
                    "mismatches %lld, tolerance %.0e) in %.1f ms: %s\n",
                ex.on_gpu ? "GPU fi_run (bf16)" : "CPU fi_ref_run (fp32)", ex.rel_err,
                ex.lse_rel_err, (long long)ex.nonfinite, ex.tolerance, ex.exec_ms,
                rc == 0 ? "PASS" : "FAIL");
        if (o.explain)
            fprintf(sf, "               = the plan run on random data, against an fp64 "
                        "attention without any plan; PASS: error under the tolerance\n");
        if (ex.on_gpu) {
            fprintf(sf, "gpu time       %.1f us per run (CUDA events, mean of %d runs), "
                        "%.0f GB/s\n", ex.gpu_us, ex.gpu_runs, ex.gpu_gbps);
            if (o.explain)
                fprintf(sf, "               = one fi_run of this step (one layer); GB/s: KV of "
                            "every item, q and out bytes over that time (H200 read ceiling "
                            "~4.5 TB/s)\n");
        } else if (!o.force_cpu) {
            fprintf(sf, "gpu            none here (no CUDA device%s): checked on the CPU "
                        "reference executor only\n",
                    caps.kind != FI_KIND_MLA_DECODE ? ", or a kind without a GPU executor"
                    : caps.q_dtype != FI_DTYPE_BF16 ? ", or a dtype other than bf16" : "");
        }
    }

    if (o.dot) {
        FILE *f = open_out(o.dot_path, stdout);
        if (!f || fiplan_write_dot(plan, &st, f) != 0) rc = 1;
        if (f && f != stdout) fclose(f);
    }
    if (o.svg_path) {
        if (fiplan_write_svg(plan, &st, o.svg_path) != 0) rc = 1;
        else fprintf(sf, "svg            %s\n", o.svg_path);
    }
    if (o.json) {
        FILE *f = open_out(o.json_path, stdout);
        if (!f || fiplan_write_json(f, plan, &caps, &b, &st, &ex) != 0) rc = 1;
        if (f && f != stdout && fclose(f) != 0) rc = 1;
    }
out:
    fi_plan_destroy(plan);
    fibatch_free(&b);
    fiplan_free(sparse);
    fiplan_free(l.q_len);
    fiplan_free(l.kv_len);
    fiplan_free(l.source);
    fiplan_free(o.lengths);
    return rc;
}
