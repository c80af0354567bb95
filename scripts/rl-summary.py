"""Markdown tables of real GRPO runs (scripts/rl-demo.sh) side by side, for
docs/BENCHMARKS.md "A real run": one line per arm (pass@1 and pass@3 of the
raw rollouts over steps 0-9, 10-19 and 20-29; all-failed and hinted groups;
signal rescued; transfer and reliance where defined; seconds a step), the
hinted success by category over the whole run, and pass@1 and signal rescued
step by step.

    python3 scripts/rl-summary.py ROOT [ARM ...]     # reads ROOT/<arm>/report.json

Standard library only. A value undefined at every step of an arm is '-'. An
arm without hints (none) records no `groups_failed`: it is read from stage
2's `reward/avg_pass_at_4` (the share of groups with a success).
"""
import json, statistics, sys, collections
if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
    sys.exit(__doc__)
arms = sys.argv[2:] or ["none", "static", "llm"]
root = sys.argv[1]
reps = {a: json.load(open(f"{root}/{a}/report.json")) for a in arms}
def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None
def failed(x):
    if "groups_failed" in x: return x["groups_failed"]
    return round(x["groups"] * (1 - x["stage2"]["reward/avg_pass_at_4"]))
def f(x, d=3):
    return "-" if x is None else f"{x:.{d}f}"
print("| arm | steps | pass@1, steps 0-9 / 10-19 / 20-29 | pass@3, same windows | groups all failed | groups hinted | signal rescued (mean) | transfer (mean, where defined) | reliance (mean, where defined) | s/step (median) |")
print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
for a, r in reps.items():
    s = r["steps"]
    w = lambda key: " / ".join(f(mean([x.get(key) for x in s[i:i+10]])) for i in (0, 10, 20))
    print(f"| {a} | {len(s)} | {w('pass@1')} | {w('pass@3')} | {sum(failed(x) for x in s)} | {sum(x.get('groups_hinted', 0) or 0 for x in s)} | "
          f"{f(mean([x.get('signal_rescued') for x in s]))} | {f(mean([x.get('transfer') for x in s]))} | {f(mean([x.get('reliance') for x in s]))} | {statistics.median(x['seconds'] for x in s):.0f} |")
print()
print("Hinted success by category (hinted rollouts that succeeded / hinted rollouts, all steps):")
print()
for a, r in reps.items():
    tot = collections.Counter(); ok = collections.Counter()
    for x in r["steps"]:
        st = x.get("stage2", {})
        for k, v in st.items():
            if k.startswith("hint/category_") and k.endswith("_count"):
                cat = k[len("hint/category_"):-len("_count")]
                n = v; rate = st.get(f"hint/category_{cat}_success_rate")
                tot[cat] += n
                if rate is not None: ok[cat] += rate * n
    if tot:
        print(f"- **{a}**: " + "; ".join(f"`{c}` {ok[c]:.0f} of {tot[c]:.0f} ({ok[c]/tot[c]:.3f})" for c in sorted(tot)))
    else:
        print(f"- **{a}**: no hints")
print()
print("| step | " + " | ".join(f"{a} pass@1" for a in arms) + " | " + " | ".join(f"{a} rescued" for a in arms if a != "none") + " |")
print("|---:|" + "---:|" * (len(arms) + len([a for a in arms if a != 'none'])))
n = max(len(r["steps"]) for r in reps.values())
for i in range(n):
    row = []
    for a in arms:
        s = reps[a]["steps"]; row.append(f(s[i]["pass@1"]) if i < len(s) else "")
    for a in arms:
        if a == "none": continue
        s = reps[a]["steps"]; row.append(f(s[i].get("signal_rescued")) if i < len(s) else "")
    print(f"| {i} | " + " | ".join(row) + " |")
