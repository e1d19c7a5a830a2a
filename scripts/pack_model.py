#!/usr/bin/env python3
"""scripts/pack_model.py - a model of a data-parallel packing for the heads-16 MLA
device-planning rows (docs/perf-log.md, twenty-sixth session), against the host row's plan.

For each decode snapshot of the bundled trace it prints the largest CTA cost (in the cost
units of tile table row 7: fixed 16 + 768 an item, 578 a split piece) of:
  host       row 7's own plan (fiplan --json, q and cache e4m3, heads 16);
  two-ptr    sort the tiles by cost; for a cap C a tile above C goes in
             ceil(kv / (C - fixed - piece)) pieces of a CTA each, the rest are paired
             largest with smallest while a pair fits C (the 2k smallest paired outside-in:
             the two-pointer greedy), one CTA a pair or a lone tile; C the least cap that
             fits the CTAs;
  fixed      the same with every short tile paired outside-in across all of them (a pair
             used only where it fits): the pairing needs no search, and is much worse.
A sketch to size the idea, kept as the record of it: planner/ppair.c is the library's
version (no mean piece under the floor plus half a grain, a search to 1%).  Needs build/fiplan.

usage: scripts/pack_model.py [--fiplan build/fiplan] [--ctas 132]
"""
import argparse
import json
import math
import subprocess

FIXED, PIECE = 16 + 768, (900 + 256) / 2


def snapshot(fiplan, args):
    out = subprocess.run([fiplan] + args + ["--heads", "16", "--dtype", "e4m3", "--json"],
                         capture_output=True, text=True, check=True).stdout
    d = json.loads(out)
    return d["batch"]["kv_len"], d["summary"]["max_cta_cost"], d["summary"]["num_groups"]


def least_cap(kvs, n, two_pointer):
    """The least cap C whose plan fits n CTAs."""
    def cost(k):
        return k + FIXED

    def ctas_needed(cap):
        ctas, short = 0, []
        for k in kvs:
            if cost(k) > cap:
                ctas += math.ceil(k / max(1, cap - FIXED - PIECE))
            else:
                short.append(cost(k))
        a = sorted(short)
        if two_pointer:
            i, j, bins = 0, len(a) - 1, 0
            while i <= j:  # the largest left, with the smallest left when they fit
                if i < j and a[i] + a[j] <= cap:
                    i += 1
                j -= 1
                bins += 1
            return ctas + bins
        pairs = sum(1 for i in range(len(a) // 2) if a[i] + a[len(a) - 1 - i] <= cap)
        return ctas + len(a) - pairs

    lo, hi = FIXED + 64, 2 * cost(max(kvs)) + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if ctas_needed(mid) <= n:
            hi = mid
        else:
            lo = mid + 1
    return lo


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fiplan", default="build/fiplan")
    ap.add_argument("--ctas", type=int, default=132)
    o = ap.parse_args()
    cases = [["--batch", "128", "--step", "100"], ["--batch", "128", "--step", "400"],
             ["--batch", "128", "--step", "800"], ["--batch", "32", "--step", "100"],
             ["--batch", "64", "--step", "100"], ["--batch", "128", "--step", "100", "--first", "500"],
             ["--batch", "128", "--step", "100", "--first", "2000"], ["--batch", "200", "--step", "100"]]
    print("| snapshot | host (row 7) | two-ptr | fixed | mean |")
    print("|---|---:|---:|---:|---:|")
    for args in cases:
        kvs, host, _ = snapshot(o.fiplan, args + ["--ctas", str(o.ctas)])
        mean = sum(k + FIXED for k in kvs) / o.ctas
        print(f"| {' '.join(args)} | {host} | {least_cap(kvs, o.ctas, True)} | "
              f"{least_cap(kvs, o.ctas, False)} | {mean:.0f} |")


if __name__ == "__main__":
    main()
