#!/usr/bin/env bash
# scripts/calib_cost.sh - one device call: the full scripts/gpu_check.sh, compute-sanitizer
# on the cmocka small case, then bench_mla with planner builds whose cost-model constants
# are overridden (plan/cost_model.h: -DFI_COST_BETA / -DFI_MIN_CHUNK_TOKENS), to
# calibrate the per-item overhead against measured times.
#   source .device/setup.sh && scripts/calib_cost.sh "BETA:MINCHUNK ..."
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
scripts/gpu_check.sh > "$OUT/gpu_check.txt" 2>&1
X="$OUT/extra.txt"
T=build/tests/gpu/test_mla_gpu
for tool in memcheck racecheck; do
  FI_GPU_TEST_FILTER=sanitize_small_case timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 $T > /tmp/san_$tool.log 2>&1
  echo "test sanitize_small_case $tool rc=$? : $(grep -E 'PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san_$tool.log | tr '\n' ' ')" >> "$X"
done
R=$(awk '$1 == "ceiling" && $2 == "read_TBps" { print $3 }' build/bench/ceilings.out)
echo "read ceiling $R" >> "$X"
for v in ${1:-}; do
  b=${v%%:*}; m=${v##*:}; B=build-b$b-m$m
  make NO_JEMALLOC=1 BUILD=$B CC="gcc -DFI_COST_BETA=$b -DFI_MIN_CHUNK_TOKENS=$m" -j"$(nproc)" $B/bench/bench_mla > /tmp/$B.log 2>&1 || { echo "build $B FAIL" >> "$X"; tail -5 /tmp/$B.log >> "$X"; continue; }
  echo "== beta $b min_chunk $m" >> "$X"
  $B/bench/bench_mla --read-tbps "$R" >> "$X" 2>&1
done
cat "$OUT/gpu_check.txt" | tail -60
cat "$X"
