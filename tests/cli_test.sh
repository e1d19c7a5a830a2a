#!/bin/sh
# tests/cli_test.sh - end-to-end checks of the fiplan tool (run by `make test`).
#   FIPLAN=build/fiplan sh tests/cli_test.sh
# Needs graphviz's `dot`; the JSON checks also need python3 (skipped without it).  Prints one line per check and a final
# "N passed, N failed"; exits 1 if anything failed.
FIPLAN=${FIPLAN:-build/fiplan}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/fiplan_cli.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM
pass=0
fail=0

ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [ -s "$TMP/err" ] && sed 's/^/     /' "$TMP/err" | tail -5; }

# check NAME CMD...: CMD must succeed.
check() {
    name=$1; shift
    if "$@" 2>"$TMP/err"; then ok "$name"; else bad "$name"; fi
}

# check_py: as check, skipped (and counted as such) where python3 is missing.
skipped=0
check_py() {
    if command -v python3 >/dev/null 2>&1; then check "$@"; else skipped=$((skipped + 1)); echo "skip $1 (no python3)"; fi
}

# exit_code WANT NAME ARGS...: fiplan ARGS must exit with WANT.
exit_code() {
    want=$1; name=$2; shift 2
    "$FIPLAN" "$@" >/dev/null 2>"$TMP/err"
    got=$?
    if [ "$got" -eq "$want" ]; then ok "$name (exit $got)"; else bad "$name: exit $got, want $want"; fi
}

# exit_msg WANT PATTERN NAME ARGS...: as exit_code, and stderr must match PATTERN (grep -E):
# the run failed for the reason named, not for another one.
exit_msg() {
    want=$1; pat=$2; name=$3; shift 3
    "$FIPLAN" "$@" >/dev/null 2>"$TMP/err"
    got=$?
    if [ "$got" -eq "$want" ] && grep -Eq "$pat" "$TMP/err"; then ok "$name (exit $got)"
    else bad "$name: exit $got, want $want and a message matching '$pat'"; fi
}

# fiplan must succeed and print a graph; then dot must parse it (no pipe: sh has no
# pipefail, and an empty or failed fiplan would pass through one).
dot_parses() {
    "$FIPLAN" --repeat 0 --dot "$@" >"$TMP/d.dot" 2>"$TMP/err" || return 1
    grep -q '^digraph' "$TMP/d.dot" && dot -Tsvg "$TMP/d.dot" >/dev/null
}
# As dot_parses: fiplan's exit status first, then a non-empty document, then the parser
# (a pipe would let an empty or failed fiplan through).
json_parses() {
    "$FIPLAN" --repeat 3 --json "$@" >"$TMP/j.json" 2>"$TMP/err" || return 1
    [ -s "$TMP/j.json" ] && python3 -m json.tool "$TMP/j.json" >/dev/null
}

# An --execute --cpu run must exit 0, report the CPU path and an error below the bound.
execute_below() {
    bound=$1; shift
    "$FIPLAN" --repeat 0 --execute --cpu "$@" >"$TMP/x.txt" 2>"$TMP/err" || return 1
    line=$(grep '^execute ' "$TMP/x.txt") || return 1
    echo "$line" | sed "s/^execute */     /"
    err=$(echo "$line" | sed -n 's/.*||out-ref||\/||ref|| = \([^ ]*\) .*/\1/p')
    echo "$line" | grep -q 'CPU fi_ref_run' && echo "$line" | grep -q 'mismatches 0,' &&
        awk -v e="$err" -v b="$bound" 'BEGIN { exit !(e != "" && e + 0 < b + 0) }'
}

svg_written() {
    rm -f "$TMP/p.svg"
    "$FIPLAN" --repeat 0 --svg "$TMP/p.svg" "$@" >/dev/null 2>"$TMP/err" &&
        head -c 200 "$TMP/p.svg" | grep -q '<?xml' && grep -q '<svg' "$TMP/p.svg" &&
        grep -q 'cluster_cta' "$TMP/p.svg"
}

# A large plan stays readable: at most 64 CTA clusters drawn, plus the note node.
dot_is_capped() {
    "$FIPLAN" --repeat 0 --batch 1024 --step 300 --dot 2>/dev/null >"$TMP/big.dot" || return 1
    n=$(grep -c 'subgraph cluster_cta' "$TMP/big.dot")
    [ "$n" -ge 1 ] && [ "$n" -le 64 ] && grep -q not_drawn "$TMP/big.dot" && dot -Tsvg "$TMP/big.dot" >/dev/null
}

# The JSON plan covers every request's KV range for each head chunk (summed item lengths).
json_covers_kv() {
    "$FIPLAN" --repeat 0 --json "$@" >"$TMP/c.json" 2>"$TMP/err" || return 1
    python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
kv = d["batch"]["kv_len"]; q = d["batch"]["q_len"]
cov = {}
for r, hb, he, qb, qe, kb, ke, slot, grp in d["plan"]["items"]:
    cov[(r, hb, qb)] = cov.get((r, hb, qb), 0) + (ke - kb)
# every tile of request r reads at most kv_len keys; decode rows (q 1, causal) read all
ok = all(v <= kv[r] for (r, hb, qb), v in cov.items())
ok = ok and all(cov.get((r, 0, 0), 0) == kv[r] for r in range(len(kv)) if q[r] == 1)
sys.exit(0 if ok else 1)' "$TMP/c.json"
}

# The JSON names the tile-table row with its own charges (plan/cost_model.h: WANT_BETA is
# the name of the define the row's beta comes from), and scripts/plan_quality.py scores the
# plan with them: on a plan without split pieces its model score is the header's max CTA
# cost exactly, which the shared charges would miss for a row with its own beta.
json_row_charges() {
    want_name=$1; want_beta=$2; shift 2
    "$FIPLAN" --repeat 0 --json "$@" >"$TMP/r.json" 2>"$TMP/err" || return 1
    beta=$(sed -n "s/^#define $want_beta \([0-9]*\)$/\1/p" plan/cost_model.h)
    [ -n "$beta" ] || return 1
    python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
r = d["row"]
sys.exit(0 if r["name"] == sys.argv[2] and r["cost_beta"] == int(sys.argv[3])
         and d["summary"]["num_groups"] == 0 else 1)' "$TMP/r.json" "$want_name" "$beta" || return 1
    q=$(python3 scripts/plan_quality.py "$TMP/r.json" "$TMP/r.json") || return 1
    max=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["summary"]["max_cta_cost"])' "$TMP/r.json")
    echo "$q" | grep -q "^old max $max model $max | new max $max model $max | equal$"
}

bad_trace() {
    printf 'TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,12,x\n' >"$TMP/bad.csv"
    "$FIPLAN" --trace "$TMP/bad.csv" --repeat 0 >/dev/null 2>"$TMP/err"
    [ $? -eq 1 ] && grep -q 'line 2' "$TMP/err"
}

# examples/decode_cpu.c must keep compiling against the public headers and pass.
example_runs() {
    bdir=$(dirname "$FIPLAN")
    [ -f "$bdir/libfiattn.a" ] || return 1
    san=""
    case "$bdir" in *asan*) san="-fsanitize=address,undefined" ;; esac
    ${CC:-cc} -std=c11 -Wall -Wextra -Werror $san -Iinclude examples/decode_cpu.c "$bdir/libfiattn.a" \
        -L"${CUDA_HOME:-/usr/local/cuda}/lib64" -lcudart_static -ldl -lrt -lpthread -lstdc++ -lm \
        -o "$TMP/decode_cpu" && "$TMP/decode_cpu" >"$TMP/ex.txt" && grep -q 'ref|| = ' "$TMP/ex.txt"
}

check "dot output parses (decode, embedded trace)" dot_parses
check "dot output parses (prefill, context kind)" dot_parses --mode prefill --batch 4 --prefix 128
check "dot output parses (mixed, context kind)" dot_parses --mode mixed --batch 16 --step 20
check "dot output parses (gqa, explicit lengths, shuffled pages)" dot_parses --kind gqa --lengths 100,2000,37,5000 --shuffle
check "dot output of a 1024-request plan is capped at 64 CTAs" dot_is_capped
check_py "json output parses (decode)" json_parses
check_py "json output parses (mixed, cum_seq_lens form)" json_parses --mode mixed --kind context --batch 12 --form cum_seq_lens
check_py "json plan covers every decode request's keys" json_covers_kv --batch 64 --step 50 --ctas 32
check_py "json row and plan_quality charges (row 6: the default at heads 128 on bf16)" json_row_charges mla_decode_wgmma64 FI_COST_BETA_WG64 --lengths 4096,4096,4096 --ctas 6
check_py "json row and plan_quality charges (row 7: --dtype e4m3 at heads 16)" json_row_charges mla_decode_fp8_rows16 FI_COST_BETA_FP8_ROWS16 --dtype e4m3 --heads 16 --lengths 4096,4096,4096 --ctas 3
check_py "json row and plan_quality charges (row 9: bf16 at heads 16)" json_row_charges mla_decode_rows16 FI_COST_BETA_ROWS16 --heads 16 --lengths 4096,4096,4096 --ctas 3
check_py "json row and plan_quality charges (row 0, the shared beta)" json_row_charges mla_decode FI_COST_BETA --heads 16 --q-len 2 --lengths 4096,4096,4096 --ctas 3
check "svg file written" svg_written --batch 16 --ctas 24
check "execute on CPU below 1e-5 (MLA decode, default batch)" execute_below 1e-5
check "execute on CPU below 1e-5 (MLA, MTP 2, indptr, 16 heads)" execute_below 1e-5 --heads 16 --q-len 2 --form indptr --batch 6 --step 30
check "execute on CPU below 1e-5 (GQA decode, window_left 100)" execute_below 1e-5 --kind gqa --lengths 300,1,900,2500 --window-left 100 --ctas 16
check "execute on CPU below 1e-5 (context, cached prefix)" execute_below 1e-5 --kind context --lengths 300,700,65 --q-len 40 --heads 8 --kv-heads 2 --head-dim 64 --page-size 16
check "examples/decode_cpu.c builds and passes" example_runs
exit_code 0 "--help" --help
exit_code 2 "unknown option" --bogus
exit_code 2 "--batch 0" --batch 0
exit_code 2 "--mode nonsense" --mode nonsense
exit_code 2 "--kind nonsense" --kind nonsense
exit_code 2 "--dtype nonsense" --dtype fp4
exit_code 2 "--lengths with an empty entry" --lengths 1,,2
exit_code 2 "--page-size not a number" --page-size 6x4
exit_code 2 "stray argument" extra
exit_code 2 "missing value" --batch
exit_msg 1 'cannot load trace /nonexistent/trace.csv: FITRACE_ERR_IO' "missing trace file" --trace /nonexistent/trace.csv
exit_msg 1 'FI_ERR_UNSUPPORTED_PAGE_SIZE' "unsupported page size (library rejects)" --page-size 48 --repeat 0
exit_msg 1 'FI_ERR_INVALID_FORM' "cum_seq_lens for a decode kind (library rejects)" --form cum_seq_lens --repeat 0
check "malformed trace row reported with its line (exit 1)" bad_trace
# --sparse-top-k: a sparse plan of the trace batch (one request per query token), and its
# refusals (the library's for another kind, fiplan's for --execute)
sparse_plan() {
    "$FIPLAN" --batch 8 --q-len 2 --sparse-top-k 256 --heads 16 --ctas 16 --repeat 0 >"$TMP/sp" &&
        grep -Eq '^batch +8 requests \(block_tables\), 16 query tokens' "$TMP/sp" &&
        grep -Eq '4096 KV tokens' "$TMP/sp"
}
check "--sparse-top-k plans B x q_len requests of K keys" sparse_plan
exit_msg 1 'FI_ERR_SPARSE_UNSUPPORTED' "--sparse-top-k for gqa (library rejects)" --kind gqa --sparse-top-k 64 --repeat 0
exit_msg 1 'without --execute' "--sparse-top-k with --execute" --sparse-top-k 64 --execute --repeat 0
exit_code 2 "--sparse-top-k 0" --sparse-top-k 0

[ "$skipped" -gt 0 ] && echo "($skipped checks skipped: python3 not installed)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
