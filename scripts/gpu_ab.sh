#!/usr/bin/env bash
# scripts/gpu_ab.sh - on the GPU machine, in one call: build this tree and a baseline tree
# (BASE, e.g. an unpacked `git archive <commit>`), then either
#   check: make gpu-test + compute-sanitizer memcheck / racecheck on the split cases, SASS
#          statistics of both kernels;
#   bench: bench/ceilings once, then bench_mla of baseline and this tree interleaved REPS
#          times (same GPU, same call: the A/B an executor change needs).
# Logs under $OUT.   source .device/setup.sh && [FAMILY=gqa] scripts/gpu_ab.sh check|bench BASE [REPS]
# FAMILY (mla, the default, or gqa) picks bench_$FAMILY and test_${FAMILY}_gpu.
set -u
mode=$1; BASE=$2; REPS=${3:-2}; F=${FAMILY:-mla}
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"; J=$(nproc)
sum() { echo "$*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv > "$OUT/gpu.txt" 2>&1
(cd "$BASE" && make NO_JEMALLOC=1 -j"$J" build/bench/bench_$F build/bench/ceilings) > "$OUT/build_base.log" 2>&1 \
  && sum "build base: ok" || { sum "build base: FAIL"; tail -20 "$OUT/build_base.log"; }
make NO_JEMALLOC=1 -j"$J" all > "$OUT/build_new.log" 2>&1 && sum "build new: ok" || { sum "build new: FAIL"; grep -m10 -E 'error' "$OUT/build_new.log"; }
if [ "$mode" = check ]; then
  for b in "$BASE/build/bench/bench_$F" build/bench/bench_$F; do
    cuobjdump -sass "$b" > /tmp/s.sass 2>/dev/null
    sum "sass $b: $(grep -cE 'HMMA' /tmp/s.sass) HMMA, $(grep -c LDL /tmp/s.sass) LDL, $(grep -c STL /tmp/s.sass) STL (both dtypes)"
  done
  timeout 400 make NO_JEMALLOC=1 gpu-test > "$OUT/gpu_test.log" 2>&1
  sum "make gpu-test rc=$? : $(grep -cE '^\[       OK \]' "$OUT/gpu_test.log") OK, $(grep -cE '^\[  FAILED  \]' "$OUT/gpu_test.log") FAILED, $(grep -c SKIPPED "$OUT/gpu_test.log") skipped lines"
  grep -E 'FAILED|ERROR|error' "$OUT/gpu_test.log" | head -20
  filters=sanitize_small_case
  [ "$F" = mla ] && filters="$filters mla_split_merge_matches_reference_few_and_many_ctas mla_rows32_variant_matches_reference"
  for f in $filters; do
    for tool in memcheck racecheck; do
      FI_GPU_TEST_FILTER=$f timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 \
        build/tests/gpu/test_${F}_gpu > "$OUT/san_${f%%_matches*}_$tool.log" 2>&1
      sum "$tool $f rc=$? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_${f%%_matches*}_$tool.log" | tail -1)"
    done
  done
else
  build/bench/ceilings 2 > "$OUT/ceilings.out" 2>&1
  R=$(awk '$1 == "ceiling" && $2 == "read_TBps" { print $3 }' "$OUT/ceilings.out")
  T=$(awk '$1 == "ceiling" && $2 == "bf16_TFLOPs" { print $3 }' "$OUT/ceilings.out")
  sum "ceilings: read $R TB/s, bf16 $T TFLOP/s"
  for r in $(seq 1 "$REPS"); do
    for side in base new; do
      b=build/bench/bench_$F; [ $side = base ] && b=$BASE/build/bench/bench_$F
      targs="--read-tbps $R"; [ "$F" = mla ] && targs="$targs --tflops $T"
      timeout 250 "$b" $targs ${BENCH_ARGS:-} > "$OUT/bench_${side}_$r.txt" 2>&1
      sum "bench $side rep $r rc=$?"
    done
  done
fi
cat "$OUT/summary.txt"
# at most 8 files come back from the device tool: everything but the summary in one archive
( cd "$OUT" && tar czf /tmp/ab_logs.tgz --exclude=summary.txt . && find . -type f ! -name summary.txt -delete && mv /tmp/ab_logs.tgz "logs_$mode.tgz" )
