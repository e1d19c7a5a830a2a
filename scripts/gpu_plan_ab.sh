#!/usr/bin/env bash
# scripts/gpu_plan_ab.sh - the device planner's A/B on the GPU machine, in one call.
#
#   source .device/setup.sh && scripts/gpu_plan_ab.sh BASE.tgz [BASE.tgz ...]
#
# Each BASE.tgz holds another planner (`git archive <commit> planner/ | gzip > .exp/b.tgz`
# here: the GPU machine's copy of the repository has a stale .git).  Each is unpacked over a
# copy of this tree, so only `planner/` differs, and its bench_device_plan is built beside
# this tree's `make all`.  Then, on this tree, test_device_plan_gpu (the 1,000 random
# batches host against device, the graph loops) and compute-sanitizer memcheck on the
# bad-length test; then ROUNDS rounds of bench_device_plan, every base and this tree in
# turn (same GPU, same call, interleaved: what a planner change needs, docs/perf-log.md).
# Environment: ROUNDS (2), BENCH_ARGS ("--kind all --case parallel --reps 30 --steps 20"),
# PREBUILT=1 (keep carried kernel objects, below),
# STAMPS=1 (also the profiling build's clock stamps of this tree, `make PROFILE=1`: cycles
# between the planning kernel's FI_PD_STAMP points), MAKE_ARGS ("NO_JEMALLOC=1": the GPU
# machine has no jemalloc), OUT (gpu_out).
# $OUT gets summary.txt (the builds, the tests, each run's `result` lines: case, plan us,
# e2e PDL us) and logs.tgz (every log): the device tool returns only a few files.
set -u
[ $# -ge 1 ] || { echo "usage: $0 BASE.tgz [BASE.tgz ...]" >&2; exit 2; }
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"; LOGS=$(mktemp -d)
trap 'tar czf "$OUT/logs.tgz" -C "$LOGS" . && rm -rf "$LOGS"' EXIT
M=${MAKE_ARGS-NO_JEMALLOC=1}
ROUNDS=${ROUNDS:-2}; ARGS=${BENCH_ARGS:-"--kind all --case parallel --reps 30 --steps 20"}
J=$(nproc); JB=$(( J / (2 * $#) > 1 ? J / (2 * $#) : 1 ))
sum() { echo "$*" | tee -a "$OUT/summary.txt"; }
here=$PWD
# PREBUILT=1: build/executor was built on the development machine from this tree and carried
# (`carry: [".device", ".exp", "build/executor"]`: ~53 MB, inside the 64 MiB carry limit).
# A planner A/B changes no kernel, so the kernel objects are made newer than every source
# and make keeps them, here and in each base's copy: a fresh machine's kernel build (~60 s
# of the call) is skipped.  Objects older than an executor change would be used as they
# are: carry only a build of the tree being sent.
if [ "${PREBUILT:-0}" = 1 ] && [ -d build/executor ]; then
    find build/executor -name '*.o' -exec touch {} +
    sum "prebuilt kernel objects: $(find build/executor -name '*.cu.o' | wc -l)"
fi
i=0
for tgz in "$@"; do
    i=$((i + 1)); d=/tmp/plan_ab_$i
    if ! { rm -rf "$d" && cp -a "$here" "$d" && tar xzf "$tgz" --touch -C "$d"; }; then
        sum "base $i ($tgz): unpack failed"; exit 1
    fi
    # shellcheck disable=SC2086
    (cd "$d" && nice make $M -j"$JB" build/bench/bench_device_plan > "$LOGS/build_base_$i.log" 2>&1
     echo "build base $i ($tgz) rc=$?" >> "$OUT/summary.txt") &
done
# shellcheck disable=SC2086
if make $M -j"$J" all > "$LOGS/build_new.log" 2>&1; then
    sum "build new: ok"
else
    sum "build new: FAIL"; grep -m10 error "$LOGS/build_new.log"; exit 1
fi
if [ "${STAMPS:-0}" = 1 ]; then
    # shellcheck disable=SC2086
    (nice make $M PROFILE=1 -j"$JB" build-prof/bench/bench_device_plan > "$LOGS/build_prof.log" 2>&1
     echo "build profiling rc=$?" >> "$OUT/summary.txt") &
fi
timeout 200 build/tests/gpu/test_device_plan_gpu > "$LOGS/device_plan_gpu.log" 2>&1
sum "test_device_plan_gpu rc=$?: $(grep -c '^\[       OK' "$LOGS/device_plan_gpu.log") OK"
FI_GPU_TEST_FILTER=device_plan_bad_length_reports_status timeout 150 compute-sanitizer --tool memcheck \
    build/tests/gpu/test_device_plan_gpu > "$LOGS/memcheck.log" 2>&1
sum "memcheck rc=$?: $(grep 'ERROR SUMMARY' "$LOGS/memcheck.log")"
wait
for r in $(seq 1 "$ROUNDS"); do
    for k in $(seq 1 $#) new; do
        b=build/bench/bench_device_plan; [ "$k" = new ] || b=/tmp/plan_ab_$k/build/bench/bench_device_plan
        # shellcheck disable=SC2086
        timeout 200 "$b" $ARGS > "$LOGS/bench_${k}_$r.txt" 2>&1
        sum "== round $r, $([ "$k" = new ] && echo this tree || echo "base $k") rc=$?"
        grep '^result' "$LOGS/bench_${k}_$r.txt" | awk '{print $2, $3, $4, $5, $6}' | tee -a "$OUT/summary.txt"
    done
done
if [ "${STAMPS:-0}" = 1 ]; then
    # shellcheck disable=SC2086
    timeout 200 build-prof/bench/bench_device_plan $ARGS --reps 10 --steps 10 > "$LOGS/stamps.txt" 2>&1
    sum "stamps rc=$?"; grep 'plan kernel cycles' "$LOGS/stamps.txt" | tee -a "$OUT/summary.txt"
fi
