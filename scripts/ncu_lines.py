#!/usr/bin/env python3
"""scripts/ncu_lines.py - ncu's per-instruction samples of one kernel, summed by source line.

    ncu ... --section WarpStateStats --section SourceCounters -o R <program>   # GPU machine
    ncu -i R.ncu-rep --page source --csv --print-source sass > k.csv          # GPU machine
    cuobjdump -xelf all build/.../x.cu.o && nvdisasm -c -gi x.sm_90a.cubin > all.sass  # here
    scripts/ncu_lines.py k.csv all.sass KERNEL_MANGLED_NAME [--by file|line|frame]
                         [--under FRAME,...] [--skip FRAME] [--top N]

The CSV's rows are the kernel's instructions in address order; nvdisasm -gi gives the same
instructions with their line-info comments (innermost file:line first, then each
"inlined at" frame), so row i is instruction i of the function's .text section.  The
object must be the one the profiled binary was linked from (checked by the instruction
count).  For each group: samples, the main stall reasons (no_instruction = instruction
fetch, barrier, wait = fixed-latency dependence, long_sb = global / local memory,
short_sb = shared memory), instructions executed (warp level) and distinct instructions
executed (the code the path touches).

--by file | line: the innermost frame's file or file:line.  --by frame: the next frame
below --under (outermost first): `--under planner/device/plan_kernel.cu:387 --by frame`
splits that call site's samples by what it calls.  --skip FRAME drops every instruction
whose outermost frame is FRAME (e.g. the other CTA's branch of a cluster kernel).
How the thirty-third session read the planning kernel (docs/perf-log.md).
"""
import argparse
import collections
import csv
import re
import sys

COLS = ("# Samples", "stall_no_inst", "stall_barrier", "stall_wait", "stall_long_sb",
        "stall_short_sb", "Instructions Executed")
SHORT = ("samples", "fetch", "barrier", "wait", "long_sb", "short_sb", "executed")


def sass_frames(path, kernel):
    """Per instruction of `kernel`'s .text section: its frames, outermost first."""
    frames, chain, in_comment, inside = [], [], False, False
    head = re.compile(r"^\.text\.(\S+):")
    info = re.compile(r'\s*//## File "([^"]+)", line (\d+)')
    instr = re.compile(r"\s*/\*[0-9a-f]{4,}\*/\s")
    for line in open(path):
        h = head.match(line)
        if h:
            if inside:
                break
            inside = h.group(1) == kernel
            continue
        if not inside:
            continue
        m = info.match(line)
        if m:
            if not in_comment:
                chain = []
            f = re.sub(r"^(\./)+", "", re.sub(r"^/work/[^/]+/", "", m.group(1)))
            chain.append(f"{f}:{m.group(2)}")
            in_comment = True
        elif instr.match(line):
            frames.append(tuple(reversed(chain)))
            in_comment = False
    return frames


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("sass")
    ap.add_argument("kernel", help="mangled name, as in nvdisasm's .text.<name>")
    ap.add_argument("--by", choices=("file", "line", "frame"), default="file")
    ap.add_argument("--under", default="", help="comma-separated outermost frames")
    ap.add_argument("--skip", action="append", default=[])
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv)))
    header = rows[1]
    col = {n: i for i, n in enumerate(header)}
    data = [r for r in rows[2:] if len(r) >= len(header)]
    frames = sass_frames(a.sass, a.kernel)
    if len(frames) != len(data):
        sys.exit(f"{len(data)} instructions in the CSV, {len(frames)} in the SASS of "
                 f"{a.kernel}: not the same build")
    under = tuple(a.under.split(",")) if a.under else ()
    groups = collections.defaultdict(collections.Counter)
    for fr, r in zip(frames, data):
        if fr and fr[0] in a.skip:
            continue
        if fr[:len(under)] != under:
            continue
        if a.by == "frame":
            key = fr[len(under)] if len(fr) > len(under) else "(itself)"
        else:
            inner = fr[-1] if fr else "?"
            key = inner.rsplit(":", 1)[0] if a.by == "file" else inner
        g = groups[key]
        for c in COLS:
            g[c] += int(r[col[c]] or 0)
        g["distinct"] += int(r[col["Instructions Executed"]] or 0) > 0
    total = collections.Counter()
    for g in groups.values():
        total.update(g)
    print(f"{'where':52s} " + " ".join(f"{s:>8s}" for s in SHORT) + f" {'distinct':>8s}")
    ranked = sorted(groups.items(), key=lambda kv: -kv[1]["# Samples"])[:a.top]
    for key, g in ranked + [("TOTAL", total)]:
        print(f"{key[-52:]:52s} " + " ".join(f"{g[c]:8d}" for c in COLS) +
              f" {g['distinct']:8d}")


if __name__ == "__main__":
    main()
