#!/usr/bin/env bash
# scripts/gpu_cp_gqa.sh - context-parallel decode on a machine with two GPUs (issue 19), in
# one device call: build the library and tests/gpu/test_multi_gpu; the Python GPU tests of
# context parallelism (python/tests/gpu/test_context_parallel.py: MLA and GQA over 2 GPUs)
# and of GQA decode's LSE on one GPU (test_gpu.py -k decode_lse); test_multi_gpu (two plans on two
# GPUs, one and two threads); examples/cp_decode.py at the BENCHMARKS.md size (batch 8 x
# 131072 keys, bf16, page 64) for MLA heads 128, MLA heads 16 and GQA (32 / 8 heads, head_dim
# 128): merged vs one-GPU relative error (must be <= 1e-2) and both step times.
# NCCL's NVLink multicast stays off (NCCL_NVLS_ENABLE=0).  Logs under $OUT (or ./gpu_out),
# 7 files: summary.txt (GPUs, commit, one line a step, the cp_decode results), build.log,
# pytest_cp.log, multi_gpu.log, cp_mla_h128.log, cp_mla_h16.log, cp_gqa.log.
#   scripts/gpu_cp_gqa.sh [all|tests|cp]
#     all    (default) everything above, about 5-7 minutes on 2 x H100 / H200
#     tests  build + the Python GPU tests + test_multi_gpu
#     cp     build + the three cp_decode runs (the build is incremental on a warm machine)
# Exit status: 0 when every step passed and every cp_decode run gave its result.
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
MODE=${1:-all}
J=$(nproc)
export NCCL_NVLS_ENABLE=0
export FIATTN_LIBRARY=$PWD/build/libfiattn.so
fail=0
sum() { echo "$*" | tee -a "$OUT/summary.txt"; }
step() {  # step NAME LOG TIMEOUT_S COMMAND...: run, log, one summary line; failures counted
  local name=$1 log=$2 limit=$3 start=$SECONDS rc
  shift 3
  timeout "$limit" "$@" > "$OUT/$log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || fail=1
  sum "$name: rc=$rc in $((SECONDS - start)) s ($log)"
}

nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv >> "$OUT/summary.txt" 2>&1 \
  || sum "nvidia-smi: not found"
git log -1 --format='commit %h %s' 2>/dev/null | tee -a "$OUT/summary.txt"

step "build lib + test_multi_gpu" build.log 500 \
  make NO_JEMALLOC=1 -j"$J" lib build/tests/gpu/test_multi_gpu
[ $fail -eq 0 ] || { grep -m10 -E "error|Error" "$OUT/build.log"; exit 1; }

if [ "$MODE" = all ] || [ "$MODE" = tests ]; then
  step "pytest context parallel (2 GPUs) + GQA lse (1 GPU)" pytest_cp.log 300 \
    sh -c 'cd python && python3 -m pytest -q -rs tests/gpu/test_context_parallel.py \
             tests/gpu/test_gpu.py -k "context_parallel or decode_lse"'
  sum "  $(tail -1 "$OUT/pytest_cp.log")"
  if [ -x build/tests/gpu/test_multi_gpu ]; then
    step "test_multi_gpu" multi_gpu.log 200 build/tests/gpu/test_multi_gpu
    sum "  $(grep -E "^\[ .* \] [0-9]+ test\(s\)" "$OUT/multi_gpu.log" | tr -s ' ' | paste -sd ' ')"
  else
    sum "test_multi_gpu: not built"
  fi
fi

if [ "$MODE" = all ] || [ "$MODE" = cp ]; then
  size="--gpus 2 --batch 8 --kv-len 131072 --page-size 64 --iters 20"
  for c in "mla_h128:--family mla --heads 128 --port 29517" \
           "mla_h16:--family mla --heads 16 --port 29518" \
           "gqa:--family gqa --heads 32 --kv-heads 8 --head-dim 128 --port 29519"; do
    name=${c%%:*}
    # shellcheck disable=SC2086  # word splitting of the option lists is intended
    step "cp_decode $name" "cp_$name.log" 240 python3 examples/cp_decode.py $size ${c#*:}
    if grep -q "relative error" "$OUT/cp_$name.log"; then
      grep -E "^context-parallel|relative error|step:" "$OUT/cp_$name.log" >> "$OUT/summary.txt"
    else
      fail=1
      sum "  no result: $(tail -1 "$OUT/cp_$name.log")"
    fi
  done
fi

echo "===== summary ====="
cat "$OUT/summary.txt"
exit $fail
