#!/bin/sh
# bench/run_gpu_bench.sh - measure the ceilings, then the MLA decode benchmark, in one run on
# one GPU, and print one table (markdown, ready for BENCHMARKS.md) with date, GPU and commit.
#
#   sh bench/run_gpu_bench.sh [bench_mla options...]     (from the repository root)
#
# Env: BUILD (default build), NO_BUILD=1 to skip `make bench`, READ_GIB (ceilings buffer,
# default 2).  Raw outputs are kept in $BUILD/bench/ceilings.out and bench_mla.out.
# Exit status: that of bench_mla (1 if a case failed its correctness check).
set -eu

BUILD=${BUILD:-build}
OUTDIR=$BUILD/bench
if [ "${NO_BUILD:-0}" != 1 ]; then
    make -j"$(nproc 2>/dev/null || echo 2)" bench >&2
fi

if ! "$OUTDIR/ceilings" "${READ_GIB:-2}" > "$OUTDIR/ceilings.out"; then
    echo "run_gpu_bench: ceilings failed" >&2
    exit 1
fi
if grep -q '^skip' "$OUTDIR/ceilings.out"; then
    echo "run_gpu_bench: no CUDA device, skipped"
    exit 0
fi
READ_TBPS=$(awk '$1 == "ceiling" && $2 == "read_TBps" { print $3 }' "$OUTDIR/ceilings.out")
MMA_TFLOPS=$(awk '$1 == "ceiling" && $2 == "bf16_TFLOPs" { print $3 }' "$OUTDIR/ceilings.out")
GPU=$(awk '$1 == "device" { print $2 }' "$OUTDIR/ceilings.out" | tr '_' ' ')
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then COMMIT="$COMMIT+dirty"; fi

rc=0
FI_CEIL_READ_TBPS=$READ_TBPS FI_CEIL_BF16_TFLOPS=$MMA_TFLOPS \
    "$OUTDIR/bench_mla" --read-tbps "$READ_TBPS" --tflops "$MMA_TFLOPS" "$@" \
    > "$OUTDIR/bench_mla.out" 2> "$OUTDIR/bench_mla.err" || rc=$?

echo "## MLA paged decode (fiattn) - $(date -u '+%Y-%m-%d %H:%M UTC'), $GPU, commit $COMMIT"
echo
echo "Ceilings measured in this run (bench/ceilings): streaming read $READ_TBPS TB/s" \
     "(16-byte loads, >= 1 GiB, median), bf16 cuBLAS 8192^3 $MMA_TFLOPS TFLOP/s (median)."
echo "Reference points of the same run (not ceilings: an empty launch, and the streaming read over"
echo "windows the size of the cases' KV, ramp-up and tail included):"
grep -E '^(floor|small_read)' "$OUTDIR/ceilings.out" | sed 's/^/- /' || true
echo
echo "bf16, page_size 64 (h16_q1_ps1: 1), concatenated trtllm layout, CUDA-graph replays (median),"
echo "b2b = back to back, flush = L2 flushed before each replay, chain = per run of 8 PDL-chained"
echo "runs in one graph (input sets rotated). GB/s counts KV tokens once + q + out."
echo
grep -v '^#' "$OUTDIR/bench_mla.out" || true
echo
grep '^#' "$OUTDIR/bench_mla.out" | sed 's/^# /- /' || true
if [ "$rc" != 0 ]; then
    echo
    echo "bench_mla exited $rc; stderr:"
    cat "$OUTDIR/bench_mla.err"
fi
exit "$rc"
