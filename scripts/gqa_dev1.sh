#!/bin/bash
# one device call: build, GQA smoke cases, MLA GPU tests, sanitizer on a small GQA split case
set -u
mkdir -p $OUT
{ time make -j16 all > $OUT/build.log 2>&1; } 2> $OUT/build_time.txt || { tail -30 $OUT/build.log; exit 1; }
cc -std=c11 -O2 -Iinclude -I. -I/usr/local/cuda/include scripts/gqa_smoke.c build/libfiattn.a -L/usr/local/cuda/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++ -lm -o build/gqa_smoke || exit 1
S=build/gqa_smoke
{
$S 128 32 8 16 4 300 1 0 -1 0 0
$S 128 32 8 64 8 2000 1 1 -1 1 0
$S 64 16 16 32 4 500 1 0 -1 0 0
$S 256 40 8 128 4 700 1 0 -1 0 0
$S 128 32 2 16 3 900 4 0 -1 0 0
$S 128 32 8 16 2 3000 1 0 100 1 0
$S 128 32 8 16 1 20000 1 0 -1 0 0
$S 128 32 8 64 2 8000 3 0 -1 1 16
$S 128 128 8 16 2 500 8 0 -1 0 0
$S 64 8 8 32 3 400 2 1 50 1 0
$S 256 16 1 64 2 3000 1 0 -1 1 0
$S 128 32 8 64 128 -4096 1 0 -1 0 0 200
$S 128 32 8 16 128 -4096 1 0 -1 0 0 200
$S 128 32 8 64 1 -32768 1 0 -1 0 0 200
$S 128 64 8 64 64 -8192 1 0 -1 0 0 200
} 2>&1 | tee $OUT/smoke.txt
timeout 120 compute-sanitizer --tool memcheck $S 128 32 8 16 2 600 2 0 -1 1 8 > $OUT/memcheck.txt 2>&1; tail -3 $OUT/memcheck.txt
timeout 120 compute-sanitizer --tool racecheck $S 128 32 8 16 2 600 2 0 -1 1 8 > $OUT/racecheck.txt 2>&1; tail -3 $OUT/racecheck.txt
timeout 200 build/tests/gpu/test_mla_gpu > $OUT/mla_gpu.txt 2>&1; tail -5 $OUT/mla_gpu.txt
