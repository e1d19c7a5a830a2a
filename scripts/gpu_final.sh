#!/bin/bash
# One device call: build, make gpu-test (C + Python), compute-sanitizer on the small split
# cases of both families, the GQA benchmark and FlashInfer's peer in the same run.
set -u
mkdir -p $OUT
make -j16 all > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
timeout 400 make gpu-test > $OUT/gpu_test.txt 2>&1; echo "gpu-test rc=$?"; grep -E "^\[  (FAILED|PASSED)|passed|failed|^== " $OUT/gpu_test.txt | head -20
for t in gqa mla; do for tool in memcheck racecheck; do
  FI_GPU_TEST_FILTER=sanitize_small_case timeout 150 compute-sanitizer --tool $tool build/tests/gpu/test_${t}_gpu > $OUT/san_${t}_${tool}.txt 2>&1
  echo "$t $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_${t}_${tool}.txt | head -1)"; done; done
timeout 300 sh bench/run_gpu_bench.sh --gqa > $OUT/bench.txt 2>&1; echo "bench rc=$?"; grep "^|\|ceiling" $OUT/bench.txt
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
O=$OUT; unset OUT
timeout 300 python3 bench/peer_flashinfer_gqa.py --reps 50 > $O/peer.txt 2>&1; echo "peer rc=$?"; grep "^peer" $O/peer.txt
git log --oneline -1 2>/dev/null | head -1
