#!/bin/sh
# scripts/plan_compare.sh - do two fiplan builds produce byte-identical plans?
#
#   scripts/plan_compare.sh OLD_FIPLAN NEW_FIPLAN [WORKDIR]
#
# Plans a fixed set of batches (~650: trace decode snapshots of MLA and GQA at several
# head counts, batch sizes, steps, q_len and CTA counts; seeded random-length batches;
# sliding windows; the data-parallel partition rows; context prefill and mixed batches)
# with both binaries (`--json`, no timing) and compares the JSON files byte for byte.
# Prints one line per differing batch (its arguments, both builds' max CTA cost, items
# and groups, and the verdict of scripts/plan_quality.py: both plans' max CTA cost and
# executor-model score, worse / better / equal) and a summary with the count of each verdict; exit status 0 if every
# plan is identical, 1 if some differ but none is worse, 3 if one is worse, 2 on a usage
# or run error.
# Use it before landing any planner change (docs/perf-log.md: "plans byte-identical").
set -eu
if [ $# -lt 2 ]; then
    echo "usage: $0 OLD_FIPLAN NEW_FIPLAN [WORKDIR]" >&2
    exit 2
fi
OLD=$1
NEW=$2
WORK=${3:-$(mktemp -d)}
mkdir -p "$WORK/old" "$WORK/new"

# COUNT batches of random lengths, seeded (the same lists on every machine): up to MAXN
# requests, lengths up to MAX0 / MAX1 / MAX2 in turn, the four KINDs in turn.
#   random_lengths SEED COUNT MAXN MAX0 MAX1 MAX2 KIND0 KIND1 KIND2 KIND3
random_lengths() {
    awk -v seed="$1" -v count="$2" -v maxn="$3" -v m0="$4" -v m1="$5" -v m2="$6" \
        -v k0="$7" -v k1="$8" -v k2="$9" -v k3="${10}" 'BEGIN {
        srand(seed);
        for (i = 0; i < count; i++) {
            n = 1 + int(rand() * maxn); mx = (i % 3 == 0) ? m0 : (i % 3 == 1) ? m1 : m2;
            s = "";
            for (j = 0; j < n; j++) s = s (j ? "," : "") 1 + int(rand() * mx);
            kind = (i % 4 == 0) ? k0 : (i % 4 == 1) ? k1 : (i % 4 == 2) ? k2 : k3;
            print kind " --lengths " s;
        }
    }'
}

# One batch per line: fiplan arguments.
cases() {
    for b in 1 2 8 32 64 128 256 512 1024; do
        for s in 0 100 200 400; do
            echo "--kind mla --heads 128 --batch $b --step $s"
            echo "--kind mla --heads 16 --batch $b --step $s"
            echo "--kind gqa --heads 32 --kv-heads 8 --batch $b --step $s"
        done
        echo "--kind mla --heads 64 --batch $b --step 200"
        echo "--kind mla --heads 32 --batch $b --step 200"
        echo "--kind mla --heads 16 --batch $b --step 200 --q-len 2"
        echo "--kind mla --heads 128 --batch $b --step 200 --q-len 2"
        echo "--kind gqa --heads 64 --kv-heads 8 --batch $b --step 200"
        echo "--kind gqa --heads 32 --kv-heads 4 --batch $b --step 200"
        echo "--kind gqa --heads 32 --kv-heads 8 --batch $b --step 200 --q-len 4"
        echo "--kind gqa --heads 8 --kv-heads 8 --batch $b --step 200 --head-dim 64"
        echo "--kind gqa --heads 32 --kv-heads 8 --batch $b --step 200 --window-left 511"
        echo "--kind mla --heads 16 --batch $b --step 200 --ctas 78"
        echo "--kind gqa --heads 32 --kv-heads 8 --batch $b --step 200 --ctas 24"
        echo "--kind mla --heads 16 --batch $b --step 100 --page-size 16 --shuffle"
    done
    for b in 8 32 96 160 264; do
        for s in 50 150 300; do
            echo "--kind mla --heads 16 --batch $b --step $s --first 7"
            echo "--kind gqa --heads 32 --kv-heads 8 --batch $b --step $s --first 7"
        done
    done
    # Random lengths (seeded awk generator: the same lists on every machine).
    random_lengths 18 180 300 200 4000 33000 "--kind mla --heads 128" "--kind mla --heads 16" \
        "--kind gqa --heads 32 --kv-heads 8" "--kind gqa --heads 16 --kv-heads 2"
    # The data-parallel partition rows (planner/ppart.c, ppair.c; what the device planner
    # runs): MLA 2 (heads 16) and 5 (wgmma), GQA 1 and 4 (rows 8).
    for b in 1 8 32 100 128 256 1024; do
        for s in 0 100 400; do
            echo "--kind mla --heads 16 --batch $b --step $s --variant 2"
            echo "--kind mla --heads 128 --batch $b --step $s --variant 5"
            echo "--kind gqa --heads 32 --kv-heads 8 --batch $b --step $s --variant 1"
            echo "--kind gqa --heads 32 --kv-heads 8 --batch $b --step $s --variant 4"
        done
        echo "--kind mla --heads 16 --batch $b --step 200 --variant 2 --ctas 78"
        echo "--kind gqa --heads 32 --kv-heads 8 --batch $b --step 200 --variant 4 --ctas 24"
        echo "--kind gqa --heads 64 --kv-heads 8 --batch $b --step 200 --variant 1 --page-size 16"
    done
    random_lengths 29 60 600 300 5000 40000 "--kind mla --heads 128 --variant 5" \
        "--kind mla --heads 16 --variant 2" "--kind gqa --heads 32 --kv-heads 8 --variant 4" \
        "--kind gqa --heads 16 --kv-heads 2 --variant 1"
    for b in 1 4 16 64; do
        echo "--mode prefill --batch $b --step 0"
        echo "--mode prefill --batch $b --prefix 512"
        echo "--mode mixed --batch $b --step 100"
        echo "--mode mixed --batch $b --step 100 --q-len 128 --window-left 1023"
    done
}

n=0
diff=0
worse=0
better=0
HERE=$(dirname "$0")
cases >"$WORK/cases.txt"
while IFS= read -r args; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    "$OLD" $args --repeat 0 --json="$WORK/old/$n.json" >/dev/null 2>&1 ||
        echo "fiplan failed: $args" >"$WORK/old/$n.json"
    # shellcheck disable=SC2086
    "$NEW" $args --repeat 0 --json="$WORK/new/$n.json" >/dev/null 2>&1 ||
        echo "fiplan failed: $args" >"$WORK/new/$n.json"
    # The plans, not the row's charges (fiplan's JSON names them since the rows have their
    # own; an older build's JSON has no "row" line): plan_quality.py reads the charges.
    grep -v '^  "row": ' "$WORK/old/$n.json" >"$WORK/old.plan"
    grep -v '^  "row": ' "$WORK/new/$n.json" >"$WORK/new.plan"
    if ! cmp -s "$WORK/old.plan" "$WORK/new.plan"; then
        diff=$((diff + 1))
        fig() { sed -n 's/.*"num_items": \([0-9]*\), "num_groups": \([0-9]*\).*"max_cta_cost": \([0-9]*\).*/max \3 items \1 groups \2/p' "$1"; }
        q=$(python3 "$HERE/plan_quality.py" "$WORK/old/$n.json" "$WORK/new/$n.json" 2>&1 || true)
        case $q in
        *"| better") better=$((better + 1)) ;;
        *"| equal") ;;
        *) worse=$((worse + 1)) ;; # worse, or not comparable (a failed run)
        esac
        echo "differs: $(echo "$args" | cut -c1-100) | old $(fig "$WORK/old/$n.json") | new $(fig "$WORK/new/$n.json") | $q"
    fi
done <"$WORK/cases.txt"
echo "$n batches, $diff differ: $better better, $worse worse, $((diff - better - worse)) equal in max CTA cost and model (JSON in $WORK)"
[ "$worse" -eq 0 ] || exit 3
[ "$diff" -eq 0 ]
