#!/bin/sh
# bench/run_gpu_bench.sh - measure the ceilings, then the MLA and GQA decode benchmarks, the
# context (prefill) benchmark and the device planner's, in one run on one GPU, and print one
# table per bench (markdown, ready for BENCHMARKS.md) with date, GPU and commit.
#
#   sh bench/run_gpu_bench.sh [--gqa | --mla | --context | --devplan] [bench options...]
#   (from the repository root)
#
# --gqa: only bench_gqa; --mla: only bench_mla; --context: only bench_context (run with
# --check: sampled rows against the fp64 reference first); --devplan: only
# bench_device_plan; none: all four (the options then go to each: --reps, --sets, --chain,
# --case, --ctas, --trace-step are understood by each).
# Env: BUILD (default build), NO_BUILD=1 to skip `make bench`, READ_GIB (ceilings buffer,
# default 2), FI_BENCH_CLOCKS=1 (each case's notes also give the median SM clock and board
# power sampled through NVML while each mode ran: bench/bench_common.h).  Raw outputs are
# kept in $BUILD/bench/ceilings.out, bench_mla.out, bench_gqa.out, bench_context.out,
# bench_device_plan.out.
# Exit status: 1 if a bench failed (a case failed its correctness check), else 0.
set -eu

RUN_MLA=1
RUN_GQA=1
RUN_CTX=1
RUN_DEV=1
case "${1:-}" in
    --gqa) RUN_MLA=0; RUN_CTX=0; RUN_DEV=0; shift ;;
    --mla) RUN_GQA=0; RUN_CTX=0; RUN_DEV=0; shift ;;
    --context) RUN_MLA=0; RUN_GQA=0; RUN_DEV=0; shift ;;
    --devplan) RUN_MLA=0; RUN_GQA=0; RUN_CTX=0; shift ;;
esac

BUILD=${BUILD:-build}
OUTDIR=$BUILD/bench
if [ "${NO_BUILD:-0}" != 1 ]; then
    make -j"$(nproc 2>/dev/null || echo 2)" bench >&2
fi

if ! "$OUTDIR/ceilings" "${READ_GIB:-2}" > "$OUTDIR/ceilings.out"; then
    # The read and bf16 ceilings come first; a failure after them (the fp8 product, the
    # reference points) leaves those two, which the tables need.
    if ! grep -q '^ceiling bf16_TFLOPs' "$OUTDIR/ceilings.out"; then
        echo "run_gpu_bench: ceilings failed" >&2
        exit 1
    fi
    echo "run_gpu_bench: ceilings stopped after the bf16 ceiling (see its stderr)" >&2
fi
if grep -q '^skip' "$OUTDIR/ceilings.out"; then
    echo "run_gpu_bench: no CUDA device, skipped"
    exit 0
fi
READ_TBPS=$(awk '$1 == "ceiling" && $2 == "read_TBps" { print $3 }' "$OUTDIR/ceilings.out")
MMA_TFLOPS=$(awk '$1 == "ceiling" && $2 == "bf16_TFLOPs" { print $3 }' "$OUTDIR/ceilings.out")
FP8_TFLOPS=$(awk '$1 == "ceiling" && $2 == "fp8_TFLOPs" { print $3 }' "$OUTDIR/ceilings.out")
FP8_TFLOPS=${FP8_TFLOPS:-0}  # 0: cuBLASLt had no fp8 product (ceilings says why)
GPU=$(awk '$1 == "device" { print $2 }' "$OUTDIR/ceilings.out" | tr '_' ' ')
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then COMMIT="$COMMIT+dirty"; fi

rc=0
if [ "$RUN_MLA" = 1 ]; then
mla_rc=0
FI_CEIL_READ_TBPS=$READ_TBPS FI_CEIL_BF16_TFLOPS=$MMA_TFLOPS FI_CEIL_FP8_TFLOPS=$FP8_TFLOPS \
    "$OUTDIR/bench_mla" --read-tbps "$READ_TBPS" --tflops "$MMA_TFLOPS" \
    --tflops-fp8 "$FP8_TFLOPS" "$@" \
    > "$OUTDIR/bench_mla.out" 2> "$OUTDIR/bench_mla.err" || mla_rc=$?

echo "## MLA paged decode (fiattn) - $(date -u '+%Y-%m-%d %H:%M UTC'), $GPU, commit $COMMIT"
echo
echo "Ceilings measured in this run (bench/ceilings): streaming read $READ_TBPS TB/s" \
     "(16-byte loads, >= 1 GiB, median), bf16 cuBLAS 8192^3 $MMA_TFLOPS TFLOP/s, fp8 e4m3" \
     "cuBLASLt 8192^3 $FP8_TFLOPS TFLOP/s (medians; the fp8 cases' %mma is of the fp8 rate)."
echo "Reference points of the same run (not ceilings: an empty launch, and the streaming read over"
echo "windows the size of the cases' KV, ramp-up and tail included):"
grep -E '^(floor|small_read)' "$OUTDIR/ceilings.out" | sed 's/^/- /' || true
echo
echo "bf16, page_size 64 (h16_q1_ps1: 1, h128_q1_ps16: 16), concatenated trtllm layout, CUDA-graph replays (median),"
echo "b2b = back to back, flush = L2 flushed before each replay, chain = per run of 8 PDL-chained"
echo "runs in one graph (input sets rotated). GB/s counts KV tokens once + q + out."
echo
grep -v '^#' "$OUTDIR/bench_mla.out" || true
echo
grep '^#' "$OUTDIR/bench_mla.out" | sed 's/^# /- /' || true
if [ "$mla_rc" != 0 ]; then
    echo
    echo "bench_mla exited $mla_rc; stderr:"
    cat "$OUTDIR/bench_mla.err"
    rc=1
fi
fi

if [ "$RUN_GQA" = 1 ]; then
gqa_rc=0
FI_CEIL_READ_TBPS=$READ_TBPS "$OUTDIR/bench_gqa" --read-tbps "$READ_TBPS" "$@" \
    > "$OUTDIR/bench_gqa.out" 2> "$OUTDIR/bench_gqa.err" || gqa_rc=$?

echo
echo "## GQA paged decode (fiattn) - $(date -u '+%Y-%m-%d %H:%M UTC'), $GPU, commit $COMMIT"
echo
echo "Ceiling measured in this run (bench/ceilings): streaming read $READ_TBPS TB/s."
echo "bf16 q and out, KV as one NHD tensor [pages, 2, page_size, H_kv, D] (bf16, fp8 e4m3 or NVFP4),"
echo "q_len 1, CUDA-graph replays (median), b2b / flush / chain as for MLA. GB/s counts the KV of"
echo "the tokens read once (K and V; NVFP4 values + scales) + q + out."
echo
grep -v '^#' "$OUTDIR/bench_gqa.out" || true
echo
grep '^#' "$OUTDIR/bench_gqa.out" | sed 's/^# /- /' || true
if [ "$gqa_rc" != 0 ]; then
    echo
    echo "bench_gqa exited $gqa_rc; stderr:"
    cat "$OUTDIR/bench_gqa.err"
    rc=1
fi
fi

if [ "$RUN_CTX" = 1 ]; then
ctx_rc=0
FI_CEIL_BF16_TFLOPS=$MMA_TFLOPS "$OUTDIR/bench_context" --tflops "$MMA_TFLOPS" --check "$@" \
    > "$OUTDIR/bench_context.out" 2> "$OUTDIR/bench_context.err" || ctx_rc=$?

echo
echo "## Context attention (prefill, fiattn) - $(date -u '+%Y-%m-%d %H:%M UTC'), $GPU, commit $COMMIT"
echo
echo "Ceiling measured in this run (bench/ceilings): bf16 cuBLAS 8192^3 $MMA_TFLOPS TFLOP/s."
echo "bf16 q, KV and out, head_dim 128, page_size 64, KV as one HND tensor [pages, 2, H_kv, page_size, D],"
echo "causal (query block at the end of the KV range), CUDA-graph replays (median), b2b / flush / chain"
echo "as for MLA. TFLOP/s = 4 x D x sum over (token, head) rows of the keys each row sees / time"
echo "(causal FLOPs counted once); the mixed batch once as one context plan and once as a context"
echo "plan + a GQA decode plan in one graph (_2launch)."
echo
grep -v '^#' "$OUTDIR/bench_context.out" || true
echo
grep '^#' "$OUTDIR/bench_context.out" | sed 's/^# /- /' || true
if [ "$ctx_rc" != 0 ]; then
    echo
    echo "bench_context exited $ctx_rc; stderr:"
    cat "$OUTDIR/bench_context.err"
    rc=1
fi
fi

if [ "$RUN_DEV" = 1 ]; then
dev_rc=0
"$OUTDIR/bench_device_plan" "$@" \
    > "$OUTDIR/bench_device_plan.out" 2> "$OUTDIR/bench_device_plan.err" || dev_rc=$?

echo
echo "## Device planner (fiattn) - $(date -u '+%Y-%m-%d %H:%M UTC'), $GPU, commit $COMMIT"
echo
echo "fi_plan_update_device on trace decode snapshots (bf16, q_len 1): CUDA-graph replays (median,"
echo "back to back) of the plan alone, plan -> run with and without PDL, and the run alone on a"
echo "host plan (gap = e2e - plan - exec); host-clock steps of fi_plan_update + run graph against"
echo "the plan -> run graph, with a stream sync each step (median) or running ahead (mean)."
echo
grep -v '^#' "$OUTDIR/bench_device_plan.out" || true
echo
grep '^#' "$OUTDIR/bench_device_plan.out" | sed 's/^# /- /' || true
if [ "$dev_rc" != 0 ]; then
    echo
    echo "bench_device_plan exited $dev_rc; stderr:"
    cat "$OUTDIR/bench_device_plan.err"
    rc=1
fi
fi
exit "$rc"
