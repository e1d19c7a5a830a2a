#!/bin/bash
# device call 2: build, smoke subset, racecheck, perf of the normal and the no-compute build
set -u
mkdir -p $OUT
make -j16 all > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
L="-L/usr/local/cuda/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++ -lm"
cc -std=c11 -O2 -Iinclude -I. -I/usr/local/cuda/include scripts/gqa_smoke.c build/libfiattn.a $L -o build/gqa_smoke || exit 1
nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC -Iinclude -I. --expt-relaxed-constexpr -DFI_GQA_EXP_NOCOMPUTE -c executor/gqa/gqa_bf16_d128.cu -o /tmp/gqa_bf16_d128.cu.o
cp build/libfiattn.a /tmp/libexp.a && (cd /tmp && ar r libexp.a gqa_bf16_d128.cu.o)
cc -std=c11 -O2 -Iinclude -I. -I/usr/local/cuda/include scripts/gqa_smoke.c /tmp/libexp.a $L -o build/gqa_smoke_nc || exit 1
S=build/gqa_smoke
{
$S 128 32 8 16 4 300 1 0 -1 0 0
$S 128 32 8 64 8 2000 1 1 -1 1 0
$S 256 40 8 128 4 700 1 0 -1 0 0
$S 128 32 8 64 2 8000 3 0 -1 1 16
$S 64 8 8 32 3 400 2 1 50 1 0
$S 128 32 8 64 128 -4096 1 0 -1 0 0 200
$S 128 32 8 16 128 -4096 1 0 -1 0 0 200
$S 128 32 8 64 1 -32768 1 0 -1 0 0 200
$S 256 16 2 64 128 -2048 1 0 -1 0 0 100
$S 64 32 8 64 128 -8192 1 0 -1 0 0 100
echo "--- no-compute build (wrong results expected; timing only)"
build/gqa_smoke_nc 128 32 8 64 128 -4096 1 0 -1 0 0 200
build/gqa_smoke_nc 128 32 8 64 1 -32768 1 0 -1 0 0 200
} 2>&1 | tee $OUT/smoke.txt
timeout 120 compute-sanitizer --tool racecheck $S 128 32 8 16 2 600 2 0 -1 1 8 > $OUT/racecheck.txt 2>&1; tail -2 $OUT/racecheck.txt
timeout 120 compute-sanitizer --tool racecheck $S 128 32 8 64 1 3000 1 0 -1 0 0 > $OUT/racecheck2.txt 2>&1; tail -2 $OUT/racecheck2.txt
