#!/bin/sh
# scripts/check-build-log.sh LOG... - fail on any compiler or linker warning in build logs
# (CI: .ci/run) and on wgmma that ptxas serialised (below), except the ptxas register
# spills listed in scripts/accepted-spills.txt, which are checked by number: a kernel that
# spills more bytes than listed, or a kernel not listed, fails.  Accepted spills and why:
# docs/DESIGN.md section 9a.
set -eu
here=$(dirname "$0")
accepted="$here/accepted-spills.txt"
[ $# -ge 1 ] || { echo "usage: check-build-log.sh LOG..." >&2; exit 2; }
status=0
# Every line that names a warning, less the ptxas spill lines (checked below).
others=$(cat "$@" | grep -i 'warning' | grep -v "^ptxas warning : Registers are spilled" || true)
if [ -n "$others" ]; then
    echo "check-build-log: warnings in the build:" >&2
    printf '%s\n' "$others" >&2
    status=1
fi
# ptxas reports wgmma it had to serialise (C7510, C7514, C7515, C7520: a register it could
# not prove idle while a wgmma is in flight) as "info", not a warning: the build stays
# correct but the kernel loses its overlap (the MLA wgmma body took 668 us serialised
# against 391 without, docs/perf-log.md 2026-11-26).  Any such line fails.
serial=$(cat "$@" | grep 'wgmma.mma_async instructions are serialized' || true)
if [ -n "$serial" ]; then
    echo "check-build-log: ptxas serialised wgmma:" >&2
    printf '%s\n' "$serial" >&2
    status=1
fi
# ptxas warning : Registers are spilled to local memory in function 'NAME', S bytes spill
# stores, L bytes spill loads
cat "$@" | sed -n "s/^ptxas warning : Registers are spilled to local memory in function '\([^']*\)', \([0-9]*\) bytes spill stores, \([0-9]*\) bytes spill loads.*/\1 \2 \3/p" |
    sort -u > "${TMPDIR:-/tmp}/fiattn-spills.$$"
while read -r fn st ld; do
    line=$(grep -v '^#' "$accepted" | awk -v f="$fn" '$1 == f {print $2, $3}')
    if [ -z "$line" ]; then
        echo "check-build-log: $fn spills $st / $ld bytes (stores / loads) and is not in $accepted" >&2
        status=1
        continue
    fi
    set -- $line
    if [ "$st" -gt "$1" ] || [ "$ld" -gt "$2" ]; then
        echo "check-build-log: $fn spills $st / $ld bytes (stores / loads), accepted $1 / $2" >&2
        status=1
    fi
done < "${TMPDIR:-/tmp}/fiattn-spills.$$"
n=$(wc -l < "${TMPDIR:-/tmp}/fiattn-spills.$$")
rm -f "${TMPDIR:-/tmp}/fiattn-spills.$$"
[ "$status" = 0 ] && echo "check-build-log: no warnings ($n accepted ptxas spill line(s))"
exit "$status"
