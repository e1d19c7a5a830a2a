#!/usr/bin/env python3
"""scripts/plan_quality.py - compare two fiplan --json plans of one batch by quality.

    scripts/plan_quality.py OLD.json NEW.json

Prints one line: each plan's max CTA cost (the plan header's, from the JSON summary) and
its executor-model score (planner/model.c's fi_model_max, recomputed here from the items;
both plans with the charges of the NEW plan's tile-table row: its JSON "row", or for a plan
written before fiplan gave it, the shared constants of plan/cost_model.h), then a verdict:
  worse   - the new plan's max CTA cost or model score is higher than the old one's;
  better  - neither is higher and one is lower;
  equal   - both figures are the same (the plans may still differ in layout).
scripts/plan_compare.sh calls it for every plan that is not byte-identical.
Exit status 0, or 2 on a usage or read error.
"""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cost_constants():
    """The shared FI_COST_{ALPHA,BETA,MERGE,ARRIVE} of plan/cost_model.h: the charges of a
    plan whose JSON has no "row" (fiplan before the rows had their own charges)."""
    text = open(os.path.join(ROOT, "plan", "cost_model.h")).read()
    out = {}
    for name in ("ALPHA", "BETA", "MERGE", "ARRIVE"):
        m = re.search(r"#define FI_COST_%s (\d+)" % name, text)
        if not m:
            raise SystemExit("plan_quality.py: FI_COST_%s not found in plan/cost_model.h" % name)
        out[name] = int(m.group(1))
    return out


def model_max(plan, k):
    """fi_model_max: a CTA's items end at its running cost; of each merge group the piece
    that ends last (ties: the lower item index) merges (cost_merge), the others arrive."""
    fields = plan["item_fields"]
    col = {f: i for i, f in enumerate(fields)}
    items, indptr = plan["items"], plan["work_indptr"]
    finish = [0] * len(items)
    last = {}
    for c in range(len(indptr) - 1):
        t = 0
        for i in range(indptr[c], indptr[c + 1]):
            it = items[i]
            rows = (it[col["q_end"]] - it[col["q_begin"]]) * (
                it[col["head_end"]] - it[col["head_begin"]])
            t += it[col["kv_end"]] - it[col["kv_begin"]] + k["ALPHA"] * rows + k["BETA"]
            finish[i] = t
            g = it[col["merge_group"]]
            if g >= 0 and (g not in last or t > finish[last[g]]):
                last[g] = i
    best = 0
    for c in range(len(indptr) - 1):
        b, e = indptr[c], indptr[c + 1]
        t = finish[e - 1] if e > b else 0
        for i in range(b, e):
            g = items[i][col["merge_group"]]
            if g >= 0:
                t += k["MERGE"] if last[g] == i else k["ARRIVE"]
        best = max(best, t)
    return best


def row_constants(d, shared):
    """The charges of the tile-table row that made the plan (its JSON "row"), else shared."""
    row = d.get("row")
    if row is None:
        return shared
    return {name: row["cost_" + name.lower()] for name in ("ALPHA", "BETA", "MERGE", "ARRIVE")}


def figures(d, k):
    return d["summary"]["max_cta_cost"], model_max(d["plan"], k)


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        old, new = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
        # One model for both: the new plan's row charges (the ones under review).
        k = row_constants(new, cost_constants())
        (om, os_), (nm, ns) = figures(old, k), figures(new, k)
    except (OSError, ValueError, KeyError) as e:
        print("plan_quality.py: %s" % e, file=sys.stderr)
        return 2
    if nm > om or ns > os_:
        verdict = "worse"
    elif nm < om or ns < os_:
        verdict = "better"
    else:
        verdict = "equal"
    print("old max %d model %d | new max %d model %d | %s" % (om, os_, nm, ns, verdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
