#!/usr/bin/env bash
# scripts/calib_cost.sh - one device call: the full scripts/gpu_check.sh (compute-sanitizer
# on the small split tests included), then bench_mla with planner builds whose cost-model
# constants are overridden (plan/cost_model.h: -DFI_COST_BETA / -DFI_MIN_CHUNK_TOKENS), to
# calibrate the per-item overhead against measured times.
#   source .device/setup.sh && scripts/calib_cost.sh "BETA:MINCHUNK ..."
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
G=${TMPDIR:-/tmp}/gpu_check.txt  # not under $OUT: gpu_check.sh packs and empties it
scripts/gpu_check.sh > "$G" 2>&1
X="$OUT/extra.txt"
: > "$X"
R=$(awk '$1 == "ceiling" && $2 == "read_TBps" { print $3 }' build/bench/ceilings.out)
echo "read ceiling $R" >> "$X"
for v in ${1:-}; do
  b=${v%%:*}; m=${v##*:}; B=build-b$b-m$m
  make NO_JEMALLOC=1 BUILD=$B CC="gcc -DFI_COST_BETA=$b -DFI_MIN_CHUNK_TOKENS=$m" -j"$(nproc)" $B/bench/bench_mla > /tmp/$B.log 2>&1 || { echo "build $B FAIL" >> "$X"; tail -5 /tmp/$B.log >> "$X"; continue; }
  echo "== beta $b min_chunk $m" >> "$X"
  $B/bench/bench_mla --read-tbps "$R" >> "$X" 2>&1
done
tail -60 "$G"
cat "$X"
