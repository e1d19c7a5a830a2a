#!/bin/sh
# tests/build_log_test.sh - checks of scripts/check-build-log.sh, CI's gate on build logs
# (run by `make test`): each synthetic log must pass or fail as stated.  Prints one line per
# check and "N passed, N failed"; exits 1 if anything failed.  `make asan`'s log, which
# the gate reads too, carries this output: no check name may contain "warning".
CHECK=${CHECK:-scripts/check-build-log.sh}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/build_log.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM
pass=0
fail=0
# The first kernel of scripts/accepted-spills.txt and the bytes it may spill.
set -- $(grep -v '^#' scripts/accepted-spills.txt | head -1)
fn=$1 st=$2 ld=$3
spill() { echo "ptxas warning : Registers are spilled to local memory in function '$1', $2 bytes spill stores, $3 bytes spill loads"; }
# expect WANT NAME: the log in $TMP/log must make the check exit with WANT (0 or 1).
expect() {
    sh "$CHECK" "$TMP/log" > /dev/null 2>&1
    rc=$?
    if [ "$rc" = "$1" ]; then pass=$((pass + 1)); echo "ok   $2"; else fail=$((fail + 1)); echo "FAIL $2 (exit $rc, want $1)"; fi
}
echo "nvcc -c x.cu -o x.o" > "$TMP/log"
expect 0 clean_log_passes
spill "$fn" "$st" "$ld" > "$TMP/log"
expect 0 accepted_spill_passes
spill "$fn" "$((st + 4))" "$ld" > "$TMP/log"
expect 1 larger_spill_fails
spill _Z7unknownv 4 4 > "$TMP/log"
expect 1 unlisted_spill_fails
echo "x.c:1:2: warning: unused variable 'y' [-Wunused-variable]" > "$TMP/log"
expect 1 compiler_diagnostic_fails
echo "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma instructions defining accumulator registers of a wgmma between start and end of the pipeline stage in the function 'k'" > "$TMP/log"
expect 1 serialised_wgmma_fails
echo "ptxas info    : (C7519) warpgroup.arrive is injected in around line 1 by compiler to allow use of registers in GMMA in function 'k'" > "$TMP/log"
expect 0 injected_arrive_passes
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
