#!/usr/bin/env bash
# scripts/gpu_check.sh - everything the GPU machine does in one call (device time is scarce):
# build, executor self-check, compute-sanitizer (memcheck + racecheck) on a small split case,
# the cmocka GPU tests, and the benches.  Logs go to $OUT (or ./gpu_out); a summary is last.
#   source .device/setup.sh && scripts/gpu_check.sh [quick]
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
J=$(nproc)
sum() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.limit,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
git log -1 --format='commit %h %s' 2>/dev/null | tee -a "$OUT/summary.txt"

# 1. executor self-check program (hand-built plans; independent of the planner)
mkdir -p build/scripts
if [ -f scripts/mla_check.cu ]; then
  make NO_JEMALLOC=1 build/scripts/mla_check > "$OUT/build_check.log" 2>&1 \
    && sum "build mla_check: ok" || { sum "build mla_check: FAIL"; tail -20 "$OUT/build_check.log"; }
  if [ -x build/scripts/mla_check ]; then
    timeout 240 build/scripts/mla_check > "$OUT/check.log" 2>&1; rc=$?
    grep -E "FAIL|cases|error" "$OUT/check.log" | tail -15
    sum "mla_check sweep rc=$rc: $(tail -1 "$OUT/check.log")"
    FIMLA_CONCAT=1 timeout 240 build/scripts/mla_check > "$OUT/check_concat.log" 2>&1
    sum "mla_check sweep (concatenated cache) rc=$?: $(tail -1 "$OUT/check_concat.log")"
    if [ "${1:-}" != "quick" ]; then
      timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 build/scripts/mla_check small > "$OUT/memcheck.log" 2>&1
      sum "memcheck rc=$? : $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
      timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 build/scripts/mla_check small > "$OUT/racecheck.log" 2>&1
      sum "racecheck rc=$? : $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"
    fi
    if [ "${1:-}" = "ncu" ]; then
      timeout 200 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section LaunchStats -k regex:mla_decode --launch-count 2 \
        build/scripts/mla_check one > "$OUT/ncu.log" 2>&1
      sum "ncu rc=$?"
    fi
    if [ "${1:-}" = "stamps" ]; then
      nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -lineinfo -DFIMLA_TIMING -Iinclude -I. \
        -o build/scripts/mla_check_t scripts/mla_check.cu executor/cuda/*.cu && \
      timeout 300 build/scripts/mla_check_t bench scripts/trace_snapshot.txt > "$OUT/bench_stamps.log" 2>&1
      sum "stamps rc=$?"; cat "$OUT/bench_stamps.log"
    fi
    FIMLA_CONCAT=1 timeout 300 build/scripts/mla_check bench scripts/trace_snapshot.txt > "$OUT/bench_check.log" 2>&1
    sum "mla_check bench rc=$?"
  fi
fi

if command -v cuobjdump > /dev/null && [ -x build/scripts/mla_check ]; then
  cuobjdump --dump-sass build/scripts/mla_check > "$OUT/sass.txt" 2>&1
  sum "sass: $(grep -c 'LDL' "$OUT/sass.txt") LDL, $(grep -c 'STL' "$OUT/sass.txt") STL lines (both dtypes)"
fi
# 2. the library, GPU tests and benches of the tree (when they exist)
make NO_JEMALLOC=1 -j"$J" build/libfiattn.a > "$OUT/build_lib.log" 2>&1 && sum "build lib: ok" || { sum "build lib: FAIL"; grep -m5 error "$OUT/build_lib.log"; }
if ls tests/gpu/test_*.c > /dev/null 2>&1; then
  timeout 300 make NO_JEMALLOC=1 -j"$J" gpu-test > "$OUT/gpu_test.log" 2>&1
  gpu_test_rc=$?
  if [ "${1:-}" != "quick" ]; then
    # heads 16 / q_len 1 splits (the KP = 2 path, producer warps 4..7): the small cases
    # above all have q_len 2 and do not reach it
    for tool in memcheck racecheck; do
      FI_GPU_TEST_FILTER=mla_split_merge_matches_reference_few_and_many_ctas timeout 200 \
        compute-sanitizer --tool $tool --error-exitcode 9 build/tests/gpu/test_mla_gpu > "$OUT/san_split_$tool.log" 2>&1
      sum "$tool split cases (h16 q1) rc=$? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_split_$tool.log" | tail -1)"
    done
  fi
  (exit $gpu_test_rc)
  sum "make gpu-test rc=$? : $(grep -cE '^\[  PASSED|OK \]' "$OUT/gpu_test.log") ok lines, $(grep -cE 'FAILED|ERROR' "$OUT/gpu_test.log") fail lines"
  grep -E "FAILED|ERROR|Error|error" "$OUT/gpu_test.log" | head -20
fi
if [ -f bench/run_gpu_bench.sh ] && [ "${1:-}" != "quick" ]; then
  make NO_JEMALLOC=1 -j"$J" bench > "$OUT/build_bench.log" 2>&1 || sum "build bench: FAIL"
  NO_BUILD=1 timeout 400 sh bench/run_gpu_bench.sh > "$OUT/bench_mla.log" 2>&1
  sum "run_gpu_bench rc=$?"
fi
echo "===== bench_mla (team bench, real planner) ====="
cat "$OUT/bench_mla.log" 2>/dev/null | tail -40
echo "===== bench (mla_check, hand-built plans) ====="
cat "$OUT/bench_check.log" 2>/dev/null
echo "===== summary ====="
cat "$OUT/summary.txt"
# at most 8 files come back from the device tool: pack the logs into one archive
( cd "$OUT" && tar czf /tmp/logs.tgz --exclude=summary.txt . && find . -type f ! -name summary.txt ! -name bench_check.log -delete && mv /tmp/logs.tgz . )
