#!/usr/bin/env bash
# scripts/sweep_charges.sh - the planner's charges (plan/cost_model.h) and the KV stream's
# evict-first threshold (executor/core/run.c FI_KV_EVICT_FIRST_BYTES) swept on the GPU.
# The tree is built once; each setting gets a copy of the build directory in which only
# executor/core/registry.c (the one reader of the charges) and executor/core/run.c are
# rebuilt with -D overrides, so a setting costs seconds, not a kernel build.  Every bench
# command runs on the tree as it is ("base") and on each setting, interleaved, for R rounds.
#
#   source .device/setup.sh && scripts/sweep_charges.sh [-r ROUNDS] \
#       -s "beta384:FI_COST_BETA=384" -s "fp8:FI_COST_MERGE_FP8_ROWS16=600,FI_COST_ARRIVE_FP8_ROWS16=200" \
#       -b "bench_gqa --case gqa_32x8_d128_trace128 --trace-step 400" -b "bench_mla --case trace_h128"
#
# -s TAG:DEFS  a setting: a name, then NAME=VALUE overrides of cost_model.h's defines or of
#              FI_KV_EVICT_FIRST_BYTES, comma-separated (the shared FI_COST_* move every row
#              that uses them; the benched case picks the row, which fiplan --dtype ... or
#              the bench's plan line names).
# -b CMD       a program under build/bench/ and its arguments, after the defaults
#              --read-tbps 4.5 --chain 0 --reps 40 --sets 2 (later options win).
# Prints one line a run: "rR TAG | CMD | b2b US flush US | the plan's items / groups / balance".
# Logs under $OUT (default sweep_out).  Exit 1 when a build fails, 2 on a usage error.
set -u
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; }
R=2
SETS=()
CMDS=()
while getopts "r:s:b:h" o; do
    case $o in
    r) R=$OPTARG ;;
    s) SETS+=("$OPTARG") ;;
    b) CMDS+=("$OPTARG") ;;
    *) usage; exit 2 ;;
    esac
done
[ ${#SETS[@]} -gt 0 ] && [ ${#CMDS[@]} -gt 0 ] || { usage; exit 2; }
OUT=${OUT:-sweep_out}
mkdir -p "$OUT"
PROGS=$(for c in "${CMDS[@]}"; do echo "${c%% *}"; done | sort -u)
targets() { for p in $PROGS; do printf '%s/bench/%s ' "$1" "$p"; done; }
# shellcheck disable=SC2046
make NO_JEMALLOC=1 -j"$(nproc)" $(targets build) >"$OUT/build-base.log" 2>&1 ||
    { echo "base build failed: $OUT/build-base.log"; exit 1; }
TAGS="base"
for s in "${SETS[@]}"; do
    tag=${s%%:*}
    defs=${s#*:}
    dir=build-sweep-$tag
    # The Makefile's .SECONDARY keeps a missing object from remaking what was built from
    # it: the archive and the benches go too, so they are remade with the new object.
    rm -rf "$dir" && cp -a build "$dir" &&
        rm -f "$dir/executor/core/registry.o" "$dir/executor/core/run.o" "$dir/libfiattn.a" &&
        find "$dir/bench" -maxdepth 1 -type f -delete
    flags=$(echo "$defs" | tr ',' '\n' | sed 's/^/-D/' | tr '\n' ' ')
    # shellcheck disable=SC2046
    make NO_JEMALLOC=1 BUILD="$dir" CC="${CC:-cc} $flags" -j"$(nproc)" $(targets "$dir") \
        >"$OUT/build-$tag.log" 2>&1 || { echo "build $tag failed: $OUT/build-$tag.log"; exit 1; }
    if ! grep -q 'registry\.c' "$OUT/build-$tag.log" || ! grep -q 'core/run\.c' "$OUT/build-$tag.log"; then
        echo "build $tag: registry.c or run.c not rebuilt"; exit 1
    fi
    echo "setting $tag: $flags"
    TAGS="$TAGS $tag"
done
for r in $(seq 1 "$R"); do
    for c in "${CMDS[@]}"; do
        prog=${c%% *}
        args=${c#"$prog"}
        for tag in $TAGS; do
            dir=build
            [ "$tag" = base ] || dir=build-sweep-$tag
            # shellcheck disable=SC2086
            timeout 120 "$dir/bench/$prog" --read-tbps 4.5 --chain 0 --reps 40 --sets 2 $args \
                >"$OUT/run.txt" 2>&1
            us=$(awk '$1 == "result" { printf "%s %s ", $3, $5 }' "$OUT/run.txt")
            plan=$(grep -o 'items [0-9]* groups [0-9]*.*balance [0-9.]*' "$OUT/run.txt" | head -1)
            echo "r$r $tag | $c | ${us:-no result: $(tail -1 "$OUT/run.txt")}| $plan"
        done
    done
done
