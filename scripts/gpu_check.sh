#!/usr/bin/env bash
# scripts/gpu_check.sh - everything the GPU machine does in one call (device time is scarce):
# build what CI builds, the cmocka GPU tests, compute-sanitizer (memcheck + racecheck) on the
# small split tests, the benches.  Logs go to $OUT (or ./gpu_out) and are packed into one
# archive at the end (the device tool brings back at most 8 files): logs.tgz, bench_mla.log
# and summary.txt, printed last.
#   source .device/setup.sh && [SKIP_GPU_TEST=1] scripts/gpu_check.sh [quick|ncu|stamps]
#     quick   build and gpu-test only (no sanitizer, no benches)
#     ncu     also Nsight Compute on one launch each of bench_mla's h16_q1 and h128_q1
#     rows8   also bench_gqa on gqa_decode_rows64 (--variant 3) and gqa_decode_rows8
#             (--variant 2), one case after the other, twice (the A/B of the two kernels)
#     stamps  also the profiling build (make profile, -DFI_PROFILE, build-prof/): per-CTA
#             stamps of the trace snapshots, the wgmma MLA bodies' round phases
#             (profile.cuh FI_PHASE: cycles a round by phase) on the heads-128 cases, and
#             the batch-1 cases' head, latest split arrival and cooperative merge
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
J=$(nproc)
MODE=${1:-}
TEST=build/tests/gpu/test_mla_gpu
sum() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.limit,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
git log -1 --format='commit %h %s' 2>/dev/null | tee -a "$OUT/summary.txt"

# 1. the library, the GPU tests and the benches (CI builds them too, with `make all`)
GPU_BINS=$(ls tests/gpu/test_*.c | sed 's|^tests/gpu/\(.*\)\.c$|build/tests/gpu/\1|')
make NO_JEMALLOC=1 -j"$J" lib $GPU_BINS bench > "$OUT/build.log" 2>&1 \
  && sum "build lib, GPU tests, benches: ok" \
  || { sum "build lib, GPU tests, benches: FAIL"; grep -m5 -E "error|Error" "$OUT/build.log"; }
if command -v cuobjdump > /dev/null && [ -x "$TEST" ]; then
  cuobjdump --dump-sass "$TEST" > "$OUT/sass.txt" 2>&1
  sum "sass: $(grep -c 'LDL' "$OUT/sass.txt") LDL, $(grep -c 'STL' "$OUT/sass.txt") STL lines (both dtypes)"
fi

# 2. the GPU tests (fresh seed, printed; FI_TEST_SEED replays); budget ~3 minutes on an H100
# (SKIP_GPU_TEST=1: already run in an earlier call; the device allows 10 minutes a call)
if [ -z "${SKIP_GPU_TEST:-}" ]; then
start=$SECONDS
timeout 420 make NO_JEMALLOC=1 gpu-test > "$OUT/gpu_test.log" 2>&1
rc=$?
sum "make gpu-test rc=$rc in $((SECONDS - start)) s: $(grep -cE '^\[       OK \]' "$OUT/gpu_test.log") OK, $(grep -cE '^\[  (FAILED|ERROR)' "$OUT/gpu_test.log") failed/error lines; $(grep -m1 'seed' "$OUT/gpu_test.log")"
grep -E "FAILED|ERROR|Error|error" "$OUT/gpu_test.log" | head -20
fi

# 3. compute-sanitizer on the small split tests: sanitize_small_case (heads 16, q_len 2,
# 8 CTAs) and the split test (heads 16 / q_len 1 splits too: the KP = 2 path, producer warps
# 4..7, which q_len 2 does not reach; and the cooperative merge of a batch-1 request)
if [ "$MODE" != quick ] && [ -x "$TEST" ]; then
  # each on every MLA body (FI_MLA_TEST_VARIANT 4: mma.sync, 3: wgmma, 6: 64-token wgmma)
  for pair in small:sanitize_small_case split:mla_split_merge_matches_reference_few_and_many_ctas; do
    name=${pair%%:*} filter=${pair#*:}
    for v in 4 3 6; do
    for tool in memcheck racecheck; do
      FI_MLA_TEST_VARIANT=$v FI_GPU_TEST_FILTER=$filter timeout 200 \
        compute-sanitizer --tool $tool --error-exitcode 9 "$TEST" > "$OUT/san_${name}_v${v}_$tool.log" 2>&1
      sum "$tool $filter variant $v rc=$? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_${name}_v${v}_$tool.log" | tail -1)"
    done
    done
  done
  # the fp8 cache small case on both bodies (FI_MLA_TEST_VARIANT 4: mma.sync, 3: wgmma), on
  # the transposed fp8 body (row 7, its own case) and the sparse top-k one (the wgmma body's
  # only) (tests/gpu/test_mla_fp8_gpu.c)
  for run in sanitize_fp8_small_case:4 sanitize_fp8_small_case:3 sanitize_fp8_rows16_small_case:0 \
             sanitize_sparse_small_case:0; do
    filter=${run%%:*} v=${run#*:}
    for tool in memcheck racecheck; do
      FI_MLA_TEST_VARIANT=$v FI_GPU_TEST_FILTER=$filter timeout 200 compute-sanitizer --tool $tool \
        --error-exitcode 9 build/tests/gpu/test_mla_fp8_gpu > "$OUT/san_${filter}_v${v}_$tool.log" 2>&1
      sum "$tool $filter variant $v rc=$? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_${filter}_v${v}_$tool.log" | tail -1)"
    done
  done
  # GQA: the 64-row kernel's small split case (caps.variant 3) and the rows-8 kernel's (2)
  for filter in sanitize_small_case sanitize_rows8_small_case; do
    for tool in memcheck racecheck; do
      FI_GPU_TEST_FILTER=$filter timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 \
        build/tests/gpu/test_gqa_gpu > "$OUT/san_gqa_${filter}_$tool.log" 2>&1
      sum "$tool gqa $filter rc=$? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_gqa_${filter}_$tool.log" | tail -1)"
    done
  done
fi

# 4. benches: ceilings + bench_mla (the table for BENCHMARKS.md), then split granularity of
# the batch-1 cases: the same request cut for 64 and 32 CTAs (fewer, longer pieces)
if [ "$MODE" != quick ] && [ -f bench/run_gpu_bench.sh ]; then
  NO_BUILD=1 timeout 400 sh bench/run_gpu_bench.sh > "$OUT/bench_mla.log" 2>&1
  sum "run_gpu_bench rc=$?"
  read_tbps=$(awk '$1 == "ceiling" && $2 == "read_TBps" { print $3 }' build/bench/ceilings.out 2>/dev/null)
  for ctas in 64 32; do
    timeout 120 build/bench/bench_mla --case b1_32k --ctas $ctas --chain 0 ${read_tbps:+--read-tbps $read_tbps} \
      > "$OUT/bench_b1_ctas$ctas.log" 2>&1
    sum "bench_mla b1_32k --ctas $ctas rc=$?"
    grep -E '^\||^# b1' "$OUT/bench_b1_ctas$ctas.log" >> "$OUT/bench_mla.log"
  done
fi
if [ "$MODE" = rows8 ]; then
  [ -f build/bench/ceilings.out ] || build/bench/ceilings 2 > build/bench/ceilings.out 2>&1
  R=$(awk '$1 == "ceiling" && $2 == "read_TBps" { print $3 }' build/bench/ceilings.out 2>/dev/null)
  for r in 1 2; do
    for c in b1_kv32768 p64_fp8 p64_nvfp4 p64_bf16 p16_bf16 trace128 64x8; do
      for v in 3 2; do
        timeout 60 build/bench/bench_gqa ${R:+--read-tbps $R} --case $c --variant $v --chain 0 \
          --reps 50 --sets 2 2>&1 | grep "^result" | sed "s/^/variant $v round $r /" | tee -a "$OUT/rows8.txt"
      done
    done
  done
  sum "rows8 A/B: $(wc -l < "$OUT/rows8.txt") result lines (rows8.txt in logs.tgz)"
fi
if [ "$MODE" = ncu ]; then
  for c in h16_q1 h128_q1; do
    timeout 200 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section LaunchStats -k regex:mla_decode --launch-count 1 \
      build/bench/bench_mla --case $c --reps 50 --sets 1 --chain 0 > "$OUT/ncu_$c.log" 2>&1
    sum "ncu $c rc=$?"
  done
fi
if [ "$MODE" = stamps ]; then
  make NO_JEMALLOC=1 -j"$J" profile > "$OUT/build_prof.log" 2>&1 \
    && timeout 300 build-prof/bench/bench_mla --case trace --chain 0 > "$OUT/bench_stamps.log" 2>&1
  sum "stamps rc=$?"
  cat "$OUT/bench_stamps.log" 2>/dev/null
  for c in h128_q1 h128_q2 h128_q1_ps16 mla_fp8_h128_q1_b128_kv4096 \
           mla_sparse_top2048_h128_q2 mla_sparse_fp8_top2048_h128_q2; do
    timeout 60 build-prof/bench/bench_mla --case "$c" --chain 0 --reps 20 --sets 1 2>&1 \
      | grep -E "^# profile: .*body|^\| $c +\| b2b" | tee -a "$OUT/phases.txt"
  done
  # batch 1: the head (Q, first scores), the latest arrival and the cooperative merge
  for c in b1_32k_h16 b1_32k_h128 mla_fp8_b1_kv32768_h128; do
    timeout 60 build-prof/bench/bench_mla --case "$c" --chain 0 --reps 20 --sets 1 2>&1 \
      | grep -E "^# profile: (head|last)|^\| $c +\| b2b" | tee -a "$OUT/phases.txt"
  done
fi

echo "===== bench_mla (real planner) ====="
tail -60 "$OUT/bench_mla.log" 2>/dev/null
echo "===== summary ====="
cat "$OUT/summary.txt"
# at most 8 files come back from the device tool: pack the logs into one archive
( cd "$OUT" && tar czf /tmp/logs.tgz --exclude=summary.txt . \
  && find . -type f ! -name summary.txt ! -name bench_mla.log -delete && mv /tmp/logs.tgz . )
